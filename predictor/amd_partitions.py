"""AMD Instinct compute partitions: an MI300-series GPU split into 2, 4 or 8 devices that keep its name.

In DPX, QPX or CPX mode an MI300X or MI325X lists 2, 4 or 8 devices, each with its share of the
compute units (152, 76 or 38 of 304) and named like the whole GPU ("AMD Instinct MI300X"), so the
name alone would plan each as a whole GPU. Detection reports each device's compute-unit count, and a
device with a half, quarter or eighth of its row's is planned at that share of the row: its rates,
its memory and its memory bandwidth, since the partitions of a node train together and share the
GPU's memory stacks (AMD Instinct MI300X GPU partitioning overview: SPX/DPX/QPX/CPX compute modes,
NPS1/NPS4 memory modes).
"""
from __future__ import annotations

import re
from typing import Optional

from geodiloco.predictor.slice_rows import slice_row

PARTITION_MODES = {2: "DPX", 4: "QPX", 8: "CPX"}
PARTITIONING_ARCHITECTURES = ("cdna3", "cdna4")
"""Architectures whose parts split into compute partitions (MI300X, MI325X and later)."""

_MODE = re.compile(r"\b(spx|dpx|qpx|cpx)\b", re.IGNORECASE)


def split_partition_name(name: str) -> Optional[tuple[str, int]]:
    """(the GPU's name, partitions) for a name that states a compute-partition mode ("MI300X CPX"), else None."""
    found = _MODE.search(name)
    if not found:
        return None
    mode = found.group(1).upper()
    count = 1 if mode == "SPX" else {value: key for key, value in PARTITION_MODES.items()}[mode]
    rest = (name[:found.start()] + " " + name[found.end():]).strip(" -_/,")
    return " ".join(rest.split()), count


def partition_problem(row) -> Optional[str]:
    """Why ``row`` cannot be split into compute partitions, or None."""
    if row.vendor == "amd" and row.architecture in PARTITIONING_ARCHITECTURES:
        return None
    return (f"{row.name} has no compute partitions (SPX/DPX/QPX/CPX are modes of AMD Instinct MI300-series "
            "GPUs and later)")


def partition_count(row, sm_count: Optional[int]) -> Optional[int]:
    """How many compute partitions ``row`` is split into when one of its devices reports ``sm_count``
    compute units, or None when the device is the whole part (or not an AMD part that partitions)."""
    if partition_problem(row) or not sm_count or sm_count >= row.sm_count:
        return None
    count = row.sm_count / sm_count
    return int(round(count)) if round(count) in PARTITION_MODES and abs(count - round(count)) < 0.01 else None


def partition_spec(row, count: int):
    """The row of one of ``count`` compute partitions of ``row`` (a GpuSpec)."""
    share = 1.0 / count
    mode = PARTITION_MODES[count]
    return slice_row(
        row, f"{row.name} {mode}", share,
        source=(f"{mode} compute partition of {row.name}: 1/{count} of its compute units, memory and bandwidth "
                f"(AMD Instinct MI300X GPU partitioning overview); whole GPU: {row.source}"),
        extra={"partition_of": row.name, "partition_mode": mode},
        sm_count=row.sm_count // count, memory_gb=row.memory_gb * share,
        memory_bandwidth_gbps=row.memory_bandwidth_gbps * share)
