"""The step-time model contract shared by the predictor, balancer and runtime.

Every node has one model of its step time as a function of batch size. A cold
model comes from GPU specs; measured steps refine it (``update``). The balancer
only talks to this protocol, so spec models, calibrated models and test doubles
are interchangeable.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class StepTimeModel(Protocol):
    """Per-node model of the time of one optimizer step (all micro-batches)."""

    def predict(self, batch_size: int) -> float:
        """Seconds for one inner step at ``batch_size`` samples (whole node)."""
        ...

    def update(self, batch_size: int, step_time_s: float) -> None:
        """Feed one measured step time (seconds) at ``batch_size``."""
        ...

    def max_batch_size(self) -> int:
        """Largest batch (samples per step, whole node) that fits in memory."""
        ...
