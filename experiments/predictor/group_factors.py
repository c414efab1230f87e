"""Does a factor per group of published rows, on top of the shipped cold model, carry out of fold?

Truth: the dev third of the published single-GPU training steps (experiments/predictor/data/
published_training_steps.yaml, rows with sha256(id) mod 3 == 0), as predicted in
experiments/results/predictor/published.json; no held-out row is read. For each grouping (the
GPU's architecture, architecture x precision, the source generation, architecture x source, HBM vs
GDDR memory, consumer vs not), the median log ratio measured / predicted of a group's rows in four
folds corrects the fifth fold's rows of that group (shrunk toward 0 by ``SHRINK`` pseudo-rows, or
not). Scores are out-of-fold median absolute error and mean absolute log error, averaged over the
fold splits cv:, cv1:, cv2:, cv3: (sha256(salt + id) mod 5), as select_model.py splits them. A
grouping worth a model term would lower both below the model alone ("none").

Run:  .venv/bin/python experiments/predictor/bench_published.py   (writes published.json)
      .venv/bin/python experiments/predictor/group_factors.py
Writes experiments/results/predictor/group_factors.md.
"""
from __future__ import annotations

import hashlib
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Callable

import numpy as np

from geodiloco.predictor.specs import resolve_gpu

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[0] / "results" / "predictor"
FOLDS = 5
SPLITS = ("cv:", "cv1:", "cv2:", "cv3:")
SHRINK = 3
HBM_MODELS = ("V100", "A100", "A30", "H100", "H200", "GH200", "B200", "MI")
"""GPU names (as published.json writes them) whose memory is HBM; the others in the set are GDDR."""


def dev_rows() -> list[dict]:
    data = json.loads((RESULTS / "published.json").read_text(encoding="utf-8"))
    rows = [dict(row) for row in data["rows"] if not row["held_out"]]
    for row in rows:
        spec = resolve_gpu(row["gpu"])[0]
        row["architecture"], row["consumer"] = spec.architecture, spec.consumer
        row["hbm"] = row["gpu"].startswith(HBM_MODELS)
        row["source_generation"] = "-".join(row["id"].split("-")[:2])
        row["log_ratio"] = float(np.log1p(row["error"]))
    return rows


GROUPINGS: dict[str, Callable[[dict], object]] = {
    "none": lambda row: None,
    "architecture": lambda row: row["architecture"],
    "architecture x precision": lambda row: (row["architecture"], row["precision"]),
    "source generation": lambda row: row["source_generation"],
    "architecture x source generation": lambda row: (row["architecture"], row["source_generation"]),
    "HBM vs GDDR memory": lambda row: row["hbm"],
    "consumer vs not": lambda row: row["consumer"],
}


def fold_of(row: dict, salt: str) -> int:
    return int(hashlib.sha256((salt + row["id"]).encode()).hexdigest(), 16) % FOLDS


def out_of_fold(rows: list[dict], group: Callable[[dict], object], salt: str, shrink: int) -> tuple[float, float]:
    """(median absolute error, mean absolute log error) of the rows corrected by their group's factor from the
    other folds; ``group`` None for every row: the model alone."""
    corrected = []
    for fold in range(FOLDS):
        by_group: dict = defaultdict(list)
        for row in rows:
            if fold_of(row, salt) != fold:
                by_group[group(row)].append(row["log_ratio"])
        for row in rows:
            if fold_of(row, salt) != fold:
                continue
            ratios = [] if group(row) is None else by_group.get(group(row), [])
            factor = statistics.median(ratios) * len(ratios) / (len(ratios) + shrink) if ratios else 0.0
            corrected.append(row["log_ratio"] - factor)
    return (statistics.median(abs(float(np.expm1(value))) for value in corrected),
            statistics.fmean(abs(value) for value in corrected))


def main() -> int:
    rows = dev_rows()
    lines = ["# A factor per group of published rows, out of fold inside the dev third", "",
             f"Truth: the {len(rows)} dev-third rows of the published single-GPU training steps, as the shipped cold "
             "model predicts them (experiments/results/predictor/published.json); no held-out row is read. Each "
             f"grouping's factor (the median log ratio of its rows in the other folds, shrunk by {SHRINK} pseudo-rows "
             "or not) corrects a fold's rows; averaged over the fold splits "
             f"{', '.join(SPLITS)}. Command: `python experiments/predictor/group_factors.py`.", "",
             "| grouping | shrink | out-of-fold median error | out-of-fold mean abs log error |", "|---|---|---|---|"]
    for name, group in GROUPINGS.items():
        for shrink in ((0,) if name == "none" else (0, SHRINK)):
            scores = [out_of_fold(rows, group, salt, shrink) for salt in SPLITS]
            lines.append(f"| {name} | {shrink} | {statistics.fmean(s[0] for s in scores):.2%} | "
                         f"{statistics.fmean(s[1] for s in scores):.4f} |")
    lines += ["", "A grouping that lowers both figures below `none` would be worth a model term; one that lowers one "
              "and raises the other is not (docs/predictor.md, the rule for terms)."]
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "group_factors.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
