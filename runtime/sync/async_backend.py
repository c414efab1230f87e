"""Asynchronous DiLoCo over torch.distributed point-to-point (``diloco.mode: async``).

Where things live: the global model and its outer optimizer (delayed Nesterov) are kept by the
leader of the node holding global rank 0 (the *host*; runtime/sync/async_server.py). The host
runs one thread per other node, each on a two-rank process group of its own (gloo for these CPU
tensors), and trains as a node itself. A node's leader, at the end of each local phase, pushes
its pseudo-gradient (global model at its last pull - its local model) with its phase statistics,
and gets back the newest global model, its version, the staleness of its update and the other
nodes' statistics it has not seen; its next phase starts from that model at once. Nothing waits
for the slowest node except the end of the run (every node ends on the final global model).

The world is formed and authenticated exactly as in the synchronous mode (the run's secret;
runtime/auth.py), and start reuses the torch backend's: the host's global checkpoint holds
the global parameters, outer momentum, pending delayed-Nesterov buffer, version and each node's newest
phase it took in; each node's file its inner state. A resume (``--resume``, or the elastic agents'
restart) takes the global file with the most updates and starts each node after its own newest phase
that file holds (runtime/sync/async_resume.py). The checkpoint pointer moves to the newest round every
node has saved, for the tools that read one round (export, evaluate).
"""
from __future__ import annotations

import threading
import time
from dataclasses import asdict
from typing import Any, Optional

import torch
import torch.distributed as dist

from geodiloco.runtime import checkpoint
from geodiloco.runtime.comm import Topology
from geodiloco.runtime.config import DilocoSection, ElasticSection, OuterOptim
from geodiloco.runtime.diloco import DelayedNesterov
from geodiloco.runtime.plain_collectives import all_gather_values, broadcast_value
from geodiloco.runtime.recovery import (ResumePoint, SavedRounds, choose_resume_point, log_membership_event,
                                        saved_rounds)
from geodiloco.runtime.runlog import RunLog
from geodiloco.runtime.sync.async_resume import GlobalOffer, choose_global, newest_global_offer, resume_round
from geodiloco.runtime.sync.async_server import GlobalModelHost, PushResult, serve_node
from geodiloco.runtime.sync.async_wire import PullShadows, PushFeedback, apply_pull
from geodiloco.runtime.sync.messages import DONE, PUSH, RECORD, REPLY, Message, receive_message, send_message
from geodiloco.runtime.sync.protocol import RoundSync, StartPoint, SyncHandles, SyncOutcome
from geodiloco.runtime.sync.torch_backend import TorchOuterSync, no_round_restarts, rejoin_lost_since


class AsyncOuterSync(TorchOuterSync):
    """OuterSync without a round barrier (see the module docstring)."""

    barrier_free = True
    global_copy_per_node = False  # one global model, on the first node: no rounding to agree on
    leader_borrows_threads = False  # a node's push and pull run while its ranks train

    def __init__(self, topology: Topology, diloco: DilocoSection, outer_optim: OuterOptim, timeout_s: float,
                 checkpoint_keep: int, elastic: Optional[ElasticSection] = None) -> None:
        super().__init__(topology, diloco, elastic)
        self.outer_optim = outer_optim
        self.period = diloco.momentum_every or topology.num_nodes
        self.codec = diloco.compression
        self.push_feedback = PushFeedback(self.codec)
        self.timeout_s = timeout_s
        self.checkpoint_keep = checkpoint_keep
        # the host is the coordinator's node (global rank 0, which writes the run's logs and sees every push): under
        # torchrun's elastic agents rank 0 need not be the first node of the config
        self.host_rank = 0
        self.host_name = topology.present_names[topology.leader_ranks.index(0)]
        self.is_host = topology.rank == self.host_rank
        self.writes_round = self.is_host  # only the host's global copy is the global model
        # every rank creates every pair group, in the same order (torch.distributed requires it)
        self.pair_groups: dict[str, Any] = {}
        for name, rank in zip(topology.present_names, topology.leader_ranks):
            if rank != self.host_rank:
                group = dist.new_group([self.host_rank, rank])
                if topology.rank in (self.host_rank, rank):
                    self.pair_groups[name] = group
        self.host: Optional[GlobalModelHost] = None
        self.pulled: list[torch.Tensor] = []
        self.pulled_version = 0
        self.stage = "starting"
        self.weighting = "uniform"
        self.handles: Optional[SyncHandles] = None
        self.committed_round: Optional[int] = None
        self._own_rounds: list[int] = []
        """Rounds this node's own files were saved for, as a resume found them (leaders)."""
        self.resumed_round: Optional[int] = None
        """The round whose own file this node resumed from: what it reports as saved until it saves another (a node
        that resumes with no phase left saves none, and the final model must still be committed)."""
        self._run_id = ""
        self._threads: list[threading.Thread] = []
        self._host_sent_bytes = 0

    # ----- start ---------------------------------------------------------------------------

    def start(self, resume: bool, handles: SyncHandles) -> StartPoint:
        if self.topology.is_leader:
            optim = self.outer_optim
            self.host = GlobalModelHost(handles.outer, DelayedNesterov(handles.outer, optim.lr, optim.momentum,
                                                                       optim.nesterov, self.period),
                                        self.topology.present_names) if self.is_host else None
        self._pending_global_state: dict = {}
        point = super().start(resume, handles)
        if self.topology.is_leader:
            self.pulled = [param.detach().clone() for param in handles.outer.global_params]
            self.pulled_version = int(self._pending_global_state.get("version", 0))
            if self.host is not None:
                self.host.load_state_dict(self._pending_global_state)
                self._start_serving()
        return point

    def _resume_point(self, saved: list[SavedRounds], held: list[int]) -> ResumePoint:
        """As the synchronous mode's, except that a saved global model restarts the present nodes even where none of
        them saved a phase of it (the host died before the others' first saves): each node's start is chosen from
        its own files in ``_resume``, which the round's members need not hold."""
        point = choose_resume_point(saved, self.topology.present_names)
        if point is not None:
            return point
        newest = max(held)
        holder = next(report for report in saved if newest in report.global_members)
        return ResumePoint(newest, holder.node, holder.global_members[newest], synthetic=True)

    def _resume(self, point: ResumePoint, own_report: Optional[SavedRounds], restarted: bool) -> StartPoint:
        """Each node after its own newest phase the newest global model holds (runtime/sync/async_resume.py);
        checkpoints without that record resume every node from ``point`` as the synchronous mode does."""
        topology, run_dir = self.topology, self.handles.run_dir
        own_offer = (newest_global_offer(run_dir, topology.node_name, own_report.global_members)
                     if topology.is_leader and own_report is not None else None)
        offers = [GlobalOffer(**item) for item in self.exchange(asdict(own_offer) if own_offer else None) if item]
        chosen = choose_global(offers, topology.present_names)
        if chosen is None or chosen.pushed_rounds is None:  # written before pushed_rounds: all from one round
            if point.synthetic:  # no round every present member holds: refused as in sync mode
                raise no_round_restarts(topology.present_names, [point.round])
            start = super()._resume(point, own_report, restarted)
            self.resumed_round = point.round
            # the members' phases up to the round resumed from are in the model: the next save records them
            self._pending_global_state = {**self._pending_global_state,
                                          "pushed_rounds": {name: point.round for name in point.members}}
            if topology.is_coordinator:
                print(f"[geodiloco] resuming {start.run_id} after round {start.first_round}", flush=True)
            return start
        own = None
        if topology.is_leader:
            report = own_report or saved_rounds(run_dir, topology.node_name)
            own = {"node": topology.node_name, "pushed": chosen.pushed_rounds.get(topology.node_name),
                   "round": resume_round(report.node_rounds, chosen.pushed_rounds.get(topology.node_name)),
                   "newest_own": max(report.node_rounds, default=None)}
            self._own_rounds = list(report.node_rounds)
        resumed = {item["node"]: item for item in self.exchange(own) if item}
        joined_at = max(chosen.pushed_rounds.values(), default=-1)
        after = {name: resumed_after(item, joined_at) for name, item in resumed.items()}
        global_state, node_state = self._resumed_states(chosen, resumed, after)
        same_members = sorted(chosen.members) == sorted(topology.present_names)
        run_id, pending = self.handles.restore(global_state, node_state, same_members)
        logged = broadcast_value(sorted(RunLog(run_dir).logged_keys("idle.jsonl")) if topology.is_coordinator else None,
                                 src=0)
        self._drop_redone(after, host_same=self.host_name == chosen.host)
        if topology.is_coordinator:
            self._say_how_resumed_async(run_id, global_state, chosen, resumed, after, restarted, same_members)
        start = self._own_start(run_id, pending, resumed[topology.node_name], after[topology.node_name],
                                [tuple(key) for key in logged], restarted, node_state)
        if topology.is_coordinator:
            start.unlogged_reports = unlogged_reports(global_state["sync"].get("unlogged") or [], after,
                                                      {tuple(key) for key in logged},
                                                      RunLog(run_dir).logged_keys("metrics.jsonl"))
        return start

    def _resumed_states(self, chosen: GlobalOffer, resumed: dict[str, dict],
                        after: dict[str, int]) -> tuple[dict, Optional[dict]]:
        """(the global state, from the node whose disk holds it; this node's state: its own file of the phase it
        resumes after, else its newest own file's data position and inner optimizer with the phase counter set by
        ``after``, else the inner optimizer state a node with a file lends)."""
        topology, run_dir = self.topology, self.handles.run_dir
        source = topology.leader_ranks[topology.present_names.index(chosen.node)]
        lender = next((name for name in topology.present_names if resumed[name]["round"] is not None), None)
        borrowers = any(item["round"] is None and item["newest_own"] is None for item in resumed.values())
        sent = None
        if topology.rank == source:
            sent = checkpoint.load_global(run_dir, chosen.round)
        global_state = broadcast_value(sent, src=source)
        lent_inner_state = None
        if borrowers and lender is not None:
            lender_rank = topology.leader_ranks[topology.present_names.index(lender)]
            lent = (checkpoint.load_node(run_dir, resumed[lender]["round"], lender)["inner_optimizer"]
                    if topology.rank == lender_rank else None)
            lent_inner_state = broadcast_value(lent, src=lender_rank)
        own = resumed[topology.node_name]
        if own["round"] is not None:
            return global_state, checkpoint.load_node(run_dir, own["round"], topology.node_name)
        state: dict = {"rejoined_after": after[topology.node_name]}
        if own["newest_own"] is not None:
            older = checkpoint.load_node(run_dir, own["newest_own"], topology.node_name)
            state.update(data_position=older["data_position"], inner_optimizer=older["inner_optimizer"],
                         own_round_end=(older.get("pending_record") or {}).get("round_end"))
        elif lent_inner_state is not None:
            state["inner_optimizer"] = lent_inner_state
        return global_state, state

    def _drop_redone(self, after: dict[str, int], host_same: bool) -> None:
        """Before any node writes again: each leader deletes its own files of the phases it redoes, and the
        coordinator those phases' log rows (and, with the same host as before, the global rows past its phase).
        Global files stay: the host replaces them as it saves (``barrier_free``), and the one resumed from is kept
        until then."""
        topology, run_dir = self.topology, self.handles.run_dir
        host_round = after[self.host_name]
        if topology.is_leader:
            checkpoint.drop_node_files_after(run_dir, topology.node_name, after[topology.node_name])
        if not topology.is_coordinator:
            return
        log = RunLog(run_dir)

        def redone(row: dict) -> bool:
            node = row.get("node")
            if node == "global":
                return host_same and row.get("round", -1) > host_round
            return row.get("round", -1) > after.get(node, float("inf"))

        log.drop_rows("idle.jsonl", redone)
        log.drop_rows("metrics.jsonl", redone)
        if host_same:
            log.drop_rounds_from("plan.jsonl", host_round + 1)

    def _say_how_resumed_async(self, run_id: str, global_state: dict, chosen: GlobalOffer, resumed: dict[str, dict],
                               after: dict[str, int], restarted: bool, same_members: bool) -> None:
        """One line: the global model resumed from and the phase each node goes on after, with what differs from
        an exact resume (phases applied again, phases whose update is in the model but whose state is gone)."""
        parts = []
        for name, item in resumed.items():
            if item["round"] is not None and item["pushed"] is not None and item["round"] < item["pushed"]:
                parts.append(f"{name} {after[name] + 1} (its phases {item['round'] + 2}-{item['pushed'] + 1} "
                             "are applied again: their files are gone)")
            elif item["round"] is None and item["pushed"] is not None:
                parts.append(f"{name} {after[name] + 1} (no file of it up to there: it goes on from its "
                             f"{'newest file' if item['newest_own'] is not None else 'lent optimizer state'})")
            elif item["round"] is None and item["newest_own"] is not None:
                parts.append(f"{name} {after[name] + 1} (none of its phases is in that model: it goes on there from "
                             "its newest file)")
            elif item["round"] is None:
                parts.append(f"{name} {after[name] + 1} (new to this run: it joins there)")
            else:
                parts.append(f"{name} {after[name] + 1}")
        version = global_state["sync"].get("version", 0)
        print(f"[geodiloco] resuming {run_id} from the global model of version {version}, which holds each "
              f"node's phases up to: {', '.join(parts)}; each node goes on after its own", flush=True)
        if restarted or not same_members:
            log_membership_event(self.handles.run_dir, "resumed", after_round=after[self.host_name],
                                 present=self.topology.present_names, members_before=chosen.members,
                                 source=chosen.node)

    def _own_start(self, run_id: str, pending: Optional[dict], own: dict, after: int, logged: list[tuple],
                   restarted: bool, node_state: Optional[dict]) -> StartPoint:
        """This node's first phase, its saved idle record when the log lacks it, and where lost time began."""
        self.resumed_round = max((round_idx for round_idx in self._own_rounds if round_idx <= after), default=None)
        if own["round"] is None:
            return StartPoint(run_id, after + 1, None,
                              lost_since=rejoin_lost_since(node_state or {}) if restarted else None)
        relogged = pending if (own["round"], self.topology.node_name) not in logged else None
        return StartPoint(run_id, after + 1, relogged,
                          lost_since=pending.get("round_end") if restarted and pending else None)

    def _start_serving(self) -> None:
        shadows = PullShadows(self.codec, list(self.pair_groups), self.host.global_flat()[1])
        for name, group in self.pair_groups.items():
            rank = self.topology.leader_ranks[self.topology.present_names.index(name)]
            thread = threading.Thread(target=serve_node, name=f"geodiloco-host-{name}", daemon=True,
                                      args=(self.host, name, rank, group, shadows, self._count_host_bytes))
            thread.start()
            self._threads.append(thread)

    def _count_host_bytes(self, count: int) -> None:
        self._host_sent_bytes += count

    # ----- the phase -----------------------------------------------------------------------

    def begin_round(self, round_idx: int) -> Optional[list[str]]:
        self.stage = "rounds"
        return super().begin_round(round_idx)

    def exchange(self, stats: Any) -> list[Any]:
        """World-wide while starting; afterwards only this node's ranks (no barrier across nodes),
        and at the end every node's final record on the host (``finish``)."""
        if self.stage == "starting":
            return all_gather_values(stats)
        gathered = all_gather_values(stats, group=self.topology.node_group) if self.topology.node_group else [stats]
        if self.stage != "final" or not self.topology.is_leader:
            return gathered
        own = self._with_saved_round(gathered[0])
        if self.host is None:
            send_message(Message(RECORD, own), self.host_rank, self._own_pair_group())
            return gathered
        self.host.add_final_item(self.topology.node_name, own)
        items = self.host.wait_final_items(self.timeout_s)
        self._save_final_model()
        self._commit(self.handles.run_dir)
        return items + gathered[1:]

    def _save_final_model(self) -> None:
        """Host, once every node has sent its final record: the global model every node ended on becomes
        the global checkpoint of the newest round every node saved, which is then committed. The global
        file saved at that round's end lacks the updates other nodes pushed after it."""
        round_idx = self.host.committable_round()
        if round_idx is None or round_idx < 0 or self.handles.save_final_global is None:
            return
        self.handles.save_final_global(round_idx, self._run_id, list(self.topology.present_names))

    def outer_step(self, round_sync: RoundSync) -> SyncOutcome:
        """Push this phase's pseudo-gradient, pull the newest global model (the node's ranks all get it)."""
        self.weighting = round_sync.weighting
        name = self.topology.node_name
        own = self._with_saved_round(round_sync.stats_by_node[name])
        started = time.time()
        result: Optional[PushResult] = None
        sent = 0
        if self.topology.is_leader:
            pseudo_gradient = self._pseudo_gradient() if own.get("finite", True) else None
            result, sent = self._push(own, pseudo_gradient)
            self._take_global(result.version, result.global_flat)
            if self.host is not None:
                self._commit(self.handles.run_dir)
        self.broadcast_in_node([param.data for param in self.handles.params])
        reply = self.share_in_node(None if result is None else
                                   {"version": result.version, "staleness": result.staleness,
                                    "queued_s": result.queued_s, "news": result.news})
        ended = time.time()
        news = [item for item in reply["news"] if item["node"] != name]
        latest = {item["node"]: item for item in news}
        return SyncOutcome(stats_by_node={name: own, **latest}, sync_intervals=[(started, ended)],
                           sent_bytes=sent + self._take_host_bytes(), staleness=reply["staleness"],
                           waited_s=min(reply["queued_s"], ended - started), reported=[own, *news])

    def _with_saved_round(self, stats: dict) -> dict:
        if stats.get("saved_round") is None and self.resumed_round is not None:
            return {**stats, "saved_round": self.resumed_round}
        return stats

    def _pseudo_gradient(self) -> torch.Tensor:
        return torch.cat([(pulled - local.detach().to(pulled.device, torch.float32)).reshape(-1)
                          for pulled, local in zip(self.pulled, self.handles.params)]).cpu()

    def _push(self, stats: dict, pseudo_gradient: Optional[torch.Tensor]) -> tuple[PushResult, int]:
        if self.host is not None:
            return self.host.push(self.topology.node_name, stats, pseudo_gradient, self.pulled_version,
                                  self.weighting), 0
        group = self._own_pair_group()
        body = {"stats": stats, "pulled_version": self.pulled_version, "weighting": self.weighting}
        tensors = self.push_feedback.encode(pseudo_gradient) if pseudo_gradient is not None else []
        sent = send_message(Message(PUSH, body, tensors), self.host_rank, group)
        reply = receive_message(self.host_rank, group, (REPLY,))
        body = reply.body
        flat = apply_pull(self.codec, reply.tensors, self._pulled_flat())
        return PushResult(body["version"], body["staleness"], body["queued_s"], flat, body["news"]), sent

    def _pulled_flat(self) -> torch.Tensor:
        return torch.cat([tensor.reshape(-1) for tensor in self.pulled])

    @torch.no_grad()
    def _take_global(self, version: int, flat: torch.Tensor) -> None:
        """Load the pulled global model into the local parameters, the pulled copy and (other than on
        the host, whose copy is the global model itself) the node's OuterState."""
        offset = 0
        outer_params = self.handles.outer.global_params if self.host is None else [None] * len(self.pulled)
        for param, pulled, outer_param in zip(self.handles.params, self.pulled, outer_params):
            count = param.numel()
            piece = flat[offset:offset + count].view_as(pulled)
            pulled.copy_(piece)
            param.copy_(piece.to(param.device, param.dtype))
            if outer_param is not None:
                outer_param.copy_(piece)
            offset += count
        self.pulled_version = version

    def _take_host_bytes(self) -> int:
        count, self._host_sent_bytes = self._host_sent_bytes, 0
        return count

    def _own_pair_group(self):
        return self.pair_groups[self.topology.node_name]

    def _commit(self, run_dir) -> None:
        """Host: point ``latest`` at the newest round every node has saved (its global file is there)."""
        round_idx = self.host.committable_round()
        if round_idx is None or round_idx < 0 or round_idx == self.committed_round:
            return
        if checkpoint.has_global(run_dir, round_idx):
            checkpoint.mark_latest(run_dir, round_idx, self.checkpoint_keep)
            self.committed_round = round_idx

    # ----- the end -------------------------------------------------------------------------

    def finish(self, run_id: str, last_round: int) -> None:
        """Wait until every node has run its last phase; every rank then holds the final global model."""
        self.stage = "final"
        self._run_id = run_id
        if self.topology.is_leader:
            if self.host is not None:
                self.host.mark_done(self.topology.node_name)
                self.host.wait_all_done(self.timeout_s)
                version, flat = self.host.global_flat()
            else:
                group = self._own_pair_group()
                send_message(Message(DONE, {"timeout_s": self.timeout_s}), self.host_rank, group)
                reply = receive_message(self.host_rank, group, (REPLY,))
                version, flat = reply.body["version"], reply.tensors[0]  # whole, whatever the codec
            self._take_global(version, flat)
        self.broadcast_in_node([param.data for param in self.handles.params])

    def drain_reports(self) -> list[dict]:
        """Host, after the run: the phases other nodes reported after the host's own last pull."""
        if self.host is None:
            return []
        with self.host.lock:
            tail, self.host.unseen[self.topology.node_name] = self.host.unseen[self.topology.node_name], []
        return tail

    # ----- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict:
        """This node's push residual (error feedback of a lossy ``diloco.compression``)."""
        return self.push_feedback.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.push_feedback.load_state_dict(state or {})

    def global_state_dict(self) -> dict:
        """The host's version, delayed-Nesterov state and each node's newest phase in the model, and the host's name,
        saved beside the global parameters."""
        if self.host is None:
            return {}
        # the phases other nodes pushed that the host has not logged yet (it logs them at its next pull): their
        # updates are in this model, so a resume from it logs them (``unlogged_reports``)
        return {**self.host.state_dict(), "host": self.host_name,
                "unlogged": [dict(item) for item in self.host.unseen.get(self.host_name, [])]}

    def load_global_state_dict(self, state: dict) -> None:
        self._pending_global_state = state or {}
        if self.host is not None and self.stage != "starting":
            self.host.load_state_dict(self._pending_global_state)

    def state_lock(self):
        """Held while the host's global state is copied into a checkpoint (updates wait)."""
        return self.host.lock if self.host is not None else super().state_lock()

    def close(self) -> None:
        for thread in self._threads:
            thread.join(timeout=1.0)
        super().close()


def resumed_after(item: dict, joined_at: int) -> int:
    """The phase (round index) a node goes on after on an async resume: its own file's up to the phase the global
    model holds of it; without such a file, that phase itself (its updates up to there are in the model); for a
    node with none of its phases in the model, ``joined_at`` (the newest phase the model holds of any node)."""
    if item["round"] is not None:
        return item["round"]
    return item["pushed"] if item["pushed"] is not None else joined_at


def unlogged_reports(saved: list[dict], after: dict[str, int], idle_logged: set[tuple],
                     metrics_logged: set[tuple]) -> list[dict]:
    """The phase reports a resumed global model holds that the log lacks: those of phases the model holds (up to
    each node's ``after``) whose metrics row is not logged; each one's idle record (of the phase before) kept only
    where that row is missing too."""
    reports = []
    for item in saved:
        node, round_idx = item.get("node"), item.get("round")
        if node is None or round_idx is None or round_idx > after.get(node, round_idx) \
                or (round_idx, node) in metrics_logged:
            continue
        record = item.get("previous_record")
        keep_record = bool(record) and (record.get("round"), record.get("node")) not in idle_logged
        reports.append({**item, "previous_record": record if keep_record else None})
    return reports
