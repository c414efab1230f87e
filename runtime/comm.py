"""The process layout of a run: which ranks form which node, and their groups.

A *node* (one site) has one or more ranks (one per GPU); the ranks of a node
train together with DDP. Each node's leader (local rank 0) takes part in the
outer sync over the WAN and shares the result inside its node. The outer-sync
backends are in runtime/sync/.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Optional

import torch.distributed as dist


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


def init_process_group(timeout_s: float, use_cuda: bool) -> None:
    """env:// rendezvous (torchrun or the local launcher set RANK, WORLD_SIZE, MASTER_*)."""
    backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


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


def build_topology(node_name: str, config_node_names: list[str], min_nodes: Optional[int] = None) -> Topology:
    """Agree on which ranks form which node, and create the node and leader groups.

    Ranks are grouped by the node name each one reports (``--node-name`` / GEODILOCO_NODE);
    nodes are ordered as in the config, so node indices match on every site. ``min_nodes``:
    the fewest nodes that may train (None = every config node must be present).
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    reports: list = [None] * world_size
    dist.all_gather_object(reports, node_name)
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
                    present_names=list(ranks_by_node), config_node_names=list(config_node_names))


def node_name_from_env(cli_node: Optional[str], config_node_names: list[str]) -> str:
    """``--node-name`` wins, then GEODILOCO_NODE, then torchrun's GROUP_RANK as a config index."""
    name = cli_node or os.environ.get("GEODILOCO_NODE")
    if name:
        return name
    group_rank = os.environ.get("GROUP_RANK")
    if group_rank is not None and int(group_rank) < len(config_node_names):
        return config_node_names[int(group_rank)]
    raise RuntimeError("cannot tell which config node this process is: pass --node-name NAME "
                       f"(one of {', '.join(config_node_names)})")
