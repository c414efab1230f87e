"""Rows for a slice of a GPU that a driver lists as a device of its own.

MIG instances (predictor/mig.py), vGPU profiles (predictor/vgpu.py) and AMD compute partitions
(predictor/amd_partitions.py) are named after the GPU they are cut from. Each is resolved against the
table: its GPU is looked up (``resolve``, the registry's name -> (row, notice)), checked that it can be
split that way, and scaled to the slice. ``siblings`` gives a row's model's rows, so that a GPU name that
fits several rows ("A100") is narrowed by what the slice needs.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

from geodiloco.predictor.amd_partitions import (partition_modes, partition_problem, partition_spec,
                                                split_partition_name)
from geodiloco.predictor.mig import MigProfile, mig_spec, profile_problem, split_mig_name
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.vgpu import (VgpuProfile, split_vgpu_name, time_share_notice, time_sliced_problem,
                                      time_sliced_spec)

Resolved = tuple  # (GpuSpec, notice or None)
Resolver = Callable[[str], Resolved]
Siblings = Callable[[object], list]


class SliceNameError(ConfigError):
    """A name of a MIG instance, vGPU profile or compute partition that its part does not have (or of a part
    that has none): an error to `geodiloco predict`; a plan or run plans it like an unknown GPU, with this reason."""


def resolve_slice(resolve: Resolver, siblings: Siblings, name: str) -> Optional[Resolved]:
    """(row, notice) when ``name`` names a slice of a known GPU; None when it names no slice at all."""
    mig = split_mig_name(name)
    if mig:
        return resolve_mig(resolve, siblings, name, *mig)
    vgpu = split_vgpu_name(name)
    if vgpu:
        return resolve_vgpu(resolve, siblings, name, *vgpu)
    partitioned = split_partition_name(name)
    if partitioned:
        return resolve_partition(resolve, name, *partitioned)
    return None


def resolve_mig(resolve: Resolver, siblings: Siblings, name: str, parent_name: str, profile: MigProfile,
                sm_count: Optional[int] = None) -> Resolved:
    """(row, notice) of a MIG instance (predictor/mig.py). A parent name that fits several rows
    ("A100") is narrowed to the rows the profile fits: "3g.20gb" is half of a 40 GB A100."""
    if not parent_name:
        raise SliceNameError(f"GPU {name!r} names a MIG profile but not its GPU; write the GPU's name before it, "
                          f"as torch prints it (e.g. \"A100-SXM4-40GB MIG {profile.label}\")")
    try:
        parent, notice = resolve(parent_name)
    except ConfigError as err:
        raise SliceNameError(f"GPU {name!r} is a MIG instance of a GPU the table does not know: {err}") from None
    if notice:
        parent, notice = mig_parent_among_siblings(siblings, name, parent_name, parent, profile)
    problem = profile_problem(parent, profile)
    if problem:
        raise SliceNameError(f"GPU {name!r}: {problem}")
    return mig_spec(parent, profile, sm_count), notice


def resolve_vgpu(resolve: Resolver, siblings: Siblings, name: str, board_name: str,
                 profile: VgpuProfile) -> Resolved:
    """(row, notice) of a vGPU (predictor/vgpu.py): a MIG-backed one is its MIG instance, a time-sliced
    one its share of the board, with a notice saying so."""
    if profile.mig:
        spec, notice = resolve_mig(resolve, siblings, name, board_name, profile.mig)
        return dataclasses.replace(spec, name=f"{spec.extra['mig_parent']} vGPU {profile.label}"), notice
    try:
        board, notice = resolve(board_name)
    except ConfigError as err:
        raise SliceNameError(f"GPU {name!r} is a vGPU of a GPU the table does not know: {err}") from None
    problem = time_sliced_problem(board, profile)
    if problem:
        raise SliceNameError(f"GPU {name!r}: {problem}")
    spec = time_sliced_spec(board, profile)
    shared = time_share_notice(name, board.name, spec.extra["vgpu_share"]) if spec.extra["vgpu_share"] < 1 else None
    return spec, "; ".join(filter(None, [notice, shared])) or None


def resolve_partition(resolve: Resolver, name: str, gpu_name: str, mode: str) -> Resolved:
    """(row, notice) of one device of ``gpu_name`` in compute-partition ``mode`` (predictor/amd_partitions.py)."""
    try:
        row, notice = resolve(gpu_name)
    except ConfigError as err:
        raise SliceNameError(f"GPU {name!r} is a compute partition of a GPU the table does not know: {err}") from None
    problem = partition_problem(row)
    if problem:
        raise SliceNameError(f"GPU {name!r}: {problem}")
    modes = partition_modes(row)
    if mode not in modes:
        raise SliceNameError(f"GPU {name!r}: {row.name} has no {mode} mode; its compute-partition modes: "
                          + ", ".join(f"{known} ({count} device{'s' if count > 1 else ''})"
                                      for known, count in modes.items()))
    count = modes[mode]
    return (row if count == 1 else partition_spec(row, count)), notice


def mig_parent_among_siblings(siblings: Siblings, name: str, parent_name: str, parent,
                              profile: MigProfile) -> Resolved:
    """The row of an ambiguous parent name that ``profile`` fits, and a notice unless only one does."""
    fitting = [row for row in siblings(parent) if profile_problem(row, profile) is None]
    if not fitting:
        return parent, None
    chosen = parent if parent in fitting else next((row for row in fitting if row.default_for_model), fitting[0])
    if len(fitting) == 1:
        return chosen, None
    others = ", ".join(row.name for row in fitting if row is not chosen)
    return chosen, (f"GPU {name!r}: {parent_name!r} could be several parts; a {profile.label} instance fits "
                    f"{chosen.name} and {others}; planned as {chosen.name}; write the GPU's full name to choose "
                    f"(e.g. \"{chosen.name} MIG {profile.label}\")")
