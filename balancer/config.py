"""The ``balancing:`` section of a run config: which policy, with its options.

Every option has a unit in its name or says it is a fraction. The planner
checks the options that depend on the cluster (e.g. ``reference_node``).
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, model_validator

from geodiloco.common.schema import StrictModel

PolicyName = Literal[
    "uniform", "batch_by_flops", "max_batch_by_memory", "steps_by_flops",
    "time", "hybrid", "adaptive", "deadline",
]
POLICY_NAMES: tuple[str, ...] = PolicyName.__args__
WeightingName = Literal["auto", "uniform", "tokens", "normalized"]
SyncDtype = Literal["fp32", "bf16", "fp16", "int8"]
FlopsField = Literal["fp16_tflops", "bf16_tflops", "fp16_fp32acc_tflops", "tf32_tflops", "fp32_tflops"]


RULE_OPTIONS: dict[str, tuple[str, ...]] = {
    "reference_node": ("time", "hybrid"), "round_time_s": ("time", "hybrid"),
    "max_comm_fraction": ("time", "hybrid"), "max_phase_stretch": ("time", "hybrid"),
    "tokens_per_round": ("hybrid",), "max_grad_accum": ("hybrid",), "throughput_tolerance": ("hybrid",),
    "max_batch_factor": ("hybrid",), "flops_field": ("batch_by_flops", "steps_by_flops"),
    "batch_search": ("max_batch_by_memory",),
}
"""Options read by a policy's rule (balancer/policies.py), and the policies whose rule reads each;
``adaptive`` and ``deadline`` run the rule of their ``adaptive_base`` (time or hybrid) every round."""
PLANNER_OPTIONS: dict[str, tuple[str, ...]] = {
    "calibration_rounds": ("time", "hybrid"), "adaptive_base": ("adaptive", "deadline"),
    "hysteresis": ("adaptive", "deadline"), "deadline_step_slack": ("deadline",),
}
"""Options the planner reads around the rule (balancer/planner.py), and the policies it reads each for."""
REPLANNING_POLICIES = ("adaptive", "deadline")


class SimulationConfig(StrictModel):
    """Ground truth knobs of ``geodiloco simulate`` (ignored by a real run).

    ``model_error``: relative spread (std of the log) of the true step time
    around the predictor's estimate, drawn once per node, for nodes that declare
    no time of their own (no ``measured:``, no ``emulate.step_time_s``/``gpu``).
    ``step_noise``: relative std of each step's time (a virtual GPU's
    ``emulate.jitter`` or a measured trace's spread wins). ``straggler_prob``:
    chance that a step is a straggler, ``straggler_factor`` x slower (uniform in
    [low, high]). ``drift_per_round``: std of the log of a node's speed change
    from one round to the next (a slow random walk: thermals, co-tenants).
    ``seed``: RNG seed. ``slowdowns``: scenario slowdowns (below).
    """

    model_error: float = Field(default=0.1, ge=0.0, le=2.0)
    step_noise: float = Field(default=0.02, ge=0.0, lt=0.5)
    straggler_prob: float = Field(default=0.01, ge=0.0, le=0.5)
    straggler_factor: tuple[float, float] = (2.0, 5.0)
    drift_per_round: float = Field(default=0.02, ge=0.0, le=0.5)
    seed: int = Field(default=0, ge=0)
    slowdowns: list[str] = Field(default_factory=list)
    """Scenario slowdowns as ``--slowdown`` writes them (``NODE:ROUND:FACTOR[:UNTIL]``), applied beside the
    command line's: ``simulate --out`` records its own here, so simulating the written config.yaml again
    reproduces the run."""

    @model_validator(mode="after")
    def _straggler_range(self) -> "SimulationConfig":
        low, high = self.straggler_factor
        if not 1.0 <= low <= high:
            raise ValueError(f"balancing.simulation.straggler_factor: [low, high] with 1 <= low <= high; "
                             f"got [{low:g}, {high:g}]")
        return self


class BalancingConfig(StrictModel):
    """``policy`` picks the balancing rule; docs/balancer.md lists each option per policy."""

    def for_mode(self, mode: str) -> "BalancingConfig":
        """The settings a run of ``diloco.mode`` ``mode`` plans with: under async, ``weighting: auto`` is the
        async weighting (``policies.ASYNC_WEIGHTING``), not the policy's."""
        if mode != "async" or self.weighting != "auto":
            return self
        from geodiloco.balancer.policies import ASYNC_WEIGHTING
        return self.model_copy(update={"weighting": ASYNC_WEIGHTING})

    policy: PolicyName = "uniform"
    weighting: WeightingName = "auto"
    # Length of the local phase (time, hybrid, adaptive, deadline).
    reference_node: str = "slowest"
    round_time_s: Optional[float] = Field(default=None, gt=0)
    tokens_per_round: Optional[int] = Field(default=None, ge=1)
    max_comm_fraction: Optional[float] = Field(default=None, gt=0, lt=1)
    # Bounds on what a node is asked to do.
    min_local_steps: int = Field(default=1, ge=1)
    max_local_steps: Optional[int] = Field(default=None, ge=1)
    min_batch_size: int = Field(default=1, ge=1)
    max_batch_size: Optional[int] = Field(default=None, ge=1)
    max_grad_accum: int = Field(default=4, ge=1)
    memory_headroom: float = Field(default=0.1, ge=0.0, lt=1.0)
    # Source-paper policies A, B, C.
    flops_field: FlopsField = "fp16_tflops"
    batch_search: Literal["doubling", "exact"] = "doubling"
    # hybrid: batches within this fraction of a node's best throughput are acceptable, up to
    # max_batch_factor x the baseline batch.
    throughput_tolerance: float = Field(default=0.05, ge=0.0, lt=1.0)
    max_batch_factor: float = Field(default=4.0, ge=1.0)
    # Use of measurements.
    calibration_rounds: int = Field(default=1, ge=0)
    adaptive_base: Literal["time", "hybrid"] = "time"
    ewma_alpha: float = Field(default=0.5, gt=0.0, le=1.0)
    change_threshold: float = Field(default=0.1, gt=0.0)
    hysteresis: float = Field(default=0.02, ge=0.0, lt=1.0)
    deadline_step_slack: float = Field(default=0.25, ge=0.0, le=10.0)
    # Outer sync (network-aware planning). ``sync_dtype``: wire dtype the planner assumes when no
    # run config says (a run plans with diloco.compression). ``max_phase_stretch``: with
    # diloco.overlap, the time-based policies lengthen the local phase up to this factor to hide
    # the sync behind it.
    sync_dtype: SyncDtype = "fp32"
    max_phase_stretch: float = Field(default=2.0, ge=1.0, le=100.0)
    simulation: SimulationConfig = Field(default_factory=SimulationConfig)

    @model_validator(mode="after")
    def _bounds_ordered(self) -> "BalancingConfig":
        if self.max_local_steps is not None and self.max_local_steps < self.min_local_steps:
            raise ValueError(f"max_local_steps ({self.max_local_steps}) must be >= min_local_steps "
                             f"({self.min_local_steps}); raise max_local_steps or lower min_local_steps")
        if self.max_batch_size is not None and self.max_batch_size < self.min_batch_size:
            raise ValueError(f"max_batch_size ({self.max_batch_size}) must be >= min_batch_size "
                             f"({self.min_batch_size}); raise max_batch_size or lower min_batch_size")
        return self

    def unread_options(self) -> list[str]:
        """One notice per option the config sets away from its default that its policy never reads (a
        setting meant for another policy has no effect, which a user tuning it would not otherwise learn).
        A value equal to the default is no tuning: a run's own config.yaml spells out every default."""
        rule = self.adaptive_base if self.policy in REPLANNING_POLICIES else self.policy
        changed = {name for name in self.model_fields_set
                   if getattr(self, name) != type(self).model_fields[name].get_default(call_default_factory=True)}
        notices = []
        for option in sorted(changed & (RULE_OPTIONS.keys() | PLANNER_OPTIONS.keys())):
            if option in RULE_OPTIONS:
                readers = RULE_OPTIONS[option]
                if rule in readers:
                    continue
                used_by = ", ".join(readers)
                if "time" in readers or "hybrid" in readers:
                    bases = " or ".join(base for base in ("time", "hybrid") if base in readers)
                    used_by += f", and adaptive/deadline with adaptive_base: {bases}"
            else:
                readers = PLANNER_OPTIONS[option]
                if self.policy in readers:
                    continue
                used_by = ", ".join(readers)
            rule_note = f" (its rule: {rule})" if rule != self.policy else ""
            notices.append(f"balancing.{option} has no effect under policy {self.policy}{rule_note}; "
                           f"it is read by {used_by}")
        return notices
