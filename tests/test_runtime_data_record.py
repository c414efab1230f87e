"""A run records what data it trained and evaluated on; a resume or `geodiloco evaluate` on changed
files says so in one line (the config names data by path only, so an edited corpus looks unchanged)."""
import json

import numpy as np
import pytest
import torch

from geodiloco.runtime.data_record import (RECORD_FILE, data_record, evaluate_notice, resume_notice,
                                           tokens_digest, write_record)
from runtime_helpers import geodiloco, small_config, write_config


def batches(values, batch_size):
    windows = torch.tensor(values, dtype=torch.long).reshape(-1, 3)
    return [(windows[index:index + batch_size], windows[index:index + batch_size])
            for index in range(0, len(windows), batch_size)]


def test_the_digest_follows_the_values_not_the_batching():
    values = list(range(12))
    assert data_record(batches(values, 1), None) == data_record(batches(values, 2), None)
    changed = data_record(batches(values[:-1] + [99], 2), None)
    assert changed["eval_set"]["tokens"] == 12
    assert changed["eval_set"]["sha256"] != data_record(batches(values, 2), None)["eval_set"]["sha256"]
    assert tokens_digest([np.arange(5, dtype=np.uint8)])["tokens"] == 5


def test_notices_name_what_changed_and_stay_quiet_otherwise(tmp_path):
    corpus = np.frombuffer(b"some text of a corpus", dtype=np.uint8)
    eval_batches = batches(list(range(12)), 2)
    assert resume_notice(tmp_path, data_record(eval_batches, corpus)) is None  # a run from before the record
    write_record(tmp_path, data_record(eval_batches, corpus))
    assert json.loads((tmp_path / RECORD_FILE).read_text())["corpus"]["tokens"] == len(corpus)
    assert resume_notice(tmp_path, data_record(eval_batches, corpus)) is None
    assert evaluate_notice(tmp_path, eval_batches) is None

    longer = np.frombuffer(b"some text of a corpus, and more", dtype=np.uint8)
    notice = resume_notice(tmp_path, data_record(eval_batches, longer))
    assert notice.startswith(f"data changed since this run started (corpus has {len(longer)} tokens, it had "
                             f"{len(corpus)}): training resumes")
    edited = np.frombuffer(b"SOME text of a corpus", dtype=np.uint8)
    assert "(corpus has the same 21 tokens but other contents)" in resume_notice(tmp_path, data_record(eval_batches, edited))
    other_eval = batches(list(range(1, 13)), 2)
    assert "eval set has the same 12 tokens but other contents" in evaluate_notice(tmp_path, other_eval)
    # a streamed dataset has no corpus digest: only its eval set is compared
    assert resume_notice(tmp_path, data_record(eval_batches, None)) is None


@pytest.mark.slow
def test_a_run_on_edited_files_warns_at_evaluate_and_at_resume(tmp_path):
    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    for index in range(4):
        (corpus_dir / f"part{index}.txt").write_text(f"line {index} of some ordinary english text. " * 400)
    config = small_config([{"name": "a"}, {"name": "b"}], checkpoint={"every_rounds": 1, "keep": 3},
                          diloco={"rounds": 1, "local_steps": 2, "batch_size": 4, "overlap": "none",
                                  "compression": "none"})
    config["data"] = {"source": str(corpus_dir), "max_bytes": 300_000, "eval_batches": 1, "eval_batch_size": 4}
    config_path = write_config(tmp_path, config)
    run_dir = tmp_path / "run"
    first = geodiloco("run", "--config", str(config_path), "--sites", "local", "--run-dir", str(run_dir),
                      "--no-report", timeout=180)
    assert first.returncode == 0, first.stderr[-2000:]
    saved = json.loads((run_dir / RECORD_FILE).read_text())
    assert saved["corpus"]["tokens"] == 4 * len("line 0 of some ordinary english text. ") * 400
    unchanged = geodiloco("evaluate", str(run_dir))
    assert unchanged.returncode == 0 and "data changed" not in unchanged.stderr, unchanged.stderr

    for index in range(4):
        (corpus_dir / f"part{index}.txt").write_text(f"LINE {index} OF SOME OTHER TEXT ENTIRELY, IN CAPITALS. " * 400)
    edited = geodiloco("evaluate", str(run_dir))  # eval inputs: 4 windows x seq_len 32 = 128 tokens
    assert edited.returncode == 0, edited.stderr
    assert "warning: the data changed since this run trained (eval set has the same 128 tokens but other " \
           "contents)" in edited.stderr

    config["diloco"]["rounds"] = 2
    write_config(tmp_path, config)
    resumed = geodiloco("run", "--config", str(config_path), "--sites", "local", "--run-dir", str(run_dir),
                        "--resume", "--no-report", timeout=180)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    # one line for the run (its nodes share the run directory and the data), whichever node says it
    assert resumed.stderr.count("data changed since this run started (corpus has") == 1, resumed.stderr
    assert json.loads((run_dir / RECORD_FILE).read_text()) == saved  # the record stays the run's start
