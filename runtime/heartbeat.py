"""Failure detection in seconds: each node's leader beats a counter in the run's TCP store.

A killed site closes its connections and its peers' next collective fails at once; a
frozen site (SIGSTOP, a hung driver, a cut link with the socket still open) would block
them until ``comm.timeout_s`` (minutes). So every leader increments its own counter in the
run's TCP store (served by rank 0) every ``heartbeat_interval_s`` and watches its peers' counters; a peer
whose counter has not moved for ``failure_timeout_s`` (by this node's own clock, so site
clocks need not agree) is declared failed, and the watcher ends its process with
``PEER_FAILED_EXIT_CODE``. Under torchrun's elastic agent that restarts the surviving
workers without the failed site (runtime/recovery.py picks the round to go on from); under
``geodiloco run --no-elastic`` it stops the run promptly instead of hanging.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Optional

PEER_FAILED_EXIT_CODE = 75
"""Exit status of a worker that stopped because a peer failed (EX_TEMPFAIL: try again)."""
LEFT_SUFFIX = ".left"


def open_store(failure_timeout_s: float) -> Optional[Any]:
    """A client of the run's TCP store (MASTER_ADDR:MASTER_PORT, set by torchrun or the launcher)."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    import torch.distributed as dist
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=failure_timeout_s),
                         wait_for_workers=False)


class Heartbeat:
    """Beat this node's counter and watch the peers' (a daemon thread; see the module docstring).

    ``store``: any torch.distributed Store (``add`` is atomic and never blocks on a missing key).
    ``on_failure(node, silent_s)``: called once, from a thread, when a peer fell silent.

    A store whose site froze or whose link was cut leaves the socket open, and a store call can then block
    far past the store's own timeout (forever, against a frozen process): so a second thread watches the call
    in flight, and declares the store's site failed once a call has waited ``failure_timeout_s`` (a process
    that was itself stopped, then continued, is between calls and is not misled by its own pause)."""

    def __init__(self, store: Any, node_name: str, peers: list[str], interval_s: float, failure_timeout_s: float,
                 on_failure: Optional[Callable[[str, float], None]] = None) -> None:
        self.store = store
        self.node_name = node_name
        self.peers = [peer for peer in peers if peer != node_name]
        self.interval_s = interval_s
        self.failure_timeout_s = failure_timeout_s
        self.on_failure = on_failure or exit_on_peer_failure(node_name)
        self._stop = threading.Event()
        self._failed = threading.Lock()
        self._store_ok_since = time.monotonic()
        self._call_started: Optional[float] = None
        """When the beat's store calls in flight began (None between beats)."""
        self._thread = threading.Thread(target=self._run, name="geodiloco-heartbeat", daemon=True)
        self._store_watch = threading.Thread(target=self._watch_store, name="geodiloco-store-watch", daemon=True)

    def start(self) -> "Heartbeat":
        self._store_ok_since = time.monotonic()
        self._thread.start()
        self._store_watch.start()
        return self

    def _watch_store(self) -> None:
        while not self._stop.wait(self.interval_s):
            started = self._call_started
            if started is not None and time.monotonic() - started > self.failure_timeout_s:
                self._fail("the run's TCP store on rank 0's site (no answer)", time.monotonic() - self._store_ok_since)
                return

    def stop(self, leaving: bool = True) -> None:
        """Stop beating; ``leaving``: tell the peers this node left on purpose (run finished), so
        those still writing their last logs do not take its silence for a failure."""
        self._stop.set()
        self._thread.join(timeout=self.interval_s * 2 + 1)
        if leaving:
            try:
                self.store.add(self.node_name + LEFT_SUFFIX, 1)
            except Exception:
                pass

    def _run(self) -> None:
        now = time.monotonic()
        last_seen = {peer: (-1, now) for peer in self.peers}
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            self._call_started = now
            try:
                self.store.add(self.node_name, 1)
                counts = {peer: self.store.add(peer, 0) for peer in self.peers}
                self._store_ok_since = now
            except Exception as err:  # the store itself is unreachable: the site of rank 0 failed
                self._call_started = None
                silent_s = time.monotonic() - self._store_ok_since
                if silent_s > self.failure_timeout_s:
                    self._fail(f"the run's TCP store on rank 0's site ({type(err).__name__})", silent_s)
                    return
                continue
            self._call_started = None
            for peer, count in counts.items():
                previous, since = last_seen[peer]
                if count != previous:
                    last_seen[peer] = (count, now)
                elif now - since > self.failure_timeout_s and not self._left(peer):
                    self._fail(peer, now - since)
                    return

    def _left(self, peer: str) -> bool:
        try:
            return self.store.add(peer + LEFT_SUFFIX, 0) > 0
        except Exception:
            return False

    def _fail(self, peer: str, silent_s: float) -> None:
        """Tell ``on_failure`` once, whichever thread notices first."""
        if not self._stop.is_set() and self._failed.acquire(blocking=False):
            self.on_failure(peer, silent_s)


def exit_on_peer_failure(node_name: str, on_record: Optional[Callable[[str, float], None]] = None
                         ) -> Callable[[str, float], None]:
    """End this worker at once (a collective may be blocked on the silent peer); ``on_record``
    logs the failure first."""

    def stop(peer: str, silent_s: float) -> None:
        if on_record is not None:
            on_record(peer, silent_s)
        print(f"[geodiloco] node {node_name}: {peer} silent for {silent_s:.0f} s; treating it as failed and "
              "stopping this worker (the elastic agent restarts the present sites from the last complete round)",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(PEER_FAILED_EXIT_CODE)

    return stop
