"""Time of one device's share of a training step, kernel class by kernel class.

Roofline per matmul (compute time vs bytes / bandwidth, whichever is longer,
with wave quantization over the GPU's SMs), flash attention as compute,
elementwise kernels and the optimizer as memory traffic, and a per-op host
cost (Python + dispatch + launch). Efficiencies are fractions of the datasheet
peak each kernel class reaches: one set for every GPU (data/gpu_efficiency.yaml,
partly fitted on the dev third of published measurements, never per GPU) and
one for CPUs, whose rates are measured.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import yaml

from geodiloco.predictor.specs import GpuSpec
from geodiloco.predictor.workload import (
    RUNTIME_CODE, ModelDims, TrainingCode, activation_bytes, eager_attention_bytes_per_sample,
    elementwise_bytes_per_token, gpt_elementwise_bytes_per_token, layer_linear_shapes, optimizer_traffic,
    parameter_count, parameter_tensor_count, vocab_loss_bytes_per_token,
)


@dataclass(frozen=True)
class Efficiency:
    """Fractions of datasheet peaks reached in practice, and host costs.

    ``matmul``: of the matmul TFLOPS for the model's GEMMs; ``score_matmul``: of the
    same rate for eager attention's batched score products (many small matrices);
    ``attention``: of the same rate for flash attention; ``memory``: of the memory
    bandwidth for memory-bound GEMMs; ``elementwise``: of the bandwidth for eager
    elementwise kernels (norms, activations, dropout, residuals, softmax over
    scores); ``optimizer``: of the bandwidth for clipping + AdamW passes; ``link``:
    of the intra-node link bandwidth; ``host_op_us``: microseconds per eager forward
    op (its backward included) when the device row has no measured value;
    ``host_optimizer_tensor_us``: the same per parameter tensor in the optimizer
    step; ``tile``: matmul output tile edge used for wave quantization (0 = none);
    ``half_rate_fp16_share``: on parts whose FP32-accumulate tensor rate is half
    the FP16-accumulate one (GeForce), the share of the FP16-accumulate rate that
    mixed-precision GEMMs run at (0.5 = the datasheet's FP32-accumulate rate);
    ``half_rate_fp16_architectures``: the architectures it applies to (those the
    fit saw such rows of; the others keep the datasheet rate);
    ``vocab_softmax_gbps_per_sm``: GB/s that one SM (compute unit) streams through the
    softmax cross-entropy over the vocabulary. PyTorch runs a softmax over a row that long
    as one thread block per row, so its loads in flight, and with them its rate, are
    likely bounded per SM (Little's law: bytes in flight / memory latency) rather than by
    the memory bus; fitted, it makes HBM and GDDR6 parts stream the loss at similar
    rates, as the published Transformer-XL steps do. The loss runs at the lower of this
    times the SM count and its bus rate, for code that has the bound
    (``TrainingCode.vocab_softmax_per_sm_bound``: the published steps' code, not the runtime
    on current PyTorch, whose loss streamed at 3x this rate per SM on an H200). None: no
    such bound (CPUs, whose rates are measured); ``vocab_softmax_bandwidth``: the loss's bus rate, as a fraction of the
    memory bandwidth. A softmax over rows of tens of thousands of entries streams long
    contiguous rows, unlike the mix of small and strided tensors the elementwise fraction
    averages over, so it gets its own fraction. None: the elementwise rate.
    """

    matmul: float
    score_matmul: float
    attention: float
    memory: float
    elementwise: float
    optimizer: float
    link: float
    host_op_us: float
    host_optimizer_tensor_us: float
    tile: int
    half_rate_fp16_share: float = 0.5
    half_rate_fp16_architectures: tuple[str, ...] = ()
    vocab_softmax_gbps_per_sm: Optional[float] = None
    vocab_softmax_bandwidth: Optional[float] = None


EFFICIENCY_FILE = Path(__file__).parent / "data" / "gpu_efficiency.yaml"
FITTED_FIELDS = ("matmul", "score_matmul", "elementwise", "optimizer", "half_rate_fp16_share",
                 "vocab_softmax_gbps_per_sm", "vocab_softmax_bandwidth")
# Fields whose null means "no such term" (the model falls back to a simpler rule).
OPTIONAL_FIELDS = ("vocab_softmax_gbps_per_sm", "vocab_softmax_bandwidth")
# Fitted or hand-set fields that are not fractions of a peak.
NOT_FRACTIONS = ("host_op_us", "host_optimizer_tensor_us", "tile", "half_rate_fp16_architectures",
                 "vocab_softmax_gbps_per_sm")


def load_gpu_efficiency(path: Path = EFFICIENCY_FILE) -> Efficiency:
    """The GPU constants: hand-set ones and those fitted on the dev third of published measurements
    (experiments/predictor/fit_efficiency.py writes the file; its ``fit`` block says on what)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    values = data["efficiency"]
    missing = [name for name in Efficiency.__dataclass_fields__ if name not in values]
    if missing:
        raise ValueError(f"{path}: efficiency lacks {', '.join(missing)}")
    for name in Efficiency.__dataclass_fields__:
        if name in OPTIONAL_FIELDS and values[name] is None:
            continue
        if name not in NOT_FRACTIONS and not 0.0 < values[name] <= 1.0:
            allowed = "(0, 1] or null" if name in OPTIONAL_FIELDS else "(0, 1]"
            raise ValueError(f"{path}: efficiency.{name} must be in {allowed}, got {values[name]}")
    per_sm = values["vocab_softmax_gbps_per_sm"]
    if per_sm is not None and not per_sm > 0.0:
        raise ValueError(f"{path}: efficiency.vocab_softmax_gbps_per_sm must be > 0 GB/s or null, got {per_sm}")
    fields = {name: values[name] for name in Efficiency.__dataclass_fields__}
    fields["half_rate_fp16_architectures"] = tuple(fields["half_rate_fp16_architectures"] or ())
    return Efficiency(**fields)


GPU_EFFICIENCY = load_gpu_efficiency()
# CPU rates are measured (matmul at 1024^3, copy bandwidth curve, op costs), so they are achieved rates.
CPU_EFFICIENCY = Efficiency(matmul=1.0, score_matmul=1.0, attention=0.5, memory=1.0, elementwise=1.0, optimizer=1.0,
                            link=1.0, host_op_us=5.0, host_optimizer_tensor_us=20.0, tile=0)
_active_gpu_efficiency = GPU_EFFICIENCY


@contextmanager
def gpu_efficiency(eff: Efficiency) -> Iterator[None]:
    """Predict with other GPU constants inside the block (the fitting script's trial values)."""
    global _active_gpu_efficiency
    saved, _active_gpu_efficiency = _active_gpu_efficiency, eff
    try:
        yield
    finally:
        _active_gpu_efficiency = saved


def efficiency_for(device: GpuSpec) -> Efficiency:
    return CPU_EFFICIENCY if device.is_cpu else _active_gpu_efficiency


def matmul_rate_tflops(device: GpuSpec, precision: str) -> float:
    """The tensor rate GEMMs run at: the datasheet column for ``precision``, except that mixed
    precision on a part with a halved FP32-accumulate rate reaches ``half_rate_fp16_share`` of its
    FP16-accumulate rate (a fitted constant; see data/gpu_efficiency.yaml)."""
    rate, _, _ = device.matmul_rate(precision)
    eff = efficiency_for(device)
    if device.architecture in eff.half_rate_fp16_architectures and half_rate_mixed_precision(device, precision):
        return max(rate, device.fp16_tflops * eff.half_rate_fp16_share)
    return rate


def half_rate_mixed_precision(device: GpuSpec, precision: str) -> bool:
    """Whether ``precision`` runs at the datasheet's FP32-accumulate rate and that rate is below the FP16 one
    (GeForce-style parts)."""
    rate, column, _ = device.matmul_rate(precision)
    return column == "fp16_fp32acc_tflops" and bool(device.fp16_tflops) and device.fp16_tflops > rate


@dataclass(frozen=True)
class MicroBatchTime:
    """Seconds of device work for one micro-batch, by kernel class, and its op count."""

    matmul_compute_s: float
    matmul_memory_s: float
    attention_s: float
    elementwise_s: float
    host_ops: float

    @property
    def device_s(self) -> float:
        return self.matmul_compute_s + self.matmul_memory_s + self.attention_s + self.elementwise_s


def wave_efficiency(rows: int, cols: int, sm_count: int, tile: int, tile_cols: Optional[int] = None) -> float:
    """Share of SM time doing useful work when output tiles (``tile`` x ``tile_cols``, square by default) run in
    waves over the SMs."""
    if tile <= 0:
        return 1.0
    tiles = math.ceil(rows / tile) * math.ceil(cols / (tile_cols or tile))
    waves = math.ceil(tiles / sm_count)
    return tiles / (waves * sm_count)


CUDA_CORE_SGEMM_TILE: Optional[tuple[int, int]] = (128, 64)
"""Output tile of an FP32 GEMM on an NVIDIA GPU's CUDA cores (no tensor cores, no TF32), for wave quantization:
cuBLAS's SGEMM kernels run 128 x 64 tiles (``volta_sgemm_128x64_nn`` and its kin), turned whichever way fills the
SMs better, where its tensor-core kernels run larger ones (``eff.tile``). None: the square ``eff.tile`` for every
GEMM (the model before 2026-12-02)."""


def gemm_wave_efficiency(m: int, n: int, device: GpuSpec, rate_tflops: float, eff: Efficiency) -> float:
    """Wave efficiency of an (m x n) output on ``device`` at ``rate_tflops`` (see ``CUDA_CORE_SGEMM_TILE``)."""
    on_cuda_cores = device.vendor == "nvidia" and not device.is_cpu and rate_tflops == device.fp32_tflops
    if CUDA_CORE_SGEMM_TILE is None or not on_cuda_cores or eff.tile <= 0:
        return wave_efficiency(m, n, device.sm_count, eff.tile)
    long_edge, short_edge = CUDA_CORE_SGEMM_TILE
    return max(wave_efficiency(m, n, device.sm_count, long_edge, short_edge),
               wave_efficiency(m, n, device.sm_count, short_edge, long_edge))


def shape_rate_tflops(device: GpuSpec, precision: str, rate_tflops: float, code: TrainingCode, *dims: int) -> float:
    """The rate a GEMM with these dimensions runs at: ``rate_tflops``, except an FP16 one with a dimension that is
    not a multiple of ``code.tensor_core_alignment`` (code on CUDA 10), which runs on the CUDA cores."""
    alignment = code.tensor_core_alignment
    if alignment > 1 and precision == "fp16" and device.vendor == "nvidia" and not device.is_cpu \
            and any(dim % alignment for dim in dims):
        return device.fp32_tflops
    return rate_tflops


def matmul_time_s(m: int, n: int, k: int, device: GpuSpec, rate_tflops: float,
                  element_bytes: int, eff: Efficiency) -> tuple[float, bool]:
    """(seconds, compute-bound?) of an (m x k) @ (k x n) product."""
    compute_s = 2.0 * m * n * k / (rate_tflops * 1e12 * eff.matmul * gemm_wave_efficiency(m, n, device, rate_tflops, eff))
    moved = element_bytes * (m * k + k * n + m * n)
    memory_s = moved / (device.bandwidth_gbps_for(moved) * 1e9 * eff.memory)
    return (compute_s, True) if compute_s >= memory_s else (memory_s, False)


def micro_batch_time(device: GpuSpec, dims: ModelDims, seq_len: int, precision: str, samples: int,
                     activation_checkpointing: bool = False, code: TrainingCode = RUNTIME_CODE) -> MicroBatchTime:
    """Forward + backward of ``samples`` sequences on one device, run the way ``code`` describes."""
    eff = efficiency_for(device)
    rate = matmul_rate_tflops(device, precision)
    e = activation_bytes(precision) if not device.is_cpu else 4
    tokens = samples * seq_len
    compute_s = memory_s = 0.0
    block_passes = 4 if activation_checkpointing else 3

    def add(m: int, n: int, k: int, repeats: int, shape: tuple[int, ...] = ()) -> None:
        """``shape``: the dimensions the tensor-core alignment is checked on, where they are not (m, n, k)."""
        nonlocal compute_s, memory_s
        if m == 0 or n == 0 or k == 0:
            return
        gemm_rate = shape_rate_tflops(device, precision, rate, code, *(shape or (m, n, k)))
        seconds, compute_bound = matmul_time_s(m, n, k, device, gemm_rate, e, eff)
        if compute_bound:
            compute_s += seconds * repeats
        else:
            memory_s += seconds * repeats

    for index, (n_in, n_out) in enumerate(layer_linear_shapes(dims)):
        layers = dims.num_layers
        # The fused q, k, v projection (the first shape) runs over the cached memory too: Transformer-XL projects
        # cat([memory, segment]) and keeps the last segment's queries (RelPartialLearnableMultiHeadAttn:
        # qkv_net(cat([mems, w]))), so its forward, input- and weight-gradient GEMMs span memory + segment positions.
        rows = samples * (seq_len + code.memory_len) if index == 0 else tokens
        # A "gpt" block's MLP width here is the SwiGLU equivalent (2/3 of its real width), so its alignment is
        # checked on the hidden size: the real width is 4 x the hidden size in BERT, GPT-2 and Transformer-XL.
        shape = (rows, dims.hidden_size) if code.block == "gpt" and index >= 2 else ()
        # Blocks timed alone on an input that needs no gradient: the first block's input projections
        # (q, k, v) compute no input gradient.
        input_gradients = layers - 1 if code.blocks_only and index == 0 else layers
        add(rows, n_out, n_in, layers * (block_passes - 2), shape)  # forward (+ recompute)
        add(rows, n_in, n_out, input_gradients, shape)               # input gradient
        add(n_in, n_out, rows, layers, shape)                        # weight gradient
    head = dims.hidden_size, dims.vocab_size
    head_tokens = round(tokens * code.lm_head_fraction)
    add(head_tokens, head[1], head[0], 1)
    add(head_tokens, head[0], head[1], 1)
    add(head[0], head[1], head_tokens, 1)

    attention_s = attention_time_s(device, dims, seq_len, precision, samples, activation_checkpointing, code)
    precision_moved = "fp32" if device.is_cpu else precision
    if code.block == "gpt":
        per_token = gpt_elementwise_bytes_per_token(dims, precision_moved, code.activation,
                                                    final_norm=not code.blocks_only)
    else:
        per_token = elementwise_bytes_per_token(dims, seq_len, precision_moved)
    working_set = 3 * tokens * max(dims.hidden_size, dims.intermediate_size) * e
    elementwise_bytes_per_s = device.bandwidth_gbps_for(working_set) * 1e9 * eff.elementwise
    loss_bytes = tokens * vocab_loss_bytes_per_token(dims, precision_moved, code.lm_head_fraction)
    elementwise_s = (tokens * per_token / elementwise_bytes_per_s
                     + loss_bytes / vocab_softmax_bytes_per_s(device, loss_bytes, elementwise_bytes_per_s,
                                                              code.vocab_softmax_per_sm_bound))
    return MicroBatchTime(compute_s, memory_s, attention_s, elementwise_s, host_chain_ops(device, dims, precision, code))


def host_chain_ops(device: GpuSpec, dims: ModelDims, precision: str, code: TrainingCode) -> float:
    """Host work of one micro-batch's forward and backward, in chain ops (``host_op_us`` each)."""
    ops = dims.num_layers * code.host_ops_per_layer + (0.0 if code.blocks_only else code.host_ops_head)
    if precision in ("bf16", "fp16") and not device.is_cpu:
        ops += code.autocast_host_ops
    return ops


def vocab_softmax_bytes_per_s(device: GpuSpec, loss_bytes: float, elementwise_bytes_per_s: float,
                              per_sm_bound: bool) -> float:
    """Bytes/s of the softmax cross-entropy over the vocabulary (``loss_bytes`` of traffic): its own share of
    the bus where one is set (else the elementwise rate), or, for code that has it (``per_sm_bound``,
    ``TrainingCode.vocab_softmax_per_sm_bound``), the per-SM bound times the SM count where that is lower
    (see ``Efficiency.vocab_softmax_gbps_per_sm`` and ``vocab_softmax_bandwidth``)."""
    eff = efficiency_for(device)
    bus_bytes_per_s = elementwise_bytes_per_s
    if eff.vocab_softmax_bandwidth is not None:
        bus_bytes_per_s = device.bandwidth_gbps_for(loss_bytes) * 1e9 * eff.vocab_softmax_bandwidth
    if eff.vocab_softmax_gbps_per_sm is None or not per_sm_bound:
        return bus_bytes_per_s
    return min(bus_bytes_per_s, device.sm_count * eff.vocab_softmax_gbps_per_sm * 1e9)


def attention_time_s(device: GpuSpec, dims: ModelDims, seq_len: int, precision: str, samples: int,
                     activation_checkpointing: bool, code: TrainingCode) -> float:
    """Seconds of the attention core (scores, softmax, weighted sum), forward + backward.

    Flash: compute at the attention efficiency, causal half skipped, the backward recomputing the
    scores (3.5 forward passes). Eager: the full square of scores (plus Transformer-XL memory keys and
    relative-position scores) through batched matmuls at the matmul efficiency, and the score matrices
    through memory.
    """
    eff = efficiency_for(device)
    rate = matmul_rate_tflops(device, precision)
    recompute = 1.0 if activation_checkpointing else 0.0
    if code.attention == "flash":
        forward_flops = 2.0 * samples * seq_len**2 * dims.hidden_size * dims.num_layers
        return forward_flops * (3.5 + recompute) / (rate * 1e12 * eff.attention)
    keys = seq_len + code.memory_len
    rate = shape_rate_tflops(device, precision, rate, code, seq_len, keys, dims.head_dim)
    score_matmuls = 3.0 if code.relative_positions else 2.0  # QK^T (+ Q R^T) and PV
    forward_flops = 2.0 * score_matmuls * samples * seq_len * keys * dims.hidden_size * dims.num_layers
    compute_s = forward_flops * (3.0 + recompute) / (rate * 1e12 * eff.score_matmul)
    moved = samples * eager_attention_bytes_per_sample(dims, seq_len, precision, code.memory_len,
                                                       code.relative_positions, code.attention_dropout)
    return compute_s + moved / (device.bandwidth_gbps_for(moved) * 1e9 * eff.elementwise)


def optimizer_time(device: GpuSpec, dims: ModelDims, precision: str, micro_batches: int) -> tuple[float, float]:
    """(device seconds, host seconds) of gradient clipping + AdamW + grad accumulation.

    The first touch of the optimizer state streams from memory at the
    bandwidth of the whole state; the other passes over one tensor at a time
    run at the bandwidth of that tensor's working set (cache on a CPU). The
    host pays per parameter tensor (a loop of small ops on CPU, multi-tensor
    launches on GPU).
    """
    eff = efficiency_for(device)
    compulsory, retouched = optimizer_traffic(dims, "fp32" if device.is_cpu else precision, micro_batches)
    params, tensors = parameter_count(dims), parameter_tensor_count(dims)
    state_bytes = 16.0 * params
    tensor_working_set = 5 * 4.0 * params / tensors
    seconds = (compulsory / device.bandwidth_gbps_for(state_bytes)
               + retouched / device.bandwidth_gbps_for(tensor_working_set)) / (1e9 * eff.optimizer)
    per_tensor_us = device.host_optimizer_tensor_us
    if per_tensor_us is None:
        per_tensor_us = eff.host_optimizer_tensor_us
    return seconds, tensors * per_tensor_us * 1e-6


def host_op_s(device: GpuSpec) -> float:
    """Seconds of host work per forward op, its backward included (measured on CPUs, a constant on GPUs)."""
    micros = device.host_op_us if device.host_op_us is not None else efficiency_for(device).host_op_us
    return micros * 1e-6
