"""How the probe's timing and matmul size change what it measures, on the GPU it runs on.

The probe (predictor/probe.py) planned Hopper's GPU-bound steps 13 % too slow: its 4096^3
matmuls reached only 0.69-0.73 of the tensor peak there, while the training GEMMs reach more.
Two causes can be told apart here:
- timing: a lone 0.2 ms matmul timed from the host counts the synchronize, and on a GPU that was
  idle its clocks have not ramped up (``single``: best of 5 single calls after one warm-up, the
  probe before version 3);
- size: a 4096^3 matmul may not fill a GPU with 132 SMs (``sustained``: back-to-back matmuls for
  0.25 s, then the fastest of 5 batches of at least 25 ms, the probe from version 3 on).
Each (size, timing) is measured after the GPU has idled for ``--idle-s`` seconds, at fp32, tf32,
fp16 and bf16, with the device copy beside them.

  python experiments/gpu/probe_timing.py --out DIR [--data-check]   # measures: DIR/probe_timing.json
  python experiments/gpu/probe_timing.py --render DIR                # DIR/probe_timing.md from the JSON

``--data-check`` also times an 8192^3 product and llama-150m's MLP GEMM on operands of three scales
(standard normals, x 0.02, zeros), single calls as the probe times them. ``--render`` writes the
tables of DIR/probe_timing.json and, if present, DIR/probe_operands.json and DIR/probe_interleave.json
(later measuring calls' probe_timing.json, with --data-check and --interleave-check) without a GPU. Without CUDA, measuring says so and exits 0.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable, Optional

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SIZES = (4096, 8192, 16384)
TIMINGS = ("single", "sustained")
COLUMNS = ("fp32_tflops", "tf32_tflops", "fp16_tflops", "bf16_tflops")


WARMUP_S = 0.25
"""Sustained timing: matmuls and copies run this long before they are timed (clocks ramp up)."""
MIN_TIMED_S = 0.025
"""Sustained timing: each timed batch of back-to-back calls runs at least this long."""


def sustained_s(action: Callable[[], object], synchronize: Callable[[], None], repeats: int) -> float:
    """Seconds per ``action`` at steady state: calls for ``WARMUP_S`` first, then ``repeats`` batches of
    back-to-back calls, each at least ``MIN_TIMED_S`` long; the fastest batch's mean."""
    started, calls = time.perf_counter(), 0
    while True:
        action()
        synchronize()
        calls += 1
        elapsed_s = time.perf_counter() - started
        if elapsed_s >= WARMUP_S:
            break
    batch_calls = max(1, math.ceil(MIN_TIMED_S / (elapsed_s / calls)))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(batch_calls):
            action()
        synchronize()
        best = min(best, (time.perf_counter() - start) / batch_calls)
    return best


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", type=Path, help="measure, and write the folder's probe_timing.json")
    target.add_argument("--render", type=Path, metavar="DIR",
                        help="write DIR/probe_timing.md from DIR's stored JSON files (no GPU needed)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="matmul sizes N (N^3 products), comma-separated (default: %(default)s)")
    parser.add_argument("--idle-s", type=float, default=3.0,
                        help="seconds the GPU idles before each (size, timing) (default: %(default)s)")
    parser.add_argument("--data-check", action="store_true",
                        help="also time 8192^3 and llama-150m's MLP GEMM on operands of three scales")
    parser.add_argument("--interleave-check", action="store_true",
                        help="also time bf16 GEMMs by CUDA events, back to back and with a 1 GiB copy between")
    return parser


def measure(torch, size: int, timing: str) -> dict:
    """One probe measurement (every precision and the copy) at ``size`` with ``timing``."""
    from geodiloco.predictor import probe
    timer = probe._best_s if timing == "single" else sustained_s
    started = time.perf_counter()
    rates = {column: probe._matmul_tflops(torch, "cuda:0", dtype, size, 5, tf32, timer)
             for column, dtype, tf32 in (("fp32_tflops", torch.float32, False), ("tf32_tflops", torch.float32, True),
                                         ("fp16_tflops", torch.float16, False),
                                         ("bf16_tflops", torch.bfloat16, False))}
    rates["memory_bandwidth_gbps"] = probe._copy_gbps(torch, "cuda:0", probe.COPY_BYTES, 5, timer)
    rates["seconds"] = round(time.perf_counter() - started, 2)
    return rates


OPERANDS = {"randn": 1.0, "randn x 0.02": 0.02, "zeros": 0.0}
"""Operand scales of the data check: the probe's standard normals, values at an initialized weight's
scale, and zeros (a GPU whose clocks follow its power draw runs these faster)."""
OPERAND_HOW = ("operand scales: best of 5 single calls, as the probe times; 'back to back' / 'copy between': "
               "median of 50 GEMMs timed by CUDA events around each GEMM alone")
TRAINING_GEMM = (32768, 1024, 4096)
"""(M, K, N) of llama-150m's MLP up-projection at batch 32 x 1024 tokens."""
CHECKED_GEMMS = (("8192^3", (8192, 8192, 8192)), ("llama-150m MLP", TRAINING_GEMM))
"""The GEMMs the data and interleave checks time: a larger square than the probe's, and a training one."""


def operand_rate(torch, dtype, shape: tuple[int, int, int], scale: float) -> float:
    """TFLOPS of an (M x K) @ (K x N) product in ``dtype`` on operands of standard deviation ``scale``,
    timed as the probe times (best of 5 single calls)."""
    from geodiloco.predictor import probe
    rows, inner, cols = shape
    left = (torch.randn(rows, inner, device="cuda:0") * scale).to(dtype)
    right = (torch.randn(inner, cols, device="cuda:0") * scale).to(dtype)
    seconds = probe._best_s(lambda: torch.mm(left, right), lambda: torch.cuda.synchronize(), 5)
    return 2.0 * rows * inner * cols / seconds / 1e12


def data_check(torch, idle_s: float) -> list[dict]:
    """Square 8192^3 and llama-150m's MLP GEMM at bf16 and fp16 on each operand scale."""
    rows = []
    for label, shape in CHECKED_GEMMS:
        for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            for operands, scale in OPERANDS.items():
                time.sleep(idle_s)
                rows.append({"gemm": label, "shape": list(shape), "dtype": dtype_name, "operands": operands,
                             "tflops": operand_rate(torch, dtype, shape, scale)})
                print(f"{rows[-1]}", flush=True)
    return rows


def gemm_event_ms(torch, left, right, between: Optional[Callable[[], object]], calls: int = 60) -> float:
    """Median device time of one GEMM (CUDA events around it alone), with ``between`` run after each GEMM
    (a memory-bound copy, as a training step interleaves GEMMs with elementwise kernels) or nothing."""
    timings = []
    for _ in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.mm(left, right)
        end.record()
        if between is not None:
            between()
        timings.append((start, end))
    torch.cuda.synchronize()
    return sorted(start.elapsed_time(end) for start, end in timings[10:])[(calls - 10) // 2]


def interleave_check(torch, idle_s: float) -> list[dict]:
    """bf16 GEMMs (8192^3, llama-150m's MLP) timed by CUDA events back to back, then each followed by a
    1 GiB device copy: does a GEMM run faster when memory-bound work sits between GEMMs?"""
    source = torch.ones(2**28, device="cuda:0")
    target = torch.empty_like(source)
    rows = []
    for label, (rows_, inner, cols) in CHECKED_GEMMS:
        left = torch.randn(rows_, inner, device="cuda:0", dtype=torch.bfloat16)
        right = torch.randn(inner, cols, device="cuda:0", dtype=torch.bfloat16)
        for mode, between in (("back to back", None), ("copy between", lambda: target.copy_(source))):
            time.sleep(idle_s)
            ms = gemm_event_ms(torch, left, right, between)
            rows.append({"gemm": label, "dtype": "bf16", "operands": f"randn, {mode}",
                         "tflops": 2.0 * rows_ * inner * cols / (ms / 1e3) / 1e12})
            print(f"{rows[-1]}", flush=True)
    return rows


def data_table(rows: list[dict], sheet: Optional[dict]) -> str:
    lines = ["| GEMM | dtype | operands | TFLOPS | share of datasheet |", "|---|---|---|---|---|"]
    for row in rows:
        peak = sheet.get(f"{row['dtype']}_tflops") if sheet else None
        share = f"{row['tflops'] / peak:.2f}" if peak else "-"
        lines.append(f"| {row['gemm']} | {row['dtype']} | {row['operands']} | {row['tflops']:,.0f} | {share} |")
    return "\n".join(lines)


def datasheet_row(name: str) -> Optional[dict]:
    from geodiloco.predictor.specs import resolve_gpu
    try:
        spec, _ = resolve_gpu(name)
    except ValueError:
        return None
    return {"name": spec.name, "fp32_tflops": spec.fp32_tflops, "tf32_tflops": spec.tf32_tflops,
            "fp16_tflops": spec.fp16_tflops, "bf16_tflops": spec.bf16_tflops,
            "memory_bandwidth_gbps": spec.memory_bandwidth_gbps}


def table(results: dict, sheet: Optional[dict]) -> str:
    lines = ["| size | timing | fp32 | tf32 | fp16 | bf16 | copy GB/s | s |", "|---|---|---|---|---|---|---|---|"]
    for row in results["measurements"]:
        cells = []
        for column in (*COLUMNS, "memory_bandwidth_gbps"):
            value = row[column]
            share = f" ({value / sheet[column]:.2f})" if sheet and value and sheet.get(column) else ""
            cells.append("-" if value is None else f"{value:,.0f}{share}")
        lines.append(f"| {row['size']} | {row['timing']} | " + " | ".join(cells) + f" | {row['seconds']} |")
    return "\n".join(lines)


def render(folder: Path) -> str:
    """Markdown of a folder's stored measurements: the size x timing table, then the operand check."""
    parts = []
    for file_name in ("probe_timing.json", "probe_operands.json", "probe_interleave.json"):
        path = folder / file_name
        if not path.is_file():
            continue
        results = json.loads(path.read_text(encoding="utf-8"))
        sheet = results.get("datasheet")
        parts.append(f"## {file_name}: {results['gpu']}, torch {results['torch']}, CUDA {results['cuda']}, "
                     f"{results['measured_at']}\n\n{results['how']}; the GPU idled "
                     f"{results['idle_s_before_each']:g} s before each row. In brackets: the share of the "
                     f"datasheet row {sheet['name'] if sheet else '-'}.\n\n{table(results, sheet)}")
        if results.get("operands"):
            parts.append(f"GEMMs beside the probe ({OPERAND_HOW}):\n\n{data_table(results['operands'], sheet)}")
    if not parts:
        raise SystemExit(f"probe_timing.py: error: {folder} holds no probe_timing.json; measure with --out first")
    head = ("# The probe's matmul by size, timing and operands\n\nTruth: rates measured on this machine's GPU by "
            "`python experiments/gpu/probe_timing.py --out DIR [--data-check]`; this file: `--render DIR`.")
    return "\n\n".join([head, *parts]) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.render:
        (args.render / "probe_timing.md").write_text(render(args.render), encoding="utf-8")
        print(f"wrote {args.render / 'probe_timing.md'}")
        return 0
    import torch
    if not torch.cuda.is_available():
        print("probe_timing.py: no CUDA GPU here; nothing measured")
        return 0
    sizes = [int(size) for size in args.sizes.split(",") if size]
    name = torch.cuda.get_device_name(0)
    results = {"gpu": name, "torch": torch.__version__, "cuda": torch.version.cuda,
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "idle_s_before_each": args.idle_s,
               "how": "single: best of 5 single timed calls after one warm-up call; sustained: 0.25 s of "
                      "back-to-back calls, then the fastest of 5 batches of at least 25 ms",
               "measurements": []}
    for size in sizes:
        for timing in TIMINGS:
            time.sleep(args.idle_s)
            results["measurements"].append({"size": size, "timing": timing, **measure(torch, size, timing)})
            print(f"size {size} {timing}: {results['measurements'][-1]}", flush=True)
    if args.data_check:
        results["operands"] = data_check(torch, min(args.idle_s, 1.0))
    if args.interleave_check:
        results["operands"] = results.get("operands", []) + interleave_check(torch, min(args.idle_s, 1.0))
    sheet = datasheet_row(name)
    results["datasheet"] = sheet
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "probe_timing.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    print(f"\n{name} (share of the datasheet row {sheet['name'] if sheet else '-'} in brackets)\n")
    print(table(results, sheet))
    if results.get("operands"):
        print(f"\nGEMMs beside the probe ({OPERAND_HOW})\n\n{data_table(results['operands'], sheet)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
