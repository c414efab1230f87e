"""End to end: `geodiloco run` trains a transformers model on a tokenized JSONL corpus (real gloo
processes), logs to TensorBoard and W&B (offline), and `geodiloco export` writes a directory
that transformers loads with the run's final global parameters."""
from __future__ import annotations

import glob

import pytest
import torch

import transformers  # noqa: F401  (the dev extra has it: a missing one must fail, not skip)
import tensorboard  # noqa: F401
import wandb  # noqa: F401

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

    # after the run the user retrains the tokenizer in place and edits the model config: evaluate and export use
    # the copies the run kept, not the changed files (the checkpoints no longer fit the edited config)
    train_tokenizer(texts[:40], tmp_path / "tokenizer", vocab_size=300)
    llama_config(tmp_path / "config.json", hidden=48)
    scored = geodiloco("evaluate", str(run_dir), "--json", timeout=120)
    assert scored.returncode == 0, scored.stderr
    import json
    assert json.loads(scored.stdout)[-1]["eval_loss"] == pytest.approx(evals[-1], abs=1e-5)

    (tmp_path / "config.json").unlink()  # and then deletes it: the run's own copy still builds the model
    exported = tmp_path / "exported"
    done = geodiloco("export", str(run_dir), "--out", str(exported), timeout=120)
    assert done.returncode == 0, done.stderr
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(exported)
    tokenizer = AutoTokenizer.from_pretrained(exported)
    assert len(tokenizer) == 320
    # made for use: the cache on, and generation ends on the tokenizer's end of text (LLaMA's default is id 2)
    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert model.config.use_cache is True and model.generation_config.use_cache is True
    assert model.config.eos_token_id == model.generation_config.eos_token_id == end_of_text
    assert model.config.bos_token_id is None
    final = checkpoint.load_global(run_dir, 1)["outer"]["global_params"]
    assert all(torch.equal(param, saved) for param, saved in zip(model.parameters(), final, strict=True))
