"""A short measured probe of this machine's GPU, for a GPU the datasheet table does not know.

It times large matmuls at fp32, tf32, fp16 and bf16 and a device-to-device
copy (a few seconds in all) and returns a ``GpuSpec`` so the step-time model
plans the node like any known GPU. The model's efficiencies are shares of
*datasheet* peaks, while a probe measures what a 4096^3 matmul and a copy
reach, so the row holds datasheet-equivalent peaks (``probe_shares``): a
matmul rate divided by the share of its peak the model gives large GEMMs
(``Efficiency.matmul``, 0.90), so that the model's large GEMMs run at the
measured rate; the copy divided by the share of the memory bandwidth the probe's
copy reached where the datasheet is known (``PROBE_COPY_SHARE``). Taken as peaks
unconverted, the probes of an H100 and an H200 put their GPU-bound steps 30 %
and 26 % too slow at the median; converted, 13 % (the datasheet rows: 5.8 %
and 4.8 %; experiments/results/gpu/probe_accuracy.md). What remains is Hopper's:
a 4096^3 matmul reaches only 0.69-0.74 of its tensor peak there. That is not the
probe's size or timing: on a second H200, 8192^3 and 16384^3 products, steady-state
batches instead of single calls, and llama-150m's own MLP GEMM all read 0.62-0.79
(experiments/results/gpu/h200-b/probe_timing.md), and the GEMMs inside a profiled
training step 0.76-0.78 (kernel_classes.md of h200-a and h100-d). The model's 0.90 is
the share its fit to whole published steps gives large GEMMs, not a measured share.
Dividing by Hopper's 0.70 instead would plan a GPU whose matmuls reach more of
their peak too fast by that ratio (no such GPU has been measured here), so the rule
keeps the model's own share; the online calibration corrects the rest from the
node's first measured steps.

It also times the host's cost per eager op and per optimizer tensor on the
device (``host_op_us``, ``host_optimizer_tensor_us`` in ``measure_device``'s
result, printed by ``geodiloco predict --probe``), but the row does not use
them. On the H100 hosts of experiments/results/gpu/ the table's constant
(20 µs per op) predicted the host-bound steps of a host no fit saw within 25 %,
while that host's probe read 29-37 µs and put the same steps 60-120 % too slow:
small-batch steps mix dispatch and launch costs in proportions a tiny chain of
ops does not share. The online calibration learns each host from its own steps.
Results are cached as JSON next to the CPU measurements (see detect.py), keyed
by device name and torch version. ``probe_row`` turns the result into a YAML
row for a GPU file, so the measurement can be kept and shared.
"""
from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from geodiloco.predictor.detect import cached_measurement
from geodiloco.predictor.specs import GpuSpec

log = logging.getLogger("geodiloco.predictor")

CACHE_FILE_NAME = "gpu_probe.json"
MATMUL_SIZE = 4096
COPY_BYTES = 512 * 2**20
CPU_MATMUL_SIZE = 1024
CPU_COPY_BYTES = 64 * 2**20
"""A CPU probe (no GPU here) stays at sizes a CPU times in about a second; half precision is skipped."""
PROBE_VERSION = 2
PROBE_COPY_SHARE = 0.84
"""The probe's device copy as a share of the datasheet memory bandwidth, where the datasheet is known:
0.82-0.86 on two H100 SXM and an H200 (``python experiments/gpu/probe_accuracy.py``)."""


def probe_shares() -> dict:
    """Share of the datasheet peak each probed rate stands for: matmuls (fp32, and the tf32/fp16/bf16
    "tensor" rates) at the model's share for large GEMMs, the copy at ``PROBE_COPY_SHARE``."""
    from geodiloco.predictor.kernels import GPU_EFFICIENCY
    return {"fp32": GPU_EFFICIENCY.matmul, "tensor": GPU_EFFICIENCY.matmul, "memory": PROBE_COPY_SHARE}


def _best_s(action: Callable[[], object], synchronize: Callable[[], None], repeats: int) -> float:
    """Fastest of ``repeats`` timed runs after one warm-up, in seconds."""
    action()
    synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        synchronize()
        best = min(best, time.perf_counter() - start)
    return best


Timer = Callable[[Callable[[], object], Callable[[], None], int], float]
"""How an action is timed: (action, synchronize, repeats) -> seconds per action."""


def _matmul_tflops(torch, device, dtype, size: int, repeats: int, tf32: bool = False,
                   timer: Timer = _best_s) -> Optional[float]:
    """Measured TFLOPS of a size^3 matmul in ``dtype``; None if the device refuses that dtype."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        left = torch.randn(size, size, device=device, dtype=dtype)
        right = torch.randn(size, size, device=device, dtype=dtype)
        seconds = timer(lambda: torch.mm(left, right), lambda: _sync(torch, device), repeats)
    except (RuntimeError, TypeError) as err:
        log.info("probe: %s matmul unavailable on %s: %s", dtype, device, err)
        return None
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return 2.0 * size**3 / seconds / 1e12


def _sync(torch, device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize(device)


def _copy_gbps(torch, device, copy_bytes: int, repeats: int, timer: Timer = _best_s) -> float:
    """Read + write bandwidth of a device-to-device copy, GB/s."""
    elements = copy_bytes // 4
    source = torch.ones(elements, device=device)
    target = torch.empty(elements, device=device)
    seconds = timer(lambda: target.copy_(source), lambda: _sync(torch, device), repeats)
    return 2.0 * elements * 4 / seconds / 1e9


def measure_device(device: str = "cuda:0", size: int = MATMUL_SIZE, copy_bytes: int = COPY_BYTES,
                   repeats: int = 5) -> dict:
    """Measured peaks of one torch device (TFLOPS per precision, copy GB/s, memory GiB)."""
    import torch

    on_gpu = device.startswith("cuda")
    if not on_gpu:
        size, copy_bytes = min(size, CPU_MATMUL_SIZE), min(copy_bytes, CPU_COPY_BYTES)
    if on_gpu:
        from geodiloco.predictor.detect import compute_units
        props = torch.cuda.get_device_properties(device)
        name, memory_gb = props.name, props.total_memory / 2**30
        units = compute_units(props, bool(getattr(torch.version, "hip", None)))
    else:
        from geodiloco.predictor.detect import cpu_model_name, memory_total_gb
        name, memory_gb, units = cpu_model_name(), memory_total_gb(), torch.get_num_threads()
    rates = {
        "fp32_tflops": _matmul_tflops(torch, device, torch.float32, size, repeats),
        "tf32_tflops": _matmul_tflops(torch, device, torch.float32, size, repeats, tf32=True) if on_gpu else None,
        "fp16_tflops": _matmul_tflops(torch, device, torch.float16, size, repeats) if on_gpu else None,
        "bf16_tflops": _matmul_tflops(torch, device, torch.bfloat16, size, repeats) if on_gpu else None,
    }
    host = {}
    if on_gpu:
        from geodiloco.predictor.detect import _chain_op_s, _optimizer_tensor_s
        timer = lambda action: _best_s(action, lambda: _sync(torch, device), repeats)  # noqa: E731
        host = {"host_op_us": _chain_op_s(torch, device, timer) * 1e6,
                "host_optimizer_tensor_us": _optimizer_tensor_s(torch, device, timer) * 1e6}
    return {"name": name, "device": device, "memory_gb": round(memory_gb, 2), "sm_count": int(units), **rates,
            **host,
            "memory_bandwidth_gbps": _copy_gbps(torch, device, copy_bytes, repeats),
            "torch": torch.__version__, "hip": getattr(torch.version, "hip", None),
            "matmul_size": size, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}


def probe_spec(measured: dict) -> GpuSpec:
    """A device row from ``measure_device`` output. On a GPU the measured rates become datasheet-equivalent
    peaks (divided by ``probe_shares``); a CPU's stay as measured (CPU rows are measured rates)."""
    on_gpu = measured.get("device", "cuda").startswith("cuda")
    shares = probe_shares() if on_gpu else {"fp32": 1.0, "tensor": 1.0, "memory": 1.0}

    def peak(column: str, share: str) -> Optional[float]:
        value = measured.get(column)
        return None if value is None else value / shares[share]

    half = peak("fp16_tflops", "tensor")
    converted = (f"; rates divided by the probe's share of the datasheet peak ({shares['fp32']:g} fp32, "
                 f"{shares['tensor']:g} tensor, {shares['memory']:g} copy)") if on_gpu else ""
    return GpuSpec(
        name=measured["name"], architecture="measured", sm_count=max(1, int(measured["sm_count"])),
        memory_gb=float(measured["memory_gb"]), memory_bandwidth_gbps=peak("memory_bandwidth_gbps", "memory"),
        fp32_tflops=peak("fp32_tflops", "fp32"), tf32_tflops=peak("tf32_tflops", "tensor"), fp16_tflops=half,
        fp16_fp32acc_tflops=half, bf16_tflops=peak("bf16_tflops", "tensor"), consumer=False,
        vendor="amd" if measured.get("hip") else ("nvidia" if on_gpu else "other"),
        source=(f"measured probe on this machine ({measured['matmul_size']}^3 matmuls, device copy; "
                f"torch {measured['torch']}, {measured['measured_at']}{converted})"))


def probe_local_gpu(name: str, refresh: bool = False) -> Optional[GpuSpec]:
    """The probed row of this machine's GPU called ``name`` (cached), or None if no such GPU is here."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    from geodiloco.predictor.gpu_names import normalize_name
    wanted = normalize_name(name)
    for index in range(torch.cuda.device_count()):
        if normalize_name(torch.cuda.get_device_name(index)) == wanted:
            return probe_spec(_cached_measurement(f"cuda:{index}", torch, refresh))
    return None


def _cached_measurement(device: str, torch, refresh: bool) -> dict:
    key = f"{torch.cuda.get_device_name(device)}|torch {torch.__version__}|v{PROBE_VERSION}"
    return cached_measurement(CACHE_FILE_NAME, key, lambda: measure_device(device), refresh)


def probe_row(measured: dict) -> dict:
    """A ``gpus:`` YAML row (predictor/data/gpus.yaml shape) holding a probe's measurements."""
    spec = probe_spec(measured)
    return {"name": spec.name, "vendor": spec.vendor, "architecture": spec.architecture,
            "sm_count": spec.sm_count, "memory_gb": spec.memory_gb,
            "memory_bandwidth_gbps": round(spec.memory_bandwidth_gbps, 1),
            "fp32_tflops": round(spec.fp32_tflops, 2),
            **{column: None if getattr(spec, column) is None else round(getattr(spec, column), 2)
               for column in ("tf32_tflops", "fp16_tflops", "fp16_fp32acc_tflops", "bf16_tflops")},
            "source": spec.source}
