"""Idle-time tracker: per node and round, where the wall-clock time went.

Method: the round starts when the local phase starts. ``compute_s`` is the local
phase (emulated padding included) less the time it stood still waiting on a sync
(streaming). ``wait_s`` is the readiness exchange that follows: it returns only
once every node has finished its local phase, so its duration is the time this
node waited for its peers (plus the latency of one tiny collective). ``comm_s``
is the *exposed* sync: the outer step phase (waiting for the pseudo-gradient sum,
the outer step, the in-node broadcast) plus the waits on a sync inside the local
phase. ``overhead_s`` is what follows before the next round (logging, evaluation,
the checkpoint's snapshot), plus any wait for the previous checkpoint's background
write before the exchange (counted out of ``wait_s``). The four add up to the
round's wall time by construction: each phase ends where the next begins,
measured with one clock.

``comm_hidden_s`` is not part of that sum: it is the sync time that ran while this
node computed (overlap), i.e. the overlap of every sync landed this round with the
local phase, less the local phase's own waits on a sync. Blocking sync has none.

A hivemind node left out of a round's averaging group throws that round's work
away and reloads the peers' state; the time from that round's start until the
round it rejoins starts (``lost_since``) is added to the rejoined round as
overhead, so no second of the run goes unrecorded.

Asynchronous mode (``diloco.mode: async``) has no readiness barrier: ``wait_s`` is the time
the node's push waited behind other nodes' updates at the global model's host (and, after its
last phase, for the other nodes to finish), ``comm_s`` the rest of its push and pull.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class RoundClock:
    """Marks phase boundaries with ``time.time()`` (unix seconds)."""

    marks: dict[str, float] = field(default_factory=dict)
    blocked_in_phase_s: float = 0.0
    comm_hidden_s: float = 0.0
    waited_in_sync_s: float = 0.0
    checkpoint_wait_s: float = 0.0
    """Seconds after the local phase spent waiting for the previous round's checkpoint write
    (runtime/checkpoint_writer.py): overhead, not waiting for peers."""
    members_wait_s: float = 0.0
    """Seconds at the round's start spent waiting for ``comm.min_nodes`` live nodes (hivemind): waiting
    for peers, not compute."""

    def mark(self, phase_end: str) -> None:
        self.marks[phase_end] = time.time()

    def record_sync(self, intervals: list[tuple[float, float]], blocked_in_phase_s: float,
                    waited_s: float = 0.0) -> None:
        """Syncs landed this round ((start, end) unix seconds), the local phase's waits on them, and
        ``waited_s`` of the outer step spent waiting on peers (async) rather than on the wire."""
        self.waited_in_sync_s = min(max(0.0, waited_s), self.span_s("ready", "synced"))
        phase_start, phase_end = self.marks["start"], self.marks["local_done"]
        overlap_s = sum(max(0.0, min(end, phase_end) - max(start, phase_start)) for start, end in intervals)
        self.blocked_in_phase_s = min(max(0.0, blocked_in_phase_s), self.span_s("start", "local_done"))
        self.comm_hidden_s = max(0.0, overlap_s - self.blocked_in_phase_s)

    def span_s(self, start: str, end: str) -> float:
        return max(0.0, self.marks[end] - self.marks[start])

    @property
    def compute_s(self) -> float:
        return self.span_s("start", "local_done") - self.blocked_in_phase_s - self.members_wait_s

    @property
    def wait_s(self) -> float:
        return (max(0.0, self.span_s("local_done", "ready") - self.checkpoint_wait_s) + self.waited_in_sync_s
                + self.members_wait_s)

    @property
    def comm_s(self) -> float:
        return self.span_s("ready", "synced") - self.waited_in_sync_s + self.blocked_in_phase_s

    @property
    def lost_s(self) -> float:
        """Discarded rounds and the rejoin before this round (0 when none)."""
        return self.span_s("lost_since", "start") if "lost_since" in self.marks else 0.0

    @property
    def overhead_s(self) -> float:
        return (self.span_s("synced", "end") + self.lost_s
                + min(self.checkpoint_wait_s, self.span_s("local_done", "ready")))

    def idle_windows(self) -> list[tuple[float, float]]:
        """The round's contiguous idle stretches (unix seconds): the lost time before it, if any, the wait
        for ``comm.min_nodes`` at its start, and everything after the local phase (waiting, the outer
        step, other). Stalls on a streaming sync inside the local phase (``blocked_in_phase_s``) are
        scattered and not among them."""
        windows = [(self.marks["lost_since"], self.marks["start"])] if "lost_since" in self.marks else []
        if self.members_wait_s > 0:
            windows.append((self.marks["start"], self.marks["start"] + self.members_wait_s))
        return windows + [(self.marks["local_done"], self.marks["end"])]

    @property
    def round_start(self) -> float:
        """Unix seconds where this round's record begins (the lost time included)."""
        return self.marks.get("lost_since", self.marks["start"])
