"""Outer-sync backends behind one seam (``protocol.OuterSync``): torch.distributed and hivemind."""
from __future__ import annotations

from typing import Optional

from geodiloco.runtime.comm import Topology
from geodiloco.runtime.config import RunConfig
from geodiloco.runtime.sync.protocol import (CannotStart, OuterSync, OutOfSync, RoundSync, StartPoint, SyncHandles,
                                              SyncOutcome, TooFewToGoOn)

__all__ = ["CannotStart", "OuterSync", "OutOfSync", "RoundSync", "StartPoint", "SyncHandles", "SyncOutcome",
           "TooFewToGoOn", "build_outer_sync"]


def transfer_timeout_s(config: RunConfig, planned_sync_s: float) -> float:
    """How long one outer transfer may take before its peers are given up on (seconds): a multiple
    of the planned sync time (bytes over the ``wan:`` bandwidths), never below the floor."""
    comm = config.comm
    return max(comm.transfer_min_timeout_s, comm.transfer_timeout_factor * planned_sync_s)


def build_outer_sync(config: RunConfig, topology: Topology, num_params: int, planned_sync_s: float = 0.0) -> OuterSync:
    """The configured backend (hivemind is imported only when chosen). ``planned_sync_s``: the
    planner's time for one whole-model sync (sizes the torch backend's transfer timeout)."""
    if config.diloco.mode == "async":
        from geodiloco.runtime.sync.async_backend import AsyncOuterSync
        return AsyncOuterSync(topology, config.diloco, config.optim.outer, config.comm.timeout_s,
                              config.checkpoint.keep, config.comm.elastic)
    if config.comm.backend != "hivemind":
        from geodiloco.runtime.sync.torch_backend import TorchOuterSync
        return TorchOuterSync(topology, config.diloco, config.comm.elastic,
                              transfer_timeout_s(config, planned_sync_s), sync_threads=config.comm.sync_threads)
    from geodiloco.runtime.sync.hivemind_backend import HivemindOuterSync
    return HivemindOuterSync(topology, config.comm.hivemind, config.run.name, [node.name for node in config.nodes],
                             num_params, config.diloco.compression, config.comm.init_timeout_s,
                             config.comm.min_nodes, sync_threads=config.comm.sync_threads,
                             total_rounds=config.diloco.rounds)


def join_world(config: RunConfig, node_name: str, use_cuda: bool, secret: Optional[bytes] = None) -> Topology:
    """This process's place in the run: a torch.distributed world of every rank (torch), or only
    its own node's ranks (hivemind: nodes meet through the DHT)."""
    config_names = [node.name for node in config.nodes]
    if config.comm.backend == "hivemind":
        from geodiloco.runtime.sync.hivemind_backend import node_topology
        return node_topology(node_name, config_names, config.comm.timeout_s, use_cuda, secret)
    from geodiloco.runtime.comm import build_topology, check_world_env, init_process_group
    check_world_env()
    init_process_group(config.comm.timeout_s, use_cuda, secret)
    return build_topology(node_name, config_names, config.comm.min_nodes, secret)
