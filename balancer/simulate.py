"""Discrete-event simulation of outer rounds: no processes, every node at once with numpy.

Per round: the planner plans (seeing only spec estimates and the rounds
already finished), every node runs its local phase with its *true* step time
(``measured:`` in the cluster file, else ``emulate.step_time_s``, else the
predictor's estimate off by a per-node model error), with per-step noise and
slowdown events; the outer sync starts when the last node is done and takes
the network model's time. The planner then sees each node's mean step time.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np
import yaml

from balancer.cluster import NodeSpec, SlowdownEvent
from balancer.estimates import StepTimeBank, micro_batches
from balancer.planner import Planner, RoundPlan
from balancer.records import IdleRecord, append_records
from predictor.schema import ConfigError

NOISE_WINDOW_SIGMAS = 6.0


@dataclass(frozen=True)
class Slowdown:
    """Extra slowdown for a scenario: ``node`` runs ``factor`` x slower from ``from_round`` on."""

    node: str
    from_round: int
    factor: float
    until_round: Optional[int] = None


class GroundTruth:
    """True seconds per step of every node, by batch size and round."""

    def __init__(self, nodes: Sequence[NodeSpec], bank: StepTimeBank, model_error: float,
                 step_noise: float, rng: np.random.Generator) -> None:
        self.bank = bank
        count = len(nodes)
        self.factor = np.exp(model_error * rng.standard_normal(count))
        self.linear_step_s = np.full(count, np.nan)
        self.linear_batch = np.ones(count)
        self.linear_fixed = np.zeros(count)
        self.noise = np.full(count, step_noise)
        for position, node in enumerate(nodes):
            self._node_truth(position, node)

    def _node_truth(self, position: int, node: NodeSpec) -> None:
        emulate, measured = node.emulate, node.measured
        if emulate is not None:
            self.noise[position] = emulate.jitter
        if measured is not None:
            if measured.trace_s and len(measured.trace_s) > 1:
                self.noise[position] = float(np.std(measured.trace_s) / np.mean(measured.trace_s))
            if measured.fixed_fraction is not None:
                self.linear_step_s[position] = measured.step_time_s
                self.linear_batch[position] = measured.batch_size
                self.linear_fixed[position] = measured.fixed_fraction
                return
            batch = np.full(self.factor.shape, measured.batch_size, dtype=np.int64)
            prior_s = self.bank.prior_step_s(batch, micro_batches(batch, self.bank.max_micro))[position]
            self.factor[position] = measured.step_time_s / prior_s
        elif emulate is not None and emulate.step_time_s is not None:
            self.factor[position] = 1.0
        elif emulate is not None:
            self.factor[position] *= emulate.time_scale

    def step_s(self, batch_size: np.ndarray, micro_batch_size: np.ndarray) -> np.ndarray:
        """True mean seconds per step at (batch, micro-batch), before slowdowns."""
        from_prior = self.bank.prior_step_s(batch_size, micro_batch_size) * self.factor
        share = self.linear_fixed + (1.0 - self.linear_fixed) * batch_size / self.linear_batch
        return np.where(np.isnan(self.linear_step_s), from_prior, self.linear_step_s * share)


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


def run_fixed_steps(step_s: np.ndarray, steps: np.ndarray, noise: np.ndarray,
                    rng: np.random.Generator) -> np.ndarray:
    """Seconds for ``steps`` steps with independent normal per-step noise (the sum is exact)."""
    total_s = step_s * (steps + noise * np.sqrt(steps) * rng.standard_normal(len(steps)))
    return np.maximum(total_s, 1e-3 * step_s * steps)


def run_until_deadline(step_s: np.ndarray, cap: np.ndarray, deadline_s: float, noise: np.ndarray,
                       rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Steps done and seconds spent when each node stops before its next step would pass the deadline.

    Exact in distribution without drawing every step: the sum of the first
    ``k0`` steps (well before the expected crossing) is one normal draw, then
    a short window of single steps around the deadline is drawn one by one.
    """
    expected = np.minimum(deadline_s / step_s, cap)
    spread = NOISE_WINDOW_SIGMAS * noise * np.sqrt(np.maximum(expected, 1.0))
    head = np.clip(np.floor(expected - spread - 2), 0, cap).astype(np.int64)
    head_s = step_s * (head + noise * np.sqrt(head) * rng.standard_normal(len(head)))
    width = int(np.max(np.minimum(cap - head, np.ceil(2 * spread) + 4)))
    width = max(width, 1)
    steps_s = step_s[:, None] * np.maximum(1.0 + noise[:, None] * rng.standard_normal((len(head), width)), 1e-3)
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
            })
        tokens = int(self.tokens.sum())
        return {
            "policy": self.policy, "weighting": self.weighting, "rounds": self.rounds, "nodes": per_node,
            "predicted_idle_s": float(self.predicted_idle_s.sum()), "compute_s": float(self.compute_s.sum()),
            "wait_s": float(self.wait_s.sum()), "comm_s": float(self.comm_s.sum()),
            "idle_s": float(self.idle_s.sum()), "tokens": tokens, "wall_s": self.wall_s,
            "tokens_per_round": tokens / max(self.rounds, 1),
            "tokens_per_hour": tokens / self.wall_s * 3600.0 if self.wall_s > 0 else 0.0,
        }

    def idle_records(self, run_id: str) -> Iterator[IdleRecord]:
        """One IdleRecord per node per round, as the runtime's tracker writes them."""
        for round_idx in range(self.rounds):
            for i, node in enumerate(self.nodes):
                yield IdleRecord(
                    run_id=run_id, round=round_idx, node=node.name, site=node.site, policy=self.policy,
                    local_steps=int(self.local_steps[round_idx, i]), batch_size=int(self.batch_size[round_idx, i]),
                    tokens=int(self.tokens[round_idx, i]), compute_s=float(self.compute_s[round_idx, i]),
                    wait_s=float(self.wait_s[round_idx, i]), comm_s=float(self.comm_s[round_idx, i]),
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
    truth = GroundTruth(nodes, planner.bank, settings.model_error, settings.step_noise, rng)
    slow = slowdown_matrix(nodes, rounds, slowdowns)
    shape = (rounds, len(nodes))
    steps_done, batch = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    compute_s, wait_s, comm_s = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    predicted_compute_s, predicted_idle_s = np.zeros(shape), np.zeros(shape)
    round_start, round_end = np.zeros(rounds), np.zeros(rounds)
    sync_s = planner.sync.node_sync_s()
    plans = []
    clock_s = start_s
    for round_idx in range(rounds):
        plan = planner.plan_arrays(round_idx)
        if keep_plans:
            plans.append(planner.to_plan(plan))
        true_step_s = truth.step_s(plan.batch_size, plan.micro_batch_size) * slow[round_idx]
        if plan.deadline_s is None:
            done = plan.local_steps
            spent_s = run_fixed_steps(true_step_s, done, truth.noise, rng)
        else:
            done, spent_s = run_until_deadline(true_step_s, plan.local_steps, plan.deadline_s, truth.noise, rng)
        phase_s = float(np.max(spent_s))
        steps_done[round_idx], batch[round_idx] = done, plan.batch_size
        compute_s[round_idx], wait_s[round_idx], comm_s[round_idx] = spent_s, phase_s - spent_s, sync_s
        predicted_compute_s[round_idx], predicted_idle_s[round_idx] = plan.compute_s, plan.idle_s
        round_start[round_idx] = clock_s
        clock_s += phase_s + float(np.max(sync_s))
        round_end[round_idx] = clock_s
        planner.observe_round(round_idx, plan.batch_size, spent_s / done)
    return SimulationResult(
        policy=planner.balancing.policy, weighting=planner.weighting, seq_len=planner.seq_len, nodes=list(nodes),
        local_steps=steps_done, batch_size=batch, tokens=steps_done * batch * planner.seq_len,
        compute_s=compute_s, wait_s=wait_s, comm_s=comm_s, round_start=round_start, round_end=round_end,
        predicted_compute_s=predicted_compute_s, predicted_idle_s=predicted_idle_s, plans=plans)


def summary_json(result: SimulationResult) -> str:
    return json.dumps(result.summary(), indent=2, sort_keys=False)
