"""Several runs side by side (e.g. one per balancing policy), each relative to the first.

Idle is compared per round (GPU-hours wasted per 1,000 rounds) so runs of
different lengths compare fairly; throughput is tokens per wall-clock hour. The
run named least idle is the one with the smallest total GPU idle share.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from geodiloco.report.summary import RunSummary


@dataclass
class Comparison:
    """One run against the baseline (the first run given)."""

    label: str
    policy: str
    idle_gpu_h_per_1k_rounds: float
    idle_change: Optional[float]
    tokens_per_hour: Optional[float]
    tokens_per_hour_ratio: Optional[float]


def _ratio(value: Optional[float], baseline: Optional[float]) -> Optional[float]:
    if value is None or baseline is None or baseline <= 0:
        return None
    return value / baseline


def compare(summaries: list[RunSummary]) -> list[Comparison]:
    """``idle_change`` = idle per round / baseline's - 1 (-0.39 = 39 % less idle); None when the baseline had none."""
    baseline = summaries[0]
    rows = []
    for summary in summaries:
        idle_ratio = _ratio(summary.total.idle_gpu_h_per_1k_rounds, baseline.total.idle_gpu_h_per_1k_rounds)
        rows.append(Comparison(
            label=summary.label, policy=summary.policy,
            idle_gpu_h_per_1k_rounds=summary.total.idle_gpu_h_per_1k_rounds,
            idle_change=None if idle_ratio is None else idle_ratio - 1.0,
            tokens_per_hour=summary.tokens_per_hour,
            tokens_per_hour_ratio=_ratio(summary.tokens_per_hour, baseline.tokens_per_hour)))
    return rows


def least_idle(summaries: list[RunSummary]) -> RunSummary:
    """The run with the smallest total GPU idle share (idle GPU-s / wall GPU-s, the headline figure); fewer idle
    GPU-hours per 1,000 rounds break a tie. The share, not the per-round figure, decides: policies that run
    different local steps make rounds of different lengths, and async runs count phases per node."""
    return min(summaries, key=lambda summary: (round(summary.total.idle_share, 6), summary.total.idle_gpu_h_per_1k_rounds))


def node_names(summaries: list[RunSummary]) -> list[str]:
    """All nodes of the runs, in the order they first appear."""
    names: list[str] = []
    for summary in summaries:
        names.extend(node.node for node in summary.nodes if node.node not in names)
    return names
