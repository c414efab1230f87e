"""Sites end with their launcher: a `geodiloco run` killed with SIGKILL runs no cleanup of its own, and its
site processes (trainers, torchrun agents and their workers, the rendezvous store) must not go on without it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runtime_helpers import REPO_ROOT, small_config, start_run, write_config

CHILD = ("from geodiloco.runtime.launcher_watch import exit_with_launcher; import sys, time; "
         "print('watched' if exit_with_launcher(0.1) else 'unwatched', flush=True); time.sleep(60)")
PARENT = ("import os, subprocess, sys, time; from geodiloco.runtime.launcher_watch import launcher_env; "
          "env = {**os.environ, **(launcher_env() if sys.argv[1] == 'launcher' else {})}; "
          f"child = subprocess.Popen([sys.executable, '-c', {CHILD!r}], env=env, start_new_session=True); "
          "print(child.pid, flush=True); time.sleep(60)")


def gone(pid: int) -> bool:
    """Exited (a zombie whose new parent has not reaped it yet counts: it runs nothing)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """The pids still running after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(gone(pid) for pid in pids):
        time.sleep(0.1)
    return [pid for pid in pids if not gone(pid)]


def descendants(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    children = [int(line) for line in found]
    return children + [grandchild for child in children for grandchild in descendants(child)]


@pytest.mark.parametrize("started_by, stops", [("launcher", True), ("someone else", False)])
def test_a_process_started_by_a_launcher_stops_when_the_launcher_is_killed(started_by, stops):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, started_by.split()[0]], stdout=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT)
    child_pid = int(parent.stdout.readline())
    try:
        time.sleep(1.0)  # the child is up and watching
        parent.kill()
        parent.wait()
        assert (wait_gone([child_pid], timeout_s=10.0) == []) is stops
    finally:
        with __import__("contextlib").suppress(ProcessLookupError):
            os.kill(child_pid, signal.SIGKILL)


@pytest.mark.slow
def test_a_killed_launcher_takes_its_elastic_sites_agents_workers_and_store_with_it(tmp_path):
    nodes = [{"name": name, "local_steps": 3, "batch_size": 2, "emulate": {"step_time_s": 0.1}} for name in "ab"]
    config = small_config(nodes, comm={"timeout_s": 60, "elastic": {"enabled": True}})
    config["diloco"]["rounds"] = 200
    run_dir = tmp_path / "run"
    launcher = start_run(write_config(tmp_path, config), run_dir, "--sites", "local")
    deadline = time.monotonic() + 120
    while not (run_dir / "metrics.jsonl").is_file():
        assert launcher.poll() is None and time.monotonic() < deadline, launcher.communicate()[1][-2000:]
        time.sleep(0.2)
    sites = descendants(launcher.pid)
    assert len(sites) >= 5  # the store, two agents and their two workers
    launcher.kill()
    launcher.wait()
    assert wait_gone(sites, timeout_s=30.0) == []


def test_the_resume_command_keeps_a_run_dir_that_begins_with_a_dash_an_argument():
    import argparse
    import shlex
    from geodiloco.runtime.launcher_watch import resume_command
    assert resume_command("runs/a b") == "geodiloco run --resume --run-dir 'runs/a b'"
    command = resume_command("-odd")
    parser = argparse.ArgumentParser()
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--run-dir")
    assert parser.parse_args(shlex.split(command)[2:]).run_dir == "-odd"
