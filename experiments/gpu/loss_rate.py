#!/usr/bin/env python3
"""How fast the softmax cross-entropy over the vocabulary streams on this GPU, by vocabulary size,
beside the rate the cold predictor gives it.

    python experiments/gpu/loss_rate.py [--vocab-sizes 8192,32000,50257,128256,267735]
                                        [--dtypes fp32,bf16] [--logit-gib 4] [--out DIR]

The predictor prices the loss as ``vocab_loss_bytes_per_token`` bytes per token at the lower of a
share of the bus and a per-SM rate times the SM count (``predictor.kernels.vocab_softmax_bytes_per_s``):
the per-SM bound was fitted on published steps, whose PyTorch ran a row that long as one block per row
that re-reads it from memory. This times ``F.cross_entropy`` forward + backward on random logits
(fp32: what autocast hands the loss; bf16: logits left in bf16), each vocabulary size with about
``--logit-gib`` GiB of logits, and splits the kernels with torch.profiler: the softmax and the NLL
kernels (the loss kernels) and the rest (casts, fills). It prints, per size, the loss kernels'
milliseconds, the kernel names (which softmax path ran) and the rate they streamed at, beside the
predicted milliseconds with and without the per-SM bound.

Without CUDA it prints one line and exits 0 (``--device cpu`` runs it on the CPU, for testing).
Writes DIR/loss_rate.{json,md} (default experiments/results/gpu/); ``--render DIR/loss_rate.json``
rewrites the table from stored measurements with the current predictor code.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_classes import KERNEL_PATTERNS  # noqa: E402

WARMUP_STEPS = 3
TIMED_STEPS = 5
LOSS_PATTERN = dict(KERNEL_PATTERNS)["vocab_loss"]
DTYPES = ("fp32", "bf16")  # the logits' dtype, named as the predictor names the precision


def rows_for(vocab_size: int, logit_gib: float) -> int:
    """Rows (tokens) that make about ``logit_gib`` GiB of fp32 logits, at least 1."""
    return max(1, int(logit_gib * 2**30 // (4 * vocab_size)))


def split_kernels(kernels: list[tuple[str, float]]) -> dict:
    """Device milliseconds of the loss kernels (softmax, NLL) and of the rest, and each loss kernel's name
    with its milliseconds, largest first."""
    loss, other, names = 0.0, 0.0, {}
    for name, device_us in kernels:
        if LOSS_PATTERN.search(name):
            loss += device_us / 1e3
            names[name] = names.get(name, 0.0) + device_us / 1e3
        else:
            other += device_us / 1e3
    ordered = sorted(names.items(), key=lambda item: -item[1])
    return {"loss_ms": loss, "other_ms": other, "loss_kernels": [[name, ms] for name, ms in ordered]}


def predicted_loss_ms(spec, vocab_size: int, rows: int, precision: str, per_sm_bound: bool) -> tuple[float, float]:
    """(the predictor's milliseconds for the loss over ``rows`` tokens, its bytes) on GPU row ``spec``, with
    or without the per-SM bound (``TrainingCode.vocab_softmax_per_sm_bound``)."""
    from geodiloco.predictor.kernels import efficiency_for, vocab_softmax_bytes_per_s
    from geodiloco.predictor.workload import ModelDims, vocab_loss_bytes_per_token

    dims = ModelDims(hidden_size=1024, intermediate_size=4096, num_layers=1, num_heads=16,
                     vocab_size=vocab_size, max_seq_len=1024)
    loss_bytes = rows * vocab_loss_bytes_per_token(dims, precision)
    elementwise_rate = spec.bandwidth_gbps_for(loss_bytes) * 1e9 * efficiency_for(spec).elementwise
    rate = vocab_softmax_bytes_per_s(spec, loss_bytes, elementwise_rate, per_sm_bound)
    return loss_bytes / rate * 1e3, loss_bytes


def kernel_bytes(vocab_size: int, rows: int, dtype_name: str) -> float:
    """Bytes the softmax kernels must move, counted by hand: forward reads the logits and writes the
    log-probabilities, backward reads the incoming gradient and the log-probabilities and writes the
    logits' gradient; five passes at the logits' element size (the NLL kernels touch one entry per row)."""
    from geodiloco.predictor.workload import activation_bytes

    return 5.0 * rows * vocab_size * activation_bytes(dtype_name)


def measure(vocab_size: int, rows: int, dtype_name: str, device) -> dict:
    """Median wall milliseconds of forward + backward over TIMED_STEPS, and one profiled step's kernels."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    logits = torch.randn(rows, vocab_size, device=device, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, vocab_size, (rows,), device=device)

    def step():
        logits.grad = None
        F.cross_entropy(logits, targets).backward()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(WARMUP_STEPS):
        step()
    times_ms = []
    for _ in range(TIMED_STEPS):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times_ms.append((time.perf_counter() - start) * 1e3)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        sync()
    kernels = [(event.name, getattr(event, "device_time", 0.0)) for event in prof.events()
               if event.device_type == torch.autograd.DeviceType.CUDA]
    return {"step_ms": statistics.median(times_ms), **split_kernels(kernels)}


def markdown(result: dict) -> str:
    """The table, with the predictions recomputed by the current predictor code."""
    from geodiloco.predictor.specs import lookup_gpu

    spec = lookup_gpu(result["row"])
    lines = [
        f"# Softmax cross-entropy over the vocabulary: {result['gpu']}",
        "",
        f"Truth: `F.cross_entropy` forward + backward on random logits, timed on this GPU (torch "
        f"{result['torch']}; loss kernels from one torch.profiler step, step time the median of "
        f"{TIMED_STEPS} after {WARMUP_STEPS} warm-up steps; {result['date']}). Predicted: the cold predictor's "
        f"loss term for GPU row {spec.name} ({spec.sm_count} SMs, {spec.memory_bandwidth_gbps:.0f} GB/s datasheet "
        "bus), recomputed by the current code: with the per-SM bound the published steps' code is given, and "
        "without it, as the runtime's code (`RUNTIME_CODE`) runs. Kernel rate: the bytes the softmax kernels "
        "must move (`kernel_bytes`: five passes over the logits) over the loss kernels' measured time. Command: "
        "`python experiments/gpu/loss_rate.py` (`--render loss_rate.json` recomputes this table).",
        "",
        "| vocab | logits | rows | loss kernels ms | rest ms | predicted ms, per-SM bound | predicted ms, runtime "
        "| kernel rate GB/s | of the bus | GB/s per SM | softmax kernels |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["rows"]:
        bound_ms, _ = predicted_loss_ms(spec, row["vocab_size"], row["rows"], row["dtype"], True)
        runtime_ms, _ = predicted_loss_ms(spec, row["vocab_size"], row["rows"], row["dtype"], False)
        rate_gbps = kernel_bytes(row["vocab_size"], row["rows"], row["dtype"]) / (row["loss_ms"] / 1e3) / 1e9 \
            if row["loss_ms"] > 0 else float("nan")
        softmax_kernels = ", ".join(kernel_short_name(name) for name, _ in row["loss_kernels"]
                                    if "softmax" in name.lower())
        lines.append(f"| {row['vocab_size']:,} | {row['dtype']} | {row['rows']:,} | {row['loss_ms']:.2f} | "
                     f"{row['other_ms']:.2f} | {bound_ms:.2f} | {runtime_ms:.2f} | {rate_gbps:.0f} | "
                     f"{rate_gbps / spec.memory_bandwidth_gbps:.2f} | {rate_gbps / spec.sm_count:.1f} | "
                     f"{softmax_kernels} |")
    return "\n".join(lines) + "\n"


def kernel_short_name(name: str) -> str:
    """``cunn_SoftMaxForwardReg`` from ``void at::native::(anonymous namespace)::cunn_SoftMaxForwardReg<...>(...)``."""
    return name.split("<")[0].split("::")[-1].strip()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python experiments/gpu/loss_rate.py",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab-sizes", default="8192,32000,50257,128256,267735",
                        help="comma-separated vocabulary sizes (row lengths of the softmax)")
    parser.add_argument("--dtypes", default="fp32,bf16", help="comma-separated logit dtypes: fp32, bf16")
    parser.add_argument("--logit-gib", type=float, default=4.0, help="GiB of fp32 logits per size (default 4)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (default), or cpu to try the script without a GPU")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "gpu",
                        help="folder for loss_rate.json and loss_rate.md")
    parser.add_argument("--render", type=Path, metavar="JSON",
                        help="measure nothing: rewrite the loss_rate.md beside this loss_rate.json with the "
                             "current predictor code")
    args = parser.parse_args(argv)
    bad = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if bad:
        parser.error(f"--dtypes: unknown dtype {bad[0]!r}; choose from {', '.join(DTYPES)}")
    if args.logit_gib <= 0:
        parser.error(f"--logit-gib must be > 0, got {args.logit_gib}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        if not args.render.is_file():
            print(f"loss_rate.py: error: --render: no such file {args.render}", file=sys.stderr)
            return 2
        out = args.render.with_suffix(".md")
        out.write_text(markdown(json.loads(args.render.read_text(encoding="utf-8"))), encoding="utf-8")
        print(f"wrote {out}")
        return 0
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): nothing was run; with one this would time the "
              f"cross-entropy over vocabularies of {args.vocab_sizes} in {args.dtypes}.")
        return 0
    from geodiloco.predictor.specs import lookup_gpu

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU (test run)"
    spec = lookup_gpu(gpu if args.device == "cuda" else "A100-SXM4-80GB")
    rows = []
    for vocab_size in map(int, args.vocab_sizes.split(",")):
        for dtype_name in args.dtypes.split(","):
            row_count = rows_for(vocab_size, args.logit_gib)
            measured = measure(vocab_size, row_count, dtype_name, device)
            predicted_ms, _ = predicted_loss_ms(spec, vocab_size, row_count, dtype_name, False)
            rows.append({"vocab_size": vocab_size, "dtype": dtype_name, "rows": row_count, **measured})
            print(f"vocab {vocab_size} {dtype_name} x {row_count} rows: loss kernels {measured['loss_ms']:.2f} ms, "
                  f"rest {measured['other_ms']:.2f} ms, step {measured['step_ms']:.2f} ms; predicted (runtime) "
                  f"{predicted_ms:.2f} ms; kernels {[name[:60] for name, _ in measured['loss_kernels'][:3]]}",
                  flush=True)
            if args.device == "cuda":
                torch.cuda.empty_cache()
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gpu": gpu, "row": spec.name, "torch": torch.__version__,
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "loss_rate.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    (args.out / "loss_rate.md").write_text(markdown(result), encoding="utf-8")
    print(f"wrote {args.out / 'loss_rate.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
