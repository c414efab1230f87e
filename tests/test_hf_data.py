"""Hugging Face datasets + tokenizers: packed documents, disjoint node shards, a held-out eval set,
streaming with a resumable position, and errors that name the field."""
from __future__ import annotations

import gzip
import re
from types import SimpleNamespace

import numpy as np
import pytest

import datasets  # the dev extra has it: a missing one must fail, not skip

from geodiloco.common.schema import ConfigError
from geodiloco.runtime.config import parse_config
from geodiloco.runtime.data_sources import node_data
from geodiloco.runtime.hf_data import load_tokenizer
from geodiloco.runtime.preflight import preflight
from tests.hf_helpers import documents, llama_config, train_tokenizer, write_jsonl

NODES = [{"name": name, "gpus": ["A30"]} for name in ("a", "b", "c")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("hf")
    texts = documents(120)
    return {"texts": texts, "files": write_jsonl(root / "corpus", texts, files=4),
            "tokenizer": str(train_tokenizer(texts, root / "tokenizer")), "model": str(llama_config(root / "config.json")),
            "root": root}


def hf_config(corpus: dict, streaming: bool = False, shards: str = "iid", eval_batches: int = 1, **data) -> object:
    return parse_config({
        "model": {"hf": {"config": corpus["model"]}, "seq_len": 16},
        "data": {"hf_dataset": {"path": "json", "data_files": corpus["files"], "streaming": streaming},
                 "tokenizer": corpus["tokenizer"], "shards": shards, "eval_batches": eval_batches,
                 "eval_batch_size": 4, **data},
        "nodes": NODES}, "run.yaml")


def independent_tokens(corpus: dict) -> list[int]:
    """Each document tokenized on its own, the end-of-text id after it."""
    tokenizer = load_tokenizer(corpus["tokenizer"])
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    return [token for text in corpus["texts"] for token in tokenizer.encode(text) + [eos]]


def drain(shard, batches: int, batch_size: int = 2) -> list[list[int]]:
    windows = []
    for _ in range(batches):
        inputs, targets = shard.next_batch(batch_size)
        assert np.array_equal(inputs[:, 1:].numpy(), targets[:, :-1].numpy())
        windows += [row + [last] for row, last in zip(inputs.tolist(), targets[:, -1].tolist())]
    return windows


def test_packed_corpus_is_every_document_then_end_of_text(corpus):
    config = hf_config(corpus, eval_batches=0)
    _, shard = node_data(config, 0, 3)
    assert shard.corpus_array.tolist() == independent_tokens(corpus)


def test_node_shards_are_disjoint_and_skip_the_eval_windows(corpus):
    config = hf_config(corpus)
    eval_set, _ = node_data(config, 0, 3)
    eval_windows = {tuple(row.tolist() + [target[-1].item()]) for inputs, targets in eval_set
                    for row, target in zip(inputs, targets)}
    assert len(eval_windows) == 4
    starts = [set(node_data(config, index, 3)[1].window_starts.tolist()) for index in range(3)]
    assert not (starts[0] & starts[1]) and not (starts[1] & starts[2]) and not (starts[0] & starts[2])
    _, shard = node_data(config, 1, 3)
    trained = {tuple(window) for window in drain(shard, 10)}
    assert not trained & eval_windows


def test_streaming_iid_deals_each_document_to_one_node_and_holds_out_the_first(corpus):
    config = hf_config(corpus, streaming=True)
    eval_set, _ = node_data(config, 0, 3)
    tokens = independent_tokens(corpus)
    first_eval = [row.tolist() + [target[-1].item()] for row, target in zip(*eval_set[0])]
    assert first_eval[0] == tokens[:17] and first_eval[1] == tokens[17:34]  # the stream's head, packed
    firsts = []
    for index in range(3):
        shard = node_data(config, index, 3)[1]
        window = drain(shard, 1, batch_size=1)[0]
        firsts.append(load_tokenizer(corpus["tokenizer"]).decode(window).split()[0])
    held_out_docs = sum(shard.layout.held_out_docs)
    assert firsts == [f"doc{held_out_docs + index}" for index in range(3)]


def test_streaming_position_resumes_the_same_windows(corpus):
    config = hf_config(corpus, streaming=True)
    shard = node_data(config, 2, 3)[1]
    drain(shard, 4, batch_size=3)
    saved = shard.position_state()
    expected = drain(shard, 6, batch_size=3)
    resumed = node_data(config, 2, 3)[1]
    resumed.load_position_state(saved)
    assert drain(resumed, 6, batch_size=3) == expected


def test_a_stream_with_empty_records_resumes_at_the_same_document_and_never_trains_on_eval_ones(corpus, tmp_path):
    # every third record empty or null: documents are fewer than records, and a resume must skip records
    import json
    path = tmp_path / "gappy.jsonl"
    rows = []
    for index, text in enumerate(corpus["texts"]):
        rows.append({"text": text})
        if index % 3 == 0:
            rows.append({"text": None if index % 2 else ""})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = hf_config(dict(corpus, files=[str(path)]), streaming=True)
    shard = node_data(config, 0, 1)[1]
    drain(shard, 3, batch_size=2)
    saved = shard.position_state()
    expected = drain(shard, 5, batch_size=2)
    resumed = node_data(config, 0, 1)[1]
    resumed.load_position_state(saved)
    assert drain(resumed, 5, batch_size=2) == expected
    # a checkpoint written before the record count was kept: the resume passes the documents again
    old = {"stream": {key: value for key, value in saved["stream"].items() if key != "record_index"}}
    from_old = node_data(config, 0, 1)[1]
    from_old.load_position_state(old)
    assert drain(from_old, 5, batch_size=2) == expected


def test_streaming_non_iid_gives_each_node_whole_files(corpus):
    config = hf_config(corpus, streaming=True, shards="non_iid")
    layouts = [node_data(config, index, 3)[1].layout for index in range(3)]
    assert [[files[0] for files in layout.files] for layout in layouts] == [
        [corpus["files"][0], corpus["files"][3]], [corpus["files"][1]], [corpus["files"][2]]]
    with pytest.raises(ConfigError, match="non_iid with data.hf_dataset.streaming gives each node whole data files"):
        node_data(config, 0, 5)


def test_streaming_non_iid_deals_the_files_a_glob_matches(corpus):
    """``corpus/*.jsonl`` over 4 files is 4 files to deal, not one (the launcher's check counts the same way)."""
    from pathlib import Path
    pattern = str(Path(corpus["files"][0]).parent / "*.jsonl")
    config = parse_config({
        "model": {"hf": {"config": corpus["model"]}, "seq_len": 16},
        "data": {"hf_dataset": {"path": "json", "data_files": [pattern], "streaming": True},
                 "tokenizer": corpus["tokenizer"], "shards": "non_iid", "eval_batches": 1, "eval_batch_size": 4},
        "nodes": NODES}, "run.yaml")
    preflight(config)
    layouts = [node_data(config, index, 3)[1].layout for index in range(3)]
    files = sorted(corpus["files"])
    assert [[group[0] for group in layout.files] for layout in layouts] == [[files[0], files[3]], [files[1]], [files[2]]]
    iid = parse_config({**config.model_dump(mode="json", exclude_none=True),
                        "data": {**config.data.model_dump(mode="json", exclude_none=True), "shards": "iid"}}, "run.yaml")
    assert [group for group in node_data(iid, 0, 3)[1].layout.files] == [[pattern]]  # iid reads the glob as one group
    from geodiloco.runtime.hf_data import stream_files
    recursive = str(Path(corpus["files"][0]).parent.parent / "**" / "*.jsonl")
    twice = SimpleNamespace(data_files=[recursive, files[0]])  # a file named twice is dealt once
    assert stream_files(twice, "non_iid") == [[path] for path in files]


def test_a_tokenizer_larger_than_the_embedding_is_one_config_error(corpus, tmp_path):
    big_vocab = train_tokenizer(corpus["texts"] * 3, tmp_path / "big", vocab_size=400)
    config = parse_config({"model": {"hf": {"config": corpus["model"]}, "seq_len": 16},
                           "data": {"hf_dataset": {"path": "json", "data_files": corpus["files"]},
                                    "tokenizer": str(big_vocab)}, "nodes": NODES}, "run.yaml")
    with pytest.raises(ConfigError, match=r"data\.tokenizer: its vocabulary has \d+ tokens but the model's "
                                          r"embedding has 320 \(vocab_size\)"):
        preflight(config)


@pytest.mark.parametrize("data, message", [
    ({"hf_dataset": {"path": "json", "data_files": ["nowhere/*.jsonl"]}, "tokenizer": "TOK"},
     "data.hf_dataset.data_files: nowhere/*.jsonl matches no file"),
    ({"hf_dataset": {"path": "json"}, "tokenizer": "TOK"}, "data.hf_dataset.data_files: the json builder reads local files"),
    ({"hf_dataset": {"path": "json", "data_files": ["FILE"]}, "tokenizer": "missing_dir"},
     "data.tokenizer: missing_dir is not a tokenizer directory"),
])
def test_bad_data_settings_name_the_field(corpus, data, message):
    data = {key: (value.replace("TOK", corpus["tokenizer"]) if isinstance(value, str) else value)
            for key, value in data.items()}
    if data["hf_dataset"].get("data_files") == ["FILE"]:
        data["hf_dataset"]["data_files"] = corpus["files"]
    config = parse_config({"model": {"hf": {"config": corpus["model"]}}, "data": data, "nodes": NODES}, "run.yaml")
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("*", r"\*")):
        preflight(config)


def test_a_folder_given_as_a_data_file_is_named_with_the_glob_that_lists_it(corpus):
    from pathlib import Path
    folder = str(Path(corpus["files"][0]).parent)
    config = config_for_files(corpus, [folder])
    with pytest.raises(ConfigError) as refused:
        preflight(config)
    assert str(refused.value) == (f"data.hf_dataset.data_files: {folder} is a directory; list its files, e.g. "
                                  f"{folder}/*.jsonl")
    with pytest.raises(ConfigError) as relative:
        preflight(config_for_files(corpus, ["nowhere/*.jsonl"]))
    assert str(relative.value) == ("data.hf_dataset.data_files: nowhere/*.jsonl matches no file (relative paths are "
                                   f"read from the current directory, {Path.cwd()})")


def test_hf_dataset_without_tokenizer_and_a_wrong_text_field(corpus):
    with pytest.raises(ConfigError, match="data.hf_dataset and data.tokenizer go together"):
        parse_config({"data": {"hf_dataset": {"path": "json", "data_files": corpus["files"]}}, "nodes": NODES}, "r.yaml")
    config = hf_config(corpus)
    config.data.hf_dataset.text_field = "body"
    with pytest.raises(ConfigError, match="data.hf_dataset.text_field: records have no 'body' field; their fields are text"):
        node_data(config, 0, 3)


def config_for_files(corpus: dict, files: list[str]) -> object:
    return parse_config({"model": {"hf": {"config": corpus["model"]}, "seq_len": 16},
                         "data": {"hf_dataset": {"path": "json", "data_files": files}, "tokenizer": corpus["tokenizer"]},
                         "nodes": NODES}, "run.yaml")


@pytest.mark.parametrize("content, message", [
    (b"", "bad.jsonl is empty; remove it from the corpus or fill it"),
    (b'{"text": "one"}\n{"text": "two\n', "bad.jsonl line 2 is not JSON (Unterminated string"),
    ('{"text": "café"}\n'.encode("latin-1"), "bad.jsonl is not UTF-8 text (byte 13: invalid continuation byte)"),
])
def test_a_corpus_file_the_nodes_could_not_read_stops_the_run_before_it_starts(corpus, tmp_path, content, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    with pytest.raises(ConfigError, match=re.escape(message)):
        preflight(config_for_files(corpus, corpus["files"] + [str(bad)]))


def test_records_without_the_text_field_are_refused_when_most_and_counted_when_few(corpus, tmp_path, capsys,
                                                                                   monkeypatch):
    from geodiloco.runtime import hf_data
    from geodiloco.runtime.hf_data import load_token_corpus
    monkeypatch.setattr(hf_data, "_told_skipped", set())
    texts = documents(6)
    mostly = tmp_path / "mostly.jsonl"  # datasets reads the other key's records as text: null
    write_lines(mostly, [{"text": texts[0]}] + [{"content": text} for text in texts[1:]])
    with pytest.raises(ConfigError, match=r"data\.hf_dataset\.text_field: 5 of 6 records read have no text in 'text' "
                                          r"\(null or another type\)"):
        load_token_corpus(config_for_files(corpus, [str(mostly)]).data.hf_dataset, corpus["tokenizer"], 10**6)
    few = tmp_path / "few.jsonl"
    write_lines(few, [{"text": text} for text in texts] + [{"text": None}])
    kept = load_token_corpus(config_for_files(corpus, [str(few)]).data.hf_dataset, corpus["tokenizer"], 10**6)
    tokenizer = load_tokenizer(corpus["tokenizer"])
    assert len(kept) == sum(len(tokenizer.encode(text)) + 1 for text in texts)  # every text, each with its end token
    assert "[geodiloco] data.hf_dataset: skipped 1 of 7 records whose 'text' is null or not text" in capsys.readouterr().err
    # nulls first and text after: decided on the whole, not on the first records; told once per process
    late = tmp_path / "late.jsonl"
    write_lines(late, [{"text": None}] * 3 + [{"text": text} for text in texts])
    load_token_corpus(config_for_files(corpus, [str(late)]).data.hf_dataset, corpus["tokenizer"], 10**6)
    assert "skipped" not in capsys.readouterr().err


@pytest.mark.parametrize("name, content, texts", [
    ("gz.jsonl.gz", gzip.compress(b'{"text": "one"}\n{"text": "two"}\n', mtime=0), ["one", "two"]),
    ("bom.jsonl", '\ufeff{"text": "one"}\n{"text": "two"}\n'.encode("utf-8"), ["one", "two"]),
    ("array.json", b'[\n  {"text": "one"},\n  {"text": "two"}\n]\n', ["one", "two"]),
    ("pretty.json", b'{\n  "text": "one"\n}\n', ["one"]),
])
def test_json_files_datasets_reads_in_other_shapes_are_left_to_it(corpus, tmp_path, name, content, texts):
    from geodiloco.runtime.preflight import check_json_lines_head
    path = tmp_path / name
    path.write_bytes(content)
    assert check_json_lines_head(path, "text") is None  # not refused here ...
    read = datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    assert read["text"] == texts  # ... since datasets' json builder reads each of these


def test_a_record_that_breaks_while_reading_is_a_config_error_naming_the_cause():
    from geodiloco.runtime.hf_data import document_texts

    def records():
        yield {"text": "fine"}
        raise UnicodeDecodeError("utf-8", b"\xe9", 0, 1, "invalid continuation byte")
    reader = document_texts(records(), "text")
    assert next(reader) == "fine"
    with pytest.raises(ConfigError, match=r"cannot read record 2 of the corpus \(UnicodeDecodeError: 'utf-8' codec"):
        next(reader)


def test_a_model_type_transformers_does_not_build_is_refused_with_the_close_names(corpus, tmp_path):
    import json
    config_json = json.loads(open(corpus["model"]).read())
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps({**config_json, "model_type": "lama"}))
    config = parse_config({"model": {"hf": {"config": str(bad)}, "seq_len": 16},
                           "data": {"hf_dataset": {"path": "json", "data_files": corpus["files"]},
                                    "tokenizer": corpus["tokenizer"]}, "nodes": NODES}, "run.yaml")
    with pytest.raises(ConfigError, match=r"model\.hf\.config: .* has model_type 'lama', which this transformers does "
                                          r"not build; did you mean 'llama'"):
        preflight(config)


def write_lines(path, records: list[dict]) -> None:
    import json
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


@pytest.mark.parametrize("path, meant", [("jsonl", "json"), ("txt", "text"), ("parqet", "parquet"), ("Json", "json")])
def test_a_misspelt_local_builder_is_named_before_datasets_looks_for_it_on_the_hub(corpus, path, meant):
    config = config_for_files(corpus, corpus["files"])
    config.data.hf_dataset.path = path
    with pytest.raises(ConfigError, match=re.escape(f"data.hf_dataset.path: {path!r} is no local builder nor folder "
                                                    f"(datasets would look for it on the Hugging Face Hub); for local "
                                                    f"files write {meant!r}")):
        preflight(config)


def test_a_tokenized_corpus_too_small_for_its_eval_set_names_its_own_cap(corpus):
    config = hf_config(corpus, eval_batches=100_000)
    with pytest.raises(ConfigError, match=r"lower them or give data\.hf_dataset more text \(it holds only \d+ tokens, "
                                          r"under data\.max_tokens \d+\)"):
        node_data(config, 0, 3)
    config = hf_config(corpus, eval_batches=30, max_tokens=1000)  # the cap, not the corpus, is what is short
    with pytest.raises(ConfigError, match=r"lower them or raise data\.max_tokens$"):
        node_data(config, 0, 3)


def test_a_tokenizer_without_a_boundary_token_is_told_once_by_the_launchers_preflight(corpus, tmp_path, capsys):
    import json
    import shutil
    plain = tmp_path / "plain_tokenizer"
    shutil.copytree(corpus["tokenizer"], plain)
    settings = json.loads((plain / "tokenizer_config.json").read_text())
    (plain / "tokenizer_config.json").write_text(json.dumps({key: value for key, value in settings.items()
                                                             if key not in ("eos_token", "sep_token")}))
    (plain / "special_tokens_map.json").unlink(missing_ok=True)
    config = hf_config(corpus)
    config.data.tokenizer = str(plain)
    preflight(config, data=False)  # a node's preflight: silent
    assert "eos_token" not in capsys.readouterr().out
    preflight(config)
    assert f"[geodiloco] data.tokenizer: {plain} names no eos_token nor sep_token" in capsys.readouterr().out
    config.data.tokenizer = corpus["tokenizer"]
    preflight(config)
    assert "eos_token" not in capsys.readouterr().out


@pytest.mark.parametrize("sample_by, documents_read", [(None, ["first line\nsecond line\n\nnew paragraph\n",
                                                               "other file\n"]),
                                                       ("line", ["first line", "second line", "new paragraph",
                                                                 "other file"]),
                                                       ("paragraph", ["first line\nsecond line",
                                                                      "new paragraph\n", "other file\n"])])
def test_the_text_builder_reads_a_file_as_one_document_unless_told_otherwise(corpus, tmp_path, sample_by,
                                                                              documents_read):
    from geodiloco.runtime.hf_data import document_texts, open_dataset
    (tmp_path / "a.txt").write_text("first line\nsecond line\n\nnew paragraph\n")
    (tmp_path / "b.txt").write_text("other file\n")
    data = {"path": "text", "data_files": str(tmp_path / "*.txt"), **({"sample_by": sample_by} if sample_by else {})}
    config = hf_config(corpus, hf_dataset=data)
    assert config.data.hf_dataset.data_files == [str(tmp_path / "*.txt")]  # one glob given as a string
    assert list(document_texts(open_dataset(config.data.hf_dataset), "text")) == documents_read


def test_sample_by_belongs_to_the_text_builder_only(corpus):
    with pytest.raises(ConfigError, match="data.hf_dataset.sample_by: read only by the text builder"):
        hf_config(corpus, hf_dataset={"path": "json", "data_files": corpus["files"], "sample_by": "line"})


def test_a_folder_whose_files_sit_in_subfolders_is_named_with_a_recursive_glob(tmp_path):
    from geodiloco.runtime.preflight import folder_glob
    (tmp_path / "shards" / "2024").mkdir(parents=True)
    (tmp_path / "shards" / "2024" / "a.jsonl").write_text('{"text": "one"}\n')
    assert folder_glob(tmp_path / "shards", "json") == tmp_path / "shards" / "**" / "*.jsonl"
    (tmp_path / "shards" / "b.jsonl").write_text('{"text": "two"}\n')
    assert folder_glob(tmp_path / "shards", "json") == tmp_path / "shards" / "*.jsonl"
    assert folder_glob(tmp_path / "shards", "text") == tmp_path / "shards" / "*.txt"  # none anywhere: the plain one


@pytest.mark.slow
def test_a_hub_dataset_this_machine_cannot_read_stops_the_run_before_any_node_starts(tmp_path):
    import os
    import subprocess
    import sys
    import yaml
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    config = {"model": {"hf": {"config": str(repo / "experiments/configs/hf/llama_tiny.json")}, "seq_len": 32},
              "data": {"hf_dataset": {"path": "no-such-owner/no-such-dataset"}, "tokenizer": str(tmp_path)},
              "comm": {"elastic": {"enabled": False}},
              "nodes": [{"name": name, "gpus": ["A100-SXM4-80GB"], "emulate": {"step_time_s": 0.1}} for name in "ab"]}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")  # no Hub here: fail at once, not after retries
    done = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", "run", "--no-report", "--config",
                           str(tmp_path / "run.yaml"), "--run-dir", str(tmp_path / "run")], capture_output=True,
                          text=True, timeout=180, env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith(
        "geodiloco run: error: data.hf_dataset.path: 'no-such-owner/no-such-dataset' cannot be read on this machine ("), \
        done.stderr
    assert "nodes on this machine" not in done.stdout  # refused before any node was started
