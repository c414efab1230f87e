"""Number formatting for tables: few significant digits, units in the column header."""
from __future__ import annotations

from typing import Optional

DASH = "–"


def seconds(value: Optional[float]) -> str:
    if value is None:
        return DASH
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def percent(fraction: Optional[float]) -> str:
    return DASH if fraction is None else f"{fraction * 100:.1f} %"


def signed_percent(fraction: Optional[float]) -> str:
    return DASH if fraction is None else f"{fraction * 100:+.1f} %"


def usd(value: Optional[float]) -> str:
    if value is None:
        return DASH
    if abs(value) < 0.01:
        return f"${value:,.4f}"
    return f"${value:,.3f}" if abs(value) < 1 else f"${value:,.2f}"


def count(value: Optional[float]) -> str:
    """Large counts with a k/M/G suffix (tokens, tokens per hour)."""
    if value is None:
        return DASH
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.2f} {suffix}"
    return f"{value:.0f}"


def number(value: Optional[float], digits: int = 2) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def significant(value: Optional[float], digits: int = 3) -> str:
    """``digits`` significant figures, in plain notation: 0.000148 kWh stays readable where a fixed 4 decimals
    would print 0.0001 for every small run."""
    if value is None:
        return DASH
    if value == 0:
        return "0"
    text = f"{value:.{digits}g}"
    if "e" in text:
        decimals = max(0, digits - 1 - int(f"{value:e}".split("e")[1]))
        text = f"{value:.{decimals}f}"
    return text


def ratio(value: Optional[float]) -> str:
    return DASH if value is None else f"{value:.2f}×"


def gpus(names: list[str], num_gpus: int) -> str:
    """'4× A30', '3× RTX 2080 Ti + 1× TITAN RTX', or '2 GPUs' when unnamed."""
    if not names:
        return f"{num_gpus} GPU" + ("s" if num_gpus != 1 else "")
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return " + ".join(f"{n}× {name}" for name, n in counts.items())
