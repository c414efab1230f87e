"""Every site plans the run's GPUs from the same rows: the row the node that has a GPU plans it with
(a site's own user row, a probe of an unknown GPU) reaches the other nodes at start-up (torch: in the
world; hivemind: in the founding proposals, and with the global state a joiner downloads), so the
first round's plan does not differ between sites."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from geodiloco.predictor import unknown_gpus
from geodiloco.predictor.kernels import GPU_EFFICIENCY
from geodiloco.predictor.specs import GpuRow, lookup_gpu
from geodiloco.runtime.launch import free_port
from tests.runtime_helpers import REPO_ROOT, small_config, write_config

SITE_CARD = "Site Card 77"
"""A GPU no datasheet row has; only the site that has it describes it, in its own GPU file."""


def site_card_row(scale: float) -> dict:
    """An L4-shaped row ``scale`` times as fast (rates and bandwidth)."""
    base = lookup_gpu("L4")
    return {"name": SITE_CARD, "architecture": "Ada", "sm_count": base.sm_count, "memory_gb": base.memory_gb,
            "memory_bandwidth_gbps": base.memory_bandwidth_gbps * scale, "fp32_tflops": base.fp32_tflops * scale,
            "tf32_tflops": base.tf32_tflops * scale, "fp16_tflops": base.fp16_tflops * scale,
            "fp16_fp32acc_tflops": base.fp16_fp32acc_tflops * scale, "bf16_tflops": base.bf16_tflops * scale,
            "source": "site a's own measurements"}


@pytest.fixture
def fresh_resolutions():
    unknown_gpus.forget_adopted_rows()
    unknown_gpus._resolved.pop(SITE_CARD, None)
    yield
    unknown_gpus.forget_adopted_rows()
    unknown_gpus._resolved.pop(SITE_CARD, None)


def test_a_gpu_is_planned_from_the_first_node_that_sent_its_row(fresh_resolutions):
    from geodiloco.predictor.probe import probe_spec
    measured = {"name": SITE_CARD, "sm_count": 60, "memory_gb": 48.0, "memory_bandwidth_gbps": 900.0,
                "fp32_tflops": 40.0, "fp16_tflops": 160.0, "bf16_tflops": 160.0, "tf32_tflops": 80.0,
                "torch": "2.13.0", "hip": None, "matmul_size": 4096, "measured_at": "2026-11-26T12:00:00"}
    probed = unknown_gpus._plain_values(probe_spec(measured))
    second = {**probed, "bf16_tflops": 10.0, "source": "another probe"}
    stand_in = unknown_gpus.device_spec(SITE_CARD)
    assert stand_in.bf16_tflops == lookup_gpu("L4").bf16_tflops and stand_in.source.startswith("stand-in")

    changed = unknown_gpus.adopt_rows([("a", unknown_gpus.own_rows(["L4"])), ("b", {SITE_CARD: probed}),
                                       ("c", {SITE_CARD: second})])
    adopted = unknown_gpus.device_spec(SITE_CARD)
    # node b's 160 TFLOPS over the model's large-GEMM share (c's 10 would give a twentieth of it)
    assert (round(adopted.bf16_tflops, 2), adopted.memory_gb, adopted.sm_count) == \
        (round(160.0 / GPU_EFFICIENCY.matmul, 2), 48.0, 60)
    assert adopted.source.startswith("measured probe")
    assert changed == [f"GPU '{SITE_CARD}': planned from node b's row ({adopted.source})"], \
        "a table row every node has is no news; the probe of node b is, and node c's second row loses"
    assert unknown_gpus.device_spec("L4") == lookup_gpu("L4")

    unknown_gpus.forget_adopted_rows()
    assert unknown_gpus.device_spec(SITE_CARD).source.startswith("stand-in")


def start_worker(config_path, run_dir, name, rank, port, gpu_file=None):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               GEODILOCO_NODE=name, GEODILOCO_DEVICE="cpu", OMP_NUM_THREADS="1",
               GEODILOCO_SECRET="the-runs-shared-secret-123456")
    env.pop("GEODILOCO_GPU_FILES", None)
    if gpu_file is not None:
        env["GEODILOCO_GPU_FILES"] = str(gpu_file)
    return subprocess.Popen([sys.executable, "-m", "geodiloco.runtime.train", "--config", str(config_path),
                             "--run-dir", str(run_dir)], env=env, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def start_hivemind_nodes(tmp_path, config_path, run_dir, gpu_file, monkeypatch):
    from tests.test_hivemind_run import start_node
    peers_file = tmp_path / "peers.txt"
    run_dir.mkdir()
    monkeypatch.setenv("GEODILOCO_GPU_FILES", str(gpu_file))
    first = start_node(config_path, run_dir, "a", peers_file, first=True)
    monkeypatch.delenv("GEODILOCO_GPU_FILES")
    second = start_node(config_path, run_dir, "b", peers_file, first=False)
    outputs = []
    for process, name in zip((first, second), "ab"):
        process.wait(timeout=150)
        outputs.append((tmp_path / f"{name}.log").read_text())
    return [first, second], outputs


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "hivemind"])
def test_the_first_plan_is_the_same_on_a_site_that_lacks_the_other_sites_gpu_row(tmp_path, backend, monkeypatch):
    """Site a describes its GPU in its own file (an old card, 1/50 of an L4's rates: about twice an L4's
    step for this tiny model, whose steps are mostly host time); site b has no row for it, so on its own
    it would plan a like the L4 stand-in and give itself a's steps, where a's plan gives b twice as many.
    Node a writes the round's plan (plan.jsonl); metrics.jsonl says what each node trained. torch: the
    nodes agree in their world at start-up; hivemind: through the founding proposals."""
    gpu_file = tmp_path / "site_a_gpus.yaml"
    gpu_file.write_text(yaml.safe_dump({"gpus": [site_card_row(0.02)]}))
    nodes = [{"name": "a", "gpus": [SITE_CARD], "emulate": {"step_time_s": 0.01}},
             {"name": "b", "gpus": ["L4"], "emulate": {"step_time_s": 0.01}}]
    if backend == "torch":
        config = small_config(nodes, balancing={"policy": "time"})
    else:
        from tests.test_hivemind_run import hivemind_config
        config = hivemind_config(nodes, rounds=1)
        config["balancing"] = {"policy": "time"}
    config["diloco"].update(rounds=1, local_steps=4)
    config["data"]["eval_batches"] = 0
    config_path = write_config(tmp_path, config)
    run_dir = tmp_path / "run"
    if backend == "torch":
        port = free_port()
        workers = [start_worker(config_path, run_dir, "a", 0, port, gpu_file),
                   start_worker(config_path, run_dir, "b", 1, port)]
        outputs = [worker.communicate(timeout=120)[0] for worker in workers]
    else:
        workers, outputs = start_hivemind_nodes(tmp_path, config_path, run_dir, gpu_file, monkeypatch)
    assert [worker.returncode for worker in workers] == [0, 0], outputs[0][-3000:] + outputs[1][-3000:]

    plan = read_rows(run_dir / "plan.jsonl")[0]
    planned = {row["name"]: (row["local_steps"], row["batch_size"]) for row in plan["nodes"]}
    trained = {row["node"]: (row["local_steps"], row["batch_size"])
               for row in read_rows(run_dir / "metrics.jsonl") if row["round"] == 0 and row["node"] in "ab"}
    assert planned["b"][0] * planned["b"][1] >= 1.6 * planned["a"][0] * planned["a"][1], \
        f"the L4 gets about twice the slow card's samples: {planned}"
    assert trained == planned, f"node b trained what node a's plan gives it: trained {trained}, planned {planned}"
    assert f"node b: GPU '{SITE_CARD}': planned from node a's row (site a's own measurements)" in outputs[1]
    assert "planned from node" not in outputs[0]


@pytest.fixture
def one_rank_world():
    """A one-rank gloo world, as a NodeTrainer needs one."""
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def trainer_of(node_name, nodes, run_dir):
    """Node ``node_name``'s trainer for a time-balanced run of ``nodes`` ((name, GPU) pairs) on the CPU."""
    import torch

    from geodiloco.runtime.comm import build_topology
    from geodiloco.runtime.config import parse_config
    from geodiloco.runtime.trainer import NodeTrainer
    config = parse_config({"model": {"seq_len": 32}, "data": {"max_bytes": 20_000, "eval_batches": 0},
                           "balancing": {"policy": "time"}, "diloco": {"local_steps": 4, "batch_size": 4},
                           "comm": {"min_nodes": 1},
                           "nodes": [{"name": name, "gpus": [gpu]} for name, gpu in nodes]}, "<test>")
    names = [name for name, _ in nodes]
    return NodeTrainer(config, build_topology(node_name, names, min_nodes=1), run_dir, torch.device("cpu"))


def test_a_node_that_joins_later_plans_the_founders_gpus_from_their_rows(tmp_path, fresh_resolutions, capsys,
                                                                        one_rank_world):
    """Hivemind: a joiner gets the run's rows with the peers' global state (``shared_state``). Here node a's
    card is known only from a's own row; node c joins later and, without that row, would plan a as the
    L4 stand-in, like its own L4, and give both the same steps."""
    trainer = trainer_of("c", [("a", SITE_CARD), ("c", "L4")], tmp_path)
    before = trainer.planner.plan(0, ["a", "c"])
    assert before.node("a").local_steps == before.node("c").local_steps, "both planned as L4s"

    # on a peer that founded the run with a: a's row, adopted at founding, travels with the state
    site_row = unknown_gpus._plain_values(GpuRow(**site_card_row(0.02)).to_spec())
    unknown_gpus.adopt_rows([("a", {SITE_CARD: site_row})])
    metadata, tensors = trainer.shared_state(0, "run-x")
    assert [node for node, _ in metadata["gpu_rows_by_node"]] == ["a"]

    unknown_gpus.forget_adopted_rows()  # the joiner's own process knows nothing of it
    capsys.readouterr()
    trainer.load_shared_state(metadata, tensors)
    assert unknown_gpus.device_spec(SITE_CARD).source == "site a's own measurements"
    assert f"node c: GPU '{SITE_CARD}': planned from node a's row" in capsys.readouterr().err
    after = trainer.planner.plan(0, ["a", "c"])
    assert after.node("c").local_steps >= 1.6 * after.node("a").local_steps, after.to_dict()


def test_rows_of_a_later_node_are_added_after_those_adopted_and_only_new_names_are_news(fresh_resolutions):
    site_row = unknown_gpus._plain_values(GpuRow(**site_card_row(0.02)).to_spec())
    unknown_gpus.adopt_rows([("a", {SITE_CARD: site_row}), ("b", unknown_gpus.own_rows(["L4"]))])
    other = {**site_row, "name": "Other Card 5", "bf16_tflops": 3.0, "source": "site c's own measurements"}
    lines = unknown_gpus.adopt_more_rows([("c", {SITE_CARD: {**site_row, "bf16_tflops": 999.0}, "Other Card 5": other})])
    assert lines == ["GPU 'Other Card 5': planned from node c's row (site c's own measurements)"]
    assert unknown_gpus.device_spec(SITE_CARD).bf16_tflops == site_row["bf16_tflops"], "a's row keeps its name"
    assert unknown_gpus.device_spec("Other Card 5").bf16_tflops == 3.0
    assert [node for node, _ in unknown_gpus.adopted_rows()] == ["a", "b", "c"]
    assert unknown_gpus.adopt_more_rows([("d", {"Other Card 5": other})]) == [], "adopted before: no news"
    unknown_gpus._resolved.pop("Other Card 5", None)


def hivemind_view(node_name, members, founders, joined_round, adopt):
    """A hivemind backend's leader as ``planning_nodes`` sees the run: ``members`` are the heartbeats."""
    import types

    from geodiloco.runtime.sync.hivemind_backend import HivemindOuterSync, Member
    sync = HivemindOuterSync.__new__(HivemindOuterSync)
    sync.topology = types.SimpleNamespace(node_name=node_name, is_leader=True)
    sync.node_names, sync._founders, sync.joined_round = ["a", "b", "c"], founders, joined_round
    sync.members = lambda: {name: Member(name, *fields) for name, fields in members.items()}
    sync.share_in_node = lambda value: value
    sync.handles = types.SimpleNamespace(adopt_gpu_rows=adopt)
    return sync


def test_a_peer_adopts_a_joiners_rows_from_its_heartbeat_once_it_takes_part(fresh_resolutions):
    site_row = unknown_gpus._plain_values(GpuRow(**site_card_row(0.02)).to_spec())
    unknown_gpus.adopt_rows([("a", unknown_gpus.own_rows(["L4"])), ("b", unknown_gpus.own_rows(["L4"]))])
    adopted_calls = []

    def adopt(rows_by_node):
        adopted_calls.append(rows_by_node)
        unknown_gpus.adopt_more_rows(rows_by_node)

    members = {"a": (5, 0, unknown_gpus.own_rows(["L4"])), "b": (5, 0, unknown_gpus.own_rows(["L4"])),
               "c": (-1, 6, {SITE_CARD: site_row})}
    sync = hivemind_view("a", members, founders=["a", "b"], joined_round=0, adopt=adopt)
    assert sync.planning_nodes(5) == ["a", "b"] and adopted_calls == [], "c takes part from round 6"
    assert sync.planning_nodes(6) == ["a", "b", "c"]
    assert adopted_calls == [[("c", {SITE_CARD: site_row})]]
    assert unknown_gpus.device_spec(SITE_CARD).source == "site a's own measurements"
    sync.planning_nodes(7)
    assert len(adopted_calls) == 1, "adopted once"


def test_a_peer_replans_a_joiner_with_an_unknown_gpu_from_the_joiners_row(tmp_path, fresh_resolutions, capsys,
                                                                          one_rank_world):
    """Without the joiner's row, node a plans c's card as the L4 stand-in (the same steps as its own L4);
    with it, as the slow card it is."""
    trainer = trainer_of("a", [("a", "L4"), ("c", SITE_CARD)], tmp_path)
    trainer.adopt_founders_gpu_rows([("a", unknown_gpus.own_rows(["L4"]))])
    before = trainer.planner.plan(6, ["a", "c"])
    assert before.node("a").local_steps == before.node("c").local_steps, "both planned as L4s"
    capsys.readouterr()
    site_row = unknown_gpus._plain_values(GpuRow(**site_card_row(0.02)).to_spec())
    trainer.adopt_joiners_gpu_rows([("c", {SITE_CARD: site_row})])
    assert f"node a: GPU '{SITE_CARD}': planned from node c's row (site a's own measurements)" in \
        capsys.readouterr().err
    after = trainer.planner.plan(6, ["a", "c"])
    assert after.node("a").local_steps >= 1.6 * after.node("c").local_steps, after.to_dict()


def test_the_heartbeat_carries_the_nodes_own_rows_and_members_read_them_back(fresh_resolutions):
    import types

    from geodiloco.runtime.sync.hivemind_backend import HivemindOuterSync
    site_row = unknown_gpus._plain_values(GpuRow(**site_card_row(0.02)).to_spec())
    stored = {}
    sync = HivemindOuterSync.__new__(HivemindOuterSync)
    sync.topology = types.SimpleNamespace(node_name="c")
    sync.node_names, sync.current_round, sync.joined_round, sync.peer_id = ["a", "b", "c"], -1, 6, "peer-c"
    sync.options = types.SimpleNamespace(heartbeat_ttl_s=6.0)
    sync.handles = types.SimpleNamespace(gpu_rows={SITE_CARD: site_row})
    sync._store = lambda key, subkey, value, ttl_s: stored.setdefault(key, {}).__setitem__(subkey, value)
    sync._read = lambda key: stored.get(key, {})
    sync._beat()
    member = sync.members()["c"]
    assert (member.joined, member.gpu_rows) == (6, {SITE_CARD: site_row})


def test_two_joiners_of_one_round_plan_their_shared_unknown_gpu_from_the_same_row_as_the_peers(
        tmp_path, fresh_resolutions, one_rank_world):
    """b and c join in round 6, each with the site card and its own probe of it. Every node adopts the
    joiners' heartbeat rows in config order, so b's row wins on the founder a and on c alike; c used to
    adopt its own row with the peers' state, before b's, and plan the card unlike its peers."""
    row_b = {**unknown_gpus._plain_values(GpuRow(**site_card_row(0.02)).to_spec()), "source": "site b's probe"}
    row_c = {**unknown_gpus._plain_values(GpuRow(**site_card_row(0.05)).to_spec()), "source": "site c's probe"}
    members = {"a": (5, 0, unknown_gpus.own_rows(["L4"])), "b": (-1, 6, {SITE_CARD: row_b}),
               "c": (-1, 6, {SITE_CARD: row_c})}

    unknown_gpus.adopt_rows([("a", unknown_gpus.own_rows(["L4"]))])
    hivemind_view("a", members, founders=["a"], joined_round=0, adopt=unknown_gpus.adopt_more_rows).planning_nodes(6)
    assert unknown_gpus.device_spec(SITE_CARD).source == "site b's probe"

    trainer = trainer_of("c", [("a", "L4"), ("b", SITE_CARD), ("c", SITE_CARD)], tmp_path)
    unknown_gpus.forget_adopted_rows()
    unknown_gpus.adopt_rows([("a", unknown_gpus.own_rows(["L4"]))])
    metadata, tensors = trainer.shared_state(5, "run-x")  # the state c downloads from a
    unknown_gpus.forget_adopted_rows()
    unknown_gpus._resolved[SITE_CARD] = GpuRow(**{**site_card_row(0.05), "source": "site c's probe"}).to_spec()
    trainer.load_shared_state(metadata, tensors)
    sync = hivemind_view("c", members, founders=["a"], joined_round=6, adopt=trainer.adopt_joiners_gpu_rows)
    assert sync.planning_nodes(6) == ["a", "b", "c"]
    assert unknown_gpus.device_spec(SITE_CARD).source == "site b's probe"
    assert [node for node, _ in unknown_gpus.adopted_rows()] == ["a", "b", "c"]
