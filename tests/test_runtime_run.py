"""`geodiloco run` end to end: 4 nodes, emulated GPUs, per-node plans, logs, kill and resume."""
import json
import os
from pathlib import Path
import re
import shutil
import signal
import subprocess
import time

import pytest
import torch

from geodiloco.balancer.records import REQUIRED_FIELDS
from geodiloco.runtime import checkpoint
from tests.runtime_helpers import geodiloco, read_jsonl, small_config, start_run, write_config

pytestmark = pytest.mark.slow

EMULATED_NODES = [
    {"name": "slow", "site": "seoul", "gpus": ["4 x RTX 2080 Ti"], "local_steps": 4, "batch_size": 4,
     "emulate": {"step_time_s": 0.20}},
    {"name": "mid", "site": "daejeon", "gpus": ["2 x RTX 3090"], "local_steps": 5, "batch_size": 2,
     "emulate": {"step_time_s": 0.15, "batch_size": 4}},
    {"name": "fast", "site": "busan", "gpus": ["4 x A30"], "local_steps": 8, "batch_size": 4,
     "emulate": {"step_time_s": 0.10}},
    {"name": "slowed", "site": "gwangju", "gpus": ["V100-SXM2-32GB"], "local_steps": 4, "batch_size": 4,
     "emulate": {"step_time_s": 0.10, "slowdown": [{"from_round": 1, "factor": 2.0}]}},
]


@pytest.fixture(scope="module")
def four_node_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("four")
    config = small_config(EMULATED_NODES)
    config["diloco"]["rounds"] = 3
    run_dir = tmp_path / "run"
    result = geodiloco("run", "--sites", "local", "--no-report", "--config", str(write_config(tmp_path, config)),
                       "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir, result


def expected_step_s(node: dict, round_idx: int) -> float:
    emulate = node["emulate"]
    step_s = emulate["step_time_s"] * node["batch_size"] / emulate.get("batch_size", 4)
    for event in emulate.get("slowdown", []):
        if round_idx >= event["from_round"]:
            step_s *= event["factor"]
    return step_s


def test_run_directory_holds_every_log(four_node_run):
    run_dir, result = four_node_run
    for name in ("config.yaml", "metrics.jsonl", "idle.jsonl", "plan.jsonl", "checkpoints/latest"):
        assert (run_dir / name).is_file(), name
    assert "round 3/3" in result.stdout
    assert checkpoint.latest_round(run_dir) == 2


def test_idle_log_has_one_record_per_node_and_round(four_node_run):
    records = read_jsonl(four_node_run[0] / "idle.jsonl")
    assert sorted((r["round"], r["node"]) for r in records) == sorted(
        (round_idx, node["name"]) for round_idx in range(3) for node in EMULATED_NODES)
    for record in records:
        assert set(REQUIRED_FIELDS) <= set(record)
        assert len({r["run_id"] for r in records}) == 1


def test_per_node_plan_is_honoured(four_node_run):
    records = read_jsonl(four_node_run[0] / "idle.jsonl")
    for record in records:
        node = next(node for node in EMULATED_NODES if node["name"] == record["node"])
        assert (record["local_steps"], record["batch_size"]) == (node["local_steps"], node["batch_size"])
        assert record["tokens"] == node["local_steps"] * node["batch_size"] * 32
        assert record["site"] == node["site"]
    plans = read_jsonl(four_node_run[0] / "plan.jsonl")
    assert [plan["round"] for plan in plans] == [0, 1, 2]


def test_emulated_step_times_are_honoured(four_node_run):
    # a node whose CPU could not keep up with its target says so and keeps the real (longer) time
    late = set(re.findall(r"node (\S+): \d+ steps were slower than the emulated GPU's target",
                          four_node_run[1].stderr))
    for record in read_jsonl(four_node_run[0] / "idle.jsonl"):
        node = next(node for node in EMULATED_NODES if node["name"] == record["node"])
        per_step_s = record["compute_s"] / record["local_steps"]
        expected_s = expected_step_s(node, record["round"])
        if node["name"] in late:
            assert per_step_s >= expected_s * 0.9, record
        else:
            assert per_step_s == pytest.approx(expected_s, rel=0.10), record


def test_phases_add_up_to_the_round_wall_time(four_node_run):
    for record in read_jsonl(four_node_run[0] / "idle.jsonl"):
        wall_s = record["round_end"] - record["round_start"]
        phases_s = record["compute_s"] + record["wait_s"] + record["comm_s"] + record["overhead_s"]
        assert phases_s == pytest.approx(wall_s, rel=0.02)


def test_fast_nodes_wait_for_the_slowest(four_node_run):
    records = read_jsonl(four_node_run[0] / "idle.jsonl")
    for round_idx in range(3):
        this_round = {r["node"]: r for r in records if r["round"] == round_idx}
        done_at = {name: r["round_start"] + r["compute_s"] for name, r in this_round.items()}
        last_done = max(done_at.values())
        # the barrier's own latency: up to a tenth of a second or so on two loaded cores (the waits here are 0.2-0.5 s)
        barrier_s = 0.15
        assert this_round[max(done_at, key=done_at.get)]["wait_s"] < barrier_s
        for name, record in this_round.items():
            # wait = time from this node's end of local phase until the last peer's (one clock); the last
            # round's also holds the wait at the run's end (test_the_run_end_is_counted_in_every_node_last_record)
            if round_idx < 2:
                assert record["wait_s"] == pytest.approx(last_done - done_at[name], abs=barrier_s)
            else:
                assert record["wait_s"] >= last_done - done_at[name] - barrier_s


def test_the_run_end_is_counted_in_every_node_last_record(four_node_run):
    # the nodes leave together (the last exchange waits for the slowest node's last checkpoint write),
    # so every node's last record ends at the same moment and the span to it is in the record's parts
    last = [r for r in read_jsonl(four_node_run[0] / "idle.jsonl") if r["round"] == 2]
    assert len(last) == len(EMULATED_NODES)
    assert max(r["round_end"] for r in last) - min(r["round_end"] for r in last) < 1e-6


def _wait_for_checkpoint(run_dir, round_idx, process, timeout_s=90):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (checkpoint.latest_round(run_dir) or -1) >= round_idx:
            return
        assert process.poll() is None, process.communicate()[1][-2000:]
        time.sleep(0.1)
    raise AssertionError("no checkpoint appeared")


def _children_of(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(line) for line in found.stdout.split()]


def _assert_all_gone(pids: list[int]) -> None:
    """No orphan: every node process has exited and been reaped."""
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_killed_run_resumes_to_the_same_parameters(tmp_path):
    nodes = [{"name": "a", "local_steps": 3, "batch_size": 4, "emulate": {"step_time_s": 0.05}},
             {"name": "b", "local_steps": 2, "batch_size": 4, "emulate": {"step_time_s": 0.08}}]
    config = small_config(nodes, run={"name": "resume", "out_dir": "runs", "seed": 3, "deterministic": True})
    config["diloco"]["rounds"] = 5
    config_path = write_config(tmp_path, config)

    straight_dir = tmp_path / "straight"
    result = geodiloco("run", "--sites", "local", "--no-report", "--config", str(config_path),
                       "--run-dir", str(straight_dir))
    assert result.returncode == 0, result.stderr[-3000:]

    resumed_dir = tmp_path / "resumed"
    launcher = start_run(config_path, resumed_dir, "--sites", "local")
    _wait_for_checkpoint(resumed_dir, 1, launcher)
    children = _children_of(launcher.pid)
    node_b = next(pid for pid in children if b"GEODILOCO_NODE=b\0" in Path(f"/proc/{pid}/environ").read_bytes())
    os.kill(node_b, signal.SIGKILL)  # mid-round, no chance to clean up
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGKILL  # as a shell reports a killed process
    assert "node b failed (killed by SIGKILL); the other nodes were stopped" in stderr
    assert f"last lines of node b (all of it: {resumed_dir / 'logs' / 'b.log'})" in stderr
    assert "continue with: geodiloco run --resume" in stderr and "Traceback" not in stderr
    assert "round" in (resumed_dir / "logs" / "a.log").read_text()
    _assert_all_gone(children)
    interrupted_at = checkpoint.latest_round(resumed_dir)
    assert interrupted_at is not None and interrupted_at < 4

    result = geodiloco("run", "--sites", "local", "--no-report", "--config", str(config_path),
                       "--run-dir", str(resumed_dir), "--resume")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming" in result.stdout

    straight = checkpoint.load_global(straight_dir, 4)["outer"]
    resumed = checkpoint.load_global(resumed_dir, 4)["outer"]
    for got, want in zip(resumed["global_params"], straight["global_params"]):
        assert torch.equal(got, want)
    assert resumed["optimizer"]["state"][0]["momentum_buffer"].equal(straight["optimizer"]["state"][0]["momentum_buffer"])
    rounds = sorted((r["round"], r["node"]) for r in read_jsonl(resumed_dir / "idle.jsonl"))
    assert rounds == sorted((round_idx, name) for round_idx in range(5) for name in ("a", "b"))


def test_existing_run_directory_is_not_overwritten_without_resume(tmp_path):
    nodes = [{"name": "a", "emulate": {"step_time_s": 0.01}}, {"name": "b", "emulate": {"step_time_s": 0.01}}]
    config = small_config(nodes)
    config["diloco"].update({"rounds": 1, "local_steps": 1})
    config_path = write_config(tmp_path, config)
    first = geodiloco("run", "--sites", "local", "--no-report", "--config", str(config_path), "--run-dir", str(tmp_path / "r"))
    assert first.returncode == 0, first.stderr[-2000:]
    saved_config = (tmp_path / "r" / "config.yaml").read_bytes()
    config["optim"]["inner"]["lr"] = 0.5
    again = geodiloco("run", "--sites", "local", "--no-report", "--config", str(write_config(tmp_path, config)),
                      "--run-dir", str(tmp_path / "r"))
    assert again.returncode == 2
    assert "already holds a checkpoint (after round 1); pass --resume" in again.stderr
    assert "Traceback" not in again.stderr
    assert (tmp_path / "r" / "config.yaml").read_bytes() == saved_config  # refused before writing anything

    changed = geodiloco("run", "--sites", "local", "--no-report", "--resume", "--run-dir", str(tmp_path / "r"),
                        "--set", "model.seq_len=16")
    assert changed.returncode == 2
    assert "--resume: model.seq_len (32 -> 16) cannot change in a resumed run" in changed.stderr
    assert (tmp_path / "r" / "config.yaml").read_bytes() == saved_config

    longer = geodiloco("run", "--sites", "local", "--no-report", "--resume", "--run-dir", str(tmp_path / "r"),
                       "--set", "diloco.rounds=2")
    assert longer.returncode == 0, longer.stderr[-2000:]
    assert "resuming with a changed setting: diloco.rounds: 1 -> 2" in longer.stdout
    assert sorted({row["round"] for row in read_jsonl(tmp_path / "r" / "idle.jsonl")}) == [0, 1]


def test_resume_without_a_checkpoint_is_an_error(tmp_path):
    nodes = [{"name": "a", "emulate": {"step_time_s": 0.01}}]
    result = geodiloco("run", "--sites", "local", "--no-report", "--resume", "--config",
                       str(write_config(tmp_path, small_config(nodes))), "--run-dir", str(tmp_path / "empty"))
    assert result.returncode == 2
    assert f"--resume: {tmp_path / 'empty'} holds no checkpoint to resume from" in result.stderr
    assert not (tmp_path / "empty").exists()


def test_sigterm_on_one_node_stops_the_whole_job_and_keeps_the_checkpoint(tmp_path):
    nodes = [{"name": name, "local_steps": 3, "batch_size": 2, "emulate": {"step_time_s": 0.1}} for name in "abc"]
    config = small_config(nodes)
    config["diloco"]["rounds"] = 50
    run_dir = tmp_path / "run"
    launcher = start_run(write_config(tmp_path, config), run_dir, "--sites", "local")
    _wait_for_checkpoint(run_dir, 0, launcher)
    children = _children_of(launcher.pid)
    assert len(children) == 3
    os.kill(children[1], signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 143, stderr[-3000:]  # the stopped node's own status: 128 + SIGTERM
    assert "node stopped by SIGTERM" in stderr
    _assert_all_gone(children)
    saved_round = checkpoint.latest_round(run_dir)
    assert saved_round is not None and saved_round < 49
    state = checkpoint.load_global(run_dir, saved_round)
    assert state["round"] == saved_round
    for name in "abc":
        assert checkpoint.load_node(run_dir, saved_round, name)["round"] == saved_round


def test_ctrl_c_stops_every_elastic_site_quietly_and_says_how_to_resume(tmp_path):
    from geodiloco.runtime.launch import descendants

    nodes = [{"name": name, "local_steps": 3, "batch_size": 2, "emulate": {"step_time_s": 0.1}} for name in "ab"]
    config = small_config(nodes, comm={"timeout_s": 60, "elastic": {"enabled": True}})
    config["diloco"]["rounds"] = 50
    run_dir = tmp_path / "run"
    launcher = start_run(write_config(tmp_path, config), run_dir, "--sites", "local", new_session=True)
    _wait_for_checkpoint(run_dir, 0, launcher)
    site_processes = descendants(launcher.pid)  # torchrun agents and their workers
    assert len(site_processes) >= 4
    os.killpg(launcher.pid, signal.SIGINT)  # what a terminal's Ctrl+C sends to its foreground job
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 130
    assert "Traceback" not in stderr and "failed" not in stderr, stderr[-3000:]
    assert "[geodiloco] stopping all nodes (interrupted)" in stderr
    assert f"continue with: geodiloco run --resume --run-dir {run_dir}" in stderr
    time.sleep(0.5)
    _assert_all_gone(site_processes)
    assert checkpoint.latest_round(run_dir) is not None


def test_resuming_a_finished_run_leaves_its_last_records_as_they_were(four_node_run, tmp_path):
    # nothing is left to train: the saved last records are logged again unchanged, not stretched to now
    run_dir = tmp_path / "run"
    shutil.copytree(four_node_run[0], run_dir)
    before = {r["node"]: r for r in read_jsonl(run_dir / "idle.jsonl") if r["round"] == 2}
    logged_bytes = (run_dir / "idle.jsonl").read_bytes()
    time.sleep(3.0)
    result = geodiloco("run", "--sites", "local", "--no-report", "--resume", "--config",
                       str(four_node_run[0].parent / "run.yaml"), "--run-dir", str(run_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    after = {r["node"]: r for r in read_jsonl(run_dir / "idle.jsonl") if r["round"] == 2}
    assert sorted(after) == sorted(before)
    for name, record in after.items():
        assert record["round_end"] - record["round_start"] < 3.0, record
    # byte for byte: the rows the run's end logged (its last wait and checkpoint write included) stay
    assert (run_dir / "idle.jsonl").read_bytes() == logged_bytes


def test_extending_a_finished_run_keeps_the_rows_its_end_logged_and_adds_the_new_rounds(four_node_run, tmp_path):
    # the last round's rows were closed at the run's end (its final wait and checkpoint write included);
    # a resume with more rounds must not swap them for the shorter records the checkpoint saved
    run_dir = tmp_path / "run"
    shutil.copytree(four_node_run[0], run_dir)
    logged_bytes = (run_dir / "idle.jsonl").read_bytes()
    nodes = {r["node"] for r in read_jsonl(run_dir / "idle.jsonl")}
    result = geodiloco("run", "--sites", "local", "--no-report", "--resume", "--config",
                       str(four_node_run[0].parent / "run.yaml"), "--run-dir", str(run_dir),
                       "--set", "diloco.rounds=4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run_dir / "idle.jsonl").read_bytes().startswith(logged_bytes)
    rows = read_jsonl(run_dir / "idle.jsonl")
    assert sorted((r["round"], r["node"]) for r in rows) == sorted((round_idx, node) for round_idx in range(4)
                                                                    for node in nodes)


def test_a_resume_evaluates_again_a_round_whose_evaluation_the_stop_cut_off(four_node_run, tmp_path):
    # a run stopped while round 2's evaluation ran in the background: no global row of round 2 was logged
    run_dir = tmp_path / "run"
    shutil.copytree(four_node_run[0], run_dir)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    evaluated = next(row for row in metrics if row["node"] == "global" and row["round"] == 2)
    kept = [row for row in metrics if not (row["node"] == "global" and row["round"] == 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in kept))
    result = geodiloco("run", "--sites", "local", "--no-report", "--resume", "--config",
                       str(four_node_run[0].parent / "run.yaml"), "--run-dir", str(run_dir),
                       "--set", "diloco.rounds=4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "evaluating round 3 again" in result.stdout
    rows = [row for row in read_jsonl(run_dir / "metrics.jsonl") if row["node"] == "global"]
    assert [row["round"] for row in rows] == [0, 1, 2, 3]
    again = rows[2]
    # the same global model, scored on the same held-out set: the same loss, and the round's tokens
    assert again["eval_loss"] == pytest.approx(evaluated["eval_loss"], rel=1e-6)
    assert again["tokens"] == evaluated["tokens"]
