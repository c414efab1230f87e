"""Step-time model of one node: t(B) from its devices' datasheets and the workload.

A node trains synchronous data parallel over its GPUs. With ``split="equal"``
(PyTorch DDP) every GPU gets the same share of the batch and the slowest GPU
sets the pace; with ``split="by_speed"`` the batch is divided so all GPUs
finish together (the runtime must then feed uneven per-GPU batches). The
gradient all-reduce inside the node overlaps with the backward pass except for
its last bucket. A batch that does not fit in memory runs as micro-batches
with gradient accumulation. ``optimizer_step=False`` models forward + backward
only (no clipping, no optimizer update), for timings that leave the step out.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, Optional

from geodiloco.predictor.kernels import (
    efficiency_for, host_op_s, matmul_rate_tflops, micro_batch_time, optimizer_time,
)
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.specs import GpuSpec
from geodiloco.predictor.workload import (
    RUNTIME_CODE, ModelDims, TrainingCode, check_precision, gradient_bytes, training_memory_bytes,
)

Split = Literal["equal", "by_speed"]

# Memory a GPU cannot give to tensors: CUDA context, library workspaces (GiB),
# and the share lost to allocator fragmentation.
GPU_RESERVED_GB = 0.75
ALLOCATOR_HEADROOM = 0.95
CPU_USABLE_FRACTION = 0.8
DDP_BUCKET_BYTES = 25 * 2**20


@dataclass(frozen=True)
class DeviceStep:
    """One device's time for its share of a step (seconds)."""

    samples: int
    micro_batch_size: int
    micro_batches: int
    matmul_compute_s: float
    matmul_memory_s: float
    attention_s: float
    elementwise_s: float
    optimizer_s: float
    host_s: float
    last_micro_device_s: float
    step_s: float
    is_cpu: bool

    @property
    def scaling_s(self) -> float:
        """The part that grows with the batch (forward/backward kernels)."""
        return self.matmul_compute_s + self.matmul_memory_s + self.attention_s + self.elementwise_s

    @property
    def bound(self) -> str:
        """'compute', 'memory' or 'host' (Python/launch overhead). On a GPU the host runs beside the kernels, so
        a step whose host work outlasts them (``host_s``, the exposed remainder, above 0) is host-bound whatever
        the kernels' shares; on a CPU the three add up and the largest share names the bound."""
        if not self.is_cpu and self.host_s > 0:
            return "host"
        shares = {"compute": self.matmul_compute_s + self.attention_s,
                  "memory": self.matmul_memory_s + self.elementwise_s + self.optimizer_s,
                  "host": self.host_s}
        return max(shares, key=shares.get)


class NodeStepModel:
    """t(B) for one node from specs; satisfies predictor.base.StepTimeModel.

    ``update`` records nothing: this is the cold prior. Wrap it in
    predictor.online.OnlineStepTimeModel to learn from measured steps.
    """

    def __init__(self, devices: list[GpuSpec], dims: ModelDims, seq_len: int, precision: str = "bf16",
                 micro_batch_size: Optional[int] = None, split: Split = "equal",
                 activation_checkpointing: bool = False, optimizer_step: bool = True,
                 code: TrainingCode = RUNTIME_CODE) -> None:
        check_precision(precision)
        if not devices:
            raise ConfigError("a node needs at least one device")
        if seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
        if micro_batch_size is not None and micro_batch_size < 1:
            raise ConfigError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if split not in ("equal", "by_speed"):
            raise ConfigError(f"split must be 'equal' or 'by_speed', got {split!r}")
        self.devices = list(devices)
        self.dims = dims
        self.seq_len = seq_len
        self.precision = precision
        self.micro_batch_size = micro_batch_size
        self.split = split
        self.activation_checkpointing = activation_checkpointing
        self.optimizer_step = optimizer_step
        self.code = code
        self._device_step = lru_cache(maxsize=4096)(self._device_step_uncached)

    # ------------------------------------------------------------ memory

    def usable_memory_bytes(self, device: GpuSpec) -> float:
        if device.is_cpu:
            return device.memory_gb * 2**30 * CPU_USABLE_FRACTION
        return (device.memory_gb - GPU_RESERVED_GB) * 2**30 * ALLOCATOR_HEADROOM

    def memory_bytes(self, micro_batch_size: int) -> float:
        """Peak bytes on one device at ``micro_batch_size`` samples per micro-batch."""
        return training_memory_bytes(self.dims, micro_batch_size, self.seq_len, self.precision,
                                     self.activation_checkpointing).total

    def max_micro_batch_size(self, device: GpuSpec) -> int:
        """Largest micro-batch that fits on ``device`` (0: not even the weights fit)."""
        static = self.memory_bytes(0)
        per_sample = self.memory_bytes(1) - static
        free = self.usable_memory_bytes(device) - static
        return max(0, int(free // per_sample))

    def max_batch_size(self) -> int:
        """Largest node batch that runs without gradient accumulation."""
        capacities = [self.max_micro_batch_size(device) for device in self.devices]
        if self.split == "by_speed":
            return sum(capacities)
        return len(self.devices) * min(capacities)

    # ------------------------------------------------------------ time

    def _device_step_uncached(self, device: GpuSpec, samples: int) -> DeviceStep:
        capacity = self.max_micro_batch_size(device)
        if capacity < 1:
            raise ConfigError(f"{self.dims.num_layers}-layer model with hidden {self.dims.hidden_size} does not fit "
                              f"in {device.name} memory ({device.memory_gb} GiB) even at batch 1"
                              f"{' with activation checkpointing' if self.activation_checkpointing else ''}; use a "
                              f"smaller model{'' if self.activation_checkpointing else ', activation checkpointing'} "
                              "or a larger GPU")
        micro = min(samples, self.micro_batch_size or capacity, capacity) if samples else 0
        micro_batches = math.ceil(samples / micro) if micro else 0
        parts = [0.0] * 4
        ops = 0
        last_device_s = 0.0
        full_micro_batches, remainder = divmod(samples, micro) if micro else (0, 0)
        for size, count in ((micro, full_micro_batches), (remainder, 1 if remainder else 0)):
            if count == 0:
                continue
            work = micro_batch_time(device, self.dims, self.seq_len, self.precision, size,
                                    self.activation_checkpointing, self.code)
            for slot, value in enumerate((work.matmul_compute_s, work.matmul_memory_s, work.attention_s,
                                          work.elementwise_s)):
                parts[slot] += value * count
            ops += work.host_ops * count
            last_device_s = work.device_s
        optimizer_s, optimizer_host_s = (optimizer_time(device, self.dims, self.precision, max(1, micro_batches))
                                         if self.optimizer_step else (0.0, 0.0))
        host_s = ops * host_op_s(device) + optimizer_host_s
        device_s = sum(parts) + optimizer_s
        step_s = device_s + host_s if device.is_cpu else max(device_s, host_s)
        exposed_host_s = host_s if device.is_cpu else max(0.0, host_s - device_s)
        return DeviceStep(samples, micro, micro_batches, *parts, optimizer_s, exposed_host_s,
                          last_device_s, step_s, device.is_cpu)

    def device_step(self, device_index: int, samples: int) -> DeviceStep:
        return self._device_step(self.devices[device_index], samples)

    def split_batch(self, batch_size: int) -> list[int]:
        """Samples per device for a node batch of ``batch_size``. Every device trains at least one sample,
        as the runtime's ranks must (runtime/batching.py): a batch smaller than the device count runs as
        one sample on each, and their sum is the batch the node really trains."""
        count = len(self.devices)
        if batch_size <= count:
            return [1] * count
        if self.split == "equal" or count == 1:
            return [batch_size // count + (1 if index < batch_size % count else 0) for index in range(count)]
        shares = [1] * count
        heap = [(self.device_step(index, 2).step_s, index) for index in range(count)]
        heapq.heapify(heap)
        for _ in range(batch_size - count):
            _, index = heapq.heappop(heap)
            shares[index] += 1
            heapq.heappush(heap, (self.device_step(index, shares[index] + 1).step_s, index))
        return shares

    def allreduce_s(self) -> float:
        """Ring all-reduce of the fp32 gradients (seconds): NVLink / Infinity Fabric between identical GPUs (a
        bridge joins only pairs, so more than two bridged cards ring over PCIe), else the slowest PCIe link."""
        count = len(self.devices)
        if count == 1:
            return 0.0
        bridged_pairs_only = self.devices[0].peer_link == "NVLink bridge" and count > 2
        if len({device.name for device in self.devices}) == 1 and not bridged_pairs_only:
            link_gbps = self.devices[0].link_gbps()
        else:
            link_gbps = min(device.pcie_gbps() for device in self.devices)
        link = link_gbps * 1e9 * efficiency_for(self.devices[0]).link
        return 2.0 * (count - 1) / count * gradient_bytes(self.dims) / link

    def _exposed_allreduce_s(self, pacing: DeviceStep) -> float:
        total = self.allreduce_s()
        if total == 0.0:
            return 0.0
        backward_s = pacing.last_micro_device_s * 2.0 / 3.0
        last_bucket = total * min(1.0, DDP_BUCKET_BYTES / gradient_bytes(self.dims))
        return max(0.0, total - backward_s) + last_bucket

    def _node_step(self, batch_size: int) -> tuple[list[int], list[DeviceStep], int, float]:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        shares = self.split_batch(batch_size)
        steps = [self.device_step(index, share) for index, share in enumerate(shares)]
        pacing = max(range(len(steps)), key=lambda index: steps[index].step_s)
        return shares, steps, pacing, self._exposed_allreduce_s(steps[pacing])

    def predict(self, batch_size: int) -> float:
        """Seconds for one inner step of the whole node at ``batch_size`` samples."""
        _, steps, pacing, allreduce = self._node_step(batch_size)
        return steps[pacing].step_s + allreduce

    def update(self, batch_size: int, step_time_s: float) -> None:
        """The spec model does not learn; OnlineStepTimeModel does."""

    def fixed_and_scaling_s(self, batch_size: int) -> tuple[float, float]:
        """(seconds that do not grow with the batch, seconds that do) of ``predict``."""
        _, steps, pacing, allreduce = self._node_step(batch_size)
        scaling = steps[pacing].scaling_s
        return steps[pacing].step_s + allreduce - scaling, scaling

    def explain(self, batch_size: int) -> dict:
        """The estimate and where it comes from (seconds, TFLOPS, GiB)."""
        shares, steps, pacing, allreduce = self._node_step(batch_size)
        device, step = self.devices[pacing], steps[pacing]
        datasheet_rate, column, note = device.matmul_rate(self.precision)
        rate = matmul_rate_tflops(device, self.precision)
        if rate != datasheet_rate:
            column = f"{column} -> fitted share of fp16_tflops"
        step_time_s = step.step_s + allreduce
        bound = "allreduce" if allreduce > max(step.scaling_s, step.host_s, step.optimizer_s) else step.bound
        notes = [note] if note else []
        if len(self.devices) > 1 and self.split == "equal" and len({d.name for d in self.devices}) > 1:
            notes.append(f"equal split: the slowest GPU ({device.name}) sets the pace; split='by_speed' would "
                         "balance the GPUs")
        if len(self.devices) > 1 and any("mig_profile" in d.extra for d in self.devices):
            notes.append("MIG instances have no peer-to-peer path: the in-node all-reduce is modelled through host "
                         "memory over PCIe, and each rank must see its own instance (CUDA_VISIBLE_DEVICES=MIG-<uuid>)")
        if step.micro_batches > 1:
            notes.append(f"{step.micro_batches} micro-batches of at most {step.micro_batch_size} samples per GPU "
                         "(gradient accumulation; the last takes what is left)")
        if self.micro_batch_size is not None and self.micro_batch_size > max(shares):
            notes.append(f"micro-batch {self.micro_batch_size} is more than the {max(shares)} samples a GPU trains "
                         "per step: each GPU runs them in one pass")
        trained = sum(shares)
        if trained > batch_size:
            notes.append(f"batch {batch_size} < {len(self.devices)} GPUs: every GPU trains at least one sample, so "
                         f"the node trains {trained} per step (as the runtime does); give a batch of at least "
                         f"{len(self.devices)}")
        return {
            "step_time_s": step_time_s,
            "tokens_per_s": trained * self.seq_len / step_time_s,
            "batch_size": batch_size,
            "trained_batch_size": trained,
            "seq_len": self.seq_len,
            "precision": self.precision,
            "bound": bound,
            "pacing_gpu": device.name,
            "rate_tflops": rate,
            "rate_column": column,
            "memory_bandwidth_gbps": device.memory_bandwidth_gbps,
            "samples_per_gpu": shares,
            "split": self.split,
            "micro_batch_size": step.micro_batch_size,
            "grad_accum_steps": step.micro_batches,
            "compute_s": step.matmul_compute_s + step.attention_s,
            "matmul_s": step.matmul_compute_s + step.matmul_memory_s,
            "attention_s": step.attention_s,
            "memory_s": step.matmul_memory_s + step.elementwise_s + step.optimizer_s,
            "elementwise_s": step.elementwise_s,
            "optimizer_s": step.optimizer_s,
            "host_overhead_s": step.host_s,
            "allreduce_s": self.allreduce_s(),
            "allreduce_exposed_s": allreduce,
            "memory_gb": self.memory_bytes(step.micro_batch_size) / 2**30,
            "max_batch_size": self.max_batch_size(),
            "per_gpu_step_s": [s.step_s for s in steps],
            "notes": notes,
        }


def resolve_devices(gpus: list[str]) -> list[GpuSpec]:
    """Datasheet rows for GPU names (unknown ones probed or stood in for, with a notice);
    an empty list means this machine's CPU (measured)."""
    if not gpus:
        from geodiloco.predictor.detect import cpu_spec
        return [cpu_spec()]
    from geodiloco.predictor.unknown_gpus import device_spec
    return [device_spec(name) for name in gpus]


def node_step_model(gpus: list[str], dims: ModelDims, seq_len: int, precision: str = "bf16",
                    micro_batch_size: int | None = None, split: Split = "equal",
                    activation_checkpointing: bool = False, optimizer_step: bool = True,
                    code: TrainingCode = RUNTIME_CODE) -> NodeStepModel:
    """Cold step-time model of a node with these GPUs (one name per GPU; [] = this CPU);
    ``optimizer_step=False``: forward + backward only; ``code``: how the training code runs the model."""
    return NodeStepModel(resolve_devices(gpus), dims, seq_len, precision, micro_batch_size, split,
                         activation_checkpointing, optimizer_step, code)
