"""Outer sync over torch.distributed: gloo on CPU tensors, nccl on CUDA tensors.

Every rank of every node is in one world. Every rank joins the readiness exchange (tiny);
only each node's leader (local rank 0) sends pseudo-gradients, on a group of the leaders of
its own (so a sync in flight never shares a group with the readiness exchange), then
broadcasts the parameters inside its node. ``diloco.overlap`` decides when a sync runs
(runtime/sync/overlap.py), ``diloco.compression`` what it sends (runtime/sync/wire.py).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

from runtime import checkpoint
from runtime.comm import Topology
from runtime.config import DilocoSection
from runtime.diloco import outer_weights
from runtime.runlog import RunLog
from runtime.sync.overlap import OverlapSchedule, launch_steps, split_fragments
from runtime.sync.protocol import OutOfSync, RoundSync, StartPoint, SyncHandles, SyncOutcome
from runtime.sync.wire import ErrorFeedback, reduce_sum, sent_bytes


def planned_weights(round_sync: RoundSync) -> dict[str, float]:
    """Each node's outer weight from the plan (streaming launches before the round's counts are known)."""
    nodes = round_sync.plan.nodes
    weights = outer_weights(round_sync.weighting, [node.local_steps * node.batch_size for node in nodes],
                            [node.local_steps for node in nodes], [node.batch_size for node in nodes])
    return {node.name: weight for node, weight in zip(nodes, weights)}


def measured_weights(round_sync: RoundSync) -> dict[str, float]:
    """Each present node's outer weight from the round's readiness statistics."""
    stats = round_sync.stats_by_node
    names = list(stats)
    weights = outer_weights(round_sync.weighting, [stats[name]["tokens"] for name in names],
                            [stats[name]["steps"] for name in names], [stats[name]["batch_size"] for name in names])
    return dict(zip(names, weights))


class TorchOuterSync:
    """OuterSync over one torch.distributed world (see the module docstring)."""

    writes_round = True
    logs_own_idle_only = False

    def __init__(self, topology: Topology, diloco: DilocoSection) -> None:
        self.topology = topology
        self.mode = diloco.overlap
        self.codec = diloco.compression
        self.fragment_count = diloco.fragments if diloco.overlap == "streaming" else 1
        self.sync_group = dist.new_group(topology.leader_ranks) if topology.num_nodes > 1 else None
        self.handles: Optional[SyncHandles] = None
        self.schedule: Optional[OverlapSchedule] = None
        self.fragments: list[list[int]] = []
        self._blocked_in_phase_s = 0.0
        self._sent_bytes = 0
        self._launched: set[int] = set()

    # ----- start ---------------------------------------------------------------------------

    def start(self, resume: bool, handles: SyncHandles) -> StartPoint:
        """Agree on run id and first round (the coordinator decides); restore state when resuming."""
        self.handles = handles
        self.fragments = split_fragments([param.numel() for param in handles.params], self.fragment_count)
        if self.topology.is_leader:
            self.schedule = OverlapSchedule(self.mode, handles.params, handles.outer, self.fragments,
                                            self._reduce, run_in_background=self.mode != "none")
        run_dir, topology = handles.run_dir, self.topology
        saved_round = checkpoint.latest_round(run_dir) if topology.is_coordinator else None
        if topology.is_coordinator and saved_round is not None and resume:
            checkpoint.drop_rounds_after(run_dir, saved_round)
        if topology.is_coordinator and saved_round is not None and not resume:
            proposal = {"error": f"{run_dir} already holds a checkpoint of round {saved_round}; "
                                 "pass --resume to continue it, or choose another --run-dir"}
        else:
            proposal = {"run_id": handles.new_run_id(), "resume_round": saved_round if resume else None}
        agreed = self.exchange(proposal)[0]
        if "error" in agreed:
            raise RuntimeError(agreed["error"])
        resume_round = agreed["resume_round"]
        if resume_round is None:
            return StartPoint(agreed["run_id"], 0)
        run_id, pending = handles.load_checkpoint(resume_round)
        if topology.is_coordinator:
            log = RunLog(run_dir)
            log.drop_rounds_from("idle.jsonl", resume_round)
            log.drop_rounds_from("metrics.jsonl", resume_round + 1)
            log.drop_rounds_from("plan.jsonl", resume_round + 1)
        return StartPoint(run_id, resume_round + 1, pending)

    # ----- the round -----------------------------------------------------------------------

    def begin_round(self, round_idx: int) -> Optional[list[str]]:
        self._launched = set()
        return None

    def before_step(self, step_idx: int, local_steps: int, round_sync: RoundSync) -> None:
        """Streaming: land the previous fragment and launch the next at their points of the round."""
        if self.mode != "streaming":
            return
        points = launch_steps(local_steps, len(self.fragments))
        for fragment, point in enumerate(points):
            if point != step_idx:
                continue
            if fragment > 0:
                self._blocked_in_phase_s += self._land(fragment - 1)
            self._launch(fragment, planned_weights(round_sync))

    def outer_step(self, round_sync: RoundSync) -> SyncOutcome:
        if self.mode == "none":
            self._launch(0, measured_weights(round_sync))
            self._land(0)
        elif self.mode == "delayed":
            self._land(0)
            self._launch(0, measured_weights(round_sync))
            if round_sync.last_round:
                self._land(0)
        else:
            weights = planned_weights(round_sync)
            for fragment in range(len(self.fragments)):
                if fragment not in self._launched:
                    self._launch(fragment, weights)
                self._land(fragment)
            if round_sync.last_round:  # what moved since each launch, averaged in (no momentum kick)
                for fragment in range(len(self.fragments)):
                    self._launch(fragment, weights)
                    self._land(fragment, outer_step=False)
        return self._outcome(round_sync)

    def _outcome(self, round_sync: RoundSync) -> SyncOutcome:
        intervals = self.schedule.take_landed() if self.schedule is not None else []
        outcome = SyncOutcome(stats_by_node=round_sync.stats_by_node, sync_intervals=intervals,
                              blocked_in_phase_s=self._blocked_in_phase_s, sent_bytes=self._sent_bytes)
        self._blocked_in_phase_s, self._sent_bytes = 0.0, 0
        return outcome

    def _launch(self, fragment: int, weights: dict[str, float]) -> None:
        self._launched.add(fragment)
        if self.schedule is None:
            return
        self.schedule.launch(fragment, weights[self.topology.node_name])
        numel = sum(self.handles.params[index].numel() for index in self.fragments[fragment])
        self._sent_bytes += sent_bytes(self.codec, numel, self.topology.num_nodes)

    def _land(self, fragment: int, outer_step: bool = True) -> float:
        """Land ``fragment`` on the leader and share its parameters in the node; seconds waited."""
        blocked_s = self.schedule.land(fragment, outer_step) if self.schedule is not None else 0.0
        self.broadcast_in_node([self.handles.params[index].data for index in self.fragments[fragment]])
        return blocked_s

    def _reduce(self, contribution: torch.Tensor, feedback: ErrorFeedback) -> torch.Tensor:
        return reduce_sum(contribution, self.codec, feedback, self.sync_group, self.topology.num_nodes)

    def end_round(self, round_idx: int, run_id: str) -> None:
        """Nothing to share: every node of a torch world took part in the sync."""

    def recover(self, error: OutOfSync) -> StartPoint:
        raise error

    def finish(self, run_id: str, last_round: int) -> None:
        """The last round's outer step drained every sync; nothing is left in flight."""

    # ----- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict:
        return self.schedule.state_dict() if self.schedule is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.schedule is not None:
            self.schedule.load_state_dict(state)

    # ----- in-node and world helpers -------------------------------------------------------

    def exchange(self, stats: Any) -> list[Any]:
        gathered: list = [None] * self.topology.world_size
        dist.all_gather_object(gathered, stats)
        return gathered

    def broadcast_in_node(self, tensors: list[torch.Tensor]) -> None:
        if self.topology.node_group is None:
            return
        for tensor in tensors:
            dist.broadcast(tensor, src=self.topology.node_ranks[0], group=self.topology.node_group)

    def share_in_node(self, value: Any) -> Any:
        if self.topology.node_group is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=self.topology.node_ranks[0], group=self.topology.node_group)
        return box[0]

    def barrier(self) -> None:
        dist.barrier()

    def close(self) -> None:
        if self.schedule is not None:
            self.schedule.close()
        if dist.is_initialized():
            dist.destroy_process_group()
