"""Planner: the one object the runtime and simulator use to get a plan per round.

Interface (stable): ``Planner(balancing, nodes, dims, seq_len, local_steps,
batch_size, precision)``, ``plan(round_idx) -> Plan``, ``observe(measurement)``.
"""
from __future__ import annotations

from balancer.cluster import NodeSpec
from balancer.config import BalancingConfig
from balancer.plan import NodePlan, Plan, RoundMeasurement
from predictor.workload import ModelDims


class Planner:
    def __init__(self, balancing: BalancingConfig, nodes: list[NodeSpec], dims: ModelDims,
                 seq_len: int, local_steps: int, batch_size: int, precision: str = "bf16") -> None:
        self.balancing = balancing
        self.nodes = list(nodes)
        self.dims = dims
        self.seq_len = seq_len
        self.local_steps = local_steps
        self.batch_size = batch_size
        self.precision = precision
        self.measurements: list[RoundMeasurement] = []

    def observe(self, measurement: RoundMeasurement) -> None:
        self.measurements.append(measurement)

    def plan(self, round_idx: int) -> Plan:
        node_plans = [
            NodePlan(name=node.name,
                     local_steps=node.local_steps or self.local_steps,
                     batch_size=node.batch_size or self.batch_size)
            for node in self.nodes
        ]
        return Plan(policy=self.balancing.policy, round=round_idx, nodes=node_plans)
