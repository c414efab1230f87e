"""Machine-readable report (``--json``) and the HTML export of the terminal report (``--html``)."""
from __future__ import annotations

import io
import json
import math
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from rich.console import Console, RenderableType

from geodiloco.report.compare import compare
from geodiloco.report.energy import JOULES_PER_KWH
from geodiloco.report.errors import ReportError
from geodiloco.report.summary import RunSummary

SCHEMA_VERSION = 1


def _with_kwh(node: dict[str, Any]) -> dict[str, Any]:
    energy = node["energy"]
    for key in ("energy_j", "idle_energy_j"):
        energy[key.replace("_j", "_kwh")] = None if energy[key] is None else energy[key] / JOULES_PER_KWH
    return node


def summary_dict(summary: RunSummary) -> dict[str, Any]:
    """Everything in the summary but the raw records, plus ``energy_available``."""
    data = {item.name: getattr(summary, item.name) for item in fields(summary) if item.name != "records"}
    data["nodes"] = [_with_kwh(asdict(node)) for node in summary.nodes]
    data["total"] = _with_kwh(asdict(summary.total))
    data["per_round"] = [asdict(row) for row in summary.per_round]
    data["energy_available"] = summary.energy_available
    return data


def report_dict(summaries: list[RunSummary]) -> dict[str, Any]:
    document: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "runs": [summary_dict(s) for s in summaries]}
    if len(summaries) > 1:
        document["comparison"] = [asdict(row) for row in compare(summaries)]
    return document


def finite_or_null(value: Any) -> Any:
    """``value`` with every NaN or infinity replaced by None: JSON has no such numbers, and Python's NaN token
    breaks other readers (JSON.parse, jq)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


def write_json(summaries: list[RunSummary], destination: str) -> str:
    """Write the report as JSON to ``destination`` ('-' = return it for stdout); returns the text."""
    text = json.dumps(finite_or_null(report_dict(summaries)), indent=2, sort_keys=True, allow_nan=False)
    if destination != "-":
        _write(Path(destination), text + "\n", "--json")
    return text


def write_html(renderables: list[RenderableType], destination: str, width: int = 160) -> None:
    """The terminal report with its colors as a standalone HTML page."""
    console = Console(record=True, file=io.StringIO(), width=width, color_system="truecolor", markup=False)
    for renderable in renderables:
        console.print(renderable)
    _write(Path(destination), console.export_html(inline_styles=True), "--html")


def _write(path: Path, text: str, option: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as err:
        raise ReportError(f"{option} {path}: cannot write: {err.strerror}") from None
