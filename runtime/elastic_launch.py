"""Elastic sites through torchrun: the agent command line and a rendezvous store of the run's own.

Each site runs torchrun's elastic agent with ``--nnodes comm.min_nodes:N`` and the c10d
rendezvous. When a site's workers fail (a peer's connections closed, or runtime/heartbeat.py
found a peer silent) the agent restarts them; the agents still alive meet again and start a
world of whoever is present, and a site that comes back is let in at the next rendezvous
(the agents of a running world restart their workers to take it in). The workers resume
from the newest round every present node can restart after (runtime/recovery.py).

The rendezvous store runs in a process of its own (``python -m geodiloco.runtime.rendezvous``), not
inside a site's agent, so any training site may fail. The same command lines are what
``scripts/launch_site.sh`` builds for sites on separate machines.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from geodiloco.runtime.config import RunConfig
from geodiloco.runtime.launch import wait_for_file

AGENT_MONITOR_INTERVAL_S = 0.5
KEEP_ALIVE_MISSES = 3
RENDEZVOUS_READY_FILE = "rendezvous.ready"
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
"""torchrun's shared store lives in the first agent and keeps its keys from one world to the next
(the workers of a new world read the old world's addresses); off, each world's rank 0 serves a
fresh store."""
TORCHRUN_SET = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT")


def rendezvous_conf(config: RunConfig) -> str:
    """torchrun ``--rdzv-conf``: the store is elsewhere; timeouts sized for a WAN (seconds)."""
    elastic = config.comm.elastic
    return (f"is_host=false,join_timeout={elastic.join_timeout_s},last_call_timeout={elastic.last_call_s},"
            f"close_timeout={max(30, elastic.last_call_s)},keep_alive_interval={elastic.keep_alive_s},"
            f"keep_alive_max_attempt={KEEP_ALIVE_MISSES}")


def agent_command(config: RunConfig, endpoint: str, local_addr: str, run_name: str, train_args: list[str],
                  nproc_per_node: int = 1) -> list[str]:
    """One site's torchrun elastic agent (``runtime/agent.py``) running ``runtime.train``."""
    elastic = config.comm.elastic
    return [sys.executable, "-m", "geodiloco.runtime.agent",
            f"--nnodes={config.comm.min_nodes}:{len(config.nodes)}", f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_name}",
            f"--rdzv-conf={rendezvous_conf(config)}", f"--max-restarts={elastic.max_restarts}",
            f"--monitor-interval={AGENT_MONITOR_INTERVAL_S:g}", f"--local-addr={local_addr}",
            "-m", "geodiloco.runtime.train", *train_args]


def agent_env(node_env: dict[str, str]) -> dict[str, str]:
    """A node's environment for its agent: torchrun sets the rank variables of its workers itself."""
    env = {key: value for key, value in node_env.items() if key not in TORCHRUN_SET}
    env.setdefault("LOGLEVEL", "WARNING")
    env.update(ELASTIC_ENV)
    return env


@contextlib.contextmanager
def rendezvous_store(site_set, address: str, port: int, run_dir: Path, timeout_s: float) -> Iterator[str]:
    """Run ``python -m geodiloco.runtime.rendezvous`` at ``address:port`` (in the first site's namespace when
    ``site_set`` is given); yields the endpoint once it listens, stops it on exit."""
    ready_file = run_dir / RENDEZVOUS_READY_FILE
    ready_file.unlink(missing_ok=True)
    command = [sys.executable, "-m", "geodiloco.runtime.rendezvous", "--host", address, "--port", str(port),
               "--ready-file", str(ready_file)]
    if site_set is not None:
        command = site_set.command(0, command)
    from geodiloco.runtime.launcher_watch import launcher_env
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, start_new_session=True,
                               env={**os.environ, **launcher_env()})
    try:
        wait_for_file(ready_file, process, timeout_s, "the rendezvous store")
        yield f"{address}:{port}"
    finally:
        if process.poll() is None:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        if process.poll() is None:
            process.kill()
            process.wait()
        ready_file.unlink(missing_ok=True)
