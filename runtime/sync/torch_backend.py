"""Outer sync over torch.distributed: gloo on CPU tensors, nccl on CUDA tensors.

Every rank of every node is in one world. Every rank joins the readiness exchange (tiny);
only each node's leader (local rank 0) sends pseudo-gradients, on a group of the leaders of
its own (so a sync in flight never shares a group with the readiness exchange), then
broadcasts the parameters inside its node. ``diloco.overlap`` decides when a sync runs
(runtime/sync/overlap.py), ``diloco.compression`` what it sends (runtime/sync/wire.py).
"""
from __future__ import annotations

import contextlib
import uuid
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist

from geodiloco.runtime import checkpoint
from geodiloco.runtime.comm import Topology
from geodiloco.runtime.config import DilocoSection, ElasticSection
from geodiloco.runtime.finite_guard import non_finite_nodes
from geodiloco.runtime.diloco import outer_weights
from geodiloco.runtime.heartbeat import Heartbeat, exit_on_peer_failure, open_store
from geodiloco.runtime.host_threads import choose_leader_threads, intra_op_threads
from geodiloco.runtime.recovery import (ResumePoint, SavedRounds, agent_started, choose_resume_point, elastic_job,
                                        log_membership_event, newest_node_round, saved_rounds)
from geodiloco.runtime.runlog import RunLog
from geodiloco.runtime.plain_collectives import all_gather_values, broadcast_value
from geodiloco.runtime.sync.overlap import OverlapSchedule, launch_steps, split_fragments
from geodiloco.runtime.sync.protocol import CannotStart, OutOfSync, RoundSync, StartPoint, SyncHandles, SyncOutcome
from geodiloco.runtime.sync import start_model
from geodiloco.runtime.sync.wire import ErrorFeedback, reduce_sum, sent_bytes


def weights_of(round_sync: RoundSync, work: dict[str, tuple[int, int, int]]) -> dict[str, float]:
    """Outer weights from each node's (tokens, local steps, batch size). Nodes the readiness exchange
    named non-finite weigh 0 and the others are renormalized (runtime/finite_guard.py)."""
    left_out = set(non_finite_nodes(round_sync.stats_by_node))
    names = [name for name in work if name not in left_out]
    weights = outer_weights(round_sync.weighting, *([work[name][column] for name in names] for column in range(3)))
    return {**{name: 0.0 for name in left_out}, **dict(zip(names, weights))}


def planned_weights(round_sync: RoundSync) -> dict[str, float]:
    """Each node's outer weight from the plan (streaming launches before the round's counts are known)."""
    return weights_of(round_sync, {node.name: (node.local_steps * node.batch_size, node.local_steps, node.batch_size)
                                   for node in round_sync.plan.nodes})


def measured_weights(round_sync: RoundSync) -> dict[str, float]:
    """Each present node's outer weight from the round's readiness statistics."""
    return weights_of(round_sync, {name: (item["tokens"], item["steps"], item["batch_size"])
                                   for name, item in round_sync.stats_by_node.items()})


class TorchOuterSync:
    """OuterSync over one torch.distributed world (see the module docstring)."""

    writes_round = True

    @property
    def writes_global_file(self) -> bool:
        return self.writes_round
    global_withheld: Optional[str] = None  # every node applies the same complete average
    logs_own_idle_only = False
    barrier_free = False
    members_wait_s = 0.0
    global_copy_per_node = True  # every node takes the outer step on its own copy (runtime/sync/start_model.py)
    leader_borrows_threads = True  # the leader lands syncs while its node's ranks wait (``sync_threads``)

    def __init__(self, topology: Topology, diloco: DilocoSection, elastic: Optional[ElasticSection] = None,
                 transfer_timeout_s: Optional[float] = None, sync_threads: Optional[int] = None) -> None:
        self.topology = topology
        self.sync_threads_setting = sync_threads
        self.sync_threads = torch.get_num_threads()
        """Intra-op threads of this rank's sync work while the node's other ranks wait (leader: see ``start``)."""
        self.elastic = elastic
        self.heartbeat: Optional[Heartbeat] = None
        self.mode = diloco.overlap
        self.codec = diloco.compression
        self.fragment_count = diloco.fragments if diloco.overlap == "streaming" else 1
        # the transfer has its own timeout; the readiness exchange keeps the world's (comm.timeout_s)
        self.transfer_timeout_s = transfer_timeout_s
        timeout = timedelta(seconds=transfer_timeout_s) if transfer_timeout_s is not None else None
        self.sync_group = dist.new_group(topology.leader_ranks, timeout=timeout) if topology.num_nodes > 1 else None
        self.handles: Optional[SyncHandles] = None
        self.schedule: Optional[OverlapSchedule] = None
        self.fragments: list[list[int]] = []
        self._blocked_in_phase_s = 0.0
        self._sent_bytes = 0
        self._launched: set[int] = set()

    # ----- start ---------------------------------------------------------------------------

    def start(self, resume: bool, handles: SyncHandles) -> StartPoint:
        """Agree on run id and first round; resume from the newest round every present node can
        restart after (runtime/recovery.py), with the global state sent by a node that holds it.

        Resuming is asked for by ``--resume`` on any site, or happens by itself when the saved
        rounds were written by this same elastic job (torchrun restarted the workers after a
        membership change, or a site came back); only then is the time since the round resumed
        from recorded as lost."""
        self.handles = handles
        self.fragments = split_fragments([param.numel() for param in handles.params], self.fragment_count)
        if self.topology.is_leader and self.leader_borrows_threads:
            self.sync_threads = choose_leader_threads(self.topology.node_name, self.topology.local_world_size,
                                                      self.sync_threads_setting,
                                                      handles.params[0].is_cuda if handles.params else False)
        if self.topology.is_leader:
            self.schedule = OverlapSchedule(self.mode, handles.params, handles.outer, self.fragments,
                                            self._reduce, run_in_background=self.mode != "none")
        run_dir, topology = handles.run_dir, self.topology
        saved_here = saved_rounds(run_dir, topology.node_name) if topology.is_leader else None
        start = None
        if topology.is_leader:  # a digest of the initial model only where no saved round will replace it
            start = asdict(start_model.own_report(topology.node_name, handles.outer.global_params,
                                                  handles.outer.optimizer, fresh=not saved_here.global_members))
        gathered = self.exchange({
            "resume": resume, "run_id": handles.new_run_id(), "generation": uuid.uuid4().hex,
            "saved": asdict(saved_here) if saved_here is not None else None, "start": start})
        self._start_heartbeat(gathered[0]["generation"])
        saved = [SavedRounds(**item["saved"]) for item in gathered if item["saved"] is not None]
        held = sorted({round_idx for report in saved for round_idx in report.global_members})
        asked = any(item["resume"] for item in gathered)
        job = elastic_job()
        restarted = not asked and job is not None and any(job in report.jobs for report in saved)
        holders = [report.node for report in saved if report.global_members]
        if held and not (asked or restarted):
            raise CannotStart(f"the run directory of {'nodes' if len(holders) > 1 else 'node'} {', '.join(holders)} "
                              f"already holds a checkpoint (after round {held[-1] + 1}; this node's is {run_dir}): "
                              "pass --resume to continue it, or choose another --run-dir")
        if asked and not held:
            raise CannotStart(f"--resume: no node's run directory holds a checkpoint (this node's is {run_dir}): "
                              "pass the --run-dir of the run to continue, or leave out --resume to start a new run")
        point = self._resume_point(saved, held) if held else None
        self._agree_on_start(start_model.reports_of([item["start"] for item in gathered]), fresh=point is None)
        if point is None:
            return StartPoint(gathered[0]["run_id"], 0)
        own_saved = next((report for report in saved if report.node == topology.node_name), None)
        return self._resume(point, own_saved, restarted)

    def _resume_point(self, saved: list[SavedRounds], held: list[int]) -> ResumePoint:
        """The round every present node restarts after (runtime/recovery.py); ``held``: the rounds whose global
        state some present node holds."""
        point = choose_resume_point(saved, self.topology.present_names)
        if point is None:
            raise no_round_restarts(self.topology.present_names, held)
        return point

    def _agree_on_start(self, reports: list[start_model.StartReport], fresh: bool) -> None:
        """One initial model on every node, and one way of rounding the outer step
        (runtime/sync/start_model.py)."""
        agreement = start_model.agree(reports, fresh, rounding_matters=self.global_copy_per_node)
        topology, outer = self.topology, self.handles.outer
        if topology.is_leader:
            outer.portable = agreement.portable
            for notice in agreement.notices:
                print(f"[geodiloco] node {topology.node_name}: {notice}", flush=True)
        if not agreement.receivers:
            return
        if topology.is_leader:
            source = topology.leader_ranks[topology.present_names.index(agreement.source)]
            for global_param in outer.global_params:
                dist.broadcast(global_param, src=source, group=self.sync_group)
            outer.load_into(self.handles.params)
            self.schedule.rebase()
        self.broadcast_in_node([param.data for param in self.handles.params])

    def _resume(self, point: ResumePoint, own_report: Optional[SavedRounds], restarted: bool) -> StartPoint:
        topology, handles = self.topology, self.handles
        run_dir = handles.run_dir
        returning = topology.node_name in point.members
        same_members = sorted(point.members) == sorted(topology.present_names)
        node_state = checkpoint.load_node(run_dir, point.round, topology.node_name) if returning else None
        source = topology.leader_ranks[topology.present_names.index(point.source_node)]
        # the global state, and the sender's inner optimizer state for nodes that rejoin
        sent = ((checkpoint.load_global(run_dir, point.round), node_state and node_state["inner_optimizer"])
                if topology.rank == source else None)
        global_state, lent_inner_state = broadcast_value(sent, src=source)
        if not returning:
            node_state = self._rejoin_state(point, own_report, lent_inner_state)
        run_id, pending = handles.restore(global_state, node_state, same_members)
        # round point.round's idle rows stay where the run logged them (at the next round's exchange or at
        # the run's end, both later than the record the checkpoint saved); a returning member whose row was
        # never logged logs its saved record instead
        logged_nodes = broadcast_value(self._nodes_logged_in(point.round) if topology.is_coordinator else None,
                                       src=0)
        if topology.is_coordinator:
            log = RunLog(run_dir)
            log.drop_rounds_from("idle.jsonl", point.round + 1)
            absent = [name for name in point.members if name not in topology.present_names + logged_nodes]
            log.append("idle.jsonl", saved_records(run_dir, point.round, absent))
            log.drop_rounds_from("metrics.jsonl", point.round + 1)
            log.drop_rounds_from("plan.jsonl", point.round + 1)
        if topology.is_leader:
            checkpoint.drop_rounds_after(run_dir, point.round)
            checkpoint.point_latest(run_dir, point.round)
            self._say_how_resumed(point, returning, same_members, node_state)
        if topology.is_coordinator and (restarted or not same_members):
            log_membership_event(run_dir, "resumed", after_round=point.round, present=topology.present_names,
                                 members_before=point.members, source=point.source_node)
        lost_since = pending.get("round_end") if (restarted and returning and pending) else None
        if restarted and not returning:
            lost_since = rejoin_lost_since(node_state)
        relogged = pending if returning and topology.node_name not in logged_nodes else None
        return StartPoint(run_id, point.round + 1, relogged, lost_since=lost_since)

    def _nodes_logged_in(self, round_idx: int) -> list[str]:
        """Nodes whose idle row of ``round_idx`` is in the run's ``idle.jsonl`` already."""
        return sorted(node for logged_round, node in RunLog(self.handles.run_dir).logged_keys("idle.jsonl")
                      if logged_round == round_idx)

    def _rejoin_state(self, point: ResumePoint, own_report: Optional[SavedRounds],
                      lent_inner_state: Optional[dict]) -> dict:
        """A node that missed ``point.round``: its data position from its newest own file, the inner
        optimizer state lent by the source node (see runtime/recovery.py)."""
        report = own_report or saved_rounds(self.handles.run_dir, self.topology.node_name)
        older = newest_node_round(report, point.round)
        state: dict = {"rejoined_after": older}
        if lent_inner_state is not None:
            state["inner_optimizer"] = lent_inner_state
        if older is not None:
            own = checkpoint.load_node(self.handles.run_dir, older, self.topology.node_name)
            state["data_position"] = own["data_position"]
            state["own_round_end"] = (own.get("pending_record") or {}).get("round_end")
        return state

    def _say_how_resumed(self, point: ResumePoint, returning: bool, same_members: bool,
                         node_state: Optional[dict]) -> None:
        name, present = self.topology.node_name, ", ".join(self.topology.present_names)
        if returning and same_members:
            return
        if returning:
            print(f"[geodiloco] node {name}: nodes present now: {present} (round {point.round + 1} had "
                  f"{', '.join(point.members)}); going on from round {point.round + 1} with the global state "
                  f"from node {point.source_node}{'; syncs that were in flight are dropped' if self.mode != 'none' else ''}",
                  flush=True)
            return
        older = node_state.get("rejoined_after") if node_state else None
        since = f"its last round was {older + 1}" if older is not None else "it has no saved state of this run"
        inner = (f"node {point.source_node}'s inner optimizer state" if "inner_optimizer" in (node_state or {})
                 else "fresh inner optimizer state")
        joins = "rejoins" if older is not None else "joins"
        print(f"[geodiloco] node {name}: {joins} after round {point.round + 1} ({since}) with the global state and "
              f"{inner} from node {point.source_node}; nodes present now: {present}", flush=True)

    def _start_heartbeat(self, generation: str) -> None:
        """Leaders watch each other (runtime/heartbeat.py) once the world has formed."""
        elastic = self.elastic
        if not self.topology.is_leader or self.topology.num_nodes < 2 or elastic is None:
            return
        store = open_store(elastic.failure_timeout_s)
        if store is None:
            return
        prefixed = dist.PrefixStore(f"geodiloco/heartbeat/{generation}/", store)
        name, run_dir = self.topology.node_name, self.handles.run_dir

        def record(peer: str, silent_s: float) -> None:
            log_membership_event(run_dir, "peer_failed", node=name, peer=peer, how="heartbeat",
                                 silent_s=round(silent_s, 2))

        self.heartbeat = Heartbeat(prefixed, name, self.topology.present_names, elastic.heartbeat_interval_s,
                                   elastic.failure_timeout_s, on_failure=exit_on_peer_failure(name, record)).start()

    # ----- the round -----------------------------------------------------------------------

    def begin_round(self, round_idx: int) -> Optional[list[str]]:
        """The nodes of this world (after a site failed: the ones present)."""
        self._launched = set()
        return None if self.topology.all_present else list(self.topology.present_names)

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
            with intra_op_threads(self.sync_threads):  # the node's other ranks wait in the broadcast
                self._launch(0, measured_weights(round_sync))
            self._land(0)
        elif self.mode == "delayed":
            self._land(0)
            self._launch(0, measured_weights(round_sync))  # the other ranks train meanwhile
            if round_sync.last_round:
                self._land(0)
        else:
            weights = planned_weights(round_sync)
            with intra_op_threads(self.sync_threads):  # the round's end: the other ranks wait
                for fragment in range(len(self.fragments)):
                    if fragment not in self._launched:
                        self._launch(fragment, weights)
                    self._land(fragment)
                if round_sync.last_round:  # what moved since each launch, averaged in (no momentum kick)
                    for fragment in range(len(self.fragments)):
                        self._launch(fragment, weights)
                        self._land(fragment, outer_step=False)
        self._reload_if_left_out(round_sync)
        return self._outcome(round_sync)

    def _reload_if_left_out(self, round_sync: RoundSync) -> None:
        """This node's model was non-finite: take the global parameters back (its zero contribution
        landed with the others'), with anchors and error feedback afresh."""
        if self.topology.node_name not in non_finite_nodes(round_sync.stats_by_node):
            return
        if self.topology.is_leader:
            with torch.no_grad():
                for param, global_param in zip(self.handles.params, self.handles.outer.global_params):
                    param.copy_(global_param.to(param.device, param.dtype))
            self.schedule.load_state_dict({})
        self.broadcast_in_node([param.data for param in self.handles.params])

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
        """Land ``fragment`` on the leader and share its parameters in the node; seconds waited. The node's other
        ranks wait for it in the broadcast, so the leader lands on their threads too (``sync_threads``)."""
        blocked_s = 0.0
        if self.schedule is not None:
            with intra_op_threads(self.sync_threads):
                blocked_s = self.schedule.land(fragment, outer_step)
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

    def global_state_dict(self) -> dict:
        return {}

    def load_global_state_dict(self, state: dict) -> None:
        """Nothing beyond the global parameters and outer optimizer."""

    def state_lock(self) -> Any:
        return contextlib.nullcontext()

    # ----- in-node and world helpers -------------------------------------------------------

    def exchange(self, stats: Any) -> list[Any]:
        return all_gather_values(stats)

    def broadcast_in_node(self, tensors: list[torch.Tensor]) -> None:
        if self.topology.node_group is None:
            return
        for tensor in tensors:
            dist.broadcast(tensor, src=self.topology.node_ranks[0], group=self.topology.node_group)

    def share_in_node(self, value: Any) -> Any:
        if self.topology.node_group is None:
            return value
        return broadcast_value(value, src=self.topology.node_ranks[0], group=self.topology.node_group)

    def barrier(self) -> None:
        dist.barrier()

    def leave(self) -> None:
        """Stop this node's heartbeat (saying it left on purpose), then wait for every node to have done so
        (lockstep modes): the TCP store lives in rank 0's process, and a heartbeat that reached it after
        that process exited made torch print a C++ stack trace on a run that had succeeded."""
        if self.heartbeat is not None:
            self.heartbeat.stop(leaving=True)
            self.heartbeat = None
        if not self.barrier_free and dist.is_initialized():
            dist.barrier()

    def close(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop(leaving=True)
        if self.schedule is not None:
            self.schedule.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def no_round_restarts(present: list[str], held: list[int]) -> CannotStart:
    return CannotStart(f"no saved round can restart the present nodes ({', '.join(present)}): rounds "
                       f"{', '.join(str(round_idx + 1) for round_idx in held)} lack a present member's node file; "
                       "start from a fresh --run-dir")


def saved_records(run_dir: Path, round_idx: int, node_names: list[str]) -> list[dict]:
    """The idle records these nodes' checkpoints of ``round_idx`` saved: a member that stopped after its round
    was saved logs no row of it itself (rows go out at the next round's exchange), so its round is logged from
    its file, where the run directory holds it (one shared directory; across machines each site keeps its own)."""
    records = []
    for name in node_names:
        try:
            record = checkpoint.load_node(run_dir, round_idx, name).get("pending_record")
        except (OSError, ValueError):  # not in this run directory, or damaged: nothing to log
            continue
        if record:
            records.append(record)
    return records


def rejoin_lost_since(node_state: dict) -> Optional[float]:
    """Where a site that rejoins an elastic run starts losing time (unix seconds), counted into its first round as
    lost: its agent's start (a site started again) or the end of its own last round (one that was left out while
    its agent ran on, such as a frozen one), whichever is later; None when neither is known."""
    known = [moment for moment in (agent_started(), node_state.get("own_round_end")) if moment is not None]
    return max(known) if known else None
