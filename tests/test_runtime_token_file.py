"""Pre-tokenized corpora (``data.token_file``): nanoGPT-style raw ``.bin`` files and ``.npy`` arrays are
memory-mapped, windowed like any corpus, and refused with the field named when they cannot be trained on."""
from __future__ import annotations

import numpy as np
import pytest

from geodiloco.common.schema import ConfigError
from geodiloco.runtime.config import parse_config
from geodiloco.runtime.data import load_token_file
from geodiloco.runtime.data_sources import eval_set, node_data
from geodiloco.runtime.preflight import preflight

from runtime_helpers import geodiloco, read_jsonl, small_config, write_config

NODES = [{"name": name, "gpus": ["A100-SXM4-80GB"], "emulate": {"step_time_s": 0.05}} for name in ("a", "b")]
SEQ_LEN = 32
IDS = (np.arange(20_000) * 7919 % 30_011).astype(np.int64)  # ids up to 30,010: past uint8, under the vocab below


def config_for(token_file, **data) -> object:
    """Two nodes on a small decoder whose vocabulary (32,000) holds IDS."""
    dims = token_file.parent / "dims.json"
    dims.write_text('{"hidden_size": 64, "intermediate_size": 128, "num_layers": 1, "num_heads": 2, '
                    '"vocab_size": 32000, "max_seq_len": 64}')
    config = small_config(NODES, data={"token_file": str(token_file), "eval_batches": 2, "eval_batch_size": 4, **data})
    config["model"] = {"file": str(dims), "seq_len": SEQ_LEN}
    return parse_config(config, "run.yaml")


def windows_of(batches) -> list[list[int]]:
    return [row + [last] for inputs, targets in batches for row, last in zip(inputs.tolist(), targets[:, -1].tolist())]


def test_a_bin_and_an_npy_file_give_the_windows_of_the_ids_they_hold(tmp_path):
    IDS.astype(np.uint16).tofile(tmp_path / "train.bin")
    np.save(tmp_path / "train.npy", IDS.astype(np.int32))
    eval_bin, shard_bin = node_data(config_for(tmp_path / "train.bin"), 0, 2)
    eval_npy, shard_npy = node_data(config_for(tmp_path / "train.npy"), 0, 2)
    assert isinstance(shard_bin.corpus_array, np.memmap)  # mapped, not read into memory
    held_out = windows_of(eval_bin)
    assert held_out == windows_of(eval_npy) and len(held_out) == 8
    ids = IDS.tolist()
    starts = [ids.index(window[0]) for window in held_out]  # IDS has no repeated value in 20,000
    assert all(window == ids[start:start + SEQ_LEN + 1] for window, start in zip(held_out, starts))
    for _ in range(3):
        from_bin, from_npy = shard_bin.next_batch(4), shard_npy.next_batch(4)
        assert from_bin[0].dtype.is_floating_point is False and str(from_bin[0].dtype) == "torch.int64"
        for window in windows_of([from_bin]):
            start = ids.index(window[0])
            assert window == ids[start:start + SEQ_LEN + 1]
            assert all(abs(start - held) > SEQ_LEN for held in starts)  # no token shared with the eval set
        assert windows_of([from_bin]) == windows_of([from_npy])
    assert windows_of(eval_set(config_for(tmp_path / "train.bin"))) == held_out


def test_uint32_files_are_read_with_the_dtype_they_were_written_with(tmp_path):
    IDS.astype(np.uint32).tofile(tmp_path / "ids.bin")
    assert load_token_file(str(tmp_path / "ids.bin"), "uint32").tolist() == IDS.tolist()
    # read as uint16, every second value is an id's zero high half: ids that fit any vocabulary, so it is told apart
    with pytest.raises(ConfigError, match=r"data.token_file: .*ids.bin read as uint16 has a 0 in every second value "
                                          r"\(100% of them\): it looks written as uint32; set data.token_dtype: uint32"):
        load_token_file(str(tmp_path / "ids.bin"), "uint16")
    IDS.astype(np.int64).tofile(tmp_path / "ids64.bin")
    with pytest.raises(ConfigError, match="looks written as int64; set data.token_dtype: int64"):
        load_token_file(str(tmp_path / "ids64.bin"), "uint32")
    # a narrow file with zeros of its own (a padding id, say) in every other place but not all of them is read as is
    padded = IDS.astype(np.uint16).copy()
    padded[1::2][::3] = 0
    padded.tofile(tmp_path / "padded.bin")
    assert load_token_file(str(tmp_path / "padded.bin"), "uint16").tolist() == padded.tolist()


@pytest.mark.parametrize("write, dtype, message", [
    (lambda path: None, "uint16", "is not a file"),
    (lambda path: path.write_bytes(b"\x01\x00\x02"), "uint16", "has 3 bytes, not a whole number of uint16 values"),
    (lambda path: path.write_bytes(b""), "uint16", "has 0 bytes"),
])
def test_a_missing_or_partial_bin_file_is_refused_naming_the_field(tmp_path, write, dtype, message):
    path = tmp_path / "train.bin"
    write(path)
    with pytest.raises(ConfigError, match=f"data.token_file: .*{message}"):
        load_token_file(str(path), dtype)


def test_an_npy_file_that_is_not_one_flat_integer_array_is_refused(tmp_path):
    np.save(tmp_path / "grid.npy", np.zeros((4, 5), dtype=np.int32))
    np.save(tmp_path / "float.npy", np.zeros(10, dtype=np.float32))
    with pytest.raises(ConfigError, match=r"array of int32 of shape \(4, 5\); token ids are one flat array"):
        load_token_file(str(tmp_path / "grid.npy"), "uint16")
    with pytest.raises(ConfigError, match="array of float32"):
        load_token_file(str(tmp_path / "float.npy"), "uint16")


def test_ids_past_the_vocabulary_or_negative_stop_the_run_before_any_node_starts(tmp_path):
    np.save(tmp_path / "big.npy", np.array([1, 2, 40_000] * 3000, dtype=np.int32))
    np.save(tmp_path / "negative.npy", np.array([1, -3, 2] * 3000, dtype=np.int32))
    with pytest.raises(ConfigError, match="data.token_file: .*big.npy holds token id 40000, but the model's embedding has rows "
                                          r"0-31999 \(vocab_size 32000\)"):
        preflight(config_for(tmp_path / "big.npy"))
    with pytest.raises(ConfigError, match="data.token_file: .*negative.npy holds token id -3"):
        preflight(config_for(tmp_path / "negative.npy"))


def test_a_token_file_too_short_for_the_eval_set_says_how_many_tokens_it_holds(tmp_path):
    IDS[:200].astype(np.uint16).tofile(tmp_path / "short.bin")
    with pytest.raises(ConfigError, match=r"give data.token_file more tokens \(it holds 200\)"):
        preflight(config_for(tmp_path / "short.bin"))


def test_a_token_file_goes_alone(tmp_path):
    base = small_config(NODES, data={"token_file": "train.bin", "source": "corpus/"})
    with pytest.raises(ConfigError, match="give data.token_file .* or data.source, not both"):
        parse_config(base, "run.yaml")
    with pytest.raises(ConfigError, match="data.token_dtype: describes data.token_file, which is not set"):
        parse_config(small_config(NODES, data={"token_dtype": "uint32"}), "run.yaml")


@pytest.mark.slow
def test_a_run_trains_on_a_token_file_and_records_it(tmp_path):
    # byte values stored as uint16 ids: the tiny preset's vocabulary holds them
    ids = (np.arange(60_000) * 31 % 256).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")
    config = small_config(NODES, data={"token_file": str(tmp_path / "train.bin"), "eval_batches": 1,
                                       "eval_batch_size": 4})
    run_dir = tmp_path / "run"
    done = geodiloco("run", "--no-report", "--config", str(write_config(tmp_path, config)), "--run-dir", str(run_dir),
                     timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "data.token_file: 60,000 tokens (uint16)" in done.stdout
    import json
    record = json.loads((run_dir / "data.json").read_text())
    assert record["corpus"]["tokens"] == 60_000
    losses = [row["eval_loss"] for row in read_jsonl(run_dir / "metrics.jsonl") if row.get("eval_loss") is not None]
    assert len(losses) == 2 and losses[-1] < losses[0]


def test_a_saved_config_without_a_token_file_parses_again(tmp_path):
    # every run saves its whole config, defaults included; reading it back must not refuse token_dtype
    from geodiloco.runtime.config import load_config
    config = parse_config(small_config(NODES), "run.yaml")
    (tmp_path / "config.yaml").write_text(config.to_yaml())
    assert load_config(tmp_path / "config.yaml").data.token_dtype == "uint16"


def test_the_saved_config_names_a_relative_token_file_absolutely(tmp_path, monkeypatch):
    # evaluate, export and --resume read the run's config.yaml from any directory
    from geodiloco.runtime.config import with_absolute_paths
    IDS.astype(np.uint16).tofile(tmp_path / "train.bin")
    monkeypatch.chdir(tmp_path)
    saved = with_absolute_paths({"data": {"token_file": "train.bin"}}, tmp_path)
    assert saved["data"]["token_file"] == str(tmp_path / "train.bin")


def test_an_export_of_a_token_file_run_names_the_ids_it_trained_on(tmp_path):
    from pathlib import Path
    from geodiloco.runtime.export import write_model_files
    from geodiloco.runtime.models import build_configured_model
    repo = Path(__file__).resolve().parents[1]
    IDS.astype(np.uint16).tofile(tmp_path / "train.bin")
    config = parse_config({"model": {"hf": {"config": str(repo / "experiments/configs/hf/llama_tiny.json")},
                                     "seq_len": 32},
                           "data": {"token_file": str(tmp_path / "train.bin")}, "nodes": NODES}, "run.yaml")
    (tmp_path / "out").mkdir()
    said = write_model_files(config, build_configured_model(config.model, 0), tmp_path / "out")
    assert said == ("a transformers save_pretrained directory without a tokenizer (the run trained on the ids of "
                    f"data.token_file {tmp_path / 'train.bin'}: add the tokenizer that wrote them)")
    assert (tmp_path / "out" / "config.json").is_file()


def test_a_large_token_file_is_digested_from_samples_that_see_an_edit(tmp_path, monkeypatch):
    from geodiloco.runtime import data_record
    monkeypatch.setattr(data_record, "SAMPLED_ABOVE_BYTES", 1000)
    monkeypatch.setattr(data_record, "SAMPLE_BLOCK_BYTES", 64)
    ids = (np.arange(50_000) % 4093).astype(np.uint16)
    ids.tofile(tmp_path / "train.bin")
    first = data_record.corpus_digest(load_token_file(str(tmp_path / "train.bin"), "uint16"))
    assert first["sampled"] is True and first["tokens"] == 50_000
    assert data_record.corpus_digest(load_token_file(str(tmp_path / "train.bin"), "uint16")) == first
    ids[-1] = 7  # the last block is always sampled
    ids.tofile(tmp_path / "train.bin")
    assert data_record.corpus_digest(load_token_file(str(tmp_path / "train.bin"), "uint16"))["sha256"] != first["sha256"]
    small = ids[:100]
    assert data_record.corpus_digest(small) == data_record.tokens_digest([small])  # in memory: read whole


def test_the_id_range_is_found_in_slices(monkeypatch):
    from geodiloco.runtime import data_sources
    monkeypatch.setattr(data_sources, "ID_RANGE_CHUNK", 7)
    ids = np.array([5, 9, 3, 40, 2, 8, 1, 6, 77, 4, 0, 12, 11, -2, 30], dtype=np.int32)
    assert data_sources.id_range(ids) == (-2, 77)
    assert data_sources.id_range(ids[:10]) == (1, 77)
