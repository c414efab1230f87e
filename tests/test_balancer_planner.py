import pytest

from geodiloco.balancer.plan import RoundMeasurement
from geodiloco.common.schema import ConfigError
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
    # one measured round moves the calibration to within its assumed round noise of the measurement
    assert second.nodes[1].predicted_step_s == pytest.approx(0.2, rel=2e-3)


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
    assert second.nodes[0].predicted_compute_s == pytest.approx(60.0, rel=2e-3)
    assert second.nodes[1].predicted_wait_s == pytest.approx(50.0, rel=2e-3)


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


def _sync_planner(mbps: float, overlap: str, codec: str = "none", **balancing):
    from geodiloco.balancer.cluster import NodeSpec
    from geodiloco.balancer.config import BalancingConfig
    from geodiloco.balancer.network import SyncSettings
    from geodiloco.balancer.planner import Planner
    from geodiloco.predictor.workload import preset_dims
    nodes = [NodeSpec(name="slow", emulate={"step_time_s": 0.2}, wan={"bandwidth_mbps": mbps}),
             NodeSpec(name="fast", emulate={"step_time_s": 0.1}, wan={"bandwidth_mbps": mbps})]
    return Planner(BalancingConfig(policy="time", **balancing), nodes, preset_dims("tiny"), 64, 10, 4,
                   sync_settings=SyncSettings(overlap, codec))


def test_time_policy_lengthens_the_phase_until_an_overlapped_sync_hides():
    planner = _sync_planner(mbps=5.0, overlap="delayed")
    sync_s = planner.sync.sync_s()
    assert 2.0 < sync_s < 4.0  # longer than the baseline phase (10 steps x 0.2 s) and < 2x it
    plan = planner.plan(0)
    slow = plan.node("slow")
    assert slow.predicted_compute_s >= sync_s
    assert slow.local_steps > 10 and plan.node("fast").local_steps >= 2 * 10
    assert all(node.predicted_comm_s == 0.0 for node in plan.nodes) and plan.sync_advice is None


def test_plan_says_what_would_hide_a_sync_that_no_sensible_phase_hides():
    planner = _sync_planner(mbps=1.0, overlap="delayed")  # fp32 sync ~ 15 s, phase at most 2 x 2 s
    plan = planner.plan(0)
    assert plan.node("slow").local_steps == 20  # stretched to max_phase_stretch (2x), no further
    assert plan.node("slow").predicted_comm_s == pytest.approx(planner.sync.sync_s() - 4.0, rel=0.02)
    assert "diloco.compression: int8" in plan.sync_advice
    steps_needed = int(plan.sync_advice.split("diloco.local_steps: ")[1].split(" ")[0])
    assert steps_needed * 0.2 >= planner.sync.sync_s() * 0.99
    assert planner.sync.codec_sync_s("int8") <= 4.0


def test_plan_advises_overlap_for_a_blocking_sync_that_takes_a_large_share():
    plan = _sync_planner(mbps=5.0, overlap="none").plan(0)
    assert plan.sync_advice.startswith("the outer sync") and "diloco.overlap: streaming" in plan.sync_advice
    assert _sync_planner(mbps=10_000.0, overlap="none").plan(0).sync_advice is None


@pytest.mark.parametrize("config_file", ["runtime/default.yaml", "experiments/configs/hivemind.yaml",
                                         "experiments/configs/async.yaml", "experiments/configs/hide_sync.yaml"])
def test_plan_on_a_run_config_models_the_sync_the_run_will_use(config_file):
    from pathlib import Path

    from geodiloco.balancer.setup import load_setup
    from geodiloco.runtime.config import load_config
    from geodiloco.runtime.trainer import planned_sync
    path = Path(__file__).resolve().parents[1] / config_file
    run = planned_sync(load_config(str(path)))
    sync = load_setup(str(path)).sync
    assert (sync.overlap, sync.codec, sync.backend) == (run.overlap, run.codec, run.backend)
    if config_file.endswith("hivemind.yaml"):  # comm.hivemind.compression: fp16 is what its wire carries
        assert (sync.overlap, sync.codec, sync.backend) == ("none", "fp16", "hivemind")


def test_a_hivemind_plan_offers_what_hivemind_has_and_no_mode_advice(capsys):
    from pathlib import Path

    from geodiloco.runtime.cli import main
    config = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "hivemind.yaml"
    assert main(["plan", "--cluster", str(config), "--json"]) == 0
    import json
    plan = json.loads(capsys.readouterr().out)
    assert plan["mode_advice"] is None  # async DiLoCo is torch-only
    advice = plan["sync_advice"]
    assert "(the hivemind backend does not overlap it)" in advice
    assert "comm.hivemind.compression: 8bit" in advice and "streaming" not in advice


def test_plan_on_a_bare_cluster_file_models_a_blocking_sync_and_refuses_zero_steps():
    from pathlib import Path

    from geodiloco.balancer.setup import load_setup
    cluster = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "clusters" / "paper4.yaml"
    assert (load_setup(str(cluster)).sync.overlap, load_setup(str(cluster)).sync.codec) == ("none", "none")
    for option in ("local_steps", "batch_size", "seq_len"):
        with pytest.raises(ConfigError, match="must be a positive integer, got 0"):
            load_setup(str(cluster), **{option: 0})


def test_an_async_run_config_without_a_policy_is_planned_with_adaptive_as_the_run_uses(tmp_path):
    from geodiloco.balancer.setup import load_setup
    from geodiloco.runtime.config import load_config
    path = tmp_path / "async.yaml"
    path.write_text('diloco: {mode: async}\nnodes:\n  - {name: a, gpus: ["A30"]}\n  - {name: b, gpus: ["RTX 3090"]}\n')
    assert load_config(str(path)).balancing.policy == "adaptive"  # the run's own default
    assert load_setup(str(path)).balancing.policy == "adaptive"
    assert load_setup(str(path), policy="time").balancing.policy == "time"
    path.write_text(path.read_text().replace("diloco: {mode: async}", "diloco: {mode: sync}"))
    assert load_setup(str(path)).balancing.policy == "uniform"


def test_plan_set_takes_the_runs_full_balancing_path_and_names_its_scope_for_other_sections(capsys):
    from pathlib import Path

    from geodiloco.runtime.cli import main
    cluster = str(Path(__file__).resolve().parents[1] / "experiments" / "configs" / "clusters" / "paper4.yaml")
    assert main(["plan", "--cluster", cluster, "--policy", "adaptive", "--set", "balancing.hysteresis=0.05",
                 "--json"]) == 0
    capsys.readouterr()
    assert main(["plan", "--cluster", cluster, "--set", "diloco.rounds=3"]) == 2
    assert "--set 'diloco.rounds=3': plan and simulate set balancing: options only" in capsys.readouterr().err
