"""GPUs the datasheet table does not know stay usable: probe them, or plan with a stand-in until measured.

Order, for a name the table cannot resolve:
1. rows a user added (``--gpu-file``, ``gpu_files:`` in a config, ``$GEODILOCO_GPU_FILES``)
   are already in the table, so they win;
2. a GPU of that name on this machine is probed (predictor/probe.py, a few seconds, cached);
3. otherwise the node is planned like a stand-in part (``STAND_IN_GPU``) until its own
   measured steps calibrate it (balancer calibration, from the first round on).
Each fallback prints one notice per name, never an error.
"""
from __future__ import annotations

import dataclasses
import logging

from geodiloco.predictor.schema import ConfigError
from geodiloco.predictor.specs import GpuSpec, lookup_gpu

log = logging.getLogger("geodiloco.predictor")

STAND_IN_GPU = "L4"
"""The part an unknown GPU is planned as before any measurement: a mid-range current data-center GPU
(24 GB, ~120 dense BF16 TFLOPS, 300 GB/s). Calibration corrects its speed after one round; its memory
bounds the batch, so add a row or probe on the node for a large-memory part."""

_resolved: dict[str, GpuSpec] = {}


def device_spec(name: str) -> GpuSpec:
    """The datasheet row of ``name``, else a probe of this machine's GPU of that name, else a stand-in."""
    try:
        return lookup_gpu(name)
    except ConfigError as err:
        reason = _why_unresolved(name, str(err))
    if name not in _resolved:
        _resolved[name] = _probe_or_stand_in(name, reason)
    return _resolved[name]


def _why_unresolved(name: str, message: str) -> str:
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
