"""Transformers LLaMA against the built-in decoder, and the predictor on the transformers model.

Truth: real training steps on this CPU (forward, backward, gradient clipping, AdamW; fp32; one
torch thread), timed as this process's CPU time (on 2 shared cores wall time measures the
neighbours too; with one thread the CPU time is the step on a dedicated core).

1. Step time at the same dimensions: the transformers ``LlamaForCausalLM`` built from
   experiments/configs/hf/llama_tiny.json and the built-in decoder built from the same
   config.json (its dims), at batch 4, 8 and 16, seq 128: the fastest of 7 steps each, the two
   models interleaved so both see the same load. Reported as the ratio transformers / built-in.
2. Predictor error on the transformers model: cold (the model's dims from its config.json and
   this CPU's measured peak only) and warm (OnlineStepTimeModel fed one measured step at each of
   batch 1, 2, 4, 8, 16, seq 128) against the fastest of 5 measured steps at batch 3, 6, 12 and
   seq 64 and 256 (none seen in calibration).

Run:  .venv/bin/python experiments/hf/bench_hf.py   (needs the hf extra)
Writes experiments/results/hf/{bench_hf.json, bench_hf.md}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from geodiloco.predictor.model import node_step_model
from geodiloco.predictor.online import OnlineStepTimeModel
from geodiloco.runtime.config import ModelSection
from geodiloco.runtime.hf_model import build_hf_model
from geodiloco.runtime.models import build_model

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "experiments" / "configs" / "hf" / "llama_tiny.json"
RESULTS = ROOT / "experiments" / "results" / "hf"
COMPARE_BATCHES, COMPARE_SEQ, COMPARE_REPEATS = (4, 8, 16), 128, 7
CALIBRATION_BATCHES, CALIBRATION_SEQ = (1, 2, 4, 8, 16), 128
TEST_BATCHES, TEST_SEQS = (3, 6, 12), (64, 256)


class StepTimer:
    """One model's training loop on random tokens; step times are CPU seconds."""

    def __init__(self, model: torch.nn.Module, vocab_size: int) -> None:
        self.model = model
        self.vocab_size = vocab_size
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        self.generator = torch.Generator().manual_seed(0)

    def step_s(self, batch_size: int, seq_len: int) -> float:
        tokens = torch.randint(0, self.vocab_size, (batch_size, seq_len + 1), generator=self.generator)
        started = time.process_time()
        self.model(tokens[:, :-1], tokens[:, 1:]).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return time.process_time() - started

    def fastest_s(self, batch_size: int, seq_len: int, repeats: int) -> float:
        self.step_s(batch_size, seq_len)
        return min(self.step_s(batch_size, seq_len) for _ in range(repeats))


def compare_step_times(hf: StepTimer, builtin: StepTimer) -> list[dict]:
    rows = []
    for batch in COMPARE_BATCHES:
        hf_times, builtin_times = [], []
        for _ in range(COMPARE_REPEATS):
            hf_times.append(hf.step_s(batch, COMPARE_SEQ))
            builtin_times.append(builtin.step_s(batch, COMPARE_SEQ))
        row = {"batch_size": batch, "seq_len": COMPARE_SEQ, "hf_s": min(hf_times[1:]),
               "builtin_s": min(builtin_times[1:])}
        row["ratio"] = row["hf_s"] / row["builtin_s"]
        rows.append(row)
        print(f"B={batch:3d} S={COMPARE_SEQ}: transformers {row['hf_s'] * 1e3:7.1f} ms, built-in "
              f"{row['builtin_s'] * 1e3:7.1f} ms, ratio {row['ratio']:.2f}", flush=True)
    return rows


def predictor_accuracy(hf: StepTimer, dims) -> list[dict]:
    online = OnlineStepTimeModel(node_step_model([], dims, CALIBRATION_SEQ, "fp32"))
    online.update(CALIBRATION_BATCHES[0], hf.step_s(CALIBRATION_BATCHES[0], CALIBRATION_SEQ))
    for batch in CALIBRATION_BATCHES:
        hf.step_s(batch, CALIBRATION_SEQ)
        online.update(batch, hf.step_s(batch, CALIBRATION_SEQ))
    points = []
    for seq in TEST_SEQS:
        cold = node_step_model([], dims, seq, "fp32")
        warm = online.with_prior(cold)
        for batch in TEST_BATCHES:
            measured = hf.fastest_s(batch, seq, 5)
            point = {"batch_size": batch, "seq_len": seq, "measured_s": measured, "cold_s": cold.predict(batch),
                     "warm_s": warm.predict(batch), "warm_uncertainty": warm.uncertainty(batch)}
            point["cold_error"] = abs(point["cold_s"] - measured) / measured
            point["warm_error"] = abs(point["warm_s"] - measured) / measured
            points.append(point)
            print(f"B={batch:3d} S={seq:4d}: measured {measured * 1e3:7.1f} ms, cold {point['cold_s'] * 1e3:7.1f} ms "
                  f"({point['cold_error']:.1%}), warm {point['warm_s'] * 1e3:7.1f} ms ({point['warm_error']:.1%})",
                  flush=True)
    return points


def write_markdown(summary: dict) -> None:
    compare, points = summary["compare"], summary["points"]
    lines = [
        "# Transformers LLaMA on this machine",
        "",
        f"Written by `experiments/hf/bench_hf.py` ({summary['wall_s']:.0f} s). Truth: real training steps on this "
        "CPU (fp32, one torch thread, AdamW + clipping), each the process's CPU time; model: "
        "`experiments/configs/hf/llama_tiny.json` (hidden 128, 2 layers, 4 heads, vocab 4096), the built-in decoder "
        f"built from the same config.json; {summary['threads']} torch thread; 1-minute load average "
        f"{summary['load_before']:.1f} before / {summary['load_after']:.1f} after, on 2 shared cores.",
        "",
        "## Step time at the same dimensions (fastest of 6 interleaved steps)",
        "",
        "| batch | seq | transformers ms | built-in ms | transformers / built-in |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {row['batch_size']} | {row['seq_len']} | {row['hf_s'] * 1e3:.1f} | {row['builtin_s'] * 1e3:.1f} | "
              f"{row['ratio']:.2f} |" for row in compare]
    lines += [
        "",
        f"Median ratio **{summary['median_ratio']:.2f}**.",
        "",
        "## Predictor on the transformers model (dims read from its config.json)",
        "",
        f"Cold (measured CPU peak only): median error **{summary['cold_median_error']:.1%}** (max "
        f"{summary['cold_max_error']:.1%}). Warm (5 measured steps at batch 1-16, seq {CALIBRATION_SEQ}): median "
        f"error **{summary['warm_median_error']:.1%}** (max {summary['warm_max_error']:.1%}), on batch sizes and "
        "sequence lengths not seen in calibration.",
        "",
        "| batch | seq | measured ms | cold ms | cold err | warm ms | warm err | warm +-1 sigma |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {p['batch_size']} | {p['seq_len']} | {p['measured_s'] * 1e3:.1f} | {p['cold_s'] * 1e3:.1f} | "
              f"{p['cold_error']:.1%} | {p['warm_s'] * 1e3:.1f} | {p['warm_error']:.1%} | {p['warm_uncertainty']:.1%} |"
              for p in points]
    (RESULTS / "bench_hf.md").write_text("\n".join(lines) + "\n")


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    torch.set_num_threads(1)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    dims = ModelSection(hf={"config": str(CONFIG)}, seq_len=256).dims()
    hf = StepTimer(build_hf_model(str(CONFIG), None, seed=0), dims.vocab_size)
    builtin = StepTimer(build_model(dims, seed=0), dims.vocab_size)
    hf_params = sum(param.numel() for param in hf.model.parameters())
    builtin_params = sum(param.numel() for param in builtin.model.parameters())
    if hf_params != builtin_params:
        print(f"parameter counts differ: transformers {hf_params}, built-in {builtin_params}", file=sys.stderr)
        return 1
    compare = compare_step_times(hf, builtin)
    points = predictor_accuracy(hf, dims)
    summary = {
        "compare": compare, "points": points, "parameters": hf_params, "threads": torch.get_num_threads(),
        "median_ratio": statistics.median(row["ratio"] for row in compare),
        "cold_median_error": statistics.median(p["cold_error"] for p in points),
        "cold_max_error": max(p["cold_error"] for p in points),
        "warm_median_error": statistics.median(p["warm_error"] for p in points),
        "warm_max_error": max(p["warm_error"] for p in points),
        "wall_s": time.perf_counter() - started, "load_before": load_before, "load_after": os.getloadavg()[0],
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "bench_hf.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_markdown(summary)
    print(f"median transformers / built-in step time {summary['median_ratio']:.2f}; predictor cold median error "
          f"{summary['cold_median_error']:.1%}, warm {summary['warm_median_error']:.1%}; "
          f"written to {RESULTS / 'bench_hf.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
