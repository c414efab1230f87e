"""Batch-size sweep of real training steps on one GPU, beside the predictor's t(B).

The pure parts (the OOM-stopping sweep, the largest-batch search, the error
and verdict arithmetic) take the hardware as callables, so they are tested
without a GPU; ``StepRunner`` is the hardware side: one model, one AdamW, one
full training step at a time on ``device``.
"""
from __future__ import annotations

import gc
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Optional

import torch

from geodiloco.predictor.model import NodeStepModel, node_step_model
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.workload import ModelDims, resolve_dims
from geodiloco.runtime.diloco import build_inner_optimizer
from geodiloco.runtime.models import build_model

# Allocation failures inside cuBLAS/cuDNN near the memory limit surface as plain RuntimeErrors.
OOM_MESSAGES = ("out of memory", "ALLOC_FAILED", "NOT_ENOUGH_WORKSPACE")
BATCH_SEARCH_LIMIT = 65536
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# The runtime's inner optimizer and clipping (runtime/trainer.py), so a step here is a runtime step.
INNER_LR = 3.0e-4
INNER_WEIGHT_DECAY = 0.1
INNER_BETAS = (0.9, 0.95)
GRAD_CLIP = 1.0


# ---------------------------------------------------------------- pure helpers


def slug(name: str) -> str:
    """File-name form of a GPU name: 'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "gpu"


def relative_error(predicted_s: float, measured_s: float) -> float:
    """Signed (predicted - measured) / measured: +0.10 = predicts 10 % more time than measured, -0.10 = 10 % less."""
    if measured_s <= 0:
        raise ValueError(f"measured time must be > 0 s, got {measured_s}")
    return (predicted_s - measured_s) / measured_s


def median_s(times_s: list[float]) -> float:
    """Median of step times (seconds): robust to a stray slow step (a clock boost, another process)."""
    if not times_s:
        raise ValueError("no step times to take the median of")
    return statistics.median(times_s)


def effective_precision(requested: str, bf16_supported: bool) -> tuple[str, str]:
    """(precision that runs, note): bf16 on a GPU without bf16 runs fp16 autocast, as the predictor models it."""
    if requested == "bf16" and not bf16_supported:
        return "fp16", "this GPU has no bf16: fp16 autocast measured, predictor asked for fp16"
    return requested, ""


def is_out_of_memory(err: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError, or a library's allocation failure reported as a RuntimeError."""
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and any(text in str(err) for text in OOM_MESSAGES)


def doubling_batches(start: int, limit: int) -> list[int]:
    """start*2, start*4, ... up to and including the first value >= limit (probes past a sweep without OOM)."""
    batches, batch = [], max(1, start)
    while batch < limit:
        batch *= 2
        batches.append(batch)
    return batches


@dataclass
class SweepPoint:
    """One batch size of the sweep: step times (s) when it ran, ``oom`` when it did not fit."""

    batch_size: int
    step_times_s: list[float] = field(default_factory=list)
    oom: bool = False
    error: str = ""
    peak_memory_gib: Optional[float] = None

    @property
    def ran(self) -> bool:
        return bool(self.step_times_s)


def sweep_batches(batch_sizes: list[int], time_batch: Callable[[int], tuple[list[float], Optional[float]]],
                  release_memory: Callable[[], None]) -> list[SweepPoint]:
    """Time each batch size in order; stop at the first that runs out of memory (or fails).

    ``time_batch(B)`` returns (step times in s, peak memory in GiB or None) and raises
    torch.cuda.OutOfMemoryError (or another ``is_out_of_memory`` error) when B does not fit.
    Memory is released outside the ``except`` block, once the exception (and the frames
    its traceback holds) is gone.
    """
    points: list[SweepPoint] = []
    for batch_size in batch_sizes:
        point = SweepPoint(batch_size)
        try:
            point.step_times_s, point.peak_memory_gib = time_batch(batch_size)
        except RuntimeError as err:
            point.oom = is_out_of_memory(err)
            point.error = "" if point.oom else f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
        points.append(point)
        if not point.ran:
            release_memory()
            break
    return points


def sweep_bracket(points: list[SweepPoint]) -> tuple[int, Optional[int]]:
    """(largest batch that ran, smallest that ran out of memory or None) from a sweep."""
    largest_fit = max((point.batch_size for point in points if point.ran), default=0)
    first_oom = next((point.batch_size for point in points if point.oom), None)
    return largest_fit, first_oom


@dataclass
class SearchResult:
    """The bracket the probes narrowed the largest batch to, and why they stopped early (if they did)."""

    largest_fit: int
    first_oom: Optional[int]
    probes: int = 0
    stopped_by: str = ""


def search_largest_fit(largest_fit: int, first_oom: Optional[int], fits: Callable[[int], bool],
                       limit: int = BATCH_SEARCH_LIMIT) -> SearchResult:
    """Narrow [largest_fit, first_oom) to adjacent batch sizes with single-step probes.

    Without an OOM yet, batches double from ``largest_fit`` until one does not fit or
    ``limit`` is reached; then bisection. ``fits(B)`` runs one step at B and says whether
    it fit; a RuntimeError other than OOM (a kernel's size limit, say) ends the search
    with the bracket reached so far.
    """
    result = SearchResult(largest_fit, first_oom)

    def probe(batch: int) -> bool:
        result.probes += 1
        if fits(batch):
            result.largest_fit = batch
            return True
        result.first_oom = batch
        return False

    try:
        if result.first_oom is None:
            for batch in doubling_batches(result.largest_fit, limit):
                if not probe(batch):
                    break
        while result.first_oom is not None and result.first_oom - result.largest_fit > 1:
            probe((result.largest_fit + result.first_oom) // 2)
    except RuntimeError as err:
        result.stopped_by = f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"
    return result


def max_batch_verdict(predicted_max: Optional[int], largest_fit: int, first_oom: Optional[int]) -> str:
    """Does the predicted largest batch agree with the measured bracket [largest_fit, first_oom)?"""
    if predicted_max is None:
        return "no prediction"
    if predicted_max < largest_fit:
        return f"predictor too cautious: {largest_fit} fit, it allows {predicted_max}"
    if first_oom is None:
        return f"consistent so far (no OOM up to {largest_fit})"
    if predicted_max >= first_oom:
        return f"predictor too optimistic: {first_oom} ran out of memory, it allows {predicted_max}"
    return "agrees"


# ---------------------------------------------------------------- predictor side


@dataclass
class Prediction:
    """The predictor's view of one preset on this GPU: t(B) (s), memory (GiB) and max batch."""

    model: Optional[NodeStepModel]
    note: str = ""

    def step_s(self, batch_size: int) -> Optional[float]:
        if self.model is None:
            return None
        try:
            return self.model.predict(batch_size)
        except ConfigError:
            return None

    def memory_gib(self, batch_size: int) -> Optional[float]:
        return self.model.memory_bytes(batch_size) / 2**30 if self.model is not None else None

    def max_batch_size(self) -> Optional[int]:
        return self.model.max_batch_size() if self.model is not None else None


def predict_for(datasheet_name: Optional[str], dims: ModelDims, seq_len: int, precision: str) -> Prediction:
    """The cold predictor for one GPU of ``datasheet_name`` (None: GPU unknown to the table)."""
    if datasheet_name is None:
        return Prediction(None, "GPU not in predictor/data/gpus.yaml: no prediction (give --gpu NAME)")
    try:
        return Prediction(node_step_model([datasheet_name], dims, seq_len, precision=precision))
    except ConfigError as err:
        return Prediction(None, str(err))


def spec_step_ms(spec, dims: ModelDims, seq_len: int, precision: str, batch_size: int) -> float:
    """The cold prediction (ms) for one GPU given as a device row (``GpuSpec``), e.g. a table row with
    other host costs: what host_overhead.py and cold_accuracy.py compare measured steps with."""
    return NodeStepModel([spec], dims, seq_len, precision=precision).predict(batch_size) * 1e3


# ---------------------------------------------------------------- hardware side


def synchronize(device: torch.device) -> None:
    """Wait for queued kernels, so host clocks bracket the GPU's work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def set_matmul_precision(precision: str) -> None:
    """TF32 matmuls only for ``tf32``: plain fp32 stays IEEE fp32, as the predictor assumes."""
    allow_tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    torch.backends.cudnn.allow_tf32 = allow_tf32


class StepRunner:
    """One model and optimizer on ``device``; runs full training steps at any batch size.

    A step is what the runtime's inner step does (runtime/trainer.py): forward with the
    loss (under autocast for bf16/fp16), backward, gradient clipping at 1.0, AdamW step,
    gradients set to None. Tokens are random, made on the device once per batch size.
    """

    def __init__(self, dims: ModelDims, seq_len: int, precision: str, device: torch.device, seed: int = 0) -> None:
        self.dims = dims
        self.seq_len = seq_len
        self.device = device
        self.autocast_dtype = AUTOCAST_DTYPES.get(precision)
        self.model = build_model(dims, seed).to(device)
        self.optimizer = build_inner_optimizer(self.model, "adamw", INNER_LR, INNER_WEIGHT_DECAY, INNER_BETAS)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self._batch: Optional[tuple[int, torch.Tensor]] = None

    def _tokens(self, batch_size: int) -> torch.Tensor:
        if self._batch is None or self._batch[0] != batch_size:
            self._batch = None
            tokens = torch.randint(0, self.dims.vocab_size, (batch_size, self.seq_len + 1),
                                   generator=self.generator, device=self.device)
            self._batch = (batch_size, tokens)
        return self._batch[1]

    def step(self, batch_size: int) -> None:
        tokens = self._tokens(batch_size)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
            loss = self.model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def timed_steps_s(self, batch_size: int, warmup_steps: int,
                      timed_steps: int) -> tuple[list[float], Optional[float]]:
        """(seconds per timed step, peak allocated GiB or None on CPU) after ``warmup_steps`` untimed steps.

        Each timed step is bracketed by device synchronization, so it is the step's
        whole GPU time plus the host time the GPU could not hide.
        """
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        for _ in range(warmup_steps):
            self.step(batch_size)
        times_s = []
        for _ in range(timed_steps):
            synchronize(self.device)
            started = time.perf_counter()
            self.step(batch_size)
            synchronize(self.device)
            times_s.append(time.perf_counter() - started)
        peak_gib = torch.cuda.max_memory_allocated(self.device) / 2**30 if self.device.type == "cuda" else None
        return times_s, peak_gib

    def fits(self, batch_size: int) -> bool:
        """Whether one full step at ``batch_size`` runs without running out of memory."""
        try:
            self.step(batch_size)
            synchronize(self.device)
            return True
        except RuntimeError as err:
            if not is_out_of_memory(err):
                raise
        self.release_memory()
        return False

    def close(self) -> None:
        """Drop the model, optimizer and batch, and return their memory to the device, before the next
        runner is built (a caller may still hold this object)."""
        self.model = self.optimizer = None
        self._batch = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def release_memory(self) -> None:
        """Drop gradients, the cached batch and the allocator's free blocks after an OOM."""
        self.optimizer.zero_grad(set_to_none=True)
        self._batch = None
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()



def preset_runners(presets: list[str], precisions: list[str],
                   device: torch.device) -> Iterator[tuple[str, ModelDims, str, StepRunner]]:
    """(preset, dims, precision, runner) for each preset x precision, each at the preset's own sequence
    length with its matmul precision set; each runner's memory is released before the next is built."""
    for preset in presets:
        dims = resolve_dims(preset)
        for precision in precisions:
            set_matmul_precision(precision)
            runner = StepRunner(dims, dims.max_seq_len, precision, device)
            yield preset, dims, precision, runner
            runner.close()


def profiled_step(runner: StepRunner, batch_size: int) -> tuple[list[tuple[str, float]], int]:
    """One training step under torch.profiler: (name, device microseconds) of each CUDA kernel it ran,
    and the number of aten ops it dispatched."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        runner.step(batch_size)
        synchronize(runner.device)
    events = prof.events()
    kernels = [(event.name, event.device_time if hasattr(event, "device_time") else event.cuda_time)
               for event in events if event.device_type == torch.autograd.DeviceType.CUDA]
    aten_ops = sum(1 for event in events
                   if event.device_type == torch.autograd.DeviceType.CPU and event.name.startswith("aten::"))
    return kernels, aten_ops

@dataclass
class PresetSweep:
    """Everything measured and predicted for one preset."""

    preset: str
    seq_len: int
    precision: str
    points: list[SweepPoint]
    predicted_step_s: dict[int, Optional[float]]
    predicted_memory_gib: dict[int, Optional[float]]
    predicted_max_batch: Optional[int]
    largest_fit: int
    first_oom: Optional[int]
    search_probes: int
    verdict: str
    note: str = ""

    def to_dict(self) -> dict:
        data = asdict(self)
        data["points"] = [dict(asdict(point), median_step_s=median_s(point.step_times_s) if point.ran else None,
                               predicted_step_s=self.predicted_step_s.get(point.batch_size),
                               predicted_memory_gib=self.predicted_memory_gib.get(point.batch_size),
                               relative_error=point_error(self, point))
                          for point in self.points]
        data["predicted_step_s"] = {str(key): value for key, value in self.predicted_step_s.items()}
        data["predicted_memory_gib"] = {str(key): value for key, value in self.predicted_memory_gib.items()}
        return data


def point_error(sweep: PresetSweep, point: SweepPoint) -> Optional[float]:
    """Signed relative error of the prediction at a point that ran (None otherwise)."""
    predicted_s = sweep.predicted_step_s.get(point.batch_size)
    if not point.ran or predicted_s is None:
        return None
    return relative_error(predicted_s, median_s(point.step_times_s))


def measure_preset(runner: StepRunner, batch_sizes: list[int], prediction: Prediction, warmup_steps: int,
                   timed_steps: int, search_max_batch: bool) -> tuple[list[SweepPoint], SearchResult, list[str]]:
    """The timed sweep, then (optionally) the probes for the largest batch; notes say what was cut short."""
    try:
        points = sweep_batches(batch_sizes, lambda batch: runner.timed_steps_s(batch, warmup_steps, timed_steps),
                               runner.release_memory)
        search = SearchResult(*sweep_bracket(points))
        if search_max_batch and search.largest_fit > 0 and not any(point.error for point in points):
            limit = max(4 * (prediction.max_batch_size() or 0), 2 * max(batch_sizes), 64)
            search = search_largest_fit(search.largest_fit, search.first_oom, runner.fits,
                                        min(limit, BATCH_SEARCH_LIMIT))
    finally:
        runner.release_memory()
    notes = [prediction.note]
    if search.stopped_by:
        notes.append(f"largest-batch search stopped at {search.largest_fit}: {search.stopped_by}")
    return points, search, [note for note in notes if note]


def run_preset_sweep(preset: str, dims: ModelDims, seq_len: int, precision: str, batch_sizes: list[int],
                     prediction: Prediction, device: torch.device, warmup_steps: int, timed_steps: int,
                     search_max_batch: bool) -> PresetSweep:
    """Time every batch size until OOM, pin down the largest batch that fits, and set the
    predictor's numbers beside them. The model is gone and the cache emptied on return."""
    points, search, notes = measure_preset(StepRunner(dims, seq_len, precision, device), batch_sizes, prediction,
                                           warmup_steps, timed_steps, search_max_batch)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    predicted_max = prediction.max_batch_size()
    return PresetSweep(
        preset=preset, seq_len=seq_len, precision=precision, points=points,
        predicted_step_s={point.batch_size: prediction.step_s(point.batch_size) for point in points},
        predicted_memory_gib={point.batch_size: prediction.memory_gib(point.batch_size) for point in points},
        predicted_max_batch=predicted_max, largest_fit=search.largest_fit, first_oom=search.first_oom,
        search_probes=search.probes, verdict=max_batch_verdict(predicted_max, search.largest_fit, search.first_oom),
        note="; ".join(notes))
