"""A site's elastic agent (runtime/agent.py): torchrun's failures in one line, a worker that stops on bad input
not restarted, and a site that joins a running run with another config leaving while the run goes on
(real torchrun agents, `geodiloco rendezvous` and gloo on loopback)."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.elastic.rendezvous.api import (RendezvousClosedError, RendezvousConnectionError,
                                                      RendezvousTimeoutError)
from torch.distributed.run import get_args_parser

from geodiloco.runtime.agent import LEAVE_SIGNAL, TorchrunLog, describe_failure, run_label, with_leave_signal
from geodiloco.runtime.config import load_config
from geodiloco.runtime.elastic_launch import agent_command, agent_env
from geodiloco.runtime.launch import free_port, wait_for_file
from tests.runtime_helpers import REPO_ROOT, read_jsonl, small_config, write_config
from tests.test_runtime_launcher_watch import wait_gone

SECRET = "the-runs-shared-secret-123456"
ARGV = ["--nnodes=1:3", "--max-restarts=3", "--rdzv-endpoint", "10.0.0.1:29400", "--rdzv_id=exp7", "-m", "geodiloco.runtime.train",
        "--rdzv-id", "not-torchrun's"]
RUN = "run exp7 at 10.0.0.1:29400"
ARGS = get_args_parser().parse_args(ARGV)


def test_the_run_is_named_by_torchruns_own_options_not_the_workers_arguments():
    assert run_label(ARGS) == RUN


def test_the_leave_signal_is_added_to_the_signals_torchrun_handles_unless_the_user_chose_them():
    argv, leave = with_leave_signal(ARGV, get_args_parser())
    assert leave == LEAVE_SIGNAL and argv[0] == "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"
    assert get_args_parser().parse_args(argv).signals_to_handle.endswith("SIGUSR2")
    chosen = ["--signals-to-handle=SIGTERM", *ARGV]
    assert with_leave_signal(chosen, get_args_parser()) == (chosen, signal.SIGTERM)


@pytest.mark.parametrize("error, expected, exit_code", [
    (RendezvousClosedError(), "site a: the run exp7 at 10.0.0.1:29400 has ended (its rendezvous is closed)", 1),
    (RendezvousTimeoutError(), "site a: no world formed for the run exp7 at 10.0.0.1:29400 within the join timeout", 1),
    (RendezvousConnectionError("The connection to the C10d store has failed."),
     "site a: lost the rendezvous store of the run exp7 at 10.0.0.1:29400", 1),
    (ConnectionResetError("Connection reset by peer"), "site a: lost the rendezvous store", 1),
    (SignalException("got signal", LEAVE_SIGNAL), "site a stopped on bad input or a full disk (its error is above) and was not "
                                                  "restarted", 2),
    (SignalException("got signal", signal.SIGINT), "site a stopped by SIGINT", 130),
    (ChildFailedError("geodiloco.runtime.train", {0: ProcessFailure(0, 4242, 75, "<N/A>")}),
     "site a: its workers failed (exit code 75) and used up their restarts", 1),
])
def test_each_torchrun_failure_is_one_line_naming_the_run_and_what_to_do(error, expected, exit_code):
    line, code = describe_failure(error, ARGS, "a", fatal=None)
    assert line.startswith(expected) and "\n" not in line
    assert code == exit_code


def test_failed_workers_say_how_to_continue_and_why_a_fixed_run_did_not_restart_them():
    failed = ChildFailedError("geodiloco.runtime.train", {0: ProcessFailure(0, 4242, 75, "<N/A>")})
    fixed = get_args_parser().parse_args([arg.replace("--max-restarts=3", "--max-restarts=0") for arg in ARGV])
    line, _ = describe_failure(failed, fixed, "a", fatal=None)
    assert line.startswith("site a: its workers failed (exit code 75) and the run has fixed membership (--fixed, or "
                           "comm.elastic.enabled: false), so they are not restarted")
    assert line.endswith("start every site with its command plus --resume and a new --run-id")
    closed, _ = describe_failure(RendezvousClosedError(), ARGS, "a", fatal=None)
    assert "if it finished, there is nothing left to do" in closed and "restart `geodiloco rendezvous`" not in closed


def test_a_site_says_within_seconds_that_nothing_answers_at_the_endpoint_and_nothing_when_something_does(capsys):
    import socket
    from types import SimpleNamespace

    from geodiloco.runtime.agent import watch_the_endpoint
    port = free_port()
    args = get_args_parser().parse_args([f"--rdzv-endpoint=127.0.0.1:{port}", "-m", "x"])
    watch_the_endpoint(args, "a", SimpleNamespace(joined=False), after_s=0.3, poll_s=0.1).join(5)
    err = capsys.readouterr().err
    assert err.startswith(f"[geodiloco] site a: nothing answers at 127.0.0.1:{port} after 0.3 s (connection refused)")
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        args = get_args_parser().parse_args([f"--rdzv-endpoint=127.0.0.1:{port}", "-m", "x"])
        watch_the_endpoint(args, "a", SimpleNamespace(joined=False), after_s=0.3, poll_s=0.1).join(5)
    assert capsys.readouterr().err == ""
    hosting = get_args_parser().parse_args(["--rdzv-endpoint=127.0.0.1:1", "--rdzv-conf=is_host=true", "-m", "x"])
    assert watch_the_endpoint(hosting, "a", SimpleNamespace(joined=False)) is None


def test_a_store_never_reached_is_told_apart_from_one_lost():
    error = RendezvousConnectionError("The connection to the C10d store has failed.")
    line, code = describe_failure(error, ARGS, "a", None, joined=False)
    assert line.startswith("site a: cannot reach the rendezvous store at 10.0.0.1:29400 (nothing listens there")
    assert "--resume" not in line and code == 1


def log_record(message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord("torch.distributed.elastic", level, __file__, 1, message, None, None)


def test_torchruns_log_becomes_a_spare_notice_once_a_killed_worker_line_and_nothing_else(capsys):
    log = TorchrunLog("c", RUN)
    log.emit(log_record("The node 'x_1_0' added itself to the redundancy list of round 3 of the rendezvous 'exp7'."))
    log.emit(log_record("The node 'x_1_0' added itself to the redundancy list of round 4 of the rendezvous 'exp7'."))
    log.emit(log_record("Sending process 42 closing signal SIGTERM", logging.WARNING))
    log.emit(log_record("failed (exitcode: 75) local_rank: 0 (pid: 42) of binary: python", logging.ERROR))
    log.emit(log_record("failed (exitcode: -9) local_rank: 1 (pid: 43) of binary: python", logging.ERROR))
    assert not log.joined
    log.emit(log_record("The node 'x_1_0' has joined round 5 of the c10d rendezvous 'exp7' as rank 2 in a world of "
                        "size 3."))
    assert log.joined and log.waited_as_spare
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"[geodiloco] site c: the {RUN} already has every place taken (--nnodes): this site waits as a spare until "
        "a site of it fails or it ends; if this is another run, stop it and give it its own --run-id",
        "[geodiloco] site c: the worker of local rank 1 was killed by SIGKILL (the kernel's out-of-memory killer, "
        "or a kill -9); its agent restarts it while --max-restarts allows"]


def test_a_spare_whose_run_ended_is_told_so_and_other_errors_are_not_hidden():
    # torchrun's agent returns no result to launch_agent when a spare's rendezvous closes
    line, code = describe_failure(AttributeError("'NoneType' object has no attribute 'is_failed'"), ARGS, "a", None,
                                  waited_as_spare=True)
    assert line.startswith("site a waited as a spare and the run exp7 at 10.0.0.1:29400 has ended") and code == 1
    with pytest.raises(AttributeError, match="^a bug of ours$"):
        describe_failure(AttributeError("a bug of ours"), ARGS, "a", None, waited_as_spare=False)
    with pytest.raises(ValueError, match="^a bug of ours$"):
        describe_failure(ValueError("a bug of ours"), ARGS, "a", None)


# ----- real agents ----------------------------------------------------------------------------

def site_config(tmp_path: Path, rounds: int, step_time_s: float) -> Path:
    nodes = [{"name": name, "gpus": ["RTX 3090"], "emulate": {"step_time_s": step_time_s}} for name in ("a", "b", "c")]
    config = small_config(nodes, comm={"timeout_s": 60, "min_nodes": 2,
                                       "elastic": {"failure_timeout_s": 5, "heartbeat_interval_s": 0.5,
                                                   "last_call_s": 3, "keep_alive_s": 1, "join_timeout_s": 120}})
    config["diloco"].update({"rounds": rounds, "local_steps": 2})
    config["data"]["eval_every_rounds"] = 0
    return write_config(tmp_path, config)


def start_agent(config_path: Path, endpoint: str, name: str, run_dir: Path, *extra: str) -> subprocess.Popen:
    config = load_config(config_path)
    command = agent_command(config, endpoint, "127.0.0.1", "agent-test",
                            ["--config", str(config_path), "--run-dir", str(run_dir), *extra])
    env = agent_env(dict(os.environ, GEODILOCO_NODE=name, GEODILOCO_SECRET=SECRET, GLOO_SOCKET_IFNAME="lo",
                         GEODILOCO_DEVICE="cpu", OMP_NUM_THREADS="1"))
    env.pop("GEODILOCO_FATAL_FILE", None)
    return subprocess.Popen(command, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def start_rendezvous(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    port, ready = free_port(), tmp_path / "rendezvous.ready"
    server = subprocess.Popen([sys.executable, "-m", "geodiloco.runtime.rendezvous", "--host", "127.0.0.1",
                               "--port", str(port), "--ready-file", str(ready)], cwd=REPO_ROOT,
                              stdout=subprocess.DEVNULL)
    wait_for_file(ready, server, 30, "the rendezvous store")
    return server, f"127.0.0.1:{port}"


@pytest.mark.slow
def test_a_site_that_joins_with_another_config_leaves_and_the_run_goes_on(tmp_path):
    # the run must still be training when site c's agent has started and joined, which takes a loaded 2-core
    # machine tens of seconds: 45 rounds of 2 steps padded to 0.3 s last at least 27 s (padding sleeps, no CPU)
    rounds = 45
    config_path = site_config(tmp_path, rounds, step_time_s=0.3)
    server, endpoint = start_rendezvous(tmp_path)
    try:
        first = start_agent(config_path, endpoint, "a", tmp_path / "run_a")
        # b's first start has a bad setting: its worker stops before the world forms, and a hears why at once
        bad = start_agent(config_path, endpoint, "b", tmp_path / "run_b", "--set", "optim.outer.lr=-1")
        bad_output, _ = bad.communicate(timeout=120)
        running = {"a": first, "b": start_agent(config_path, endpoint, "b", tmp_path / "run_b")}
        deadline = time.monotonic() + 120
        while not (tmp_path / "run_a" / "metrics.jsonl").is_file() and time.monotonic() < deadline:
            time.sleep(0.2)  # the run is training before the edited site comes
        edited = start_agent(config_path, endpoint, "c", tmp_path / "run_c", "--set", "optim.outer.lr=0.5")
        edited_output, _ = edited.communicate(timeout=240)
        outputs = {name: agent.communicate(timeout=300)[0] for name, agent in running.items()}
        # a site started after the run ended meets a closed rendezvous: one line, not torchrun's traceback
        late = start_agent(config_path, endpoint, "c", tmp_path / "run_late")
        late_output, _ = late.communicate(timeout=120)
    finally:
        server.terminate()
        server.wait(timeout=10)

    assert bad.returncode == 2, bad_output[-3000:]
    assert "optim.outer.lr: Input should be greater than 0 (got -1)" in bad_output
    # a did not wait out comm.timeout_s for b's rank: it restarted its worker at b's notice
    assert ("node a: a site of this world stopped on bad input before it formed (node b: " in outputs["a"]
            and "optim.outer.lr: Input should be greater than 0" in outputs["a"]), outputs["a"][-3000:]
    assert "no world formed within comm.timeout_s" not in outputs["a"]
    assert edited.returncode == 2, edited_output[-3000:]
    # it stopped once and its agent did not restart it (a restart would meet the same difference)
    assert edited_output.count("node c's config differs from node a's in optim.outer.lr: 0.5 at node c, "
                               "0.7 at node a") == 1, edited_output[-3000:]
    assert "this site leaves the run and the other sites go on without it" in edited_output
    assert "[geodiloco] site c stopped on bad input or a full disk (its error is above) and was not restarted" in edited_output
    assert "Traceback" not in edited_output
    for name, output in outputs.items():
        assert running[name].returncode == 0, output[-3000:]
        assert "c joined with a config that differs from the run's (optim.outer.lr: 0.5 at node c" in output
    trained = {row["round"] for row in read_jsonl(tmp_path / "run_a" / "metrics.jsonl") if row["node"] == "a"}
    assert trained == set(range(rounds))
    assert not (tmp_path / "run_c" / "checkpoints").exists()
    assert late.returncode == 1, late_output[-3000:]
    assert "[geodiloco] site c: the run" in late_output and "has ended (its rendezvous is closed)" in late_output
    assert "Traceback" not in late_output


def test_an_agents_own_fatal_error_file_lies_in_a_folder_only_its_user_can_enter():
    # a name freed in the shared temp folder could be created first by another user, who would then speak for it
    import stat
    from geodiloco.runtime.agent import prepare_environment
    environ: dict[str, str] = {}
    path, chosen = prepare_environment(signal.SIGTERM, environ)
    try:
        assert chosen and not path.exists() and environ["GEODILOCO_FATAL_FILE"] == str(path)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and path.parent.stat().st_uid == os.getuid()
    finally:
        path.parent.rmdir()
    kept, chosen = prepare_environment(signal.SIGTERM, {"GEODILOCO_FATAL_FILE": "/somewhere/fatal.txt"})
    assert (str(kept), chosen) == ("/somewhere/fatal.txt", False)


@pytest.mark.slow
def test_a_worker_whose_agent_is_killed_with_sigkill_stops_with_it(tmp_path):
    """An agent killed with SIGKILL cannot stop its worker; the worker notices its parent is gone and stops, instead
    of training on in the world with no agent to restart it (the others' agents then waited out torchrun's 300 s
    exit barrier for the agent that was gone)."""
    config = small_config([{"name": "a", "emulate": {"step_time_s": 0.05}}], comm={"timeout_s": 60, "min_nodes": 1})
    config["diloco"].update({"rounds": 500, "local_steps": 2})
    config_path = write_config(tmp_path, config)
    server, endpoint = start_rendezvous(tmp_path)
    try:
        agent = start_agent(config_path, endpoint, "a", tmp_path / "run")
        deadline = time.monotonic() + 120
        while not (tmp_path / "run" / "metrics.jsonl").is_file():
            assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()[0][-3000:]
            time.sleep(0.2)
        workers = [int(pid) for pid in subprocess.run(["pgrep", "-P", str(agent.pid)], capture_output=True,
                                                      text=True).stdout.split()]
        assert workers, "the agent has a worker while it trains"
        agent.kill()
        agent.wait()
        running = wait_gone(workers, timeout_s=15.0)
        for pid in running:
            os.kill(pid, signal.SIGKILL)
        assert running == [], "the worker went on training without its agent"
    finally:
        server.terminate()
        server.wait(timeout=10)
