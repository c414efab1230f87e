"""GPUs the datasheet table does not know stay usable: probe them, or plan with a stand-in until measured.

Order, for a name the table cannot resolve:
1. rows a user added (``--gpu-file``, ``gpu_files:`` in a config, ``$GEODILOCO_GPU_FILES``)
   are already in the table, so they win;
2. a GPU of that name on this machine is probed (predictor/probe.py, a few seconds, cached);
3. otherwise the node is planned like a stand-in part (``STAND_IN_GPU``) until its own
   measured steps calibrate it (balancer calibration, from the first round on).
Each fallback prints one notice per name, never an error.

Nodes of one run must plan alike, yet each knows only its own machine: the node with an unknown
GPU probes it, the others would plan it as the stand-in. So at start-up every node sends the rows
it plans its own GPUs with (``own_rows``) and plans every other node's GPUs from that node's rows
(``adopt_rows``), whatever its own table holds.
"""
from __future__ import annotations

import dataclasses
import logging

from geodiloco.common.schema import ConfigError
from geodiloco.predictor.specs import GpuFilesError, GpuSpec, lookup_gpu

log = logging.getLogger("geodiloco.predictor")

STAND_IN_GPU = "L4"
"""The part an unknown GPU is planned as before any measurement: a mid-range current data-center GPU
(24 GB, ~120 dense BF16 TFLOPS, 300 GB/s). Calibration corrects its speed after one round; its memory
bounds the batch, so add a row or probe on the node for a large-memory part."""

_resolved: dict[str, GpuSpec] = {}
_adopted: dict[str, GpuSpec] = {}
"""Rows other nodes of the run plan their GPUs with (``adopt_rows``); they win over this machine's."""
_adopted_from: list[tuple[str, dict]] = []
"""What ``adopt_rows`` was given, (node, rows) in order, to pass on to a node that joins later."""


def device_spec(name: str) -> GpuSpec:
    """The row the run's node with this GPU plans it with (``adopt_rows``), else the datasheet row of
    ``name``, else a probe of this machine's GPU of that name, else a stand-in."""
    return _adopted[name] if name in _adopted else _own_spec(name)


def _own_spec(name: str) -> GpuSpec:
    """This machine's resolution of ``name``: its table (with its user rows), a probe, or the stand-in."""
    try:
        return lookup_gpu(name)
    except GpuFilesError:
        raise
    except ConfigError as err:
        reason = why_unresolved(name, str(err))
    if name not in _resolved:
        _resolved[name] = _probe_or_stand_in(name, reason)
    return _resolved[name]


def why_unresolved(name: str, message: str) -> str:
    """The useful part of a lookup error: what was close for an unknown name ("closest known: ..."), the
    whole message for a name that resolved but cannot be (a MIG profile the GPU does not have)."""
    if message.startswith("unknown GPU") and ";" in message:
        return message.split(";")[1].strip()
    return message.removeprefix(f"GPU {name!r}: ")


def _probe_or_stand_in(name: str, reason: str) -> GpuSpec:
    from geodiloco.predictor.probe import probe_local_gpu
    try:
        probed = probe_local_gpu(name)
    except Exception as err:  # a failing probe must not stop planning: fall through to the stand-in
        log.warning("GPU %r: the probe on this machine failed (%s); using a stand-in", name, err)
        probed = None
    if probed is not None:
        log.warning("GPU %r is not in the table: planned from a probe of this machine's GPU "
                    "(%.0f TFLOPS bf16, %.0f GB/s); save it with `geodiloco predict --probe --write-row FILE`",
                    name, probed.bf16_tflops or probed.fp32_tflops, probed.memory_bandwidth_gbps)
        return dataclasses.replace(probed, name=name)
    stand_in = lookup_gpu(STAND_IN_GPU)
    log.warning("GPU %r is not in the table (%s): planned like an %s until its node's measured steps "
                "calibrate it; for a better first plan add a row (docs/predictor.md) or run "
                "`geodiloco predict --probe --write-row FILE` on that machine", name, reason or "no match",
                STAND_IN_GPU)
    return dataclasses.replace(stand_in, name=name, aliases=(), default_for_model=False,
                               source=f"stand-in: planned like {STAND_IN_GPU} ({stand_in.source}) until measured")


def own_rows(gpu_names: list[str]) -> dict[str, dict]:
    """The rows this machine plans ``gpu_names`` (its own node's GPUs) with, as plain values for the
    other nodes: a datasheet row, a user's row, a probe of this machine or a stand-in (never a row
    adopted from another node)."""
    return {name: _plain_values(_own_spec(name)) for name in dict.fromkeys(gpu_names)}


def adopt_rows(rows_by_node: list[tuple[str, dict]]) -> list[str]:
    """Plan each GPU name from the first node (in the given (node, rows) order) that sent a row for it,
    in place of this machine's own resolution. Returns one line per name whose row differs from what
    this machine would have planned (another node probed it, or has a user row for it)."""
    return list(_adopt(rows_by_node).values())


def adopt_more_rows(rows_by_node: list[tuple[str, dict]]) -> list[str]:
    """Add the rows of nodes that joined later, after those already adopted (a name keeps the row it
    was adopted with). Returns the lines ``adopt_rows`` would for the names new to this process."""
    before = set(_adopted)
    changed = _adopt(adopted_rows() + list(rows_by_node))
    return [line for name, line in changed.items() if name not in before]


def _adopt(rows_by_node: list[tuple[str, dict]]) -> dict[str, str]:
    """Adopt ``rows_by_node`` afresh; {name: line} for each name planned differently from this machine."""
    _adopted.clear()
    _adopted_from[:] = [(label, dict(rows)) for label, rows in rows_by_node]
    changed = {}
    for label, rows in rows_by_node:
        for name, values in rows.items():
            if name in _adopted:
                continue
            spec = _spec_from_values(values)
            own = _resolved.get(name) or _table_row(name)
            _adopted[name] = spec
            if own is None or _plain_values(own) != _plain_values(spec):
                changed[name] = f"GPU {name!r}: planned from node {label}'s row ({spec.source})"
    return changed


def adopted_rows() -> list[tuple[str, dict]]:
    """(node, rows) this process plans from, as ``adopt_rows`` took them: what a node that joins the run
    later needs to plan like its peers."""
    return list(_adopted_from)


def forget_adopted_rows() -> None:
    """Back to this machine's own resolutions (a new run in the same process, tests)."""
    _adopted.clear()
    _adopted_from.clear()


def _table_row(name: str) -> GpuSpec | None:
    try:
        return lookup_gpu(name)
    except GpuFilesError:
        raise
    except ConfigError:
        return None


def _plain_values(spec: GpuSpec) -> dict:
    values = dataclasses.asdict(spec)
    values["aliases"] = list(spec.aliases)
    values["bandwidth_curve"] = [list(point) for point in spec.bandwidth_curve]
    return values


def _spec_from_values(values: dict) -> GpuSpec:
    known = {item.name for item in dataclasses.fields(GpuSpec)}
    fields = {key: value for key, value in values.items() if key in known}
    fields["aliases"] = tuple(fields.get("aliases") or ())
    fields["bandwidth_curve"] = tuple(tuple(point) for point in fields.get("bandwidth_curve") or ())
    return GpuSpec(**fields)
