"""When pseudo-gradients are sent and when their outer step lands: ``diloco.overlap``.

The parameters are split into fragments (one for ``none`` and ``delayed``, ``diloco.fragments``
for ``streaming``). For each fragment the node's leader keeps an *anchor*: where its local
parameters would be had they not trained since the last launch. Two operations:

- **launch**: send ``weight * (anchor - local)`` (the progress since the last launch) to be
  summed over the nodes, in the background; the anchor moves to the local parameters.
- **land**: wait for that sum, take the outer Nesterov step on the fragment's global copy, and
  move the local parameters by the same difference: ``local = global + (local - anchor)``; the
  anchor becomes the new global. Local progress made while the sum was on the wire is kept.

``none`` launches and lands at the end of every round (blocking DiLoCo; the local model is then
exactly the global one). ``delayed`` lands round r-1's sum at the end of round r, then launches
round r's: the sync of round r runs behind round r+1's inner steps (one round stale). ``streaming``
launches fragment f before step floor(f H / N) of the round and lands it at the next fragment's
launch point (the last at the round end): N smaller syncs spread through the round, each 1/N of
a round stale. The last round drains: every sync lands, and streaming sends what moved since
(averaged into the global copy without an outer momentum step), so every node ends on the same
global parameters.

Launches run in order on one worker thread (every node issues the same collectives in the same
order); on CUDA it uses its own stream.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from geodiloco.runtime.finite_guard import all_finite
from geodiloco.runtime.host_threads import with_creators_threads
from geodiloco.runtime.sync.wire import ErrorFeedback

Reducer = Callable[[torch.Tensor, ErrorFeedback], torch.Tensor]
"""(this node's weighted contribution, the fragment's error feedback) -> the fp32 sum over nodes."""


def split_fragments(sizes: list[int], count: int) -> list[list[int]]:
    """Parameter indices of at most ``count`` contiguous fragments of about equal element counts
    (a parameter goes to the fragment its middle element falls in)."""
    total = sum(sizes)
    fragments: list[list[int]] = [[] for _ in range(max(1, count))]
    done = 0
    for index, size in enumerate(sizes):
        position = min(len(fragments) - 1, int((done + size / 2) * len(fragments) / total)) if total else 0
        fragments[position].append(index)
        done += size
    return [fragment for fragment in fragments if fragment]


def launch_steps(local_steps: int, fragments: int) -> list[int]:
    """Inner step before which each fragment launches under streaming: floor(f H / N)."""
    return [fragment * local_steps // fragments for fragment in range(fragments)]


@dataclass
class SyncJob:
    """One fragment's sum on the wire: its input (kept for checkpoints), result and timing."""

    fragment: int
    contribution: torch.Tensor
    feedback_before: ErrorFeedback
    done: threading.Event = field(default_factory=threading.Event)
    result: Optional[torch.Tensor] = None
    error: Optional[BaseException] = None
    started: float = 0.0
    finished: float = 0.0


class SyncWorker:
    """Runs reductions one at a time, in submission order, on a background thread."""

    def __init__(self, reducer: Reducer, device: torch.device) -> None:
        self.reducer = reducer
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.jobs: "queue.Queue[Optional[tuple[SyncJob, ErrorFeedback, object]]]" = queue.Queue()
        self.thread = threading.Thread(target=with_creators_threads(self._run), name="geodiloco-sync", daemon=True)
        self.thread.start()

    def submit(self, job: SyncJob, feedback: ErrorFeedback) -> None:
        ready = None
        if self.stream is not None:
            ready = torch.cuda.Event()
            ready.record()
        self.jobs.put((job, feedback, ready))

    def _run(self) -> None:
        while True:
            item = self.jobs.get()
            if item is None:
                return
            job, feedback, ready = item
            job.started = time.time()
            try:
                if self.stream is not None:
                    with torch.cuda.stream(self.stream):
                        self.stream.wait_event(ready)
                        job.result = self.reducer(job.contribution, feedback)
                    self.stream.synchronize()
                else:
                    job.result = self.reducer(job.contribution, feedback)
            except BaseException as err:  # handed to the waiting training thread
                job.error = err
            job.finished = time.time()
            job.done.set()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=5)


class OverlapSchedule:
    """The leader's anchors, error feedback and syncs in flight for every fragment."""

    def __init__(self, mode: str, params: list[torch.Tensor], outer, fragments: list[list[int]],
                 reducer: Reducer, run_in_background: bool) -> None:
        self.mode = mode
        self.params = params
        self.outer = outer
        self.fragments = fragments
        self.anchors = [param.detach().clone() for param in outer.global_params]
        self.feedback = [ErrorFeedback() for _ in self.fragments]
        self.in_flight: dict[int, SyncJob] = {}
        self.reducer = reducer
        device = outer.global_params[0].device
        self.worker = SyncWorker(reducer, device) if run_in_background else None
        self.landed: list[SyncJob] = []

    @torch.no_grad()
    def rebase(self) -> None:
        """Anchors at the global copy again, nothing sent yet: after the global copy was replaced before the
        first round (runtime/sync/start_model.py)."""
        for anchor, global_param in zip(self.anchors, self.outer.global_params):
            anchor.copy_(global_param)

    # ----- the two operations ------------------------------------------------------------

    def launch(self, fragment: int, weight: float) -> None:
        """Send ``weight * (anchor - local)`` of ``fragment``; the anchor moves to the local values.
        Each difference is written in place into the flat contribution (no per-tensor temporaries),
        the local values widened into the anchor first (experiments/runtime/bench_outer_step.py)."""
        indices = self.fragments[fragment]
        device = self.anchors[indices[0]].device if indices else torch.device("cpu")
        contribution = torch.empty(sum(self.anchors[index].numel() for index in indices), dtype=torch.float32,
                                   device=device)
        offset = 0
        for index in indices:
            anchor = self.anchors[index]
            slot = contribution[offset:offset + anchor.numel()].view_as(anchor)
            slot.copy_(anchor)
            anchor.copy_(self.params[index].detach())
            slot.sub_(anchor)
            offset += anchor.numel()
        if weight != 1.0:
            contribution.mul_(weight)
        if weight == 0.0 or not all_finite([contribution]):
            contribution.zero_()  # a non-finite model is left out (runtime/finite_guard.py); 0 x inf is NaN
        self._submit(SyncJob(fragment, contribution, self.feedback[fragment].copy()))

    def _submit(self, job: SyncJob) -> None:
        self.in_flight[job.fragment] = job
        if self.worker is None:
            job.started = time.time()
            job.result = self.reducer(job.contribution, self.feedback[job.fragment])
            job.finished = time.time()
            job.done.set()
        else:
            self.worker.submit(job, self.feedback[job.fragment])

    @torch.no_grad()
    def land(self, fragment: int, outer_step: bool = True) -> float:
        """Wait for ``fragment``'s sum, take its outer step, rebase the local values; returns the
        seconds this thread waited for it. ``outer_step=False`` subtracts the sum from the global
        copy instead (plain averaging, the outer momentum untouched): the final resync of streaming."""
        job = self.in_flight.pop(fragment, None)
        if job is None:
            return 0.0
        waited_from = time.perf_counter()
        job.done.wait()
        blocked_s = time.perf_counter() - waited_from
        if job.error is not None:
            raise RuntimeError(f"outer sync of fragment {fragment} failed: {job.error}") from job.error
        indices = self.fragments[fragment]
        if outer_step:
            self.outer.apply(job.result, indices)
        else:
            self.outer.subtract(job.result, indices)
        for index in indices:  # local = global + (local - anchor), in the anchor's buffer; then anchor = global
            global_param, local, anchor = self.outer.global_params[index], self.params[index], self.anchors[index]
            source = local.detach()
            torch.sub(source if source.device == anchor.device else source.to(anchor.device), anchor, out=anchor)
            anchor.add_(global_param)
            local.copy_(anchor)
            anchor.copy_(global_param)
        self.landed.append(job)
        return blocked_s

    def take_landed(self) -> list[tuple[float, float]]:
        """(start, end) unix seconds of the syncs landed since the last call."""
        intervals = [(job.started, job.finished) for job in self.landed]
        self.landed = []
        return intervals

    # ----- checkpoints ----------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Error feedback, and the inputs of the syncs in flight with the error feedback they
        started from: resuming launches them again and gets the same sums.

        Anchors are not saved: at a round's end they are the local parameters under ``delayed``
        (the round's sync was just launched from them) and the global ones otherwise (every
        fragment landed), so ``load_state_dict`` sets them from those."""
        in_flight = [{"fragment": job.fragment, "contribution": job.contribution,
                      "feedback_before": job.feedback_before.state_dict()}
                     for job in sorted(self.in_flight.values(), key=lambda job: job.fragment)]
        return {"mode": self.mode, "feedback": [feedback.state_dict() for feedback in self.feedback],
                "in_flight": in_flight}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Restore a checkpoint's state; an empty ``state`` (a node that rejoins, or members that
        changed) only sets the anchors: nothing in flight, fresh error feedback."""
        state = state or {"mode": self.mode, "feedback": [], "in_flight": []}
        if state.get("mode", "none") != self.mode:
            raise ValueError(f"the checkpoint was written with diloco.overlap: {state.get('mode')}, this run "
                             f"uses {self.mode}; resume with the same diloco.overlap")
        sources = self.params if self.mode == "delayed" else self.outer.global_params
        for anchor, source in zip(self.anchors, sources):
            anchor.copy_(source.detach().to(anchor.device, torch.float32))
        for feedback, saved in zip(self.feedback, state["feedback"]):
            feedback.load_state_dict(saved)
        for item in state["in_flight"]:
            self.feedback[item["fragment"]].load_state_dict(item["feedback_before"])
            job = SyncJob(item["fragment"], item["contribution"], ErrorFeedback(**item["feedback_before"]).copy())
            self._submit(job)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()
