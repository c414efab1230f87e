"""Balancing policies: per-node local steps and batch sizes from step-time estimates.

Each policy is a function of ``PolicyInputs`` returning ``Assignment`` arrays
(one entry per node), so one call plans ten thousand nodes. The stateful part
(when to use measurements, hysteresis, deadlines) lives in planner.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from geodiloco.balancer.config import BalancingConfig
from geodiloco.balancer.estimates import StepTimeBank, UNLIMITED_BATCH, micro_batches
from geodiloco.predictor.online import CorrectionFit
from geodiloco.common.schema import ConfigError

# Outer-average weighting each policy recommends (the runtime uses it under ``weighting: auto``):
# equal work -> uniform; equal steps, unequal batches -> tokens; unequal steps -> normalized
# (each pseudo-gradient divided by its step count, so a node that ran more steps does not pull
# the average toward its own data and the outer step keeps its size).
POLICY_WEIGHTING = {
    "uniform": "uniform",
    "batch_by_flops": "tokens",
    "max_batch_by_memory": "tokens",
    "steps_by_flops": "normalized",
    "time": "normalized",
    "hybrid": "normalized",
    "adaptive": "normalized",
    "deadline": "normalized",
}
ASYNC_WEIGHTING = "tokens"
"""Weighting under ``weighting: auto`` in ``diloco.mode: async``, whatever the policy. The host applies each
pseudo-gradient alone, from a model pulled several updates before; ``normalized`` scales a node's update by
tau_eff / H_i of its share, so a node that ran few steps (a straggler under a time-balanced policy) counts many
times its tokens, and its stale update moved the model most. Measured (experiments/async/weighting.py, real
losses, virtual GPUs): ``tokens`` ended on a lower eval loss than ``normalized`` on both clusters tried
(results in experiments/results/async/weighting.md)."""


@dataclass
class PolicyInputs:
    """What a policy may look at: the run's baseline, the estimates and the outer-sync time."""

    config: BalancingConfig
    names: list
    base_steps: np.ndarray
    base_batch: np.ndarray
    seq_len: int
    comm_s: float
    bank: StepTimeBank
    calibration: CorrectionFit
    nominal_tflops: Callable[[], np.ndarray]
    hide_phase_s: float = 0.0
    """Shortest local phase that hides an overlapped sync (0 when the sync blocks)."""

    def step_s(self, batch_size: np.ndarray, micro_batch_size: np.ndarray) -> np.ndarray:
        """Estimated seconds per step of every node (its prior's two parts, each calibrated)."""
        return self.calibration.predict_s(*self.bank.prior_features(batch_size, micro_batch_size))

    def batch_cap(self) -> np.ndarray:
        """Largest batch per node: memory x gradient accumulation, and ``max_batch_size``."""
        cap = np.where(self.bank.max_micro >= UNLIMITED_BATCH, UNLIMITED_BATCH,
                       self.bank.max_micro * self.config.max_grad_accum)
        if self.config.max_batch_size is not None:
            cap = np.minimum(cap, self.config.max_batch_size)
        return np.maximum(cap, self.config.min_batch_size)


@dataclass
class Assignment:
    """Per-node decision arrays of one round."""

    local_steps: np.ndarray
    batch_size: np.ndarray
    micro_batch_size: np.ndarray


def half_up(values: np.ndarray) -> np.ndarray:
    """Round to the nearest integer, halves up (as the source paper's tables do)."""
    return np.floor(np.asarray(values, dtype=float) + 0.5).astype(np.int64)


def clip_steps(steps: np.ndarray, config: BalancingConfig) -> np.ndarray:
    upper = config.max_local_steps if config.max_local_steps is not None else np.iinfo(np.int64).max
    return np.clip(steps, config.min_local_steps, upper).astype(np.int64)


def clip_batch(batch: np.ndarray, config: BalancingConfig) -> np.ndarray:
    upper = config.max_batch_size if config.max_batch_size is not None else np.iinfo(np.int64).max
    return np.clip(batch, config.min_batch_size, upper).astype(np.int64)


PHASE_END_CANDIDATES = 16
HIDE_MARGIN = 0.05
"""An overlapped sync is hidden behind a phase 5 % longer than it, so jitter does not expose it."""


def fill_steps(step_s: np.ndarray, target_s: float, config: BalancingConfig,
               max_phase_s: Optional[float] = None) -> np.ndarray:
    """Whole local steps per node so every local phase ends as close to one moment as possible.

    First as many steps as fit in ``target_s``; that sets a phase end. Every node
    then takes the most steps that still end by the phase end, so each is left with
    less than one of its steps. Extending the phase to the end of some node's next
    step can waste less (the node that waited longest gets one more step while the
    others wait a little longer), so the phase end is chosen among the current one
    and the earliest next-step ends as the one with the smallest waiting share,
    never past ``max_phase_s`` (a hard round-time budget).
    """
    steps = clip_steps(np.floor(target_s / step_s + 1e-9), config)
    phase_s = float(np.max(steps * step_s))
    best_steps, best_share = None, np.inf
    next_ends = np.sort((np.floor(phase_s / step_s * (1 + 1e-12) + 1e-9) + 1) * step_s)
    if max_phase_s is not None:
        next_ends = next_ends[next_ends <= max_phase_s * (1 + 1e-12)]
    for candidate_s in np.concatenate(([phase_s], next_ends[:PHASE_END_CANDIDATES])):
        candidate = clip_steps(np.floor(candidate_s / step_s * (1 + 1e-12) + 1e-9), config)
        ends_s = candidate * step_s
        end_s = float(np.max(ends_s))
        share = float(np.sum(end_s - ends_s)) / (end_s * len(ends_s)) if end_s > 0 else 0.0
        if share < best_share - 1e-12:
            best_steps, best_share = candidate, share
    return best_steps


def stretch_for_network(phase_s: float, inputs: PolicyInputs) -> float:
    """Lengthen the local phase for the network: a blocking sync to at most ``max_comm_fraction``
    of the round; an overlapped one until it hides behind the phase, by at most
    ``max_phase_stretch`` x (past that the plan says what would hide it)."""
    fraction = inputs.config.max_comm_fraction
    if fraction is not None and inputs.comm_s > 0:
        phase_s = max(phase_s, inputs.comm_s * (1.0 - fraction) / fraction)
    if inputs.hide_phase_s > phase_s:
        phase_s = min(inputs.hide_phase_s * (1.0 + HIDE_MARGIN), phase_s * inputs.config.max_phase_stretch)
    return phase_s


def round_time_budget_s(inputs: PolicyInputs) -> Optional[float]:
    """Seconds of local phase left by ``round_time_s`` after the outer sync (None if not set)."""
    round_time_s = inputs.config.round_time_s
    if round_time_s is None:
        return None
    budget_s = round_time_s - inputs.comm_s
    if budget_s <= 0:
        raise ConfigError(f"balancing.round_time_s ({round_time_s:g} s) leaves no time for local steps: "
                          f"the outer sync alone takes {inputs.comm_s:.3g} s; raise round_time_s")
    return budget_s


def reference_phase_s(inputs: PolicyInputs, base_step_s: np.ndarray) -> float:
    """Local-phase length set by ``reference_node`` doing its baseline steps, or by ``round_time_s``."""
    budget_s = round_time_budget_s(inputs)
    if budget_s is not None:
        return stretch_for_network(budget_s, inputs)
    base_phase_s = inputs.base_steps * base_step_s
    reference = inputs.config.reference_node
    if reference == "slowest":
        phase_s = float(np.max(base_phase_s))
    elif reference == "fastest":
        phase_s = float(np.min(base_phase_s))
    else:
        phase_s = float(base_phase_s[inputs.names.index(reference)])
    return stretch_for_network(phase_s, inputs)


def _nominal_ratio(inputs: PolicyInputs) -> np.ndarray:
    tflops = inputs.nominal_tflops()
    return tflops / float(np.min(tflops))


def uniform(inputs: PolicyInputs) -> Assignment:
    """Baseline DiLoCo: the run's H and B everywhere (or each node's fixed override)."""
    batch = inputs.base_batch.copy()
    return Assignment(inputs.base_steps.copy(), batch, micro_batches(batch, inputs.bank.max_micro))


def batch_by_flops(inputs: PolicyInputs) -> Assignment:
    """Source paper's A: batch size x (node's mean nominal TFLOPS / the smallest)."""
    batch = clip_batch(np.maximum(1, half_up(inputs.base_batch * _nominal_ratio(inputs))), inputs.config)
    return Assignment(inputs.base_steps.copy(), batch, micro_batches(batch, inputs.bank.max_micro))


def max_batch_by_memory(inputs: PolicyInputs) -> Assignment:
    """Source paper's B: the largest batch that fits in memory (doubling from B, or exact)."""
    fits = inputs.bank.max_micro
    if np.any(fits >= UNLIMITED_BATCH) and inputs.config.max_batch_size is None:
        unknown = [name for name, value in zip(inputs.names, fits) if value >= UNLIMITED_BATCH]
        raise ConfigError(f"policy max_batch_by_memory needs a memory model, but nodes {', '.join(unknown[:5])} "
                          "have no gpus; list their gpus or set balancing.max_batch_size")
    if inputs.config.max_batch_size is not None:
        fits = np.minimum(fits, inputs.config.max_batch_size)
    base = inputs.base_batch
    if inputs.config.batch_search == "doubling":
        doublings = np.floor(np.log2(np.maximum(fits, 1) / base) + 1e-12)
        batch = np.where(fits >= base, base * np.power(2, np.maximum(doublings, 0)).astype(np.int64), base)
    else:
        batch = np.maximum(fits, base)
    batch = clip_batch(batch, inputs.config)
    return Assignment(inputs.base_steps.copy(), batch, micro_batches(batch, inputs.bank.max_micro))


def steps_by_flops(inputs: PolicyInputs) -> Assignment:
    """Source paper's C: local steps x (node's mean nominal TFLOPS / the smallest)."""
    steps = clip_steps(half_up(inputs.base_steps * _nominal_ratio(inputs)), inputs.config)
    batch = inputs.base_batch.copy()
    return Assignment(steps, batch, micro_batches(batch, inputs.bank.max_micro))


def time_balanced(inputs: PolicyInputs) -> Assignment:
    """Steps from estimated step times so every local phase lasts the same seconds."""
    batch = inputs.base_batch.copy()
    micro = micro_batches(batch, inputs.bank.max_micro)
    step_s = inputs.step_s(batch, micro)
    phase_s = reference_phase_s(inputs, step_s)
    budget_s = round_time_budget_s(inputs)
    steps = fill_steps(step_s, phase_s, inputs.config,
                       max_phase_s=None if budget_s is None else max(budget_s, phase_s))
    return Assignment(steps, batch, micro)


@dataclass
class _Candidates:
    """Per-node candidate batches (padded matrix) with their estimated step times."""

    batch: np.ndarray
    micro: np.ndarray
    step_s: np.ndarray
    valid: np.ndarray
    preferred: np.ndarray


def _group_candidates(inputs: PolicyInputs, group_id: int, cap: int, base_batch: int) -> tuple:
    """Efficient batches of one hardware group, their micro-batches, their (fixed, scaling) step seconds, and the
    preferred batch (closest to the baseline)."""
    bank, config = inputs.bank, inputs.config
    max_micro = int(bank.max_micro[bank.members[group_id][0]])
    cap = min(cap, max(config.min_batch_size, int(math.floor(base_batch * config.max_batch_factor))))
    batches = np.arange(config.min_batch_size, cap + 1, dtype=np.int64)
    micros = np.minimum(batches, max_micro)
    features_s = np.array([bank.group_features(group_id, batch, micro) for batch, micro in zip(batches, micros)])
    samples_per_s = batches / features_s.sum(axis=1)
    efficient = samples_per_s >= (1.0 - config.throughput_tolerance) * samples_per_s.max()
    distance = np.abs(np.log(batches / base_batch))
    preferred = int(batches[efficient][np.argmin(distance[efficient])])
    keep = efficient & (batches * 2 >= preferred) & (batches <= 2 * preferred)
    return batches[keep], micros[keep], features_s[keep], preferred


def _candidates(inputs: PolicyInputs) -> _Candidates:
    cap = inputs.batch_cap()
    rows = {}
    for group_id, members in enumerate(inputs.bank.members):
        for key in np.unique(np.stack([cap[members], inputs.base_batch[members]], axis=1), axis=0):
            rows[(group_id, int(key[0]), int(key[1]))] = _group_candidates(inputs, group_id, int(key[0]), int(key[1]))
    width = max(len(row[0]) for row in rows.values())
    num_nodes = len(inputs.names)
    batch = np.ones((num_nodes, width), dtype=np.int64)
    micro = np.ones((num_nodes, width), dtype=np.int64)
    fixed_s = np.zeros((num_nodes, width))
    scaling_s = np.full((num_nodes, width), np.inf)
    valid = np.zeros((num_nodes, width), dtype=bool)
    preferred = np.empty(num_nodes, dtype=np.int64)
    group_of = inputs.bank.group_index
    for (group_id, group_cap, group_base), (batches, micros, features_s, group_preferred) in rows.items():
        members = np.flatnonzero((group_of == group_id) & (cap == group_cap) & (inputs.base_batch == group_base))
        count = len(batches)
        batch[members, :count], micro[members, :count] = batches, micros
        fixed_s[members, :count], scaling_s[members, :count] = features_s[:, 0], features_s[:, 1]
        valid[members, :count] = True
        preferred[members] = group_preferred
    step_s = inputs.calibration.predict_s(fixed_s, scaling_s)
    return _Candidates(batch, micro, step_s, valid, preferred)


def _hybrid_phase_s(inputs: PolicyInputs, candidates: _Candidates) -> float:
    """``round_time_s`` if set; else the time to process ``tokens_per_round`` at the preferred
    batches; else the reference node's baseline steps at the baseline batch (as ``time``)."""
    tokens = inputs.config.tokens_per_round
    if inputs.config.round_time_s is not None or tokens is None:
        batch = inputs.base_batch
        return reference_phase_s(inputs, inputs.step_s(batch, micro_batches(batch, inputs.bank.max_micro)))
    column = np.argmax(candidates.batch == candidates.preferred[:, None], axis=1)
    rows = np.arange(len(column))
    samples_per_s = candidates.batch[rows, column] / candidates.step_s[rows, column]
    return stretch_for_network(tokens / inputs.seq_len / float(np.sum(samples_per_s)), inputs)


def _pick_pairs(candidates: _Candidates, phase_s: float, config: BalancingConfig) -> tuple:
    """Per node the (steps, batch) that leaves the least time unused before ``phase_s``."""
    steps = clip_steps(np.floor(phase_s / candidates.step_s + 1e-9), config)
    gap_s = np.where(candidates.valid, phase_s - steps * candidates.step_s, np.inf)
    gap_s = np.where(gap_s < -1e-9, np.abs(gap_s) + phase_s, gap_s)
    closeness = np.abs(np.log(candidates.batch / candidates.preferred[:, None]))
    best = np.argmin(gap_s + 1e-9 * closeness, axis=1)
    rows = np.arange(len(best))
    return steps[rows, best], candidates.batch[rows, best], candidates.micro[rows, best], candidates.step_s[rows, best]


def hybrid(inputs: PolicyInputs) -> Assignment:
    """Batch near each node's best throughput, steps to fill a shared phase, tokens near a target.

    The batch moves away from the baseline only where the baseline batch is
    more than ``throughput_tolerance`` below the node's best samples per
    second (fixed per-step costs); gradient accumulation extends the batch past
    memory up to ``max_grad_accum`` micro-batches. The phase length makes the
    round's tokens equal ``tokens_per_round`` if set; else it is the ``time``
    policy's phase (reference node, or ``round_time_s``). Batches stay within
    ``max_batch_factor`` x the baseline batch. Steps and batch are then chosen jointly per node
    (batches within a factor of 2 of the preferred one) so that whole steps
    end as close as possible to the shared moment.
    """
    candidates = _candidates(inputs)
    phase_s = _hybrid_phase_s(inputs, candidates)
    steps, batch, micro, step_s = _pick_pairs(candidates, phase_s, inputs.config)
    phase_s = float(np.max(steps * step_s))
    steps, batch, micro, step_s = _pick_pairs(candidates, phase_s, inputs.config)
    return Assignment(steps, batch, micro)


POLICIES: dict[str, Callable[[PolicyInputs], Assignment]] = {
    "uniform": uniform,
    "batch_by_flops": batch_by_flops,
    "max_batch_by_memory": max_batch_by_memory,
    "steps_by_flops": steps_by_flops,
    "time": time_balanced,
    "hybrid": hybrid,
}
