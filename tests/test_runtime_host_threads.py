"""Trainers sharing one host: finding the others in /proc (real processes) and the notice's advice."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from geodiloco.runtime.host_threads import (_parent_pid, other_trainers_on_host, oversubscription_notice,
                                            runs_module, warn_if_oversubscribed)

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
    notice = warn_if_oversubscribed("b", on_cuda=False, outer_on_cuda=False)
    assert notice is not None
    assert capsys.readouterr().out == f"[geodiloco] {notice}\n"
