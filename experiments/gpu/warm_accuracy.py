#!/usr/bin/env python3
"""Warm accuracy of the step-time predictor on measured GPU steps: the planner's online model
(predictor.online, the one the balancer calibrates every node with) after 5 steps at mixed batch
sizes, on batch sizes it never saw.

    python experiments/gpu/warm_accuracy.py [SWEEP.json ...]

Truth: the per-step times validate.py measured on a GPU (default: every
experiments/results/gpu/<machine>/*/<gpu>.json with sweeps). For each sweep (preset x precision) the
measured batch sizes are split alternately: the 1st, 3rd, 5th, ... calibrate, the others are
predicted. The model sees one discarded warm-up step, then 5 single measured steps cycling
through the calibration batches (each step a different one of the 10 timed steps, not a
median); each predicted batch is compared with the median of its 10 timed steps. Cold = the
datasheet prediction by the current predictor code (recomputed, not the one the sweep recorded).
Writes experiments/results/gpu/warm_accuracy.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from geodiloco.predictor.model import node_step_model
from geodiloco.predictor.online import OnlineStepTimeModel
from geodiloco.predictor.workload import resolve_dims

RESULTS = Path(__file__).resolve().parents[1] / "results" / "gpu"
CALIBRATION_STEPS = 5


def sweep_files() -> list[Path]:
    return sorted(path for path in RESULTS.glob("*/*/*.json") if json.loads(path.read_text()).get("sweeps"))


def evaluate_sweep(sweep: dict, datasheet: str) -> list[dict]:
    """Cold and warm error at each held-out batch size of one sweep."""
    points = [point for point in sweep["points"] if point["step_times_s"]]
    calibration, held_out = points[0::2], points[1::2]
    dims = resolve_dims(sweep["preset"])
    cold = node_step_model([datasheet], dims, sweep["seq_len"], sweep["precision"])
    online = OnlineStepTimeModel(cold)
    online.update(calibration[0]["batch_size"], calibration[0]["step_times_s"][0])  # discarded warm-up step
    for index in range(CALIBRATION_STEPS):
        point = calibration[index % len(calibration)]
        online.update(point["batch_size"], point["step_times_s"][1 + index // len(calibration)])
    rows = []
    for point in held_out:
        truth_s = statistics.median(point["step_times_s"])
        warm_s = online.predict(point["batch_size"])
        cold_s = cold.predict(point["batch_size"])
        rows.append({"preset": sweep["preset"], "precision": sweep["precision"], "seq_len": sweep["seq_len"],
                     "batch_size": point["batch_size"], "measured_ms": truth_s * 1e3,
                     "cold_ms": cold_s * 1e3, "warm_ms": warm_s * 1e3,
                     "cold_error": cold_s / truth_s - 1, "warm_error": warm_s / truth_s - 1,
                     "warm_uncertainty": online.uncertainty(point["batch_size"]),
                     "calibrated_on": sorted({p["batch_size"] for p in calibration})})
    return rows


def median_abs(rows: list[dict], key: str) -> float:
    return statistics.median(abs(row[key]) for row in rows)


def write_markdown(rows: list[dict], sources: list[str], gpu: str) -> Path:
    lines = ["# Warm accuracy on measured GPU steps", "",
             "One row per held-out batch size; the sweep's machine is the first folder of its file.", "",
             f"Truth: training steps measured on one {gpu} by `experiments/gpu/validate.py` ({', '.join(sources)}).",
             "The planner did not build it. Regenerate with `python experiments/gpu/warm_accuracy.py`.", "",
             f"Per sweep, the online model (`predictor.online`) sees one discarded warm-up step and {CALIBRATION_STEPS} "
             "single steps at the calibration batches, then predicts the other batch sizes; each is compared with the "
             "median of 10 measured steps. Cold: the datasheet prediction.", "",
             "| machine | preset | precision | batch | calibrated on | measured ms | cold ms | cold error | warm ms "
             "| warm error | warm ±1σ |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['machine']} | {row['preset']} | {row['precision']} | {row['batch_size']} | "
                     f"{','.join(map(str, row['calibrated_on']))} | {row['measured_ms']:.2f} | {row['cold_ms']:.2f} | "
                     f"{row['cold_error']:+.1%} | {row['warm_ms']:.2f} | {row['warm_error']:+.1%} | "
                     f"{row['warm_uncertainty']:.1%} |")
    lines += ["", f"Median |error| over {len(rows)} held-out points: cold {median_abs(rows, 'cold_error'):.1%}, "
              f"warm {median_abs(rows, 'warm_error'):.1%}; worst warm {max(abs(r['warm_error']) for r in rows):.1%}.", ""]
    path = RESULTS / "warm_accuracy.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="*", type=Path,
                        help="validate.py sweep files (<gpu>.json); default: every one under experiments/results/gpu/")
    files = parser.parse_args(argv).sweeps or sweep_files()
    for path in files:
        if not path.is_file():
            parser.error(f"{path}: no such sweep file (validate.py writes <gpu>.json)")
    if not files:
        print("no sweep files under experiments/results/gpu/ (run experiments/gpu/validate.py on a GPU first)")
        return 1
    rows, sources, gpus = [], [], set()
    for path in files:
        data = json.loads(path.read_text())
        datasheet = data["detection"]["datasheet"]
        gpus.add(data["measured_with"]["gpu_0"])
        sources.append(str(path.relative_to(RESULTS.parents[1])) if path.is_relative_to(RESULTS.parents[1]) else path.name)
        for sweep in data["sweeps"]:
            rows.extend({"machine": path.parent.parent.name, **row} for row in evaluate_sweep(sweep, datasheet))
    path = write_markdown(rows, sources, " / ".join(sorted(gpus)))
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
