"""Fit the predictor's GPU efficiency constants on the dev third of the published measurements.

The cold model's kernel classes each reach some fraction of a datasheet peak
(predictor.kernels.Efficiency). The fields in ``FITTED_FIELDS`` (GEMMs, eager
attention's batched score products, eager elementwise kernels, the optimizer
passes, mixed precision on GeForce-style half-rate parts of the
architectures the dev third has such rows of, and the per-SM rate and the
share of the bus that bound the softmax over the vocabulary) are chosen here to minimise the
mean absolute log error of the cold prediction over the dev third only (rows
with ``sha256(id) mod 3 == 0``); the held-out two-thirds are never read. One
set of constants for every GPU: nothing per GPU, per source or per workload.

Search: Nelder-Mead over the logs of the fields (scipy, installed with the dev
extra), each fraction kept in (0.05, 1], the GEMM efficiency at most 0.90 and
the per-SM softmax rate in [0.5, 100] GB/s (``LOWER_BOUNDS``, ``UPPER_BOUNDS``),
restarted from several softmax rates; deterministic.

Run:  .venv/bin/python experiments/predictor/fit_efficiency.py
Rewrites predictor/data/gpu_efficiency.yaml (the fitted fields and a ``fit``
block saying on what) and prints the dev-third error before and after. Then
``experiments/predictor/bench_published.py`` reports the held-out error.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_published import DATA_FILE, evaluate, held_out, measured_step_s, predicted_step_s, row_precision  # noqa: E402

from geodiloco.predictor import kernels  # noqa: E402
from geodiloco.predictor.kernels import (  # noqa: E402
    EFFICIENCY_FILE, FITTED_FIELDS, Efficiency, gpu_efficiency, half_rate_mixed_precision,
)
from geodiloco.predictor.specs import resolve_gpu  # noqa: E402

BOUNDS = (0.05, 1.0)
# Where the search starts: the hand-set values the fitted fields had before any fit (so a refit
# does not depend on the file's current contents). The per-SM softmax rate had none: it starts where
# the bound does not bind on any listed GPU (the search then finds whether and where it does).
# The vocabulary softmax's own share of the bus had none either: it starts at the elementwise kernels' hand-set share,
# the rate it falls back to.
HAND_SET = {"matmul": 0.70, "score_matmul": 0.70, "elementwise": 0.75, "optimizer": 0.75, "half_rate_fp16_share": 0.5,
            "vocab_softmax_gbps_per_sm": 50.0, "vocab_softmax_bandwidth": 0.75}
# A share below a half would put mixed precision under the datasheet's FP32-accumulate rate.
LOWER_BOUNDS = {"half_rate_fp16_share": 0.5, "vocab_softmax_gbps_per_sm": 0.5}
# GEMMs in a training step do not hold the datasheet peak: the peak is quoted at the boost clock, which sustained
# tensor work does not keep, and cuBLAS's best large square GEMMs stay near 90 % of it. The dev third's objective is
# almost flat along matmul vs score_matmul (0.84/0.64 and 0.99/0.44 differ by 0.002 in mean |log error|), so without
# this cap the search walks to a GEMM efficiency no GPU shows, which the planner would then apply to every user's model.
UPPER_BOUNDS = {"matmul": 0.9, "vocab_softmax_gbps_per_sm": 100.0}
# The objective has kinks where the per-SM softmax bound starts to bind on one more GPU, where Nelder-Mead can
# stall; the search is repeated from these starting rates (GB/s per SM) and keeps the best, deterministically.
SOFTMAX_STARTS_GBPS_PER_SM = (HAND_SET["vocab_softmax_gbps_per_sm"], 12.0, 6.0, 3.0)
MAX_TRIALS = 900


def dev_rows(rows: list[dict], workloads: dict) -> list[dict]:
    """The rows the fit may see: the dev third, and only rows the model can place."""
    chosen = []
    for row in rows:
        if held_out(row["id"]):
            continue
        try:
            evaluate(row, workloads)
        except Exception:  # a row the benchmark cannot place (unknown GPU, a global batch) is left out here too
            continue
        chosen.append(row)
    return chosen


def half_rate_architectures(rows: list[dict]) -> tuple[str, ...]:
    """Architectures of the rows that run mixed precision on a part with a halved FP32-accumulate rate:
    the only ones the fitted share is applied to (a correction is not carried to parts it never saw)."""
    found = set()
    for row in rows:
        spec, _ = resolve_gpu(row.get("gpu_canonical") or row["gpu"])
        if half_rate_mixed_precision(spec, row_precision(row)):
            found.add(spec.architecture)
    return tuple(sorted(found))


def log_errors(eff: Efficiency, rows: list[dict], workloads: dict) -> list[float]:
    with gpu_efficiency(eff):
        return [math.log(predicted_step_s(row, workloads) / measured_step_s(row)) for row in rows]


def objective(eff: Efficiency, rows: list[dict], workloads: dict) -> float:
    """Mean absolute log error: a relative error, symmetric in over- and under-prediction."""
    return statistics.fmean(abs(value) for value in log_errors(eff, rows, workloads))


def fit(start: Efficiency, rows: list[dict], workloads: dict, fields: tuple[str, ...] = FITTED_FIELDS,
        verbose: bool = True) -> Efficiency:
    """The constants in ``fields`` that minimise the objective over ``rows``; the others stay as in ``start``."""
    from scipy.optimize import minimize

    def trial(logs: np.ndarray) -> Efficiency:
        values = np.exp(logs)
        return dataclasses.replace(start, **{name: float(min(max(value, LOWER_BOUNDS.get(name, BOUNDS[0])),
                                                             UPPER_BOUNDS.get(name, BOUNDS[1])))
                                             for name, value in zip(fields, values)})

    evaluations = 0

    def score(logs: np.ndarray) -> float:
        nonlocal evaluations
        evaluations += 1
        value = objective(trial(logs), rows, workloads)
        if verbose and evaluations % 50 == 0:
            print(f"  {evaluations} trials, dev mean |log error| {value:.4f}", flush=True)
        return value

    best = None
    softmax_starts = SOFTMAX_STARTS_GBPS_PER_SM if "vocab_softmax_gbps_per_sm" in fields else (None,)
    for softmax_start in softmax_starts:
        first = np.log([softmax_start if name == "vocab_softmax_gbps_per_sm" else getattr(start, name)
                        for name in fields])
        result = minimize(score, first, method="Nelder-Mead",
                          options={"xatol": 1e-3, "fatol": 1e-5, "maxfev": MAX_TRIALS})
        if verbose and softmax_start is not None:
            print(f"  from {softmax_start:g} GB/s per SM: dev mean |log error| {result.fun:.4f}", flush=True)
        if best is None or result.fun < best.fun:
            best = result
    fitted = trial(best.x)
    return dataclasses.replace(fitted, **{name: round(getattr(fitted, name), 3) for name in fields})


def median_abs_error(eff: Efficiency, rows: list[dict], workloads: dict) -> float:
    return statistics.median(abs(math.exp(value) - 1.0) for value in log_errors(eff, rows, workloads))


def write(eff: Efficiency, rows: list[dict], before: float, after: float) -> None:
    document = yaml.safe_load(EFFICIENCY_FILE.read_text(encoding="utf-8"))
    for name in FITTED_FIELDS:
        document["efficiency"][name] = getattr(eff, name)
    document["efficiency"]["half_rate_fp16_architectures"] = list(eff.half_rate_fp16_architectures)
    document["fit"] = {
        "fields": list(FITTED_FIELDS),
        "on": "dev third of experiments/predictor/data/published_training_steps.yaml (sha256(id) mod 3 == 0)",
        "rows": len(rows),
        "objective": "mean absolute log error of the cold prediction",
        "lower_bounds": dict(LOWER_BOUNDS),
        "upper_bounds": dict(UPPER_BOUNDS),
        "dev_median_error_hand_set": round(before, 4),
        "dev_median_error_fitted": round(after, 4),
        "command": "python experiments/predictor/fit_efficiency.py",
    }
    header = [line for line in EFFICIENCY_FILE.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    body = yaml.safe_dump(document, sort_keys=False)
    EFFICIENCY_FILE.write_text("\n".join(header) + "\n" + body, encoding="utf-8")


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    data = yaml.safe_load(DATA_FILE.read_text(encoding="utf-8"))
    workloads = data["workloads"]
    rows = dev_rows(data["measurements"], workloads)
    start = dataclasses.replace(kernels.GPU_EFFICIENCY, **HAND_SET,
                                half_rate_fp16_architectures=half_rate_architectures(rows))
    print(f"half-rate mixed precision seen on: {', '.join(start.half_rate_fp16_architectures) or 'none'}")
    before = median_abs_error(start, rows, workloads)
    print(f"fitting {', '.join(FITTED_FIELDS)} on {len(rows)} dev rows; dev median error at the hand-set values "
          f"{before:.1%}", flush=True)
    eff = fit(start, rows, workloads)
    after = median_abs_error(eff, rows, workloads)
    write(eff, rows, before, after)
    print(f"dev median error {before:.1%} -> {after:.1%}; wrote {EFFICIENCY_FILE.name}. "
          "Held-out error: python experiments/predictor/bench_published.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
