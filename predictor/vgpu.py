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

NVIDIA's vGPU software names some boards by a code rather than the name the table knows them by:
"A100D-3-40C" is a vGPU on an A100 PCIe 80GB, "H100XM-1-10C" one on an H100 SXM5 80GB. ``BOARD_CODES``
maps each code confirmed in NVIDIA's vGPU type tables to its row; any other board name is looked up
as written, so an unknown code still fails with the table's "unknown GPU" error.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from geodiloco.predictor.mig import MigProfile
from geodiloco.predictor.slice_rows import slice_row

VGPU_GUIDE = "NVIDIA Virtual GPU Software User Guide, vGPU types"

# Board codes in NVIDIA's vGPU type names, each confirmed in the "Virtual GPU Types for Supported GPUs"
# tables of NVIDIA AI Enterprise, "NVIDIA AI Enterprise and NVIDIA vGPU (C-Series)",
# https://docs.nvidia.com/ai-enterprise/release-6/latest/appendix/vgpu.html (the Hopper codes also in
# release 7's "Hopper Architecture vGPU Types"). Each comment names the board whose MIG-backed and
# time-sliced tables list the code, and the code's first and last types there.
BOARD_CODES: dict[str, str] = {
    # NVIDIA A100 PCIe 80GB: A100D-1-10C ... A100D-80C (the same types are listed for the A100 PCIe 80GB
    # Liquid-Cooled and the A100X converged card, planned here as the A100 PCIe 80GB)
    "A100D": "A100-PCIE-80GB",
    "A100DX": "A100-SXM4-80GB",  # NVIDIA A100 HGX 80GB: A100DX-1-10C ... A100DX-80C
    "A100X": "A100-SXM4-40GB",   # NVIDIA A100 HGX 40GB: A100X-1-5C ... A100X-40C
    # NVIDIA A800 PCIe 80GB: A800D-1-10C ... A800D-80C (also listed for its Liquid Cooled variant and the AX800)
    "A800D": "A800-PCIE-80GB",
    "A800DX": "A800-SXM4-80GB",  # NVIDIA A800 HGX 80GB: A800DX-1-10C ... A800DX-80C
    "H100XM": "H100-SXM",        # NVIDIA H100 SXM5 80GB: H100XM-1-10C ... H100XM-80C
    "H100L": "H100-NVL",         # NVIDIA H100 PCIe 94GB (H100 NVL): H100L-1-12C ... H100L-94C
    "H800XM": "H800-SXM",        # NVIDIA H800 SXM5 80GB: H800XM-1-10C ... H800XM-80C
    # NVIDIA H200 SXM5 141GB: H200X-1-18C ... H200X-141C. Row H200, named by its alias "H200 SXM5": "H200"
    # alone is also the model name, which the H200-NVL row shares.
    "H200X": "H200 SXM5",
    "V100X": "V100-SXM2-16GB",   # NVIDIA Tesla V100 SXM2: V100X-4C ... V100X-16C
    "V100DX": "V100-SXM2-32GB",  # NVIDIA Tesla V100 SXM2 32GB: V100DX-4C ... V100DX-32C
    "V100D": "V100-PCIE-32GB",   # NVIDIA Tesla V100 PCIe 32GB: V100D-4C ... V100D-32C
    # Plain codes: in the same tables "H100-", "H800-" and "H200-" types are those of the PCIe / NVL boards
    # (H100 PCIe 80GB, H800 PCIe 80GB, H200 NVL), where the bare model name would take the SXM row.
    "H100": "H100-PCIE",
    "H800": "H800-PCIE",
    "H200": "H200-NVL",
}
"""vGPU board code -> the table row's name (or an alias that names that row alone). Listed in the same
tables but not mapped, for want of a row: H800L (H800 PCIe 94GB, H800 NVL), H100XL (H100 SXM5 94GB),
H100XS (H100 SXM5 64GB), H20X (H20 SXM5 141GB), V100L (Tesla V100 FHHL), RTX6000P and RTX8000P
(Quadro RTX 6000 and 8000 Passive)."""

_PROFILE = re.compile(r"^(?P<board>.+?)-(?:(?P<slices>\d+)-)?(?P<memory>\d+)(?P<series>[QCBA])$", re.IGNORECASE)
_GRID = re.compile(r"^\s*grid\s+", re.IGNORECASE)
_NVIDIA = re.compile(r"^nvidia\s+", re.IGNORECASE)


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
    """(board name, profile) when ``name`` names a vGPU ("NVIDIA A10-4Q", "GRID A100-3-20C"), else None.
    A board code of NVIDIA's vGPU types ("A100D") comes back as its row's name ("A100-PCIE-80GB")."""
    found = _PROFILE.match(_GRID.sub("", name.strip()))
    if not found:
        return None
    memory_gb = float(found.group("memory"))
    series = found.group("series").upper()
    slices = int(found.group("slices")) if found.group("slices") else None
    mig = MigProfile(slices, memory_gb, slices) if slices else None
    return board_row_name(found.group("board").strip()), VgpuProfile(memory_gb=memory_gb, series=series, mig=mig)


def board_row_name(board: str) -> str:
    """The table row a vGPU board code stands for ("NVIDIA A100D" -> "A100-PCIE-80GB", ``BOARD_CODES``),
    else ``board`` as written."""
    return BOARD_CODES.get(_NVIDIA.sub("", board).strip().upper(), board)


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
