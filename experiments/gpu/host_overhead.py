#!/usr/bin/env python3
"""Where a small-batch training step's time goes on this GPU machine: host (Python, dispatch,
kernel launches) or GPU, beside the predictor's host model.

    python experiments/gpu/host_overhead.py [--presets tiny,small,llama-150m] [--batch-sizes 1,8]
                                            [--precisions fp32,bf16] [--out DIR]

Per preset x precision x batch: the median wall time of a full training step (the runtime's
inner step, as validate.py times it), the GPU's busy time in that step (sum of the CUDA kernel
durations torch.profiler records, one profiled step), the kernels launched and the aten ops
dispatched per step. A step whose wall time is well above its GPU busy time is bound by the host.
Beside them the predictor's step time three ways: with its constant host cost per op
(data/gpu_efficiency.yaml), with the host costs the probe measures on this machine
(predictor/probe.py), and with no host cost at all (its GPU time alone).

Without CUDA it prints one line and exits 0. Writes DIR/host_overhead.json (default
experiments/results/gpu/).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

WARMUP_STEPS = 3
TIMED_STEPS = 10


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python experiments/gpu/host_overhead.py",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", default="tiny,small,llama-150m", help="comma-separated model presets")
    parser.add_argument("--batch-sizes", default="1,8", help="comma-separated batch sizes")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16, fp16")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "gpu")
    return parser.parse_args(argv)


def profile_step(runner, batch_size: int) -> dict:
    """GPU busy ms, kernels and aten ops of one training step, from torch.profiler."""
    from gpu_sweep import profiled_step

    kernels, aten_ops = profiled_step(runner, batch_size)
    return {"gpu_busy_ms": sum(device_us for _, device_us in kernels) / 1e3, "kernels": len(kernels),
            "aten_ops": aten_ops}


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): nothing was run; with one this would time and profile "
              f"{args.presets} at batch {args.batch_sizes} in {args.precisions}.")
        return 0
    from gpu_sweep import preset_runners, spec_step_ms
    from geodiloco.predictor.probe import measure_device
    from geodiloco.predictor.specs import lookup_gpu

    device = torch.device("cuda", 0)
    measured = measure_device("cuda:0")
    datasheet = lookup_gpu(torch.cuda.get_device_name(0))
    with_probed_host = dataclasses.replace(datasheet, host_op_us=measured["host_op_us"],
                                           host_optimizer_tensor_us=measured["host_optimizer_tensor_us"])
    without_host = dataclasses.replace(datasheet, host_op_us=1e-9, host_optimizer_tensor_us=1e-9)
    print(f"{torch.cuda.get_device_name(0)} (row {datasheet.name}); torch {torch.__version__}; probe: "
          f"{measured['host_op_us']:.1f} us per eager op with backward, "
          f"{measured['host_optimizer_tensor_us']:.1f} us per optimizer tensor", flush=True)
    rows = []
    header = (f"{'preset':<11}{'prec':<6}{'batch':>6}{'step ms':>9}{'GPU busy':>9}{'kernels':>8}{'aten ops':>9}"
              f"{'pred ms':>9}{'probed':>9}{'GPU only':>9}")
    print(header + "\n(pred: constant host cost; probed: host costs measured here; GPU only: no host cost)",
          flush=True)
    for preset, dims, precision, runner in preset_runners(args.presets.split(","), args.precisions.split(","), device):
        for batch_size in map(int, args.batch_sizes.split(",")):
            times_s, _ = runner.timed_steps_s(batch_size, WARMUP_STEPS, TIMED_STEPS)
            row = {"preset": preset, "precision": precision, "batch_size": batch_size,
                   "seq_len": dims.max_seq_len, "step_ms": statistics.median(times_s) * 1e3,
                   **profile_step(runner, batch_size)}
            shape = (dims, dims.max_seq_len, precision, batch_size)
            row.update({"predicted_ms": spec_step_ms(datasheet, *shape),
                        "predicted_ms_probed_host": spec_step_ms(with_probed_host, *shape),
                        "predicted_gpu_only_ms": spec_step_ms(without_host, *shape)})
            rows.append(row)
            print(f"{preset:<11}{precision:<6}{batch_size:>6}{row['step_ms']:>9.2f}{row['gpu_busy_ms']:>9.2f}"
                  f"{row['kernels']:>8}{row['aten_ops']:>9}{row['predicted_ms']:>9.2f}"
                  f"{row['predicted_ms_probed_host']:>9.2f}{row['predicted_gpu_only_ms']:>9.2f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_overhead.json").write_text(json.dumps(
        {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
         "probe": measured, "rows": rows}, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
