"""A worker that stops before its world forms tells that world's other workers through the rendezvous store."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from geodiloco.runtime.agent import tell_workers_the_rendezvous
from geodiloco.runtime.launch import free_port
from geodiloco.runtime.stop_notice import (RENDEZVOUS_ENDPOINT_ENV, RUN_ID_ENV, notice_key, open_rendezvous_store,
                                           post_stop_notice,
                                           watch_for_stop_notices)
from torch.distributed.run import get_args_parser


@pytest.fixture
def rendezvous_store():
    """A real TCP store on loopback, as `geodiloco rendezvous` serves one."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield store, f"127.0.0.1:{port}"


def world_env(endpoint: str, master_port: str = "41234") -> dict[str, str]:
    return {RENDEZVOUS_ENDPOINT_ENV: endpoint, RUN_ID_ENV: "run7", "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": master_port}


def test_a_peers_notice_reaches_the_workers_of_its_world_and_no_other(rendezvous_store):
    _, endpoint = rendezvous_store
    heard, other_world_heard = [], []
    got_it = threading.Event()
    watch = watch_for_stop_notices("a", world_env(endpoint), on_notice=lambda text: (heard.append(text), got_it.set()))
    other = watch_for_stop_notices("c", world_env(endpoint, master_port="41235"), on_notice=other_world_heard.append)
    try:
        time.sleep(1.5)
        assert heard == []  # nothing posted yet
        assert post_stop_notice("node b: optim.outer.lr must be > 0\n", world_env(endpoint)) is True
        assert got_it.wait(10)
        time.sleep(1.5)
    finally:
        watch.stop()
        other.stop()
    assert heard == ["node b: optim.outer.lr must be > 0"]
    assert other_world_heard == []  # another world (another store port) is not told


def test_a_stopped_watch_ignores_later_notices(rendezvous_store):
    _, endpoint = rendezvous_store
    heard = []
    watch = watch_for_stop_notices("a", world_env(endpoint), on_notice=heard.append)
    watch.stop()
    post_stop_notice("node b: bad", world_env(endpoint))
    time.sleep(1.5)
    assert heard == []


def test_outside_an_agents_world_nothing_is_posted_or_watched():
    assert notice_key({"MASTER_ADDR": "h", "MASTER_PORT": "1"}) is None  # no rendezvous endpoint from an agent
    assert post_stop_notice("x", {"MASTER_ADDR": "h", "MASTER_PORT": "1"}) is False
    assert watch_for_stop_notices("a", {RENDEZVOUS_ENDPOINT_ENV: "127.0.0.1:1", RUN_ID_ENV: "r"}) is None


def test_an_unreachable_rendezvous_store_costs_a_bounded_wait_and_no_error():
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens

    def open_briefly(environ):
        return open_rendezvous_store(environ, timeout_s=1)
    started = time.monotonic()
    assert post_stop_notice("node b: bad", world_env(endpoint), open_store=open_briefly) is False
    assert watch_for_stop_notices("a", world_env(endpoint), open_store=open_briefly) is None
    assert time.monotonic() - started < 20


def test_the_agent_passes_a_c10d_endpoint_and_run_id_to_its_workers():
    parser = get_args_parser()
    environ: dict[str, str] = {}
    tell_workers_the_rendezvous(parser.parse_args(["--rdzv-backend=c10d", "--rdzv-endpoint=10.1.0.1:29400",
                                                   "--rdzv-id=lab", "train.py"]), environ)
    assert environ == {RENDEZVOUS_ENDPOINT_ENV: "10.1.0.1:29400", RUN_ID_ENV: "lab"}
    environ = {}
    tell_workers_the_rendezvous(parser.parse_args(["--rdzv-backend=static", "train.py"]), environ)
    assert environ == {}
