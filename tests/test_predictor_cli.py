"""`geodiloco predict`: JSON keys, human explanation, errors as exit code 2."""
import json

import pytest

from geodiloco.predictor.kernels import GPU_EFFICIENCY
from geodiloco.runtime.cli import main


def run(capsys, *argv):
    code = main(["predict", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_output_has_the_documented_keys(capsys):
    code, out, _ = run(capsys, "--gpu", "A30", "--gpu", "A30", "--model", "llama-150m", "--batch-size", "4",
                       "--seq-len", "1024", "--precision", "fp16", "--json")
    info = json.loads(out)
    assert code == 0
    for key in ("step_time_s", "tokens_per_s", "memory_gb", "max_batch_size", "bound"):
        assert key in info
    assert info["gpus"] == ["A30", "A30"] and info["samples_per_gpu"] == [2, 2]
    assert info["tokens_per_s"] * info["step_time_s"] == pytest.approx(4 * 1024)


def test_human_output_explains_the_pace(capsys):
    code, out, _ = run(capsys, "--gpu", "3 x RTX 2080 Ti", "--gpu", "Titan RTX", "--model", "llama-150m",
                       "--batch-size", "4", "--seq-len", "1024", "--precision", "fp16")
    assert code == 0
    # Turing is among the architectures the fit gives the half-rate share of the FP16 headline (113.8 TFLOPS)
    share_tflops = 113.8 * GPU_EFFICIENCY.half_rate_fp16_share
    assert (f"pace set by: RTX 2080 Ti at {share_tflops:.1f} TFLOPS "
            "(fp16_fp32acc_tflops -> fitted share of fp16_tflops)") in out
    assert "bound by" in out and "slowest GPU" in out


def test_unknown_gpu_is_predicted_as_a_stand_in_with_one_notice(capsys, caplog):
    with caplog.at_level("WARNING", logger="geodiloco.predictor"):
        code, out, _ = run(capsys, "--gpu", "RTX 2080 Tii", "--model", "tiny")
    assert code == 0 and "node: 1 x RTX 2080 Tii" in out
    [notice] = [record.getMessage() for record in caplog.records]
    assert "'RTX 2080 Tii' is not in the table" in notice and "closest known: RTX 2080 Ti" in notice


def test_model_file_and_seq_len_check(capsys, tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("hidden_size: 256\nintermediate_size: 512\nnum_hidden_layers: 2\nnum_attention_heads: 4\n"
                    "vocab_size: 1000\nmax_position_embeddings: 128\n")
    code, out, _ = run(capsys, "--gpu", "L4", "--model", str(path), "--seq-len", "128", "--json")
    assert code == 0 and json.loads(out)["seq_len"] == 128
    code, _, err = run(capsys, "--gpu", "L4", "--model", str(path), "--seq-len", "256")
    assert code == 2 and "max_seq_len 128" in err


def test_gpu_file_adds_a_gpu(capsys, tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text("gpus:\n  - {name: Lab X, architecture: ada, sm_count: 20, memory_gb: 16, "
                    "memory_bandwidth_gbps: 400, fp32_tflops: 20, bf16_tflops: 80, source: lab sheet}\n")
    code, out, _ = run(capsys, "--gpu-file", str(path), "--gpu", "lab x", "--model", "small", "--json")
    assert code == 0 and json.loads(out)["rate_tflops"] == 80


def test_a_micro_batch_above_a_gpus_share_is_noted_and_the_help_gives_the_defaults():
    from geodiloco.predictor.model import node_step_model
    from geodiloco.predictor.workload import resolve_dims
    explained = node_step_model(["RTX 3090"] * 4, resolve_dims("tiny"), 128, micro_batch_size=14).explain(16)
    assert explained["micro_batch_size"] == 4
    assert "micro-batch 14 is more than the 4 samples a GPU trains per step: each GPU runs them in one pass" \
        in explained["notes"]
    within = node_step_model(["RTX 3090"] * 4, resolve_dims("tiny"), 128, micro_batch_size=2).explain(16)["notes"]
    assert not any("is more than the" in note for note in within)
    import subprocess
    import sys
    shown = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", "predict", "--help"], capture_output=True,
                           text=True, env={**__import__("os").environ, "COLUMNS": "200"})
    assert "default: tiny" in shown.stdout and "(default: 4)" in shown.stdout and "(default: 128)" in shown.stdout


def test_json_carries_the_notices_a_script_would_otherwise_miss():
    from runtime_helpers import geodiloco
    completed = geodiloco("predict", "--gpu", "A100", "--gpu", "Quux 7", "--model", "tiny", "--json")
    assert completed.returncode == 0, completed.stderr
    notices = json.loads(completed.stdout)["notices"]
    assert len(notices) == 2
    assert notices[0].startswith("GPU 'A100' could be several parts") and "planned as A100-SXM4-80GB" in notices[0]
    assert notices[1].startswith("GPU 'Quux 7' is not in the table") and "planned like an L4" in notices[1]
    assert all(line in completed.stderr for line in notices)  # still said where a person reads them
    plain = geodiloco("predict", "--gpu", "A30", "--model", "tiny", "--json")
    assert json.loads(plain.stdout)["notices"] == []
