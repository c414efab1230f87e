"""Step-time estimates for many nodes at once: spec priors grouped by hardware, plus calibration.

Nodes with the same GPUs share one prior step-time model (a ``StepTimeModel``
from the predictor), so ten thousand nodes of a few kinds cost a few model
calls. Each node then has its own calibration, two corrections of its prior
(the part of a step that does not grow with the batch, and the part that does),
learned from the rounds it finished; estimates are ``w_fixed x fixed_s +
w_scaling x scaling_s``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.step_time import UNLIMITED_BATCH, LinearStepModel, ScaledStepModel, declared_key, declared_step_model
from geodiloco.predictor.base import StepTimeModel
from geodiloco.predictor.online import PRIOR_COVARIANCE, CorrectionFit, fit_corrections, prior_features
from geodiloco.common.schema import ConfigError

CALIBRATION_HISTORY = 32
"""Rounds of each node kept for its calibration (older ones weigh ~nothing at the default half-life)."""
ROUND_NOISE = 0.01
"""Relative noise assumed of one round's median step time before three rounds give residuals."""

ModelFactory = Callable[[list, Optional[int]], StepTimeModel]
"""(gpu names of one node, micro_batch_size or None) -> that node's step-time model."""


def micro_batches(batch_size: np.ndarray, max_micro: np.ndarray) -> np.ndarray:
    """Micro-batch per node: the whole batch if it fits in memory, else the largest that fits."""
    return np.minimum(batch_size, max_micro)


def prior_gpus(node: NodeSpec) -> list[str]:
    """GPU names the planner may know about a node: its ``gpus``, else its ``emulate.gpu``."""
    if node.gpus:
        return list(node.gpus)
    if node.emulate is not None and node.emulate.gpu not in (None, "from_gpus"):
        gpu = node.emulate.gpu
        return [gpu] if isinstance(gpu, str) else list(gpu)
    return []


@dataclass
class NodeGroup:
    """Nodes that share one prior: the same GPUs (and emulated workload), or the same declared step time.

    ``workload`` = (model preset or file, seq_len) of an ``emulate.gpu`` node, whose
    steps follow that workload's time scaled by ``time_scale``; empty = the run's model.
    """

    gpus: tuple
    linear: Optional[LinearStepModel]
    workload: tuple = ()
    time_scale: float = 1.0
    models: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)


class StepTimeBank:
    """Prior step times of every node, evaluated for arrays of batch sizes.

    ``memory_headroom`` (fraction) is kept free below each model's ``max_batch_size``.
    """

    def __init__(self, nodes: Sequence[NodeSpec], model_factory: ModelFactory,
                 memory_headroom: float = 0.0,
                 workload_factory: Optional[Callable[[Optional[str], Optional[int]], ModelFactory]] = None,
                 base_batch_size: int = 1) -> None:
        self.names = [node.name for node in nodes]
        self.base_batch_size = base_batch_size
        self.model_factory = model_factory
        self.workload_factory = workload_factory
        self.groups: list[NodeGroup] = []
        keys: dict = {}
        group_index = np.empty(len(nodes), dtype=np.int64)
        for position, node in enumerate(nodes):
            key, group = self._group_for(node)
            if key not in keys:
                keys[key] = len(self.groups)
                self.groups.append(group)
            group_index[position] = keys[key]
        self.group_index = group_index
        self.members = [np.flatnonzero(group_index == g) for g in range(len(self.groups))]
        self.max_micro = self._max_micro(memory_headroom)

    def _group_for(self, node: NodeSpec) -> tuple:
        """The prior a node is planned with, in the order a real run would know it.

        An ``emulate.gpu`` node runs at the predictor's time for its emulated GPUs and
        workload; otherwise the node's ``gpus``, at the workload its declared ``step_time_s`` was
        measured on where ``emulate.model``/``emulate.seq_len`` name it, else at the run's model; a node with only
        ``emulate.step_time_s`` at that declared time (the rule of :mod:`balancer.step_time`,
        reference batch ``emulate.batch_size`` or the run's baseline); a node with neither
        (or only ``emulate.cpu_share``: real compute) is planned as this CPU.
        """
        emulate = node.emulate
        names_workload = emulate is not None and (emulate.model is not None or emulate.seq_len is not None)
        if emulate is not None and (emulate.gpu is not None or (node.gpus and names_workload)):
            gpus = tuple(emulate.gpu_names(node.gpus)) if emulate.gpu is not None else tuple(node.gpus)
            workload = (emulate.model, emulate.seq_len)
            key = ("emulated", gpus, workload, emulate.time_scale)
            return key, NodeGroup(gpus=gpus, linear=None, workload=workload, time_scale=emulate.time_scale)
        if node.gpus:
            return ("gpus", tuple(node.gpus)), NodeGroup(gpus=tuple(node.gpus), linear=None)
        if emulate is not None and emulate.step_time_s is not None:
            key = declared_key(emulate, node.gpus, self.base_batch_size)
            return key, NodeGroup(gpus=(), linear=declared_step_model(emulate, node.gpus, self.base_batch_size,
                                                                       gpu_model=None))
        return ("gpus", ()), NodeGroup(gpus=(), linear=None)

    def model(self, group_id: int, micro_batch_size: Optional[int] = None) -> StepTimeModel:
        """The group's prior model (``micro_batch_size`` None = whole batch in one pass)."""
        group = self.groups[group_id]
        if group.linear is not None:
            return group.linear
        if micro_batch_size not in group.models:
            factory = self.model_factory
            if group.workload and self.workload_factory is not None:
                factory = self.workload_factory(*group.workload)
            model = factory(list(group.gpus), micro_batch_size)
            group.models[micro_batch_size] = (ScaledStepModel(model, group.time_scale)
                                              if group.time_scale != 1.0 else model)
        return group.models[micro_batch_size]

    def _named(self, group_id: int, err: ConfigError) -> ConfigError:
        """``err`` of a group's model, prefixed with the nodes it plans (the error names only the GPU)."""
        names = [self.names[position] for position in self.members[group_id]]
        return ConfigError(f"node{'s' if len(names) > 1 else ''} {', '.join(names)}: {err}")

    def _max_micro(self, memory_headroom: float) -> np.ndarray:
        per_group = []
        for group_id in range(len(self.groups)):
            try:
                fits = self.model(group_id).max_batch_size()
                if fits < 1:
                    self.model(group_id).predict(1)  # raises the model's own reason: the node fits no sample
            except ConfigError as err:
                raise self._named(group_id, err) from None
            if fits >= UNLIMITED_BATCH:
                per_group.append(UNLIMITED_BATCH)
            else:
                per_group.append(max(1, int(math.floor(fits * (1.0 - memory_headroom)))))
        return np.asarray(per_group, dtype=np.int64)[self.group_index]

    def group_features(self, group_id: int, batch_size: int, micro_batch_size: int) -> tuple[float, float]:
        """Prior (fixed_s, scaling_s) of one group at (batch, micro-batch), cached; they sum to the prior."""
        group = self.groups[group_id]
        key = ("split", int(batch_size), int(micro_batch_size))
        if key not in group.cache:
            micro = None if micro_batch_size >= batch_size else int(micro_batch_size)
            try:
                group.cache[key] = prior_features(self.model(group_id, micro), int(batch_size))
            except ConfigError as err:
                raise self._named(group_id, err) from None
        return group.cache[key]

    def prior_features(self, batch_size: np.ndarray, micro_batch_size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prior (fixed_s, scaling_s) of every node at its (batch, micro-batch)."""
        batch_size = np.broadcast_to(np.asarray(batch_size, dtype=np.int64), self.group_index.shape)
        micro_batch_size = np.broadcast_to(np.asarray(micro_batch_size, dtype=np.int64), self.group_index.shape)
        features = np.empty(self.group_index.shape + (2,), dtype=float)
        pair_key = (batch_size << 32) | micro_batch_size
        for group_id, members in enumerate(self.members):
            unique_keys, inverse = np.unique(pair_key[members], return_inverse=True)
            values = np.array([self.group_features(group_id, key >> 32, key & 0xFFFFFFFF) for key in unique_keys])
            features[members] = values[inverse]
        return features[:, 0], features[:, 1]

    def prior_step_s(self, batch_size: np.ndarray, micro_batch_size: np.ndarray) -> np.ndarray:
        """Prior seconds per step of every node at its (batch, micro-batch)."""
        fixed_s, scaling_s = self.prior_features(batch_size, micro_batch_size)
        return fixed_s + scaling_s


class Calibration:
    """Per-node corrections (w_fixed, w_scaling) of the prior, learned from measured rounds.

    The fit is :func:`predictor.online.fit_corrections`, the same online model the
    predictor publishes its warm accuracy for: a node that ran at two batch sizes
    has the shape of its t(B) learned, not only its scale. Rounds weigh less with
    age (``alpha`` = weight of the newest round, as an exponential average:
    half-life ln 0.5 / ln(1 - alpha) rounds). A node whose step time at an
    unchanged (batch, micro-batch) moved by more than ``change_threshold``
    (relative) really changed speed: its older rounds are dropped.
    """

    def __init__(self, num_nodes: int, alpha: float = 0.5, change_threshold: float = 0.1,
                 history: int = CALIBRATION_HISTORY) -> None:
        self.alpha = alpha
        self.change_threshold = change_threshold
        self.half_life_rounds = math.log(0.5) / math.log(1.0 - alpha) if alpha < 1.0 else 1e-3
        shape = (num_nodes, history)
        self.fixed_s, self.scaling_s, self.step_s = np.zeros(shape), np.zeros(shape), np.ones(shape)
        self.order = np.zeros(shape)
        self.valid = np.zeros(shape, dtype=bool)
        self.count = np.zeros(num_nodes, dtype=np.int64)
        self.weights = np.ones((num_nodes, 2))
        self.covariance = np.broadcast_to(PRIOR_COVARIANCE, (num_nodes, 2, 2)).copy()
        self.noise = np.full(num_nodes, ROUND_NOISE)

    @property
    def seen(self) -> np.ndarray:
        return self.valid.any(axis=1)

    def update(self, node_index: np.ndarray, measured_step_s: np.ndarray, fixed_s: np.ndarray,
               scaling_s: np.ndarray) -> None:
        """Add one measured round (seconds per step) per listed node, with the prior's split at its batch."""
        node_index = np.asarray(node_index, dtype=np.int64)
        measured = np.asarray(measured_step_s, dtype=float)
        fixed_s, scaling_s = np.asarray(fixed_s, dtype=float), np.asarray(scaling_s, dtype=float)
        changed = self._changed_speed(node_index, measured, fixed_s, scaling_s)
        self.valid[node_index[changed]] = False
        slot = self.count[node_index] % self.valid.shape[1]
        for column, values in ((self.fixed_s, fixed_s), (self.scaling_s, scaling_s), (self.step_s, measured),
                               (self.order, self.count[node_index].astype(float))):
            column[node_index, slot] = values
        self.valid[node_index, slot] = True
        self.count[node_index] += 1
        self._refit(node_index)

    def _changed_speed(self, node_index: np.ndarray, measured: np.ndarray, fixed_s: np.ndarray,
                       scaling_s: np.ndarray) -> np.ndarray:
        """Nodes whose newest round at the same prior split differs from ``measured`` by > the threshold."""
        same = (self.valid[node_index] & np.isclose(self.fixed_s[node_index], fixed_s[:, None], rtol=1e-9)
                & np.isclose(self.scaling_s[node_index], scaling_s[:, None], rtol=1e-9))
        newest = np.argmax(np.where(same, self.order[node_index], -1.0), axis=1)
        previous = self.step_s[node_index, newest]
        return same.any(axis=1) & (np.abs(measured / previous - 1.0) > self.change_threshold)

    def _refit(self, node_index: np.ndarray) -> None:
        newest = (self.count[node_index] - 1).astype(float)[:, None]
        recency = 0.5 ** ((newest - self.order[node_index]) / self.half_life_rounds)
        fit = fit_corrections(self.fixed_s[node_index], self.scaling_s[node_index], self.step_s[node_index],
                              recency, self.valid[node_index], default_noise=ROUND_NOISE)
        self.weights[node_index], self.covariance[node_index], self.noise[node_index] = (
            fit.weights, fit.covariance, fit.noise)

    def fitted(self, rows: Optional[np.ndarray] = None) -> CorrectionFit:
        """The current fit of every node (or of ``rows``)."""
        rows = slice(None) if rows is None else rows
        return CorrectionFit(self.weights[rows], self.covariance[rows], self.noise[rows])

    def take(self, other: "Calibration", positions: np.ndarray) -> None:
        """Copy ``other``'s state of the nodes at ``positions`` into this (smaller) calibration."""
        for name in ("fixed_s", "scaling_s", "step_s", "order", "valid", "count", "weights", "covariance", "noise"):
            getattr(self, name)[:] = getattr(other, name)[positions]
