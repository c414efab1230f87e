"""Checkpoint files written beside training instead of in its way.

A round's checkpoint used to be hashed and written between the outer step and
the next local phase, so every GPU of the node stood still for it (the idle
report's "other"). Now the round's end only takes a snapshot (every tensor
copied to host memory, runtime/state_file.py's ``encode_state``) and one
background thread hashes and writes the files while the next local phase runs.

Training waits for a write only at the next readiness exchange, the first
point where the files must exist (that exchange reports the saved round, and
every node reporting it commits ``latest``; see ``NodeTrainer.commit_checkpoint``).
The seconds it waits there are returned so the idle tracker counts them as
overhead. A crash while a write is under way leaves a temp file and ``latest``
on the round before, as a crash during a blocking write did.

``checkpoint.background: false`` runs each write at once, in the caller.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Optional

from geodiloco.runtime.host_threads import with_creators_threads


class CheckpointWriteError(RuntimeError):
    """A background checkpoint write failed (disk full, permissions); raised where training waits for it."""


class CheckpointWriter:
    """One write at a time, in a background thread (or in the caller when ``background`` is False)."""

    def __init__(self, background: bool = True) -> None:
        self.background = background
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._what = ""

    @property
    def writing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, write: Callable[[], None], what: str) -> None:
        """Start ``write`` (``what`` names it in errors) once the previous write has ended."""
        self.wait()
        self._what = what
        if not self.background:
            self._run(write)
            self._raise_if_failed()
            return
        # not a daemon: a normal exit lets the write finish rather than leave a half-written temp file
        self._thread = threading.Thread(target=with_creators_threads(self._run), args=(write,),
                                        name="geodiloco-checkpoint")
        self._thread.start()

    def wait(self) -> float:
        """Block until the write under way (if any) has ended; returns the seconds blocked.
        Raises ``CheckpointWriteError`` when that write failed."""
        waited_s = 0.0
        if self._thread is not None:
            started = time.perf_counter()
            self._thread.join()
            waited_s = time.perf_counter() - started
            self._thread = None
        self._raise_if_failed()
        return waited_s

    def close(self) -> Optional[BaseException]:
        """Wait for the last write without raising (for shutdown paths that are already handling an error);
        returns the write's error, if any."""
        try:
            self.wait()
        except CheckpointWriteError as err:
            return err
        return None

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as err:  # re-raised in the training thread, at the next wait
            self._error = err

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise CheckpointWriteError(f"writing the checkpoint of {self._what} failed: "
                                       f"{type(error).__name__}: {error}") from error
