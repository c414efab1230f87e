"""The global model of asynchronous DiLoCo, kept by the leader of the node holding global rank 0.

``GlobalModelHost`` owns the global parameters and the delayed-Nesterov outer optimizer
(runtime/diloco.py) and applies each node's pseudo-gradient as it arrives, under one lock, so
the updates are applied one at a time in arrival order. It counts versions (updates applied),
records each update's staleness (versions applied since that node pulled), hands every node the
other nodes' phase statistics it has not seen yet (so every node's planner learns every node's
speed: dynamic local updates reuse the balancer), and knows which round every node has saved
(the run's checkpoint pointer moves only to a round every node holds).

``serve_node`` is the loop one host thread runs for one remote node over their two-rank group
(runtime/sync/messages.py); the host node itself calls ``GlobalModelHost`` directly.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from geodiloco.runtime.diloco import DelayedNesterov, OuterState, outer_weights
from geodiloco.runtime.sync.async_wire import PullShadows, unpack
from geodiloco.runtime.sync.messages import DONE, PUSH, RECORD, REPLY, Message, receive_message, send_message


@dataclass
class PushResult:
    """The host's answer to one push. ``staleness``: global versions applied between this node's
    pull and its update; ``queued_s``: seconds the update waited for the host's lock (other nodes'
    updates); ``news``: phase statistics of other nodes this node has not seen yet."""

    version: int
    staleness: int
    queued_s: float
    global_flat: torch.Tensor
    news: list[dict] = field(default_factory=list)


class GlobalModelHost:
    """Global parameters, outer optimizer and bookkeeping of an asynchronous run (thread-safe)."""

    def __init__(self, outer: OuterState, optimizer: DelayedNesterov, node_names: list[str]) -> None:
        self.outer = outer
        self.optimizer = optimizer
        self.node_names = list(node_names)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.version = 0
        self.latest_stats: dict[str, dict] = {}
        self.unseen: dict[str, list[dict]] = {name: [] for name in node_names}
        self.saved_round: dict[str, int] = {}
        self.pushed_round: dict[str, int] = {}
        """Each node's newest phase (round index) the host took in, applied or left out as non-finite: the global
        model holds that node's work up to there, so a resume starts the node after it (runtime/sync/async_resume.py)."""
        self.done: set[str] = set()
        self.final_items: dict[str, dict] = {}
        self.failure: Optional[BaseException] = None

    # ----- updates -------------------------------------------------------------------------

    def push(self, node: str, stats: dict, pseudo_gradient: Optional[torch.Tensor], pulled_version: int,
             weighting: str) -> PushResult:
        """Apply ``node``'s pseudo-gradient (``global_at_pull - local``, unweighted; None or a
        non-finite node: nothing applied) and return what the node needs to go on."""
        arrived = time.perf_counter()
        with self.changed:
            queued_s = time.perf_counter() - arrived
            staleness = self.version - pulled_version
            self.latest_stats[node] = stats
            if stats.get("saved_round") is not None:
                self.saved_round[node] = max(self.saved_round.get(node, -1), int(stats["saved_round"]))
            if stats.get("round") is not None:
                self.pushed_round[node] = int(stats["round"])
            if pseudo_gradient is not None and stats.get("finite", True):
                self.optimizer.apply(pseudo_gradient * self.weight_of(node, weighting))
                self.version += 1
            for other in self.node_names:
                if other != node:
                    self.unseen[other].append(stats)
            news, self.unseen[node] = self.unseen[node], []
            self.changed.notify_all()
            return PushResult(self.version, staleness, queued_s, self._flat(), news)

    def weight_of(self, node: str, weighting: str) -> float:
        """``node``'s share of one outer average (``runtime.diloco.outer_weights`` over every node's
        latest phase; a node not heard from yet counts as doing what this one did)."""
        own = self.latest_stats[node]
        rows = [self.latest_stats.get(name, own) for name in self.node_names]
        weights = outer_weights(weighting, [row["tokens"] for row in rows], [row["steps"] for row in rows],
                                [row["batch_size"] for row in rows])
        return weights[self.node_names.index(node)]

    def global_flat(self) -> tuple[int, torch.Tensor]:
        """(version, a copy of the global parameters as one flat fp32 tensor), taken together."""
        with self.lock:
            return self.version, self._flat()

    def _flat(self) -> torch.Tensor:
        return torch.cat([param.detach().reshape(-1).to("cpu", torch.float32) for param in self.outer.global_params])

    # ----- the end of the run --------------------------------------------------------------

    def mark_done(self, node: str) -> None:
        with self.changed:
            self.done.add(node)
            self.changed.notify_all()

    def wait_all_done(self, timeout_s: float) -> None:
        self._wait_for(lambda: self.done >= set(self.node_names), timeout_s,
                       lambda: f"nodes {sorted(set(self.node_names) - self.done)} did not finish their last phase")

    def add_final_item(self, node: str, item: dict) -> None:
        with self.changed:
            self.final_items[node] = item
            if item.get("saved_round") is not None:
                self.saved_round[node] = max(self.saved_round.get(node, -1), int(item["saved_round"]))
            self.changed.notify_all()

    def wait_final_items(self, timeout_s: float) -> list[dict]:
        self._wait_for(lambda: set(self.final_items) >= set(self.node_names), timeout_s,
                       lambda: f"nodes {sorted(set(self.node_names) - set(self.final_items))} sent no final record")
        with self.lock:
            return [self.final_items[name] for name in self.node_names]

    def _wait_for(self, ready: Callable[[], bool], timeout_s: float, what: Callable[[], str]) -> None:
        deadline = time.monotonic() + timeout_s
        with self.changed:
            while not ready():
                if self.failure is not None:
                    raise RuntimeError(f"Connection closed by peer: {self.failure}")
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    raise TimeoutError(f"{what()} within comm.timeout_s ({timeout_s:g} s)")
                self.changed.wait(min(left_s, 1.0))

    def fail(self, error: BaseException) -> None:
        with self.changed:
            self.failure = self.failure or error
            self.changed.notify_all()

    def committable_round(self) -> Optional[int]:
        """The newest round every node has saved its own state of (None before that)."""
        with self.lock:
            if set(self.saved_round) < set(self.node_names):
                return None
            return min(self.saved_round.values())

    # ----- checkpoints ---------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What the global checkpoint needs beside ``OuterState``: version, delayed-Nesterov buffer and each
        node's newest phase the global model holds."""
        with self.lock:
            return {"version": self.version, "optimizer": self.optimizer.state_dict(),
                    "pushed_rounds": dict(self.pushed_round)}

    def load_state_dict(self, state: dict) -> None:
        with self.lock:
            self.version = int(state.get("version", 0))
            self.optimizer.load_state_dict(state.get("optimizer", {}))
            self.pushed_round = {node: int(round_idx) for node, round_idx in (state.get("pushed_rounds") or {}).items()}


def serve_node(host: GlobalModelHost, node: str, peer_rank: int, group, shadows: PullShadows,
               sent_bytes: Callable[[int], None]) -> None:
    """One remote node's requests until its final record: pushes (answered with the newest global
    model, as a whole or as an encoded difference: runtime/sync/async_wire.py), its done message
    (answered once every node is done, with the final model) and its record. A failed connection
    is handed to ``host.fail`` so the host node stops too."""
    codec = shadows.codec
    try:
        while True:
            message = receive_message(peer_rank, group, (PUSH, DONE, RECORD))
            if message.kind == RECORD:
                host.add_final_item(node, message.body)
                return
            if message.kind == DONE:
                host.mark_done(node)
                host.wait_all_done(message.body["timeout_s"])
                version, flat = host.global_flat()
                # the final model goes whole (once per run): an encoded difference would leave the node on
                # its codec-rounded shadow, not on the global model every rank must end on
                sent_bytes(send_message(Message(REPLY, {"version": version}, [flat]), peer_rank, group))
                continue
            body = message.body
            numel = host.optimizer.numel
            pseudo_gradient = unpack(codec, message.tensors, numel) if message.tensors else None
            result = host.push(node, body["stats"], pseudo_gradient, body["pulled_version"], body["weighting"])
            reply = {"version": result.version, "staleness": result.staleness, "queued_s": result.queued_s,
                     "news": result.news}
            sent_bytes(send_message(Message(REPLY, reply, shadows.encode(node, result.global_flat)), peer_rank, group))
    except Exception as err:  # a peer that died or sent garbage: the host node must not hang
        host.fail(RuntimeError(f"node {node}: {err}"))
