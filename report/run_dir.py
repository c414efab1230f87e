"""Load one run directory: ``idle.jsonl`` (required), ``plan.jsonl``, ``metrics.jsonl``, ``config.yaml``.

The runtime and the simulator write the same files, so the report works on both.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
import os
from pathlib import Path
from typing import Any, Optional

import yaml

from geodiloco.common.gpu_counts import GPU_COUNT
from geodiloco.report.errors import ReportError
from geodiloco.report.jsonl import read_jsonl
from geodiloco.report.records import MetricRow, NodeRound, PlanRound, printable

IDLE_LOG = "idle.jsonl"
PLAN_LOG = "plan.jsonl"
METRICS_LOG = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
MEMBERSHIP_LOG = "membership.jsonl"
DRILL_LOG = "drill.jsonl"
"""``geodiloco run --drill`` events: read as membership events (``"event": "drill"``), since a restart that
leaves the members as they were shows nowhere else."""


def expand_gpu_names(names: list[str]) -> list[str]:
    """``["4 x A30"]`` -> four ``"A30"``: the cluster config's shorthand, also accepted in logs."""
    expanded: list[str] = []
    for name in names:
        match = GPU_COUNT.match(name)
        expanded.extend([match.group(2)] * int(match.group(1)) if match else [name])
    return expanded


@dataclass
class RunLogs:
    """Everything the report knows about one run, as read from its directory."""

    run_dir: Path
    run_id: str
    records: list[NodeRound]
    plans: list[PlanRound] = field(default_factory=list)
    metrics: list[MetricRow] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    membership: list[dict[str, Any]] = field(default_factory=list)
    """``membership.jsonl``'s events (elastic runs: who left or rejoined, and when) and the run's drill events,
    as plain rows in time order."""
    part_dirs: list[Path] = field(default_factory=list)
    """The sites' run directories this run's logs were joined from (``merge_parts``); empty for one directory."""

    @property
    def where(self) -> str:
        """The run directory, or the joined ones."""
        return " + ".join(map(str, self.part_dirs)) if self.part_dirs else str(self.run_dir)

    @property
    def running_launcher(self) -> Optional[int]:
        """The pid of the ``geodiloco run`` still training into this directory, else None (a finished or stopped
        run, or sites started by hand, which hold no launcher lock)."""
        return None if self.part_dirs else running_launcher(self.run_dir)

    @property
    def name(self) -> str:
        """The run's name from ``config.yaml`` (``run.name``), else the directory name."""
        run_section = self.config.get("run")
        if isinstance(run_section, dict) and run_section.get("name"):
            return str(run_section["name"])
        return self.run_dir.name

    @property
    def policy(self) -> str:
        """The balancing policy named by the records (several joined by '+')."""
        policies = sorted({record.policy for record in self.records})
        return "+".join(policies)

    def config_gpus(self) -> dict[str, list[str]]:
        """GPU names per node from ``config.yaml`` (``nodes[].name``/``gpus``), for logs that lack them."""
        nodes = self.config.get("nodes")
        if not isinstance(nodes, list):
            return {}
        return {str(node["name"]): expand_gpu_names(_as_names(node.get("gpus")))
                for node in nodes if isinstance(node, dict) and "name" in node}


def _as_names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [str(item) for item in value] if isinstance(value, list) else []


def _read_config(path: Path, warnings: list[str]) -> dict[str, Any]:
    if not path.exists():
        return {}
    if not path.is_file():
        warnings.append(f"{path.name}: not a file; labels come from idle.jsonl")
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        warnings.append(f"{path.name}: unreadable ({type(err).__name__}); labels come from idle.jsonl")
        return {}
    if not isinstance(data, dict):
        warnings.append(f"{path.name}: not a mapping of sections (a {type(data).__name__}); labels come from idle.jsonl")
        return {}
    return _printable_strings(data)


def _printable_strings(value: Any) -> Any:
    """The config's strings without control characters (they label the report: run name, nodes, GPUs)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_printable_strings(key): _printable_strings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_printable_strings(item) for item in value]
    return value


def _optional_log(path: Path, schema, warnings: list[str]) -> list:
    """The lines of an optional log; one that exists but is not a file is said, not silently skipped."""
    if path.is_file():
        return read_jsonl(path, schema, warnings)
    if path.exists():
        warnings.append(f"{path.name}: not a file; left out of the report")
    return []


def _missing_node_rounds(records: list[NodeRound]) -> list[str]:
    """Rounds of a synchronous run without a record of a node that took part in them (its ``present_nodes``, else
    every node of the run): the run stopped mid-round, or a line was lost. Async nodes log their own phases."""
    if any(record.mode == "async" for record in records):
        return []
    everyone = {record.node for record in records}
    by_round: dict[int, list[NodeRound]] = {}
    for record in records:
        by_round.setdefault(record.round, []).append(record)
    missing: dict[str, list[int]] = {}
    for round_index, group in sorted(by_round.items()):
        present = {name for record in group for name in record.present_nodes} or everyone
        for name in sorted(present - {record.node for record in group}):
            missing.setdefault(name, []).append(round_index)
    return [f"node {name} has no record of round{'s' if len(rounds) > 1 else ''} {', '.join(map(str, rounds))} "
            f"({MISSING_CAUSES}); its totals leave them out" for name, rounds in missing.items()]


MISSING_CAUSES = ("the run stopped mid-round, a line was lost, or another site's run directory holds it: give every "
                  "site's directory of the run to the report, which joins them")


def merge_parts(parts: list[RunLogs]) -> RunLogs:
    """One run's logs from the run directories of several sites (one ``run_id``): the sites' coordinators each
    logged the rounds they led (an elastic run whose first coordinator failed goes on logging at another
    site). A node-round, plan or metrics row logged at two sites is kept once: the record that ends later (a
    resumed coordinator logs the saved round again from its checkpoint), the first plan or metrics row."""
    records: dict[tuple[int, str], NodeRound] = {}
    for part in parts:
        for record in part.records:
            kept = records.get((record.round, record.node))
            if kept is None or record.round_end > kept.round_end:
                records[(record.round, record.node)] = record
    plans = list({plan.round: plan for part in reversed(parts) for plan in part.plans}.values())
    metrics = list({(row.round, row.node): row for part in reversed(parts) for row in part.metrics}.values())
    warnings = [f"{part.run_dir}: {warning}" for part in parts for warning in part.warnings
                if MISSING_CAUSES not in warning]
    warnings.insert(0, f"{len(parts)} directories hold one run (run_id {parts[0].run_id}): joined into one report "
                       f"({', '.join(str(part.run_dir) for part in parts)})")
    merged = sorted(records.values(), key=lambda record: (record.round, record.node))
    return RunLogs(run_dir=parts[0].run_dir, run_id=parts[0].run_id, records=merged,
                   plans=sorted(plans, key=lambda plan: plan.round),
                   metrics=sorted(metrics, key=lambda row: row.round),
                   config=next((part.config for part in parts if part.config), {}),
                   warnings=warnings + _missing_node_rounds(merged), part_dirs=[part.run_dir for part in parts],
                   membership=sorted((event for part in parts for event in part.membership),
                                     key=lambda event: event.get("time") or 0.0))


def _single_run_id(records: list[NodeRound], path: Path) -> str:
    counts = Counter(record.run_id for record in records)
    if len(counts) > 1:
        listed = ", ".join(f"{run_id!r} ({count} records)" for run_id, count in counts.most_common())
        raise ReportError(f"{path}: records of {len(counts)} runs mixed in one log: {listed}; "
                          "give each run its own directory")
    return next(iter(counts))


def _check_unique_rounds(records: list[NodeRound], path: Path) -> None:
    seen: set[tuple[int, str]] = set()
    for record in records:
        key = (record.round, record.node)
        if key in seen:
            raise ReportError(f"{path}: two records for node {record.node!r} in round {record.round}; "
                              "was the log appended to by a second run with the same run_id?")
        seen.add(key)


def _check_metrics_run(metrics: list[MetricRow], run_id: str, path: Path) -> None:
    others = sorted({row.run_id for row in metrics if row.run_id is not None and row.run_id != run_id})
    if others:
        raise ReportError(f"{path}: metrics of run(s) {', '.join(map(repr, others))} mixed with run {run_id!r} "
                          "of idle.jsonl; give each run its own directory")


LAUNCHER_LOCK = ".launcher.lock"
"""Where ``geodiloco run`` writes ``pid N`` and holds a lock while it runs (runtime/launch.py ``hold_run_dir``)."""


def running_launcher(run_dir: Path) -> Optional[int]:
    """The pid written in ``run_dir``'s launcher lock when that process is alive and is a geodiloco launcher (the
    file stays after the run; the pid is read, not locked, so a report never gets in a launcher's way)."""
    try:
        text = (run_dir / LAUNCHER_LOCK).read_text().split()
        pid = int(text[1]) if len(text) == 2 and text[0] == "pid" else None
        command = Path(f"/proc/{pid}/cmdline").read_bytes() if pid else b""
    except (OSError, ValueError):
        return None
    if pid == os.getpid():
        return None  # the launcher reporting its own run at its end: that run has finished
    return pid if b"geodiloco" in command else None


def load_run(run_dir: str | Path) -> RunLogs:
    """Read and check one run directory; raise ReportError with a one-line reason if it is unusable."""
    directory = Path(run_dir)
    if not directory.exists():
        raise ReportError(f"{directory}: no such directory; pass the run directory written by "
                          "`geodiloco run` or `geodiloco simulate`")
    if not directory.is_dir():
        raise ReportError(f"{directory}: not a directory; pass the run directory that holds {IDLE_LOG}")
    idle_path = directory / IDLE_LOG
    if not idle_path.is_file():
        raise ReportError(f"{directory}: no {IDLE_LOG} here; is this a run directory? "
                          "(the run may have stopped before its first outer sync)")
    warnings: list[str] = []
    records = read_jsonl(idle_path, NodeRound, warnings)
    if not records:
        raise ReportError(f"{idle_path}: no complete record; the run wrote no finished round")
    run_id = _single_run_id(records, idle_path)
    _check_unique_rounds(records, idle_path)
    plans = _optional_log(directory / PLAN_LOG, PlanRound, warnings)
    metrics_path = directory / METRICS_LOG
    metrics = _optional_log(metrics_path, MetricRow, warnings)
    _check_metrics_run(metrics, run_id, metrics_path)
    config = _read_config(directory / CONFIG_FILE, warnings)
    records.sort(key=lambda record: (record.round, record.node))
    warnings += _missing_node_rounds(records)
    membership = _membership_events(directory / MEMBERSHIP_LOG, warnings)
    drills = [{**row, "event": "drill"} for row in _membership_events(directory / DRILL_LOG, warnings)]
    return RunLogs(run_dir=directory, run_id=run_id, records=records, plans=plans,
                   metrics=metrics, config=config, warnings=warnings,
                   membership=sorted(membership + drills, key=lambda event: event.get("time") or 0.0))


def _membership_events(path: Path, warnings: list[str]) -> list[dict[str, Any]]:
    """The rows of ``membership.jsonl`` that are JSON objects; an unreadable line is warned about and skipped."""
    if not path.is_file():
        return []
    import json
    events = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            warnings.append(f"{path.name} line {number}: not JSON; skipped")
            continue
        if isinstance(row, dict):
            events.append(row)
    return events
