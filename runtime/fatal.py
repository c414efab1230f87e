"""A configuration error in one worker stops the whole local run at once.

Under torchrun's elastic agent a worker that exits is restarted (up to ``comm.elastic.max_restarts``),
which helps after a crash but not after bad input: a field the data does not have, or a metrics
setting that cannot work, fails the same way on every restart, so the run would loop for minutes
and end in pages of agent tracebacks. A worker that stops on a ``ConfigError`` writes its one-line
message to the file ``GEODILOCO_FATAL_FILE`` names (``geodiloco run`` sets it in the run directory);
the launcher sees it, stops every site and exits 2 with that line.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import MutableMapping, Optional

FATAL_FILE_ENV = "GEODILOCO_FATAL_FILE"
FATAL_FILE = "fatal_error.txt"


def record_fatal(message: str, environ: MutableMapping[str, str] = os.environ) -> None:
    """Write ``message`` where the launcher looks for it; the first worker's message is kept."""
    path = environ.get(FATAL_FILE_ENV)
    if not path:
        return
    try:
        with open(path, "x", encoding="utf-8") as handle:
            handle.write(message.strip() + "\n")
    except OSError:
        pass


def read_fatal(path: Path) -> Optional[str]:
    """The recorded message, or None while no worker has recorded one."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return text or None


class LaunchError(RuntimeError):
    """A node the launcher waits for never came up (its own error is in its output above): one line, exit 1."""
