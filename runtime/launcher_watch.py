"""Site processes end with the ``geodiloco run`` that started them.

The launcher starts every site (a node's trainer, its torchrun agent, the rendezvous store) in a
session of its own, so that a closed terminal or a Ctrl-C reaches them only through the launcher,
which stops them in order. A launcher killed with SIGKILL runs no such code: its sites would go on
training, restarting workers that fail on its closed output pipe, inside network namespaces the
next run takes for stale. So each process the launcher starts directly watches for its parent to
change (the kernel hands orphans to another process) and then stops itself with SIGTERM, the
signal its own shutdown path already handles. Watching the parent id, not a pid's liveness, is
immune to pid reuse. Workers under a site's torchrun agent watch that agent the same way: an agent
stops its workers itself, but one killed with SIGKILL cannot, and its orphaned worker would go on
training in the world with no agent to restart it, while the other sites' agents waited out torchrun's
exit barrier (300 s) for the agent that is gone.
"""
from __future__ import annotations

import os
import shlex
import signal
import threading
import time
from pathlib import Path
from typing import Optional

LAUNCHER_PID_ENV = "GEODILOCO_LAUNCHER_PID"
"""The launcher's pid, set in the environment of every process it starts."""
POLL_S = 1.0


def launcher_env() -> dict[str, str]:
    """The variable to put in the environment of a process this launcher starts."""
    return {LAUNCHER_PID_ENV: str(os.getpid())}


def resume_command(run_dir: Path | str) -> str:
    """The command that continues a run ``geodiloco run`` started (it gives each run its own rendezvous id, so no
    ``--run-id`` is needed), pasteable whatever the path holds."""
    path = shlex.quote(str(run_dir))
    return f"geodiloco run --resume --run-dir{'=' if path.startswith('-') else ' '}{path}"  # argparse takes -x for an option


def launcher_resume_command(run_dir: Path | str) -> Optional[str]:
    """``resume_command`` when this process was started under ``geodiloco run`` (directly, or as a worker of a site
    it started), else None: a site started by hand continues with its own command."""
    return resume_command(run_dir) if os.environ.get(LAUNCHER_PID_ENV) else None


def exit_with_launcher(poll_s: float = POLL_S) -> Optional[threading.Thread]:
    """Start a daemon thread that sends this process SIGTERM once the launcher that started it is gone; None
    (nothing watched) when this process was not started by a launcher directly (started by hand, by torchrun,
    or a worker of a site's agent)."""
    return exit_with_parent(LAUNCHER_PID_ENV, poll_s)


def exit_with_parent(pid_env: str, poll_s: float = POLL_S) -> Optional[threading.Thread]:
    """Start a daemon thread that sends this process SIGTERM once its parent, the process whose pid the
    environment variable ``pid_env`` holds, is gone; None when that variable does not name this process's
    parent (it was started by another process, or by hand)."""
    parent = os.environ.get(pid_env, "")
    if not parent.isdigit() or os.getppid() != int(parent):
        return None
    parent_pid = int(parent)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name=f"geodiloco-parent-watch-{parent_pid}", daemon=True)
    thread.start()
    return thread
