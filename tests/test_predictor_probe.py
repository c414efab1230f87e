"""The measured probe of a GPU the table lacks (predictor/probe.py): its row round-trips through a
GPU file and leaves the host costs it measured out; host costs a user writes into a row drive
small-batch predictions. The GPU path itself runs in experiments/gpu/run_all.sh (results under
experiments/results/gpu/)."""
from __future__ import annotations

import yaml

from geodiloco.predictor.detect import _chain_op_s, _optimizer_tensor_s
from geodiloco.predictor.kernels import GPU_EFFICIENCY
from geodiloco.predictor.probe import measure_device, probe_row
from geodiloco.runtime.cli import main

MEASURED = {"name": "Lab Card 9000", "device": "cuda:0", "memory_gb": 24.0, "sm_count": 60,
            "fp32_tflops": 30.0, "tf32_tflops": 60.0, "fp16_tflops": 120.0, "bf16_tflops": 120.0,
            "memory_bandwidth_gbps": 900.0, "torch": "2.x", "hip": None, "matmul_size": 4096,
            "measured_at": "2026-01-01T00:00:00"}


def write_row_file(path, **host_costs) -> None:
    """A probe's row, with ``host_costs`` written into it as a user would (the probe leaves them out)."""
    row = {**probe_row({**MEASURED, **host_costs}), **host_costs}
    path.write_text(yaml.safe_dump({"gpus": [row]}, sort_keys=False), encoding="utf-8")


def predicted_step_s(capsys, gpu_file, model: str, batch_size: int) -> float:
    code = main(["predict", "--gpu-file", str(gpu_file), "--gpu", "Lab Card 9000", "--model", model,
                 "--batch-size", str(batch_size), "--seq-len", "64", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    return yaml.safe_load(out)["step_time_s"]


def test_a_cpu_probe_measures_positive_rates_and_leaves_host_costs_to_detection():
    measured = measure_device("cpu", size=128, copy_bytes=2**20, repeats=1)
    assert measured["fp32_tflops"] > 0 and measured["memory_bandwidth_gbps"] > 0
    assert measured["bf16_tflops"] is None and "host_op_us" not in measured


def test_the_probe_row_leaves_measured_host_costs_out_and_loads_as_a_gpu_file(tmp_path, capsys):
    row = probe_row({**MEASURED, "host_op_us": 37.0, "host_optimizer_tensor_us": 43.0})
    assert "host_op_us" not in row and "host_optimizer_tensor_us" not in row
    # datasheet-equivalent peaks: matmul rates over the model's share for large GEMMs (fitted in the shipped
    # predictor/data/gpu_efficiency.yaml), the copy over 0.84
    share = GPU_EFFICIENCY.matmul
    assert (row["bf16_tflops"], row["memory_bandwidth_gbps"]) == (round(120.0 / share, 2), 1071.4)
    assert (row["fp32_tflops"], row["tf32_tflops"]) == (round(30.0 / share, 2), round(60.0 / share, 2))
    assert 0.5 < share <= 0.9 and row["bf16_tflops"] > 120.0
    path = tmp_path / "probed.yaml"
    path.write_text(yaml.safe_dump({"gpus": [row]}, sort_keys=False), encoding="utf-8")
    table_default = predicted_step_s(capsys, path, "tiny", 1)
    written = tmp_path / "written.yaml"
    write_row_file(written, host_op_us=20.0, host_optimizer_tensor_us=3.0)  # the table's constants
    assert table_default == predicted_step_s(capsys, written, "tiny", 1)


def test_measured_host_costs_set_a_host_bound_step_and_leave_a_gpu_bound_one(tmp_path, capsys):
    slow, slower = tmp_path / "slow.yaml", tmp_path / "slower.yaml"
    write_row_file(slow, host_op_us=40.0, host_optimizer_tensor_us=6.0)
    write_row_file(slower, host_op_us=80.0, host_optimizer_tensor_us=12.0)
    # tiny at batch 1: microseconds of GPU work, so the step is the host's, and doubles with it
    assert predicted_step_s(capsys, slower, "tiny", 1) == \
        predicted_step_s(capsys, slow, "tiny", 1) * 2
    # llama-150m at batch 512: seconds of GPU work hide any host cost
    assert predicted_step_s(capsys, slower, "llama-150m", 512) == predicted_step_s(capsys, slow, "llama-150m", 512)


def test_host_cost_timers_divide_by_the_ops_they_ran():
    import torch
    timed = []

    def timer(action):
        action()
        timed.append(action)
        return 0.01

    assert _chain_op_s(torch, "cpu", timer) == 0.01 / 200
    assert _optimizer_tensor_s(torch, "cpu", timer) == 0.01 / 64
    assert len(timed) == 2
