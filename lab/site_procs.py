"""Start one process per emulated site and collect the JSON lines each prints.

The benchmarks time a collective from inside every site; each site process
prints one JSON object per line (other lines are ignored), and the driver
combines them. Sites are network namespaces (:class:`lab.sites.Sites`) or,
with ``sites=None``, plain processes on loopback.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from geodiloco.lab.sites import Sites

ArgvForSite = Callable[[int, str], Sequence[str]]
"""(site index, the address the site is reached at) -> the site process's command line."""


class SiteProcessError(RuntimeError):
    """A site process exited non-zero or did not finish in time."""


def display_path(path: Path, root: Path) -> str:
    """``path`` relative to ``root`` when inside it (results name no machine-specific prefixes)."""
    try:
        return str(Path(path).resolve().relative_to(Path(root).resolve()))
    except ValueError:
        return str(path)


def json_lines(text: str) -> list[dict]:
    """Every line of ``text`` that is a JSON object, parsed, in order."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run_per_site(argv_for_site: ArgvForSite, num_sites: int, sites: Optional[Sites],
                 env: Optional[Mapping[str, str]] = None, master_port: int = 29500,
                 timeout_s: float = 600.0, cwd: Optional[Path] = None) -> list[list[dict]]:
    """Run ``num_sites`` processes at once, one per site; return each one's JSON lines (site order).

    Each process runs in its own session so that whatever it starts (a DHT, p2pd)
    is killed with it. ``MASTER_ADDR``/``MASTER_PORT`` point at site 0 (loopback
    without ``sites``). Raises :class:`SiteProcessError` naming the site that failed.
    """
    base_env = dict(os.environ if env is None else env)
    base_env.setdefault("OMP_NUM_THREADS", "1")
    processes: list[subprocess.Popen] = []
    try:
        for rank in range(num_sites):
            address = sites[rank].address if sites is not None else "127.0.0.1"
            argv = list(argv_for_site(rank, address))
            site_env = dict(base_env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port))
            if sites is not None:
                site_env = sites.env(rank, master_port=master_port, base=site_env)
                argv = sites.command(rank, argv)
            processes.append(subprocess.Popen(argv, env=site_env, stdout=subprocess.PIPE, text=True,
                                              cwd=cwd, start_new_session=True))
        outputs = []
        for rank, process in enumerate(processes):
            try:
                stdout, _ = process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                raise SiteProcessError(f"site {rank} did not finish within {timeout_s:g} s") from None
            if process.returncode != 0:
                raise SiteProcessError(f"site {rank} exited with code {process.returncode}")
            outputs.append(json_lines(stdout))
        return outputs
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
            kill_session(process.pid)


def kill_session(pid: int) -> None:
    """SIGKILL what a site process left in its session (its DHT, averager, p2pd)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
