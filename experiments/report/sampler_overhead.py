#!/usr/bin/env python3
"""Does the NVML sampler thread slow inner steps? Step time of a tiny transformer with and without it.

    python experiments/report/sampler_overhead.py [--steps 120] [--blocks 4]

Trains a 2-layer, d=128 transformer (seq 64, batch 8, AdamW, 1 thread) on the
CPU and times each step, alternating blocks of steps with the sampler off, on
at its default 1 s interval, and on at 10 ms (100x more often than the default).
Without a GPU, NVML is replaced by an in-process stand-in (four GPUs, each read
returning fixed numbers), so what is measured is the sampler thread's Python
work and its contention for the GIL, not the driver's reads; on a GPU machine
the real NVML is used. It also times one sample directly, which bounds the
sampler's own work per interval. Prints the medians and writes
experiments/results/report/sampler_overhead.{png,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pynvml  # noqa: E402
import torch  # noqa: E402

from geodiloco.runtime.gpu_sampler import GpuSampler  # noqa: E402

OUT_DIR = REPO / "experiments" / "results" / "report"
SETTINGS = {"sampler off": None, "sampler 1 s": 1.0, "sampler 10 ms": 0.01}


def _nvml_works() -> bool:
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except pynvml.NVMLError:
        return False


def install_stand_in_nvml(gpu_count: int = 4) -> None:
    """Replace pynvml's device reads by constant answers (this machine has no NVIDIA driver)."""
    pynvml.nvmlInit = lambda: None
    pynvml.nvmlShutdown = lambda: None
    pynvml.nvmlDeviceGetCount = lambda: gpu_count
    pynvml.nvmlDeviceGetHandleByIndex = lambda index: index
    pynvml.nvmlDeviceGetUtilizationRates = lambda handle: SimpleNamespace(gpu=97, memory=40)
    pynvml.nvmlDeviceGetPowerUsage = lambda handle: 250_000
    pynvml.nvmlDeviceGetTotalEnergyConsumption = lambda handle: int(time.time() * 250_000)


def build_model() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=128, nhead=4, dim_feedforward=512, batch_first=True)
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 128), torch.nn.TransformerEncoder(layer, num_layers=2),
                                torch.nn.Linear(128, 1000))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3), torch.randint(0, 1000, (8, 65))


def timed_steps(model, optimizer, tokens, steps: int) -> list[float]:
    step_times_s = []
    for _ in range(steps):
        start_s = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 1000), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step_times_s.append(time.perf_counter() - start_s)
    return step_times_s


def sample_cost_us(samples: int = 2000) -> float:
    """Wall time of one ``sample_now`` (all GPUs read once, sample stored), in microseconds."""
    sampler = GpuSampler(interval_s=3600.0)
    if not sampler.start():
        raise SystemExit(f"sampler did not start: {sampler.reason}")
    start_s = time.perf_counter()
    for _ in range(samples):
        sampler.sample_now()
    cost_us = (time.perf_counter() - start_s) / samples * 1e6
    sampler.stop()
    return cost_us


def measure(steps: int, blocks: int) -> dict[str, list[float]]:
    model, optimizer, tokens = build_model()
    timed_steps(model, optimizer, tokens, 20)
    results: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(blocks):
        for name, interval_s in SETTINGS.items():
            sampler = GpuSampler(interval_s=interval_s) if interval_s else None
            if sampler is not None and not sampler.start():
                raise SystemExit(f"sampler did not start: {sampler.reason}")
            results[name] += timed_steps(model, optimizer, tokens, steps)
            if sampler is not None:
                sampler.stop()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=120, help="steps per block and setting")
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks per setting")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    torch.set_num_threads(1)
    real_nvml = _nvml_works()
    if not real_nvml:
        install_stand_in_nvml()
    cost_us = sample_cost_us()
    results = measure(args.steps, args.blocks)
    medians_ms = {name: statistics.median(times) * 1e3 for name, times in results.items()}
    baseline_ms = medians_ms["sampler off"]
    nvml = "real NVML" if real_nvml else "stand-in NVML (no GPU here)"
    load_1min = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {load_1min:.1f}, "
          f"torch {torch.__version__}, 1 thread, {nvml}")
    for name, median_ms in medians_ms.items():
        print(f"{name:>14}: median step {median_ms:7.2f} ms  ({(median_ms / baseline_ms - 1) * 100:+.1f} % vs off)"
              f"  over {len(results[name])} steps")
    print(f"one sample costs {cost_us:.1f} us: at most {cost_us / 1e6 / 1.0 * 100:.4f} % of the time at 1 s, "
          f"{cost_us / 1e6 / 0.01 * 100:.2f} % at 10 ms (the sampler's own work, if it all blocked the training thread)")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sampler_overhead.json").write_text(json.dumps(
        {"command": " ".join(["python experiments/report/sampler_overhead.py", *sys.argv[1:]]),
         "nvml": nvml, "torch": torch.__version__, "cpu_count": os.cpu_count(), "load_average_1min": load_1min,
         "sample_cost_us": cost_us,
         "steps_per_setting": len(results["sampler off"]),
         "median_step_ms": medians_ms}, indent=2) + "\n")
    figure, axes = plt.subplots(figsize=(7, 3.6))
    axes.boxplot([[t * 1e3 for t in results[name]] for name in SETTINGS], showfliers=False)
    axes.set_xticks(range(1, len(SETTINGS) + 1), list(SETTINGS))
    axes.set_ylabel("inner step time (ms)")
    axes.set_title(f"Tiny transformer on CPU, 1 thread; {nvml}; load {load_1min:.1f} on {os.cpu_count()} cores",
                   fontsize=9, loc="left")
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(args.out / "sampler_overhead.png", dpi=120)
    print(f"wrote {args.out / 'sampler_overhead.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
