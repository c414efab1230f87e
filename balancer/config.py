"""The ``balancing:`` section of a run config: which policy, with its options."""
from __future__ import annotations

from typing import Literal

from predictor.schema import StrictModel

PolicyName = Literal[
    "uniform", "batch_by_flops", "max_batch_by_memory", "steps_by_flops",
    "time", "hybrid", "adaptive", "deadline",
]


class BalancingConfig(StrictModel):
    """``policy`` picks the balancing rule; see README 'Balancing policies'."""

    policy: PolicyName = "uniform"
