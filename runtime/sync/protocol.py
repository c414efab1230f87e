"""The seam between the round loop and the outer-sync backends.

The round loop (runtime/train.py) drives any backend through ``OuterSync`` and never asks
which one it has: start or resume the run, plan with the nodes present, give the backend a
hook before every inner step (streaming sync), exchange readiness, take the outer step,
finish the round, recover when the node fell behind, leave together. Backends get the node's
state through ``SyncHandles`` (tensors and callables), never the trainer object.

Backends: ``runtime/sync/torch_backend.py`` (torch.distributed: gloo or nccl, with overlap and
compression) and ``runtime/sync/hivemind_backend.py`` (DHT and decentralized averaging).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Protocol

import torch

from geodiloco.balancer.plan import Plan


class OutOfSync(RuntimeError):
    """This node's peers finished a round without it; it must reload the global state to go on."""


class CannotStart(RuntimeError):
    """The run cannot start at this node, for a reason its message states with the fix (fewer than
    ``comm.min_nodes`` sites came up; a checkpoint in the run directory without ``--resume``)."""


class TooFewNodes(RuntimeError):
    """Founding a hivemind run gave up: fewer than ``comm.min_nodes`` nodes came up in time."""


class TooFewToGoOn(RuntimeError):
    """Fewer than ``comm.min_nodes`` nodes stayed live and none (re)joined in time: this node stops
    between rounds, its last complete checkpoint kept for ``--resume``."""


@dataclass
class SyncHandles:
    """What a backend may read and change on its node.

    ``params``: the node's local model parameters (changed in place by outer steps).
    ``outer``: the global copy and outer optimizer (``runtime.diloco.OuterState``; the node's
    leader only, else None). ``export_state``/``import_state``: the global state a joining peer
    needs, as (metadata, tensors). ``load_checkpoint``: restore round r, returns (run id, the
    node's pending idle record). ``restore(global_state, node_state, keep_in_flight)``: the same from
states in hand (node_state None: fresh inner state; keep_in_flight False: drop syncs in flight,
the local model starts from the global one). ``checksum``: sum of |parameters|. ``new_run_id``: a fresh id.
``gpu_rows``: the rows this node plans its own GPUs with (``predictor.unknown_gpus.own_rows``), for
backends that agree on them at the start (hivemind's founding) or pass them on later (its heartbeats).
    """

    params: list[torch.Tensor]
    outer: Any
    export_state: Callable[[int, str], tuple[dict, list[torch.Tensor]]]
    import_state: Callable[[dict, list[torch.Tensor]], None]
    load_checkpoint: Callable[[int], tuple[str, Optional[dict]]]
    restore: Callable[[dict, Optional[dict], bool], tuple[str, Optional[dict]]]
    checksum: Callable[[], float]
    new_run_id: Callable[[], str]
    run_dir: Path
    gpu_rows: dict = field(default_factory=dict)
    config_view: dict = field(default_factory=dict)
    """The settings every site must share (``runtime.config_agreement.shared_view``)."""
    adopt_gpu_rows: Optional[Callable[[list[tuple[str, dict]]], None]] = None
    """Plan from the rows of nodes that joined later, (node, rows) each, after the rows already adopted
    (hivemind: a joiner's rows reach its peers in its heartbeat)."""
    save_final_global: Optional[Callable[[int, str, list[str]], None]] = None
    """``(round, run_id, members)``: write the global model as it is now as that round's global checkpoint,
    synchronously (async mode: the other nodes' last updates land after the host saved its own last round)."""


@dataclass
class RoundSync:
    """What the outer step of a round works with.

    ``stats_by_node``: the present nodes' readiness statistics (config order), ``weighting``:
    uniform | tokens | normalized, ``last_round``: drain every sync still in flight."""

    round: int
    plan: Plan
    stats_by_node: dict[str, dict]
    weighting: str
    last_round: bool = False


@dataclass
class SyncOutcome:
    """What the outer step did on this node.

    ``stats_by_node``: the nodes whose pseudo-gradients the applied average holds.
    ``sync_intervals``: (start, end) unix seconds of every sync that finished and was applied
    during this round (for the idle tracker's hidden time and the planner's network model).
    ``blocked_in_phase_s``: seconds the local phase waited on a sync (streaming), counted as
    exposed sync, not compute. ``sent_bytes``: bytes this node put on the wire this round.
    ``waited_s``: seconds of the outer step spent waiting on peers rather than on the wire (async:
    queued behind other nodes' updates at the host), counted as waiting. ``staleness``: global
    versions applied between this node's pull and its update (async; None in sync mode).
    ``reported``: every node-phase statistics this outcome brings (async: a node may report several
    phases between two of this node's pulls); None = the values of ``stats_by_node``."""

    stats_by_node: dict[str, dict]
    sync_intervals: list[tuple[float, float]] = field(default_factory=list)
    blocked_in_phase_s: float = 0.0
    sent_bytes: int = 0
    waited_s: float = 0.0
    staleness: Optional[int] = None
    reported: Optional[list[dict]] = None

    def reported_stats(self) -> list[dict]:
        return list(self.stats_by_node.values()) if self.reported is None else list(self.reported)

    @property
    def sync_s(self) -> Optional[float]:
        """Mean duration of the syncs that finished this round (seconds), None when none did."""
        if not self.sync_intervals:
            return None
        return sum(end - start for start, end in self.sync_intervals) / len(self.sync_intervals)


@dataclass
class StartPoint:
    """Where this node starts: the run id, its first round, its pending idle record (resume)."""

    run_id: str
    first_round: int
    pending_record: Optional[dict] = None
    lost_since: Optional[float] = None
    """Unix time the work lost to a restart began (end of the round resumed from), else None."""
    unlogged_reports: list[dict] = field(default_factory=list)
    """Node-phase reports the resumed state holds that the run's log lacks (async: phases the host took in but had
    not logged when it stopped); the coordinator logs them before its first round."""
    gpu_rows_by_node: Optional[list[tuple[str, dict]]] = None
    """(node, its GPU rows) of the nodes that started the run together, config order, when the backend
    agreed on them only now (hivemind's founding): the node then plans from these rows."""


class OuterSync(Protocol):
    """What the round loop needs from an outer-sync backend."""

    writes_round: bool
    """Whether this node's coordinator writes the round's shared logs (plan, metrics, checkpoint)."""

    writes_global_file: bool
    """Whether this node's leader writes the round's global checkpoint into its run directory (where it is
    not there yet): ``writes_round``, and under hivemind also a node whose run directory the round's writer
    does not share (a directory per site), so that every site can resume, prune and export on its own."""

    global_withheld: Optional[str]
    """Why this node, though it writes the round, must not write or commit the round's global checkpoint: its
    parameters are not the round's full average (hivemind: a partial all-reduce). None: write it as usual."""

    logs_own_idle_only: bool
    """True when every node logs its own idle rows (no node sees the others' reliably)."""

    barrier_free: bool
    """True when nodes do not meet at a round barrier (``diloco.mode: async``): each node's outcome holds
    its own phase and whatever the others reported since, and each node decides its own last phase."""

    members_wait_s: float
    """Seconds the last ``begin_round`` waited for ``comm.min_nodes`` live nodes (hivemind; 0 elsewhere):
    idle time of the round, not compute."""

    def start(self, resume: bool, handles: SyncHandles) -> StartPoint:
        """Found, join or resume the run; the model holds the starting state afterwards."""
        ...

    def begin_round(self, round_idx: int) -> Optional[list[str]]:
        """Announce the round; return the nodes to plan it for (None = all config nodes)."""
        ...

    def before_step(self, step_idx: int, local_steps: int, round_sync: RoundSync) -> None:
        """Called on every rank before inner step ``step_idx`` of ``local_steps`` (streaming syncs)."""
        ...

    def exchange(self, stats: Any) -> list[Any]:
        """Block until the participating ranks are ready; return their ``stats``. Its duration on a
        node is that node's wait for its peers."""
        ...

    def outer_step(self, round_sync: RoundSync) -> SyncOutcome:
        """Pseudo-gradients in, outer step applied (now or, with overlap, when the sync lands),
        the node's ranks hold the resulting parameters."""
        ...

    def end_round(self, round_idx: int, run_id: str) -> None:
        """After the outer step and the measurements: share or repair state (hivemind)."""
        ...

    def recover(self, error: OutOfSync) -> StartPoint:
        """Reload the peers' state after ``error``; returns where to go on."""
        ...

    def finish(self, run_id: str, last_round: int) -> None:
        """Leave together; every node holds the final global parameters afterwards."""
        ...

    def state_dict(self) -> dict:
        """The backend's part of this node's checkpoint (syncs in flight, error feedback)."""
        ...

    def load_state_dict(self, state: dict) -> None:
        ...

    def global_state_dict(self) -> dict:
        """The backend's part of the global checkpoint (async: version and outer-optimizer buffer)."""
        ...

    def load_global_state_dict(self, state: dict) -> None:
        ...

    def state_lock(self) -> Any:
        """A context manager held while the global state is copied into a checkpoint."""
        ...

    def broadcast_in_node(self, tensors: list[torch.Tensor]) -> None:
        """Leader -> the other ranks of its node."""
        ...

    def share_in_node(self, value: Any) -> Any:
        """The leader's Python ``value`` on every rank of its node."""
        ...

    def barrier(self) -> None:
        ...

    def leave(self) -> None:
        """The run ended normally on this node: stop what talks to the peers (heartbeats) so that no
        site's last message meets a store that has already gone away."""
        ...

    def close(self) -> None:
        ...
