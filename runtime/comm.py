"""The process layout of a run: which ranks form which node, and their groups.

A *node* (one site) has one or more ranks (one per GPU); the ranks of a node
train together with DDP. Each node's leader (local rank 0) takes part in the
outer sync over the WAN and shares the result inside its node. The outer-sync
backends are in runtime/sync/.
"""
from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as dist

from geodiloco.common.schema import ConfigError
from geodiloco.runtime.auth import SECRET_ENV, AuthError, derived_id, verify_world
from geodiloco.runtime.plain_collectives import all_gather_values
from geodiloco.runtime.store_socket import inherited_listener
from geodiloco.runtime.mig_devices import cuda_backend


@dataclass
class Topology:
    """Where this process sits: global rank, its node and its place inside the node."""

    rank: int
    world_size: int
    node_name: str
    node_index: int
    local_rank: int
    local_world_size: int
    node_ranks: list[int]
    leader_ranks: list[int]
    node_group: Optional[Any] = None
    leaders_group: Optional[Any] = None
    present_names: list[str] = field(default_factory=list)
    config_node_names: list[str] = field(default_factory=list)
    secret: Optional[bytes] = field(default=None, repr=False)
    """The run's shared secret (runtime/auth.py); None in a one-node run without one."""

    @property
    def is_leader(self) -> bool:
        return self.local_rank == 0

    @property
    def is_coordinator(self) -> bool:
        """Rank 0 writes the run's shared logs and the checkpoint pointer."""
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        """Nodes present in this world (a failed site is absent until it rejoins)."""
        return len(self.leader_ranks)

    @property
    def all_present(self) -> bool:
        return len(self.present_names) == len(self.config_node_names)


def init_process_group(timeout_s: float, use_cuda: bool, secret: Optional[bytes] = None) -> None:
    """Form the world, then have every rank prove the run's secret (runtime/auth.py).

    Under torchrun the agent's store is used (env://; the rendezvous id is derived from the
    secret). Otherwise (``geodiloco run --no-elastic``, RANK/WORLD_SIZE/MASTER_* set by hand) rank 0
    serves the store on MASTER_ADDR only, and every key lives under a prefix derived from the
    secret, so a process without it waits in a world of its own until its timeout.
    """
    backend = f"cpu:gloo,cuda:{cuda_backend()}" if use_cuda else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend=backend, timeout=timeout)
    else:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        served = world_store(rank, timeout) if rank == 0 else None  # a port another process holds is its own error
        try:  # another rank waits up to the timeout for rank 0's store to open: part of forming the world
            store = dist.PrefixStore(f"geodiloco/{derived_id(secret, 'store', 'world')}/",
                                     served if served is not None else world_store(rank, timeout))
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        except RuntimeError as err:  # DistStoreError / DistNetworkError on a timeout, DistError when the store went away
            cause = str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__
            raise AuthError(f"no world formed within comm.timeout_s ({timeout_s:g} s): the other ranks did not "
                            f"arrive, or they hold a different shared secret ({SECRET_ENV}) ({cause})") from None
    verify_world(secret)


def world_store(rank: int, timeout: timedelta) -> Any:
    """The TCP store at MASTER_ADDR:MASTER_PORT: rank 0 serves it, on the socket it inherited from
    `geodiloco run` (runtime/store_socket.py), else bound to MASTER_ADDR alone (all interfaces only
    if that address is not on this machine, with a notice)."""
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank != 0:
        return dist.TCPStore(host, port, is_master=False, timeout=timeout)
    listener = inherited_listener() or store_listener(host, port)
    return dist.TCPStore(host, port, is_master=True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=listener.detach(), use_libuv=True)


def store_listener(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or on every interface where host is not this machine's."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        bind_store_port(listener, host, port)
    except OSError as err:
        if err.errno != errno.EADDRNOTAVAIL:
            raise
        print(f"[geodiloco] MASTER_ADDR {host} is not an address of this machine; the store listens on all "
              "interfaces (runs are still authenticated by their secret)", flush=True)
        bind_store_port(listener, "", port)
    listener.listen(128)
    return listener


def bind_store_port(listener: socket.socket, host: str, port: int) -> None:
    """Bind, naming a port that another process holds (closing the socket on any failure)."""
    try:
        listener.bind((host, port))
    except OSError as err:
        if err.errno != errno.EADDRNOTAVAIL:
            listener.close()
        if err.errno == errno.EADDRINUSE:
            raise RuntimeError(f"rank 0 cannot serve the world's store on port {port} (MASTER_PORT): another "
                               "process holds it; start the run with another port (torchrun --master-port)") from None
        raise


def present_nodes(reports: list[str], config_node_names: list[str], min_nodes: int) -> dict[str, list[int]]:
    """Ranks of each node present in the world (config order), from the node name each rank reported.

    Any subset of the config's nodes with at least ``min_nodes`` nodes may form a world (a site
    that failed is simply absent); names outside the config, or a world too small, are errors.
    """
    unknown = sorted(set(reports) - set(config_node_names))
    if unknown:
        raise RuntimeError(f"ranks reported nodes {unknown} that the config does not list "
                           f"({', '.join(config_node_names)}); start each site with --node-name NAME "
                           "from the config's nodes:")
    ranks_by_node = {name: [rank for rank, reported in enumerate(reports) if reported == name]
                     for name in config_node_names if name in reports}
    if len(ranks_by_node) < min_nodes:
        missing = [name for name in config_node_names if name not in ranks_by_node]
        raise RuntimeError(f"only {len(ranks_by_node)} of the config's nodes joined ({', '.join(ranks_by_node)}); "
                           f"comm.min_nodes is {min_nodes}. Missing: {', '.join(missing)}. Start those sites, "
                           "or lower comm.min_nodes")
    return ranks_by_node


def settle_double_claims(claims: list[list], node_name: str, config_node_names: list[str]) -> None:
    """Refuse a node name that two sites started: every rank's (node name, its torchrun agent's GROUP_RANK)
    are ``claims``; ranks of two agents under one name would otherwise be merged into one node and train it
    with DDP across the WAN, while the node the second site meant never trains. Both claimants stop (which
    one was meant cannot be told); the other sites, when their agents will restart them, form a world
    without that node (``OtherSitesLeave``), else stop too."""
    agents_by_node: dict[str, set] = {}
    for reported, agent in claims:
        if agent is not None:
            agents_by_node.setdefault(reported, set()).add(agent)
    doubled = {name: sorted(agents, key=str) for name, agents in agents_by_node.items() if len(agents) > 1}
    if not doubled:
        return
    from geodiloco.runtime.config_agreement import OtherSitesLeave
    from geodiloco.runtime.recovery import restarts_left
    told = "; ".join(f"node {name} was started by {len(agents)} sites (torchrun agents {', '.join(map(str, agents))})"
                     for name, agents in doubled.items())
    fix = (f"each site needs its own --node-name from the config's nodes ({', '.join(config_node_names)})")
    if node_name in doubled:
        raise ConfigError(f"{told}: {fix}; this site stops: start it again with the right name")
    if restarts_left():
        raise OtherSitesLeave(f"{told}: {fix}; those sites stop, and the run goes on without them")
    raise ConfigError(f"{told}: {fix}")


def build_topology(node_name: str, config_node_names: list[str], min_nodes: Optional[int] = None,
                   secret: Optional[bytes] = None) -> Topology:
    """Agree on which ranks form which node, and create the node and leader groups.

    Ranks are grouped by the node name each one reports (``--node-name`` / GEODILOCO_NODE);
    nodes are ordered as in the config, so node indices match on every site. ``min_nodes``:
    the fewest nodes that may train (None = every config node must be present).
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    claims = all_gather_values([node_name, os.environ.get("GROUP_RANK")])
    settle_double_claims(claims, node_name, config_node_names)
    reports = [reported for reported, _ in claims]
    ranks_by_node = present_nodes(reports, config_node_names,
                                  len(config_node_names) if min_nodes is None else min_nodes)
    node_group = None
    for name, ranks in ranks_by_node.items():
        group = dist.new_group(ranks) if len(ranks) > 1 else None
        if name == node_name:
            node_group = group
    leader_ranks = [ranks[0] for ranks in ranks_by_node.values()]
    leaders_group = None
    if len(leader_ranks) != world_size:
        group = dist.new_group(leader_ranks)
        leaders_group = group if rank in leader_ranks else None
    node_ranks = ranks_by_node[node_name]
    return Topology(rank=rank, world_size=world_size, node_name=node_name,
                    node_index=config_node_names.index(node_name),
                    local_rank=node_ranks.index(rank), local_world_size=len(node_ranks),
                    node_ranks=node_ranks, leader_ranks=leader_ranks,
                    node_group=node_group, leaders_group=leaders_group,
                    present_names=list(ranks_by_node), config_node_names=list(config_node_names), secret=secret)


@dataclass(frozen=True)
class SiteStart:
    """What a site brings to the start agreement beside its settings and GPUs.

    ``trained_in_job``: it was training in this elastic job before this world formed. ``may_leave_out``: its
    elastic agent will restart its workers (so a world can form without a site that leaves).
    ``resume_refusal``: why its saved config cannot be resumed with the settings given (``--resume`` with a
    setting a checkpoint was written for), else None."""

    trained_in_job: bool = False
    may_leave_out: bool = False
    resume_refusal: Optional[str] = None


def agree_at_start(topology: Topology, config_view: dict, own_gpus: list[str],
                   site: SiteStart = SiteStart()) -> list[str]:
    """One gather at start-up, so that the sites train and plan alike:

    - a ``--resume`` that some site's saved config refuses stops every site with that site's ConfigError
      (one site alone leaving would leave the others waiting for a world);
    - every site must share ``config_view`` (``runtime.config_agreement``); on a difference every rank
      raises the same ConfigError, naming the settings. With ``site.may_leave_out`` (an elastic agent that
      will restart this site's workers) the run's side is kept when one can be told (the sites that were
      training in this job, or a majority): the others' ranks raise ConfigError and leave, the run's
      raise ``OtherSitesLeave`` and form a world without them;
    - every node plans each GPU from the row the node that has it plans it with (a datasheet row, that
      site's user row, or a probe of its unknown GPU), so the first round's plan is the same everywhere.

    Returns what changed in this node's GPU rows, one line per GPU name."""
    from geodiloco.predictor.unknown_gpus import adopt_rows, own_rows
    from geodiloco.runtime.config_agreement import check_all_same, leave_or_go_on
    gathered = all_gather_values({"node": topology.node_name, "view": config_view, "rows": own_rows(own_gpus),
                                  "trained": site.trained_in_job, "resume_refusal": site.resume_refusal})
    order = {name: index for index, name in enumerate(topology.config_node_names)}
    gathered.sort(key=lambda item: order.get(item["node"], len(order)))
    refusal = next((item for item in gathered if item.get("resume_refusal")), None)
    if refusal is not None:
        raise ConfigError(f"node {refusal['node']}: {refusal['resume_refusal']}")
    views = [(item["node"], item["view"]) for item in gathered]
    if site.may_leave_out:
        leave_or_go_on(views, topology.node_name, {item["node"] for item in gathered if item.get("trained")})
    check_all_same(views)
    return adopt_rows([(item["node"], item["rows"]) for item in gathered])


def node_name_from_env(cli_node: Optional[str], config_node_names: list[str]) -> str:
    """``--node-name`` wins, then GEODILOCO_NODE, then torchrun's GROUP_RANK as a config index."""
    name = cli_node or os.environ.get("GEODILOCO_NODE")
    if name:
        if name not in config_node_names:
            source = "--node-name" if cli_node else "GEODILOCO_NODE"
            raise ConfigError(f"{source} {name!r} is not one of the config's nodes ({', '.join(config_node_names)})")
        return name
    group_rank = os.environ.get("GROUP_RANK")
    if group_rank is not None and int(group_rank) < len(config_node_names):
        return config_node_names[int(group_rank)]
    raise ConfigError("cannot tell which config node this process is: pass --node-name NAME "
                      f"(one of {', '.join(config_node_names)})")


def check_world_env(environ=os.environ) -> None:
    """A worker joins a world that torchrun (or ``geodiloco run``) describes in its environment; without it
    torch.distributed would fail with "environment variable RANK expected"."""
    missing = [key for key in ("RANK", "WORLD_SIZE") if key not in environ]
    if missing:
        raise ConfigError(f"{' and '.join(missing)} not set: this command trains one node's worker inside a world; "
                          "start it under torchrun (scripts/launch_site.sh on each site), or run every node on "
                          "this machine with `geodiloco run`")
