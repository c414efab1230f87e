"""A process and everything it started, read from /proc: how a test or drill kills a whole site.

torchrun's agent starts its workers in sessions of their own, so killing the agent's process
group leaves the workers running; a site failure is every process under the agent.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path


def children_by_parent() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        tree.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return tree


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first level first)."""
    tree, found, queue = children_by_parent(), [], [pid]
    while queue:
        for child in tree.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def signal_tree(pid: int, signum: int = signal.SIGKILL) -> list[int]:
    """Send ``signum`` to ``pid`` and all its descendants (collected first, so none escapes by
    being re-parented); returns the pids signalled."""
    pids = [pid] + descendants(pid)
    for target in pids:
        try:
            os.kill(target, signum)
        except (ProcessLookupError, PermissionError):
            pass
    return pids
