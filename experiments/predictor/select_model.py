"""Choose the cold model's terms by cross-validation inside the dev third, never reading a held-out row.

A term that lowers the dev third's error after being fitted on the dev third
proves little: more constants always fit better. Here each candidate model is
fitted on four fifths of the dev third and predicts the remaining fifth, five
times over (folds by ``sha256("cv:" + id) mod 5``, a split independent of the
dev / held-out one), and the out-of-fold errors are compared. A term is worth
shipping when it lowers the out-of-fold error; only then is the held-out part
predicted (``bench_published.py``).

Candidates: the shipped model (every field of ``FITTED_FIELDS``), the same
model with each optional term switched off (``OPTIONAL_TERMS``: the per-SM bound
on the vocabulary softmax, and that softmax's own share of the memory bus), and
the same model without the run warm-up that Lambda's SQuAD figures carry
(``bench_published.WARMUP_PER_RUN_S``, hand-set from Lambda's logs), with an attention dropout where the source
runs it at p = 0, with the square tile for CUDA-core SGEMMs (``kernels.CUDA_CORE_SGEMM_TILE`` off), without
CUDA 10's tensor-core alignment, and with Lambda's truncated figures read as published
(``bench_published.TRUNCATED_VALUES_COUNTED`` off).

The out-of-fold median moves by about half a point between fold splits, so a term
is judged over several: ``--split K`` salts the folds with ``cvK:`` (the default,
``cv:``, is the split of the written result); the decisions in docs/predictor.md
average ``cv:``, ``cv1:``, ``cv2:`` and ``cv3:``.

Run:  .venv/bin/python experiments/predictor/select_model.py      (about 10 minutes on 2 cores)
      .venv/bin/python experiments/predictor/select_model.py --split 1 --no-write
Writes experiments/results/predictor/model_selection.{md,json}.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_published  # noqa: E402
from bench_published import DATA_FILE, RESULTS  # noqa: E402
from fit_efficiency import HAND_SET, dev_rows, fit, half_rate_architectures, log_errors  # noqa: E402

from geodiloco.predictor import kernels  # noqa: E402
from geodiloco.predictor.kernels import FITTED_FIELDS, Efficiency  # noqa: E402

FOLDS = 5
# Optional terms: the field, and the value that switches the term off.
OPTIONAL_TERMS = {"vocab_softmax_gbps_per_sm": None, "vocab_softmax_bandwidth": None}


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A model to compare: which fields are fitted, and the values of the fields switched off."""

    name: str
    fields: tuple[str, ...]
    switched_off: dict
    warmup_per_run_s: float = bench_published.WARMUP_PER_RUN_S
    zero_attention_dropout_counted: bool = True
    cuda_core_sgemm_tile: Optional[tuple[int, int]] = kernels.CUDA_CORE_SGEMM_TILE
    cuda_10_alignment_counted: bool = True
    truncated_values_counted: bool = True


@dataclasses.dataclass(frozen=True)
class Score:
    """Out-of-fold errors of one candidate over the dev third (fractions; log errors are natural logs)."""

    name: str
    fields: tuple[str, ...]
    mean_abs_log_error: float
    median_abs_error: float
    in_sample_mean_abs_log_error: float
    rows: int


def candidates() -> list[Candidate]:
    shipped = Candidate("shipped", FITTED_FIELDS, {})
    without = [Candidate(f"without {term}", tuple(name for name in FITTED_FIELDS if name != term), {term: off})
               for term, off in OPTIONAL_TERMS.items()]
    return [shipped, *without, Candidate("without Lambda's run warm-up", FITTED_FIELDS, {}, warmup_per_run_s=0.0),
            Candidate("with an attention dropout where the source's is 0", FITTED_FIELDS, {},
                      zero_attention_dropout_counted=False),
            Candidate("with square 128-wide tiles for CUDA-core SGEMMs", FITTED_FIELDS, {}, cuda_core_sgemm_tile=None),
            Candidate("without CUDA 10's tensor-core alignment", FITTED_FIELDS, {}, cuda_10_alignment_counted=False),
            Candidate("with Lambda's truncated figures read as published", FITTED_FIELDS, {},
                      truncated_values_counted=False)]


def fold_of(row_id: str, split: str = "") -> int:
    """The row's fold in the split salted ``cv{split}:``."""
    return int(hashlib.sha256(f"cv{split}:{row_id}".encode()).hexdigest(), 16) % FOLDS


@contextlib.contextmanager
def module_setting(module, name: str, value) -> Iterator[None]:
    """``module.<name>`` (a module-level setting of how the sources or kernels are modelled) is ``value`` while
    inside, and what it was after."""
    shipped = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, shipped)


def run_warmup(seconds: float) -> contextlib.AbstractContextManager:
    """Lambda's SQuAD figures carry ``seconds`` of one-time costs per run while inside."""
    return module_setting(bench_published, "WARMUP_PER_RUN_S", seconds)


def zero_attention_dropout(counted: bool) -> contextlib.AbstractContextManager:
    """Whether workloads' ``attention_dropout: false`` is honoured while inside."""
    return module_setting(bench_published, "ZERO_ATTENTION_DROPOUT_COUNTED", counted)


def sgemm_tile(tile) -> contextlib.AbstractContextManager:
    """``kernels.CUDA_CORE_SGEMM_TILE`` is ``tile`` while inside (None: the square tile for every GEMM)."""
    return module_setting(kernels, "CUDA_CORE_SGEMM_TILE", tile)


def cuda_10_alignment(counted: bool) -> contextlib.AbstractContextManager:
    """Whether rows' ``cuda: '10.x'`` sets the tensor-core alignment while inside."""
    return module_setting(bench_published, "CUDA_10_ALIGNMENT_COUNTED", counted)


def truncated_values(counted: bool) -> contextlib.AbstractContextManager:
    """Whether rows' ``value_truncated_to`` moves their figure to the mean of their run logs (or, without logs, to the
    middle of what it stands for) while inside."""
    return module_setting(bench_published, "TRUNCATED_VALUES_COUNTED", counted)


def start_for(candidate: Candidate, rows: list[dict]) -> Efficiency:
    """The search's starting point: the hand-set values, the candidate's switched-off terms, and the half-rate
    architectures of ``rows`` (the training folds only, as a real fit would see)."""
    hand_set = {name: value for name, value in HAND_SET.items() if name in candidate.fields}
    return dataclasses.replace(kernels.GPU_EFFICIENCY, **hand_set, **candidate.switched_off,
                               half_rate_fp16_architectures=half_rate_architectures(rows))


def score(candidate: Candidate, rows: list[dict], workloads: dict, split: str = "") -> Score:
    out_of_fold = []
    with run_warmup(candidate.warmup_per_run_s), zero_attention_dropout(candidate.zero_attention_dropout_counted), \
            sgemm_tile(candidate.cuda_core_sgemm_tile), cuda_10_alignment(candidate.cuda_10_alignment_counted), \
            truncated_values(candidate.truncated_values_counted):
        for fold in range(FOLDS):
            train = [row for row in rows if fold_of(row["id"], split) != fold]
            test = [row for row in rows if fold_of(row["id"], split) == fold]
            fitted = fit(start_for(candidate, train), train, workloads, candidate.fields, verbose=False)
            out_of_fold += log_errors(fitted, test, workloads)
            print(f"  {candidate.name}: fold {fold + 1}/{FOLDS} done", flush=True)
        whole = fit(start_for(candidate, rows), rows, workloads, candidate.fields, verbose=False)
        in_sample = log_errors(whole, rows, workloads)
    return Score(candidate.name, candidate.fields,
                 statistics.fmean(abs(value) for value in out_of_fold),
                 statistics.median(abs(math.exp(value) - 1.0) for value in out_of_fold),
                 statistics.fmean(abs(value) for value in in_sample), len(rows))


def markdown(scores: list[Score], seconds: float, split: str = "") -> str:
    lines = [
        "# Choosing the cold model's terms inside the dev third",
        "",
        f"Truth: the dev third of the published measurements (experiments/predictor/data/published_training_steps.yaml, "
        f"rows with sha256(id) mod 3 == 0: {scores[0].rows} rows); no held-out row is read. Each candidate is fitted "
        f"on four of {FOLDS} folds (sha256('cv{split}:' + id) mod {FOLDS}) and predicts the fifth; the errors below are "
        "those out-of-fold predictions. In-sample: the same candidate fitted on the whole dev third, as shipped. "
        f"Command: `python experiments/predictor/select_model.py{f' --split {split}' if split else ''}` "
        f"({seconds / 60:.0f} min here).",
        "",
        "| candidate | fitted fields | out-of-fold mean abs log error | out-of-fold median error | in-sample mean abs log error |",
        "|---|---|---|---|---|",
    ]
    for entry in scores:
        lines.append(f"| {entry.name} | {', '.join(entry.fields)} | {entry.mean_abs_log_error:.4f} | "
                     f"{entry.median_abs_error:.2%} | {entry.in_sample_mean_abs_log_error:.4f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--no-write", action="store_true", help="print the table only; write no result files")
    parser.add_argument("--split", default="", metavar="K",
                        help="salt the folds with 'cvK:' instead of 'cv:' (another split of the same dev third)")
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        help="score only the candidates whose name contains one of these (each takes minutes)")
    args = parser.parse_args()
    chosen = [candidate for candidate in candidates()
              if not args.only or any(part in candidate.name for part in args.only)]
    if not chosen:
        parser.error(f"--only {' '.join(args.only)} matches no candidate; the candidates are: "
                     + "; ".join(candidate.name for candidate in candidates()))
    data = yaml.safe_load(DATA_FILE.read_text(encoding="utf-8"))
    workloads = data["workloads"]
    rows = dev_rows(data["measurements"], workloads)
    began = time.monotonic()
    scores = [score(candidate, rows, workloads, args.split) for candidate in chosen]
    table = markdown(scores, time.monotonic() - began, args.split)
    print(table)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "model_selection.md").write_text(table, encoding="utf-8")
        (RESULTS / "model_selection.json").write_text(
            json.dumps([dataclasses.asdict(entry) for entry in scores], indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
