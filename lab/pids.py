"""Whether a process still runs: how lab resources (namespaces, cgroups) know their owner is gone."""
from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """True while ``pid`` exists (also when it belongs to another user and cannot be signalled)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
