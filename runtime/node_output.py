"""A launched node's output: forwarded to this terminal as it comes, and kept.

Every line a node process writes goes to the launcher's stdout/stderr (as before) and to
``RUN_DIR/logs/NAME.log``; the last lines stay in memory so that, when the node dies, the
launcher can show them beside its name and exit cause instead of leaving the user to find
them among the other nodes' interleaved output.
"""
from __future__ import annotations

import collections
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Optional

TAIL_LINES = 12
LOG_DIR = "logs"


class NodeOutput:
    """Forwarding threads for one node process (``stdout``/``stderr`` must be pipes)."""

    def __init__(self, process: subprocess.Popen, log_path: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self._log: Optional[IO[str]] = open(log_path, "a", buffering=1, errors="replace")
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._lock = threading.Lock()
        self._to_terminal = True
        self._threads = [threading.Thread(target=self._forward, args=(stream, sink), daemon=True)
                         for stream, sink in ((process.stdout, sys.stdout), (process.stderr, sys.stderr))]
        for thread in self._threads:
            thread.start()

    def _forward(self, stream: IO[str], sink: IO[str]) -> None:
        for line in stream:
            if self._to_terminal:
                sink.write(line)
                sink.flush()
            with self._lock:
                self._keep(line)
                self._tail.append(line.rstrip("\n"))

    def _keep(self, line: str) -> None:
        """Append ``line`` to the node's log file; a log that can no longer be written (the disk is full) is
        said once and then left, while the terminal and the tail go on getting every line."""
        if self._log is None:
            return
        try:
            self._log.write(line)
        except OSError as err:
            self._log = None
            print(f"[geodiloco] {self.log_path}: {err.strerror or err}; this node's log stops here (its output "
                  "still comes here)", file=sys.stderr, flush=True)

    def log_only(self) -> None:
        """Stop forwarding to the terminal (the log file still gets every line): for a node the launcher is
        stopping on purpose, whose shutdown messages would bury the reason."""
        self._to_terminal = False

    def tail(self, wait_s: float = 2.0) -> list[str]:
        """The last lines the node wrote (after the pipes drained, at most ``wait_s`` seconds)."""
        for thread in self._threads:
            thread.join(timeout=wait_s)
        with self._lock:
            return list(self._tail)


def log_path(run_dir: Path, node_name: str) -> Path:
    return run_dir / LOG_DIR / f"{node_name}.log"
