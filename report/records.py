"""Schemas of the log lines the report reads, checked with pydantic at the edge.

The report parses JSON itself (it does not import the balancer) so it works on
logs of any version that carries the documented keys; unknown keys are ignored.
Times are seconds; ``round_start``/``round_end`` are unix seconds (or simulated
seconds from the simulator), energy is joules, power watts, utilization percent.
"""
from __future__ import annotations

from typing import Annotated, Optional

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, NonNegativeInt, PositiveInt, field_validator,
                      model_validator)


CONTROL_CHARACTERS = dict.fromkeys([*range(0x20), 0x7F, *range(0x80, 0xA0), 0x200E, 0x200F, *range(0x202A, 0x202F),
                                    *range(0x2066, 0x206A)])
"""C0 and C1 controls (escape sequences) and the bidirectional overrides and isolates (text that reads otherwise
than it is stored)."""


def printable(text: str) -> str:
    """``text`` without control characters: a name in an edited log must not reach the terminal as an escape
    sequence (a window title, a hyperlink, a clipboard write)."""
    return text.translate(CONTROL_CHARACTERS)


class LogLine(BaseModel):
    """A log line: extra keys are allowed so newer writers do not break older reports."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    @field_validator("*", mode="after")
    @classmethod
    def _printable(cls, value):
        if isinstance(value, str):
            return printable(value)
        if isinstance(value, list):
            return [printable(item) if isinstance(item, str) else item for item in value]
        return value


PHASE_SPAN_TOLERANCE = 0.01
PHASE_SPAN_SLACK_S = 0.01
"""How far a node's phases may add up past its round's span: clock rounding, never a second of work."""


class NodeRound(LogLine):
    """One ``idle.jsonl`` line: one node's time in one outer round."""

    run_id: str
    round: NonNegativeInt
    node: str
    site: str
    policy: str
    local_steps: NonNegativeInt
    batch_size: NonNegativeInt
    tokens: NonNegativeInt
    compute_s: NonNegativeFloat
    wait_s: NonNegativeFloat
    comm_s: NonNegativeFloat
    round_start: float
    round_end: float
    overhead_s: NonNegativeFloat = 0.0
    comm_hidden_s: NonNegativeFloat = 0.0
    sync_bytes: NonNegativeInt = 0
    lost_s: NonNegativeFloat = 0.0
    present_nodes: list[str] = Field(default_factory=list)
    gpus: list[str] = Field(default_factory=list)
    num_gpus: PositiveInt = 1
    source: str = "runtime"
    gpu_util: Optional[NonNegativeFloat] = None
    power_w: Optional[NonNegativeFloat] = None
    energy_j: Optional[NonNegativeFloat] = None
    idle_energy_j: Optional[NonNegativeFloat] = None
    staleness: Optional[NonNegativeInt] = None
    """``diloco.mode: async``: global versions applied between the node's pull and its update."""
    mode: str = "sync"

    @model_validator(mode="after")
    def _round_ends_after_start(self) -> "NodeRound":
        if self.round_end < self.round_start:
            raise ValueError(f"round_end ({self.round_end}) is before round_start ({self.round_start})")
        phases_s, span_s = self.compute_s + self.idle_s, self.round_end - self.round_start
        if phases_s > span_s * (1 + PHASE_SPAN_TOLERANCE) + PHASE_SPAN_SLACK_S:
            raise ValueError(f"compute_s + wait_s + comm_s + overhead_s ({phases_s:.3f} s) exceed the round's span "
                             f"round_end - round_start ({span_s:.3f} s): a node's phases fill its round, no more")
        return self

    @property
    def idle_s(self) -> float:
        """GPU idle seconds: waiting for peers + exposed outer sync + other non-compute time
        (``comm_hidden_s``, sync overlapped with compute, is not idle)."""
        return self.wait_s + self.comm_s + self.overhead_s

    @property
    def wall_s(self) -> float:
        return self.round_end - self.round_start

    @property
    def gpu_count(self) -> int:
        """GPUs of the node: ``num_gpus`` when written, else the length of ``gpus`` (at least 1)."""
        if "num_gpus" in self.model_fields_set:
            return self.num_gpus
        return len(self.gpus) or 1


PredictedSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A planner's prediction in seconds: finite and not negative (a hand-edited or damaged plan.jsonl is refused
with file, line and key rather than shown as -49.9 or nan)."""


class PlannedNode(LogLine):
    """One node's entry of a ``plan.jsonl`` line; only the name is required."""

    name: str
    local_steps: Optional[int] = None
    batch_size: Optional[int] = None
    predicted_step_s: Optional[PredictedSeconds] = None
    predicted_compute_s: Optional[PredictedSeconds] = None
    predicted_comm_s: Optional[PredictedSeconds] = None
    predicted_idle_s: Optional[PredictedSeconds] = None


class PlanRound(LogLine):
    """One ``plan.jsonl`` line: the planner's choice and predictions for a round."""

    round: NonNegativeInt
    nodes: list[PlannedNode]
    policy: Optional[str] = None
    predicted_round_s: Optional[PredictedSeconds] = None
    predicted_idle_s: Optional[PredictedSeconds] = None


class MetricRow(LogLine):
    """One ``metrics.jsonl`` line; every field but ``round`` is optional."""

    round: NonNegativeInt
    run_id: Optional[str] = None
    node: Optional[str] = None
    loss: Optional[float] = None
    eval_loss: Optional[float] = None
    tokens: Optional[int] = None
    wall_s: Optional[float] = None
