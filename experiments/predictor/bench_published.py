"""Cold accuracy of the step-time predictor on published measurements nobody here made.

Truth: single-GPU training throughput published by others (NVIDIA
DeepLearningExamples tables, the NeuSight artifact, Lambda's benchmark results,
papers), each row citing its source in
experiments/predictor/data/published_training_steps.yaml.

Prediction: the predictor's cold model (GPU datasheet row + the workload's
shape; no measurement of any kind) at the row's GPU, batch, micro-batch,
sequence length and precision. A plain roofline (training FLOPs / the GPU's
dense peak at that precision) is reported beside it for scale.

How each source ran is taken from the data file, never fitted: a row's ``math``
(TF32 under an 'fp32' label in NGC containers) sets the matmul precision;
``optimizer: none`` (NeuSight times forward + backward only) drops the optimizer
step; the workload's ``block``, ``attention``, ``lm_head_fraction``,
``memory_len``, ``relative_positions`` and ``attention_dropout`` (a row's
``lm_head_fraction`` overrides its workload's) become the predictor's TrainingCode.

Held-out split: a row is held out unless ``sha256(id) mod 3 == 0``; the
predictor's fitted constants are fitted on the dev third only (fit_efficiency.py), never on
the held-out rows, and the dev third is reported apart. The headline
is the held-out part: median and worst absolute error per GPU and per workload.

Reported apart, never fitted and never in the dev third: Pascal GPUs (published_pascal_steps.yaml) and layer
micro-benchmarks (published_layer_steps.yaml: one block timed alone on a random input; its workloads'
``blocks_only`` drops the embedding, final norm, head and the first input gradient, and its TFLOPS figures turn
back into seconds with the notebook's own FLOP formula, ``layer_forward_flops``; its ``grid_maxima``, the best
TFLOPS of the grid on other GPUs, are compared with the model's best over the same grid, ``grid_maximum``).

Run:  .venv/bin/python experiments/predictor/bench_published.py
Writes experiments/results/predictor/published.{md,json}.
      .venv/bin/python experiments/predictor/bench_published.py --dev
prints the dev third only, row by row with the model's breakdown, and writes
nothing: the view to tune against without seeing a held-out row.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

from geodiloco.predictor.model import NodeStepModel, node_step_model
from geodiloco.predictor.specs import resolve_gpu
from geodiloco.predictor.workload import ModelDims, TrainingCode, training_flops

HERE = Path(__file__).resolve().parent
DATA_FILE = HERE / "data" / "published_training_steps.yaml"
OUTSIDE_SCOPE_FILE = HERE / "data" / "published_pascal_steps.yaml"
"""Rows of GPUs outside the fitted scope (Pascal): never fitted, all predicted blind, reported apart."""
LAYER_FILE = HERE / "data" / "published_layer_steps.yaml"
"""Layer micro-benchmarks (one block timed alone, forward + backward, with its own workloads): never fitted, all
predicted blind, reported apart."""
OPEN_DRIVER_NAMES_FILE = HERE.parents[1] / "tests" / "data" / "nvidia_open_driver_names.yaml"
RESULTS = HERE.parents[0] / "results" / "predictor"
GOAL_MEDIAN = 0.08
BOOTSTRAP_DRAWS = 4000
MAX_PLAIN_BATCH = 1024
ZERO_ATTENTION_DROPOUT_COUNTED = True
"""Whether a workload's ``attention_dropout: false`` (the source sets that dropout's probability to 0, so PyTorch runs
no dropout kernel over the attention probabilities) is honoured; select_model.py turns it off to score the model
without it."""
CUDA_10_ALIGNMENT_COUNTED = True
"""Whether a row's ``cuda`` (its container predates CUDA 11) sets the predictor's tensor-core alignment
(``TrainingCode.tensor_core_alignment``); select_model.py turns it off to score the model without it."""
CUBLAS_10_TENSOR_CORE_ALIGNMENT = 8
"""NVIDIA's Matrix Multiplication Background User's Guide, Tensor Core Requirements: before cuBLAS 11.0, FP16 GEMMs
use tensor cores only when their dimensions are multiples of 8."""
WARMUP_PER_RUN_S = 1.0
"""One-time costs of a run (its first iterations: allocation, autotuning, loader start) that a figure timed over the
whole run with no warm-up excluded spreads over its timed steps. Hand-set from Lambda's console logs, not fitted: the
median, over the 18 runs in experiments/results/predictor/source_warmup.md that match a dev-third row (workload,
precision, batch and published step), of published step - steady step (tqdm's rate over iterations 20-100), 10.0 ms,
times the 100 steps those figures are timed over."""
TRUNCATED_VALUES_COUNTED = True
"""Whether a figure its source truncated (``value_truncated_to``: it stands for any value up to one step above it) is
read as the mean its source's run logs give (``value_from_logs``, experiments/predictor/lambda_log_means.py), or as the
middle of that interval where no logs were read; select_model.py turns it off to score the model on the figures as
published."""
TIMED_STEPS = re.compile(r"over (\d+) steps")
"""A row's ``measures`` names the steps its figure is timed over ('... over 100 steps ...')."""


def workload_dims(spec: dict, seq_len: int) -> ModelDims:
    """ModelDims of a published workload. A GELU MLP (two matrices of hidden x ffn) is given the
    SwiGLU width with the same parameters and FLOPs (2/3 of ffn), which is all the cost model sees."""
    ffn = spec["ffn_size"] if spec.get("ffn_kind", "gelu") == "swiglu" else round(spec["ffn_size"] * 2 / 3)
    return ModelDims(hidden_size=spec["hidden_size"], intermediate_size=ffn, num_layers=spec["num_layers"],
                     num_heads=spec["num_heads"], vocab_size=spec["vocab_size"], max_seq_len=max(seq_len, 1),
                     tie_embeddings=bool(spec.get("tied_embeddings", False)),
                     embedding_parameters=spec.get("embedding_parameters"))


def measured_step_s(row: dict) -> float:
    """Seconds per optimizer step of the published figure."""
    value, unit = published_value(row), row["unit"]
    if unit == "sequences_per_s":
        return row["batch_size"] / value
    if unit == "tokens_per_s":
        return row["batch_size"] * row["seq_len"] / value
    if unit == "step_s":
        return value
    if unit == "ms_per_step":
        return value / 1e3
    if unit == "layer_tflops_fwd_bwd":
        return 3.0 * layer_forward_flops(row["batch_size"], row["seq_len"], row["flops_hidden_size"]) / (value * 1e12)
    raise ValueError(f"{row['id']}: unknown unit {unit!r}")


def published_value(row: dict) -> float:
    """The row's figure in its own unit. A figure its source truncated (``value_truncated_to``: Lambda's compile
    scripts write ``int(round(mean, 2))``, so a published 62 stands for a mean run throughput in [62, 63)) is read as
    the mean of the runs it was cut down from where their logs were read (``value_from_logs``: the A40's 62.71), else
    as the middle of what it stands for, the value plus half the step."""
    value = float(row["value"])
    step = row.get("value_truncated_to")
    if not (step and TRUNCATED_VALUES_COUNTED):
        return value
    if "value_from_logs" in row:
        return float(row["value_from_logs"])
    return value + 0.5 * float(step)


def layer_forward_flops(batch: int, seq_len: int, hidden: int) -> float:
    """FLOPs of one block's forward pass as the layer micro-benchmarks count them (published_layer_steps.yaml:
    16*b*s*h^2 for the MLP, 4*b*h*s^2 + 8*b*s*h^2 for attention), to turn their TFLOPS back into seconds."""
    return 16.0 * batch * seq_len * hidden**2 + 4.0 * batch * hidden * seq_len**2 + 8.0 * batch * seq_len * hidden**2


def held_out(row_id: str) -> bool:
    return int(hashlib.sha256(row_id.encode()).hexdigest(), 16) % 3 != 0


def row_precision(row: dict) -> str:
    """The matmul arithmetic the row ran: its ``math`` field where the data file records one (TF32 under an
    'fp32' label in NGC containers), else its ``precision``."""
    return row.get("math") or row["precision"]


def row_code(row: dict, workloads: dict) -> TrainingCode:
    """How the row's source code runs its workload (block kind, attention, MLP activation, LM-head share,
    Transformer-XL memory, a dropout over the attention probabilities or none, blocks timed alone), from the
    workload's fields; a row's ``lm_head_fraction`` overrides the workload's."""
    spec = workloads[row["workload"]]
    return TrainingCode(block=spec.get("block", "llama"), attention=spec.get("attention", "flash"),
                        activation=spec.get("activation", "fused"),
                        lm_head_fraction=float(row.get("lm_head_fraction", spec.get("lm_head_fraction", 1.0))),
                        memory_len=int(spec.get("memory_len", 0)),
                        relative_positions=bool(spec.get("relative_positions", False)),
                        attention_dropout=bool(spec.get("attention_dropout", True)) or not ZERO_ATTENTION_DROPOUT_COUNTED,
                        tensor_core_alignment=row_tensor_core_alignment(row),
                        blocks_only=bool(spec.get("blocks_only", False)))


def row_tensor_core_alignment(row: dict) -> int:
    """8 where the row's container predates CUDA 11 (its ``cuda`` field): cuBLAS before 11.0 runs an FP16 GEMM on
    tensor cores only when every dimension is a multiple of 8; 1 (any shape) otherwise."""
    if not CUDA_10_ALIGNMENT_COUNTED or not row.get("cuda"):
        return 1
    return CUBLAS_10_TENSOR_CORE_ALIGNMENT if int(str(row["cuda"]).split(".")[0]) < 11 else 1


def row_micro_batch(row: dict) -> int:
    """Sequences per forward/backward pass: the row's micro-batch, else its batch over the printed accumulation steps
    (DLE's run_pretraining.py runs train_batch_size // gradient_accumulation_steps), else the whole batch."""
    if row.get("micro_batch_size"):
        return row["micro_batch_size"]
    if row.get("accumulation_steps"):
        return row["batch_size"] // row["accumulation_steps"]
    return row["batch_size"]


def row_model(row: dict, workloads: dict) -> NodeStepModel:
    """Cold model of the row's run; ``optimizer: none`` rows (timed forward + backward only) get no optimizer step."""
    spec, _ = resolve_gpu(row.get("gpu_canonical") or row["gpu"])
    dims = workload_dims(workloads[row["workload"]], row["seq_len"])
    micro = row_micro_batch(row)
    return node_step_model([spec.name], dims, row["seq_len"], row_precision(row),
                           micro_batch_size=micro if micro < row["batch_size"] else None,
                           optimizer_step=row.get("optimizer") != "none", code=row_code(row, workloads))


def warmup_share_s(row: dict) -> float:
    """Seconds of the run's one-time costs in each published step: ``WARMUP_PER_RUN_S`` over the timed steps, for
    rows whose ``measures`` say the figure is timed over N steps with no warm-up exclusion (Lambda's SQuAD rows:
    run_squad.py's training_sequences_per_second over 100 steps); 0 for figures that exclude warm-up or do not
    say over how many steps they were timed."""
    measures = row.get("measures") or ""
    timed = TIMED_STEPS.search(measures)
    if timed is None or "no warm-up exclusion" not in measures:
        return 0.0
    return WARMUP_PER_RUN_S / int(timed.group(1))


def predicted_step_s(row: dict, workloads: dict) -> float:
    """The cold model's steady step at the row's batch, plus the share of the run's one-time costs the published
    figure carries (``warmup_share_s``)."""
    return row_model(row, workloads).predict(row["batch_size"]) + warmup_share_s(row)


def roofline_flops(row: dict, workloads: dict) -> float:
    """FLOPs of the row's step for the plain roofline: the model's training FLOPs, or for blocks timed alone
    (``blocks_only``) 3 x their forward FLOPs, with no embedding or head."""
    dims = workload_dims(workloads[row["workload"]], row["seq_len"])
    if row_code(row, workloads).blocks_only:
        return 3.0 * dims.num_layers * layer_forward_flops(row["batch_size"], row["seq_len"], dims.hidden_size)
    return training_flops(dims, row["batch_size"], row["seq_len"])


def evaluate(row: dict, workloads: dict) -> dict:
    if row.get("sequence_bins"):
        raise ValueError(f"sequences padded to {row['sequence_bins']}-token bins, not to seq_len {row['seq_len']}; "
                         "the binned lengths are not published; not placed")
    if row_micro_batch(row) > MAX_PLAIN_BATCH:
        raise ValueError(f"batch {row['batch_size']} with no micro-batch or accumulation steps stated; not placed")
    spec, notice = resolve_gpu(row.get("gpu_canonical") or row["gpu"])
    dims = workload_dims(workloads[row["workload"]], row["seq_len"])
    precision = row_precision(row)
    predicted_s = predicted_step_s(row, workloads)
    truth_s = measured_step_s(row)
    rate_tflops = spec.matmul_rate(precision)[0]
    roofline_s = roofline_flops(row, workloads) / (rate_tflops * 1e12)
    return {"id": row["id"], "gpu": spec.name, "gpu_as_published": row["gpu"], "gpu_notice": notice,
            "workload": row["workload"], "seq_len": row["seq_len"], "batch_size": row["batch_size"],
            "precision": precision, "precision_as_published": row["precision"], "measured_s": truth_s, "predicted_s": predicted_s,
            "error": predicted_s / truth_s - 1.0, "roofline_error": roofline_s / truth_s - 1.0,
            "held_out": held_out(row["id"]), "source": row["source"]}


def summary(results: list, key: str) -> list:
    groups: dict = defaultdict(list)
    for result in results:
        groups[result[key]].append(result)
    lines = []
    for name in sorted(groups):
        errors = [abs(result["error"]) for result in groups[name]]
        roofline = [abs(result["roofline_error"]) for result in groups[name]]
        lines.append({key: name, "rows": len(errors), "median": statistics.median(errors), "worst": max(errors),
                      "roofline_median": statistics.median(roofline)})
    return lines


def overall(results: list) -> dict:
    errors = [abs(result["error"]) for result in results]
    signed = [result["error"] for result in results]
    return {"rows": len(errors), "median": statistics.median(errors), "worst": max(errors),
            "median_signed": statistics.median(signed),
            "roofline_median": statistics.median(abs(result["roofline_error"]) for result in results)}


def median_interval(results: list, draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> tuple[float, float]:
    """95 % interval of the median absolute error, from a bootstrap that resamples whole GPUs (with all
    their rows) rather than single rows: rows of one GPU share its datasheet's misfit, so resampling rows
    would understate how much the figure depends on which GPUs were published."""
    by_gpu: dict = defaultdict(list)
    for result in results:
        by_gpu[result["gpu"]].append(abs(result["error"]))
    groups = list(by_gpu.values())
    rng = np.random.default_rng(seed)
    medians = [float(np.median(np.concatenate([groups[index] for index in rng.integers(len(groups), size=len(groups))])))
               for _ in range(draws)]
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(low), float(high)


def source_of(row_id: str) -> str:
    """'lambda-v0', 'dle-pt2021', 'neusight-bertlarge': the source and its generation, from a row's id."""
    return "-".join(row_id.split("-")[:2])


def in_sample_floor(results: list) -> float:
    """Median error left after fitting, to every row at once, one free factor per (GPU, precision) and one
    per (workload, source generation): an oracle that may overfit, so a lower bound on what any model
    whose error is such factors can reach on these rows (the rest is the sources' own scatter)."""
    gpu_keys = sorted({(r["gpu"], r["precision"]) for r in results})
    load_keys = sorted({(r["workload"], source_of(r["id"])) for r in results})
    design = np.zeros((len(results), len(gpu_keys) + len(load_keys)))
    for index, result in enumerate(results):
        design[index, gpu_keys.index((result["gpu"], result["precision"]))] = 1.0
        design[index, len(gpu_keys) + load_keys.index((result["workload"], source_of(result["id"])))] = 1.0
    log_errors = np.log1p([result["error"] for result in results])
    factors, *_ = np.linalg.lstsq(design, log_errors, rcond=None)
    return float(np.median(np.abs(np.expm1(log_errors - design @ factors))))


def repeat_disagreement(results: list) -> tuple[int, float, float]:
    """(pairs, median, worst) of (slower / faster - 1) between the measured step times of two rows that ran the same GPU,
    workload, precision, sequence length and batch size but were published by different sources or source
    generations (Lambda re-ran its benchmarks in a newer container). No model is involved: this is how far two
    publications of one measurement disagree, scatter a cold model cannot see."""
    by_key: dict = defaultdict(list)
    for result in results:
        key = (result["gpu"], result["workload"], result["precision"], result["seq_len"], result["batch_size"])
        by_key[key].append(result)
    disagreements = []
    for group in by_key.values():
        for index, first in enumerate(group):
            for second in group[index + 1:]:
                if source_of(first["id"]) != source_of(second["id"]):
                    times_s = sorted((first["measured_s"], second["measured_s"]))
                    disagreements.append(times_s[1] / times_s[0] - 1.0)
    if not disagreements:
        return 0, float("nan"), float("nan")
    return len(disagreements), statistics.median(disagreements), max(disagreements)


def software_factor_line(held: list, dev: list, model_median: float) -> str:
    """Whether a software factor shared by a workload and source generation, learned on other GPUs, would carry
    the held-out rows further than the model does alone (its median ``model_median``)."""
    factor_median = cross_gpu_factor_median(held, dev)
    verdict = ("A shared software factor carries little across GPUs" if factor_median > model_median - 0.01
               else "A shared software factor carries across GPUs")
    return (f"{verdict}: scaling each held-out row by the median measured / predicted ratio of the dev rows of its "
            f"workload and source generation on other GPUs gives a held-out median of {factor_median:.1%} "
            f"(the model alone: {model_median:.1%}).")


def cross_gpu_factor_median(held: list, dev: list) -> float:
    """Held-out median error after scaling each row by the median measured / predicted ratio of the dev rows with
    the same workload and source generation on other GPUs (the row unscaled where there are none): whether a
    shared software factor, learned on other GPUs, carries over."""
    errors = []
    for result in held:
        key = (result["workload"], source_of(result["id"]))
        ratios = [row["measured_s"] / row["predicted_s"] for row in dev
                  if (row["workload"], source_of(row["id"])) == key and row["gpu"] != result["gpu"]]
        factor = statistics.median(ratios) if ratios else 1.0
        errors.append(abs(result["predicted_s"] * factor / result["measured_s"] - 1.0))
    return statistics.median(errors)


def interval_line(results: list, interval: tuple[float, float]) -> str:
    low, high = interval
    gpus = len({result["gpu"] for result in results})
    return (f"resampling the {gpus} GPUs with replacement ({BOOTSTRAP_DRAWS} draws, each GPU with all its rows), "
            f"the median lies between {low:.1%} and {high:.1%} in 95 % of the draws.")


def repeat_line(results: list) -> str:
    pairs, median, worst = repeat_disagreement(results)
    if not pairs:
        return "No measurement was published twice (same GPU, workload, precision, sequence length and batch)."
    return (f"Two publications of one measurement disagree: {pairs} pairs of rows ran the same GPU, workload, "
            f"precision, sequence length and batch size in two sources or source generations, and their measured "
            f"step times differ by {median:.1%} at the median (worst {worst:.0%}). That scatter is in the truth "
            "itself; a cold model sees no container or software version beyond the CUDA release the data file records.")


def coverage_line() -> str:
    """What names the predictor plans: the table's rows and the GPU slices derived from them."""
    from geodiloco.predictor.amd_partitions import partition_modes
    from geodiloco.predictor.mig import standard_profiles
    from geodiloco.predictor.specs import known_gpus
    rows = known_gpus()
    with_mig = [row for row in rows if row.mig_instances]
    by_modes: dict[str, list[str]] = {}
    for row in rows:
        modes = "/".join(mode for mode, devices in partition_modes(row).items() if devices > 1)
        if modes:
            by_modes.setdefault(modes, []).append(row.name)
    partitions = "; ".join(f"{modes} partitions of {', '.join(names)}" for modes, names in by_modes.items())
    return (f"Coverage: {len(rows)} datasheet rows ({sum(row.vendor == 'amd' for row in rows)} AMD); "
            f"{len(with_mig)} of them split into MIG instances, {sum(len(standard_profiles(row)) for row in with_mig)} "
            f"GPU-instance profiles in all; time-sliced and MIG-backed vGPU profiles of any row; "
            f"{partitions}. {open_driver_line()} The driver strings checked are listed in "
            "tests/test_predictor_names.py, test_predictor_mig.py, test_predictor_vgpu.py and "
            "test_predictor_amd_partitions.py.")


def open_driver_line() -> str:
    """How many of the product names NVIDIA's open kernel driver lists (as NVML prints them) resolve to a row."""
    from geodiloco.predictor.specs import resolve_gpu
    names = yaml.safe_load(OPEN_DRIVER_NAMES_FILE.read_text(encoding="utf-8"))["names"]
    resolved = 0
    for name in names:
        try:
            resolve_gpu(name)
            resolved += 1
        except ValueError:  # the unknown-GPU path: the file lists why each of these has no row
            pass
    return (f"Of the {len(names)} product names NVIDIA's open kernel driver lists, {resolved} resolve to a row "
            f"({OPEN_DRIVER_NAMES_FILE.relative_to(HERE.parents[1])} lists the others and why).")


def apart_lines(rows: list, title: str, truth: str) -> list[str]:
    """A section of rows reported apart from the held-out figure (never fitted, none in the dev third), every row
    predicted once with the shipped constants; ``truth`` says what they are."""
    if not rows:
        return []
    head = overall(rows)
    lines = ["", f"## {title}", "",
             f"Truth: {truth}; none fitted to and none in the dev third; every row predicted once with the constants "
             f"above: median error {head['median']:.1%}, worst {head['worst']:.1%} (median signed "
             f"{head['median_signed']:+.1%}; roofline median {head['roofline_median']:.1%}). Not part of the held-out "
             "figure.", "",
             "| id | GPU | workload | seq | batch | precision | measured ms | predicted ms | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    return lines + [f"| {r['id']} | {r['gpu']} | {r['workload']} | {r['seq_len']} | {r['batch_size']} | "
                     f"{r['precision']} | {r['measured_s'] * 1e3:.2f} | {r['predicted_s'] * 1e3:.2f} | "
                     f"{r['error']:+.1%} |" for r in rows]


def outside_scope_lines(outside: list) -> list[str]:
    """The section on the GPUs outside the fitted scope (Pascal)."""
    return apart_lines(outside, "GPUs outside the fitted scope (Pascal, no tensor cores)",
                       f"{len(outside)} rows of experiments/predictor/data/published_pascal_steps.yaml")


def layer_lines(layers: list) -> list[str]:
    """The section on the layer micro-benchmarks (one block timed alone on one GPU)."""
    return apart_lines(layers, "Layer micro-benchmarks (one block, forward + backward)",
                       f"{len(layers)} rows of experiments/predictor/data/published_layer_steps.yaml (Mu Li's "
                       "micro_bench.ipynb: one BERT-large layer and one GPT-2 medium block in fp16 on an RTX 3090 Ti, "
                       "batch 2-128, each timed alone on a random input, no optimizer)")


def markdown(held: list, dev: list, skipped: list, sources: int, interval: tuple[float, float],
             outside: list = (), layers: list = (), maxima: list = ()) -> str:
    head = overall(held)
    lines = [
        "# Cold step-time accuracy on published measurements",
        "",
        f"Truth: {len(held) + len(dev)} published single-GPU training measurements from {sources} sources "
        "(experiments/predictor/data/published_training_steps.yaml cites each). Prediction: the cold model "
        "(datasheet row + workload shape, nothing measured on the GPU), with the kernel-class efficiencies of "
        f"predictor/data/gpu_efficiency.yaml ({fitted_note()}). Commands: "
        "`python experiments/predictor/fit_efficiency.py` (refits on the dev third), then "
        "`python experiments/predictor/bench_published.py`.",
        "",
        f"**Held-out ({head['rows']} rows): median error {head['median']:.1%}, worst {head['worst']:.1%}** "
        f"(goal: median <= {GOAL_MEDIAN:.0%}; median signed error {head['median_signed']:+.1%}; "
        f"a plain roofline, FLOPs / dense peak: median {head['roofline_median']:.1%}).",
    ]
    if dev:
        dev_head = overall(dev)
        lines.append(f"Dev third ({dev_head['rows']} rows, reported apart): median {dev_head['median']:.1%}, "
                     f"worst {dev_head['worst']:.1%}.")
    lines += ["", f"How much the held-out median depends on which GPUs were published: {interval_line(held, interval)}",
              "", f"The data's own floor: a free factor per (GPU, precision) and per (workload, source generation), "
              f"fitted to all {len(held) + len(dev)} rows at once, still leaves a median error of "
              f"{in_sample_floor(held + dev):.1%}.",
              "", repeat_line(held + dev),
              "", software_factor_line(held, dev, head["median"]),
              "", coverage_line()]
    for key, title in (("workload", "Per workload (held-out)"), ("gpu", "Per GPU (held-out)")):
        lines += ["", f"## {title}", "", f"| {key} | rows | median | worst | roofline median |", "|---|---|---|---|---|"]
        lines += [f"| {row[key]} | {row['rows']} | {row['median']:.1%} | {row['worst']:.1%} | "
                  f"{row['roofline_median']:.1%} |" for row in summary(held, key)]
    lines += ["", "## Every held-out row", "",
              "| id | GPU | workload | seq | batch | precision | measured ms | predicted ms | error |",
              "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['id']} | {r['gpu']} | {r['workload']} | {r['seq_len']} | {r['batch_size']} | {r['precision']} | "
              f"{r['measured_s'] * 1e3:.1f} | {r['predicted_s'] * 1e3:.1f} | {r['error']:+.1%} |" for r in held]
    lines += outside_scope_lines(list(outside))
    lines += layer_lines(list(layers))
    lines += grid_maxima_lines(list(maxima))
    if skipped:
        lines += ["", "## Rows not evaluated", ""] + [f"- {item}" for item in skipped]
    return "\n".join(lines) + "\n"


def fitted_note() -> str:
    """Which constants were fitted, on what, and their values."""
    from geodiloco.predictor.kernels import EFFICIENCY_FILE, GPU_EFFICIENCY
    fit = yaml.safe_load(EFFICIENCY_FILE.read_text(encoding="utf-8")).get("fit")
    if not fit:
        return "hand-set, nothing fitted"
    caps = fit.get("upper_bounds") or {}

    def shown(name: str) -> str:
        value = getattr(GPU_EFFICIENCY, name)
        unit = " GB/s per SM" if name.endswith("_gbps_per_sm") else ""
        return f"{name} {value:g}{unit}" + (" (at its cap)" if caps.get(name) == value else "")

    values = ", ".join(shown(name) for name in fit["fields"])
    return f"{values} fitted on the {fit['rows']} dev-third rows only; the held-out rows were never used"


def dev_table(dev: list, rows: list, workloads: dict) -> str:
    """Dev-third rows with where the predicted time goes (ms): the only per-row view meant for tuning."""
    by_id = {row["id"]: row for row in rows}
    lines = [f"{'id':64} {'meas':>8} {'pred':>8} {'err':>7}  mm_c  mm_m  attn  elem   opt  host  warm"]
    for result in sorted(dev, key=lambda r: (r["workload"], r["gpu"], r["id"])):
        row = by_id[result["id"]]
        parts = breakdown_ms(row, workloads)
        lines.append(f"{result['id'][:64]:64} {result['measured_s'] * 1e3:8.1f} {result['predicted_s'] * 1e3:8.1f} "
                     f"{result['error']:+7.1%} " + " ".join(f"{parts[key]:5.0f}" for key in parts))
    dev_head = overall(dev)
    lines.append(f"dev third: {dev_head['rows']} rows, median {dev_head['median']:.1%}, worst {dev_head['worst']:.1%}, "
                 f"median signed {dev_head['median_signed']:+.1%}")
    for key in ("workload", "gpu"):
        lines += [f"  {line[key]:36} {line['rows']:3} median {line['median']:6.1%} worst {line['worst']:6.1%}"
                  for line in summary(dev, key)]
    return "\n".join(lines)


def breakdown_ms(row: dict, workloads: dict) -> dict:
    """Milliseconds per kernel class of the row's prediction (matmul compute / memory, attention,
    elementwise, optimizer, exposed host) and the run's one-time costs the published figure carries."""
    step = row_model(row, workloads).device_step(0, row["batch_size"])
    return {"mm_c": step.matmul_compute_s * 1e3, "mm_m": step.matmul_memory_s * 1e3, "attn": step.attention_s * 1e3,
            "elem": step.elementwise_s * 1e3, "opt": step.optimizer_s * 1e3, "host": step.host_s * 1e3,
            "warm": warmup_share_s(row) * 1e3}


def layer_data() -> dict:
    """The layer micro-benchmarks' file: its own workloads, its grid rows and the grid maxima."""
    return yaml.safe_load(LAYER_FILE.read_text(encoding="utf-8"))


def layer_results(data: dict) -> list:
    """The layer micro-benchmarks' grid rows, each predicted once."""
    return [evaluate(row, data["workloads"]) for row in data["measurements"]]


def grid_maximum(row: dict, workloads: dict) -> dict:
    """A published best TFLOPS over a grid of (sequence length, batch) beside the model's best over the same grid.
    ``error`` is published / predicted - 1: for equal work a time ratio, so + means the model is too slow, as for
    a step time."""
    spec, notice = resolve_gpu(row.get("gpu_canonical") or row["gpu"])
    best_tflops, best_point = 0.0, None
    for seq_len in row["grid"]["seq_lens"]:
        for batch in row["grid"]["batch_sizes"]:
            point = dict(row, seq_len=seq_len, batch_size=batch, micro_batch_size=batch)
            tflops = 3.0 * layer_forward_flops(batch, seq_len, row["flops_hidden_size"]) / (
                predicted_step_s(point, workloads) * 1e12)
            if tflops > best_tflops:
                best_tflops, best_point = tflops, (seq_len, batch)
    return {"id": row["id"], "gpu": spec.name, "gpu_as_published": row["gpu"], "gpu_notice": notice,
            "workload": row["workload"], "precision": row_precision(row), "published_tflops": float(row["value"]),
            "predicted_tflops": best_tflops,
            "predicted_best_at": {"seq_len": best_point[0], "batch_size": best_point[1]},
            "error": float(row["value"]) / best_tflops - 1.0, "source": row["source"]}


def grid_maxima_results(data: dict) -> list:
    """The layer micro-benchmarks' published grid maxima (other GPUs than the grid rows'), each predicted once."""
    return [grid_maximum(row, data["workloads"]) for row in data.get("grid_maxima", [])]


def maxima_summary(maxima: list) -> dict:
    """Median and worst absolute error of the grid maxima."""
    errors = [abs(entry["error"]) for entry in maxima]
    return {"rows": len(errors), "median": statistics.median(errors), "worst": max(errors)}


def grid_maxima_lines(maxima: list) -> list[str]:
    """The section on the grid maxima: published and predicted best TFLOPS per GPU and block."""
    if not maxima:
        return []
    head = maxima_summary(maxima)
    lines = ["", "## Layer micro-benchmarks: the best of the grid on other GPUs", "",
             f"Truth: the {len(maxima)} grid maxima of experiments/predictor/data/published_layer_steps.yaml (the "
             "README's summary of the same notebook: each GPU's best forward + backward TFLOPS over the grid above, "
             "without the grid point), beside the model's best over the same grid; error = published / predicted - 1 "
             "(+: the model is too slow). Never fitted: median error "
             f"{head['median']:.1%}, worst {head['worst']:.1%}. Not part of the held-out figure.", "",
             "| id | GPU | workload | published TFLOPS | predicted TFLOPS | predicted best at (seq, batch) | error |",
             "|---|---|---|---|---|---|---|"]
    return lines + [f"| {m['id']} | {m['gpu']} | {m['workload']} | {m['published_tflops']:g} | "
                     f"{m['predicted_tflops']:.1f} | {m['predicted_best_at']['seq_len']}, "
                     f"{m['predicted_best_at']['batch_size']} | {m['error']:+.1%} |" for m in maxima]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dev", action="store_true",
                        help="print the dev third row by row (the rows the constants are fitted to); writes nothing")
    args = parser.parse_args()
    data = yaml.safe_load(DATA_FILE.read_text(encoding="utf-8"))
    workloads, rows = data["workloads"], data["measurements"]
    results, skipped = [], []
    for row in rows:
        try:
            results.append(evaluate(row, workloads))
        except Exception as err:  # a row the predictor cannot place is listed, never dropped silently
            skipped.append(f"{row.get('id')}: {err}")
    held = [result for result in results if result["held_out"]]
    dev = [result for result in results if not result["held_out"]]
    sources = len({row["source"].split(",")[0] for row in rows})
    if args.dev:
        print(dev_table(dev, rows, workloads))
        return 0
    interval = median_interval(held)
    outside = [evaluate(row, workloads)
               for row in yaml.safe_load(OUTSIDE_SCOPE_FILE.read_text(encoding="utf-8"))["measurements"]]
    layer_file = layer_data()
    layers, maxima = layer_results(layer_file), grid_maxima_results(layer_file)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "published.md").write_text(markdown(held, dev, skipped, sources, interval, outside, layers, maxima),
                                          encoding="utf-8")
    (RESULTS / "published.json").write_text(json.dumps(
        {"held_out": overall(held), "held_out_median_interval_95": interval,
         "dev": overall(dev) if dev else None,
         "per_workload": summary(held, "workload"), "per_gpu": summary(held, "gpu"),
         "repeat_disagreement": dict(zip(("pairs", "median", "worst"), repeat_disagreement(results))),
         "rows": results, "skipped": skipped,
         "outside_scope": {"summary": overall(outside), "rows": outside},
         "layer_microbenchmarks": {"summary": overall(layers), "rows": layers},
         "layer_grid_maxima": {"summary": maxima_summary(maxima), "rows": maxima}},
        indent=2), encoding="utf-8")
    head = overall(held)
    low, high = interval
    print(f"held-out: {head['rows']} rows, median {head['median']:.1%} (95 % interval over GPUs {low:.1%}-{high:.1%}), "
          f"worst {head['worst']:.1%} (roofline median {head['roofline_median']:.1%}); skipped {len(skipped)}")
    beyond = overall(outside)
    print(f"outside the fitted scope (Pascal, predicted blind): {beyond['rows']} rows, median {beyond['median']:.1%}, "
          f"worst {beyond['worst']:.1%}")
    per_layer = overall(layers)
    print(f"layer micro-benchmarks (one block on an RTX 3090 Ti, predicted blind): {per_layer['rows']} rows, "
          f"median {per_layer['median']:.1%}, worst {per_layer['worst']:.1%}")
    best = maxima_summary(maxima)
    print(f"layer grid maxima (A100, A6000, V100, 4090, predicted blind): {best['rows']} rows, "
          f"median {best['median']:.1%}, worst {best['worst']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
