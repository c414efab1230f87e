"""Tell the other sites at once why a site's worker stopped before the world formed.

A worker that stops on bad input (a config error, a secret too short) leaves before
``init_process_group``. Its peers cannot tell: they wait in the world's store for a rank that never
comes, for the whole ``comm.timeout_s``, and then fail with torch's store timeout. So the stopping
worker writes its one-line reason into the rendezvous store, the one store every site of the run
reaches, under a key named after its world (the world's store address, ``MASTER_ADDR:MASTER_PORT``,
which torchrun chooses afresh for each world). The other workers of that world watch for the key
while they form the world and agree on the start; on finding it they say why and stop with
``PEER_FAILED_EXIT_CODE``, and their agents go back to the rendezvous to wait for a world without
that site (or for the site, fixed and started again).

The rendezvous endpoint and run id reach the workers from their site's agent (``runtime/agent.py``);
under a bare torchrun or ``geodiloco run --no-elastic`` nothing is written or watched.
"""
from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta
from typing import Any, Callable, Mapping, Optional

RENDEZVOUS_ENDPOINT_ENV = "GEODILOCO_RDZV_ENDPOINT"
RUN_ID_ENV = "GEODILOCO_RDZV_ID"
DEFAULT_RENDEZVOUS_PORT = 29400
STORE_TIMEOUT_S = 5.0
"""How long a worker tries to reach the rendezvous store for a notice (seconds): a notice is a courtesy,
never a reason to hang."""
POLL_INTERVAL_S = 1.0


def notice_key(environ: Mapping[str, str]) -> Optional[str]:
    """The key of this worker's world in the rendezvous store, or None outside an agent's world."""
    run_id, address, port = (environ.get(RUN_ID_ENV), environ.get("MASTER_ADDR"), environ.get("MASTER_PORT"))
    if not (run_id and address and port and environ.get(RENDEZVOUS_ENDPOINT_ENV)):
        return None
    return f"geodiloco/stopped/{run_id}/{address}:{port}"


def open_rendezvous_store(environ: Mapping[str, str], timeout_s: float = STORE_TIMEOUT_S) -> Any:
    """A client of the run's rendezvous store (raises when it cannot be reached within ``timeout_s``)."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint
    host, port = parse_rendezvous_endpoint(environ[RENDEZVOUS_ENDPOINT_ENV], DEFAULT_RENDEZVOUS_PORT)
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def post_stop_notice(message: str, environ: Mapping[str, str] = os.environ,
                     open_store: Callable[[Mapping[str, str]], Any] = open_rendezvous_store) -> bool:
    """From a worker that stops on bad input: leave ``message`` for the other workers of its world.
    Returns whether it was written (False outside an agent's world or when the store cannot be reached)."""
    key = notice_key(environ)
    if key is None:
        return False
    try:
        open_store(environ).set(key, message.strip())
    except Exception:  # the store is unreachable or gone: the peers fall back on their own timeout
        return False
    return True


def exit_for_stopped_peer(node_name: str) -> Callable[[str], None]:
    """What a watching worker does on a notice: one line, then leave at once (its main thread may be
    blocked inside torch's store or a collective), so its agent re-forms the world."""
    def leave(message: str) -> None:
        from geodiloco.runtime.heartbeat import PEER_FAILED_EXIT_CODE
        print(f"[geodiloco] node {node_name}: a site of this world stopped on bad input before it formed "
              f"({message}); restarting this worker, so its agent waits for a world without that site "
              "(or for the site, fixed and started again)", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(PEER_FAILED_EXIT_CODE)
    return leave


class StopNoticeWatch:
    """Watch this world's notice key from a daemon thread until ``stop()``; ``on_notice(message)`` is
    called once when a peer's notice appears."""

    def __init__(self, store: Any, key: str, on_notice: Callable[[str], None],
                 interval_s: float = POLL_INTERVAL_S) -> None:
        self.store, self.key, self.on_notice, self.interval_s = store, key, on_notice, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="geodiloco-stop-notice", daemon=True)

    def start(self) -> "StopNoticeWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2 * self.interval_s + STORE_TIMEOUT_S)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.store.check([self.key]):
                    message = self.store.get(self.key).decode("utf-8", "replace")
                    if not self._stop.is_set():
                        self.on_notice(message)
                    return
            except Exception:  # the rendezvous store went away: the agent tells that; nothing to watch
                return
            self._stop.wait(self.interval_s)


def watch_for_stop_notices(node_name: str, environ: Mapping[str, str] = os.environ,
                           open_store: Callable[[Mapping[str, str]], Any] = open_rendezvous_store,
                           on_notice: Optional[Callable[[str], None]] = None) -> Optional[StopNoticeWatch]:
    """Start watching this worker's world, or None outside an agent's world or without its store."""
    key = notice_key(environ)
    if key is None:
        return None
    try:
        store = open_store(environ)
    except Exception:
        return None
    return StopNoticeWatch(store, key, on_notice or exit_for_stopped_peer(node_name)).start()
