"""Virtual GPU: pad each real inner step with sleep up to a target step time.

So one machine reproduces the timing of a heterogeneous cluster while the real
model trains. The mean target at batch B is the node's declared step time, the one
rule of :mod:`balancer.step_time` that the planner's prior and the simulator read too
(``emulate.step_time_s`` linear in B around its reference batch, or the predictor's t(B)
for ``emulate.gpu``, times ``time_scale``), times the active slowdown factor of the round
and a jitter factor ``max(0.1, 1 + N(0, jitter))`` drawn from a generator seeded by
(seed, node, round, step), so runs are reproducible. A step that is already slower than
its target is not padded. Nodes with ``emulate.cpu_share`` are not padded at all (see
:mod:`lab.cpu_share`).
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

from geodiloco.balancer.cluster import EmulateSpec, NodeSpec
from geodiloco.balancer.step_time import declared_step_model, predictor_gpu_model
from geodiloco.predictor.workload import ModelDims


class StepPacer:
    """Pads one node's steps to its declared time; inactive for real-compute and plain nodes."""

    def __init__(self, node: NodeSpec, node_index: int, base_batch_size: int, seed: int,
                 dims: ModelDims, seq_len: int, precision: str) -> None:
        self.node_index = node_index
        self.seed = seed
        self.slow_steps = 0
        self.overslept_s = 0.0
        self.last_target_s = 0.0
        self._declared = declared_step_model(node.emulate, node.gpus, base_batch_size,
                                             predictor_gpu_model(dims, seq_len, precision))
        self.spec: Optional[EmulateSpec] = node.emulate if self._declared is not None else None

    @property
    def active(self) -> bool:
        return self.spec is not None

    def nominal_step_s(self, round_idx: int, batch_size: int) -> Optional[float]:
        """Target step time without jitter (seconds), or None when not padding."""
        if self.spec is None:
            return None
        return self._declared.predict(batch_size) * self.spec.slowdown_factor(round_idx)

    def target_step_s(self, round_idx: int, step_idx: int, batch_size: int) -> Optional[float]:
        nominal_s = self.nominal_step_s(round_idx, batch_size)
        if nominal_s is None or self.spec.jitter == 0:
            return nominal_s
        rng = np.random.default_rng([self.seed, self.node_index, round_idx, step_idx])
        return nominal_s * max(0.1, 1.0 + rng.normal(0.0, self.spec.jitter))

    def pad(self, step_started: float, round_idx: int, step_idx: int, batch_size: int) -> None:
        """Sleep until ``step_started`` (time.perf_counter) + the target step time.

        A sleep on a busy CPU wakes late; what the phase's sleeps overslept so far is taken off the next steps'
        pads until it is made up (a wake-up later than one step's pad is spread over several), so a phase's steps
        add up to their targets instead of drifting long by each wake-up's delay. A step whose own compute
        outruns its target keeps its real time (``slow_steps``), and the carry starts afresh at each phase's
        first step (what the last one left is ``end_phase``'s)."""
        target_s = self.target_step_s(round_idx, step_idx, batch_size)
        if target_s is None:
            return
        if step_idx == 0:
            self.overslept_s = 0.0
        self.last_target_s = target_s
        padded_until = step_started + target_s - self.overslept_s  # before step_started when the carry is longer
        now = time.perf_counter()
        if now < padded_until:
            time.sleep(padded_until - now)
            self.overslept_s = max(0.0, time.perf_counter() - padded_until)
        elif now > step_started + target_s:
            self.overslept_s = 0.0
            self.slow_steps += 1
        else:  # its compute took some of the pad the carry needed: the rest is carried on
            self.overslept_s = now - padded_until

    def end_phase(self) -> None:
        """A phase's carry that no later step can make up: when it is above ``LATE_PHASE_SHARE`` of a step's target
        (a wake-up that late on a loaded CPU), the phase ran longer than the emulated GPU would, and one more
        step counts as slower than its target (its real time is kept, as for ``slow_steps``)."""
        if self.overslept_s > LATE_PHASE_SHARE * self.last_target_s:
            self.slow_steps += 1
        self.overslept_s = 0.0


LATE_PHASE_SHARE = 0.1
"""Share of a step's target a phase may end late by, from its last sleep's wake-up, without being said to be slow."""
