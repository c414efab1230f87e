"""Pieces of the hivemind backend that need no peers: planning for the nodes present,
drift detection, config validation."""
from pathlib import Path

import pytest
import torch

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.config import BalancingConfig
from geodiloco.balancer.plan import RoundMeasurement
from geodiloco.balancer.planner import Planner
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.workload import preset_dims
from geodiloco.runtime.comm import Topology
from geodiloco.runtime.config import HivemindSection, load_config
from geodiloco.runtime.sync.hivemind_backend import HivemindOuterSync
from tests.runtime_helpers import small_config, write_config

NODES = [NodeSpec.model_validate({"name": name, "emulate": {"step_time_s": step_s, "batch_size": 4}})
         for name, step_s in (("a", 0.1), ("b", 0.2), ("c", 0.4))]


def time_planner(**balancing):
    return Planner(BalancingConfig(policy="time", **balancing), NODES, preset_dims("tiny"), 32, 10, 4)


def steps_of(plan):
    return {node.name: node.local_steps for node in plan.nodes}


def test_plan_for_all_nodes_is_unchanged_by_present():
    planner = time_planner()
    # the slowest node (c, 0.4 s) runs the baseline 10 steps: 4 s; a and b fill the same 4 s
    assert steps_of(planner.plan(0)) == {"a": 40, "b": 20, "c": 10}
    assert steps_of(planner.plan(0, present=["c", "a", "b"])) == {"a": 40, "b": 20, "c": 10}


def test_plan_for_present_nodes_balances_among_them():
    planner = time_planner()
    # without c the slowest present node is b: 10 x 0.2 s = 2 s, so a runs 2 / 0.1 = 20 steps
    plan = planner.plan(1, present=["b", "a"])
    assert steps_of(plan) == {"a": 20, "b": 10}
    assert plan.round == 1


def test_present_plan_uses_the_measured_speeds():
    planner = time_planner(calibration_rounds=1)
    for name, step_s in (("a", 0.1), ("b", 0.4)):
        planner.observe(RoundMeasurement(node=name, round=0, batch_size=4, local_steps=10,
                                         step_times_s=[step_s] * 10, compute_s=10 * step_s))
    # b measured twice its prior: its 10 steps take 4 s, a fills them with 40
    assert steps_of(planner.plan(1, present=["a", "b"])) == {"a": 40, "b": 10}


def test_absent_reference_node_falls_back_to_the_slowest_present():
    planner = time_planner(reference_node="c")
    assert steps_of(planner.plan(0, present=["a", "b"])) == {"a": 20, "b": 10}


def test_unknown_present_node_is_an_error():
    with pytest.raises(ConfigError, match="unknown: z"):
        time_planner().plan(0, present=["a", "z"])


def follower_sync(**options):
    """A non-leader rank's sync: no peer is started, the drift check works on given stats."""
    topology = Topology(rank=1, world_size=2, node_name="c", node_index=2, local_rank=1, local_world_size=2,
                        node_ranks=[0, 1], leader_ranks=[0, 1, 2])
    return HivemindOuterSync(topology, HivemindSection(**options), "unit", ["a", "b", "c"], 10, "none")


def stats(**checksums):
    return [{"node": name, "start_checksum": value} for name, value in checksums.items()]


def test_node_off_the_majority_is_flagged_for_a_reload():
    sync = follower_sync(resync_tolerance=1e-6)
    present = stats(a=1000.0, b=1000.0 + 1e-5, c=1000.5)
    assert sync._is_outlier(present, "c")
    assert not sync._is_outlier(present, "a")
    assert not sync._is_outlier(present, "b")


def test_the_default_tolerance_follows_the_codec_whose_rounding_parts_the_replicas():
    # relative spreads of 2.1e-5 (a round of the 8-bit demo run) and 5e-4 (far past any codec's rounding)
    near, far = stats(a=8810.843, b=8810.860, c=8811.028), stats(a=1000.0, b=1000.0, c=1000.5)
    assert follower_sync(compression="8bit")._is_outlier(near, "c") is False
    assert follower_sync(compression="8bit")._is_outlier(far, "c") is True
    assert follower_sync(compression="fp16")._is_outlier(near, "c") is True
    assert follower_sync()._is_outlier(near, "c") is True
    assert follower_sync(compression="8bit", resync_tolerance=1e-6)._is_outlier(near, "c") is True


def test_two_nodes_disagreeing_defer_to_the_earlier_one():
    sync = follower_sync()
    present = stats(a=10.0, b=11.0)
    assert sync._is_outlier(present, "b")
    assert not sync._is_outlier(present, "a")


@pytest.mark.parametrize("order", ["abc", "cba", "bca"])
def test_when_no_two_nodes_agree_every_node_defers_to_the_first_in_the_config(order):
    # 8-bit rounding: three checksums, no two within the tolerance; the posted order differs between nodes
    sync = follower_sync(resync_tolerance=1e-6)
    checksums = {"a": 8579.1132, "b": 8579.0473, "c": 8579.2001}
    present = [{"node": name, "start_checksum": checksums[name]} for name in order]
    assert [sync._is_outlier(present, name) for name in "abc"] == [False, True, True]
    assert sync.majority_checksum == checksums["a"]


class StatesOnOffer:
    """hivemind's averager as download_state sees it: each call returns the next peer's published state."""

    def __init__(self, checksums):
        self.checksums, self.calls, self.allow_state_sharing = list(checksums), 0, True

    def load_state_from_peers(self, timeout):
        checksum = self.checksums[self.calls % len(self.checksums)]
        self.calls += 1
        # the global parameters (|values| summing to the peer's checksum), then the outer momentum
        return {"round": 4, "node": f"peer{self.calls}"}, [torch.tensor([-checksum / 2, checksum / 2]),
                                                          torch.full((2,), 1000.0)]


def test_a_drifted_node_reloads_only_a_state_that_agrees_with_the_majority():
    from types import SimpleNamespace
    sync = follower_sync(resync_tolerance=1e-6)
    sync.handles = SimpleNamespace(params=[torch.zeros(2)])
    sync.averager = StatesOnOffer([8579.0473, 8579.2001, 8579.1132])  # two drifted peers answer first
    loaded = sync.download_state(5.0, min_round=4, checksum=8579.1132)
    assert loaded[0]["node"] == "peer3" and sync.averager.calls == 3
    assert sync.download_state(0.5, min_round=4, checksum=1.0) is None  # nobody holds it: give up in time


def test_request_timeout_must_stay_below_matchmaking_time(tmp_path):
    config = small_config([{"name": "a"}, {"name": "b"}])
    config["comm"] = {"backend": "hivemind", "hivemind": {"matchmaking_time_s": 1.0, "request_timeout_s": 2.0}}
    with pytest.raises(ConfigError, match="request_timeout_s"):
        load_config(write_config(tmp_path, config))


def test_unknown_codec_is_rejected(tmp_path):
    config = small_config([{"name": "a"}])
    config["comm"] = {"backend": "hivemind", "hivemind": {"compression": "4bit"}}
    with pytest.raises(ConfigError, match="compression"):
        load_config(write_config(tmp_path, config))


@pytest.mark.parametrize("field, addrs, message", [
    ("initial_peers", ["garbage"], "comm.hivemind.initial_peers[0]: 'garbage' is not a multiaddr"),
    ("initial_peers", ["/ip4/127.0.0.1/tcp/31337"], "[0]: '/ip4/127.0.0.1/tcp/31337' names no peer"),
    ("host_maddrs", ["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/tcp/99999"], "comm.hivemind.host_maddrs[1]: "),
])
def test_a_peer_address_that_is_not_a_multiaddr_is_refused_before_any_node_starts(tmp_path, field, addrs, message):
    config = small_config([{"name": "a"}, {"name": "b"}])
    config["comm"] = {"backend": "hivemind", "hivemind": {field: addrs}}
    with pytest.raises(ConfigError) as err:
        load_config(write_config(tmp_path, config))
    assert message in str(err.value)


def test_peer_addresses_from_the_environment_are_checked_when_a_node_starts(monkeypatch):
    from geodiloco.runtime.sync.hivemind_backend import host_maddrs, initial_peers
    peer = "/ip4/127.0.0.1/tcp/31337/p2p/QmXfAkeXRfx7nW4b6mQCyKCmcn9LU4ZpTvi4kqeN1yTbCj"
    monkeypatch.setenv("GEODILOCO_INITIAL_PEERS", f"{peer},/ip4/127.0.0.1/tcp/1")
    with pytest.raises(ConfigError, match=r"GEODILOCO_INITIAL_PEERS\[1\]: '/ip4/127.0.0.1/tcp/1' names no peer"):
        initial_peers(HivemindSection())
    monkeypatch.setenv("GEODILOCO_INITIAL_PEERS", peer)
    assert initial_peers(HivemindSection()) == [peer]
    monkeypatch.setenv("GEODILOCO_HOST_MADDRS", "garbage")
    with pytest.raises(ConfigError, match=r"GEODILOCO_HOST_MADDRS\[0\]: 'garbage' is not a multiaddr"):
        host_maddrs(HivemindSection())


def test_a_node_that_would_join_after_the_last_round_is_told_the_run_is_ending(monkeypatch):
    from geodiloco.runtime.sync.protocol import CannotStart
    topology = Topology(rank=0, world_size=1, node_name="c", node_index=2, local_rank=0, local_world_size=1,
                        node_ranks=[0], leader_ranks=[0])
    sync = HivemindOuterSync(topology, HivemindSection(), "unit", ["a", "b", "c"], 10, "none", total_rounds=7)
    beats = []
    monkeypatch.setattr(sync, "_beat", lambda: beats.append(sync.joined_round))
    monkeypatch.setattr(sync, "running_round", lambda: 6)  # the peers are in round 7 of 7
    with pytest.raises(CannotStart, match=r"node c: the peers are in the run's last round \(7 of 7\): nothing is left"):
        sync.announce_join()
    assert beats == []  # it never announced itself, so no peer waits for it at the end


def test_a_torch_run_config_loads_without_hivemind_installed(tmp_path):
    """hivemind is an extra: a torch run's saved config.yaml (which writes out the hivemind section's defaults)
    must load where it is not installed (the nodes of the README's first command failed to start)."""
    import subprocess
    import sys
    saved = tmp_path / "config.yaml"
    saved.write_text(load_config(None).to_yaml())
    script = ("import sys\nsys.modules['hivemind'] = None  # as if it were not installed\n"
              "from geodiloco.runtime.config import load_config\n"
              f"print(load_config({str(saved)!r}).comm.hivemind.host_maddrs)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "/ip4/0.0.0.0/tcp/0" in result.stdout


def test_a_hivemind_config_without_hivemind_installed_plans_and_a_run_names_the_extra(tmp_path):
    """plan and simulate read a hivemind config without the extra; a run's preflight says which extra to install
    (config validation imported hivemind for the peer addresses: a traceback from run, plan and simulate)."""
    import subprocess
    import sys
    script = ("import sys\nsys.modules['hivemind'] = None  # as if it were not installed\n"
              "from geodiloco.runtime.cli import main\n"
              "assert main(['plan', '--cluster', 'experiments/configs/hivemind.yaml']) == 0\n"
              "sys.exit(main(['run', '--config', 'experiments/configs/hivemind.yaml', '--sites', 'local']))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "comm.backend: hivemind needs the hivemind extra (hivemind not installed): pip install -e " \
           "'.[hivemind]' in the checkout" in result.stderr
    assert "Traceback" not in result.stderr and "seoul" in result.stdout  # the plan names the config's nodes
