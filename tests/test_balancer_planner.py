import pytest

from balancer.plan import RoundMeasurement
from test_balancer_helpers import nodes, planner


def measure(plan_, name, step_s, round_idx):
    node = plan_.node(name)
    return RoundMeasurement(node=name, round=round_idx, batch_size=node.batch_size, local_steps=node.local_steps,
                            step_times_s=[step_s] * 5 + [10 * step_s])


def feed(planner_, plan_, step_s_by_node, round_idx):
    for name, step_s in step_s_by_node.items():
        planner_.observe(measure(plan_, name, step_s, round_idx))


def test_adaptive_replans_from_measured_step_times():
    balancer = planner("adaptive", nodes("slow", "fast"))
    first = balancer.plan(0)
    assert [n.local_steps for n in first.nodes] == [100, 300]
    # the fast node turns out to run at 0.2 s per step (median; the 10x outlier is ignored)
    feed(balancer, first, {"n1": 0.3, "n2": 0.2}, 0)
    second = balancer.plan(1)
    assert [n.local_steps for n in second.nodes] == [100, 150]
    assert second.nodes[1].predicted_step_s == pytest.approx(0.2)


def test_adaptive_keeps_its_plan_for_small_deviations():
    balancer = planner("adaptive", nodes("slow", "fast"), hysteresis=0.05)
    first = balancer.plan(0)
    feed(balancer, first, {"n1": 0.3, "n2": 0.101}, 0)
    second = balancer.plan(1)
    # 300 steps x 0.101 s = 30.3 s vs 30 s: 0.5 % waiting, under the 5 % hysteresis
    assert [n.local_steps for n in second.nodes] == [100, 300]


def test_time_policy_calibrates_once_then_keeps_the_plan():
    balancer = planner("time", nodes("slow", "fast"), calibration_rounds=1)
    first = balancer.plan(0)
    feed(balancer, first, {"n1": 0.3, "n2": 0.15}, 0)
    second = balancer.plan(1)
    assert [n.local_steps for n in second.nodes] == [100, 200]
    feed(balancer, second, {"n1": 0.3, "n2": 0.3}, 1)
    assert [n.local_steps for n in balancer.plan(2).nodes] == [100, 200]


def test_specs_only_time_policy_ignores_measurements():
    balancer = planner("time", nodes("slow", "fast"), calibration_rounds=0)
    first = balancer.plan(0)
    feed(balancer, first, {"n1": 0.3, "n2": 0.15}, 0)
    assert [n.local_steps for n in balancer.plan(1).nodes] == [100, 300]


def test_static_policy_predictions_use_measurements_but_plans_do_not():
    balancer = planner("uniform", nodes("slow", "fast"))
    first = balancer.plan(0)
    feed(balancer, first, {"n1": 0.6, "n2": 0.1}, 0)
    second = balancer.plan(1)
    assert [n.local_steps for n in second.nodes] == [100, 100]
    assert second.nodes[0].predicted_compute_s == pytest.approx(60.0)
    assert second.nodes[1].predicted_wait_s == pytest.approx(50.0)


def test_measurement_without_step_list_uses_compute_over_steps():
    balancer = planner("adaptive", nodes("slow", "fast"))
    balancer.plan(0)
    balancer.observe(RoundMeasurement(node="n2", round=0, batch_size=4, local_steps=300, compute_s=60.0))
    assert [n.local_steps for n in balancer.plan(1).nodes] == [100, 150]


def test_measurement_for_unknown_node_is_refused():
    balancer = planner("adaptive", nodes("slow", "fast"))
    with pytest.raises(KeyError, match="n7"):
        balancer.observe(RoundMeasurement(node="n7", round=0, batch_size=4, local_steps=1, compute_s=1.0))


def test_same_measurements_give_the_same_plan_on_every_node():
    plans = []
    for _ in range(2):
        balancer = planner("deadline", nodes("slow", "fast", "mid"))
        first = balancer.plan(0)
        feed(balancer, first, {"n1": 0.31, "n2": 0.12, "n3": 0.19}, 0)
        plans.append(balancer.plan(1).to_json())
    assert plans[0] == plans[1]
