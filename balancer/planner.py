"""Planner: the one object the runtime and simulator use to get a plan per round.

Interface (stable): ``Planner(balancing, nodes, dims, seq_len, local_steps,
batch_size, precision)``, ``plan(round_idx, present=None) -> Plan``, ``observe(measurement)``.
``present`` plans for a subset of the nodes (the ones present this round, when
nodes come and go); the subset shares the calibration measured so far.
The plan depends only on the config, the cluster and the measurements fed in,
so every node that feeds the same measurements computes the same plan.

When measurements are used: the source-paper policies and ``uniform`` never;
``time`` and ``hybrid`` plan from specs, then once more after
``calibration_rounds`` measured rounds, and keep that plan; ``adaptive`` and
``deadline`` re-plan every round, switching plans only when the current one is
predicted to waste more than ``hysteresis`` of the local phase.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.config import BalancingConfig
from geodiloco.balancer.estimates import Calibration, ModelFactory, StepTimeBank, micro_batches, prior_gpus
from geodiloco.balancer.network import CODEC_BITS, CODECS_BY_SIZE, OuterSyncModel, SyncSettings
from geodiloco.balancer.plan import NodePlan, Plan, RoundMeasurement
from geodiloco.balancer.policies import HIDE_MARGIN, POLICIES, POLICY_WEIGHTING, Assignment, PolicyInputs
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.workload import ModelDims, parameter_count, resolve_dims

STATIC_POLICIES = ("uniform", "batch_by_flops", "max_batch_by_memory", "steps_by_flops")
CALIBRATED_ONCE = ("time", "hybrid")
SYNC_ADVICE_SHARE = 0.1
HIVEMIND_NAMES = {"fp16": "fp16", "int8": "8bit"}
"""The planner's codec names as comm.hivemind.compression writes them."""
"""A sync that blocks (or stays exposed for) 10 % of a round or more gets advice in the plan."""
REPLANNING = ("adaptive", "deadline")

TflopsLookup = Callable[[str], float]
"""GPU name -> nominal TFLOPS (the ``flops_field`` of the predictor's datasheet)."""


@dataclass
class RoundPlan:
    """A round's plan as arrays (one entry per node, seconds), before it becomes a Plan."""

    round: int
    local_steps: np.ndarray
    batch_size: np.ndarray
    micro_batch_size: np.ndarray
    step_s: np.ndarray
    compute_s: np.ndarray
    wait_s: np.ndarray
    comm_s: np.ndarray
    phase_s: float
    deadline_s: Optional[float] = None
    sync_s: float = 0.0
    sync_advice: Optional[str] = None
    step_uncertainty: Optional[np.ndarray] = None

    @property
    def idle_s(self) -> np.ndarray:
        return self.wait_s + self.comm_s


def predictor_model_factory(dims: ModelDims, seq_len: int, precision: str) -> ModelFactory:
    """Step-time models from the predictor, for one model shape and sequence length."""

    def factory(gpus: list, micro_batch_size: Optional[int]):
        from geodiloco.predictor.model import node_step_model
        try:
            return node_step_model(list(gpus), dims, seq_len, precision=precision,
                                   micro_batch_size=micro_batch_size)
        except (KeyError, ValueError) as err:
            raise ConfigError(f"gpus {list(gpus)}: {err}") from None

    return factory


def predictor_tflops_lookup(flops_field: str) -> TflopsLookup:
    """Nominal TFLOPS of a GPU from the predictor's datasheet table."""

    def lookup(gpu_name: str) -> float:
        from geodiloco.predictor.unknown_gpus import device_spec
        try:
            spec = device_spec(gpu_name)
        except (KeyError, ValueError) as err:
            raise ConfigError(f"GPU {gpu_name!r}: {err}") from None
        nominal = getattr(spec, flops_field)
        if not nominal:
            raise ConfigError(f"GPU {gpu_name!r} ({spec.name}) has no {flops_field} in its datasheet row (no such "
                              "hardware rate); set balancing.flops_field to one every node's GPU has, such as "
                              "fp32_tflops")
        return float(nominal)

    return lookup


class Planner:
    """Plans each round for ``nodes``; ``local_steps``/``batch_size`` are the run's baseline H and B.

    ``model_factory`` and ``tflops_lookup`` default to the predictor; tests and
    tools may pass their own.
    """

    def __init__(self, balancing: BalancingConfig, nodes: list[NodeSpec], dims: ModelDims,
                 seq_len: int, local_steps: int, batch_size: int, precision: str = "bf16", *,
                 model_factory: Optional[ModelFactory] = None,
                 tflops_lookup: Optional[TflopsLookup] = None,
                 sync_settings: Optional[SyncSettings] = None) -> None:
        self.balancing = balancing
        self.nodes = list(nodes)
        self.names = [node.name for node in self.nodes]
        self.index = {name: position for position, name in enumerate(self.names)}
        self.dims = dims
        self.seq_len = seq_len
        self.local_steps = local_steps
        self.batch_size = batch_size
        self.precision = precision
        self._model_factory_arg = model_factory
        self._subsets: dict = {}
        self._check_reference()
        factory = model_factory or predictor_model_factory(dims, seq_len, precision)
        workload_factory = None if model_factory else (
            lambda model, seq: predictor_model_factory(resolve_dims(model) if model else dims,
                                                       seq or seq_len, precision))
        self.bank = StepTimeBank(self.nodes, factory, balancing.memory_headroom, workload_factory, batch_size)
        self.tflops_lookup = tflops_lookup or predictor_tflops_lookup(balancing.flops_field)
        self.calibration = Calibration(len(self.nodes), balancing.ewma_alpha, balancing.change_threshold)
        self.sync_settings = sync_settings
        self.sync = OuterSyncModel(self.nodes, parameter_count(dims), balancing.sync_dtype, sync_settings)
        self.base_steps = np.array([node.local_steps or local_steps for node in self.nodes], dtype=np.int64)
        self.base_batch = np.array([node.batch_size or batch_size for node in self.nodes], dtype=np.int64)
        self.measurements: list[RoundMeasurement] = []
        self.rounds_observed: set = set()
        self._cached: dict = {}
        self._current: Optional[Assignment] = None
        self._issued: dict = {}
        self._tflops: Optional[np.ndarray] = None

    # ------------------------------------------------------------------ inputs
    def _check_reference(self) -> None:
        reference = self.balancing.reference_node
        if reference not in ("slowest", "fastest") and reference not in self.index:
            known = ", ".join(self.names[:10])
            raise ConfigError(f"balancing.reference_node: no node named {reference!r}; "
                              f"use slowest, fastest or one of: {known}")

    @property
    def weighting(self) -> str:
        """Outer-average weighting for this plan: the config's, or the policy's recommendation."""
        if self.balancing.weighting != "auto":
            return self.balancing.weighting
        return POLICY_WEIGHTING[self.balancing.policy]

    def nominal_tflops(self) -> np.ndarray:
        """Mean nominal TFLOPS of each node's GPUs (what the source paper's A and C balance on)."""
        if self._tflops is None:
            per_gpu: dict = {}
            values = []
            for node in self.nodes:
                gpus = prior_gpus(node)
                if not gpus:
                    raise ConfigError(f"policy {self.balancing.policy} balances on nominal TFLOPS, but node "
                                      f"{node.name} lists no gpus; list them")
                for gpu in gpus:
                    if gpu not in per_gpu:
                        per_gpu[gpu] = self.tflops_lookup(gpu)
                values.append(float(np.mean([per_gpu[gpu] for gpu in gpus])))
            self._tflops = np.asarray(values)
        return self._tflops

    def _inputs(self, calibrated: bool) -> PolicyInputs:
        fit = self.calibration.fitted() if calibrated else Calibration(len(self.nodes)).fitted()
        blocking = self.sync.settings.overlap == "none"
        return PolicyInputs(config=self.balancing, names=self.names, base_steps=self.base_steps,
                            base_batch=self.base_batch, seq_len=self.seq_len,
                            comm_s=self.sync.sync_s() if blocking else 0.0, bank=self.bank, calibration=fit,
                            nominal_tflops=self.nominal_tflops, hide_phase_s=self.sync.hide_phase_s())

    # ---------------------------------------------------------------- planning
    def _base_policy(self) -> str:
        policy = self.balancing.policy
        return self.balancing.adaptive_base if policy in REPLANNING else policy

    def _assign(self, round_idx: int) -> Assignment:
        policy = self.balancing.policy
        rule = POLICIES[self._base_policy()]
        if policy in STATIC_POLICIES:
            key = "specs"
        elif policy in CALIBRATED_ONCE:
            # every node measured at least once too: an asynchronous node hears of a slow peer late
            ready = (self.balancing.calibration_rounds > 0
                     and len(self.rounds_observed) >= self.balancing.calibration_rounds
                     and bool(np.all(self.calibration.seen)))
            key = "calibrated" if ready else "specs"
        else:
            return self._replan(rule)
        if key not in self._cached:
            self._cached[key] = rule(self._inputs(calibrated=key == "calibrated"))
        return self._cached[key]

    def _replan(self, rule) -> Assignment:
        inputs = self._inputs(calibrated=True)
        candidate = rule(inputs)
        if self._current is None or self._imbalance(self._current, inputs) > self.balancing.hysteresis:
            if self._current is None or self._imbalance(candidate, inputs) < self._imbalance(self._current, inputs):
                self._current = candidate
        return self._current

    @staticmethod
    def _imbalance(assignment: Assignment, inputs: PolicyInputs) -> float:
        """Predicted waiting as a share of all nodes' local-phase time."""
        compute_s = assignment.local_steps * inputs.step_s(assignment.batch_size, assignment.micro_batch_size)
        phase_s = float(np.max(compute_s))
        return float(np.sum(phase_s - compute_s)) / (phase_s * len(compute_s))

    def plan_arrays(self, round_idx: int) -> RoundPlan:
        """This round's plan as arrays, with predictions from the best current estimates."""
        assignment = self._assign(round_idx)
        features = self.bank.prior_features(assignment.batch_size, assignment.micro_batch_size)
        fit = self.calibration.fitted()
        step_s = fit.predict_s(*features)
        local_steps = assignment.local_steps
        compute_s = local_steps * step_s
        phase_s = float(np.max(compute_s))
        deadline_s = None
        if self.balancing.policy == "deadline":
            deadline_s = phase_s
            local_steps = np.ceil(local_steps * (1.0 + self.balancing.deadline_step_slack) - 1e-9).astype(np.int64)
            done = np.minimum(local_steps, np.maximum(1, np.floor(deadline_s / step_s + 1e-9)))
            compute_s = done * step_s
            phase_s = float(np.max(compute_s))
        comm_s = np.full(len(self.nodes), self.sync.exposed_s(phase_s))
        plan = RoundPlan(round=round_idx, local_steps=local_steps, batch_size=assignment.batch_size,
                         micro_batch_size=assignment.micro_batch_size, step_s=step_s, compute_s=compute_s,
                         wait_s=phase_s - compute_s, comm_s=comm_s, phase_s=phase_s, deadline_s=deadline_s,
                         sync_s=self.sync.settings.sync_count * self.sync.one_sync_s(),
                         sync_advice=self.sync_advice(phase_s, float(np.max(self.base_steps * step_s))),
                         step_uncertainty=fit.uncertainty(*features))
        self._issued[round_idx] = plan
        self._issued.pop(round_idx - 2, None)
        return plan

    def largest_micro_batch(self, name: str, batch_size: int) -> int:
        """Samples of ``batch_size`` that node ``name`` passes at once: all of them when its predicted
        memory holds them, else the most it holds (the micro-batch its plans use)."""
        return int(min(batch_size, self.bank.max_micro[self.index[name]]))

    def plan(self, round_idx: int, present: Optional[Sequence[str]] = None) -> Plan:
        """The plan of round ``round_idx`` (deterministic given the measurements observed so far).

        ``present``: names of the nodes taking part this round; the plan then covers only
        them, balanced among themselves. None (or every node) = the whole cluster.
        """
        if present is None or set(present) >= set(self.names):
            return self.to_plan(self.plan_arrays(round_idx))
        return self._subset_planner(present).plan(round_idx)

    def _subset_planner(self, present: Sequence[str]) -> "Planner":
        """A planner over ``present`` (config order), fed this planner's calibration."""
        unknown = sorted(set(present) - set(self.index))
        if unknown or not present:
            raise ConfigError(f"plan for present nodes {list(present)}: unknown or empty "
                              f"(unknown: {', '.join(unknown) or 'none'}); use names from nodes:")
        positions = np.array(sorted(self.index[name] for name in set(present)), dtype=np.int64)
        key = tuple(positions.tolist())
        if key not in self._subsets:
            balancing = self.balancing
            if balancing.reference_node not in ("slowest", "fastest") and balancing.reference_node not in present:
                balancing = balancing.model_copy(update={"reference_node": "slowest"})
            self._subsets[key] = Planner(balancing, [self.nodes[i] for i in positions], self.dims, self.seq_len,
                                         self.local_steps, self.batch_size, self.precision,
                                         model_factory=self._model_factory_arg, tflops_lookup=self.tflops_lookup,
                                         sync_settings=self.sync_settings)
        subset = self._subsets[key]
        subset.calibration.take(self.calibration, positions)
        subset.rounds_observed = self.rounds_observed
        return subset

    def to_plan(self, arrays: RoundPlan) -> Plan:
        """A Plan record (per-node NodePlan objects) from a round's arrays."""
        node_plans = [
            NodePlan(name=name, local_steps=int(arrays.local_steps[i]), batch_size=int(arrays.batch_size[i]),
                     micro_batch_size=int(arrays.micro_batch_size[i]),
                     predicted_step_s=float(arrays.step_s[i]), predicted_compute_s=float(arrays.compute_s[i]),
                     predicted_comm_s=float(arrays.comm_s[i]), predicted_idle_s=float(arrays.idle_s[i]),
                     predicted_wait_s=float(arrays.wait_s[i]), deadline_s=arrays.deadline_s,
                     step_uncertainty=0.0 if arrays.step_uncertainty is None else float(arrays.step_uncertainty[i]))
            for i, name in enumerate(self.names)
        ]
        return Plan(policy=self.balancing.policy, round=arrays.round, nodes=node_plans, weighting=self.weighting,
                    predicted_round_s=arrays.phase_s + float(np.max(arrays.comm_s)),
                    predicted_idle_s=float(np.sum(arrays.idle_s)), predicted_sync_s=arrays.sync_s,
                    sync_advice=arrays.sync_advice)

    def sync_advice(self, phase_s: float, base_phase_s: float) -> Optional[str]:
        """What would hide the outer sync, when it is a large share of the round (None otherwise).

        ``phase_s``: the planned local phase; ``base_phase_s``: the phase at the baseline H."""
        sync, settings = self.sync, self.sync.settings
        total_s = settings.sync_count * sync.one_sync_s()
        if total_s <= 0 or phase_s <= 0:
            return None
        if settings.backend == "hivemind":
            return self._hivemind_sync_advice(total_s, phase_s, base_phase_s)
        if settings.overlap == "none":
            share = total_s / (phase_s + total_s)
            if share < SYNC_ADVICE_SHARE:
                return None
            hides = "which hides it" if total_s <= phase_s else "which hides part of it"
            return (f"the outer sync ({total_s:.3g} s) blocks every GPU for {share:.0%} of each round; "
                    f"diloco.overlap: streaming (the run default) spreads it in fragments behind the local phase "
                    f"({phase_s:.3g} s), {hides} (delayed hides it too, but its one-round-stale outer steps cost "
                    "eval loss: docs/sync.md)")
        exposed_s = sync.exposed_s(phase_s)
        if exposed_s <= SYNC_ADVICE_SHARE * phase_s:
            return None
        smaller = CODECS_BY_SIZE[CODECS_BY_SIZE.index(settings.codec) + 1:] if settings.codec in CODECS_BY_SIZE \
            else CODECS_BY_SIZE[2:]
        fitting = [codec for codec in smaller if sync.codec_sync_s(codec) <= phase_s]
        steps_needed = math.ceil(self.local_steps * sync.hide_phase_s() * (1.0 + HIDE_MARGIN) / base_phase_s)
        options = [f"diloco.compression: {fitting[0]} (sync {sync.codec_sync_s(fitting[0]):.3g} s)"] if fitting else []
        options.append(f"diloco.local_steps: {steps_needed} (now {self.local_steps})")
        return (f"the outer sync ({total_s:.3g} s) is longer than the local phase can be made "
                f"({phase_s:.3g} s, at most balancing.max_phase_stretch x the baseline): {exposed_s:.3g} s stay "
                f"exposed each round. To hide it: {' or '.join(options)}")

    def _hivemind_sync_advice(self, total_s: float, phase_s: float, base_phase_s: float) -> Optional[str]:
        """The hivemind backend syncs blocking (no overlap) with its own codecs: a smaller one, or longer local
        phases, are what it can offer."""
        share = total_s / (phase_s + total_s)
        if share < SYNC_ADVICE_SHARE:
            return None
        sync = self.sync
        smaller = [codec for codec in ("fp16", "int8") if CODEC_BITS[codec] < CODEC_BITS[self.sync.settings.codec]]
        options = [f"comm.hivemind.compression: {HIVEMIND_NAMES[codec]} (sync {sync.codec_sync_s(codec):.3g} s)"
                   for codec in smaller[-1:]]
        steps_needed = math.ceil(self.local_steps * total_s / (SYNC_ADVICE_SHARE * base_phase_s))
        options.append(f"diloco.local_steps: {steps_needed} (now {self.local_steps})")
        return (f"the outer sync ({total_s:.3g} s) blocks every GPU for {share:.0%} of each round (the hivemind "
                f"backend does not overlap it); to shrink it: {' or '.join(options)}")

    # ------------------------------------------------------------- measurements
    def observe(self, measurement: RoundMeasurement) -> None:
        """Feed one node's measured round (per-step times in seconds)."""
        if measurement.node not in self.index:
            raise KeyError(f"measurement for unknown node {measurement.node!r}")
        self.measurements.append(measurement)
        if measurement.sync_s is not None:
            self.sync.observe(measurement.sync_s)
        if measurement.step_times_s:
            step_s = float(np.median(measurement.step_times_s))
        elif measurement.local_steps > 0 and measurement.compute_s > 0:
            step_s = measurement.compute_s / measurement.local_steps
        else:
            return
        position = self.index[measurement.node]
        self.observe_round(measurement.round, np.array([measurement.batch_size]), np.array([step_s]),
                           node_index=np.array([position]))

    def observe_round(self, round_idx: int, batch_size: np.ndarray, step_s: np.ndarray,
                      node_index: Optional[np.ndarray] = None) -> None:
        """Feed many nodes' mean step times (seconds) at the batch sizes they ran, in one call."""
        node_index = np.arange(len(self.nodes)) if node_index is None else np.asarray(node_index)
        batch_size = np.asarray(batch_size, dtype=np.int64)
        issued = self._issued.get(round_idx)
        max_micro = self.bank.max_micro[node_index]
        micro = micro_batches(batch_size, max_micro)
        if issued is not None:
            same = issued.batch_size[node_index] == batch_size
            micro = np.where(same, issued.micro_batch_size[node_index], micro)
        full_batch = np.zeros(len(self.nodes), dtype=np.int64)
        full_micro = np.zeros(len(self.nodes), dtype=np.int64)
        full_batch[:] = self.base_batch
        full_micro[:] = micro_batches(self.base_batch, self.bank.max_micro)
        full_batch[node_index], full_micro[node_index] = batch_size, micro
        fixed_s, scaling_s = self.bank.prior_features(full_batch, full_micro)
        self.calibration.update(node_index, step_s, fixed_s[node_index], scaling_s[node_index])
        self.rounds_observed.add(round_idx)
