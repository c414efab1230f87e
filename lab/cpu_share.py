"""Real compute for an emulated site: run a node's processes under a CPU quota (cgroups).

A virtual GPU (:mod:`lab.virtual_gpu`) sleeps to a target the config declares, so a
planner that reads the same config can know the truth exactly. A node with
``emulate: {cpu_share: 0.35}`` instead trains for real inside a cgroup limited to
0.35 of one core: its step time is whatever the model takes at batch B under that
quota, with a t(B) shape and noise (scheduler, caches, the other sites' processes)
that nobody wrote down. A slowdown event divides the quota by its factor from its
round on, like a co-tenant that arrives on the machine.

Both cgroup versions: v1 (``cpu`` controller, ``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``) and v2 (``cpu.max`` = "quota period"). Needs root (or a
delegated, writable hierarchy); without it :func:`start_node_share` says what was
skipped and the node runs unthrottled.

Groups are named ``geodiloco-<owner pid>-<node>``; the owner is the process that
started the node's processes (the launcher, or torchrun's agent), so all ranks of
one node share one group, and groups whose owner is gone are removed by
:func:`cleanup_stale`.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from geodiloco.lab.pids import process_alive

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_PREFIX = "geodiloco"
MIN_QUOTA_US = 1000
GROUP_NAME = re.compile(rf"^{GROUP_PREFIX}-(\d+)-(.+)$")


class CpuShareUnavailable(RuntimeError):
    """No writable cgroup CPU controller here; the message says why."""


@dataclass(frozen=True)
class CpuHierarchy:
    """Where the CPU controller is mounted and which cgroup version it speaks."""

    path: Path
    version: int


def find_cpu_hierarchy(root: Path = CGROUP_ROOT) -> CpuHierarchy:
    """The writable CPU controller: v1 ``cpu`` (or ``cpu,cpuacct``), else v2 with ``cpu`` enabled."""
    for name in ("cpu", "cpu,cpuacct"):
        path = root / name
        if (path / "cpu.cfs_quota_us").is_file():
            return _writable(CpuHierarchy(path, 1))
    controllers = root / "cgroup.controllers"
    if controllers.is_file() and "cpu" in controllers.read_text().split():
        return _writable(CpuHierarchy(root, 2))
    raise CpuShareUnavailable(f"no cgroup CPU controller under {root} (neither v1 cpu/cpu.cfs_quota_us nor a v2 "
                              "hierarchy with 'cpu' in cgroup.controllers)")


def _writable(hierarchy: CpuHierarchy) -> CpuHierarchy:
    if not os.access(hierarchy.path, os.W_OK):
        raise CpuShareUnavailable(f"{hierarchy.path} is not writable (run as root, or delegate a cgroup to this user)")
    return hierarchy


def can_use_cpu_share(root: Path = CGROUP_ROOT) -> tuple[bool, str]:
    """(usable, reason): whether CPU quotas can be set here."""
    try:
        hierarchy = find_cpu_hierarchy(root)
    except CpuShareUnavailable as err:
        return False, str(err)
    return True, f"cgroup v{hierarchy.version} CPU controller at {hierarchy.path}"


def group_name(owner_pid: int, node: str) -> str:
    """``geodiloco-<owner>-<node>`` with anything but letters, digits, '.', '_' and '-' replaced."""
    return f"{GROUP_PREFIX}-{owner_pid}-{re.sub(r'[^A-Za-z0-9._-]', '_', node)}"


class CpuQuota:
    """One cgroup with a CPU quota of ``share`` cores per ``period_ms``."""

    def __init__(self, hierarchy: CpuHierarchy, name: str, period_ms: float) -> None:
        self.hierarchy = hierarchy
        self.path = hierarchy.path / name
        self.period_us = int(round(period_ms * 1000))
        if hierarchy.version == 2:
            _enable_cpu_controller(hierarchy.path)
        self.path.mkdir(exist_ok=True)
        self.share: Optional[float] = None

    def set_share(self, cores: float) -> None:
        """Limit the group to ``cores`` CPU cores (0.35 = 35 % of one core; > 1 spans cores)."""
        quota_us = max(MIN_QUOTA_US, int(round(cores * self.period_us)))
        if self.hierarchy.version == 1:
            (self.path / "cpu.cfs_period_us").write_text(str(self.period_us))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota_us))
        else:
            (self.path / "cpu.max").write_text(f"{quota_us} {self.period_us}")
        self.share = cores

    def add_process(self, pid: int) -> None:
        """Move ``pid`` (with all its threads) into the group."""
        (self.path / "cgroup.procs").write_text(str(pid))

    def processes(self) -> list[int]:
        try:
            return [int(line) for line in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def release(self, pid: int) -> None:
        """Move ``pid`` back to the hierarchy's root group and remove this group if it is empty."""
        try:
            (self.hierarchy.path / "cgroup.procs").write_text(str(pid))
        except OSError:
            pass
        remove_group(self.path)


def _enable_cpu_controller(path: Path) -> None:
    """cgroup v2: children of ``path`` get the cpu controller only if its subtree_control lists it."""
    control = path / "cgroup.subtree_control"
    if control.is_file() and "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def remove_group(path: Path) -> bool:
    """rmdir an empty group; False if it still holds processes or is gone."""
    try:
        path.rmdir()
        return True
    except OSError:
        return False


def cleanup_stale(root: Path = CGROUP_ROOT, owner_pid: Optional[int] = None) -> list[str]:
    """Remove empty ``geodiloco-*`` groups whose owner is gone (or whose owner is ``owner_pid``)."""
    try:
        hierarchy = find_cpu_hierarchy(root)
    except CpuShareUnavailable:
        return []
    removed = []
    for path in sorted(hierarchy.path.glob(f"{GROUP_PREFIX}-*")):
        match = GROUP_NAME.match(path.name)
        if not match or not path.is_dir():
            continue
        owner = int(match.group(1))
        if (owner == owner_pid or not process_alive(owner)) and remove_group(path):
            removed.append(path.name)
    return removed


class NodeCpuShare:
    """The calling process's node under its ``emulate.cpu_share``, re-set at every round's start.

    ``factor_for_round(round)`` is the node's slowdown factor; the quota is ``share / factor``.
    """

    def __init__(self, quota: CpuQuota, share: float, factor_for_round: Callable[[int], float]) -> None:
        self.quota = quota
        self.base_share = share
        self.factor_for_round = factor_for_round

    def enter_round(self, round_idx: int) -> None:
        share = self.base_share / self.factor_for_round(round_idx)
        if share != self.quota.share:
            self.quota.set_share(share)

    def close(self) -> None:
        self.quota.release(os.getpid())


def start_node_share(node_name: str, share: float, period_ms: float,
                     factor_for_round: Callable[[int], float], owner_pid: Optional[int] = None,
                     root: Path = CGROUP_ROOT) -> Optional[NodeCpuShare]:
    """Put this process into its node's quota group; None (after saying why on stderr) when not possible."""
    owner = owner_pid if owner_pid is not None else os.getppid()
    try:
        hierarchy = find_cpu_hierarchy(root)
        cleanup_stale(root)
        quota = CpuQuota(hierarchy, group_name(owner, node_name), period_ms)
        quota.set_share(share / factor_for_round(0))
        quota.add_process(os.getpid())
    except (CpuShareUnavailable, OSError) as err:
        print(f"[geodiloco] node {node_name}: emulate.cpu_share {share:g} skipped, the node runs unthrottled: {err}",
              file=sys.stderr, flush=True)
        return None
    return NodeCpuShare(quota, share, factor_for_round)
