#!/usr/bin/env python3
"""GPU check kit: real step times and memory beside the predictor, then a short real DiLoCo run.

    python experiments/gpu/validate.py [--presets tiny,small,llama-150m] [--batch-sizes 1,2,4,8,16,32]
                                       [--seq-len N] [--precision bf16] [--steps 10] [--skip-run] ...

Without CUDA it prints one line ("no CUDA device ...") saying what it would have
done, and exits 0. With CUDA:

1. Detects the GPUs (predictor.detect: NVML, else torch.cuda) and the datasheet
   row of GPU 0 (predictor.specs; ``--gpu NAME`` overrides it).
2. Per preset, times full training steps (the runtime's inner step: forward +
   loss under autocast, backward, clipping, AdamW) at each batch size until one
   runs out of memory, beside the predictor's t(B) and peak memory, then narrows
   down the largest batch that fits with single-step probes and compares it with
   the predictor's ``max_batch_size()``.
3. Runs two DiLoCo nodes under torchrun on the GPU(s) (see gpu_diloco.py for the
   layout) and checks the run directory.
4. Writes what it printed (``<gpu-slug>.txt``) and the raw points (``<gpu-slug>.json``)
   to ``--out`` (default experiments/results/gpu/).

Exit code: 0 when everything ran and the run's checks passed, 1 otherwise, 2 for bad options.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from geodiloco.common.schema import ConfigError  # noqa: E402
from geodiloco.predictor.workload import ModelDims, resolve_dims  # noqa: E402

DEFAULT_PRESETS = ("tiny", "small", "llama-150m")
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
DEFAULT_OUT = REPO / "experiments" / "results" / "gpu"
PIPE_WIDTH = 160
MS = 1e3
FP16_NOTE = "fp16 without loss scaling: the steps are timed, not meant to train"


# ---------------------------------------------------------------- options


def positive_int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, unique, each >= 1), for argparse."""
    try:
        values = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def name_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected at least one preset name")
    return names


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


EPILOG = """\
without CUDA: prints one line starting with "no CUDA device" that says what would have run, exits 0.
with CUDA:
  1. step-time sweep on GPU 0, per preset: full training steps (forward + loss under autocast, backward,
     clipping, AdamW: the runtime's inner step) at each batch size until one runs out of memory, median
     step time and peak memory beside the predictor's t(B) and memory, then single-step probes for the
     largest batch that fits, beside the predictor's max_batch_size()
  2. a short real DiLoCo run: two nodes, one torchrun agent each; one GPU: both nodes on it, outer
     all-reduce over gloo; several GPUs: split between the nodes, outer all-reduce (and in-node DDP) over nccl
  3. writes OUT/<gpu-slug>.txt (everything printed) and OUT/<gpu-slug>.json (raw points)
exit code: 0 all ran and the run's checks passed, 1 something failed, 2 bad options.

examples:
  python experiments/gpu/validate.py
  python experiments/gpu/validate.py --presets llama-150m --batch-sizes 1,4,16,64 --precision fp32 --skip-run
  python experiments/gpu/validate.py --skip-sweep --run-preset small --run-rounds 4
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python experiments/gpu/validate.py",
        description="Check the step-time predictor and the runtime on a real GPU.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sweep = parser.add_argument_group("step-time sweep")
    sweep.add_argument("--presets", type=name_list, default=list(DEFAULT_PRESETS), metavar="A,B",
                       help="model presets (or JSON/YAML dims files) to sweep, comma-separated "
                            f"(default: {','.join(DEFAULT_PRESETS)})")
    sweep.add_argument("--batch-sizes", type=positive_int_list, default=list(DEFAULT_BATCH_SIZES), metavar="1,2,..",
                       help="batch sizes (samples per step) to time; the sweep stops at the first that runs out "
                            f"of memory (default: {','.join(map(str, DEFAULT_BATCH_SIZES))})")
    sweep.add_argument("--seq-len", type=positive_int, default=None, metavar="TOKENS",
                       help="tokens per sample for every preset (default: each preset's max_seq_len: "
                            "tiny 256, small 512, llama-150m 1024)")
    sweep.add_argument("--precision", choices=["bf16", "fp16", "fp32", "tf32"], default="bf16",
                       help="autocast dtype of the measured steps, also the predictor's precision argument; "
                            "bf16 on a GPU without bf16 runs (and predicts) fp16 (default: bf16)")
    sweep.add_argument("--warmup-steps", type=int, default=3, metavar="N",
                       help="untimed steps at each batch size before timing: allocator, kernel selection "
                            "(default: 3)")
    sweep.add_argument("--steps", type=positive_int, default=10, metavar="N",
                       help="timed steps per batch size; their median is reported (default: 10)")
    sweep.add_argument("--no-max-batch-search", dest="max_batch_search", action="store_false",
                       help="skip the single-step probes (doubling, then bisection) that find the largest batch "
                            "that fits; the sweep's own bracket is compared instead")
    sweep.add_argument("--gpu", default=None, metavar="NAME",
                       help="datasheet row the predictor uses (a name in predictor/data/gpus.yaml), for when "
                            "GPU 0's reported name is missing from the table or ambiguous (default: GPU 0's name)")
    sweep.add_argument("--skip-sweep", action="store_true", help="skip the step-time sweep")
    run = parser.add_argument_group("DiLoCo run")
    run.add_argument("--skip-run", action="store_true", help="skip the short real DiLoCo run")
    run.add_argument("--run-preset", default="llama-150m", metavar="PRESET",
                     help="model preset of the run (default: llama-150m)")
    run.add_argument("--run-seq-len", type=positive_int, default=None, metavar="TOKENS",
                     help="tokens per sample in the run (default: the preset's max_seq_len)")
    run.add_argument("--run-batch-size", type=positive_int, default=4, metavar="B",
                     help="samples per inner step per node (default: 4)")
    run.add_argument("--run-rounds", type=int, default=3, metavar="N",
                     help="outer rounds, at least 2 so the loss can be seen to fall (default: 3)")
    run.add_argument("--run-local-steps", type=positive_int, default=20, metavar="H",
                     help="inner steps per node per round (default: 20)")
    run.add_argument("--run-precision", choices=["bf16", "fp16", "fp32"], default="bf16",
                     help="model.precision of the run: what its inner steps autocast to and its planner predicts; "
                          "bf16 on a GPU without bf16 trains fp16 with a loss scale (default: bf16)")
    run.add_argument("--run-timeout-s", type=float, default=180.0, metavar="SECONDS",
                     help="the run is stopped and reported as failed after this long (default: 180)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, metavar="DIR",
                        help="folder for <gpu-slug>.txt and <gpu-slug>.json (default: experiments/results/gpu)")
    return parser


def resolve_presets(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, tuple[ModelDims, int]]:
    """preset -> (dims, seq_len), with seq_len checked against each preset's max_seq_len."""
    resolved = {}
    for preset in args.presets:
        try:
            dims = resolve_dims(preset)
        except ConfigError as err:
            parser.error(str(err))
        seq_len = args.seq_len or dims.max_seq_len
        if seq_len > dims.max_seq_len:
            parser.error(f"--seq-len {seq_len} exceeds {preset}'s max_seq_len {dims.max_seq_len}")
        resolved[preset] = (dims, seq_len)
    return resolved


def parse_args(argv: Optional[list[str]] = None) -> tuple[argparse.Namespace, dict, int]:
    """Options, the sweep's presets, and the run's seq_len; bad values exit 2 before anything runs."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.warmup_steps < 0:
        parser.error("--warmup-steps must be >= 0")
    if args.run_rounds < 2:
        parser.error("--run-rounds must be >= 2 (the check compares the first and last round's loss)")
    presets = resolve_presets(parser, args)
    try:
        run_dims = resolve_dims(args.run_preset)
    except ConfigError as err:
        parser.error(f"--run-preset: {err}")
    run_seq_len = args.run_seq_len or run_dims.max_seq_len
    if run_seq_len > run_dims.max_seq_len:
        parser.error(f"--run-seq-len {run_seq_len} exceeds {args.run_preset}'s max_seq_len {run_dims.max_seq_len}")
    return args, presets, run_seq_len


def plan_sentence(args: argparse.Namespace, presets: dict, run_seq_len: int) -> str:
    """What a CUDA machine would run with these options, in one sentence."""
    parts = []
    if not args.skip_sweep:
        shapes = ", ".join(f"{name}@{seq}" for name, (_, seq) in presets.items())
        parts.append(f"time full training steps (forward, backward, clip, AdamW; {args.precision}; "
                     f"{args.warmup_steps} warm-up + median of {args.steps}) of {shapes} at batch "
                     f"{','.join(map(str, args.batch_sizes))} until OOM beside the predictor's t(B) and largest batch")
    if not args.skip_run:
        parts.append(f"run 2 DiLoCo nodes under torchrun on the GPU ({args.run_preset}, seq {run_seq_len}, "
                     f"{args.run_precision}, batch {args.run_batch_size}, {args.run_rounds} rounds x {args.run_local_steps} steps)")
    action = " and ".join(parts) if parts else "do nothing (--skip-sweep and --skip-run)"
    return f"With one, this would {action}, writing {args.out}/<gpu-slug>.txt and .json"


def no_cuda_line(torch_version: str, args: argparse.Namespace, presets: dict, run_seq_len: int) -> str:
    return (f"no CUDA device (torch {torch_version}: torch.cuda.is_available() is False); nothing was run. "
            + plan_sentence(args, presets, run_seq_len) + ".")


# ---------------------------------------------------------------- machine


def datasheet_for(name: str) -> Optional[str]:
    """The predictor's datasheet row for a reported GPU name, or None when the table lacks it."""
    from geodiloco.predictor.specs import lookup_gpu
    try:
        return lookup_gpu(name).name
    except ConfigError:
        return None


def detect_gpus(override: Optional[str]) -> dict:
    """GPUs as the predictor detects them (NVML, else torch.cuda), GPU 0's name as torch numbers it,
    and the datasheet row the predictor uses for it."""
    import torch
    from geodiloco.predictor.detect import describe_this_machine

    machine = describe_this_machine(measure=False)
    device_name = torch.cuda.get_device_name(0)
    datasheet = datasheet_for(override) if override else datasheet_for(device_name)
    if override and datasheet is None:
        raise SystemExit(f"validate.py: error: --gpu {override!r} is not in predictor/data/gpus.yaml")
    return {"detected_by": machine["source"], "gpus": machine["gpus"], "fallback_reasons": machine["fallback_reasons"],
            "device_name": device_name, "gpu_count": torch.cuda.device_count(), "datasheet": datasheet,
            "datasheet_source": "--gpu" if override else "reported name"}


def driver_version() -> Optional[str]:
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:  # noqa: BLE001 - NVML absent or broken: the version is only informative
        return None


def gpu_memory_used_gib() -> Optional[float]:
    """Memory in use on all GPUs together (GiB, every process's), from NVML, else torch.cuda.mem_get_info."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(pynvml.nvmlDeviceGetCount())]
            return sum(pynvml.nvmlDeviceGetMemoryInfo(handle).used for handle in handles) / 2**30
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - fall back to torch below
        pass
    try:
        import torch
        return sum(total - free for free, total in (torch.cuda.mem_get_info(index)
                                                    for index in range(torch.cuda.device_count()))) / 2**30
    except RuntimeError:
        return None


def measured_with(args: argparse.Namespace, gpu: dict, precision: str, precision_note: str,
                  argv: list[str]) -> dict:
    import torch
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": "python experiments/gpu/validate.py " + " ".join(argv),
        "host": platform.node(),
        "gpu_0": gpu["device_name"], "gpu_count": gpu["gpu_count"], "datasheet_row": gpu["datasheet"],
        "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "driver": driver_version(),
        "precision_requested": args.precision, "precision": precision,
        "precision_note": "; ".join(filter(None, [precision_note, FP16_NOTE if precision == "fp16" else ""])),
        "warmup_steps": args.warmup_steps, "timed_steps": args.steps,
        "step": "forward + loss (autocast for bf16/fp16), backward, clip_grad_norm 1.0, AdamW (runtime's groups), "
                "zero_grad; random tokens made on the GPU",
        "timing": "torch.cuda.synchronize before and after each timed step, time.perf_counter; median reported",
        "memory": "torch.cuda.max_memory_allocated over warm-up and timed steps (tensors only, no CUDA context)",
    }


# ---------------------------------------------------------------- printing


def make_console():
    from rich.console import Console
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(record=True, width=PIPE_WIDTH if piped else None, highlight=False)


def fmt(value: Optional[float], pattern: str, missing: str = "-") -> str:
    return missing if value is None else format(value, pattern)


def print_header(console, info: dict, gpu: dict) -> None:
    console.rule("GeoDiLoCo GPU check")
    console.print(f"date {info['date']}  host {info['host']}  command: {info['command']}")
    console.print(f"GPU 0: {info['gpu_0']} (of {info['gpu_count']}; detected by {gpu['detected_by']}); "
                  f"predictor datasheet row: {info['datasheet_row'] or 'none'} ({gpu['datasheet_source']})")
    for item in gpu["gpus"]:
        console.print(f"  GPU {item['index']}: {item['name']}, {item['memory_gb']} GiB")
    console.print(f"torch {info['torch']}, CUDA {info['cuda']}, cuDNN {info['cudnn']}, driver {info['driver'] or '?'}")
    console.print(f"precision {info['precision']}" + (f" ({info['precision_note']})" if info["precision_note"] else "")
                  + f"; {info['warmup_steps']} warm-up steps excluded, median of {info['timed_steps']} timed steps")
    console.print(f"step: {info['step']}")
    console.print(f"timing: {info['timing']}; memory: {info['memory']}")


def print_sweep(console, sweep) -> None:
    from rich.table import Table
    from gpu_sweep import median_s, point_error

    table = Table(title=f"{sweep.preset}, seq {sweep.seq_len}, {sweep.precision}: measured vs predicted t(B)")
    for column in ("batch", "measured ms (median)", "min-max ms", "predicted ms", "error", "peak GiB",
                   "predicted GiB"):
        table.add_column(column, justify="right")
    for point in sweep.points:
        predicted_s = sweep.predicted_step_s.get(point.batch_size)
        predicted_gib = sweep.predicted_memory_gib.get(point.batch_size)
        if point.ran:
            error = point_error(sweep, point)
            table.add_row(str(point.batch_size), f"{median_s(point.step_times_s) * MS:.2f}",
                          f"{min(point.step_times_s) * MS:.2f}-{max(point.step_times_s) * MS:.2f}",
                          fmt(predicted_s and predicted_s * MS, ".2f"), fmt(error, "+.1%"),
                          fmt(point.peak_memory_gib, ".2f"), fmt(predicted_gib, ".2f"))
        else:
            table.add_row(str(point.batch_size), "OOM" if point.oom else f"error: {point.error}", "",
                          fmt(predicted_s and predicted_s * MS, ".2f"), "", "", fmt(predicted_gib, ".2f"))
    console.print(table)
    measured = (f"{sweep.largest_fit} fit, {sweep.first_oom} ran out of memory" if sweep.first_oom
                else f"{sweep.largest_fit} fit, no OOM seen")
    console.print(f"largest batch: measured {measured} ({sweep.search_probes} probe steps); "
                  f"predicted {fmt(sweep.predicted_max_batch, 'd')} -> {sweep.verdict}")
    if sweep.note:
        console.print(f"note: {sweep.note}")


def median_abs_error(sweep) -> Optional[float]:
    from gpu_sweep import point_error
    errors = [abs(error) for error in (point_error(sweep, point) for point in sweep.points) if error is not None]
    return statistics.median(errors) if errors else None


def print_sweep_summary(console, sweeps: list) -> None:
    from rich.table import Table
    table = Table(title="summary")
    for column in ("preset", "seq", "points", "median |error|", "predicted max batch", "measured max batch",
                   "verdict"):
        table.add_column(column)
    for sweep in sweeps:
        ran = sum(point.ran for point in sweep.points)
        bracket = f"{sweep.largest_fit} (OOM at {sweep.first_oom})" if sweep.first_oom else f">= {sweep.largest_fit}"
        table.add_row(sweep.preset, str(sweep.seq_len), str(ran), fmt(median_abs_error(sweep), ".1%"),
                      fmt(sweep.predicted_max_batch, "d"), bracket, sweep.verdict)
    console.print(table)


def print_run(console, outcome) -> None:
    from rich.table import Table
    console.print(f"layout: {outcome.layout_text}")
    config = outcome.config
    nodes = "; ".join(f"{node['name']}: {', '.join(node['gpus']) or 'no GPU name'}" for node in config["nodes"])
    console.print(f"model {config['model']['preset']}, seq {config['model']['seq_len']}, model.precision "
                  f"{config['model']['precision']}, batch {config['diloco']['batch_size']}, {config['diloco']['rounds']} rounds x "
                  f"{config['diloco']['local_steps']} steps; nodes {nodes}; wall {outcome.wall_s:.1f} s")
    console.print(f"cold = predictor from the datasheet ({config['model']['precision']}); planner = the run's plan (round 1 cold, later rounds "
                  "calibrated on the measured steps)")
    table = Table(title="DiLoCo run, per round and node")
    for column in ("round", "node", "steps x batch", "mean step ms", "cold ms", "measured/cold", "planner ms",
                   "loss", "wait s", "sync s", "GPU util %"):
        table.add_column(column, justify="right")
    for row in outcome.summary.get("rows", []):
        cold_s, mean_s = row.get("cold_step_s"), row["mean_step_s"]
        table.add_row(str(row["round"] + 1), row["node"], f"{row['local_steps']} x {row['batch_size']}",
                      fmt(mean_s and mean_s * MS, ".1f"), fmt(cold_s and cold_s * MS, ".1f"),
                      fmt(mean_s / cold_s if mean_s and cold_s else None, ".2f"),
                      fmt(row["predicted_step_s"] and row["predicted_step_s"] * MS, ".1f"),
                      fmt(row["loss"], ".3f"), fmt(row["wait_s"], ".2f"), fmt(row["comm_s"], ".2f"),
                      fmt(row["gpu_util"], ".0f"))
    console.print(table)
    evals = outcome.summary.get("eval_loss", {})
    if evals:
        console.print("global eval loss after round: " + ", ".join(
            f"{int(key) + 1}: {fmt(value, '.3f')}" for key, value in evals.items()))
    for item in outcome.checks:
        console.print(f"{'PASS' if item['passed'] else 'FAIL'}  {item['check']}: {item['detail']}")
    if not outcome.passed:
        for agent in outcome.agents:
            console.print(f"--- {agent.node} agent (exit {agent.exit_code}), last lines of its log:")
            console.print(agent.log_tail, markup=False)


# ---------------------------------------------------------------- stages


def sweep_all(console, args: argparse.Namespace, presets: dict, gpu: dict, precision: str,
              device) -> tuple[list, list[str]]:
    """Every preset's sweep on ``device``; a preset that fails outright (even its model does not fit)
    is reported and skipped."""
    import torch
    from gpu_sweep import predict_for, run_preset_sweep, set_matmul_precision

    set_matmul_precision(precision)
    sweeps, failures = [], []
    for preset, (dims, seq_len) in presets.items():
        console.print(f"sweeping {preset} at seq {seq_len} ...")
        prediction = predict_for(gpu["datasheet"], dims, seq_len, precision)
        try:
            sweep = run_preset_sweep(preset, dims, seq_len, precision, args.batch_sizes, prediction, device,
                                     args.warmup_steps, args.steps, args.max_batch_search)
        except (torch.cuda.OutOfMemoryError, RuntimeError) as err:
            failures.append(f"{preset}: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
            console.print(f"[red]{preset} failed[/red]: {failures[-1]}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
            continue
        sweeps.append(sweep)
        print_sweep(console, sweep)
    if sweeps:
        print_sweep_summary(console, sweeps)
    return sweeps, failures


def diloco_run(console, args: argparse.Namespace, run_seq_len: int, gpu: dict):
    import torch
    from gpu_diloco import RunSettings, launch

    torch.cuda.empty_cache()
    settings = RunSettings(args.run_preset, run_seq_len, args.run_batch_size, args.run_rounds,
                           args.run_local_steps, args.run_timeout_s, args.run_precision)
    console.print(f"running 2 DiLoCo nodes under torchrun (stopped after {args.run_timeout_s:.0f} s) ...")
    with tempfile.TemporaryDirectory(prefix="geodiloco-gpu-run-") as scratch:
        outcome = launch(settings, Path(scratch) / "run", gpu["gpu_count"], gpu["datasheet"], "cuda",
                         gpu_memory_used_gib)
    print_run(console, outcome)
    return outcome


def output_paths(out_dir: Path, gpu_name: str) -> tuple[Path, Path]:
    """<gpu-slug>.txt (what was printed) and <gpu-slug>.json (raw points) in ``out_dir``."""
    from gpu_sweep import slug
    return out_dir / f"{slug(gpu_name)}.txt", out_dir / f"{slug(gpu_name)}.json"


def write_outputs(text_path: Path, json_path: Path, text: str, data: dict) -> None:
    text_path.parent.mkdir(parents=True, exist_ok=True)
    text_path.write_text(text, encoding="utf-8")
    json_path.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, presets, run_seq_len = parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print(no_cuda_line(torch.__version__, args, presets, run_seq_len))
        return 0
    from gpu_sweep import effective_precision

    from geodiloco.runtime.precision import cuda_has_bf16

    gpu = detect_gpus(args.gpu)
    precision, precision_note = effective_precision(args.precision, cuda_has_bf16())
    info = measured_with(args, gpu, precision, precision_note, argv)
    console = make_console()
    print_header(console, info, gpu)
    data: dict = {"measured_with": info, "detection": gpu, "sweeps": [], "sweep_failures": [], "diloco": None}
    ok = True
    if not args.skip_sweep:
        console.rule("step time and memory: measured vs predictor")
        sweeps, failures = sweep_all(console, args, presets, gpu, precision, torch.device("cuda", 0))
        data["sweeps"] = [sweep.to_dict() for sweep in sweeps]
        data["sweep_failures"] = failures
        ok = ok and not failures
    if not args.skip_run:
        console.rule("short real DiLoCo run")
        outcome = diloco_run(console, args, run_seq_len, gpu)
        data["diloco"] = outcome.to_dict()
        ok = ok and outcome.passed
    text_path, json_path = output_paths(args.out, gpu["device_name"])
    console.print(f"{'all ran' if ok else 'FAILED (see above)'}; writing {text_path} and {json_path}")
    write_outputs(text_path, json_path, console.export_text(), data)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
