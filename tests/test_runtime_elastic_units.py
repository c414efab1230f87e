"""Elastic membership, the pieces: who is present, which round to resume, heartbeats, drills."""
from __future__ import annotations

import time
from datetime import timedelta

import pydantic
import pytest
import torch
import torch.distributed as dist

from geodiloco.common.schema import ConfigError
from geodiloco.runtime import checkpoint
from geodiloco.runtime.comm import present_nodes
from geodiloco.runtime.config import RunConfig, load_config
from geodiloco.runtime.diloco import OuterState
from geodiloco.runtime.heartbeat import Heartbeat
from geodiloco.runtime.launch import elastic_exit_code, free_port
from geodiloco.runtime.recovery import SavedRounds, choose_resume_point, saved_rounds, write_members
from geodiloco.runtime.sync.overlap import OverlapSchedule
from geodiloco.lab.drill import DrillRunner, parse_drill, read_drill
from tests.runtime_helpers import small_config

NAMES = ["a", "b", "c", "d"]


def four_node_config(**comm) -> RunConfig:
    nodes = [{"name": name, "gpus": ["RTX 3090"]} for name in NAMES]
    config = small_config(nodes, comm={"timeout_s": 60, **comm})
    config["diloco"]["rounds"] = 8
    return RunConfig.model_validate(config)


# ----- present nodes ------------------------------------------------------------------------

def test_a_subset_of_the_config_forms_a_world_in_config_order():
    ranks = present_nodes(["d", "a", "b", "a"], NAMES, min_nodes=2)
    assert list(ranks) == ["a", "b", "d"]
    assert ranks == {"a": [1, 3], "b": [2], "d": [0]}


def test_too_few_nodes_name_the_missing_ones_and_the_setting():
    with pytest.raises(RuntimeError) as err:
        present_nodes(["a", "b"], NAMES, min_nodes=3)
    assert "only 2 of the config's nodes" in str(err.value)
    assert "comm.min_nodes is 3" in str(err.value) and "Missing: c, d" in str(err.value)


def test_a_node_outside_the_config_is_refused():
    with pytest.raises(RuntimeError, match=r"reported nodes \['x'\]"):
        present_nodes(["a", "x"], NAMES, min_nodes=1)


def test_min_nodes_above_the_node_count_fails_at_load(tmp_path):
    path = tmp_path / "run.yaml"
    import yaml
    path.write_text(yaml.safe_dump(small_config([{"name": "a", "gpus": ["RTX 3090"]}],
                                                comm={"min_nodes": 2})))
    with pytest.raises(ConfigError, match="comm.min_nodes: 2 is more than the 1 nodes"):
        load_config(path)


def test_failure_timeout_must_cover_three_heartbeats():
    with pytest.raises(pydantic.ValidationError, match="comm.elastic.failure_timeout_s"):
        four_node_config(elastic={"failure_timeout_s": 2, "heartbeat_interval_s": 1})


# ----- which round to resume ----------------------------------------------------------------

def report(node: str, globals_: dict[int, list[str]], node_rounds: list[int]) -> SavedRounds:
    return SavedRounds(node, globals_, node_rounds)


def test_resume_skips_a_round_a_present_member_did_not_finish_saving():
    members = {4: NAMES, 5: NAMES}
    reports = [report("a", members, [4, 5]), report("b", members, [4]), report("d", members, [4, 5])]
    point = choose_resume_point(reports, ["a", "b", "d"])
    assert (point.round, point.source_node) == (4, "a")


def test_a_node_absent_from_the_round_does_not_block_it_and_a_member_sends_the_state():
    members = {3: ["a", "b", "d"]}
    reports = [report("c", members, [1]), report("a", members, [3]), report("b", members, [3]),
               report("d", members, [3])]
    point = choose_resume_point(reports, ["a", "b", "c", "d"])
    assert point.round == 3 and point.members == ["a", "b", "d"]
    assert point.source_node == "a"  # c holds the global file too (shared disk) but was no member


def test_only_a_rejoining_node_holds_the_state_on_its_disk():
    reports = [report("c", {2: NAMES}, [2]), report("a", {}, [])]
    point = choose_resume_point(reports, ["a", "c"])
    assert point is None  # a was a member of round 2 but has no node file of it


def test_saved_rounds_reads_what_the_trainer_writes(tmp_path):
    write_members(tmp_path, 1, ["a", "b"])
    checkpoint.save_global(tmp_path, 1, {"round": 1})
    checkpoint.save_node(tmp_path, 1, "a", {"round": 1})
    checkpoint.save_node(tmp_path, 2, "a", {"round": 2})  # round 2's global file never written
    assert saved_rounds(tmp_path, "a") == SavedRounds("a", {1: ["a", "b"]}, [1, 2])
    assert saved_rounds(tmp_path, "b") == SavedRounds("b", {1: ["a", "b"]}, [])


def test_anchors_follow_the_restored_global_state_when_nothing_was_in_flight():
    """A node resuming with other members drops syncs in flight; its next pseudo-gradient must be
    measured from the restored global parameters, not from the ones it was built with."""
    model = torch.nn.Linear(4, 2)
    outer = OuterState(model, lr=0.7, momentum=0.9, nesterov=True)
    params = list(model.parameters())
    sent = []
    schedule = OverlapSchedule("none", params, outer, [[0, 1]], lambda vector, _feedback: sent.append(vector) or vector,
                               run_in_background=False)
    restored = [param.detach() + 5.0 for param in params]
    outer.load_state_dict({"global_params": restored, "optimizer": outer.optimizer.state_dict()})
    outer.load_into(model)
    schedule.load_state_dict({})
    with torch.no_grad():
        params[0].sub_(0.25)
    schedule.launch(0, weight=1.0)
    expected = torch.cat([torch.full_like(params[0], 0.25).view(-1), torch.zeros_like(params[1]).view(-1)])
    assert torch.allclose(sent[0], expected)


# ----- heartbeats ---------------------------------------------------------------------------

@pytest.fixture()
def store():
    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False,
                           timeout=timedelta(seconds=5))
    yield lambda: dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
    del server


def test_a_silent_peer_is_reported_within_the_failure_timeout(store):
    failures = []
    watcher = Heartbeat(store(), "a", ["a", "b"], 0.05, 0.6, on_failure=lambda peer, s: failures.append((peer, s)))
    frozen = Heartbeat(store(), "b", ["a", "b"], 0.05, 60, on_failure=lambda *_: None)
    watcher.start(), frozen.start()
    time.sleep(0.5)
    assert failures == []  # both beating
    stopped_at = time.monotonic()
    frozen.stop(leaving=False)  # a hung machine: it stops beating without saying goodbye
    while not failures and time.monotonic() - stopped_at < 5:
        time.sleep(0.02)
    noticed_s = time.monotonic() - stopped_at
    watcher.stop()
    assert failures and failures[0][0] == "b"
    # never before the timeout (less the beat in flight when it froze); the upper bound guards against a hang
    assert 0.5 <= noticed_s < 4


def test_a_store_that_stops_answering_is_noticed_near_the_failure_timeout_not_a_multiple_of_it(monkeypatch):
    """A cut link leaves the store's socket open and silent: every call of a beat (one per peer) waits its own
    timeout. Rank 0's store is served by a process that is then frozen (SIGSTOP)."""
    import os
    import signal
    import subprocess
    import sys

    from geodiloco.runtime.heartbeat import open_store
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", "import time, datetime, torch.distributed as dist; "
                               f"store = dist.TCPStore('127.0.0.1', {port}, is_master=True, wait_for_workers=False); "
                               "print('up', flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        failures = []
        watcher = Heartbeat(open_store(1.0), "a", ["a", "b", "c", "d"], 0.05, 1.0,
                            on_failure=lambda peer, silent_s: failures.append((peer, silent_s)))
        watcher.start()
        time.sleep(0.3)
        os.kill(server.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        while not failures and time.monotonic() - frozen_at < 10:
            time.sleep(0.02)
        noticed_s = time.monotonic() - frozen_at
        watcher.stop(leaving=False)
        assert failures and failures[0][0].startswith("the run's TCP store on rank 0's site")
        # the beating thread is stuck in a call to the frozen store (it never returns): noticed by the watch
        assert 0.7 <= noticed_s < 3, noticed_s
    finally:
        os.kill(server.pid, signal.SIGKILL)
        server.wait()


def test_a_node_whose_own_process_was_paused_does_not_take_the_store_for_failed(store):
    """A frozen site that is continued (SIGCONT) wakes between beats with its last good beat long ago: only a
    call that hangs counts against the store."""
    failures = []
    watcher = Heartbeat(store(), "a", ["a"], 0.05, 0.3, on_failure=lambda peer, s: failures.append(peer)).start()
    time.sleep(0.2)
    watcher._store_ok_since -= 60.0  # as if the process had been stopped for a minute between two beats
    time.sleep(0.6)
    watcher.stop()
    assert failures == []


def test_a_peer_that_left_on_purpose_is_not_a_failure(store):
    failures = []
    watcher = Heartbeat(store(), "a", ["a", "b"], 0.05, 0.4, on_failure=lambda peer, s: failures.append(peer))
    leaving = Heartbeat(store(), "b", ["a", "b"], 0.05, 60, on_failure=lambda *_: None)
    watcher.start(), leaving.start()
    time.sleep(0.3)
    leaving.stop(leaving=True)
    time.sleep(1.2)
    watcher.stop()
    assert failures == []


# ----- drills and the launcher's verdict ----------------------------------------------------

def test_drill_items_parse_in_round_order():
    events = parse_drill("restart:c@5, kill:c@3", four_node_config())
    assert [(event.action, event.node, event.round) for event in events] == [("kill", "c", 3), ("restart", "c", 5)]


@pytest.mark.parametrize("text, message", [
    ("explode:c@3", "ACTION one of kill, freeze, thaw, restart"),
    ("kill:z@3", "node 'z' is not in the config"),
    ("kill:c@9", "round 9 is outside 2..8"),
    ("kill:c@1", r"round 1 is outside 2..8 \(diloco.rounds; an event fires halfway through its round, timed from"),
    ("kill:c", "expected ACTION:NODE@ROUND"),
    ("kill:c@\u00b2", "expected ACTION:NODE@ROUND"),  # a digit to str.isdigit, not to int()
    ("", "no event; give ACTION:NODE@ROUND items"),
    (" , ", "no event; give ACTION:NODE@ROUND items"),
])
def test_bad_drill_items_say_what_is_wrong(text, message):
    with pytest.raises(ConfigError, match=message):
        parse_drill(text, four_node_config())


def test_a_drill_that_leaves_fewer_than_min_nodes_sites_is_refused_and_one_that_restarts_in_time_is_not():
    config = four_node_config(min_nodes=3)
    with pytest.raises(ConfigError, match=r"^--drill: after kill:b@3, 2 of 4 sites run \(a, d\), fewer than "
                                          r"comm.min_nodes \(3\): the run would wait comm.elastic.join_timeout_s"):
        parse_drill("kill:c@2,kill:b@3,restart:c@4", config)
    assert len(parse_drill("kill:c@2,restart:c@3,freeze:b@4,thaw:b@5", config)) == 4


def test_a_resumed_runs_drill_cannot_name_a_round_it_has_done():
    with pytest.raises(ConfigError, match=r"round 3 is done already \(the run resumes after round 6\); give a "
                                          r"round from 7 on"):
        parse_drill("kill:c@7,kill:c@3", four_node_config(), rounds_done=6)
    assert [event.round for event in parse_drill("kill:c@7", four_node_config(), rounds_done=6)] == [7]


def test_an_event_for_a_site_that_is_not_running_is_skipped_and_said(tmp_path, capsys):
    import subprocess
    import sys
    from types import SimpleNamespace
    ended = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    ended.wait()
    runner = DrillRunner([], [None, None, ended, None], SimpleNamespace(config=four_node_config()), tmp_path)
    runner._fire(parse_drill("freeze:c@4", four_node_config())[0], 5)
    assert read_drill(tmp_path)[0]["note"] == "skipped: the site is not running (it exited with code 3)"
    assert read_drill(tmp_path)[0]["fired_in_round"] == 5
    assert capsys.readouterr().out == ("[geodiloco] drill: freeze node c in round 5 (asked for round 4, which ended "
                                       "first); skipped: the site is not running (it exited with code 3)\n")
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        runner = DrillRunner([], [None, None, running, None], SimpleNamespace(config=four_node_config()), tmp_path)
        runner._fire(parse_drill("thaw:c@4", four_node_config())[0], 4)
        assert read_drill(tmp_path)[-1]["note"] == "skipped: the site was not frozen"
        assert running.poll() is None  # nothing was sent to it
    finally:
        running.kill()
        running.wait()


def test_a_drill_fires_halfway_through_its_round_even_when_it_polls_slowly(tmp_path):
    """Rounds of 1 s, polled every 0.4 s: "kill:c@3" must land inside round 3, not at its end, where
    the killed site would already have synced the round (what short test runs met)."""
    fired_s, ends_at = run_drill_against_rounds(tmp_path, "kill:c@3", [1.0, 1.0, 1.0, 1.0], poll_s=0.4)
    assert 0.3 < fired_s - ends_at[1] < 0.7, (fired_s, ends_at)  # round 3 runs from round 2's end to its own
    assert [(row["round"], row["fired_in_round"]) for row in read_drill(tmp_path)] == [(3, 3)]


def test_a_drill_after_a_long_round_fires_by_the_end_of_its_own(tmp_path):
    """Round 2 held a failure (5 s): half of it would reach past round 3, which lasts 1 s."""
    fired_s, ends_at = run_drill_against_rounds(tmp_path, "kill:c@3", [1.0, 5.0, 1.0, 1.0], poll_s=0.2)
    assert ends_at[2] <= fired_s < ends_at[2] + 0.5, (fired_s, ends_at)
    assert [(row["round"], row["fired_in_round"]) for row in read_drill(tmp_path)] == [(3, 4)]  # as it landed


def test_a_drill_in_round_2_fires_halfway_through_it_timed_by_round_1s_local_phase(tmp_path):
    """Round 1's start is not logged: its longest local phase (0.8 s here, in metrics.jsonl, written
    just after plan.jsonl as the coordinator does) times round 2's middle, not the instant round 1 ends."""
    fired_s, ends_at = run_drill_against_rounds(tmp_path, "kill:c@2", [1.0, 1.0, 1.0], poll_s=0.1,
                                                compute_share=0.8, metrics_delay_s=0.15)
    assert 0.3 < fired_s - ends_at[0] < 0.6, (fired_s, ends_at)


def run_drill_against_rounds(tmp_path, drill: str, rounds_s: list[float], poll_s: float, compute_share: float = 0.8,
                             metrics_delay_s: float = 0.0) -> tuple[float, list[float]]:
    """A coordinator thread appends plan.jsonl rows after rounds of the given lengths, then (after
    ``metrics_delay_s``) metrics.jsonl rows whose nodes computed ``compute_share`` of the round, while a
    DrillRunner acts on a real process for node c; returns when the event fired and the rounds' ends."""
    import subprocess
    import sys
    import threading
    from types import SimpleNamespace

    site_c = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    processes = [None, None, site_c, None]
    launcher = SimpleNamespace(config=four_node_config())
    ends_at = []

    def coordinator():
        for round_idx, round_s in enumerate(rounds_s):
            time.sleep(round_s)
            with open(tmp_path / "plan.jsonl", "a", encoding="utf-8") as handle:
                handle.write(f'{{"round": {round_idx}}}\n')
            ends_at.append(time.time())
            time.sleep(metrics_delay_s)
            with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as handle:
                for node, share in (("a", compute_share), ("b", compute_share / 2)):
                    handle.write(f'{{"round": {round_idx}, "node": "{node}", "compute_s": {round_s * share}}}\n')
                handle.write(f'{{"round": {round_idx}, "node": "global", "wall_s": 0}}\n')

    writer = threading.Thread(target=coordinator)
    try:
        with DrillRunner(parse_drill(drill, launcher.config), processes, launcher, tmp_path, poll_s=poll_s):
            writer.start()
            writer.join()
    finally:
        site_c.kill()
    assert site_c.wait(timeout=5) == -9
    return read_drill(tmp_path)[0]["time"], ends_at


def test_the_run_succeeds_when_min_nodes_sites_finish(capsys):
    config = four_node_config(min_nodes=3)
    assert elastic_exit_code(config, [0, 0, -9, 0]) == 0
    assert "c (killed by SIGKILL); the run went on without them" in capsys.readouterr().err
    assert elastic_exit_code(config, [0, 75, -9, 0]) == 75
    err = capsys.readouterr().err
    assert "b (exit 75: it lost a peer), c (killed by SIGKILL)" in err
    assert "fewer than comm.min_nodes (3) finished: the run failed" in err
    # the first site's own error, not the signal of a site killed before it (exit status 247 for -9)
    assert elastic_exit_code(config, [-9, -9, 1, 0]) == 1
    assert elastic_exit_code(config, [-9, -15, 0, 0]) == 137


def test_a_fixed_run_names_the_node_that_failed_and_why(capsys):
    import subprocess
    import sys

    from geodiloco.runtime.launch import watch
    processes = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]),
                 subprocess.Popen([sys.executable, "-c", "raise SystemExit(2)"])]
    try:
        assert watch(processes, names=["lab-a", "cloud-b"]) == 2
    finally:
        processes[0].kill()
        processes[0].wait()
    assert "node cloud-b failed (exit 2: bad input, see its error above); the other nodes were stopped" in \
        capsys.readouterr().err


# ----- the rendezvous store and the report ----------------------------------------------

def reachable(host: str, port: int) -> bool:
    import socket
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def test_rendezvous_command_serves_a_store_and_stops_on_sigterm(tmp_path):
    import signal
    import subprocess
    import sys
    from tests.runtime_helpers import REPO_ROOT

    port, ready = free_port(), tmp_path / "ready"
    server = subprocess.Popen([sys.executable, "-m", "geodiloco.runtime.cli", "rendezvous", "--host", "127.0.0.1", "--port",
                               str(port), "--ready-file", str(ready)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.is_file() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.read_text().strip() == f"127.0.0.1:{port}"
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
        client.set("agent", "here")
        assert client.get("agent") == b"here"
        assert not reachable("127.0.0.2", port), "the store listens beyond the address it was given"
        taken = subprocess.run([sys.executable, "-m", "geodiloco.runtime.rendezvous", "--host", "127.0.0.1", "--port",
                                str(port)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert taken.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in taken.stderr
        assert "another process holds that port: choose another --port" in taken.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=10) == 0


def test_report_counts_lost_time_as_idle_and_says_so(tmp_path, capsys):
    from geodiloco.report.cli import main as report_main
    from tests.test_report_support import NODE_A, NODE_B, idle_record, write_run

    records = [idle_record(r, node) for r in range(2) for node in (NODE_A, NODE_B)]
    records.append(idle_record(2, dict(NODE_A, overhead_s=14.5), round_s=24.5, lost_s=14.0,
                               present_nodes=["a"]))
    assert report_main([str(write_run(tmp_path / "run", records))]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the terminal table wraps lines
    # a: 2 x (3 wait + 1 sync) + (3 + 1 + 14.5) = 26.5 s idle; b: 2 x 1.5 = 3 s; 14 s of it lost
    # in GPU-s, as the idle beside it: a has 2 GPUs, b 4; 2 x 14 of the 2 x 26.5 + 4 x 3 = 65 idle GPU-s
    assert "28.0 GPU-s of the idle (43.1 %) lost to site failures and restarts" in out
    assert "26.5" in out


def test_a_hivemind_run_that_comm_min_nodes_finished_succeeds_though_a_node_was_killed(tmp_path, capsys):
    import subprocess
    import sys
    from types import SimpleNamespace

    from geodiloco.runtime.launch import watch_sites
    config = four_node_config(backend="hivemind", min_nodes=3)
    finishing = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"], start_new_session=True)
                 for _ in range(3)]
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    killed.kill()
    processes = finishing[:2] + [killed] + finishing[2:]
    launcher = SimpleNamespace(outputs={})
    assert watch_sites(config, tmp_path, processes, launcher, elastic=False, drill_events=[]) == 0
    err = capsys.readouterr().err
    assert "sites that did not finish: c (killed by SIGKILL); the run went on without them" in err
    assert "--resume" not in err  # nothing is left to resume
    # below comm.min_nodes the run failed: the killed node's status, and how to go on
    config = four_node_config(backend="hivemind", min_nodes=4)
    processes = [subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True) for _ in range(3)]
    processes.insert(2, killed)
    assert watch_sites(config, tmp_path, processes, launcher, elastic=False, drill_events=[]) == 137


def test_the_drill_reads_live_logs_past_a_half_written_line(tmp_path):
    """The drill polls plan.jsonl and metrics.jsonl while the coordinator appends to them and while sites are being
    killed: a last line cut mid-write must not stop its thread (every later event would then never fire)."""
    from geodiloco.lab.drill import longest_local_phase_s, rounds_logged
    (tmp_path / "plan.jsonl").write_text('{"round": 0}\n{"round": 1}\n{"round": 2, "nod')
    (tmp_path / "metrics.jsonl").write_text('{"round": 1, "node": "a", "compute_s": 2.5}\n'
                                             '{"round": 1, "node": "b", "compute_s": 4.0}\n'
                                             '{"round": 1, "node": "global", "compute_s": 9.0}\n{"round": 1, "no')
    assert rounds_logged(tmp_path)[0] == 2
    assert longest_local_phase_s(tmp_path, 1) == 4.0
    assert rounds_logged(tmp_path / "absent") == (0, 0.0)
    (tmp_path / "drill.jsonl").write_text('{"event": "kill", "node": "c"}\n{"event": "rest')
    assert read_drill(tmp_path) == [{"event": "kill", "node": "c"}]


def test_the_resume_hint_names_the_newest_complete_round_not_the_committed_pointer(tmp_path, capsys):
    """A background checkpoint write moves ``latest`` only after the next exchange: a run stopped then has a
    newer complete round on disk, which a resume takes. The hint must name that round, and not say "no round
    was saved" when one is complete."""
    from geodiloco.runtime.launch import say_how_to_resume
    state = {"outer": {"global_params": [torch.zeros(2)]}}
    for round_idx in (0, 1):
        checkpoint.save_global(tmp_path, round_idx, state)
        write_members(tmp_path, round_idx, ["a", "b"])
        for name in "ab":
            checkpoint.save_node(tmp_path, round_idx, name, {"round": round_idx})
    checkpoint.save_global(tmp_path, 2, state)  # round 2 is not complete: b's file is missing
    write_members(tmp_path, 2, ["a", "b"])
    checkpoint.save_node(tmp_path, 2, "a", {"round": 2})
    say_how_to_resume(tmp_path, ["a", "b"])
    assert capsys.readouterr().err == (f"[geodiloco] a resume continues after round 2 (its checkpoint is complete in "
                                       f"{tmp_path}); continue with: geodiloco run --resume --run-dir {tmp_path}\n")
    say_how_to_resume(tmp_path / "empty", ["a", "b"])
    assert capsys.readouterr().err == f"[geodiloco] no round was saved in {tmp_path / 'empty'}\n"
