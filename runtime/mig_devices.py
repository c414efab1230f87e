"""One MIG instance per rank: a node whose GPUs are several MIG instances trains one rank on each.

A CUDA process enumerates only the first MIG instance listed in ``CUDA_VISIBLE_DEVICES`` (NVIDIA
Multi-Instance GPU User Guide, "Device Enumeration"), so torchrun's ranks, which all inherit the
same list, would all train on that one instance. Before CUDA starts, each rank keeps only the entry
at its ``LOCAL_RANK`` and then uses ``cuda:0``. MIG instances have no peer-to-peer path, and NCCL
refuses two ranks on one physical GPU, so a pinned rank runs its collectives on CUDA tensors
through gloo (host memory), which is also how the predictor models such a node.
"""
from __future__ import annotations

import os
from typing import MutableMapping, Optional

from geodiloco.common.schema import ConfigError

PINNED_ENV = "GEODILOCO_MIG_INSTANCE"
"""Set to the MIG instance (``MIG-<uuid>``) a rank was pinned to; read by ``cuda_backend``."""


def pin_mig_instance(environ: MutableMapping[str, str] = os.environ) -> Optional[str]:
    """Narrow ``CUDA_VISIBLE_DEVICES`` to this rank's MIG instance when it lists several; return it, or None
    when there is nothing to pin (whole GPUs, a single instance, no list). Call before CUDA starts."""
    if environ.get(PINNED_ENV):
        return environ[PINNED_ENV]
    visible = [entry.strip() for entry in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if entry.strip()]
    if len(visible) < 2 or not all(entry.upper().startswith("MIG-") for entry in visible):
        return None
    local_rank = int(environ.get("LOCAL_RANK", "0"))
    if local_rank >= len(visible):
        raise ConfigError(f"local rank {local_rank} has no MIG instance: CUDA_VISIBLE_DEVICES lists {len(visible)} "
                          f"({', '.join(visible)}); start at most {len(visible)} ranks on this node "
                          "(torchrun --nproc-per-node) or list one instance per rank")
    environ["CUDA_VISIBLE_DEVICES"] = visible[local_rank]
    environ[PINNED_ENV] = visible[local_rank]
    return visible[local_rank]


def cuda_device_index(environ: MutableMapping[str, str] = os.environ) -> int:
    """The CUDA device this rank trains on: 0 when pinned to a MIG instance, else its LOCAL_RANK."""
    return 0 if environ.get(PINNED_ENV) else int(environ.get("LOCAL_RANK", "0"))


def cuda_backend(environ: MutableMapping[str, str] = os.environ) -> str:
    """torch.distributed backend for CUDA tensors: gloo on a pinned MIG instance, else nccl."""
    return "gloo" if environ.get(PINNED_ENV) else "nccl"
