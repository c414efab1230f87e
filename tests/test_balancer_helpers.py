"""Test doubles for the balancer tests: step-time models with hand-checkable numbers."""
from __future__ import annotations

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.config import BalancingConfig
from geodiloco.balancer.planner import Planner
from geodiloco.predictor.workload import preset_dims

# GPU name -> (fixed seconds per step, seconds per sample, samples that fit in memory)
FAKE_GPUS = {
    "slow": (0.0, 0.075, 16),
    "fast": (0.0, 0.025, 64),
    "mid": (0.0, 0.05, 32),
    "overhead": (0.2, 0.025, 64),
}
FAKE_TFLOPS = {"slow": 100.0, "fast": 150.0, "mid": 120.0, "overhead": 150.0}


class LinearModel:
    """t(B) = fixed + per_sample * B on one GPU; max batch = memory."""

    def __init__(self, fixed_s: float, per_sample_s: float, memory_batch: int) -> None:
        self.fixed_s, self.per_sample_s, self.memory_batch = fixed_s, per_sample_s, memory_batch

    def predict(self, batch_size: int) -> float:
        return self.fixed_s + self.per_sample_s * batch_size

    def fixed_and_scaling_s(self, batch_size: int) -> tuple[float, float]:
        return self.fixed_s, self.per_sample_s * batch_size

    def update(self, batch_size: int, step_time_s: float) -> None:
        self.per_sample_s = (step_time_s - self.fixed_s) / batch_size

    def max_batch_size(self) -> int:
        return self.memory_batch


def fake_factory(gpus, micro_batch_size):
    fixed_s, per_sample_s, memory = FAKE_GPUS[gpus[0]]
    return LinearModel(fixed_s, per_sample_s, memory)


def fake_tflops(gpu: str) -> float:
    return FAKE_TFLOPS[gpu]


def nodes(*gpu_names, **extra) -> list[NodeSpec]:
    return [NodeSpec(name=f"n{i + 1}", gpus=[gpu], **extra) for i, gpu in enumerate(gpu_names)]


def planner(policy: str, node_specs, local_steps: int = 100, batch_size: int = 4, **options) -> Planner:
    return Planner(BalancingConfig(policy=policy, **options), node_specs, preset_dims("tiny"), 128,
                   local_steps, batch_size, model_factory=fake_factory, tflops_lookup=fake_tflops)
