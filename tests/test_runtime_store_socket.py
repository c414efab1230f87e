"""The world's store port is held from the launcher's choice until rank 0 serves on it, and a port
some other process holds is named as such (not as an address of another machine)."""
import os
import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from geodiloco.runtime.comm import world_store
from geodiloco.runtime.store_socket import STORE_FD_ENV, reserve_port


def test_rank_0_serves_the_store_on_the_socket_it_inherited(monkeypatch):
    with reserve_port("127.0.0.1") as reserved:
        port = reserved.getsockname()[1]
        with pytest.raises(OSError):  # held: nobody else can take the port meanwhile
            socket.create_server(("127.0.0.1", port))
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(port))
        monkeypatch.setenv(STORE_FD_ENV, str(os.dup(reserved.fileno())))  # what pass_fds hands the child
        store = world_store(0, timedelta(seconds=20))
        assert STORE_FD_ENV not in os.environ, "used once"
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=20))
        client.set("greeting", "from rank 1")
        assert store.get("greeting") == b"from rank 1"


def test_a_port_another_process_holds_is_named_with_the_fix(monkeypatch, capsys):
    holder = socket.create_server(("127.0.0.1", 0))
    try:
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(holder.getsockname()[1]))
        monkeypatch.delenv(STORE_FD_ENV, raising=False)
        with pytest.raises(RuntimeError, match=r"cannot serve the world's store on port \d+ \(MASTER_PORT\): "
                                               r"another process holds it; .*--master-port"):
            world_store(0, timedelta(seconds=5))
    finally:
        holder.close()
    assert "is not an address of this machine" not in capsys.readouterr().out
