"""Virtual GPU: pad each real inner step with sleep up to a target step time.

So one machine reproduces the timing of a heterogeneous cluster while the real
model trains. The target at batch B is

- ``emulate.step_time_s`` given at ``emulate.batch_size`` (default: the run's batch B0):
  ``t(B) = step_time_s * (fixed_fraction + (1 - fixed_fraction) * B / B0)``, i.e. linear in
  the batch with an optional batch-independent share;
- ``emulate.gpu``: the predictor's t(B) for those GPUs and the run's model.

times ``time_scale``, the active slowdown factor of the round, and a jitter factor
``max(0.1, 1 + N(0, jitter))`` drawn from a generator seeded by (seed, node, round, step),
so runs are reproducible. A step that is already slower than its target is not padded.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np

from balancer.cluster import EmulateSpec, NodeSpec
from predictor.workload import ModelDims


def gpu_time_model(node: NodeSpec, dims: ModelDims, seq_len: int, precision: str) -> Callable[[int], float]:
    """t(B) of the node's emulated GPUs running ``emulate.model`` (default: the run's model)."""
    from predictor import model as predictor_model
    from predictor.workload import resolve_dims
    spec = node.emulate
    emulated_dims = resolve_dims(spec.model) if spec.model else dims
    step_model = predictor_model.node_step_model(spec.gpu_names(node.gpus), emulated_dims,
                                                 spec.seq_len or seq_len, precision=precision)
    return step_model.predict


class StepPacer:
    def __init__(self, node: NodeSpec, node_index: int, base_batch_size: int, seed: int,
                 dims: ModelDims, seq_len: int, precision: str) -> None:
        self.spec: Optional[EmulateSpec] = node.emulate
        self.node_index = node_index
        self.seed = seed
        self.base_batch_size = base_batch_size
        self.slow_steps = 0
        self._time_for_batch: Optional[Callable[[int], float]] = None
        if self.spec is not None and self.spec.gpu is not None:
            self._time_for_batch = gpu_time_model(node, dims, seq_len, precision)

    @property
    def active(self) -> bool:
        return self.spec is not None

    def nominal_step_s(self, round_idx: int, batch_size: int) -> Optional[float]:
        """Target step time without jitter (seconds), or None when not emulating."""
        if self.spec is None:
            return None
        if self._time_for_batch is not None:
            base_s = self._time_for_batch(batch_size)
        else:
            reference_batch = self.spec.batch_size or self.base_batch_size
            fixed = self.spec.fixed_fraction
            base_s = self.spec.step_time_s * (fixed + (1.0 - fixed) * batch_size / reference_batch)
        return base_s * self.spec.time_scale * self.spec.slowdown_factor(round_idx)

    def target_step_s(self, round_idx: int, step_idx: int, batch_size: int) -> Optional[float]:
        nominal_s = self.nominal_step_s(round_idx, batch_size)
        if nominal_s is None or self.spec.jitter == 0:
            return nominal_s
        rng = np.random.default_rng([self.seed, self.node_index, round_idx, step_idx])
        return nominal_s * max(0.1, 1.0 + rng.normal(0.0, self.spec.jitter))

    def pad(self, step_started: float, round_idx: int, step_idx: int, batch_size: int) -> None:
        """Sleep until ``step_started`` (time.perf_counter) + the target step time."""
        target_s = self.target_step_s(round_idx, step_idx, batch_size)
        if target_s is None:
            return
        remaining_s = step_started + target_s - time.perf_counter()
        if remaining_s > 0:
            time.sleep(remaining_s)
        else:
            self.slow_steps += 1
