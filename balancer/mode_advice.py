"""Which mode to expect faster on a cluster: balanced synchronous DiLoCo or asynchronous DiLoCo.

Both run the same balanced local phase (the plan's longest compute, seconds); they differ in
what the GPUs wait on around it:

- ``sync``: the plan's own prediction: waiting for the slowest node after balancing plus the
  exposed outer sync (with the configured overlap and codec).
- ``async``: no barrier; each phase ends with a push of the node's pseudo-gradient over its
  own link and a pull of the global model (as an encoded difference) over the host's (the first
  node's) link, both in the configured codec and both exposed. The host's link carries every other node's pull: when those take longer than a
  phase, the host's link sets the pace (every node's cycle stretches to it).
  Expected staleness: with equal phases every other node pushes once between a node's pull and
  its push, i.e. N - 1 versions.

The advice is the mode with the smaller predicted GPU idle share, async only when it wins by
more than ``ASYNC_MARGIN`` (staleness costs convergence that these seconds do not show). Both
shares leave out "other" (logging, evaluation, checkpoints), which both modes pay; measured runs
add it on top (a few % of node time in experiments/results/async/head_to_head.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from geodiloco.balancer.network import encoded_bytes
from geodiloco.balancer.plan import Plan

ASYNC_MARGIN = 0.05
"""Async must predict at least this much less GPU idle (share of GPU time: node time weighed by GPUs) to be advised."""


@dataclass
class ModeAdvice:
    """Predicted GPU idle share of GPU time (node time weighed by GPUs) for each mode, and the advice with its reason."""

    recommended: str
    sync_idle_share: float
    async_idle_share: float
    async_transfer_s: float
    """Seconds of one node's push and pull (mean over nodes), host link load included."""
    expected_staleness: int
    host_link_load: float
    """The host's link: seconds of pulls per phase cycle / the cycle (above 1: it sets the pace)."""
    reason: str


def link_s(payload_bytes: float, bandwidth_mbps: Optional[float], latency_ms: float) -> float:
    """Seconds to move ``payload_bytes`` over one link (no ``wan:`` entry: unlimited, 0 s)."""
    if bandwidth_mbps is None:
        return 0.0
    return 8.0 * payload_bytes / (bandwidth_mbps * 1e6) + latency_ms / 1e3


def counted(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def advise_mode(plan: Plan, nodes: list, num_params: int, measured_sync_factor: float = 1.0,
                codec: str = "none") -> ModeAdvice:
    """Advice for ``plan`` (made with the run's balancing policy and sync settings) on ``nodes``
    (config order: the first hosts the global model in async mode); ``codec``: the async push and
    pull's ``diloco.compression``."""
    count = len(plan.nodes)
    compute_s = np.array([node.predicted_compute_s for node in plan.nodes])
    phase_s = float(compute_s.max())
    weights = np.array(plan.gpu_counts(nodes), dtype=float)
    gpu_idle_s, gpu_s = plan.gpu_idle_s(nodes)
    sync_idle = gpu_idle_s / gpu_s if gpu_s > 0 else 0.0
    payload = encoded_bytes(codec, num_params)
    by_name = {node.name: node for node in nodes}
    links = [by_name[item.name].wan for item in plan.nodes]
    host = links[0]
    pull_s = link_s(payload, host.bandwidth_mbps if host else None, host.latency_ms if host else 0.0)
    pull_s *= measured_sync_factor
    push_s = np.array([link_s(payload, wan.bandwidth_mbps if wan else None, wan.latency_ms if wan else 0.0)
                       for wan in links]) * measured_sync_factor
    push_s[0], own_pull_s = 0.0, np.full(count, pull_s)
    own_pull_s[0] = 0.0  # the host reads its own copy
    cycle_s = compute_s.max() + push_s + own_pull_s
    host_busy_s = (count - 1) * pull_s
    host_load = host_busy_s / float(cycle_s.mean()) if cycle_s.mean() > 0 else 0.0
    cycle_s = np.maximum(cycle_s, host_busy_s)
    async_idle = float(np.average((cycle_s - phase_s) / cycle_s, weights=weights)) if phase_s > 0 else 0.0
    transfer_s = float(np.mean(cycle_s - phase_s))
    staleness = max(0, count - 1)
    if async_idle < sync_idle - ASYNC_MARGIN:
        recommended = "async"
        reason = (f"sync with the {plan.policy} policy leaves {sync_idle:.0%} of GPU time idle (waiting + exposed sync); async "
                  f"leaves about {async_idle:.0%} (push and pull {transfer_s:.3g} s per {phase_s:.3g} s phase) at "
                  f"an expected staleness of {counted(staleness, 'update')}")
    elif async_idle < sync_idle:
        recommended = "sync"
        reason = (f"sync with the {plan.policy} policy leaves {sync_idle:.0%} of GPU time idle (waiting + exposed sync); "
                  f"async would leave about {async_idle:.0%}, less by under {ASYNC_MARGIN:.0%} of GPU time: too little "
                  f"to pay for updates about {counted(staleness, 'version')} stale")
    else:
        recommended = "sync"
        why = ("the host's link carries every pull and sets the pace"
               if host_load > 1 else f"its push and pull take {transfer_s:.3g} s per phase "
                                     f"({'fp32' if codec == 'none' else codec}, none of it hidden)")
        reason = (f"sync with the {plan.policy} policy leaves {sync_idle:.0%} of GPU time idle (waiting + exposed sync); "
                  f"async would leave about {async_idle:.0%}: {why}, and its updates would be about "
                  f"{counted(staleness, 'version')} stale")
    return ModeAdvice(recommended, sync_idle, async_idle, transfer_s, staleness, host_load, reason)
