"""experiments/gpu/probe_timing.py: the steady-state timer on a clock it cannot see past, the tables it
renders from stored measurements (shares of the datasheet row), and the script without CUDA."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "experiments" / "gpu"
sys.path.insert(0, str(KIT))

import probe_timing  # noqa: E402


class FakeClock:
    """perf_counter that advances only when an action runs: each call costs ``call_s``."""

    def __init__(self, call_s: float) -> None:
        self.now_s, self.call_s, self.calls = 0.0, call_s, 0

    def action(self) -> None:
        self.now_s += self.call_s
        self.calls += 1


def test_the_sustained_timer_warms_up_then_times_batches_of_at_least_the_minimum(monkeypatch):
    clock = FakeClock(call_s=0.004)
    monkeypatch.setattr(probe_timing.time, "perf_counter", lambda: clock.now_s)
    per_call_s = probe_timing.sustained_s(clock.action, lambda: None, repeats=3)
    assert per_call_s == pytest.approx(0.004)
    # 0.25 s of warm-up at 4 ms a call is 63 calls (62.5 rounded up); each batch of at least 25 ms is 7 calls
    assert clock.calls == 63 + 3 * 7


def test_a_call_longer_than_the_minimum_batch_is_timed_alone(monkeypatch):
    clock = FakeClock(call_s=0.2)
    monkeypatch.setattr(probe_timing.time, "perf_counter", lambda: clock.now_s)
    assert probe_timing.sustained_s(clock.action, lambda: None, repeats=2) == pytest.approx(0.2)
    assert clock.calls == 2 + 2  # two warm-up calls reach 0.4 s >= 0.25 s; then one call per batch


def stored(folder: Path) -> None:
    results = {"gpu": "NVIDIA H200", "torch": "2.x", "cuda": "13.0", "measured_at": "2026-01-01T00:00:00",
               "idle_s_before_each": 3.0, "how": "single and sustained",
               "datasheet": {"name": "H200", "fp32_tflops": 67.0, "tf32_tflops": 494.5, "fp16_tflops": 989.5,
                             "bf16_tflops": 989.5, "memory_bandwidth_gbps": 4800.0},
               "measurements": [{"size": 4096, "timing": "single", "fp32_tflops": 33.5, "tf32_tflops": None,
                                 "fp16_tflops": 742.125, "bf16_tflops": 494.75, "memory_bandwidth_gbps": 3600.0,
                                 "seconds": 0.4}],
               "operands": [{"gemm": "8192^3", "dtype": "bf16", "operands": "zeros", "tflops": 890.55}]}
    (folder / "probe_timing.json").write_text(json.dumps(results), encoding="utf-8")


def test_render_writes_each_rate_with_its_share_of_the_datasheet(tmp_path):
    stored(tmp_path)
    assert probe_timing.main(["--render", str(tmp_path)]) == 0
    text = (tmp_path / "probe_timing.md").read_text(encoding="utf-8")
    # 33.5 / 67 = 0.50, tf32 not measured, 742.125 / 989.5 = 0.75, 494.75 / 989.5 = 0.50, 3600 / 4800 = 0.75
    assert "| 4096 | single | 34 (0.50) | - | 742 (0.75) | 495 (0.50) | 3,600 (0.75) | 0.4 |" in text
    assert "| 8192^3 | bf16 | zeros | 891 | 0.90 |" in text


def test_render_of_a_folder_without_measurements_names_what_is_missing(tmp_path):
    done = subprocess.run([sys.executable, str(KIT / "probe_timing.py"), "--render", str(tmp_path)],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert f"{tmp_path} holds no probe_timing.json; measure with --out first" in done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would really measure")
def test_without_cuda_nothing_is_measured_or_written(tmp_path):
    done = subprocess.run([sys.executable, str(KIT / "probe_timing.py"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "no CUDA GPU here; nothing measured" in done.stdout
    assert not (tmp_path / "out").exists()
