"""The row of a slice of a GPU (a MIG instance, a vGPU, an AMD compute partition): the GPU's row with every
dense rate scaled by the slice's share of the compute, and named for the slice.

A slice is not a table row: it has no aliases, model or form factor of its own (so no name resolves to it
by the table's rules), and no MIG of its own. The callers set its memory, bandwidth and links.
"""
from __future__ import annotations

import dataclasses

RATE_COLUMNS = ("fp32_tflops", "tf32_tflops", "fp16_tflops", "fp16_fp32acc_tflops", "bf16_tflops", "fp8_tflops")


def slice_row(parent, name: str, compute_share: float, source: str, extra: dict, **fields):
    """``parent`` (a GpuSpec) with its rates times ``compute_share``, called ``name``; ``fields`` override
    the rest (memory_gb, memory_bandwidth_gbps, sm_count, peer_link, ...)."""
    rates = {column: None if getattr(parent, column) is None else getattr(parent, column) * compute_share
             for column in RATE_COLUMNS}
    return dataclasses.replace(parent, **{
        **rates, "name": name, "aliases": (), "model": None, "form_factor": None, "default_for_model": False,
        "mig_instances": None, "mig_sms_per_slice": None, "source": source, "extra": {**parent.extra, **extra},
        **fields})
