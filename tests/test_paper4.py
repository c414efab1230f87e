"""The paper4 reproduction (experiments/paper4): config building, parsing, and the --quick run end to end."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAPER4 = ROOT / "experiments" / "paper4"
sys.path.insert(0, str(PAPER4))

import configs  # noqa: E402
import runner  # noqa: E402
import tables  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- fast checks

def test_scaled_wan_gives_the_small_model_llama_150m_share_of_a_round():
    scaling = configs.Scaling(local_steps=20, time_scale=0.75, wan="scaled")
    # tiny: 467,584 parameters; llama-150m: 266,888,192; one round here = 20/100 x 0.75 of a paper round.
    expected_mbps = 1000.0 * 467_584 / 266_888_192 / (0.2 * 0.75)
    assert scaling.round_scale == pytest.approx(0.15)
    assert scaling.bandwidth_mbps() == pytest.approx(expected_mbps, rel=1e-9)
    assert configs.Scaling(wan="literal").bandwidth_mbps() == 1000.0


def test_node_offsets_make_batch_4_steps_last_the_paper_fitted_times():
    from geodiloco.lab.virtual_gpu import StepPacer
    from geodiloco.predictor.workload import resolve_dims
    from geodiloco.balancer.cluster import NodeSpec

    config = configs.run_config("uniform", configs.Scaling(time_scale=0.5), configs.SLOWDOWN)
    fitted_s = {"node1": 0.2946, "node2": 0.3045, "node3": 0.1589, "node4": 0.2549}
    for index, entry in enumerate(config["nodes"]):
        node = NodeSpec(**entry)
        pacer = StepPacer(node, index, 4, 0, resolve_dims("tiny"), 32, "bf16")
        assert pacer.nominal_step_s(0, 4) == pytest.approx(fitted_s[node.name] * 0.5, rel=1e-4)
        slowed = 2.0 if node.name == "node1" else 1.0
        assert pacer.nominal_step_s(5, 4) == pytest.approx(fitted_s[node.name] * 0.5 * slowed, rel=1e-4)
        assert pacer.nominal_step_s(4, 4) == pytest.approx(fitted_s[node.name] * 0.5, rel=1e-4)


def test_planner_prior_does_not_know_the_paper_fitted_offset():
    from geodiloco.balancer.config import BalancingConfig
    from geodiloco.balancer.planner import Planner
    from geodiloco.runtime.config import parse_config

    config = parse_config(configs.run_config("uniform", configs.Scaling(time_scale=1.0)), "paper4")
    planner = Planner(BalancingConfig(policy="uniform"), config.nodes, config.model.dims(), 32, 20, 4)
    predicted = {node.name: node.predicted_step_s for node in planner.plan(0).nodes}
    # The predictor's llama-150m estimate (node1 and node2 tie), not the fitted 0.2946 / 0.3045 s.
    assert predicted["node1"] == pytest.approx(predicted["node2"])
    assert predicted["node1"] < 0.2946 / 1.2


def test_slow_step_lines_are_parsed_per_node():
    console = ("[geodiloco] node node2: 3 steps were slower than the emulated GPU's target on this CPU; ...\n"
               "[geodiloco] run x finished\n"
               "[geodiloco] node node3: 27 steps were slower than the emulated GPU's target on this CPU; ...")
    assert runner.slow_steps_from_console(console) == {"node2": 3, "node3": 27}


def test_verdicts_compare_with_uniform_within_a_tolerance():
    rows = [{"policy": "time", "tokens_delta_vs_uniform": -0.05, "wall_delta_vs_uniform": 0.004},
            {"policy": "deadline", "tokens_delta_vs_uniform": 0.02, "wall_delta_vs_uniform": float("nan")},
            {"policy": "batch_by_flops", "tokens_delta_vs_uniform": 0.5, "wall_delta_vs_uniform": 0.5}]
    result = tables.verdicts(rows)
    assert result == {"time": {"equal_tokens": "better", "equal_wall_clock": "same (within 0.01)"},
                      "deadline": {"equal_tokens": "worse", "equal_wall_clock": "not comparable"}}


# ------------------------------------------------------------------------ --quick end to end

@pytest.fixture(scope="module")
def quick_results(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("paper4")
    results = base / "results"
    completed = subprocess.run([sys.executable, str(PAPER4 / "reproduce.py"), "--quick", "--rounds", "2", "--local-steps", "15", "--results", str(results),
                                "--runs-dir", str(base / "runs")], cwd=ROOT, capture_output=True, text=True,
                               timeout=280)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    return results


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_run_writes_every_output(quick_results: Path):
    for name in ("manifest.json", "environment.md", "idle.md", "convergence.md", "fidelity.md", "summary.md",
                 "results.json"):
        assert (quick_results / name).stat().st_size > 0, name
    for name in ("wait.png", "loss.png", "timeline.png"):
        assert (quick_results / name).read_bytes()[:8] == PNG_SIGNATURE, name
    for policy in configs.QUICK_POLICIES:
        assert (quick_results / "configs" / f"paper-{policy}.yaml").is_file()
        assert (quick_results / "runs" / f"paper-{policy}" / "idle.jsonl").is_file()
    manifest = json.loads((quick_results / "manifest.json").read_text())
    assert manifest["sites"] in ("netns", "local")
    assert [run["exit_code"] for run in manifest["runs"]] == [0] * len(configs.QUICK_POLICIES)
    assert "geodiloco run --config" in (quick_results / "environment.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_idle_table_has_every_policy_with_consistent_numbers(quick_results: Path):
    output = json.loads((quick_results / "results.json").read_text())
    manifest = output["manifest"]
    rows = {row["policy"]: row for row in output["idle"]}
    assert list(rows) == list(configs.QUICK_POLICIES)
    idle_md = (quick_results / "idle.md").read_text()
    round_scale = manifest["scaling"]["local_steps"] / 100 * manifest["scaling"]["time_scale"]
    for policy, row in rows.items():
        assert f"| {policy}" in idle_md
        records = read_jsonl(quick_results / "runs" / f"paper-{policy}" / "idle.jsonl")
        rounds = len({record["round"] for record in records})
        assert rounds == manifest["scaling"]["rounds"]
        for record in records:
            parts_s = record["compute_s"] + record["wait_s"] + record["comm_s"] + record["overhead_s"]
            assert parts_s == pytest.approx(record["round_end"] - record["round_start"], abs=1e-3)
        for node, wait_s in row["wait_s_per_round"].items():
            logged = sum(record["wait_s"] for record in records if record["node"] == node) / rounds
            assert wait_s == pytest.approx(logged, rel=1e-9)
        assert row["total_wait_s_per_round"] == pytest.approx(sum(row["wait_s_per_round"].values()))
        assert row["paper_scale_wait_s_per_round"] == pytest.approx(row["total_wait_s_per_round"] / round_scale)
        assert 0.0 <= row["total_wait_share"] < 1.0
        assert all(math.isfinite(value) for value in row["wait_s_per_round"].values())
    uniform = rows["uniform"]
    assert uniform["wait_change_vs_uniform"] == 0.0
    assert uniform["paper_change_vs_baseline"] == 0.0
    assert rows["steps_by_flops"]["paper_change_vs_baseline"] == pytest.approx(12.6 / 20.6 - 1.0, abs=1e-3)
    for row in rows.values():
        assert row["wait_change_vs_uniform"] == pytest.approx(
            row["total_wait_s_per_round"] / uniform["total_wait_s_per_round"] - 1.0)
    # The A30 node is the fastest: under uniform work it waits the most; time balancing removes most waiting.
    assert max(uniform["wait_s_per_round"], key=uniform["wait_s_per_round"].get) == "node3"
    assert rows["deadline"]["total_wait_s_per_round"] < 0.5 * uniform["total_wait_s_per_round"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_runs_follow_the_policies_and_the_emulated_gpus(quick_results: Path):
    steps = {}
    for policy in configs.QUICK_POLICIES:
        for record in read_jsonl(quick_results / "runs" / f"paper-{policy}" / "idle.jsonl"):
            assert record["batch_size"] == 4
            steps.setdefault(policy, {}).setdefault(record["node"], set()).add(record["local_steps"])
    assert steps["uniform"] == {name: {15} for name in ("node1", "node2", "node3", "node4")}
    # Policy C: H_i = round(15 x mean FP16 TFLOPS / the smallest): 15 x 1.037, 1.450, 1.173.
    assert steps["steps_by_flops"] == {"node1": {15}, "node2": {16}, "node3": {22}, "node4": {18}}
    output = json.loads((quick_results / "results.json").read_text())
    for row in output["fidelity"]:
        for node, ratio in row["compute_over_target"].items():
            assert 0.99 <= ratio < 1.5, (row["run"], node, ratio)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_quick_convergence_numbers_are_finite_and_match_the_logs(quick_results: Path):
    output = json.loads((quick_results / "results.json").read_text())
    convergence = output["convergence"]
    rows = {row["policy"]: row for row in convergence["rows"]}
    assert list(rows) == list(configs.QUICK_POLICIES)
    for policy, row in rows.items():
        records = read_jsonl(quick_results / "runs" / f"paper-{policy}" / "idle.jsonl")
        assert row["tokens"] == sum(record["tokens"] for record in records)
        for key in ("final_eval_loss", "loss_at_equal_wall", "loss_at_equal_tokens", "samples_per_hour"):
            assert math.isfinite(row[key]), (policy, key)
        assert row["final_eval_loss"] < math.log(256)
    fewest = min(rows.values(), key=lambda row: row["tokens"])
    assert convergence["equal_tokens"] == fewest["tokens"]
    assert fewest["loss_at_equal_tokens"] == pytest.approx(fewest["final_eval_loss"])
    assert rows["uniform"]["throughput_vs_uniform"] == 1.0
    assert set(convergence["verdicts"]) == {"steps_by_flops", "deadline"}
