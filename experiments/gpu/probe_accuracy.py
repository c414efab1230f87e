#!/usr/bin/env python3
"""A GPU the table lacks, planned from its probe: the probe's share of the datasheet peak, and the
error of the planned steps against steps measured on that GPU.

    python experiments/gpu/probe_accuracy.py [--results experiments/results/gpu]

Truth: the training steps that validate.py measured on each GPU machine (``*/<gpu>.json`` sweeps in
experiments/results/gpu/<machine>/, median of the timed steps), beside the probe that ran on the same
machine (``probe_row.yaml``, the raw rates of ``predictor/probe.py``'s matmuls and copy). These
machines' GPUs have datasheet rows, so the probe can be compared with the datasheet.

1. Each probed machine's share of its datasheet peak per column (fp32, tf32/fp16/bf16 "tensor",
   copy against the memory bandwidth). ``PROBE_COPY_SHARE`` in predictor/probe.py is the copy's mean.
2. Each machine with sweeps is predicted four ways, with the predictor's current code and no host
   cost from the probe (the probe row leaves it out): from its datasheet row; from its probe taken as
   peaks (the rule before); from its probe as the predictor now converts it (``probe_shares``: matmuls
   at the model's large-GEMM share, the copy at ``PROBE_COPY_SHARE``); and, for comparison, from its
   probe divided by the shares the *other* machines measured (leave one machine out). Errors are
   reported over all points and over the GPU-bound ones (the datasheet prediction not host-bound).

Writes experiments/results/gpu/probe_accuracy.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
import sys
from pathlib import Path

import yaml

from geodiloco.predictor.model import NodeStepModel
from geodiloco.predictor.probe import probe_shares
from geodiloco.predictor.specs import GpuRow, GpuSpec, lookup_gpu
from geodiloco.predictor.workload import resolve_dims

RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu"
SHARE_COLUMNS = {"fp32": ("fp32_tflops",), "tensor": ("tf32_tflops", "fp16_tflops", "bf16_tflops"),
                 "memory": ("memory_bandwidth_gbps",)}


def raw_probe(folder: Path) -> dict | None:
    """The probe's measured rates on this machine (rows written before the shares were applied hold them
    as they are; a later row is multiplied back by the shares its source names)."""
    path = folder / "probe_row.yaml"
    if not path.is_file():
        return None
    row = yaml.safe_load(path.read_text())["gpus"][0]
    stated = re.search(r"share of the datasheet peak \(([\d.]+) fp32, ([\d.]+) tensor, ([\d.]+) copy\)",
                       row.get("source", ""))
    if stated:
        for share, value in zip(SHARE_COLUMNS, stated.groups()):
            for column in SHARE_COLUMNS[share]:
                row[column] = row[column] * float(value)
    return row


def datasheet_row(folder: Path, probe: dict) -> GpuSpec:
    for path in sorted(folder.glob("*/*.json")):
        data = json.loads(path.read_text())
        if data.get("detection", {}).get("datasheet"):
            return lookup_gpu(data["detection"]["datasheet"])
    return lookup_gpu(probe["name"])


def shares_of(probe: dict, datasheet: GpuSpec) -> dict:
    """The probe's share of the datasheet per class (mean over the class's columns)."""
    return {share: statistics.mean(probe[column] / getattr(datasheet, column) for column in columns)
            for share, columns in SHARE_COLUMNS.items()}


def probe_as_row(probe: dict, shares: dict) -> GpuSpec:
    values = {key: value for key, value in probe.items() if key in GpuRow.model_fields and not key.startswith("host_")}
    for share, columns in SHARE_COLUMNS.items():
        for column in columns:
            values[column] = probe[column] / shares[share]
    values["fp16_fp32acc_tflops"] = values["fp16_tflops"]
    return GpuRow(**values).to_spec()


def sweep_points(folder: Path) -> list[tuple[dict, int, float]]:
    """(sweep, batch size, measured ms) of every measured point in the folder."""
    points = []
    for path in sorted(folder.glob("*/*.json")):
        for sweep in json.loads(path.read_text()).get("sweeps") or []:
            for point in sweep["points"]:
                if point["step_times_s"]:
                    points.append((sweep, point["batch_size"], statistics.median(point["step_times_s"]) * 1e3))
    return points


def predicted(spec: GpuSpec, sweep: dict, batch_size: int) -> tuple[float, str]:
    model = NodeStepModel([spec], resolve_dims(sweep["preset"]), sweep["seq_len"], precision=sweep["precision"])
    info = model.explain(batch_size)
    return info["step_time_s"] * 1e3, info["bound"]


def evaluate(folder: Path, probe: dict, other_shares: dict) -> dict:
    datasheet = datasheet_row(folder, probe)
    rows = {"datasheet row": datasheet, "probe taken as peaks": probe_as_row(probe, {s: 1.0 for s in SHARE_COLUMNS}),
            "probe as converted": probe_as_row(probe, probe_shares()),
            "probe / other machines' shares": probe_as_row(probe, other_shares)}
    points = []
    for sweep, batch_size, measured_ms in sweep_points(folder):
        errors, bound = {}, None
        for label, spec in rows.items():
            predicted_ms, point_bound = predicted(spec, sweep, batch_size)
            errors[label] = predicted_ms / measured_ms - 1
            bound = bound or point_bound
        points.append({"preset": sweep["preset"], "precision": sweep["precision"], "batch_size": batch_size,
                       "measured_ms": measured_ms, "datasheet_bound": bound, "errors": errors})
    return {"gpu": datasheet.name, "shares_used": other_shares, "points": points}


def medians(points: list[dict], label: str) -> str:
    if not points:
        return "-"
    errors = [point["errors"][label] for point in points]
    return (f"{statistics.median(abs(error) for error in errors):.1%} "
            f"(signed {statistics.median(errors):+.1%}, {len(errors)})")


def markdown(shares: dict, evaluated: dict) -> str:
    lines = ["# A GPU the table lacks, planned from its probe", "",
             "Truth: training steps measured on each machine (validate.py sweeps, median of the timed steps), beside "
             "the probe that ran on the same machine (`probe_row.yaml`). Predictions with the current predictor code, "
             "no host cost from the probe. Command: `python experiments/gpu/probe_accuracy.py`.", "",
             "## The probe's share of the datasheet peak", "",
             "| machine | GPU | fp32 | tensor (tf32, fp16, bf16) | copy / memory bandwidth |", "|---|---|---|---|---|"]
    for machine, (gpu, share) in shares.items():
        lines.append(f"| {machine} | {gpu} | {share['fp32']:.3f} | {share['tensor']:.3f} | {share['memory']:.3f} |")
    mean = {key: statistics.mean(share[key] for _, share in shares.values()) for key in SHARE_COLUMNS}
    shipped = probe_shares()
    lines += ["", f"Mean: fp32 {mean['fp32']:.3f}, tensor {mean['tensor']:.3f}, copy {mean['memory']:.3f}. "
              f"The predictor converts a probe at fp32 {shipped['fp32']:g}, tensor {shipped['tensor']:g} (the model's "
              f"share for large GEMMs) and copy {shipped['memory']:g} (`PROBE_COPY_SHARE`).", "",
              "## Steps planned from the probe (median absolute error, signed median, points)", "",
              "| machine | points | datasheet row | probe taken as peaks | probe as converted | "
              "probe / other machines' shares |", "|---|---|---|---|---|---|"]
    for machine, result in evaluated.items():
        for subset, points in (("all", result["points"]),
                               ("GPU-bound", [p for p in result["points"] if p["datasheet_bound"] != "host"])):
            cells = " | ".join(medians(points, label) for label in
                               ("datasheet row", "probe taken as peaks", "probe as converted",
                                "probe / other machines' shares"))
            lines.append(f"| {machine} ({result['gpu']}) | {subset} | {cells} |")
    lines += ["", "GPU-bound: points whose datasheet prediction is bound by compute or memory, not by the host. "
              "The last column divides by the tensor share these Hopper machines measured (about 0.70): closer "
              "here, but a GPU that a 4096^3 matmul fills would then be planned too fast by the ratio of its own "
              "share to 0.70, so the predictor keeps the model's large-GEMM share. The online calibration corrects "
              "the plan from the node's first measured steps.", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of per-machine result folders")
    args = parser.parse_args(argv)
    if not args.results.is_dir():
        parser.error(f"--results {args.results}: no such folder (it holds one result folder per machine)")
    logging.disable(logging.WARNING)
    probes = {folder.name: probe for folder in sorted(args.results.iterdir())
              if folder.is_dir() and (probe := raw_probe(folder)) is not None}
    shares = {}
    for machine, probe in probes.items():
        datasheet = datasheet_row(args.results / machine, probe)
        shares[machine] = (datasheet.name, shares_of(probe, datasheet))
    evaluated = {}
    for machine, probe in probes.items():
        if not sweep_points(args.results / machine):
            continue
        others = [share for other, (_, share) in shares.items() if other != machine]
        other_shares = {key: statistics.mean(share[key] for share in others) for key in SHARE_COLUMNS}
        evaluated[machine] = evaluate(args.results / machine, probe, other_shares)
    text = markdown(shares, evaluated)
    (args.results / "probe_accuracy.md").write_text(text, encoding="utf-8")
    (args.results / "probe_accuracy.json").write_text(json.dumps(
        {"shares": {machine: {"gpu": gpu, **share} for machine, (gpu, share) in shares.items()},
         "evaluated": evaluated}, indent=1) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
