"""NVIDIA vGPU profiles: a virtual machine's share of a GPU, named as the guest driver prints it.

A VM with a vGPU sees a device named after the board and the profile: "NVIDIA A10-4Q" (4 GB of an
A10's frame buffer, Q series), "NVIDIA A100-40C" (a whole A100 40GB for compute), "NVIDIA A100-3-20C"
(a MIG-backed vGPU: the A100's 3g.20gb instance). Cloud VMs sold as "1/6 of an A10" are such
profiles. The series letter (Q, C, B, A) says which license the profile needs, not its speed.

A time-sliced vGPU shares the GPU's engines in turns with the other vGPUs on the board, at most
frame buffer / profile size of them (NVIDIA Virtual GPU Software User Guide: each profile's "maximum
vGPUs per GPU"). Its rates are planned at that share (the fixed-share scheduler's slice; the default
best-effort scheduler gives more while the neighbours are idle), with a notice, so the first plan is
on the safe side and the node's measured steps set its real speed from the first round. A MIG-backed
vGPU is its MIG instance (predictor/mig.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from geodiloco.predictor.mig import MigProfile
from geodiloco.predictor.slice_rows import slice_row

VGPU_GUIDE = "NVIDIA Virtual GPU Software User Guide, vGPU types"

_PROFILE = re.compile(r"^(?P<board>.+?)-(?:(?P<slices>\d+)-)?(?P<memory>\d+)(?P<series>[QCBA])$", re.IGNORECASE)
_GRID = re.compile(r"^\s*grid\s+", re.IGNORECASE)


@dataclass(frozen=True)
class VgpuProfile:
    """A vGPU type: ``memory_gb`` of frame buffer, and ``mig`` when it is backed by a MIG instance."""

    memory_gb: float
    series: str
    mig: Optional[MigProfile] = None

    @property
    def label(self) -> str:
        if self.mig:
            return f"{self.mig.gpu_slices}-{self.memory_gb:g}{self.series}"
        return f"{self.memory_gb:g}{self.series}"


def split_vgpu_name(name: str) -> Optional[tuple[str, VgpuProfile]]:
    """(board name, profile) when ``name`` names a vGPU ("NVIDIA A10-4Q", "GRID A100-3-20C"), else None."""
    found = _PROFILE.match(_GRID.sub("", name.strip()))
    if not found:
        return None
    memory_gb = float(found.group("memory"))
    series = found.group("series").upper()
    slices = int(found.group("slices")) if found.group("slices") else None
    mig = MigProfile(slices, memory_gb, slices) if slices else None
    return found.group("board").strip(), VgpuProfile(memory_gb=memory_gb, series=series, mig=mig)


def time_sliced_problem(board, profile: VgpuProfile) -> Optional[str]:
    """Why a time-sliced ``profile`` cannot run on ``board`` (a GpuSpec), or None."""
    if board.consumer:
        return f"{board.name} is a GeForce card, and NVIDIA vGPU runs on data-center and RTX workstation boards only"
    if profile.memory_gb > board.memory_gb * 1.02:
        return f"a {profile.label} vGPU needs {profile.memory_gb:g} GB and {board.name} has {board.memory_gb:g} GB"
    return None


def time_sliced_spec(board, profile: VgpuProfile):
    """The row of a time-sliced vGPU on ``board``: every rate and the bandwidth at its share of the board
    (profile frame buffer over the board's), its own memory, no peer link."""
    share = min(1.0, profile.memory_gb / board.memory_gb)
    return slice_row(
        board, f"{board.name} vGPU {profile.label}", share,
        source=(f"time-sliced vGPU {profile.label} of {board.name}: {share:.3g} of its rates and bandwidth, "
                f"{profile.memory_gb:g} GB ({VGPU_GUIDE}); board: {board.source}"),
        extra={"vgpu_board": board.name, "vgpu_profile": profile.label, "vgpu_share": share},
        memory_gb=profile.memory_gb, memory_bandwidth_gbps=board.memory_bandwidth_gbps * share, peer_link=None,
        peer_link_gbps=None)


def time_share_notice(name: str, board_name: str, share: float) -> str:
    return (f"GPU {name!r} is a time-sliced vGPU: planned at its fixed share ({share:.3g}) of {board_name}; "
            "with the default best-effort scheduler it runs faster while its neighbours idle, and the node's "
            "measured steps set its speed from the first round")
