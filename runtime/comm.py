"""The process layout of a run: which ranks form which node, and their groups.

A *node* (one site) has one or more ranks (one per GPU); the ranks of a node
train together with DDP. Each node's leader (local rank 0) takes part in the
outer sync over the WAN and shares the result inside its node. The outer-sync
backends are in runtime/sync/.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Optional

import torch
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

    @property
    def is_leader(self) -> bool:
        return self.local_rank == 0

    @property
    def is_coordinator(self) -> bool:
        """Rank 0 writes the run's shared logs and the checkpoint pointer."""
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        return len(self.leader_ranks)


def init_process_group(timeout_s: float, use_cuda: bool) -> None:
    """env:// rendezvous (torchrun or the local launcher set RANK, WORLD_SIZE, MASTER_*)."""
    backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


def build_topology(node_name: str, config_node_names: list[str]) -> Topology:
    """Agree on which ranks form which node, and create the node and leader groups.

    Ranks are grouped by the node name each one reports (``--node-name`` / GEODILOCO_NODE);
    nodes are ordered as in the config, so node indices match on every site.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    reports: list = [None] * world_size
    dist.all_gather_object(reports, node_name)
    missing = sorted(set(config_node_names) - set(reports))
    unknown = sorted(set(reports) - set(config_node_names))
    if unknown or missing:
        raise RuntimeError(f"nodes joined {sorted(set(reports))} but the config lists {config_node_names}; "
                           f"missing: {missing or 'none'}, unknown: {unknown or 'none'}. "
                           "Start one launch per config node with --node-name NAME.")
    ranks_by_node = {name: [r for r, reported in enumerate(reports) if reported == name]
                     for name in config_node_names}
    node_group = None
    for name in config_node_names:
        group = dist.new_group(ranks_by_node[name]) if len(ranks_by_node[name]) > 1 else None
        if name == node_name:
            node_group = group
    leader_ranks = [ranks_by_node[name][0] for name in config_node_names]
    leaders_group = None
    if len(leader_ranks) != world_size:
        group = dist.new_group(leader_ranks)
        leaders_group = group if rank in leader_ranks else None
    node_ranks = ranks_by_node[node_name]
    return Topology(rank=rank, world_size=world_size, node_name=node_name,
                    node_index=config_node_names.index(node_name),
                    local_rank=node_ranks.index(rank), local_world_size=len(node_ranks),
                    node_ranks=node_ranks, leader_ranks=leader_ranks,
                    node_group=node_group, leaders_group=leaders_group)


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
