"""Subcommands of the `geodiloco` command that belong to predictor/: ``geodiloco predict``."""
from __future__ import annotations

import argparse
import contextlib
import json
import logging

from geodiloco.common.schema import ConfigError


EPILOG = """\
examples:
  geodiloco predict --gpu A30 --gpu A30 --model llama-150m --batch-size 4 --seq-len 1024 --precision fp16
  geodiloco predict --gpu "4 x RTX 2080 Ti" --model llama-150m --batch-size 4 --seq-len 1024 --json
  geodiloco predict --model small --batch-size 8 --seq-len 128 --precision fp32   (no --gpu: this CPU)
  geodiloco predict --detect
  geodiloco predict --list-gpus
  geodiloco predict --resolve "NVIDIA A100 80GB PCIe" --resolve "H100 SXM5 80GB" --resolve A100
  geodiloco predict --probe --write-row my_gpu.yaml   (measure this machine's GPU; load with --gpu-file)

A GPU the table does not know is planned from a probe (when it is on this machine) or like an
L4 until measured, with a notice; add a row with --gpu-file (or gpu_files: in a config) to plan it well.
"""



def register(subparsers) -> None:
    """Add this package's subcommands to the `geodiloco` parser."""
    parser = subparsers.add_parser(
        "predict", help="predict a node's step time from its GPUs and the model",
        description="Predict one node's training step time from GPU datasheets and the model's cost.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="append", default=[], metavar="NAME",
                        help="one GPU of the node; repeat per GPU, or '4 x A30' (none: this machine's CPU)")
    parser.add_argument("--model", default="tiny", metavar="PRESET_OR_FILE",
                        help="preset (tiny, small, llama-150m) or a JSON/YAML file of dims (Hugging Face keys ok); "
                             "default: %(default)s")
    parser.add_argument("--batch-size", type=int, default=4, help="samples per step for the whole node (default: %(default)s)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sample (default: %(default)s)")
    parser.add_argument("--precision", choices=["bf16", "fp16", "fp32", "tf32"], default="bf16",
                        help="bf16/fp16 = autocast mixed precision; fp32; tf32 = fp32 with TF32 matmuls "
                             "(default: %(default)s)")
    parser.add_argument("--micro-batch-size", type=int, default=None,
                        help="samples per GPU per forward pass (gradient accumulation above it)")
    parser.add_argument("--split", choices=["equal", "by_speed"], default="equal",
                        help="how the node's batch is divided among its GPUs")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="recompute block activations in the backward pass")
    parser.add_argument("--gpu-file", action="append", default=[], metavar="YAML",
                        help="extra GPU datasheet rows (same shape as predictor/data/gpus.yaml)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--detect", action="store_true", help="describe this machine's GPUs or CPU")
    parser.add_argument("--list-gpus", action="store_true", help="print the known GPUs and their rates")
    parser.add_argument("--resolve", action="append", default=[], metavar="NAME",
                        help="print the table row a GPU name resolves to (driver strings, any spelling)")
    parser.add_argument("--probe", action="store_true",
                        help="measure this machine's GPU (matmul TFLOPS per precision, copy GB/s; a few seconds)")
    parser.add_argument("--write-row", metavar="YAML",
                        help="with --probe: write the measurement as a GPU row file for --gpu-file / gpu_files:")
    parser.add_argument("--remeasure", action="store_true",
                        help="measure this CPU again instead of using the cached peaks")
    parser.set_defaults(func=run_predict)


def run_predict(args: argparse.Namespace) -> int:
    from geodiloco.predictor.specs import load_user_gpus

    for path in args.gpu_file:
        load_user_gpus(path)
    if args.remeasure:
        from geodiloco.predictor.detect import cpu_peak
        cpu_peak(refresh=True)
    if args.detect:
        return print_detect(args.json)
    if args.list_gpus:
        return print_gpus(args.json)
    if args.resolve:
        return print_resolved(args.resolve, args.json)
    if args.probe:
        return print_probe(args.write_row, args.json)
    if args.write_row:
        raise ConfigError("--write-row needs --probe (it writes what the probe measured)")
    return print_prediction(args)


def print_resolved(names: list, as_json: bool) -> int:
    from geodiloco.predictor.mig import standard_profiles
    from geodiloco.predictor.specs import resolve_gpu

    answers = []
    for name in names:
        spec, notice = resolve_gpu(name)
        answers.append({"name": name, "row": spec.name, "notice": notice, "source": spec.source,
                        "mig_profiles": standard_profiles(spec) if spec.mig_instances else []})
    if as_json:
        print(json.dumps(answers, indent=2))
    else:
        for answer in answers:
            print(f"{answer['name']!r} -> {answer['row']}" + (f"  ({answer['notice']})" if answer["notice"] else ""))
            if answer["mig_profiles"]:
                print(f"  MIG profiles: {', '.join(answer['mig_profiles'])} (write e.g. \"{answer['row']} MIG "
                      f"{answer['mig_profiles'][0]}\")")
    return 0


def print_probe(write_row: str | None, as_json: bool) -> int:
    import yaml

    from geodiloco.predictor.probe import measure_device, probe_row

    try:
        import torch
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    except ImportError:
        raise ConfigError("--probe needs torch installed") from None
    measured = measure_device(device)
    row = probe_row(measured)
    if write_row:
        with open(write_row, "w", encoding="utf-8") as handle:
            handle.write("# Written by `geodiloco predict --probe`; load with --gpu-file or gpu_files: in a config.\n")
            yaml.safe_dump({"gpus": [row]}, handle, sort_keys=False)
    print(json.dumps(row, indent=2) if as_json else yaml.safe_dump({"gpus": [row]}, sort_keys=False).rstrip())
    if measured.get("host_op_us") and not as_json:
        print(f"# host, measured but not in the row (see predictor/probe.py): {measured['host_op_us']:.1f} us per "
              f"eager op with its backward, {measured['host_optimizer_tensor_us']:.1f} us per optimizer tensor")
    if write_row:
        print(f"wrote {write_row}")
    return 0


def print_prediction(args: argparse.Namespace) -> int:
    from geodiloco.predictor.model import node_step_model
    from geodiloco.predictor.specs import expand_gpu_counts
    from geodiloco.predictor.workload import check_workload_size, parameter_count, resolve_dims, training_flops

    dims = resolve_dims(args.model)
    try:
        check_workload_size(args.batch_size, args.seq_len, dims)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    gpus = expand_gpu_counts(args.gpu)
    with predictor_notices() as notices:
        refuse_slices_the_parts_lack(gpus)
        model = node_step_model(gpus, dims, args.seq_len, args.precision, args.micro_batch_size, args.split,
                                args.activation_checkpointing)
        info = model.explain(args.batch_size)
    info["notices"] = notices
    info["gpus"] = [device.name for device in model.devices]
    info["model"] = args.model
    info["parameters"] = parameter_count(dims)
    info["flops_per_step"] = training_flops(dims, args.batch_size, args.seq_len, args.activation_checkpointing)
    if args.json:
        print(json.dumps(info, indent=2, sort_keys=True))
    else:
        print(human_prediction(info))
    return 0


@contextlib.contextmanager
def predictor_notices():
    """The notices the predictor logs meanwhile (an unknown GPU's stand-in, an ambiguous name's default), as a
    list of lines: ``--json`` carries them for a script, which may not read stderr (they are still printed)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                lines.append(record.getMessage())

    predictor_log = logging.getLogger("geodiloco.predictor")
    handlers: list[logging.Handler] = [Collect()]
    if not predictor_log.hasHandlers():  # logging's last resort printed them, until a handler is added
        printer = logging.StreamHandler()
        printer.setLevel(logging.WARNING)
        handlers.append(printer)
    for handler in handlers:
        predictor_log.addHandler(handler)
    try:
        yield lines
    finally:
        for handler in handlers:
            predictor_log.removeHandler(handler)


def refuse_slices_the_parts_lack(names: list[str]) -> None:
    """A MIG, vGPU or partition name its part does not have is an error here (docs/predictor.md), where a plan or a
    run plans it like an unknown GPU: a typo ("3g.40gb" on a 40 GB A100) must not print a stand-in's numbers."""
    from geodiloco.predictor.gpu_slices import SliceNameError
    from geodiloco.predictor.specs import resolve_gpu
    for name in dict.fromkeys(names):
        try:
            resolve_gpu(name)
        except SliceNameError:
            raise
        except ConfigError:  # an unknown GPU: planned like the stand-in, with its notice
            continue


def human_prediction(info: dict) -> str:
    ms = 1e3
    gpus = ", ".join(f"{info['gpus'].count(name)} x {name}" for name in dict.fromkeys(info["gpus"]))
    lines = [
        f"node: {gpus}",
        f"model: {info['model']} ({info['parameters'] / 1e6:.1f} M parameters), batch {info['batch_size']} x "
        f"seq {info['seq_len']}, {info['precision']}",
        f"step time: {info['step_time_s'] * ms:.2f} ms ({info['tokens_per_s']:,.0f} tokens/s), "
        f"bound by {info['bound']}",
        f"pace set by: {info['pacing_gpu']} at {info['rate_tflops']:.1f} TFLOPS ({info['rate_column']}), "
        f"{info['memory_bandwidth_gbps']:g} GB/s",
        f"  matmul compute {info['compute_s'] * ms:.2f} ms (attention {info['attention_s'] * ms:.2f}), "
        f"memory traffic {info['memory_s'] * ms:.2f} ms (elementwise {info['elementwise_s'] * ms:.2f}, "
        f"optimizer {info['optimizer_s'] * ms:.2f}), host overhead {info['host_overhead_s'] * ms:.2f} ms",
        f"  intra-node all-reduce {info['allreduce_s'] * ms:.2f} ms, exposed {info['allreduce_exposed_s'] * ms:.2f} ms",
        f"samples per GPU: {info['samples_per_gpu']} ({info['split']} split), {info['grad_accum_steps']} micro-batch(es) "
        f"of at most {info['micro_batch_size']}",
        f"memory per GPU: {info['memory_gb']:.2f} GiB; largest batch without accumulation: {info['max_batch_size']}",
    ]
    lines += [f"note: {note}" for note in info["notes"]]
    return "\n".join(lines)


def print_detect(as_json: bool) -> int:
    from geodiloco.predictor.detect import describe_this_machine

    machine = describe_this_machine()
    if as_json:
        print(json.dumps(machine, indent=2, sort_keys=True))
        return 0
    lines = [f"detected by: {machine['source']}"]
    for gpu in machine["gpus"]:
        shared = " (the host's memory, shared with the CPU)" if gpu.get("unified_memory") else ""
        lines.append(f"GPU {gpu['index']}: {gpu['name']}, {gpu['memory_gb']} GiB{shared}, "
                     f"datasheet row: {gpu.get('datasheet') or 'none (add one with --gpu-file)'}")
    cpu = machine["cpu"]
    lines.append(f"CPU: {cpu['model']}, {cpu['logical_cores']} cores, {cpu['memory_gb']} GiB, "
                 f"{cpu['threads']} compute threads")
    if "matmul_tflops" in cpu:
        lines.append(f"  measured: {cpu['matmul_tflops'] * 1e3:.1f} GFLOP/s fp32 matmul, "
                     f"{cpu['memory_bandwidth_gbps']:.1f} GB/s copy, {cpu['host_op_us']:.2f} us per eager op (with backward)")
    lines += [f"fallback: {reason}" for reason in machine["fallback_reasons"]]
    print("\n".join(lines))
    return 0


def print_gpus(as_json: bool) -> int:
    from dataclasses import asdict

    from geodiloco.predictor.specs import known_gpus

    specs = known_gpus()
    if as_json:
        print(json.dumps([{k: v for k, v in asdict(spec).items() if k != "extra"} for spec in specs], indent=2))
        return 0
    from geodiloco.common.console import cli_console
    from rich.table import Table

    table = Table(title="GPU datasheet rows (dense TFLOPS)")
    for column in ("name", "arch", "SMs", "GiB", "GB/s", "FP32", "TF32", "FP16", "FP16/32acc", "BF16"):
        table.add_column(column)
    for spec in specs:
        table.add_row(spec.name, spec.architecture, str(spec.sm_count), f"{spec.memory_gb:g}",
                      f"{spec.memory_bandwidth_gbps:g}", *(f"{v:g}" if v else "-" for v in (
                          spec.fp32_tflops, spec.tf32_tflops, spec.fp16_tflops, spec.fp16_fp32acc_tflops,
                          spec.bf16_tflops)))
    cli_console().print(table)
    return 0
