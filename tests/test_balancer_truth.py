"""The simulator's truth comes from the cluster file, through the one step-time rule, not the planner's prior."""
from pathlib import Path

import numpy as np
import pytest

from geodiloco.balancer.cluster import NodeSpec, load_cluster
from geodiloco.balancer.config import BalancingConfig
from geodiloco.balancer.planner import Planner
from geodiloco.balancer.simulate import simulate
from geodiloco.lab.virtual_gpu import StepPacer
from geodiloco.predictor.model import node_step_model
from geodiloco.predictor.workload import resolve_dims
from test_balancer_helpers import planner

ROOT = Path(__file__).resolve().parents[1]
QUIET = {"model_error": 0.0, "step_noise": 0.0, "straggler_prob": 0.0, "drift_per_round": 0.0}


def real_planner(policy, nodes, local_steps, batch_size, model="tiny", seq_len=128, **options):
    return Planner(BalancingConfig(policy=policy, simulation=QUIET, **options), nodes, resolve_dims(model),
                   seq_len, local_steps, batch_size)


def test_simulate_runs_a_node_at_its_emulated_time_even_when_it_lists_gpus():
    nodes = load_cluster(ROOT / "experiments" / "configs" / "slowdown.yaml").nodes
    result = simulate(real_planner("uniform", nodes, local_steps=10, batch_size=8), rounds=1)
    # slowdown.yaml: 10 steps at batch 8 (= the reference batch), 0.30 / 0.32 / 0.17 / 0.26 s per step
    assert result.compute_s[0] == pytest.approx([3.0, 3.2, 1.7, 2.6], rel=1e-9)


def test_time_scale_is_applied_once():
    node = NodeSpec(name="a", gpus=["A30"], emulate={"gpu": "from_gpus", "time_scale": 0.5})
    result = simulate(real_planner("uniform", [node], local_steps=10, batch_size=4), rounds=1)
    unscaled_s = node_step_model(["A30"], resolve_dims("tiny"), 128, precision="bf16").predict(4)
    assert result.compute_s[0, 0] == pytest.approx(10 * unscaled_s * 0.5, rel=1e-9)


def test_planner_emulation_and_simulator_share_the_reference_batch():
    """emulate.step_time_s without emulate.batch_size is the time at the run's baseline batch, for all three."""
    node = NodeSpec(name="a", emulate={"step_time_s": 0.2})
    planned = real_planner("uniform", [node], local_steps=10, batch_size=4)
    assert planned.plan(0).node("a").predicted_step_s == pytest.approx(0.2)
    pacer = StepPacer(node, 0, 4, 0, resolve_dims("tiny"), 128, "bf16")
    assert pacer.nominal_step_s(0, 4) == pytest.approx(0.2)
    assert pacer.nominal_step_s(0, 8) == pytest.approx(0.4)
    assert simulate(planned, rounds=1).compute_s[0, 0] == pytest.approx(10 * 0.2)


def test_a_measured_curve_is_interpolated_not_scaled_along_the_prior():
    node = NodeSpec(name="a", gpus=["fast"], measured={"points": [{"batch_size": 2, "step_time_s": 0.1},
                                                                  {"batch_size": 8, "step_time_s": 1.0}]})
    result = simulate(planner("uniform", [node], local_steps=10, batch_size=4, simulation=QUIET), rounds=1)
    # halfway between the points in batch: 0.1 + (4 - 2) / (8 - 2) * 0.9 = 0.4 s per step
    assert result.compute_s[0, 0] == pytest.approx(10 * 0.4)


def kneed_cluster():
    """The prior (test doubles) thinks n2 has a fixed 0.2 s overhead and 0.025 s per sample, so large
    batches look cheap; its true t(B) is flat to batch 6, then 0.2 s per extra sample (a knee)."""
    return [
        NodeSpec(name="n1", gpus=["slow"], measured={"points": [{"batch_size": 1, "step_time_s": 0.075},
                                                                {"batch_size": 32, "step_time_s": 2.4}]}),
        NodeSpec(name="n2", gpus=["overhead"], measured={"points": [{"batch_size": 1, "step_time_s": 0.2},
                                                                    {"batch_size": 6, "step_time_s": 0.3},
                                                                    {"batch_size": 12, "step_time_s": 1.5}]}),
    ]


def waiting_share(result):
    phase_s = (result.compute_s + result.wait_s).max(axis=1)
    return result.wait_s.sum(axis=1) / (phase_s * result.compute_s.shape[1])


@pytest.mark.parametrize("policy, adaptive_base", [("time", "time"), ("adaptive", "time"),
                                                   ("hybrid", "time"), ("adaptive", "hybrid")])
def test_a_wrong_shaped_prior_is_corrected_after_one_measured_round(policy, adaptive_base):
    result = simulate(planner(policy, kneed_cluster(), simulation=QUIET, adaptive_base=adaptive_base), rounds=6)
    share = waiting_share(result)
    assert share[0] > 0.05
    assert np.all(share[1:] < 0.01)


def test_stragglers_and_drift_make_the_truth_differ_from_any_plan():
    quiet = simulate(planner("time", kneed_cluster(), simulation=QUIET), rounds=6)
    noisy = simulate(planner("time", kneed_cluster(), simulation={**QUIET, "straggler_prob": 0.05,
                                                                   "drift_per_round": 0.05}), rounds=6)
    assert noisy.wait_s[1:].sum() > 10 * max(quiet.wait_s[1:].sum(), 1e-3)
    # a straggler costs 2-5 extra step times: 100 steps at 5 % add 5 x 1.5..4 = 7.5..20 steps on average
    extra_steps = noisy.compute_s[1:, 0] / (noisy.local_steps[1:, 0] * 0.3) - 1.0
    assert 0.0 < float(np.median(np.abs(extra_steps))) < 0.6


class _FakeClock:
    """perf_counter and sleep for the pacer, on a clock that moves only when told: every sleep wakes
    ``wake_late_s`` late (the sleeps listed in ``late_sleeps_s`` by their own delays, in turn), and compute takes
    exactly what the test says."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.wake_late_s = 0.0
        self.late_sleeps_s: list[float] = []

    def perf_counter(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds + (self.late_sleeps_s.pop(0) if self.late_sleeps_s else self.wake_late_s)


def _pace_phase(pacer, steps: int, compute_s: float, wake_late_s: float, monkeypatch,
                clock: "_FakeClock | None" = None) -> list[float]:
    """Step times of one phase whose steps compute ``compute_s`` each, on a CPU where every sleep wakes
    ``wake_late_s`` late."""
    from geodiloco.lab import virtual_gpu

    clock = clock or _FakeClock()
    clock.wake_late_s = wake_late_s
    monkeypatch.setattr(virtual_gpu, "time", clock)
    step_times_s = []
    for step_idx in range(steps):
        started = clock.now_s
        clock.now_s += compute_s
        pacer.pad(started, 0, step_idx, 4)
        step_times_s.append(clock.now_s - started)
    return step_times_s


def test_a_phase_of_padded_steps_adds_up_to_its_targets_though_each_sleep_wakes_late(monkeypatch):
    """0.1 s targets, 0.02 s of compute, every sleep 0.03 s late: the steps after the first take the
    previous one's overshoot off their pad, so 6 steps last 6 x 0.1 s plus one wake-up, not 6 x 0.13 s;
    none counts as slow, since none computed past its target."""
    pacer = StepPacer(NodeSpec(name="a", emulate={"step_time_s": 0.1}), 0, 4, 0, resolve_dims("tiny"), 128, "bf16")
    clock = _FakeClock()
    step_times_s = _pace_phase(pacer, 6, 0.02, 0.03, monkeypatch, clock)
    assert step_times_s == pytest.approx([0.13] + [0.1] * 5, abs=1e-9)  # 0.63 s in all; without the carry 0.78 s
    assert pacer.slow_steps == 0
    # a new phase starts without the carry: its first step is padded to its whole target (0.07 s with it)
    assert _pace_phase(pacer, 1, 0.02, 0.0, monkeypatch, clock) == pytest.approx([0.1], abs=1e-9)


def test_a_wake_up_later_than_one_steps_pad_is_made_up_over_the_next_steps(monkeypatch):
    """0.1 s targets, 0.02 s of compute: the second sleep wakes 0.15 s late, more than the 0.08 s the next step
    can pad. Steps 3 and 4 take it off their pads (0.02 s, then 0.03 s), so the 6 steps last 6 x 0.1 s, as the
    emulated GPU's would; nothing is slow."""
    pacer = StepPacer(NodeSpec(name="a", emulate={"step_time_s": 0.1}), 0, 4, 0, resolve_dims("tiny"), 128, "bf16")
    clock = _FakeClock()
    clock.late_sleeps_s = [0.0, 0.15]
    step_times_s = _pace_phase(pacer, 6, 0.02, 0.0, monkeypatch, clock)
    assert step_times_s == pytest.approx([0.1, 0.25, 0.02, 0.03, 0.1, 0.1], abs=1e-9)
    assert sum(step_times_s) == pytest.approx(0.6, abs=1e-9)
    pacer.end_phase()
    assert pacer.slow_steps == 0


def test_a_phase_whose_last_wake_up_is_late_counts_one_slow_step(monkeypatch):
    """Nothing after a phase's last sleep can make up its delay: 0.02 s late on 0.1 s targets is 20 % of a step,
    more than LATE_PHASE_SHARE, and is said; 0.005 s late is not."""
    from geodiloco.lab.virtual_gpu import LATE_PHASE_SHARE

    pacer = StepPacer(NodeSpec(name="a", emulate={"step_time_s": 0.1}), 0, 4, 0, resolve_dims("tiny"), 128, "bf16")
    clock = _FakeClock()
    clock.late_sleeps_s = [0.0, 0.0, 0.02]
    assert sum(_pace_phase(pacer, 3, 0.02, 0.0, monkeypatch, clock)) == pytest.approx(0.32, abs=1e-9)
    assert 0.02 > LATE_PHASE_SHARE * 0.1 > 0.005
    pacer.end_phase()
    assert pacer.slow_steps == 1
    clock.late_sleeps_s = [0.0, 0.0, 0.005]
    _pace_phase(pacer, 3, 0.02, 0.0, monkeypatch, clock)
    pacer.end_phase()
    assert pacer.slow_steps == 1


def test_a_step_that_computes_past_its_target_keeps_its_time_and_counts_as_slow(monkeypatch):
    pacer = StepPacer(NodeSpec(name="a", emulate={"step_time_s": 0.05}), 0, 4, 0, resolve_dims("tiny"), 128, "bf16")
    step_times_s = _pace_phase(pacer, 2, 0.08, 0.0, monkeypatch)
    assert step_times_s == pytest.approx([0.08, 0.08], abs=1e-9)
    assert pacer.slow_steps == 2
