#!/usr/bin/env python3
"""Where a GPU-bound training step's kernel time goes, by the predictor's kernel classes, beside the
predictor's own split of the same step.

    python experiments/gpu/kernel_classes.py [--presets llama-150m] [--batch-sizes 8,32]
                                             [--precisions bf16,fp32] [--out DIR]

The cold predictor prices a step as GEMMs, attention, elementwise kernels (the softmax
cross-entropy over the vocabulary among them) and the optimizer, each at a share of a datasheet
peak (predictor/kernels.py). A whole-step time that is off says little about which share is
wrong; this script profiles one training step (the runtime's inner step, as validate.py times it)
with torch.profiler, sorts every CUDA kernel into those classes by its name, and prints the
measured milliseconds per class beside the predicted ones (``NodeStepModel.explain``). The loss
kernels (PyTorch's one-block-per-row softmax, ``cunn_SoftMax*``, and ``nll_loss*``) are also
shown apart: their rate is the predictor's per-SM bound.

It also gives the rate the step's GEMM kernels reached, as a share of the datasheet rate: the
linear layers' FLOPs (forward and backward, 3 x 2 x tokens x weights; attention's score products run
in the attention kernels) over the measured GEMM time. The model prices large GEMMs at 0.90 of it.

Without CUDA it prints one line and exits 0. Writes DIR/kernel_classes.{json,md} (default
experiments/results/gpu/). ``--render DIR`` rewrites DIR/kernel_classes.md from DIR/kernel_classes.json
(no GPU needed).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

WARMUP_STEPS = 3
CLASSES = ("matmul", "attention", "elementwise", "optimizer")
# Checked in this order; the first match wins. Attention first: its CUTLASS kernels ("fmha_cutlassF")
# would otherwise read as GEMMs. The loss is part of "elementwise" for the comparison, and shown apart.
KERNEL_PATTERNS = (
    ("attention", re.compile(r"flash|fmha|sdpa|attention", re.IGNORECASE)),
    ("vocab_loss", re.compile(r"cunn_SoftMax|nll_loss|cross_entropy", re.IGNORECASE)),
    ("optimizer", re.compile(r"multi_tensor_apply|lpnorm_cleanup|fused_adam|adamw?_", re.IGNORECASE)),
    ("matmul", re.compile(r"gemm|gemv|nvjet|xmma|cutlass|cublas|splitKreduce", re.IGNORECASE)),
)


def classify_kernel(name: str) -> str:
    """The predictor's kernel class of a CUDA kernel, from its name: matmul, attention, vocab_loss,
    optimizer, or elementwise (everything else: norms, activations, residuals, casts, copies)."""
    for kernel_class, pattern in KERNEL_PATTERNS:
        if pattern.search(name):
            return kernel_class
    return "elementwise"


def class_times_ms(kernels: list[tuple[str, float]]) -> dict:
    """Milliseconds per class of (kernel name, device microseconds) pairs; ``elementwise`` includes the
    loss kernels, which ``vocab_loss`` also counts apart."""
    times = {name: 0.0 for name in (*CLASSES, "vocab_loss")}
    for name, device_us in kernels:
        kernel_class = classify_kernel(name)
        times[kernel_class] += device_us / 1e3
        if kernel_class == "vocab_loss":
            times["elementwise"] += device_us / 1e3
    return times


def predicted_classes_ms(spec, dims, seq_len: int, precision: str, batch_size: int) -> dict:
    """The cold model's milliseconds per class for one GPU row (no host cost: kernels only)."""
    from geodiloco.predictor.model import NodeStepModel

    explained = NodeStepModel([spec], dims, seq_len, precision=precision).explain(batch_size)
    return {name: explained[f"{name}_s"] * 1e3 for name in CLASSES}


def gemm_flops(dims, seq_len: int, batch_size: int) -> float:
    """FLOPs of one training step's linear layers, forward and backward (3 x 2 x tokens x weights,
    the vocabulary projection included)."""
    from geodiloco.predictor.workload import layer_linear_shapes
    weights = dims.num_layers * sum(n_in * n_out for n_in, n_out in layer_linear_shapes(dims))
    weights += dims.vocab_size * dims.hidden_size
    return 6.0 * batch_size * seq_len * weights


def gemm_rate(row: dict, datasheet) -> tuple[float, float, float]:
    """(TFLOP, TFLOPS, share of the datasheet rate of the row's precision) of a profiled step's GEMM kernels."""
    from geodiloco.predictor.workload import resolve_dims
    tflop = gemm_flops(resolve_dims(row["preset"]), row["seq_len"], row["batch_size"]) / 1e12
    tflops = tflop / (row["measured_ms"]["matmul"] / 1e3)
    datasheet_tflops, _, _ = datasheet.matmul_rate(row["precision"])
    return tflop, tflops, tflops / datasheet_tflops


def gemm_table(rows: list[dict], datasheet) -> list[str]:
    lines = ["", f"GEMM kernels' rate: the linear layers' FLOPs over the measured GEMM time, as a share of the "
                 f"{datasheet.name} datasheet rate (the model prices large GEMMs at 0.90 of it).", "",
             "| preset | precision | batch | GEMM TFLOP per step | measured ms | TFLOPS | share of datasheet |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        tflop, tflops, share = gemm_rate(row, datasheet)
        lines.append(f"| {row['preset']} | {row['precision']} | {row['batch_size']} | {tflop:.2f} | "
                     f"{row['measured_ms']['matmul']:.2f} | {tflops:,.0f} | {share:.2f} |")
    return lines


def markdown(rows: list[dict], gpu: str, torch_version: str, datasheet=None) -> str:
    lines = [
        f"# Kernel time by class: {gpu}",
        "",
        f"Truth: one profiled training step per row (torch.profiler, CUDA kernel durations; torch {torch_version}), "
        "after warm-up steps. Predicted: the cold model's split of the same step (`NodeStepModel.explain`, "
        "kernels only). Elementwise includes the loss over the vocabulary, which is also shown apart (measured). "
        "Command: `python experiments/gpu/kernel_classes.py`.",
        "",
        "| preset | precision | batch | class | measured ms | predicted ms | predicted / measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for name in CLASSES:
            measured, predicted = row["measured_ms"][name], row["predicted_ms"][name]
            ratio = f"{predicted / measured:.2f}" if measured > 0 else "-"
            lines.append(f"| {row['preset']} | {row['precision']} | {row['batch_size']} | {name} | {measured:.2f} | "
                         f"{predicted:.2f} | {ratio} |")
        lines.append(f"| {row['preset']} | {row['precision']} | {row['batch_size']} | (loss kernels, measured) | "
                     f"{row['measured_ms']['vocab_loss']:.2f} | | |")
    if datasheet is not None:
        lines += gemm_table(rows, datasheet)
    return "\n".join(lines) + "\n"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python experiments/gpu/kernel_classes.py",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="llama-150m", help="comma-separated model presets")
    parser.add_argument("--batch-sizes", default="8,32", help="comma-separated batch sizes (GPU-bound ones)")
    parser.add_argument("--precisions", default="bf16,fp32", help="comma-separated: fp32, bf16, fp16")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "gpu",
                        help="folder for kernel_classes.json and kernel_classes.md")
    parser.add_argument("--render", type=Path, metavar="DIR",
                        help="rewrite DIR/kernel_classes.md from DIR/kernel_classes.json and exit (no GPU needed)")
    return parser.parse_args(argv)


def render(folder: Path) -> Path:
    """DIR/kernel_classes.md from the stored profile, with the GEMM rate the steps reached."""
    from geodiloco.predictor.specs import lookup_gpu
    stored = folder / "kernel_classes.json"
    if not stored.is_file():
        raise SystemExit(f"kernel_classes.py: error: {folder} holds no kernel_classes.json; profile with --out first")
    data = json.loads(stored.read_text(encoding="utf-8"))
    target = folder / "kernel_classes.md"
    target.write_text(markdown(data["rows"], data["gpu"], data["torch"], lookup_gpu(data["row"])), encoding="utf-8")
    return target


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:
        print(f"wrote {render(args.render)}")
        return 0
    import torch
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): nothing was run; with one this would profile "
              f"{args.presets} at batch {args.batch_sizes} in {args.precisions}, kernel class by class.")
        return 0
    from gpu_sweep import preset_runners, profiled_step
    from geodiloco.predictor.specs import lookup_gpu

    device = torch.device("cuda", 0)
    gpu = torch.cuda.get_device_name(0)
    datasheet = lookup_gpu(gpu)
    print(f"{gpu} (row {datasheet.name}); torch {torch.__version__}", flush=True)
    rows = []
    for preset, dims, precision, runner in preset_runners(args.presets.split(","), args.precisions.split(","), device):
        for batch_size in map(int, args.batch_sizes.split(",")):
            runner.timed_steps_s(batch_size, WARMUP_STEPS, 1)
            kernels, _ = profiled_step(runner, batch_size)
            row = {"preset": preset, "precision": precision, "batch_size": batch_size, "seq_len": dims.max_seq_len,
                   "measured_ms": class_times_ms(kernels),
                   "predicted_ms": predicted_classes_ms(datasheet, dims, dims.max_seq_len, precision, batch_size)}
            rows.append(row)
            print(f"{preset} {precision} batch {batch_size}: " + ", ".join(
                f"{name} {row['measured_ms'][name]:.1f} ms (predicted {row['predicted_ms'][name]:.1f})"
                for name in CLASSES) + f"; loss kernels {row['measured_ms']['vocab_loss']:.1f} ms", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernel_classes.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gpu": gpu, "row": datasheet.name, "torch": torch.__version__,
         "rows": rows}, indent=2), encoding="utf-8")
    (args.out / "kernel_classes.md").write_text(markdown(rows, gpu, torch.__version__, datasheet), encoding="utf-8")
    print(f"wrote {args.out / 'kernel_classes.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
