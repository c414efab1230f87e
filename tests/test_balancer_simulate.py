import json
from pathlib import Path

import numpy as np
import pytest

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.plan import Plan
from geodiloco.balancer.simulate import Slowdown, simulate
from geodiloco.runtime.cli import main
from test_balancer_helpers import nodes, planner

EXACT = {"simulation": {"model_error": 0.0, "step_noise": 0.0, "straggler_prob": 0.0, "drift_per_round": 0.0}}


def measured_nodes(fast_step_s=0.2):
    return [NodeSpec(name="n1", gpus=["slow"]),
            NodeSpec(name="n2", gpus=["fast"], measured={"batch_size": 4, "step_time_s": fast_step_s})]


def test_uniform_waits_for_the_slowest_node():
    result = simulate(planner("uniform", nodes("slow", "fast"), **EXACT), rounds=3)
    # 100 steps: 30 s on the slow node, 10 s on the fast one
    assert result.wait_s[:, 1] == pytest.approx([20.0, 20.0, 20.0])
    assert result.wait_s[:, 0] == pytest.approx([0.0, 0.0, 0.0])
    assert result.round_end[-1] == pytest.approx(90.0)
    assert result.summary()["tokens"] == 3 * 2 * 100 * 4 * 128


def test_the_idle_totals_weigh_each_node_by_its_gpus():
    # a 1-GPU slow node (30 s a round) and a 3-GPU fast node (10 s of compute, then 20 s waiting), no sync
    specs = [NodeSpec(name="n1", gpus=["slow"]), NodeSpec(name="n2", gpus=["fast", "fast", "fast"])]
    summary = simulate(planner("uniform", specs, **EXACT), rounds=3).summary()
    assert summary["gpu_s"] == pytest.approx(3 * (30.0 * 1 + 30.0 * 3))
    assert summary["gpu_idle_s"] == pytest.approx(summary["gpu_wait_s"]) == pytest.approx(3 * 20.0 * 3)
    assert summary["gpu_sync_s"] == pytest.approx(0.0, abs=1e-9)
    assert summary["gpu_idle_share"] == pytest.approx(0.5)
    assert summary["wait_s"] == pytest.approx(3 * 20.0)  # node-seconds, unweighted


def test_time_policy_calibrates_after_the_first_round():
    result = simulate(planner("time", measured_nodes(), **EXACT), rounds=3)
    # specs say 0.1 s on n2, truth is 0.2 s: 300 steps take 60 s in round 0, then 150 steps
    assert list(result.local_steps[:, 1]) == [300, 150, 150]
    assert result.wait_s[0, 0] == pytest.approx(30.0)
    assert result.wait_s[1:].sum() == pytest.approx(0.0, abs=1e-9)


def test_deadline_bounds_idle_by_one_step_even_when_predictions_are_wrong():
    result = simulate(planner("deadline", measured_nodes(), **EXACT), rounds=2)
    assert result.local_steps[0, 1] == 150
    step_s = np.array([0.3, 0.2])
    assert np.all(result.wait_s < step_s[None, :])


def test_adaptive_recovers_the_round_after_a_slowdown():
    result = simulate(planner("adaptive", nodes("slow", "fast", "mid"), **EXACT), rounds=5,
                      slowdowns=[Slowdown(node="n2", from_round=2, factor=2.0)])
    waits = result.wait_s.sum(axis=1)
    assert waits[2] > 10.0
    assert np.all(waits[[0, 1, 3, 4]] < 0.3)


def test_emulated_slowdown_schedule_is_ground_truth():
    specs = [NodeSpec(name="a", emulate={"step_time_s": 0.1, "batch_size": 4,
                                         "slowdown": [{"from_round": 1, "factor": 3.0, "until_round": 2}]}),
             NodeSpec(name="b", emulate={"step_time_s": 0.1, "batch_size": 4})]
    result = simulate(planner("uniform", specs, **EXACT), rounds=3)
    assert result.compute_s[:, 0] == pytest.approx([10.0, 30.0, 10.0])
    assert result.wait_s[:, 1] == pytest.approx([0.0, 20.0, 0.0])


def test_measured_fixed_fraction_scales_the_truth_with_batch():
    specs = [NodeSpec(name="a", gpus=["slow"], measured={"batch_size": 4, "step_time_s": 0.4, "fixed_fraction": 0.5}),
             NodeSpec(name="b", gpus=["slow"])]
    result = simulate(planner("uniform", specs, batch_size=8, **EXACT), rounds=1)
    # 100 steps x 0.4 s x (0.5 + 0.5 x 8/4)
    assert result.compute_s[0, 0] == pytest.approx(60.0)


def test_noise_is_reproducible_by_seed():
    def run(seed):
        options = {"simulation": {"step_noise": 0.05, "model_error": 0.2, "seed": seed}}
        return simulate(planner("deadline", nodes("slow", "fast", "mid"), **options), rounds=4).compute_s
    assert np.array_equal(run(1), run(1))
    assert not np.array_equal(run(1), run(2))


def test_round_time_is_compute_plus_wait_plus_sync():
    specs = nodes("slow", "fast", "mid", wan={"bandwidth_mbps": 10, "latency_ms": 20})
    result = simulate(planner("deadline", specs, simulation={"step_noise": 0.05}), rounds=3)
    totals = result.compute_s + result.wait_s + result.comm_s
    assert totals == pytest.approx(np.repeat((result.round_end - result.round_start)[:, None], 3, axis=1))
    assert np.all(result.comm_s > 0)


def test_out_dir_has_idle_and_plan_logs(tmp_path):
    result = simulate(planner("time", nodes("slow", "fast"), **EXACT), rounds=2, keep_plans=True)
    result.write(tmp_path, "sim-x", {"run": {"name": "sim-x"}})
    records = [json.loads(line) for line in (tmp_path / "idle.jsonl").read_text().splitlines()]
    assert len(records) == 4
    assert {r["source"] for r in records} == {"simulate"}
    assert records[1]["node"] == "n2" and records[1]["local_steps"] == 300 and records[1]["tokens"] == 300 * 4 * 128
    plans = [Plan.from_dict(json.loads(line)) for line in (tmp_path / "plan.jsonl").read_text().splitlines()]
    assert [p.round for p in plans] == [0, 1]
    assert plans[0].node("n2").local_steps == 300
    assert (tmp_path / "config.yaml").is_file()


def test_many_nodes_are_simulated_together():
    kinds = ["slow", "fast", "mid", "overhead"]
    specs = [NodeSpec(name=f"n{i}", gpus=[kinds[i % 4]]) for i in range(2000)]
    step_noise_only = {"simulation": {"straggler_prob": 0.0, "drift_per_round": 0.0}}
    result = simulate(planner("adaptive", specs, **step_noise_only), rounds=10)
    assert result.compute_s.shape == (10, 2000)
    phase_s = (result.compute_s + result.wait_s)[:, 0]
    waiting_share = result.wait_s.sum(axis=1) / (phase_s * 2000)
    # round 0 runs on specs that are 10 % off; once calibrated only per-step noise is left
    assert waiting_share[0] > 0.05
    assert np.all(waiting_share[2:] < 0.03)


CLUSTER = """
nodes:
  - {name: a, emulate: {step_time_s: 0.3, batch_size: 4}, wan: {bandwidth_mbps: 100}}
  - {name: b, emulate: {step_time_s: 0.1, batch_size: 4}, wan: {bandwidth_mbps: 100}}
"""


def test_cli_simulate_json_and_out(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    code = main(["simulate", "--cluster", str(cluster), "--policy", "time", "--rounds", "2", "--model", "tiny",
                 "--seq-len", "64", "--step-noise", "0", "--straggler-prob", "0", "--drift-per-round", "0",
                 "--json", "--out", str(tmp_path / "run")])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    assert [n["local_steps"] for n in summary["nodes"]] == [100, 300]
    assert summary["wait_s"] == pytest.approx(0.0, abs=1e-6)
    assert summary["comm_s"] > 0
    assert len((tmp_path / "run" / "idle.jsonl").read_text().splitlines()) == 4


def test_cli_simulate_leads_with_total_gpu_idle(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    args = ["simulate", "--cluster", str(cluster), "--policy", "uniform", "--rounds", "2", "--model", "tiny",
            "--seq-len", "64", "--step-noise", "0", "--straggler-prob", "0", "--drift-per-round", "0"]
    assert main([*args, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    idle_s = sum(node["wait_s"] + node["comm_s"] for node in summary["nodes"])  # one GPU per node here
    total_s = sum(node["compute_s"] + node["wait_s"] + node["comm_s"] for node in summary["nodes"])
    assert summary["wait_s"] > 0 and summary["comm_s"] > 0
    assert main(args) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("GPU idle"))
    assert line == (f"GPU idle {idle_s:,.1f} of {total_s:,.1f} GPU-s ({idle_s / total_s:.1%}): waiting "
                    f"{summary['wait_s']:,.1f}, exposed sync {summary['comm_s']:,.1f} GPU-s")


def test_cli_plan_json(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    assert main(["plan", "--cluster", str(cluster), "--policy", "uniform", "--model", "tiny", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["policy"] == "uniform"
    assert [n["predicted_compute_s"] for n in plan["nodes"]] == pytest.approx([30.0, 10.0])
    assert plan["nodes"][1]["predicted_idle_s"] == pytest.approx(20.0 + plan["nodes"][1]["predicted_comm_s"])


def test_cli_plan_weighs_gpu_idle_by_each_nodes_gpus(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the advice's lines fold at the terminal's width
    # a's one 2080 Ti and b's three A30s idle for different times; GPU time weighs b's three times
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("""
nodes:
  - {name: a, gpus: [RTX 2080 Ti], wan: {bandwidth_mbps: 100}}
  - {name: b, gpus: ["3 x A30"], wan: {bandwidth_mbps: 100}}
""")
    args = ["plan", "--cluster", str(cluster), "--policy", "uniform", "--model", "llama-150m", "--seq-len", "256"]
    assert main([*args, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    idle_a, idle_b = (node["predicted_idle_s"] for node in plan["nodes"])
    round_s = plan["predicted_round_s"]
    gpu_idle_s, gpu_s = 1 * idle_a + 3 * idle_b, 4 * round_s
    node_share = (idle_a + idle_b) / (2 * round_s)
    assert f"{gpu_idle_s / gpu_s:.1%}" != f"{node_share:.1%}"  # the weighing shows in the printed share
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (f"predicted round {round_s:.2f} s; GPU idle {gpu_idle_s:,.2f} of {gpu_s:,.2f} GPU-s "
            f"({gpu_idle_s / gpu_s:.1%}): waiting + exposed outer sync") in out, out
    assert f"summed over nodes: idle {idle_a + idle_b:,.2f} s" in out, out
    assert f"leaves {gpu_idle_s / gpu_s:.0%} of GPU time idle" in " ".join(out.split()), out


def test_cli_plan_table_is_not_folded_when_piped(capsys, monkeypatch):
    # captured output is not a terminal: the table keeps one line per node instead of rich's 80 columns
    monkeypatch.delenv("COLUMNS", raising=False)
    cluster = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "clusters" / "paper4.yaml"
    assert main(["plan", "--cluster", str(cluster), "--model", "tiny"]) == 0
    lines = capsys.readouterr().out.splitlines()
    node4 = [line for line in lines if "node4" in line]
    assert len(node4) == 1 and "2 x RTX 3090, 2 x V100 32GB" in node4[0]
    assert 80 < max(len(line) for line in lines) <= 160


def test_cli_plan_of_many_nodes_prints_a_summary_not_a_row_each(tmp_path, capsys):
    cluster = tmp_path / "many.yaml"
    nodes = "".join(f"  - {{name: n{index}, gpus: [{'A30' if index % 2 else 'RTX 2080 Ti'}]}}\n" for index in range(41))
    cluster.write_text("nodes:\n" + nodes)
    assert main(["plan", "--cluster", str(cluster), "--model", "llama-150m", "--policy", "time"]) == 0
    out = capsys.readouterr().out
    assert "41 nodes; per-node rows left out (use --json); local steps H" in out  # one line, never folded
    assert not any(line.lstrip("│ ").startswith("n40") for line in out.splitlines())
    assert main(["plan", "--cluster", str(cluster), "--model", "llama-150m", "--policy", "time", "--json"]) == 0
    steps = [node["local_steps"] for node in json.loads(capsys.readouterr().out)["nodes"]]
    assert f"local steps H {min(steps)}..{max(steps)}" in out and min(steps) < max(steps)


@pytest.mark.parametrize("extra, message", [
    (["--slowdown", "a:five:2"], "ROUND must be an integer"),
    (["--slowdown", "zz:1:2"], "unknown node 'zz'"),
    (["--set", "hysteresis=2"], "balancing.hysteresis"),
    (["--set", "reference_node=q"], "no node named 'q'"),
    (["--set", "hysteresis=[1"], "--set hysteresis: the value '[1' is not valid YAML"),
])
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path, capsys, extra, message):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    code = main(["simulate", "--cluster", str(cluster), "--policy", "adaptive", "--model", "tiny", *extra])
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_missing_cluster_file(tmp_path, capsys):
    assert main(["plan", "--cluster", str(tmp_path / "none.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize("overlap, hidden", [("none", False), ("streaming", True)])
def test_simulated_records_carry_the_hidden_sync_and_the_bytes_each_node_sends(tmp_path, capsys, overlap, hidden):
    from geodiloco.predictor.workload import parameter_count, preset_dims
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    code = main(["simulate", "--cluster", str(cluster), "--policy", "time", "--rounds", "2", "--model", "tiny",
                 "--seq-len", "64", "--overlap", overlap, "--compression", "none", "--step-noise", "0",
                 "--json", "--out", str(tmp_path / "run")])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)
    records = [json.loads(line) for line in (tmp_path / "run" / "idle.jsonl").read_text().splitlines()]
    # two nodes in a ring each send 2 (n - 1) / n = once the fp32 model
    assert {record["sync_bytes"] for record in records} == {4 * parameter_count(preset_dims("tiny"))}
    hidden_s = sum(record["comm_hidden_s"] for record in records)
    assert hidden_s == pytest.approx(summary["comm_hidden_s"])
    if hidden:
        # each round's fragments hide behind its phase, and the last round drains one more whole sync, exposed
        by_round = {record["round"]: record for record in records if record["node"] == "a"}
        assert by_round[0]["comm_s"] == pytest.approx(0.0, abs=1e-9)
        assert by_round[0]["comm_hidden_s"] > 0
        assert by_round[1]["comm_s"] == pytest.approx(by_round[0]["comm_hidden_s"])
        assert by_round[1]["comm_hidden_s"] == pytest.approx(by_round[0]["comm_hidden_s"])
    else:
        assert hidden_s == 0 and summary["comm_s"] > 0


def test_simulated_delayed_sync_hides_behind_the_next_round_and_the_last_round_drains_exposed(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    assert main(["simulate", "--cluster", str(cluster), "--policy", "time", "--rounds", "3", "--model", "tiny",
                 "--seq-len", "64", "--overlap", "delayed", "--compression", "none", "--step-noise", "0",
                 "--out", str(tmp_path / "run")]) == 0
    records = [json.loads(line) for line in (tmp_path / "run" / "idle.jsonl").read_text().splitlines()]
    comm = {record["round"]: (record["comm_s"], record["comm_hidden_s"]) for record in records if record["node"] == "a"}
    assert comm[0] == (pytest.approx(0.0, abs=1e-9), pytest.approx(0.0, abs=1e-9))  # nothing runs behind round 0
    one_sync_s = comm[1][1]
    assert one_sync_s > 0 and comm[1][0] == pytest.approx(0.0, abs=1e-9)  # round 0's sum hid behind round 1
    assert comm[2] == (pytest.approx(one_sync_s), pytest.approx(one_sync_s))  # hides round 1's, drains its own


def test_a_deadline_plan_shows_the_steps_each_node_is_expected_to_finish_beside_its_cap(tmp_path, capsys,
                                                                                         monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # one line per node, whatever the terminal
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    assert main(["plan", "--cluster", str(cluster), "--policy", "deadline", "--model", "tiny", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    for node in plan["nodes"]:
        assert node["expected_local_steps"] < node["local_steps"]  # the cap leaves room past the deadline
        assert node["expected_local_steps"] * node["predicted_step_s"] == pytest.approx(node["predicted_compute_s"])
    assert main(["plan", "--cluster", str(cluster), "--policy", "deadline", "--model", "tiny"]) == 0
    row_a = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("│ a "))
    a = plan["nodes"][0]
    assert f"{a['expected_local_steps']} of {a['local_steps']}" in row_a


def test_the_config_simulate_writes_reproduces_its_run_slowdowns_and_rounds_included(tmp_path, capsys):
    import json

    from geodiloco.runtime.cli import main
    cluster = str(Path(__file__).resolve().parents[1] / "experiments" / "configs" / "clusters" / "paper4.yaml")
    out = tmp_path / "sim"
    assert main(["simulate", "--cluster", cluster, "--policy", "uniform", "--rounds", "6", "--slowdown", "node1:2:2.0",
                 "--out", str(out), "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--cluster", str(out / "config.yaml"), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["rounds"] == first["rounds"] == 6
    assert again["idle_s"] == pytest.approx(first["idle_s"], rel=1e-12)
    assert main(["simulate", "--cluster", cluster, "--policy", "uniform", "--rounds", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["idle_s"] < first["idle_s"]  # the slowest node slowed: the others wait


def test_simulating_an_async_config_says_it_models_synchronous_rounds(capsys):
    config = str(Path(__file__).resolve().parents[1] / "experiments" / "configs" / "async.yaml")
    assert main(["simulate", "--cluster", config, "--rounds", "2", "--json"]) == 0
    assert "the file runs diloco.mode: async; simulate models synchronous rounds" in capsys.readouterr().err
