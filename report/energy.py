"""Energy of idle GPU time from the NVML fields of the idle log (joules; kWh for display).

Per node-round the log may carry ``energy_j`` (all the node's GPUs over the
round), ``power_w`` (their mean total power over the round), ``gpu_util`` (mean
percent) and, where the tracker measured it, ``idle_energy_j`` (energy while
idle). Without ``idle_energy_j`` the idle share is estimated at the round's
mean power, which over-estimates it a little (idle GPUs draw less).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

from geodiloco.report.records import NodeRound

JOULES_PER_KWH = 3.6e6
NOT_AVAILABLE = ("not available: the logs carry no gpu_util/power_w/energy_j "
                 "(CPU-only run, or NVML could not be read)")


@dataclass
class EnergyTotals:
    """Energy over a set of node-rounds; None where no record had the data."""

    energy_j: Optional[float] = None
    idle_energy_j: Optional[float] = None
    mean_gpu_util: Optional[float] = None
    mean_power_w: Optional[float] = None
    rounds_with_energy: int = 0
    idle_energy_measured: bool = False

    @property
    def available(self) -> bool:
        return self.rounds_with_energy > 0

    @property
    def energy_kwh(self) -> Optional[float]:
        return None if self.energy_j is None else self.energy_j / JOULES_PER_KWH

    @property
    def idle_energy_kwh(self) -> Optional[float]:
        return None if self.idle_energy_j is None else self.idle_energy_j / JOULES_PER_KWH


def round_energy_j(record: NodeRound) -> Optional[float]:
    """Energy of the whole round: measured ``energy_j``, else mean power x wall time."""
    if record.energy_j is not None:
        return record.energy_j
    if record.power_w is not None:
        return record.power_w * record.wall_s
    return None


def round_idle_energy_j(record: NodeRound) -> Optional[float]:
    """Energy while idle: measured ``idle_energy_j``, else the round's mean power x idle seconds."""
    if record.idle_energy_j is not None:
        return record.idle_energy_j
    if record.power_w is not None:
        return record.power_w * record.idle_s
    if record.energy_j is not None and record.wall_s > 0:
        return record.energy_j * record.idle_s / record.wall_s
    return None


def _weighted_mean(pairs: list[tuple[float, float]]) -> Optional[float]:
    weight_total = sum(weight for _, weight in pairs)
    if not pairs:
        return None
    if weight_total <= 0:
        return sum(value for value, _ in pairs) / len(pairs)
    return sum(value * weight for value, weight in pairs) / weight_total


def energy_totals(records: Iterable[NodeRound]) -> EnergyTotals:
    """Sum energy over records; utilization and power are means weighted by round wall time."""
    totals = EnergyTotals()
    energy_wall_s = 0.0
    utils: list[tuple[float, float]] = []
    powers: list[tuple[float, float]] = []
    for record in records:
        if record.gpu_util is not None:
            utils.append((record.gpu_util, record.wall_s))
        if record.power_w is not None:
            powers.append((record.power_w, record.wall_s))
        energy_j = round_energy_j(record)
        idle_energy_j = round_idle_energy_j(record)
        if energy_j is None or idle_energy_j is None:
            continue
        totals.rounds_with_energy += 1
        energy_wall_s += record.wall_s
        totals.energy_j = (totals.energy_j or 0.0) + energy_j
        totals.idle_energy_j = (totals.idle_energy_j or 0.0) + idle_energy_j
        totals.idle_energy_measured = totals.idle_energy_measured or record.idle_energy_j is not None
    totals.mean_gpu_util = _weighted_mean(utils)
    totals.mean_power_w = _weighted_mean(powers)
    if totals.mean_power_w is None and totals.energy_j is not None and energy_wall_s > 0:
        totals.mean_power_w = totals.energy_j / energy_wall_s
    return totals
