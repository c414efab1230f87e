import math

import numpy as np
import pytest

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.config import BalancingConfig
from geodiloco.balancer.planner import Planner
from geodiloco.balancer.policies import fill_steps
from geodiloco.common.schema import ConfigError, validate
from geodiloco.predictor.workload import preset_dims
from test_balancer_helpers import LinearModel, nodes, planner


def steps_and_batches(plan):
    return [node.local_steps for node in plan.nodes], [node.batch_size for node in plan.nodes]


def test_fill_steps_leaves_less_than_one_step_per_node():
    step_s = np.array([0.3, 0.07, 0.25])
    steps = fill_steps(step_s, 30.0, BalancingConfig())
    assert list(steps) == [100, 428, 120]
    phase_s = max(steps * step_s)
    assert np.all(phase_s - steps * step_s < step_s)


def test_uniform_uses_baseline_and_per_node_overrides():
    specs = nodes("slow", "fast")
    specs[1] = NodeSpec(name="n2", gpus=["fast"], local_steps=300, batch_size=8)
    plan = planner("uniform", specs).plan(0)
    assert steps_and_batches(plan) == ([100, 300], [4, 8])
    assert plan.weighting == "uniform"
    # slow: 100 x 0.3 s = 30 s; fast: 300 x 0.2 s = 60 s
    assert [node.predicted_wait_s for node in plan.nodes] == pytest.approx([30.0, 0.0])


def test_time_policy_equalizes_the_local_phase_on_the_slowest_node():
    plan = planner("time", nodes("slow", "fast", "mid")).plan(0)
    # step times at B=4: 0.3, 0.1, 0.2 s; the slowest does its 100 steps in 30 s
    assert steps_and_batches(plan) == ([100, 300, 150], [4, 4, 4])
    assert plan.predicted_idle_s == pytest.approx(0.0, abs=1e-9)
    assert plan.weighting == "normalized"


def test_time_policy_reference_fastest_or_named_node():
    # steps of 0.3 / 0.1 / 0.2 s. Reference fastest: 100 x 0.1 = 10 s fits 33 / 100 / 50 steps, leaving
    # the slow node 0.1 s idle; ending the phase at the slow node's 34th step (10.2 s) fits 102 and 51
    # steps exactly: no idle at all.
    fastest = planner("time", nodes("slow", "fast", "mid"), reference_node="fastest").plan(0)
    assert steps_and_batches(fastest)[0] == [34, 102, 51]
    assert fastest.predicted_idle_s == pytest.approx(0.0, abs=1e-9)
    # Reference n3 (mid): 20 s fits 66 / 200 / 100 (0.2 s idle); 20.2 s fits 67 / 202 / 101 (0.1 s idle).
    named = planner("time", nodes("slow", "fast", "mid"), reference_node="n3").plan(0)
    assert steps_and_batches(named)[0] == [67, 202, 101]
    assert named.predicted_idle_s == pytest.approx(0.1, abs=1e-9)


def test_unknown_reference_node_is_a_config_error():
    with pytest.raises(ConfigError, match="reference_node: no node named 'n9'"):
        planner("time", nodes("slow", "fast"), reference_node="n9")


def test_round_time_target_leaves_room_for_the_outer_sync():
    specs = nodes("slow", "fast", wan={"bandwidth_mbps": 10})
    plan = planner("time", specs, round_time_s=40.0).plan(0)
    comm_s = plan.nodes[0].predicted_comm_s
    assert comm_s > 0
    budget_s = 40.0 - comm_s
    assert plan.nodes[0].local_steps == math.floor(budget_s / 0.3)
    assert plan.predicted_round_s <= 40.0 + 1e-9
    with pytest.raises(ConfigError, match="round_time_s"):
        planner("time", specs, round_time_s=comm_s / 2).plan(0)


def test_max_comm_fraction_stretches_the_local_phase():
    specs = nodes("slow", "fast", wan={"bandwidth_mbps": 0.5})
    plan = planner("time", specs, max_comm_fraction=0.2).plan(0)
    comm_s = plan.nodes[0].predicted_comm_s
    phase_s = max(node.predicted_compute_s for node in plan.nodes)
    # the sync may take 20 % of the round: the phase is 4 x the sync, less than one 0.3 s step
    assert comm_s * 0.8 / 0.2 - 0.3 < phase_s <= comm_s * 0.8 / 0.2 + 1e-9


def test_source_paper_policies_reproduce_table_2():
    paper_tflops = {"RTX 2080 Ti": 113.8, "Titan RTX": 130.0, "A30": 165.0, "RTX 3090": 142.0, "V100": 125.0}
    specs = [NodeSpec(name="1", gpus=["4 x RTX 2080 Ti"]), NodeSpec(name="2", gpus=["3 x RTX 2080 Ti", "Titan RTX"]),
             NodeSpec(name="3", gpus=["4 x A30"]), NodeSpec(name="4", gpus=["2 x RTX 3090", "2 x V100"])]

    def make(policy):
        return Planner(BalancingConfig(policy=policy), specs, preset_dims("tiny"), 128, 100, 4,
                       model_factory=lambda gpus, micro: LinearModel(0.0, 0.05, 32),
                       tflops_lookup=paper_tflops.__getitem__)

    assert steps_and_batches(make("steps_by_flops").plan(0)) == ([100, 104, 145, 117], [4, 4, 4, 4])
    assert steps_and_batches(make("batch_by_flops").plan(0)) == ([100, 100, 100, 100], [4, 4, 6, 5])
    assert make("batch_by_flops").plan(0).weighting == "tokens"


def test_max_batch_by_memory_doubles_or_takes_the_exact_fit():
    # memory fits 16, 64, 32 samples; 10 % headroom leaves 14, 57, 28
    doubling = planner("max_batch_by_memory", nodes("slow", "fast", "mid")).plan(0)
    assert steps_and_batches(doubling)[1] == [8, 32, 16]
    exact = planner("max_batch_by_memory", nodes("slow", "fast", "mid"), batch_search="exact").plan(0)
    assert steps_and_batches(exact)[1] == [14, 57, 28]


def test_hybrid_grows_the_batch_only_where_throughput_gains():
    time_plan = planner("time", nodes("slow", "overhead")).plan(0)
    plan = planner("hybrid", nodes("slow", "overhead")).plan(0)
    steps, batches = steps_and_batches(plan)
    # overhead GPU: t(B) = 0.2 + 0.025 B; within 5 % of its best throughput (B=16, 4 x baseline) needs B >= 14
    assert 14 <= batches[1] <= 16
    assert 2 <= batches[0] <= 8
    phase_s = max(node.predicted_compute_s for node in plan.nodes)
    for node in plan.nodes:
        assert phase_s - node.predicted_compute_s < node.predicted_step_s
    samples = sum(n.local_steps * n.batch_size for n in plan.nodes)
    time_samples = sum(n.local_steps * n.batch_size for n in time_plan.nodes)
    assert samples > time_samples


def test_hybrid_tokens_target_sets_the_phase():
    plan = planner("hybrid", nodes("slow", "fast"), tokens_per_round=128 * 1000).plan(0)
    samples = sum(n.local_steps * n.batch_size for n in plan.nodes)
    assert samples == pytest.approx(1000, rel=0.05)


def test_deadline_plan_caps_steps_and_sets_the_deadline():
    plan = planner("deadline", nodes("slow", "fast")).plan(0)
    assert steps_and_batches(plan)[0] == [125, 375]
    assert plan.nodes[0].deadline_s == pytest.approx(30.0)
    assert plan.nodes[1].deadline_s == pytest.approx(30.0)


def test_weighting_override_wins_over_the_policy_default():
    assert planner("time", nodes("slow", "fast"), weighting="tokens").plan(0).weighting == "tokens"


def test_bounds_are_respected():
    plan = planner("time", nodes("slow", "fast"), max_local_steps=200).plan(0)
    assert steps_and_batches(plan)[0] == [100, 200]


def test_unknown_and_inconsistent_options_are_rejected():
    with pytest.raises(ConfigError, match="balancing.hysterisis: unknown key"):
        validate(BalancingConfig, {"policy": "adaptive", "hysterisis": 0.1}, "run.yaml", prefix="balancing")
    with pytest.raises(ConfigError, match="max_local_steps"):
        validate(BalancingConfig, {"min_local_steps": 10, "max_local_steps": 5}, "run.yaml", prefix="balancing")
    with pytest.raises(ConfigError, match="policy"):
        validate(BalancingConfig, {"policy": "fastest"}, "run.yaml", prefix="balancing")


def test_plan_is_deterministic_and_round_trips_through_json():
    first = planner("hybrid", nodes("slow", "fast", "overhead")).plan(3)
    second = planner("hybrid", nodes("slow", "fast", "overhead")).plan(3)
    assert first.to_json() == second.to_json()
    from geodiloco.balancer.plan import Plan
    import json
    assert Plan.from_dict(json.loads(first.to_json())) == first
