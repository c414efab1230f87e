"""Describe this machine: GPUs through NVML, rocm-smi (AMD) or torch.cuda (CUDA or ROCm builds), else the CPU with
its measured matmul rate, memory bandwidth and per-op overhead.

CPU measurements take about a second, so they are cached as JSON under
``$GEODILOCO_CACHE_DIR`` (default ``~/.cache/geodiloco``), keyed by CPU model,
thread count and library. Nothing here raises when NVML or a GPU is missing:
the reason is logged and returned.
"""
from __future__ import annotations

import json
import logging
import os
import platform
import re
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from geodiloco.predictor.amd_partitions import MODE_NAMES
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.specs import GpuSpec, detected_gpu, lookup_gpu

log = logging.getLogger("geodiloco.predictor")

CACHE_FILE_NAME = "cpu_peak.json"
MATMUL_SIZE = 1024
# Working sets for the copy-bandwidth curve: in cache ... well beyond it.
COPY_SIZES_MB = (0.25, 1.0, 4.0, 16.0, 64.0, 256.0)
CACHE_VERSION = 2


def cache_dir() -> Path:
    """Where measurements are cached: $GEODILOCO_CACHE_DIR or ~/.cache/geodiloco."""
    configured = os.environ.get("GEODILOCO_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "geodiloco"


# ---------------------------------------------------------------- GPUs


def _datasheet_name(name: str, memory_gib: Optional[float] = None, sm_count: Optional[int] = None) -> Optional[str]:
    try:
        return detected_gpu(name, memory_gib, sm_count).name
    except ConfigError:
        return None


def nvml_gpus() -> tuple[list[dict], str]:
    """GPUs seen by NVML, and '' or the reason NVML could not be used."""
    try:
        import pynvml
    except ImportError as err:
        return [], f"nvidia-ml-py is not installed ({err})"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return [], f"NVML unavailable: {err}"
    try:
        gpus = [device for index in range(pynvml.nvmlDeviceGetCount()) for device in _nvml_devices(pynvml, index)]
    except pynvml.NVMLError as err:
        return [], f"NVML query failed: {err}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return gpus, ""


def _nvml_devices(pynvml, index: int) -> list[dict]:
    """GPU ``index`` as NVML sees it: the GPU itself, or its MIG instances when MIG mode is on (then the
    instances are the devices CUDA programs get; the whole GPU is not one of them)."""
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = _text(pynvml.nvmlDeviceGetName(handle))
    clocks = {}
    for key, clock in (("sm_clock_max_mhz", "NVML_CLOCK_SM"), ("memory_clock_max_mhz", "NVML_CLOCK_MEM")):
        try:
            clocks[key] = pynvml.nvmlDeviceGetMaxClockInfo(handle, getattr(pynvml, clock))
        except pynvml.NVMLError:
            clocks[key] = None
    instances = _nvml_mig_instances(pynvml, handle, name)
    if instances:
        return [{"index": index, **instance, **clocks} for instance in instances]
    memory_gib, unified = _nvml_memory_gib(pynvml, handle)
    info = {"index": index, "name": name, "memory_gb": memory_gib, "datasheet": _datasheet_name(name, memory_gib),
            **clocks}
    if unified:
        info["unified_memory"] = True
    if info["datasheet"]:
        info["sm_count"] = lookup_gpu(info["datasheet"]).sm_count
    return [info]


def _nvml_memory_gib(pynvml, handle) -> tuple[float, bool]:
    """(device memory in GiB, whether it is the host's memory). A GPU that shares the host's memory (GB10 of
    the DGX Spark) has no memory of its own to report: NVML answers "Not Supported", and the memory it can
    use is the machine's, so that is reported (as nvtop and gpustat do) instead of failing detection."""
    try:
        return round(pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30, 2), False
    except pynvml.NVMLError as err:
        not_supported = isinstance(err, getattr(pynvml, "NVMLError_NotSupported", ())) or "not supported" in str(err).lower()
        if not not_supported:
            raise
        return round(memory_total_gb(), 2), True


def _nvml_mig_instances(pynvml, handle, parent_name: str) -> list[dict]:
    """The MIG instances of a GPU in MIG mode (name, memory, SM count, datasheet row), else [].

    NVML names an instance "MIG 1g.5gb" or after its parent ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", newer
    drivers); the parent's name is put in front where it is missing, so the name resolves (predictor/mig.py).
    """
    try:
        current_mode, _pending = pynvml.nvmlDeviceGetMigMode(handle)
        if current_mode != getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return []
        slots = pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    except (pynvml.NVMLError, AttributeError):
        return []
    instances = []
    for slot in range(slots):
        try:
            mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError:
            continue
        name = _text(pynvml.nvmlDeviceGetName(mig_handle))
        if not name.lower().startswith(parent_name.lower()):
            name = f"{parent_name} {name}"
        memory_gib = round(pynvml.nvmlDeviceGetMemoryInfo(mig_handle).total / 2**30, 2)
        try:
            sm_count = int(pynvml.nvmlDeviceGetAttributes(mig_handle).multiprocessorCount)
        except (pynvml.NVMLError, AttributeError):
            sm_count = None
        datasheet = _datasheet_name(name, memory_gib, sm_count)
        if sm_count is None and datasheet:
            sm_count = detected_gpu(name, memory_gib).sm_count
        instances.append({"mig_slot": slot, "name": name, "memory_gb": memory_gib, "datasheet": datasheet,
                          "sm_count": sm_count})
    return instances


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else value


ROCM_SMI_ARGS = ("rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json")


def rocm_smi_gpus(run: Optional[Callable[..., "subprocess.CompletedProcess"]] = None) -> tuple[list[dict], str]:
    """AMD GPUs seen by ``rocm-smi`` (ROCm machines have no NVML), and '' or why it could not be used."""
    run = run or subprocess.run
    try:
        result = run(list(ROCM_SMI_ARGS), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return [], f"rocm-smi unavailable: {err}"
    if result.returncode != 0:
        return [], f"rocm-smi failed (exit {result.returncode}): {result.stderr.strip()[:200]}"
    try:
        cards = json.loads(result.stdout)
    except json.JSONDecodeError as err:
        return [], f"rocm-smi printed no JSON: {err}"
    partitions = _rocm_compute_partitions(run)
    gpus = []
    for key in sorted((k for k in cards if k.lower().startswith("card")), key=lambda k: int("".join(
            filter(str.isdigit, k)) or 0)):
        fields = {name.lower(): value for name, value in cards[key].items()}
        name = str(fields.get("card series") or fields.get("card model") or fields.get("device name") or key).strip()
        vram = fields.get("vram total memory (b)")
        memory_gib = round(int(vram) / 2**30, 2) if vram and str(vram).isdigit() else None
        mode = partitions.get(key.lower(), "SPX")
        row_name = name if mode == "SPX" else f"{name} {mode}"
        gpus.append({"index": len(gpus), "name": name, "memory_gb": memory_gib, "compute_partition": mode,
                     "datasheet": _datasheet_name(row_name, None if mode != "SPX" else memory_gib)})
    return gpus, "" if gpus else "rocm-smi lists no GPU"


ROCM_SMI_PARTITION_ARGS = ("rocm-smi", "--showcomputepartition", "--json")


def _rocm_compute_partitions(run: Callable[..., "subprocess.CompletedProcess"]) -> dict[str, str]:
    """Each card's compute-partition mode ("SPX", "CPX", ...) as ``rocm-smi`` reports it; {} where this
    rocm-smi cannot say (older releases lack the option). An MI300X in CPX mode lists eight cards named
    like the whole GPU, and only the mode tells them apart (predictor/amd_partitions.py)."""
    try:
        result = run(list(ROCM_SMI_PARTITION_ARGS), capture_output=True, text=True, timeout=30)
        cards = json.loads(result.stdout) if result.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
        return {}
    modes = {}
    for key, fields in cards.items():
        if isinstance(fields, dict):
            for field, value in fields.items():
                if "compute partition" in field.lower() and str(value).strip().upper() in MODE_NAMES:
                    modes[key.lower()] = str(value).strip().upper()
    return modes


RDNA_ARCH = re.compile(r"^gfx(101|103|110|115|120)[0-9a-f](?![0-9a-z])", re.IGNORECASE)
"""LLVM targets of Radeon GPUs (RDNA 1 to 4: gfx101x, gfx103x, gfx110x, gfx115x, gfx120x), whose HIP runtime counts
workgroup processors (two compute units each) as its multiprocessors."""


def compute_units(props, hip: bool) -> int:
    """The compute units (SMs on NVIDIA) of a torch device. On an RDNA GPU ROCm's ``multiProcessorCount`` is the
    number of workgroup processors, half the compute units (ROCm/hip issue #3198: 42 on an RX 7900 XT, whose
    rocminfo lists 84 CUs; ROCm documentation issue #6407: 16 on an RX 7600 of 32 CUs), so it is doubled there,
    as the table's rows count compute units."""
    units = int(props.multi_processor_count)
    arch = str(getattr(props, "gcnArchName", "") or "")
    return units * 2 if hip and RDNA_ARCH.match(arch) else units


def torch_cuda_gpus() -> tuple[list[dict], str]:
    """GPUs seen by torch.cuda, and '' or the reason it could not be used."""
    try:
        import torch
    except ImportError:
        return [], "torch is not installed"
    if not torch.cuda.is_available():
        return [], "torch.cuda reports no GPU"
    gpus = []
    hip = bool(getattr(torch.version, "hip", None))
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        memory_gib = round(props.total_memory / 2**30, 2)
        units = compute_units(props, hip)
        gpus.append({"index": index, "name": props.name, "memory_gb": memory_gib, "sm_count": units,
                     "datasheet": _datasheet_name(props.name, memory_gib, units),
                     "runtime": "rocm" if hip else "cuda"})
    return gpus, ""


# ---------------------------------------------------------------- CPU


def cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def memory_total_gb() -> float:
    """Physical memory in GiB."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return 0.0


def _torch():
    try:
        import torch
        return torch
    except ImportError:
        return None


def compute_threads() -> int:
    """Threads the training process uses for math (torch's setting, else all cores)."""
    torch = _torch()
    return torch.get_num_threads() if torch is not None else (os.cpu_count() or 1)


def _best_time_s(action: Callable[[], object], repeats: int) -> float:
    """Fastest run of ``action`` in seconds, after one warm-up run.

    Each run counts the smaller of its wall time and its process CPU time per
    compute thread: other processes on a shared machine stretch the wall time,
    not the CPU time, while on an idle machine the two agree.
    """
    action()
    threads = compute_threads()
    best = float("inf")
    for _ in range(repeats):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        action()
        wall_s = time.perf_counter() - wall_start
        cpu_s = (time.process_time() - cpu_start) / threads
        best = min(best, wall_s, cpu_s) if cpu_s > 0 else min(best, wall_s)
    return best


def _chain_op_s(torch, device: str = "cpu", timer: Optional[Callable[[Callable[[], object]], float]] = None) -> float:
    """Seconds per tiny forward op on ``device``, its autograd backward included: the host's cost
    of one eager op (Python, dispatch, and the kernel launch on a GPU), since the tensors are tiny.
    ``timer``: action -> its fastest time in seconds (default: ``_best_time_s`` over 5 runs)."""
    weight = torch.ones(8, requires_grad=True, device=device)
    ops = 200

    def chain() -> None:
        hidden = weight
        for _ in range(ops // 2):
            hidden = hidden * 1.001 + 0.0
        hidden.sum().backward()

    return (timer or (lambda action: _best_time_s(action, 5)))(chain) / ops


def _optimizer_tensor_s(torch, device: str = "cpu",
                        timer: Optional[Callable[[Callable[[], object]], float]] = None) -> float:
    """Seconds of AdamW + clipping per (tiny) parameter tensor on ``device``: the host cost of the
    loop (multi-tensor launches on a GPU). ``timer`` as for ``_chain_op_s``."""
    params = [torch.nn.Parameter(torch.ones(8, device=device)) for _ in range(64)]
    for param in params:
        param.grad = torch.ones(8, device=device)
    optimizer = torch.optim.AdamW(params)

    def step() -> None:
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()

    return (timer or (lambda action: _best_time_s(action, 5)))(step) / len(params)


def measure_cpu(size: int = MATMUL_SIZE, copy_sizes_mb: tuple[float, ...] = COPY_SIZES_MB, repeats: int = 5) -> dict:
    """Measure fp32 matmul TFLOPS at size^3, copy bandwidth (GB/s, read + write) at
    several working-set sizes, and host costs (microseconds per eager op with its
    backward, and per parameter tensor in AdamW), with torch if present."""
    torch = _torch()
    curve = []
    if torch is not None:
        a, b = torch.randn(size, size), torch.randn(size, size)
        matmul_s = _best_time_s(lambda: torch.mm(a, b), repeats)
        for megabytes in copy_sizes_mb:
            elements = int(megabytes * 2**20 / 4)
            src, dst = torch.ones(elements), torch.empty(elements)
            curve.append((elements * 4.0, 2.0 * elements * 4 / _best_time_s(lambda: dst.copy_(src), repeats) / 1e9))
        host_op_us = _chain_op_s(torch) * 1e6
        optimizer_us = _optimizer_tensor_s(torch) * 1e6
        library = f"torch {torch.__version__}"
    else:
        a = np.random.rand(size, size).astype(np.float32)
        b = np.random.rand(size, size).astype(np.float32)
        matmul_s = _best_time_s(lambda: a @ b, repeats)
        for megabytes in copy_sizes_mb:
            elements = int(megabytes * 2**20 / 4)
            src, dst = np.ones(elements, dtype=np.float32), np.empty(elements, dtype=np.float32)
            curve.append((elements * 4.0, 2.0 * elements * 4 / _best_time_s(lambda: np.copyto(dst, src), repeats) / 1e9))
        host_op_us, optimizer_us = 5.0, 20.0
        library = f"numpy {np.__version__}"
    return {
        "matmul_tflops": 2.0 * size**3 / matmul_s / 1e12,
        "memory_bandwidth_gbps": curve[-1][1],
        "bandwidth_curve": curve,
        "host_op_us": host_op_us,
        "host_optimizer_tensor_us": optimizer_us,
        "library": library,
        "matmul_size": size,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _cache_key(threads: int) -> str:
    torch = _torch()
    library = f"torch {torch.__version__}" if torch is not None else f"numpy {np.__version__}"
    return f"{cpu_model_name()}|threads={threads}|{library}|v{CACHE_VERSION}"


def cached_measurement(file_name: str, key: str, measure: Callable[[], dict], refresh: bool = False) -> dict:
    """``measure()``'s result under ``key`` in the JSON file ``file_name`` of the cache directory;
    measured (and stored) when absent or when ``refresh``. An unreadable or unwritable cache only logs."""
    path = cache_dir() / file_name
    cached: dict = {}
    if path.is_file():
        try:
            cached = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            log.info("ignoring unreadable measurement cache %s: %s", path, err)
    if not refresh and key in cached:
        return cached[key]
    cached[key] = measure()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cached, indent=2, sort_keys=True))
    except OSError as err:
        log.warning("could not cache measurements in %s: %s", path, err)
    return cached[key]


def cpu_peak(refresh: bool = False) -> dict:
    """This CPU's measured peaks at the current thread count, cached on disk."""
    threads = compute_threads()
    return cached_measurement(CACHE_FILE_NAME, _cache_key(threads), lambda: {**measure_cpu(), "threads": threads},
                              refresh)


def cpu_spec(refresh: bool = False) -> GpuSpec:
    """This CPU as a device row for the step-time model (rates measured, not nominal)."""
    return cpu_spec_from(cpu_peak(refresh))


def cpu_spec_from(peak: dict) -> GpuSpec:
    """A CPU device row from ``cpu_peak``'s measurements (also ones stored with a benchmark)."""
    return GpuSpec(
        name=f"CPU ({cpu_model_name()}, {peak['threads']} threads)", architecture="cpu",
        sm_count=int(peak["threads"]), memory_gb=round(memory_total_gb(), 2),
        memory_bandwidth_gbps=peak["memory_bandwidth_gbps"], fp32_tflops=peak["matmul_tflops"],
        tf32_tflops=None, fp16_tflops=None, fp16_fp32acc_tflops=None, bf16_tflops=None,
        consumer=False, kind="cpu", host_op_us=peak["host_op_us"],
        host_optimizer_tensor_us=peak.get("host_optimizer_tensor_us"),
        bandwidth_curve=tuple((float(size), float(rate)) for size, rate in peak.get("bandwidth_curve", ())),
        source=f"measured on this machine with {peak['library']} ({peak['measured_at']})")


def describe_this_machine(measure: bool = True) -> dict:
    """GPUs (NVML, else rocm-smi, else torch.cuda) or, without any, the CPU with measured peaks.

    Keys: ``kind`` ('gpu' or 'cpu'), ``source``, ``gpus`` (list), ``cpu``
    (dict), ``fallback_reasons`` (why NVML / torch.cuda were not used).
    """
    reasons: list[str] = []
    gpus, source = [], "cpu"
    for source_name, detector in (("nvml", nvml_gpus), ("rocm-smi", rocm_smi_gpus), ("torch.cuda", torch_cuda_gpus)):
        gpus, reason = detector()
        if gpus:
            source = source_name
            break
        reasons.append(reason)
        log.info("GPU detection: %s; trying the next source", reason)
    cpu = {"model": cpu_model_name(), "logical_cores": os.cpu_count() or 1,
           "memory_gb": round(memory_total_gb(), 2), "threads": compute_threads()}
    if not gpus and measure:
        cpu.update(cpu_peak())
    return {"kind": "gpu" if gpus else "cpu", "source": source, "gpus": gpus,
            "cpu": cpu, "fallback_reasons": [r for r in reasons if r]}
