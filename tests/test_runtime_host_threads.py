"""Trainers sharing one host: finding the others in /proc (real processes) and the notice's advice."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import threading

import torch

from geodiloco.runtime.host_threads import (_parent_pid, intra_op_threads, leader_sync_threads, other_trainers_on_host,
                                            oversubscription_notice, runs_module, usable_cores, warn_if_oversubscribed,
                                            with_creators_threads)
from geodiloco.runtime.launch import free_port
from tests.runtime_helpers import REPO_ROOT, small_config, write_config

MODULE = "fake_site_trainer_for_tests"

FAKE_TRAINER = """
import os, sys, time
if os.fork() == 0:  # like hivemind's DHT and averager: a child with the trainer's own command line
    time.sleep(60)
    sys.exit(0)
print("up", flush=True)
time.sleep(60)
"""

FAKE_LAUNCHER = """
import time
print("up", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("argv, expected", [
    (["python3", "-m", "geodiloco.runtime.train", "--config", "c.yaml"], True),
    (["/usr/bin/python3", "-u", "-m", "geodiloco.runtime.train"], True),  # a torchrun worker
    (["/usr/bin/python3", "/usr/local/bin/torchrun", "--nproc-per-node", "1", "-m", "geodiloco.runtime.train"], False),
    (["python3", "-m", "torch.distributed.run", "-m", "geodiloco.runtime.train"], False),
    (["python3", "-m", "geodiloco.runtime.cli", "run"], False),
    (["python3", "-m"], False),
    ([], False),
])
def test_only_an_interpreter_running_the_trainer_module_counts(argv, expected):
    assert runs_module(argv, "geodiloco.runtime.train") is expected


def test_the_parent_pid_is_read_past_a_command_name_with_spaces_and_parentheses(tmp_path):
    (tmp_path / "stat").write_text("4242 (odd) name (x)) S 977 4242 4242 0 -1 4194560 120 0 0 0\n")
    assert _parent_pid(tmp_path) == 977
    assert _parent_pid(tmp_path / "gone") is None


def _start(tmp_path: Path, *args: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, *args], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert process.stdout.readline().strip() == "up"
    return process


@pytest.fixture
def processes(tmp_path):
    (tmp_path / f"{MODULE}.py").write_text(FAKE_TRAINER)
    (tmp_path / "launcher.py").write_text(FAKE_LAUNCHER)
    started: list[subprocess.Popen] = []
    yield lambda *args: started.append(_start(tmp_path, *args)) or started[-1]
    for process in started:
        process.kill()
        process.wait()
    subprocess.run(["pkill", "-f", "--", f"-m {MODULE}"], check=False)  # the forked children


def test_real_trainers_on_this_host_are_counted_once_each_and_launchers_not(processes):
    assert other_trainers_on_host(module=MODULE) == []
    first = processes("-m", MODULE)
    processes("launcher.py", "-m", MODULE)  # passes the module on, like torchrun
    assert other_trainers_on_host(module=MODULE) == [first.pid]
    second = processes("-u", "-m", MODULE)
    assert other_trainers_on_host(module=MODULE) == sorted([first.pid, second.pid])
    assert other_trainers_on_host(module=MODULE, own_pid=second.pid) == [first.pid]


def test_an_unreadable_proc_finds_no_one(tmp_path):
    assert other_trainers_on_host(proc_root=tmp_path / "no_proc") == []


def test_two_trainers_with_a_thread_per_core_each_are_told_to_split_the_cores():
    notice = oversubscription_notice("b", other_trainers=1, threads=16, cpu_count=16, omp_set=False, on_cuda=True)
    assert notice.startswith("node b: 1 other trainer(s) run on this host and each uses 16 CPU threads on 16 cores")
    assert "OMP_NUM_THREADS=8 (cores / trainers)" in notice
    assert "comm.outer_device: cuda" in notice
    assert notice.endswith("see docs/runtime.md \"Several nodes on one host\"")
    on_cpu = oversubscription_notice("c", other_trainers=3, threads=4, cpu_count=8, omp_set=False, on_cuda=False)
    assert "OMP_NUM_THREADS=2 " in on_cpu and "outer_device" not in on_cpu


@pytest.mark.parametrize("other_trainers, threads, cpu_count, omp_set", [
    (0, 16, 16, False),  # alone on the host
    (1, 8, 16, False),  # already split
    (1, 16, 16, True),  # the user set OMP_NUM_THREADS
])
def test_no_notice_where_the_threads_fit_or_the_user_chose(other_trainers, threads, cpu_count, omp_set):
    assert oversubscription_notice("a", other_trainers, threads, cpu_count, omp_set, on_cuda=True) is None


def test_with_the_outer_state_on_the_gpu_nothing_is_checked(monkeypatch):
    monkeypatch.setattr("geodiloco.runtime.host_threads.other_trainers_on_host",
                        lambda: pytest.fail("the outer step needs no CPU threads on the GPU"))
    assert warn_if_oversubscribed("a", on_cuda=True, outer_on_cuda=True) is None


def test_a_co_located_trainer_without_omp_is_warned_on_stdout(monkeypatch, capsys):
    import torch
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("geodiloco.runtime.host_threads.other_trainers_on_host", lambda: [12345])
    monkeypatch.setattr("os.cpu_count", lambda: torch.get_num_threads())
    threads = torch.get_num_threads()
    notice = warn_if_oversubscribed("b", on_cuda=False, outer_on_cuda=False)
    assert notice.startswith(f"node b: 1 other trainer(s) run on this host and each uses {threads} CPU threads on "
                             f"{threads} cores;")
    assert f"Set OMP_NUM_THREADS={max(1, threads // 2)} (cores / trainers) for each, see docs/runtime.md" in notice
    assert capsys.readouterr().out == f"[geodiloco] {notice}\n"


@pytest.mark.parametrize("ranks, own, cores, trainers, on_cuda, expected", [
    (1, 4, 16, 1, False, 4),   # a one-rank node keeps torch's own count
    (2, 1, 2, 2, False, 2),    # torchrun's one thread per rank: the leader takes both while the other waits
    (2, 1, 2, 3, False, 1),    # another site's trainer on this host: the node's share is one core
    (4, 2, 16, 4, False, 8),   # four ranks of two threads each
    (8, 1, 64, 8, True, 8),    # a GPU node: its ranks' threads, well within the cores
    (8, 1, 8, 8, True, 1),     # a GPU node on 8 cores: 7 waiting ranks may spin, one core left
    (4, 4, 4, 4, True, 4),     # never fewer than its own
])
def test_the_leader_borrows_its_waiting_ranks_threads_within_its_share_of_the_cores(ranks, own, cores, trainers,
                                                                                  on_cuda, expected):
    assert leader_sync_threads(ranks, own, cores, trainers, on_cuda) == expected


def test_intra_op_threads_go_back_after_the_block_even_on_an_error():
    before = torch.get_num_threads()
    with intra_op_threads(before + 1):
        assert torch.get_num_threads() == before + 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="inside"):
        with intra_op_threads(before + 1):
            raise RuntimeError("inside")
    assert torch.get_num_threads() == before


def test_a_thread_started_while_the_leader_borrows_keeps_its_creators_count():
    seen = {}

    def record(name):
        seen[name] = torch.get_num_threads()

    def started_in_window(target, name):
        thread = threading.Thread(target=target, args=(name,))
        with intra_op_threads(torch.get_num_threads() + 2):
            thread.start()
            thread.join()

    own = torch.get_num_threads()
    started_in_window(with_creators_threads(record), "pinned")  # wrapped before the window, as the runtime does
    started_in_window(record, "plain")
    assert seen["pinned"] == own
    assert seen["plain"] == own + 2  # what the pinning prevents: torch hands a new thread the count of that moment


def one_node_run(tmp_path, name, sync_threads):
    nodes = [{"name": "a", "gpus": ["2 x A30"], "local_steps": 2, "batch_size": 4, "emulate": {"step_time_s": 0.02}}]
    config = small_config(nodes)
    config["diloco"].update(rounds=2, overlap="none", compression="int8")
    if sync_threads is not None:
        config["comm"]["sync_threads"] = sync_threads
    config_path, run_dir = write_config(tmp_path, config, f"{name}.yaml"), tmp_path / name
    env = dict(os.environ, GEODILOCO_DEVICE="cpu", GEODILOCO_SECRET="the-runs-shared-secret-123456")
    env.pop("OMP_NUM_THREADS", None)  # torchrun's own: one thread per rank
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           f"--master-port={free_port()}", "-m", "geodiloco.runtime.train", "--config",
                           str(config_path), "--node-name", "a", "--run-dir", str(run_dir)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.skipif(usable_cores() < 2, reason="one core: there is no other rank's thread to borrow")
def test_a_two_rank_nodes_leader_syncs_on_both_threads_and_trains_the_same_bits(tmp_path):
    # set, not left to the default: tests running beside this one put other trainers on the host, and the
    # default then rightly keeps the leader's share of the cores (the rule has its own test above)
    borrowed, own = one_node_run(tmp_path, "borrowed", 2), one_node_run(tmp_path, "own", 1)
    assert ("node a: its leader takes the outer sync's host work on 2 CPU threads while the node's 2 rank(s) wait "
            "for it (comm.sync_threads)") in borrowed
    assert "host work on" not in own
    final = [line for output in (borrowed, own) for line in output.splitlines() if "final parameter checksum" in line]
    assert len(final) == 2 and final[0] == final[1] and final[0].endswith("on every rank: a (2 ranks)")
