"""MIG instances: slices of one data-center GPU that drivers list as devices of their own.

Shared clusters often hand out a MIG instance rather than a whole GPU. torch.cuda and NVML name it
after its parent and profile ("NVIDIA A100-SXM4-40GB MIG 1g.5gb"), ``nvidia-smi -L`` prints
"MIG 1g.5gb Device 0" under its parent, and Kubernetes asks for "nvidia.com/mig-1g.5gb".

A profile ``<g>g.<m>gb`` holds g of the parent's compute slices and m GB of its memory, with the
memory controllers and L2 that serve that memory. NVIDIA's Multi-Instance GPU User Guide
("Supported MIG Profiles") gives every profile as a fraction of the parent's SMs (g over the part's
most instances, ``mig_instances`` in the GPU table: 7 on A100/H100/H200/B200, 4 on A30 and the
RTX PRO 6000 Blackwell, 2 on the RTX PRO 5000/4500 Blackwell) and a fraction of its memory
(``MEMORY_SHARES``). On GA100 parts (A100, A800) a slice is 14 SMs, so MIG mode uses 98 of the 108
(``mig_sms_per_slice``, from published device properties of MIG instances). So an instance's row is
its parent's with every compute rate scaled by its share of the SMs and the memory bandwidth by its
share of the memory. A compute instance inside a GPU instance ("1c.3g.20gb") has c of the g slices'
SMs and shares the GPU instance's memory.

MIG instances have no peer-to-peer path to one another (no NVLink, no PCIe P2P), so the derived row
has no peer link: gradients between two instances travel through the host.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Optional, Protocol

from geodiloco.predictor.slice_rows import slice_row

MIG_GUIDE = "NVIDIA Multi-Instance GPU User Guide, Supported MIG Profiles"

MEMORY_SHARES: dict[int, dict[int, tuple[float, ...]]] = {
    7: {1: (1 / 8, 2 / 8), 2: (2 / 8,), 3: (4 / 8,), 4: (4 / 8,), 7: (1.0,)},
    4: {1: (1 / 4,), 2: (2 / 4,), 4: (1.0,)},
    2: {1: (1 / 2,), 2: (1.0,)},
}
"""Share of the parent's memory each GPU-instance size gets, by the part's most instances: on a
7-slice part a 1g instance has an eighth of the memory or (the "1g.10gb" of an A100 40GB) two
eighths, 3g and 4g half of it, 7g all of it."""

SHARE_TOLERANCE = 0.12
"""Relative gap allowed between a profile's memory share and a standard one: profile names round
the memory (an H200's 141 GB gives "1g.18gb"; a B300 exposes 269 of its 288 GB, "7g.269gb")."""

_PROFILE = re.compile(r"(?:\bmig[\s_-]*)?\b(?:(?P<compute>\d+)c\.)?(?P<slices>\d+)g\.(?P<memory>\d+(?:\.\d+)?)gb\b"
                      r"(?:\+[a-z]+(?:\.[a-z]+)?)*", re.IGNORECASE)
_K8S_PREFIX = re.compile(r"\bnvidia\.com/", re.IGNORECASE)


class MigParent(Protocol):
    name: str
    sm_count: int
    memory_gb: float
    mig_instances: Optional[int]
    mig_sms_per_slice: Optional[int]


@dataclass(frozen=True)
class MigProfile:
    """A MIG profile: ``gpu_slices`` compute slices and ``memory_gb`` GB of the parent's memory;
    ``compute_slices`` is the compute instance's share of those slices (equal unless "1c.3g.20gb")."""

    gpu_slices: int
    memory_gb: float
    compute_slices: int

    @property
    def label(self) -> str:
        base = f"{self.gpu_slices}g.{self.memory_gb:g}gb"
        return base if self.compute_slices == self.gpu_slices else f"{self.compute_slices}c.{base}"


def split_mig_name(name: str) -> Optional[tuple[str, MigProfile]]:
    """(parent's name, profile) when ``name`` names a MIG instance, else None.

    The parent's name is what is left around the profile ("NVIDIA A100-SXM4-40GB"); it is '' when
    the name carries the profile alone ("MIG 1g.5gb", "nvidia.com/mig-1g.5gb").
    """
    found = _PROFILE.search(name)
    if not found:
        return None
    gpu_slices = int(found.group("slices"))
    compute_slices = int(found.group("compute") or gpu_slices)
    profile = MigProfile(gpu_slices=gpu_slices, memory_gb=float(found.group("memory")), compute_slices=compute_slices)
    parent = _K8S_PREFIX.sub(" ", name[:found.start()] + " " + name[found.end():])
    return re.sub(r"^[\s_/,-]+|[\s_/,-]+$", "", re.sub(r"\s+", " ", parent)), profile


def profile_problem(parent: MigParent, profile: MigProfile) -> Optional[str]:
    """Why ``profile`` cannot be a MIG instance of ``parent`` ('' words, for an error), or None when it can."""
    if not parent.mig_instances:
        return f"{parent.name} does not support MIG"
    if not 1 <= profile.compute_slices <= profile.gpu_slices:
        return f"a compute instance of {profile.compute_slices} slices does not fit a {profile.gpu_slices}g instance"
    shares = MEMORY_SHARES.get(parent.mig_instances, {}).get(profile.gpu_slices)
    share = profile.memory_gb / parent.memory_gb
    if shares and any(abs(share - standard) <= SHARE_TOLERANCE * standard for standard in shares):
        return None
    return f"{parent.name} has no MIG profile {profile.label}; its profiles: {', '.join(standard_profiles(parent))}"


def standard_profiles(parent: MigParent) -> list[str]:
    """The GPU-instance profiles of ``parent`` as NVIDIA names them ("1g.5gb", ..., "7g.40gb")."""
    shares = MEMORY_SHARES.get(parent.mig_instances or 0, {})
    return [f"{slices}g.{math.floor(share * parent.memory_gb + 0.5)}gb"
            for slices, slice_shares in shares.items() for share in slice_shares]


def mig_spec(parent, profile: MigProfile, sm_count: Optional[int] = None):
    """The row of a MIG instance of ``parent`` (a GpuSpec): rates scaled by its share of the SMs
    (``sm_count`` when a driver reported it, else the part's published SMs per slice times the profile's
    slices, else the profile's slices over the part's most instances), bandwidth by its share of the
    memory, no peer link."""
    if not sm_count and parent.mig_sms_per_slice:
        sm_count = parent.mig_sms_per_slice * profile.compute_slices
        how = f"{sm_count} of its {parent.sm_count} SMs ({parent.mig_sms_per_slice} per slice)"
    elif sm_count:
        how = f"{sm_count} of its {parent.sm_count} SMs (as the driver reports)"
    else:
        how = f"{profile.compute_slices}/{parent.mig_instances} of its SMs"
    compute_share = sm_count / parent.sm_count if sm_count else profile.compute_slices / parent.mig_instances
    memory_share = min(1.0, profile.memory_gb / parent.memory_gb)
    return slice_row(
        parent, f"{parent.name} MIG {profile.label}", compute_share,
        source=(f"MIG instance {profile.label} of {parent.name}: {how} and {memory_share:.3g} of its memory "
                f"and bandwidth ({MIG_GUIDE}); parent: {parent.source}"),
        extra={"mig_parent": parent.name, "mig_profile": profile.label},
        sm_count=sm_count or max(1, round(parent.sm_count * compute_share)), memory_gb=profile.memory_gb,
        memory_bandwidth_gbps=parent.memory_bandwidth_gbps * memory_share, peer_link=None, peer_link_gbps=None)
