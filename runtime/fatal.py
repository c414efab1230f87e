"""A configuration error in one worker stops the whole local run at once.

Under torchrun's elastic agent a worker that exits is restarted (up to ``comm.elastic.max_restarts``),
which helps after a crash but not after bad input: a field the data does not have, or a metrics
setting that cannot work, fails the same way on every restart, so the run would loop for minutes
and end in pages of agent tracebacks. A worker that stops on a ``ConfigError`` writes its one-line
message to the file ``GEODILOCO_FATAL_FILE`` names (``geodiloco run`` and each site's agent choose it in a
private folder of the temp directory, away from the run directory, whose disk may be the very error);
the launcher sees it, stops every site and exits 2 with that line.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import MutableMapping, Optional

FATAL_FILE_ENV = "GEODILOCO_FATAL_FILE"
FATAL_FILE = "fatal_error.txt"
UNWRITTEN_GRACE_S = 2.0
"""An empty fatal-error file older than this is a message its writer could not write (its disk full too)."""
UNWRITTEN_MESSAGE = ("a site stopped on an error it could not write down (the temp folder's disk is full as well); "
                     "its own line is above")


def private_fatal_file() -> Path:
    """Where workers record their fatal error: a new folder of this user's alone (0700) in the temp directory. Not
    the run directory, which a full disk there would leave the message unwritten; not a bare name in the shared temp
    folder, since a name freed there could be created first by another user, who would then speak for it."""
    return Path(tempfile.mkdtemp(prefix="geodiloco-fatal-")) / FATAL_FILE


def remove_fatal_file(path: Path) -> None:
    """Remove ``private_fatal_file``'s file and its folder."""
    path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        path.parent.rmdir()


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
    """The recorded message, or None while no worker has recorded one. A file its writer created but could not
    write into (that disk full too) reads as ``UNWRITTEN_MESSAGE`` once it is ``UNWRITTEN_GRACE_S`` old."""
    try:
        text = path.read_text(encoding="utf-8").strip()
        if text:
            return text
        age_s = time.time() - path.stat().st_mtime
    except OSError:
        return None
    return UNWRITTEN_MESSAGE if age_s > UNWRITTEN_GRACE_S else None


class LaunchError(RuntimeError):
    """A node the launcher waits for never came up (its own error is in its output above): one line, exit 1."""
