"""AMD Instinct compute partitions: an MI300-series GPU split into devices that keep its name.

In DPX, QPX or CPX mode an MI300X or MI325X lists 2, 4 or 8 devices, each with its share of the
compute units (152, 76 or 38 of 304) and named like the whole GPU ("AMD Instinct MI300X"), so the
name alone would plan each as a whole GPU. The modes follow the part's accelerator dies (XCDs): CPX
is one die per device, so the MI300A, with 6 dies, has TPX (3 devices) and CPX (6) instead. Detection
reports each device's compute-unit count, and a device with a whole fraction of its row's is planned
at that share of the row: its rates, its memory and its memory bandwidth, since the partitions of a
node train together and share the GPU's memory stacks (AMD Instinct MI300X GPU partitioning
overview: SPX/DPX/QPX/CPX compute modes, NPS1/NPS4 memory modes; AMD's MI300A partitioning: SPX,
TPX, CPX).
"""
from __future__ import annotations

import re
from typing import Optional

from geodiloco.predictor.slice_rows import slice_row

EIGHT_DIE_MODES = {"SPX": 1, "DPX": 2, "QPX": 4, "CPX": 8}
MODES_BY_MODEL = {"MI300A": {"SPX": 1, "TPX": 3, "CPX": 6}}
"""Parts whose dies differ from the MI300X's eight; every other partitioning part has EIGHT_DIE_MODES."""
PARTITIONING_ARCHITECTURES = ("cdna3", "cdna4")
"""Architectures whose parts split into compute partitions (MI300X, MI325X and later)."""

MODE_NAMES = ("SPX", "DPX", "TPX", "QPX", "CPX")
"""Every compute-partition mode a part may have (and rocm-smi may print)."""
_MODE = re.compile(r"\b(" + "|".join(MODE_NAMES) + r")\b", re.IGNORECASE)


def partition_modes(row) -> dict[str, int]:
    """{mode: devices} of the compute-partition modes ``row`` has ({} for a part without them)."""
    if partition_problem(row):
        return {}
    return MODES_BY_MODEL.get(row.model, EIGHT_DIE_MODES)


def split_partition_name(name: str) -> Optional[tuple[str, str]]:
    """(the GPU's name, the mode) for a name that states a compute-partition mode ("MI300X CPX"), else None."""
    found = _MODE.search(name)
    if not found:
        return None
    rest = (name[:found.start()] + " " + name[found.end():]).strip(" -_/,")
    return " ".join(rest.split()), found.group(1).upper()


def partition_problem(row) -> Optional[str]:
    """Why ``row`` cannot be split into compute partitions, or None."""
    if row.vendor == "amd" and row.architecture in PARTITIONING_ARCHITECTURES:
        return None
    return (f"{row.name} has no compute partitions (SPX/DPX/TPX/QPX/CPX are modes of AMD Instinct MI300-series "
            "GPUs and later)")


def partition_count(row, sm_count: Optional[int]) -> Optional[int]:
    """How many compute partitions ``row`` is split into when one of its devices reports ``sm_count``
    compute units, or None when the device is the whole part (or not an AMD part that partitions)."""
    if partition_problem(row) or not sm_count or sm_count >= row.sm_count:
        return None
    count = row.sm_count / sm_count
    split_counts = set(partition_modes(row).values()) - {1}
    return int(round(count)) if round(count) in split_counts and abs(count - round(count)) < 0.01 else None


def partition_spec(row, count: int):
    """The row of one of ``count`` compute partitions of ``row`` (a GpuSpec)."""
    share = 1.0 / count
    mode = next(mode for mode, devices in partition_modes(row).items() if devices == count)
    return slice_row(
        row, f"{row.name} {mode}", share,
        source=(f"{mode} compute partition of {row.name}: 1/{count} of its compute units, memory and bandwidth "
                f"(AMD's Instinct GPU partitioning documentation); whole GPU: {row.source}"),
        extra={"partition_of": row.name, "partition_mode": mode},
        sm_count=row.sm_count // count, memory_gb=row.memory_gb * share,
        memory_bandwidth_gbps=row.memory_bandwidth_gbps * share)
