"""Elastic membership end to end: real torchrun agents and gloo groups on loopback, sites killed,
frozen and restarted by ``geodiloco run --drill``."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from geodiloco.runtime import checkpoint
from geodiloco.runtime.launch import free_port
from geodiloco.lab.drill import read_drill
from geodiloco.runtime.recovery import read_membership_events
from tests.runtime_helpers import REPO_ROOT, geodiloco, read_jsonl, small_config, write_config

pytestmark = pytest.mark.slow

ROUNDS = 5  # the kill drill's run: two rounds before the kill, the killed round, two after it


def elastic_config(policy: str, step_times_s: dict[str, float], rounds: int = ROUNDS) -> dict:
    nodes = [{"name": name, "site": f"site-{name}", "gpus": ["RTX 3090"], "emulate": {"step_time_s": step_s}}
             for name, step_s in step_times_s.items()]
    # short timeouts keep the test quick; the defaults are sized for a WAN (docs/elastic.md)
    config = small_config(nodes, comm={"timeout_s": 60, "elastic": {"failure_timeout_s": 5, "heartbeat_interval_s": 0.5,
                                                                    "last_call_s": 3, "keep_alive_s": 1}})
    config["diloco"].update({"rounds": rounds, "local_steps": 6})
    config["data"]["eval_every_rounds"] = 0
    config["balancing"] = {"policy": policy}
    config["checkpoint"] = {"keep": rounds}
    return config


def run_with_drill(tmp_path: Path, config: dict, drill: str) -> tuple[Path, subprocess.CompletedProcess]:
    run_dir = tmp_path / "run"
    result = geodiloco("run", "--sites", "local", "--no-report", "--elastic", "--drill", drill,
                       "--config", str(write_config(tmp_path, config)), "--run-dir", str(run_dir), timeout=420)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return run_dir, result


def nodes_by_round(run_dir: Path) -> dict[int, list[str]]:
    rows = [row for row in read_jsonl(run_dir / "metrics.jsonl") if row["node"] != "global"]
    return {round_idx: sorted(row["node"] for row in rows if row["round"] == round_idx)
            for round_idx in sorted({row["round"] for row in rows})}


def resume_without(run_dir: Path, copy_dir: Path, from_round: int, names: list[str]) -> Path:
    """Resume a copy of ``run_dir`` after ``from_round`` with only ``names`` started, by hand
    (one ``python -m geodiloco.runtime.train`` per node, fixed world): what a person would do."""
    copy_dir.mkdir()
    shutil.copy(run_dir / "config.yaml", copy_dir / "config.yaml")
    for round_idx in range(from_round + 1):
        shutil.copytree(checkpoint.round_dir(run_dir, round_idx), checkpoint.round_dir(copy_dir, round_idx))
    checkpoint.point_latest(copy_dir, from_round)
    port = free_port()
    processes = []
    for rank, name in enumerate(names):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(names)), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), GEODILOCO_NODE=name, GEODILOCO_DEVICE="cpu", OMP_NUM_THREADS="1")
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "geodiloco.runtime.train", "--config", str(copy_dir / "config.yaml"), "--run-dir",
             str(copy_dir), "--resume"], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True))
    for process in processes:
        output, _ = process.communicate(timeout=240)
        assert process.returncode == 0, output[-3000:]
    return copy_dir


def test_a_killed_site_costs_the_round_in_progress_and_the_others_finish(tmp_path):
    config = elastic_config("uniform", {"a": 0.15, "b": 0.15, "c": 0.15, "d": 0.15})
    run_dir, result = run_with_drill(tmp_path, config, "kill:c@3")

    rounds = nodes_by_round(run_dir)
    assert sorted(rounds) == list(range(ROUNDS))
    assert rounds[0] == rounds[1] == ["a", "b", "c", "d"]
    assert all(rounds[round_idx] == ["a", "b", "d"] for round_idx in range(2, ROUNDS))
    assert "sites that did not finish: c" in result.stderr

    idle = read_jsonl(run_dir / "idle.jsonl")
    # every round a node trained has its idle row: c's round 1, saved before it was killed, included
    trained = {(row["round"], row["node"]) for row in read_jsonl(run_dir / "metrics.jsonl") if row["node"] != "global"}
    assert sorted((row["round"], row["node"]) for row in idle) == sorted(trained)
    resumed = [row for row in idle if row["lost_s"] > 0]
    assert {row["node"] for row in resumed} == {"a", "b", "d"} and {row["round"] for row in resumed} == {2}
    assert all(row["present_nodes"] == ["a", "b", "d"] for row in resumed)
    kill = read_drill(run_dir)[0]
    resumed_at = min(row["round_start"] + row["lost_s"] for row in resumed)
    assert 0 < resumed_at - kill["time"] < 90  # detection, rendezvous and restart: seconds, not comm.timeout_s

    # the same final state as a person resuming the three sites from the round the survivors went on from
    by_hand = resume_without(run_dir, tmp_path / "by_hand", from_round=1, names=["a", "b", "d"])
    elastic_params = checkpoint.load_global(run_dir, ROUNDS - 1)["outer"]["global_params"]
    by_hand_params = checkpoint.load_global(by_hand, ROUNDS - 1)["outer"]["global_params"]
    for elastic_param, hand_param in zip(elastic_params, by_hand_params):
        torch.testing.assert_close(elastic_param, hand_param, rtol=1e-5, atol=1e-6)
    losses = {row["round"]: row["loss"] for row in read_jsonl(run_dir / "metrics.jsonl") if row["node"] == "a"}
    assert losses[ROUNDS - 1] < losses[0]  # still learning after the restart


def test_a_frozen_site_is_left_out_and_a_restarted_one_rejoins_and_is_planned_for(tmp_path):
    # 10 rounds: after c's restart (round 3) the survivors' remaining rounds must outlast starting
    # c's agent, which a loaded machine slows far more than the sleep-padded rounds
    config = elastic_config("time", {"a": 0.25, "b": 0.25, "c": 0.5, "d": 0.25}, rounds=10)
    # the default sync: error feedback laid out for 4 nodes must not survive into a world of 3
    config["diloco"].update({"overlap": "streaming", "compression": "int8"})
    # the default keep: c's own files of the rounds it trained are older than the two kept checkpoints
    config["checkpoint"] = {"keep": 2}
    run_dir, result = run_with_drill(tmp_path, config, "freeze:c@2,restart:c@3")

    rounds = nodes_by_round(run_dir)
    assert sorted(rounds) == list(range(10))
    absent = [round_idx for round_idx, names in rounds.items() if "c" not in names]
    assert absent and absent[0] == 1 and all(rounds[round_idx] == ["a", "b", "d"] for round_idx in absent)
    rejoined = [round_idx for round_idx in rounds if round_idx > absent[-1]]
    assert rejoined and all(rounds[round_idx] == ["a", "b", "c", "d"] for round_idx in rejoined)
    noticed = [event for event in read_membership_events(run_dir) if event["event"] == "peer_failed"]
    assert noticed and {event["how"] for event in noticed} <= {"heartbeat", "connection"}
    freeze = read_drill(run_dir)[0]
    first_notice_s = min(event["time"] for event in noticed) - freeze["time"]
    assert 0 < first_notice_s < 30  # failure_timeout_s is 5: far below comm.timeout_s
    # it goes on from its own data position (its newest file outlived checkpoint.keep), not from the start
    assert "node c: rejoins after round" in result.stdout and "(its last round was 1)" in result.stdout, result.stdout

    plans = {row["round"]: {node["name"]: node["local_steps"] for node in row["nodes"]}
             for row in read_jsonl(run_dir / "plan.jsonl")}
    without_c, with_c = plans[absent[-1]], plans[rejoined[-1]]
    assert "c" not in without_c and "c" in with_c
    # c is 2x slower: once it is back, the deadline is its phase and the fast nodes run more steps
    assert with_c["a"] > without_c["a"]
    assert with_c["c"] < with_c["a"]
    idle_nodes = {row["node"] for row in read_jsonl(run_dir / "idle.jsonl") if row["round"] == rejoined[0]}
    assert "c" in idle_nodes
    # c's wait from its restart until its first round (agent start, rendezvous, the others' round) is its lost time
    first = next(row for row in read_jsonl(run_dir / "idle.jsonl") if row["node"] == "c" and row["round"] == rejoined[0])
    restart = next(event for event in read_drill(run_dir) if event["action"] == "restart")
    assert restart["time"] <= first["round_start"] < restart["time"] + 10, (first, restart)
    assert first["lost_s"] > 3.0 and first["overhead_s"] >= first["lost_s"]
