"""End to end: `geodiloco run` trains a transformers model on a tokenized JSONL corpus (real gloo
processes), logs to TensorBoard and W&B (offline), and `geodiloco export` writes a directory
that transformers loads with the run's final global parameters."""
from __future__ import annotations

import glob

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tensorboard")
pytest.importorskip("wandb")

from geodiloco.runtime import checkpoint
from tests.hf_helpers import documents, llama_config, train_tokenizer, write_jsonl
from tests.runtime_helpers import geodiloco, read_jsonl, small_config, write_config


@pytest.mark.slow
def test_transformers_model_on_jsonl_with_tensorboard_wandb_and_export(tmp_path, monkeypatch):
    texts = documents(200)
    files = write_jsonl(tmp_path / "corpus", texts, files=2)
    tokenizer = train_tokenizer(texts, tmp_path / "tokenizer")
    config = small_config(
        [{"name": "a", "gpus": ["A30"]}, {"name": "b", "gpus": ["RTX 3090"]}],
        model={"hf": {"config": str(llama_config(tmp_path / "config.json"))}, "seq_len": 32},
        data={"hf_dataset": {"path": "json", "data_files": files, "streaming": True}, "tokenizer": str(tokenizer),
              "eval_batches": 1, "eval_batch_size": 4},
        logging={"tensorboard": str(tmp_path / "tb"), "wandb": {"project": "geodiloco-test", "mode": "offline"}},
        checkpoint={"every_rounds": 1, "keep": 2})
    run_dir = tmp_path / "run"
    monkeypatch.setenv("WANDB_SILENT", "true")
    done = geodiloco("run", "--config", str(write_config(tmp_path, config)), "--sites", "local", "--run-dir",
                     str(run_dir), "--no-elastic", timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    evals = [row["eval_loss"] for row in metrics if row["node"] == "global" and row.get("eval_loss") is not None]
    assert len(evals) == 2 and evals[-1] < evals[0] < 6.0  # ln(320) = 5.77 at the start
    assert "GPU waste:" in done.stdout

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "tb" / "run")); events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"global/eval_loss", "node/a/train_loss", "node/b/tokens_per_s", "node/a/local_steps"} <= set(scalars)
    assert [round(item.value, 5) for item in events.Scalars("global/eval_loss")] == [round(value, 5) for value in evals]
    assert glob.glob(str(run_dir / "wandb" / "offline-run-*" / "run-*.wandb"))

    exported = tmp_path / "exported"
    done = geodiloco("export", str(run_dir), "--out", str(exported), timeout=120)
    assert done.returncode == 0, done.stderr
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(exported)
    assert len(AutoTokenizer.from_pretrained(exported)) == 320
    final = checkpoint.load_global(run_dir, 1)["outer"]["global_params"]
    assert all(torch.equal(param, saved) for param, saved in zip(model.parameters(), final, strict=True))
