"""Outer-sync time model: what goes on the wire, how long it takes, and how much of it hides.

A ring all-reduce of ``S`` bytes among ``n`` nodes runs ``2 (n - 1)`` steps
(reduce-scatter, then all-gather); in each step every node sends one chunk of
``S / n`` bytes to its neighbour, so a step lasts as long as the slowest link
needs for a chunk plus that link's one-way latency. The collective ends at the
same moment on every node, so every node spends the same time in it; the
slowest link and the largest latency set that time. Nodes without a ``wan:``
entry are treated as having an unlimited, zero-latency link. A compressed sum
(all-to-all, fp32 sum, all-gather; runtime/sync/wire.py) moves the same share of
its encoded payload in the same number of steps, so the same formula holds with
the encoded size.

With ``diloco.overlap`` the sync runs behind compute: a round's critical path is
the longer of the local phase and the sync, so only ``max(0, sync - phase)`` is
exposed (delayed), or, per fragment, ``max(0, fragment sync - phase / N)``
(streaming). The model learns from measured syncs like the step-time model does
from steps: an EWMA of measured / predicted scales every prediction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from geodiloco.balancer.cluster import NodeSpec

CHUNK_ELEMENTS = 2048
"""Elements per fp32 scale of the integer codecs (2 KiB of int8 carry 4 bytes of scale)."""
CODEC_BITS = {"none": 32, "fp16": 16, "bf16": 16, "int8": 8, "int4": 4}
CODECS_BY_SIZE = ("none", "bf16", "int8", "int4")
SYNC_DTYPE_CODEC = {"fp32": "none", "bf16": "bf16", "fp16": "fp16", "int8": "int8"}
MEASURED_SYNC_ALPHA = 0.5


def encoded_bytes(codec: str, numel: int) -> int:
    """Bytes of ``numel`` pseudo-gradient elements encoded with ``codec`` (scales included)."""
    if codec not in CODEC_BITS:
        raise ValueError(f"unknown codec {codec!r}; known: {', '.join(CODEC_BITS)}")
    payload = -(-numel * CODEC_BITS[codec] // 8)
    if codec in ("int8", "int4"):
        payload += 4 * -(-numel // CHUNK_ELEMENTS)
    return payload


RUN_DEFAULT_OVERLAP = "streaming"
RUN_DEFAULT_COMPRESSION = "int8"
"""A run's ``diloco.overlap`` and ``diloco.compression`` when its config leaves them out (runtime/config.py
uses these): what experiments/sync/hide_sync.py measured best on the source paper's cluster."""


@dataclass(frozen=True)
class SyncSettings:
    """How the run syncs: ``overlap`` (none | delayed | streaming), ``codec`` (none | fp16 | bf16 |
    int8 | int4), ``fragments`` (streaming) and ``backend`` (torch | hivemind: which overlaps and codecs
    the advice may offer). The runtime passes its ``diloco:`` values (under hivemind the codec on its wire,
    ``hivemind_codec``)."""

    overlap: str = "none"
    codec: str = "none"
    fragments: int = 1
    backend: str = "torch"

    @property
    def sync_count(self) -> int:
        """Syncs per round: one per fragment under streaming."""
        return self.fragments if self.overlap == "streaming" else 1


HIVEMIND_WIRE_CODECS = {"none": "none", "fp16": "fp16", "8bit": "int8"}
"""hivemind's codecs as the codec the planner prices (8bit: one byte per element, as int8)."""


def hivemind_wire_codec(hivemind_compression: str, diloco_compression: str) -> str:
    """The hivemind codec a run puts on the wire, by hivemind's name: ``comm.hivemind.compression``, else the one
    matching ``diloco.compression`` (fp16 -> fp16, int8 -> 8bit; bf16 has no hivemind codec: it is rounded locally
    and sent as fp32)."""
    if hivemind_compression != "none":
        return hivemind_compression
    return {"fp16": "fp16", "int8": "8bit"}.get(diloco_compression, "none")


def hivemind_codec(hivemind_compression: str, diloco_compression: str) -> str:
    """The codec a hivemind run puts on the wire, as the planner names and prices it (8bit as int8)."""
    return HIVEMIND_WIRE_CODECS[hivemind_wire_codec(hivemind_compression, diloco_compression)]


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

    def __init__(self, nodes: Sequence[NodeSpec], num_params: int, sync_dtype: str = "fp32",
                 settings: Optional[SyncSettings] = None) -> None:
        self.settings = settings or SyncSettings(codec=SYNC_DTYPE_CODEC[sync_dtype])
        self.num_nodes = len(nodes)
        self.num_params = num_params
        self.payload_bytes = encoded_bytes(self.settings.codec, num_params)
        linked = [node.wan for node in nodes if node.wan is not None]
        self.bandwidths_mbps = [wan.bandwidth_mbps for wan in linked]
        self.latencies_ms = [wan.latency_ms for wan in linked]
        self.measured_factor = 1.0
        self._sync_s = self._ring_s(self.payload_bytes)

    def sync_s(self) -> float:
        """Time of one outer sync of the whole model (seconds); 0 without any ``wan:`` entry."""
        return self._sync_s * self.measured_factor

    def codec_sync_s(self, codec: str) -> float:
        """What one whole-model sync would take with ``codec`` (seconds), learned factor included."""
        return self._ring_s(encoded_bytes(codec, self.num_params)) * self.measured_factor

    def one_sync_s(self) -> float:
        """Time of one of the round's syncs: a fragment under streaming, else the whole model."""
        fragments = self.settings.sync_count
        if fragments == 1:
            return self.sync_s()
        return self._ring_s(self.payload_bytes / fragments) * self.measured_factor

    def _ring_s(self, payload_bytes: float) -> float:
        if not self.bandwidths_mbps:
            return 0.0
        # Unlimited links do not slow a step; only the listed links can be the bottleneck.
        bandwidths = self.bandwidths_mbps + [max(self.bandwidths_mbps)] * (self.num_nodes - len(self.bandwidths_mbps))
        return ring_allreduce_s(payload_bytes, bandwidths, self.latencies_ms)

    def node_sync_s(self) -> np.ndarray:
        """Each node's seconds in the outer sync (one value per node)."""
        return np.full(self.num_nodes, self.sync_s())

    def exposed_s(self, phase_s: float) -> float:
        """Seconds of sync a round leaves the GPUs waiting on, for a local phase of ``phase_s``."""
        if self.settings.overlap == "none":
            return self.sync_s()
        fragments = self.settings.sync_count
        return fragments * max(0.0, self.one_sync_s() - phase_s / fragments)

    def hide_phase_s(self) -> float:
        """Shortest local phase that hides the sync entirely (0 for blocking sync: nothing hides)."""
        if self.settings.overlap == "none":
            return 0.0
        return self.settings.sync_count * self.one_sync_s()

    def observe(self, measured_sync_s: float) -> None:
        """Learn from one measured sync (seconds, one of the round's syncs as ``one_sync_s``)."""
        predicted_s = self.one_sync_s() / self.measured_factor
        if predicted_s <= 0 or measured_sync_s <= 0:
            return
        ratio = measured_sync_s / predicted_s
        self.measured_factor = (1 - MEASURED_SYNC_ALPHA) * self.measured_factor + MEASURED_SYNC_ALPHA * ratio
