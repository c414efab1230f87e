"""The world's store port, held from the moment `geodiloco run` chooses it until rank 0 serves on it.

A port found free (bind to port 0, close) is free only at that moment: by the time the first node
has imported torch and binds it, another process may hold it (the gloo connections of other runs
on the machine take ports from the same range). So the launcher keeps a listening socket open and
the first node inherits it (``pass_fds``, its number in GEODILOCO_STORE_FD); rank 0 serves the
TCP store on that very socket. Peers that connect before it serves wait in the socket's backlog.
"""
from __future__ import annotations

import contextlib
import os
import socket
from typing import Iterator, Optional

STORE_FD_ENV = "GEODILOCO_STORE_FD"


@contextlib.contextmanager
def reserve_port(host: str) -> Iterator[socket.socket]:
    """A listening socket on a free port of ``host``, closed on exit (the child keeps its own copy)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((host, 0))
        listener.listen(128)
        yield listener
    finally:
        listener.close()


def inherited_listener() -> Optional[socket.socket]:
    """The listening socket this process inherited for the store, once (the variable is removed)."""
    fd = os.environ.pop(STORE_FD_ENV, None)
    return socket.socket(fileno=int(fd)) if fd else None
