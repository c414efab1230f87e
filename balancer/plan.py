"""Plan records: what each node does in one outer round, and what it measured.

A Plan is made before a round, shared with every node, applied by the runtime
and logged to ``plan.jsonl``; RoundMeasurement is what the runtime feeds back
to the planner after the round.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass
class NodePlan:
    """One node's work in one round.

    ``batch_size`` is samples per inner step (whole node) = ``micro_batch_size``
    x gradient-accumulation steps. ``deadline_s`` (seconds after the round
    starts), when set, ends the local phase early: the node stops once its next
    step would not finish in time, ``local_steps`` being a cap.
    Predictions are seconds: ``predicted_wait_s`` waiting for the slowest node,
    ``predicted_idle_s`` = wait + outer sync (the idle log's definition).
    """

    name: str
    local_steps: int
    batch_size: int
    micro_batch_size: Optional[int] = None
    weight: Optional[float] = None
    predicted_step_s: float = 0.0
    predicted_compute_s: float = 0.0
    predicted_comm_s: float = 0.0
    predicted_idle_s: float = 0.0
    deadline_s: Optional[float] = None
    predicted_wait_s: float = 0.0
    step_uncertainty: float = 0.0
    """Relative one-sigma uncertainty of ``predicted_step_s`` (0.1 = +-10 %), from the node's calibration."""

    def __post_init__(self) -> None:
        if self.local_steps < 1:
            raise ValueError(f"node {self.name}: local_steps must be >= 1, got {self.local_steps}")
        if self.batch_size < 1:
            raise ValueError(f"node {self.name}: batch_size must be >= 1, got {self.batch_size}")
        if self.micro_batch_size is None:
            self.micro_batch_size = self.batch_size
        if not 1 <= self.micro_batch_size <= self.batch_size:
            raise ValueError(f"node {self.name}: micro_batch_size must be in [1, batch_size={self.batch_size}], got {self.micro_batch_size}")

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches per inner step (the last one may be smaller)."""
        return -(-self.batch_size // self.micro_batch_size)


@dataclass
class Plan:
    """All nodes' work in one round, with the planner's predictions (seconds)."""

    policy: str
    round: int
    nodes: list[NodePlan]
    weighting: str = "tokens"
    predicted_round_s: float = 0.0
    predicted_idle_s: float = 0.0
    predicted_sync_s: float = 0.0
    sync_advice: Optional[str] = None

    def gpu_counts(self, nodes: list) -> list[int]:
        """GPUs of each planned node, in the plan's order, from ``nodes`` (the cluster's NodeSpecs): the weights
        that turn node-seconds into GPU-seconds, as the run report weighs nodes."""
        by_name = {node.name: node for node in nodes}
        return [by_name[node_plan.name].num_gpus for node_plan in self.nodes]

    def gpu_idle_s(self, nodes: list) -> tuple[float, float]:
        """(idle GPU-seconds, all GPU-seconds) of the round: each node's predicted idle and the round, times its
        GPUs."""
        gpus = self.gpu_counts(nodes)
        return (sum(count * node_plan.predicted_idle_s for count, node_plan in zip(gpus, self.nodes)),
                self.predicted_round_s * sum(gpus))

    def node(self, name: str) -> NodePlan:
        for node_plan in self.nodes:
            if node_plan.name == name:
                return node_plan
        raise KeyError(f"plan for round {self.round} has no node {name!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "Plan":
        fields = dict(data)
        fields["nodes"] = [NodePlan(**node) for node in data["nodes"]]
        return cls(**fields)


@dataclass
class RoundMeasurement:
    """What one node measured in one finished round (seconds), fed back to the planner."""

    node: str
    round: int
    batch_size: int
    local_steps: int
    step_times_s: list[float] = field(default_factory=list)
    compute_s: float = 0.0
    wait_s: float = 0.0
    comm_s: float = 0.0
    sync_s: Optional[float] = None
    """Duration of one of the node's syncs landed last (seconds; None = none measured)."""
