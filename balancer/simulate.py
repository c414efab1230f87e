"""Discrete-event simulation of outer rounds: no processes, every node at once with numpy.

Per round: the planner plans (seeing only its prior and the rounds already
finished), every node runs its local phase with its *true* step time, the outer
sync starts when the last node is done and takes the network model's time, and
the planner then sees each node's mean step time.

The truth comes from a different code path than the planner's prior
(:class:`GroundTruth`): the cluster file's ``measured:`` curve or point, else the
node's declared ``emulate:`` time (:mod:`balancer.step_time`, the rule the virtual
GPUs pad to), else, for nodes that declare nothing, the prior off by a per-node
log-normal ``model_error`` (the one case that shares the prior's shape). On top of
the mean: per-step jitter, occasional stragglers (a step ``straggler_factor`` x
slower with probability ``straggler_prob``), a slow multiplicative drift per round,
and slowdown events.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np
import yaml

from geodiloco.balancer.cluster import NodeSpec, SlowdownEvent
from geodiloco.balancer.config import SimulationConfig
from geodiloco.balancer.estimates import StepTimeBank
from geodiloco.balancer.network import OuterSyncModel
from geodiloco.balancer.planner import Planner
from geodiloco.balancer.records import IdleRecord, append_records
from geodiloco.balancer.step_time import (GpuModelFactory, declared_key, declared_step_model, measured_step_model,
                                predictor_gpu_model, truth_source)
from geodiloco.common.schema import ConfigError

NOISE_WINDOW_SIGMAS = 6.0
STRAGGLER_WINDOW_SIGMAS = 3.0
"""Stragglers widen the window of single steps drawn around the deadline by this many standard
deviations of their summed extra time (a node whose crossing falls outside stops at the window's end)."""


@dataclass(frozen=True)
class Slowdown:
    """Extra slowdown for a scenario: ``node`` runs ``factor`` x slower from ``from_round`` on."""

    node: str
    from_round: int
    factor: float
    until_round: Optional[int] = None


class GroundTruth:
    """True mean seconds per step of every node, by batch size, before slowdowns, drift and noise.

    ``sources[i]`` says where node i's truth comes from: ``measured``, ``emulate`` or
    ``prior x model_error``. Nodes with equal truths share one model and cache.
    """

    def __init__(self, nodes: Sequence[NodeSpec], bank: StepTimeBank, settings: SimulationConfig,
                 base_batch_size: int, gpu_model: GpuModelFactory, rng: np.random.Generator) -> None:
        self.bank = bank
        count = len(nodes)
        self.sources = [truth_source(node) for node in nodes]
        self.factor = np.exp(settings.model_error * rng.standard_normal(count))
        self.noise = np.full(count, settings.step_noise)
        self.model_index = np.full(count, -1, dtype=np.int64)
        self.models: list = []
        self._cache: list[dict] = []
        keys: dict = {}
        for position, node in enumerate(nodes):
            self.noise[position] = node_noise(node, settings.step_noise)
            key, build = self._truth_for(position, node, base_batch_size, gpu_model)
            if key is None:
                continue
            if key not in keys:
                keys[key] = len(self.models)
                self.models.append(build())
                self._cache.append({})
            self.model_index[position] = keys[key]
            self.factor[position] = 1.0

    def _truth_for(self, position: int, node: NodeSpec, base_batch_size: int, gpu_model: GpuModelFactory):
        """(key, builder) of a node's own truth model, or (None, None) for prior x model_error."""
        if node.measured is not None:
            group_id = int(self.bank.group_index[position])
            key = ("measured", node.measured.model_dump_json(), group_id)
            return key, lambda: measured_step_model(node.measured, self.bank.model(group_id))
        key = declared_key(node.emulate, node.gpus, base_batch_size)
        if key is None:
            return None, None
        return key, lambda: declared_step_model(node.emulate, node.gpus, base_batch_size, gpu_model)

    def _model_step_s(self, model_id: int, batch_size: int) -> float:
        cache = self._cache[model_id]
        if batch_size not in cache:
            cache[batch_size] = float(self.models[model_id].predict(int(batch_size)))
        return cache[batch_size]

    def step_s(self, batch_size: np.ndarray, micro_batch_size: np.ndarray) -> np.ndarray:
        """True mean seconds per step at (batch, micro-batch), before slowdowns, drift and noise."""
        step_s = self.bank.prior_step_s(batch_size, micro_batch_size) * self.factor
        batch_size = np.broadcast_to(np.asarray(batch_size, dtype=np.int64), self.model_index.shape)
        own = np.flatnonzero(self.model_index >= 0)
        if len(own):
            pairs = (self.model_index[own] << 32) | batch_size[own]
            unique_pairs, inverse = np.unique(pairs, return_inverse=True)
            values = np.array([self._model_step_s(int(pair >> 32), int(pair & 0xFFFFFFFF)) for pair in unique_pairs])
            step_s[own] = values[inverse]
        return step_s


def node_noise(node: NodeSpec, default: float) -> float:
    """Relative per-step spread: a measured trace's, else a virtual GPU's ``jitter``, else ``default``."""
    measured, emulate = node.measured, node.emulate
    if measured is not None and measured.trace_s and len(measured.trace_s) > 1:
        return float(np.std(measured.trace_s) / np.mean(measured.trace_s))
    if emulate is not None and not emulate.real_compute:
        return emulate.jitter
    return default


def drift_matrix(rounds: int, count: int, drift_per_round: float, rng: np.random.Generator) -> np.ndarray:
    """Slow multiplicative drift per (round, node): a log-normal random walk starting at 1."""
    if drift_per_round == 0 or rounds == 0:
        return np.ones((rounds, count))
    steps = drift_per_round * rng.standard_normal((rounds, count))
    steps[0] = 0.0
    return np.exp(np.cumsum(steps, axis=0))


def slowdown_matrix(nodes: Sequence[NodeSpec], rounds: int, extra: Sequence[Slowdown] = ()) -> np.ndarray:
    """Slowdown factor per (round, node): the nodes' ``emulate.slowdown`` and the scenario's."""
    factors = np.ones((rounds, len(nodes)))
    index = {node.name: position for position, node in enumerate(nodes)}
    events = [(index[node.name], event) for node in nodes if node.emulate is not None
              for event in node.emulate.slowdown]
    for item in extra:
        if item.node not in index:
            known = ", ".join(list(index)[:10])
            raise ConfigError(f"slowdown for unknown node {item.node!r}; nodes: {known}")
        events.append((index[item.node], SlowdownEvent(from_round=item.from_round, factor=item.factor,
                                                       until_round=item.until_round)))
    for position, event in events:
        until = rounds if event.until_round is None else min(event.until_round, rounds)
        factors[event.from_round:until, position] *= event.factor
    return factors


@dataclass(frozen=True)
class Stragglers:
    """A step is ``U(low, high)`` x slower with probability ``prob`` (a preempted kernel, a GC pause, I/O)."""

    prob: float = 0.0
    low: float = 2.0
    high: float = 5.0

    @property
    def mean_extra(self) -> float:
        """Mean extra time of one straggler step, in mean steps."""
        return (self.low + self.high) / 2 - 1.0

    @property
    def var_extra(self) -> float:
        return (self.high - self.low) ** 2 / 12

    def extra_steps(self, steps: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Extra time of ``steps`` steps, in units of one mean step (sum over the stragglers among them)."""
        if self.prob == 0:
            return np.zeros(len(steps))
        count = rng.binomial(np.asarray(steps, dtype=np.int64), self.prob)
        spread = np.sqrt(count * self.var_extra) * rng.standard_normal(len(steps))
        return np.maximum(count * self.mean_extra + spread, count * (self.low - 1.0))

    def extra_std(self, steps: np.ndarray) -> np.ndarray:
        """Standard deviation of ``extra_steps`` for ``steps`` steps (in mean steps)."""
        second_moment = self.mean_extra ** 2 + self.var_extra
        return np.sqrt(steps * self.prob * (second_moment - self.prob * self.mean_extra ** 2))

    def step_factors(self, shape: tuple, rng: np.random.Generator) -> np.ndarray:
        """Per-step multiplier: 1, or ``U(low, high)`` for a straggler."""
        if self.prob == 0:
            return np.ones(shape)
        slow = rng.random(shape) < self.prob
        return np.where(slow, rng.uniform(self.low, self.high, shape), 1.0)


NO_STRAGGLERS = Stragglers()


def run_fixed_steps(step_s: np.ndarray, steps: np.ndarray, noise: np.ndarray,
                    rng: np.random.Generator, stragglers: Stragglers = NO_STRAGGLERS) -> np.ndarray:
    """Seconds for ``steps`` steps with independent normal per-step noise and stragglers."""
    total_s = step_s * (steps + noise * np.sqrt(steps) * rng.standard_normal(len(steps))
                        + stragglers.extra_steps(steps, rng))
    return np.maximum(total_s, 1e-3 * step_s * steps)


def run_until_deadline(step_s: np.ndarray, cap: np.ndarray, deadline_s: float, noise: np.ndarray,
                       rng: np.random.Generator,
                       stragglers: Stragglers = NO_STRAGGLERS) -> tuple[np.ndarray, np.ndarray]:
    """Steps done and seconds spent when each node stops before its next step would pass the deadline.

    Exact in distribution without drawing every step: the sum of the first
    ``k0`` steps (well before the expected crossing) is one draw, then a short
    window of single steps around the deadline is drawn one by one.
    """
    expected = np.minimum(deadline_s / step_s, cap)
    spread = NOISE_WINDOW_SIGMAS * noise * np.sqrt(np.maximum(expected, 1.0))
    spread = spread + STRAGGLER_WINDOW_SIGMAS * stragglers.extra_std(np.maximum(expected, 1.0))
    head = np.clip(np.floor(expected - spread - 2), 0, cap).astype(np.int64)
    head_s = step_s * (head + noise * np.sqrt(head) * rng.standard_normal(len(head))
                       + stragglers.extra_steps(head, rng))
    width = int(np.max(np.minimum(cap - head, np.ceil(2 * spread) + 4)))
    width = max(width, 1)
    jitter = np.maximum(1.0 + noise[:, None] * rng.standard_normal((len(head), width)), 1e-3)
    steps_s = step_s[:, None] * jitter * stragglers.step_factors((len(head), width), rng)
    elapsed_s = head_s[:, None] + np.cumsum(steps_s, axis=1)
    within_cap = (head[:, None] + np.arange(1, width + 1)[None, :]) <= cap[:, None]
    fits = (elapsed_s <= deadline_s) & within_cap
    extra = np.sum(np.cumprod(fits, axis=1), axis=1)
    done = head + extra
    rows = np.arange(len(head))
    spent_s = np.where(extra > 0, elapsed_s[rows, np.maximum(extra - 1, 0)], head_s)
    first_step = done == 0
    spent_s = np.where(first_step, steps_s[:, 0], spent_s)
    return np.maximum(done, 1), spent_s


@dataclass
class SimulationResult:
    """Per (round, node) arrays of a simulated run; seconds, tokens, steps actually done."""

    policy: str
    weighting: str
    seq_len: int
    nodes: list
    local_steps: np.ndarray
    batch_size: np.ndarray
    tokens: np.ndarray
    compute_s: np.ndarray
    wait_s: np.ndarray
    comm_s: np.ndarray
    round_start: np.ndarray
    round_end: np.ndarray
    predicted_compute_s: np.ndarray
    predicted_idle_s: np.ndarray
    plans: list = field(default_factory=list)
    comm_hidden_s: Optional[np.ndarray] = None
    """Sync seconds overlapped with compute (``diloco.overlap``), per round and node; not idle."""
    sync_bytes: int = 0
    """Bytes each node sends in one round's outer sync (a ring all-reduce of the encoded model)."""

    def __post_init__(self) -> None:
        if self.comm_hidden_s is None:
            self.comm_hidden_s = np.zeros_like(self.comm_s)

    @property
    def rounds(self) -> int:
        return self.compute_s.shape[0]

    @property
    def idle_s(self) -> np.ndarray:
        return self.wait_s + self.comm_s

    @property
    def wall_s(self) -> float:
        return float(self.round_end[-1] - self.round_start[0]) if self.rounds else 0.0

    def summary(self) -> dict:
        """The JSON shape of ``geodiloco simulate --json`` (totals over all rounds, seconds)."""
        per_node = []
        for i, node in enumerate(self.nodes):
            per_node.append({
                "name": node.name, "site": node.site,
                "local_steps": int(self.local_steps[-1, i]), "batch_size": int(self.batch_size[-1, i]),
                "steps_total": int(self.local_steps[:, i].sum()), "tokens": int(self.tokens[:, i].sum()),
                "predicted_compute_s": float(self.predicted_compute_s[:, i].sum()),
                "predicted_idle_s": float(self.predicted_idle_s[:, i].sum()),
                "compute_s": float(self.compute_s[:, i].sum()), "wait_s": float(self.wait_s[:, i].sum()),
                "comm_s": float(self.comm_s[:, i].sum()), "idle_s": float(self.idle_s[:, i].sum()),
                "comm_hidden_s": float(self.comm_hidden_s[:, i].sum()),
            })
        tokens = int(self.tokens.sum())
        return {
            "policy": self.policy, "weighting": self.weighting, "rounds": self.rounds, "nodes": per_node,
            **self.gpu_time_totals(),
            "predicted_idle_s": float(self.predicted_idle_s.sum()), "compute_s": float(self.compute_s.sum()),
            "wait_s": float(self.wait_s.sum()), "comm_s": float(self.comm_s.sum()),
            "idle_s": float(self.idle_s.sum()), "comm_hidden_s": float(self.comm_hidden_s.sum()),
            "sync_bytes_per_round": self.sync_bytes, "tokens": tokens, "wall_s": self.wall_s,
            "tokens_per_round": tokens / max(self.rounds, 1),
            "tokens_per_hour": tokens / self.wall_s * 3600.0 if self.wall_s > 0 else 0.0,
        }

    def gpu_time_totals(self) -> dict:
        """GPU-seconds (a node's seconds times its GPUs, as the run report weighs them) of the whole simulation:
        all GPU time, its idle part (waiting for peers + exposed sync) and those two apart, and the idle share."""
        gpus = np.array([node.num_gpus for node in self.nodes], dtype=float)
        gpu_wait_s = float((self.wait_s * gpus).sum())
        gpu_sync_s = float((self.comm_s * gpus).sum())
        gpu_s = float(((self.compute_s + self.idle_s) * gpus).sum())
        gpu_idle_s = float((self.idle_s * gpus).sum())
        return {"gpu_s": gpu_s, "gpu_idle_s": gpu_idle_s, "gpu_wait_s": gpu_wait_s, "gpu_sync_s": gpu_sync_s,
                "gpu_idle_share": gpu_idle_s / gpu_s if gpu_s > 0 else 0.0}

    def idle_records(self, run_id: str) -> Iterator[IdleRecord]:
        """One IdleRecord per node per round, as the runtime's tracker writes them."""
        for round_idx in range(self.rounds):
            for i, node in enumerate(self.nodes):
                yield IdleRecord(
                    run_id=run_id, round=round_idx, node=node.name, site=node.site, policy=self.policy,
                    local_steps=int(self.local_steps[round_idx, i]), batch_size=int(self.batch_size[round_idx, i]),
                    tokens=int(self.tokens[round_idx, i]), compute_s=float(self.compute_s[round_idx, i]),
                    wait_s=float(self.wait_s[round_idx, i]), comm_s=float(self.comm_s[round_idx, i]),
                    comm_hidden_s=float(self.comm_hidden_s[round_idx, i]), sync_bytes=self.sync_bytes,
                    round_start=float(self.round_start[round_idx]), round_end=float(self.round_end[round_idx]),
                    gpus=list(node.gpus), num_gpus=node.num_gpus, source="simulate")

    def write(self, out_dir: str | Path, run_id: str, config: Optional[dict] = None) -> Path:
        """Write ``idle.jsonl``, ``plan.jsonl`` and ``config.yaml`` into ``out_dir`` (replacing old ones)."""
        directory = Path(out_dir)
        directory.mkdir(parents=True, exist_ok=True)
        idle_path = directory / "idle.jsonl"
        idle_path.unlink(missing_ok=True)
        append_records(idle_path, self.idle_records(run_id))
        with open(directory / "plan.jsonl", "w", encoding="utf-8") as handle:
            for plan in self.plans:
                handle.write(plan.to_json() + "\n")
        if config is not None:
            (directory / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        return directory


def simulate(planner: Planner, rounds: int, slowdowns: Sequence[Slowdown] = (),
             keep_plans: bool = False, start_s: float = 0.0) -> SimulationResult:
    """Simulate ``rounds`` outer rounds of the planner's cluster under its policy.

    ``keep_plans`` keeps each round's Plan (for ``plan.jsonl``); leave it off for
    large clusters, where building per-node objects costs more than simulating.
    """
    settings = planner.balancing.simulation
    rng = np.random.default_rng(settings.seed)
    nodes = planner.nodes
    truth = GroundTruth(nodes, planner.bank, settings, planner.batch_size,
                        predictor_gpu_model(planner.dims, planner.seq_len, planner.precision), rng)
    stragglers = Stragglers(settings.straggler_prob, *settings.straggler_factor)
    slow = slowdown_matrix(nodes, rounds, slowdowns) * drift_matrix(rounds, len(nodes), settings.drift_per_round, rng)
    shape = (rounds, len(nodes))
    steps_done, batch = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    compute_s, wait_s, comm_s, hidden_s = np.zeros(shape), np.zeros(shape), np.zeros(shape), np.zeros(shape)
    predicted_compute_s, predicted_idle_s = np.zeros(shape), np.zeros(shape)
    round_start, round_end = np.zeros(rounds), np.zeros(rounds)
    plans = []
    clock_s = start_s
    for round_idx in range(rounds):
        plan = planner.plan_arrays(round_idx)
        if keep_plans:
            plans.append(planner.to_plan(plan))
        true_step_s = truth.step_s(plan.batch_size, plan.micro_batch_size) * slow[round_idx]
        if plan.deadline_s is None:
            done = plan.local_steps
            spent_s = run_fixed_steps(true_step_s, done, truth.noise, rng, stragglers)
        else:
            done, spent_s = run_until_deadline(true_step_s, plan.local_steps, plan.deadline_s, truth.noise, rng,
                                               stragglers)
        phase_s = float(np.max(spent_s))
        steps_done[round_idx], batch[round_idx] = done, plan.batch_size
        exposed_s, round_hidden_s = overlapped_sync_s(planner.sync, plan.sync_s, phase_s, round_idx, rounds)
        compute_s[round_idx], wait_s[round_idx], comm_s[round_idx] = spent_s, phase_s - spent_s, exposed_s
        hidden_s[round_idx] = round_hidden_s
        predicted_compute_s[round_idx], predicted_idle_s[round_idx] = plan.compute_s, plan.idle_s
        round_start[round_idx] = clock_s
        clock_s += phase_s + exposed_s
        round_end[round_idx] = clock_s
        planner.observe_round(round_idx, plan.batch_size, spent_s / done)
    return SimulationResult(
        policy=planner.balancing.policy, weighting=planner.weighting, seq_len=planner.seq_len, nodes=list(nodes),
        local_steps=steps_done, batch_size=batch, tokens=steps_done * trained_samples(batch, nodes) * planner.seq_len,
        compute_s=compute_s, wait_s=wait_s, comm_s=comm_s, round_start=round_start, round_end=round_end,
        predicted_compute_s=predicted_compute_s, predicted_idle_s=predicted_idle_s, plans=plans,
        comm_hidden_s=hidden_s, sync_bytes=ring_sent_bytes(planner.sync.payload_bytes, len(nodes)))


def overlapped_sync_s(sync: OuterSyncModel, round_sync_s: float, phase_s: float, round_idx: int,
                      rounds: int) -> tuple[float, float]:
    """(exposed, hidden) sync seconds of one round, as the runtime's overlap schedule spends them.

    Blocking sync: the whole sync is exposed. ``delayed``: round r's sum runs behind round r+1's
    local phase, so round 0 lands nothing (nothing ran behind it) and each later round exposes what
    its phase did not hide of the previous sum. ``streaming``: each round's fragments land within it.
    Under both, the last round drains: its own sum (``delayed``) or what moved since each fragment's
    launch (``streaming``) goes out after the phase, one whole-model sync exposed (docs/sync.md).
    """
    if sync.settings.overlap == "none":
        return sync.exposed_s(phase_s), 0.0
    if sync.settings.overlap == "delayed" and round_idx == 0:
        exposed_s, hidden_s = 0.0, 0.0
    else:
        exposed_s = sync.exposed_s(phase_s)
        hidden_s = max(0.0, round_sync_s - exposed_s)
    if round_idx == rounds - 1:
        exposed_s += round_sync_s
    return exposed_s, hidden_s


def ring_sent_bytes(payload_bytes: int, num_nodes: int) -> int:
    """Bytes one node sends in a ring all-reduce of ``payload_bytes``: 2 (n - 1) / n of it."""
    return 0 if num_nodes <= 1 else int(round(2 * (num_nodes - 1) * payload_bytes / num_nodes))


def trained_samples(batch: np.ndarray, nodes: Sequence[NodeSpec]) -> np.ndarray:
    """Samples each node trains per step at its planned ``batch`` (rounds x nodes): at least one per rank, as
    the runtime's ranks train them and the predictor's t(B) times them (``NodeSpec.ranks``)."""
    return np.maximum(batch, np.array([node.ranks for node in nodes], dtype=np.int64))
