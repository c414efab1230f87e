"""The sync-or-async advice of `geodiloco plan` (balancer/mode_advice.py), on hand-worked clusters."""
import json

import pytest

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.mode_advice import advise_mode
from geodiloco.balancer.plan import NodePlan, Plan

from runtime_helpers import geodiloco, write_config


def two_node_plan() -> Plan:
    """Both nodes compute 10 s; sync predicts 4 s of idle summed over 2 nodes in a 12 s round (16.7 %)."""
    return Plan(policy="time", round=0, predicted_round_s=12.0, predicted_idle_s=4.0,
                nodes=[NodePlan(name="a", local_steps=10, batch_size=4, predicted_compute_s=10.0, predicted_idle_s=2.0),
                       NodePlan(name="b", local_steps=10, batch_size=4, predicted_compute_s=10.0, predicted_idle_s=2.0)])


def nodes(host_mbps: float) -> list[NodeSpec]:
    return [NodeSpec(name="a", gpus=["A30"], wan={"bandwidth_mbps": host_mbps}),
            NodeSpec(name="b", gpus=["A30"], wan={"bandwidth_mbps": 1000})]


def test_async_is_advised_when_its_transfers_are_short():
    # 1 M fp32 parameters = 32 Mbit: b's push and pull take 0.032 s each at 1 Gbit/s; the host moves nothing
    advice = advise_mode(two_node_plan(), nodes(1000), 1_000_000)
    assert advice.sync_idle_share == pytest.approx(4 / 24)
    assert advice.async_idle_share == pytest.approx((0.0 + 0.064 / 10.064) / 2)
    assert advice.recommended == "async" and advice.expected_staleness == 1


def test_sync_is_advised_when_the_hosts_link_sets_the_pace():
    # the host's 1 Mbit/s link: b's pull takes 32 s, so b's cycle is 42.032 s and the host's 32 s
    advice = advise_mode(two_node_plan(), nodes(1), 1_000_000)
    assert advice.async_idle_share == pytest.approx((22 / 32 + 32.032 / 42.032) / 2)
    assert advice.host_link_load > 1 and advice.recommended == "sync"
    assert "host's link" in advice.reason


def test_sync_is_advised_when_async_saves_too_little_and_the_reason_says_so():
    # at 15 Mbit/s b's push and pull of 1 M fp32 parameters take 32/15 s each: async idles (0 + 4.27 / 14.27) / 2 = 15.0 %,
    # 1.7 points under sync's 4 / 24 = 16.7 %: less idle, but by under the 5-point margin that staleness costs
    plan = two_node_plan()
    two = [NodeSpec(name="a", gpus=["A30"], wan={"bandwidth_mbps": 15}), NodeSpec(name="b", gpus=["A30"], wan={"bandwidth_mbps": 15})]
    advice = advise_mode(plan, two, 1_000_000)
    assert advice.async_idle_share == pytest.approx((32 / 15 * 2 / (10 + 32 / 15 * 2)) / 2)
    assert advice.async_idle_share < advice.sync_idle_share and advice.recommended == "sync"
    assert "async would leave about 15%, less by under 5% of GPU time: too little to pay for updates about 1 version stale" \
        in advice.reason, advice.reason


def test_both_shares_are_of_gpu_time_each_node_weighed_by_its_gpus():
    # a (1 GPU) idles 1 s and b (3 GPUs) 3 s of a 12 s round: sync idles (1 x 1 + 3 x 3) / (12 x 4) of GPU time,
    # not (1 + 3) / (12 x 2) of node time; async's per-node shares are weighed the same way
    plan = Plan(policy="time", round=0, predicted_round_s=12.0, predicted_idle_s=4.0,
                nodes=[NodePlan(name="a", local_steps=10, batch_size=4, predicted_compute_s=10.0, predicted_idle_s=1.0),
                       NodePlan(name="b", local_steps=10, batch_size=4, predicted_compute_s=10.0, predicted_idle_s=3.0)])
    specs = [NodeSpec(name="a", gpus=["A30"], wan={"bandwidth_mbps": 1000}),
             NodeSpec(name="b", gpus=["3 x A30"], wan={"bandwidth_mbps": 1000})]
    advice = advise_mode(plan, specs, 1_000_000)
    assert advice.sync_idle_share == pytest.approx(10 / 48)
    assert advice.async_idle_share == pytest.approx((1 * 0.0 + 3 * 0.064 / 10.064) / 4)


def test_int8_shrinks_the_async_transfer_about_four_times():
    fp32 = advise_mode(two_node_plan(), nodes(100), 1_000_000)
    int8 = advise_mode(two_node_plan(), nodes(100), 1_000_000, codec="int8")
    assert int8.async_transfer_s == pytest.approx(fp32.async_transfer_s / 4, rel=0.01)


def test_plan_cli_prints_and_exports_the_mode_advice(tmp_path):
    # Three nodes on 1 Mbit/s links: one push or pull P of llama-150m's fp32 parameters (about 4.8 Gbit)
    # takes over an hour, so the local phase is negligible beside it. The host serves 2 pulls per cycle
    # while a cycle lasts on average (0 + 2 x 2P) / 3 = 4P/3: its link is loaded 2P / (4P/3) = 1.5 times over.
    cluster = {"nodes": [{"name": name, "gpus": [gpu], "wan": {"bandwidth_mbps": 1}}
                         for name, gpu in (("a", "A30"), ("b", "RTX 3090"), ("c", "A30"))]}
    path = write_config(tmp_path, cluster, "cluster.yaml")
    shown = geodiloco("plan", "--cluster", str(path), "--policy", "time")
    assert shown.returncode == 0, shown.stderr
    assert "mode: expect diloco.mode: sync" in shown.stdout, shown.stdout
    exported = geodiloco("plan", "--cluster", str(path), "--json")
    advice = json.loads(exported.stdout)["mode_advice"]
    assert advice["recommended"] == "sync" and "host's link" in advice["reason"], advice
    assert advice["host_link_load"] == pytest.approx(1.5, rel=0.01) and advice["expected_staleness"] == 2


def test_plan_notes_a_real_gpu_node_whose_batch_leaves_gpus_without_a_sample():
    from geodiloco.balancer.views import batches_below_gpu_count
    batches = [("big", 2), ("even", 4), ("one", 1), ("emulated", 2)]
    specs = [NodeSpec(name="big", gpus=["4 x A30"]), NodeSpec(name="even", gpus=["4 x A30"]),
             NodeSpec(name="one", gpus=["RTX 3090"]),
             NodeSpec(name="emulated", gpus=["4 x A30"], emulate={"step_time_s": 0.1})]
    assert batches_below_gpu_count(batches, specs) == [
        "node big: batch 2 is smaller than its 4 GPUs; with one rank per GPU it trains 4 samples per step (each GPU "
        "takes at least one; its step s counts them); give it a batch that is a multiple of 4 to train the one you "
        "plan (nodes[].batch_size or diloco.batch_size)"]
    many = [NodeSpec(name=f"n{index}", gpus=["8 x A30"]) for index in range(7)]
    lines = batches_below_gpu_count([(node.name, 4) for node in many], many)
    assert len(lines) == 1 and lines[0].startswith("7 nodes have a batch smaller than their GPU count (node n0: "
                                                   "batch 4, 8 GPUs)")


def test_the_noted_step_time_is_that_of_one_sample_on_every_gpu(tmp_path):
    cluster = {"nodes": [{"name": "big", "gpus": ["4 x A30"]}, {"name": "small", "gpus": ["RTX 3090"]}]}
    path = write_config(tmp_path, cluster, "cluster.yaml")
    steps = {}
    for batch in (2, 4):
        shown = geodiloco("plan", "--cluster", str(path), "--batch-size", str(batch), "--json")
        assert shown.returncode == 0, shown.stderr
        steps[batch] = {node["name"]: node["predicted_step_s"] for node in json.loads(shown.stdout)["nodes"]}
    assert steps[2]["big"] == pytest.approx(steps[4]["big"])  # 2 samples run as 1 on each of 4 GPUs, as 4 do
    assert steps[2]["small"] < steps[4]["small"]
    noted = geodiloco("plan", "--cluster", str(path), "--batch-size", "2")
    assert "note: node big: batch 2 is smaller than its 4 GPUs" in " ".join(noted.stdout.split()), noted.stdout
    assert "node small" not in noted.stdout.split("note:")[-1]


def test_simulate_counts_the_samples_a_node_with_more_gpus_than_its_batch_trains(tmp_path):
    cluster = {"nodes": [{"name": "solo", "gpus": ["8 x H100 SXM5 80GB"]}, {"name": "small", "gpus": ["RTX 3090"]}]}
    path = write_config(tmp_path, cluster, "cluster.yaml")
    shown = geodiloco("simulate", "--cluster", str(path), "--rounds", "2", "--batch-size", "4", "--seq-len", "512",
                      "--json")
    assert shown.returncode == 0, shown.stderr
    nodes = {node["name"]: node for node in json.loads(shown.stdout)["nodes"]}
    assert nodes["solo"]["tokens"] == nodes["solo"]["steps_total"] * 8 * 512  # one sample on each of 8 GPUs
    assert nodes["small"]["tokens"] == nodes["small"]["steps_total"] * 4 * 512
    table = geodiloco("simulate", "--cluster", str(path), "--rounds", "2", "--batch-size", "4", "--seq-len", "512")
    assert "note: node solo: batch 4 is smaller than its 8 GPUs" in " ".join(table.stdout.split()), table.stdout
