"""The one step-time rule: how long a node's config says its inner step takes at batch B.

Three readers use it, so they agree wherever they are meant to agree:

- ``lab.virtual_gpu`` pads every real step to it (what an emulated node does);
- the planner's prior for a node whose config declares its time (what the planner believes);
- ``geodiloco simulate``'s ground truth (what a simulated node does).

A node's *declared* time comes from ``emulate:``: ``step_time_s`` at a reference batch
(``emulate.batch_size``, else the run's baseline ``diloco.batch_size``), linear in the
batch with a batch-independent share ``fixed_fraction``; or ``gpu``: the predictor's
t(B) for those GPUs running ``emulate.model`` at ``emulate.seq_len``. Both are
multiplied by ``time_scale``. A node with ``emulate.cpu_share`` declares no time: its
steps take what the real model takes under its CPU quota.

A node's *measured* time (``measured:``, the simulator's truth only) is a curve through
``points`` (piecewise linear in B), a point with ``fixed_fraction`` (linear as above), or
one point scaled along the shape of a reference model (the planner's prior), documented
as the weakest of the three because it shares the planner's shape.

Slowdown events, jitter, stragglers and drift are applied by each reader on top of this
mean time; they are what makes the truth differ from the plan.
"""
from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence

import numpy as np

from geodiloco.balancer.cluster import EmulateSpec, MeasuredSpec, NodeSpec
from geodiloco.predictor.base import StepTimeModel
from geodiloco.predictor.online import prior_features

UNLIMITED_BATCH = sys.maxsize

GpuModelFactory = Callable[[list, Optional[str], Optional[int]], StepTimeModel]
"""(GPU names, emulated model preset or dims file or None = the run's, seq_len or None) -> t(B)."""


class LinearStepModel:
    """``step_time_s * (fixed_fraction + (1 - fixed_fraction) * B / batch_size)`` seconds per step.

    It holds no memory model: ``max_batch_size`` is ``max_batch`` or unlimited.
    """

    def __init__(self, step_time_s: float, batch_size: int, fixed_fraction: float = 0.0,
                 max_batch: Optional[int] = None) -> None:
        self.step_time_s = step_time_s
        self.batch_size = batch_size
        self.fixed_fraction = fixed_fraction
        self.max_batch = max_batch

    def predict(self, batch_size: int) -> float:
        share = self.fixed_fraction + (1.0 - self.fixed_fraction) * batch_size / self.batch_size
        return self.step_time_s * share

    def fixed_and_scaling_s(self, batch_size: int) -> tuple[float, float]:
        """(seconds that do not grow with the batch, seconds that do) of ``predict``."""
        fixed_s = self.step_time_s * self.fixed_fraction
        return fixed_s, self.predict(batch_size) - fixed_s

    def update(self, batch_size: int, step_time_s: float) -> None:
        """Rescale to the measured time at ``batch_size`` (keeps the fixed share)."""
        self.step_time_s *= step_time_s / self.predict(batch_size)

    def max_batch_size(self) -> int:
        return self.max_batch or UNLIMITED_BATCH


class CurveStepModel:
    """Seconds per step through measured ``(batch_size, step_time_s)`` points.

    Piecewise linear between points; beyond the last point it continues the last
    segment's slope (never below the last point's time per sample, so time keeps
    growing with the batch); below the first point it scales proportionally to B
    with the first segment's fixed share. A curve can have a knee no prior knows of.
    """

    def __init__(self, points: Sequence[tuple[int, float]]) -> None:
        ordered = sorted((int(batch), float(seconds)) for batch, seconds in points)
        self.batches = np.array([batch for batch, _ in ordered], dtype=float)
        self.seconds = np.array([seconds for _, seconds in ordered], dtype=float)

    def predict(self, batch_size: int) -> float:
        batch = float(batch_size)
        if len(self.batches) == 1:
            return float(self.seconds[0] * batch / self.batches[0])
        if batch <= self.batches[-1]:
            if batch >= self.batches[0]:
                return float(np.interp(batch, self.batches, self.seconds))
            slope = (self.seconds[1] - self.seconds[0]) / (self.batches[1] - self.batches[0])
            fixed_s = max(0.0, self.seconds[0] - slope * self.batches[0])
            return float(fixed_s + (self.seconds[0] - fixed_s) * batch / self.batches[0])
        slope = (self.seconds[-1] - self.seconds[-2]) / (self.batches[-1] - self.batches[-2])
        slope = max(slope, self.seconds[-1] / self.batches[-1])
        return float(self.seconds[-1] + slope * (batch - self.batches[-1]))

    def update(self, batch_size: int, step_time_s: float) -> None:
        """Rescale the whole curve to a measured time at ``batch_size``."""
        self.seconds = self.seconds * (step_time_s / self.predict(batch_size))

    def max_batch_size(self) -> int:
        return UNLIMITED_BATCH


class ScaledStepModel:
    """A step-time model whose times are multiplied by ``time_scale`` (emulate.time_scale)."""

    def __init__(self, inner: StepTimeModel, time_scale: float) -> None:
        self.inner = inner
        self.time_scale = time_scale

    def predict(self, batch_size: int) -> float:
        return self.inner.predict(batch_size) * self.time_scale

    def fixed_and_scaling_s(self, batch_size: int) -> tuple[float, float]:
        """The inner model's split, scaled like ``predict``."""
        fixed_s, scaling_s = prior_features(self.inner, batch_size)
        return fixed_s * self.time_scale, scaling_s * self.time_scale

    def update(self, batch_size: int, step_time_s: float) -> None:
        self.inner.update(batch_size, step_time_s / self.time_scale)

    def max_batch_size(self) -> int:
        return self.inner.max_batch_size()


def predictor_gpu_model(dims, seq_len: int, precision: str) -> GpuModelFactory:
    """The predictor's t(B) for (GPU names, emulated model or None = ``dims``, seq_len or None = ``seq_len``)."""

    def factory(gpus: list, model: Optional[str], emulated_seq_len: Optional[int]) -> StepTimeModel:
        from geodiloco.predictor.model import node_step_model
        from geodiloco.predictor.workload import resolve_dims
        emulated_dims = resolve_dims(model) if model else dims
        return node_step_model(list(gpus), emulated_dims, emulated_seq_len or seq_len, precision=precision)

    return factory


def reference_batch(emulate: EmulateSpec, base_batch_size: int) -> int:
    """The batch ``emulate.step_time_s`` is given at: ``emulate.batch_size``, else the run's baseline."""
    return emulate.batch_size or base_batch_size


def declared_key(emulate: Optional[EmulateSpec], node_gpus: Sequence[str], base_batch_size: int) -> Optional[tuple]:
    """A hashable identity of a node's declared t(B) (nodes with equal keys share one model), or None."""
    if emulate is None or emulate.cpu_share is not None:
        return None
    if emulate.step_time_s is not None:
        return ("linear", emulate.step_time_s * emulate.time_scale, reference_batch(emulate, base_batch_size),
                emulate.fixed_fraction)
    return ("gpu", tuple(emulate.gpu_names(list(node_gpus))), emulate.model, emulate.seq_len, emulate.time_scale)


def declared_step_model(emulate: Optional[EmulateSpec], node_gpus: Sequence[str], base_batch_size: int,
                        gpu_model: GpuModelFactory) -> Optional[StepTimeModel]:
    """Mean seconds per step the config declares for a node (before slowdowns and noise), or None.

    None when the node is not emulated or runs real compute (``emulate.cpu_share``).
    """
    if emulate is None or emulate.cpu_share is not None:
        return None
    if emulate.step_time_s is not None:
        return LinearStepModel(emulate.step_time_s * emulate.time_scale, reference_batch(emulate, base_batch_size),
                               emulate.fixed_fraction)
    model = gpu_model(emulate.gpu_names(list(node_gpus)), emulate.model, emulate.seq_len)
    return ScaledStepModel(model, emulate.time_scale) if emulate.time_scale != 1.0 else model


def measured_step_model(measured: MeasuredSpec, shape: Optional[StepTimeModel]) -> StepTimeModel:
    """The simulator's truth from ``measured:``: a curve, a linear rule, or one point along ``shape``."""
    if measured.points:
        return CurveStepModel([(point.batch_size, point.step_time_s) for point in measured.points])
    if measured.fixed_fraction is not None or shape is None:
        return LinearStepModel(measured.step_time_s, measured.batch_size, measured.fixed_fraction or 0.0)
    return ScaledStepModel(shape, measured.step_time_s / shape.predict(measured.batch_size))


def truth_source(node: NodeSpec) -> str:
    """Where ``geodiloco simulate`` takes a node's true step time from (shown in its output)."""
    if node.measured is not None:
        return "measured"
    if node.emulate is not None and node.emulate.cpu_share is None:
        return "emulate"
    return "prior x model_error"
