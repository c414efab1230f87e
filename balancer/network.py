"""Outer-sync time model: a ring all-reduce of the pseudo-gradients over the WAN.

A ring all-reduce of ``S`` bytes among ``n`` nodes runs ``2 (n - 1)`` steps
(reduce-scatter, then all-gather); in each step every node sends one chunk of
``S / n`` bytes to its neighbour, so a step lasts as long as the slowest link
needs for a chunk plus that link's one-way latency. The collective ends at the
same moment on every node, so every node spends the same time in it; the
slowest link and the largest latency set that time. Nodes without a ``wan:``
entry are treated as having an unlimited, zero-latency link.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from balancer.cluster import NodeSpec

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}


def pseudo_gradient_bytes(num_params: int, sync_dtype: str = "fp32") -> int:
    """Bytes one node contributes to the outer all-reduce (one element per parameter)."""
    try:
        return num_params * BYTES_PER_ELEMENT[sync_dtype]
    except KeyError:
        known = ", ".join(BYTES_PER_ELEMENT)
        raise ValueError(f"unknown sync dtype {sync_dtype!r}; known: {known}") from None


def ring_allreduce_s(payload_bytes: float, bandwidths_mbps: Sequence[float],
                     latencies_ms: Optional[Sequence[float]] = None) -> float:
    """Seconds for a ring all-reduce of ``payload_bytes`` over links of the given Mbit/s and ms.

    With one node there is nothing to exchange (0 s). Equals ``2 (n-1)/n * bytes / rate``
    for equal links without latency (the ideal ring time).
    """
    num_nodes = len(bandwidths_mbps)
    if num_nodes <= 1 or payload_bytes <= 0:
        return 0.0
    bandwidth_bps = np.asarray(bandwidths_mbps, dtype=float) * 1e6
    if np.any(bandwidth_bps <= 0):
        raise ValueError("every bandwidth must be > 0 Mbit/s")
    latency_s = 0.0 if latencies_ms is None else float(np.max(latencies_ms)) / 1e3
    chunk_bits = 8.0 * payload_bytes / num_nodes
    step_s = chunk_bits / float(np.min(bandwidth_bps)) + latency_s
    return 2 * (num_nodes - 1) * step_s


class OuterSyncModel:
    """Per-node time in the outer sync for a cluster (seconds; equal for all nodes in a ring)."""

    def __init__(self, nodes: Sequence[NodeSpec], num_params: int, sync_dtype: str = "fp32") -> None:
        self.num_nodes = len(nodes)
        self.payload_bytes = pseudo_gradient_bytes(num_params, sync_dtype)
        linked = [node.wan for node in nodes if node.wan is not None]
        self.bandwidths_mbps = [wan.bandwidth_mbps for wan in linked]
        self.latencies_ms = [wan.latency_ms for wan in linked]
        self._sync_s = self._ring_s()

    def sync_s(self) -> float:
        """Time of one outer all-reduce (seconds); 0 without any ``wan:`` entry."""
        return self._sync_s

    def _ring_s(self) -> float:
        if not self.bandwidths_mbps:
            return 0.0
        # Unlimited links do not slow a step; only the listed links can be the bottleneck.
        bandwidths = self.bandwidths_mbps + [max(self.bandwidths_mbps)] * (self.num_nodes - len(self.bandwidths_mbps))
        return ring_allreduce_s(self.payload_bytes, bandwidths, self.latencies_ms)

    def node_sync_s(self) -> np.ndarray:
        """Each node's seconds in the outer sync (one value per node)."""
        return np.full(self.num_nodes, self.sync_s())
