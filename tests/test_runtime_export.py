"""`geodiloco export` / `evaluate` of a finished run from another directory: the run keeps absolute paths,
an export that fails leaves nothing behind, a tokenizer gone since the run is named."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from geodiloco.common.schema import ConfigError
from geodiloco.runtime import checkpoint, export
from geodiloco.runtime.config import load_config, parse_config
from geodiloco.runtime.models import build_configured_model
from geodiloco.runtime.run_dir import resume_changes


def finished_run(run_dir: Path, config: dict) -> Path:
    """A run directory as a run leaves it: its config.yaml and round 1's committed global model."""
    run_dir.mkdir(parents=True)
    parsed = parse_config(config, "run.yaml")
    (run_dir / "config.yaml").write_text(parsed.to_yaml())
    model = build_configured_model(parsed.model, parsed.run.seed)
    checkpoint.save_global(run_dir, 0, {"outer": {"global_params": [p.detach().clone() for p in model.parameters()]}})
    checkpoint.mark_latest(run_dir, 0, keep=2)
    return run_dir


def test_the_saved_config_holds_absolute_input_paths_and_resumes_a_run_saved_with_relative_ones(tmp_path,
                                                                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    config = parse_config({"model": {"preset": "tiny"}, "data": {"source": "corpus"},
                           "nodes": [{"name": "a"}, {"name": "b"}]}, "run.yaml")
    saved = yaml.safe_load(config.to_yaml())
    assert saved["data"]["source"] == str(tmp_path / "corpus")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_none=True)))
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["source"] == "corpus"  # an older run
    assert resume_changes(run_dir, config) == []  # the same corpus, whichever way it is written
    stdlib = parse_config({"model": {"preset": "tiny"}, "nodes": [{"name": "a"}]}, "run.yaml")
    assert yaml.safe_load(stdlib.to_yaml())["data"]["source"] == "stdlib"


def test_an_export_that_fails_leaves_no_folder_and_a_retry_writes_it(tmp_path, monkeypatch):
    run_dir = finished_run(tmp_path / "run", {"model": {"preset": "tiny"}, "nodes": [{"name": "a"}]})
    out = tmp_path / "exports" / "model"

    def disk_full(*_args):
        raise OSError(28, "No space left on device")
    with monkeypatch.context() as patch:
        patch.setattr(export, "write_model_files", disk_full)
        with pytest.raises(OSError):
            export.export_global_model(run_dir, out)
    assert not out.exists() and os.listdir(tmp_path / "exports") == []
    assert "model.safetensors + dims.json" in export.export_global_model(run_dir, out)
    assert sorted(os.listdir(out)) == ["dims.json", "model.safetensors"]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # as mkdir makes a folder, not mkdtemp's private one


def test_a_preset_name_or_a_missing_path_is_saved_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "json").mkdir()  # a folder named like the builder does not make the builder a path
    config = parse_config({"model": {"file": "tiny"}, "nodes": [{"name": "a"}]}, "run.yaml")
    saved = yaml.safe_load(config.to_yaml())
    assert saved["model"]["file"] == "tiny"
    assert load_config_text(tmp_path, config.to_yaml()).model.dims() == config.model.dims()
    from geodiloco.runtime.config import with_absolute_paths
    mapping = {"data": {"hf_dataset": {"path": "json", "data_files": ["corpus/*.jsonl", "missing/*.jsonl"]}}}
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.jsonl").write_text('{"text": "x"}\n')
    assert with_absolute_paths(mapping, tmp_path)["data"]["hf_dataset"] == {
        "path": "json", "data_files": [str(tmp_path / "corpus" / "*.jsonl"), "missing/*.jsonl"]}


def load_config_text(directory: Path, text: str):
    path = directory / "saved.yaml"
    path.write_text(text)
    return load_config(path)


def test_a_tokenizer_gone_since_the_run_is_named_before_anything_is_written(tmp_path):
    from tests.hf_helpers import llama_config
    config_path = llama_config(tmp_path / "config.json")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump({
        "model": {"hf": {"config": str(config_path)}},
        "data": {"hf_dataset": {"path": "json", "data_files": [str(tmp_path / "x.jsonl")]},
                 "tokenizer": str(tmp_path / "gone")},
        "nodes": [{"name": "a"}]}))
    load_config(run_dir / "config.yaml")
    with pytest.raises(ConfigError, match=f"data.tokenizer: {tmp_path / 'gone'} \\(from {run_dir / 'config.yaml'}\\) "
                                          "no longer exists"):
        export.export_global_model(run_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_damaged_newest_round_gives_way_to_the_newest_intact_one_and_a_chosen_damaged_round_is_named(tmp_path,
                                                                                                       capsys):
    run_dir = finished_run(tmp_path / "run", {"model": {"preset": "tiny"}, "nodes": [{"name": "a"}]})
    first = checkpoint.load_global(run_dir, 0)["outer"]["global_params"]
    checkpoint.save_global(run_dir, 1, {"outer": {"global_params": [param + 1.0 for param in first]}})
    checkpoint.mark_latest(run_dir, 1, keep=2)
    damaged = checkpoint.round_dir(run_dir, 1) / checkpoint.GLOBAL_FILE
    damaged.write_bytes(damaged.read_bytes()[:1000])

    described = export.export_global_model(run_dir, tmp_path / "latest")
    assert described.startswith("round 1 of ")
    assert f"checkpoint refused: {damaged}: not a readable safetensors file" in capsys.readouterr().err
    from safetensors.torch import load_file
    exported = load_file(str(tmp_path / "latest" / "model.safetensors"))
    assert sum(tensor.sum().item() for tensor in exported.values()) == pytest.approx(
        sum(param.sum().item() for param in first), rel=1e-6)  # round 1's weights, not round 2's (+1 each)

    with pytest.raises(ConfigError, match=r"^--round 2: .*not a readable safetensors file .*; other kept rounds: "
                                          r"1 \(round_00000\)$"):
        export.export_global_model(run_dir, tmp_path / "chosen", round_number=2)
    assert not (tmp_path / "chosen").exists()
    (checkpoint.round_dir(run_dir, 0) / checkpoint.GLOBAL_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="no kept round's global checkpoint is intact"):
        export.export_global_model(run_dir, tmp_path / "none")


def test_the_exported_files_take_the_umask_modes_and_an_unwritable_out_names_out(tmp_path):
    run_dir = finished_run(tmp_path / "run", {"model": {"preset": "tiny"}, "nodes": [{"name": "a"}]})
    umask = os.umask(0o027)
    try:
        export.export_global_model(run_dir, tmp_path / "model")
    finally:
        os.umask(umask)
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "model").iterdir()}
    assert modes == {"model.safetensors": 0o640, "dims.json": 0o640}  # safetensors left its file 0o600
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"^--out .*file/model: cannot write in .*file \(.*\); choose another directory$"):
        export.export_global_model(run_dir, tmp_path / "file" / "model")


def kept_hf_run(tmp_path: Path) -> tuple[Path, Path, Path, dict]:
    """A transformers run as it starts: config.yaml naming the user's config.json and tokenizer, and the run's
    copies of both (save_run_files), before the user edits anything."""
    from geodiloco.runtime.run_files import save_run_files
    from tests.hf_helpers import llama_config, train_tokenizer
    model_json = llama_config(tmp_path / "config.json")
    tokenizer_dir = train_tokenizer(["one two three four", "five six seven"] * 20, tmp_path / "tok", vocab_size=300)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"text": "one two three"}\n')
    config = {"model": {"hf": {"config": str(model_json)}},
              "data": {"tokenizer": str(tokenizer_dir), "hf_dataset": {"path": "json", "data_files": [str(corpus)]}},
              "nodes": [{"name": "a"}]}
    parsed = parse_config(config, "run.yaml")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(parsed.to_yaml())
    save_run_files(run_dir, parsed, build_configured_model(parsed.model, parsed.run.seed))
    return run_dir, model_json, tokenizer_dir, config


def test_a_resume_refuses_a_model_config_or_tokenizer_edited_since_the_run_started(tmp_path):
    import json
    run_dir, model_json, tokenizer_dir, config = kept_hf_run(tmp_path)
    assert resume_changes(run_dir, parse_config(config, "run.yaml")) == []  # untouched: nothing to say
    model_json.write_text(json.dumps({**json.loads(model_json.read_text()), "hidden_size": 64,
                                      "intermediate_size": 128}))
    with pytest.raises(ConfigError) as refused:
        resume_changes(run_dir, parse_config(config, "run.yaml"))
    assert str(refused.value) == (
        f"--resume: model.hf.config: {model_json} changed since this run started (head_dim 8 -> 16, "
        f"hidden_size 32 -> 64, intermediate_size 64 -> 128); the run trained with its copy {run_dir}/hf_model/config.json: put that back "
        f"(cp {run_dir}/hf_model/config.json {model_json}), or start a new run")
    (run_dir / "hf_model" / "config.json").replace(model_json)  # as the message says
    (run_dir / "hf_model").rmdir()  # the copy is gone now: as an older run without one, it resumes as before
    assert resume_changes(run_dir, parse_config(config, "run.yaml")) == []


def test_a_resume_refuses_a_tokenizer_retrained_in_place(tmp_path):
    from tests.hf_helpers import train_tokenizer
    run_dir, _, tokenizer_dir, config = kept_hf_run(tmp_path)
    train_tokenizer(["other words entirely", "and then some more"] * 20, tokenizer_dir, vocab_size=280)
    with pytest.raises(ConfigError, match=(
            rf"^--resume: data.tokenizer: {tokenizer_dir} changed since this run started \(vocabulary of \d+ tokens -> "
            rf"\d+, \d+ token\(s\) new or renumbered\); the model learned the token ids of the run's copy "
            rf"{run_dir}/tokenizer: put that back \(cp -r {run_dir}/tokenizer/. {tokenizer_dir}\), or start a new "
            rf"run$")):
        resume_changes(run_dir, parse_config(config, "run.yaml"))
    subprocess.run(["cp", "-r", f"{run_dir}/tokenizer/.", str(tokenizer_dir)], check=True)  # as the message says
    assert resume_changes(run_dir, parse_config(config, "run.yaml")) == []


def test_a_resume_refuses_a_tokenizer_that_splits_text_differently_with_the_same_vocabulary(tmp_path):
    import json
    run_dir, _, tokenizer_dir, config = kept_hf_run(tmp_path)
    tokenizer_file = tokenizer_dir / "tokenizer.json"
    spec = json.loads(tokenizer_file.read_text())
    spec["normalizer"] = {"type": "Lowercase"}  # the vocabulary and special tokens stay as they were
    tokenizer_file.write_text(json.dumps(spec))
    with pytest.raises(ConfigError, match=r"changed since this run started \(the same vocabulary splits text "
                                          r"differently \(e.g. 'The quick brown fox"):
        resume_changes(run_dir, parse_config(config, "run.yaml"))
