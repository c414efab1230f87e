"""Founding a hivemind run with comm.min_nodes: the founder's loop on a fake clock and a fake DHT
(each test says when each node's proposal appears), then two real peers that give up."""
from __future__ import annotations

import re
import types

import pytest

from geodiloco.runtime.sync import hivemind_backend
from geodiloco.runtime.sync.hivemind_backend import HivemindOuterSync, TooFewNodes
from tests.runtime_helpers import write_config
from tests.test_hivemind_run import hivemind_config, start_node, stop_all


class Founder:
    """The DHT as node a sees it: each other node's proposal appears at its time (s after a's start)."""

    def __init__(self, monkeypatch, arrivals_s: dict[str, float], min_nodes: int, wait_s: float,
                 init_timeout_s: float) -> None:
        self.now_s, self.arrivals_s, self.stored = 0.0, arrivals_s, {}
        monkeypatch.setattr(hivemind_backend, "time", types.SimpleNamespace(
            monotonic=lambda: self.now_s, sleep=self._sleep))
        sync = HivemindOuterSync.__new__(HivemindOuterSync)
        sync.topology = types.SimpleNamespace(node_name="a")
        sync.node_names, sync.min_nodes, sync.init_timeout_s = ["a", "b", "c"], min_nodes, init_timeout_s
        sync._store = lambda key, subkey, value, ttl_s: self.stored.__setitem__(subkey, value)
        sync._read = lambda key: {**{name: {"node": name, "run_id": f"run-{name}"}
                                     for name, at_s in self.arrivals_s.items() if at_s <= self.now_s},
                                  **self.stored}
        sync.running_round = lambda: None
        self.sync, self.wait_s = sync, wait_s

    def _sleep(self, seconds: float) -> None:
        self.now_s += seconds

    def found(self):
        return self.sync.found({"node": "a", "run_id": "run-a"}, self.wait_s)


def test_without_min_nodes_the_first_node_founds_alone_once_start_wait_s_is_over(monkeypatch, capsys):
    founder = Founder(monkeypatch, {"b": 500.0}, min_nodes=1, wait_s=10.0, init_timeout_s=60.0)
    assert founder.found()["run_id"] == "run-a"
    assert founder.sync._founders == ["a"]
    assert 10.0 < founder.now_s < 10.5
    assert "starting without b, c" in capsys.readouterr().out


def test_min_nodes_keeps_the_founders_waiting_past_start_wait_s_until_enough_are_up(monkeypatch, capsys):
    founder = Founder(monkeypatch, {"b": 40.0, "c": 500.0}, min_nodes=2, wait_s=10.0, init_timeout_s=60.0)
    assert founder.found()["run_id"] == "run-a"  # the lowest config index wins
    assert founder.sync._founders == ["a", "b"]
    assert 40.0 <= founder.now_s < 40.5
    out = capsys.readouterr().out
    assert ("node a: 1 of the 2 nodes comm.min_nodes asks for are up; waiting up to 60 s more "
            "(comm.init_timeout_s) for b, c") in out
    assert "starting without c" in out


def test_every_node_up_before_start_wait_s_founds_at_once(monkeypatch):
    founder = Founder(monkeypatch, {"b": 1.0, "c": 3.0}, min_nodes=3, wait_s=10.0, init_timeout_s=60.0)
    founder.found()
    assert founder.sync._founders == ["a", "b", "c"] and 3.0 <= founder.now_s < 3.5


def test_too_few_after_both_waits_gives_up_naming_the_missing_and_withdraws(monkeypatch):
    founder = Founder(monkeypatch, {"b": 5.0, "c": 500.0}, min_nodes=3, wait_s=10.0, init_timeout_s=60.0)
    with pytest.raises(TooFewNodes) as raised:
        founder.found()
    assert 70.0 < founder.now_s < 70.5
    assert str(raised.value) == (
        "node a: only 2 node(s) came up (a, b) within comm.hivemind.start_wait_s (10 s) and comm.init_timeout_s "
        "(60 s) more; comm.min_nodes asks for 3 to start the run. Never up: c. Start those sites (with this "
        "node's address in their initial peers), or lower comm.min_nodes")
    # a site starting later does not count a as up
    assert founder.stored["a"] == {"withdrawn": True}
    later = Founder(monkeypatch, {}, min_nodes=2, wait_s=10.0, init_timeout_s=5.0)
    later.sync.topology.node_name = "b"
    later.stored = {"a": {"withdrawn": True}}
    with pytest.raises(TooFewNodes, match=r"only 1 node\(s\) came up \(b\) within .* Never up: a, c\."):
        later.sync.found({"node": "b", "run_id": "run-b"}, 10.0)


@pytest.mark.slow
def test_two_real_founders_of_three_with_min_nodes_three_both_stop_and_say_why(tmp_path):
    nodes = [{"name": name, "local_steps": 2, "batch_size": 2} for name in "abc"]
    config = hivemind_config(nodes, rounds=2, start_wait_s=3.0)
    # b starts only once a is up; under a loaded CI machine its imports and peer take well over 4 s, so the
    # founders' second wait is long enough that both see each other before giving up
    config["comm"].update(min_nodes=3, init_timeout_s=30)
    config_path, run_dir, peers_file = write_config(tmp_path, config), tmp_path / "run", tmp_path / "peers.txt"
    processes = [start_node(config_path, run_dir, "a", peers_file, first=True)]
    try:
        processes.append(start_node(config_path, run_dir, "b", peers_file, first=False))
        codes = [process.wait(timeout=120) for process in processes]
    finally:
        stop_all(processes)
    for name, code in zip("ab", codes):
        log = (tmp_path / f"{name}.log").read_text()
        assert code != 0, log[-3000:]
        # the node that gives up second has seen the first withdraw
        assert re.search(rf"cannot start: node {name}: only 2 node\(s\) came up \(a, b(; [ab] gave up waiting "
                         r"first)?\) within comm.hivemind.start_wait_s \(3 s\)", log), log[-3000:]
        assert "comm.min_nodes asks for 3 to start the run. Never up: c." in log
        assert "Traceback" not in log
    assert not (run_dir / "metrics.jsonl").exists()
