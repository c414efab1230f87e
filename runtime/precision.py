"""The arithmetic of the inner steps: ``model.precision`` turned into autocast and loss scaling.

The planner predicts step times at ``model.precision`` (bf16 by default), so a GPU node must
train at that precision too, or its first round runs at a different speed than planned.
- ``bf16``: forward under ``torch.autocast(bfloat16)``; parameters, gradients and both
  optimizers stay fp32. A GPU without bf16 hardware (before Ampere: Pascal, V100, T4, RTX 20xx;
  ``cuda_has_bf16``) runs fp16 instead, as the predictor models it for such a GPU, with a
  notice. The GPUs of one node agree first (``node_has_bf16``): a node with a 3090 and a V100
  trains both in fp16, since DDP averages the ranks' gradients before any rank could unscale
  its own.
- ``fp16``: forward under ``torch.autocast(float16)`` with a dynamic loss scale
  (``torch.amp.GradScaler``): the loss is scaled before backward, the gradients unscaled
  before clipping, and a step whose gradients overflowed is skipped.
- ``fp32``: no autocast.

On the CPU every node trains fp32 whatever ``model.precision`` says: a CPU node stands in
for a GPU (its step time is padded to the GPU's predicted one at ``model.precision``, see
``runtime.pacing``), and CPU autocast would only make the stand-in slower.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional

import torch

from geodiloco.runtime.plain_collectives import all_gather_values

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TrainingPrecision:
    """How one process runs its inner steps: ``name`` (fp32 | bf16 | fp16, what actually runs),
    the autocast dtype (None: none), the loss scaler (fp16 only) and ``note`` (why ``name``
    differs from ``model.precision``, or empty)."""

    name: str
    device_type: str
    autocast_dtype: Optional[torch.dtype] = None
    scaler: Optional[torch.amp.GradScaler] = None
    note: str = ""

    def autocast(self) -> ContextManager:
        """The context the forward pass (and loss) runs in."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of ``loss``, scaled by the loss scale when there is one."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def step(self, optimizer: torch.optim.Optimizer, clip: Callable[[], Any]) -> bool:
        """Clip (``clip()``, on unscaled gradients) and step ``optimizer``; with a loss scale, a step
        whose gradients hold inf/NaN is skipped and the scale lowered. Returns whether it stepped."""
        if self.scaler is None:
            clip()
            optimizer.step()
            return True
        self.scaler.unscale_(optimizer)
        clip()
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        return self.scaler.get_scale() >= scale_before

    def state_dict(self) -> dict:
        """The loss scale and its growth counter (empty without a scaler), for the node checkpoint."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


def training_precision(requested: str, device: torch.device,
                       bf16_supported: Optional[bool] = None) -> TrainingPrecision:
    """What a process on ``device`` runs for ``model.precision`` = ``requested`` (fp32 | bf16 | fp16).
    ``bf16_supported``: whether every GPU of the node has bf16 (default: ask torch.cuda about this
    one; see ``node_has_bf16``)."""
    if requested not in ("fp32", *AUTOCAST_DTYPES):
        raise ValueError(f"model.precision must be fp32, bf16 or fp16, got {requested!r}")
    if device.type != "cuda":
        note = "" if requested == "fp32" else (
            f"model.precision {requested}: the CPU trains fp32 (it stands in for a GPU; only the "
            f"padded step time follows {requested})")
        return TrainingPrecision("fp32", device.type, note=note)
    if requested == "fp32":
        return TrainingPrecision("fp32", "cuda")
    name, note = requested, ""
    if requested == "bf16":
        has_bf16 = cuda_has_bf16() if bf16_supported is None else bf16_supported
        if not has_bf16:
            name = "fp16"
            note = ("model.precision bf16: a GPU of this node has no bf16, so the node trains fp16 with a dynamic "
                    "loss scale instead")
    scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None
    return TrainingPrecision(name, "cuda", AUTOCAST_DTYPES[name], scaler, note)


def node_has_bf16(device: torch.device, node_group: Optional[object]) -> Optional[bool]:
    """Whether every GPU of this node has bf16 (None on the CPU). Collective over ``node_group``
    (the node's ranks; None: a node of one rank), so every rank of the node gets the same answer."""
    if device.type != "cuda":
        return None
    return node_all(cuda_has_bf16(), node_group)


def cuda_has_bf16() -> bool:
    """Whether this process's GPU computes in bf16 natively: any ROCm GPU, or compute capability 8.0 and
    newer. ``torch.cuda.is_bf16_supported()`` also says yes where bf16 only works emulated (V100, T4,
    RTX 20xx, Pascal), where it runs far slower than the fp16 the predictor plans such a GPU at."""
    if torch.version.hip:
        return True
    return torch.cuda.get_device_capability()[0] >= 8


def node_all(flag: bool, node_group: Optional[object]) -> bool:
    """True when ``flag`` holds on every rank of ``node_group`` (this rank alone when None)."""
    if node_group is None:
        return bool(flag)
    return all(all_gather_values(bool(flag), group=node_group))
