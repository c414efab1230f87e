#!/usr/bin/env python3
"""The runtime model's host work per layer, from profiled GPU steps (experiments/results/gpu/h100-b/host_overhead.json).

    python experiments/gpu/fit_host_ops.py [HOST_OVERHEAD.json]

A training step bound by the host (its GPU kernels busy for less than half its wall time) costs
Python and dispatch time for every op. The predictor counts that work in "chain ops": the eager
op with its backward that the probe times (``predictor.detect._chain_op_s``: ``host_op_us``
each). Each host-bound step of the tiny and small presets gives its count of chain ops, as
(step - parameter tensors x ``host_optimizer_tensor_us``) / ``host_op_us``, with both costs the
probe measured on the same machine. A line through those counts over the layer count gives the
ops per layer, per precision. llama-150m's host-bound step is kept out of the fit and predicted.
The per-layer fp32 count and the half-precision factor go into ``predictor/workload.py``
(``RUNTIME_CODE``). Writes experiments/results/gpu/host_ops.md.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from geodiloco.predictor.workload import parameter_tensor_count, resolve_dims

RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu"
FIT_PRESETS = ("tiny", "small")
HOST_BOUND_SHARE = 0.5
"""A step is host-bound when its GPU kernels are busy for less than this share of its wall time."""


def chain_ops(row: dict, probe: dict) -> float:
    """Chain ops of host work in one step (see the module docstring)."""
    tensors = parameter_tensor_count(resolve_dims(row["preset"]))
    host_us = row["step_ms"] * 1e3 - tensors * probe["host_optimizer_tensor_us"]
    return host_us / probe["host_op_us"]


def fit(rows: list[dict], probe: dict) -> dict[str, tuple[float, float]]:
    """precision -> (chain ops per layer, chain ops outside the layers), least squares over the fit presets."""
    lines = {}
    for precision in sorted({row["precision"] for row in rows}):
        points = [(resolve_dims(row["preset"]).num_layers, chain_ops(row, probe)) for row in rows
                  if row["precision"] == precision and row["preset"] in FIT_PRESETS]
        layers, counts = np.array(points, dtype=float).T
        per_layer, outside = np.polyfit(layers, counts, 1)
        lines[precision] = (float(per_layer), float(outside))
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("host_overhead", nargs="?", type=Path, default=RESULTS / "h100-b" / "host_overhead.json",
                        help="host_overhead.json of experiments/gpu/host_overhead.py (default: the committed H100 run)")
    path = parser.parse_args(argv).host_overhead
    if not path.is_file():
        parser.error(f"{path}: no such file (experiments/gpu/host_overhead.py writes host_overhead.json)")
    data = json.loads(path.read_text())
    probe = data["probe"]
    host_bound = [row for row in data["rows"] if row["gpu_busy_ms"] < HOST_BOUND_SHARE * row["step_ms"]]
    lines = fit(host_bound, probe)
    lines_md = ["# Host work per layer of the runtime's model", "",
                f"Truth: training steps profiled on one {data['gpu']} (torch {data['torch']}) by "
                f"`experiments/gpu/host_overhead.py` ({path.relative_to(RESULTS.parents[1]) if path.is_relative_to(RESULTS.parents[1]) else path.name}); probe on the same machine: "
                f"{probe['host_op_us']:.1f} µs per chain op, {probe['host_optimizer_tensor_us']:.1f} µs per "
                "optimizer tensor. Regenerate with `python experiments/gpu/fit_host_ops.py`.", "",
                f"Host-bound steps (GPU busy < {HOST_BOUND_SHARE:.0%} of the step): {len(host_bound)} of "
                f"{len(data['rows'])}. Fitted on {', '.join(FIT_PRESETS)}; the others are predicted.", "",
                "| precision | chain ops per layer | outside the layers |", "|---|---|---|"]
    for precision, (per_layer, outside) in lines.items():
        lines_md.append(f"| {precision} | {per_layer:.0f} | {outside:.0f} |")
    if "fp32" in lines and "bf16" in lines:
        lines_md += ["", f"Half-precision factor (bf16 / fp32 per layer): {lines['bf16'][0] / lines['fp32'][0]:.2f}"]
    lines_md += ["", "| preset | precision | batch | step ms | GPU busy ms | chain ops | fitted line | in fit |",
                 "|---|---|---|---|---|---|---|---|"]
    for row in host_bound:
        per_layer, outside = lines[row["precision"]]
        layers = resolve_dims(row["preset"]).num_layers
        lines_md.append(f"| {row['preset']} | {row['precision']} | {row['batch_size']} | {row['step_ms']:.2f} | "
                        f"{row['gpu_busy_ms']:.2f} | {chain_ops(row, probe):.0f} | {per_layer * layers + outside:.0f} | "
                        f"{'yes' if row['preset'] in FIT_PRESETS else 'no'} |")
    out = RESULTS / "host_ops.md"
    out.write_text("\n".join(lines_md) + "\n", encoding="utf-8")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
