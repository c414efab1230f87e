"""Load, check and summarize several run directories with one price table: what the CLI and scripts call."""
from __future__ import annotations

from pathlib import Path

from geodiloco.report.pricing import parse_prices
from geodiloco.report.run_dir import RunLogs, load_run, merge_parts
from geodiloco.report.errors import ReportError
from geodiloco.report.summary import RunSummary, run_gpu_names, summarize


def unique_labels(runs: list[RunLogs]) -> list[str]:
    """Run names; where two runs share one, name/policy, then the directory name, then a number."""
    labels = [logs.name for logs in runs]
    for candidate in ([f"{logs.name}/{logs.policy}" for logs in runs], [logs.run_dir.name for logs in runs]):
        if len(set(labels)) == len(labels):
            break
        labels = candidate
    if len(set(labels)) < len(labels):
        labels = [f"{label}#{index + 1}" for index, label in enumerate(labels)]
    return labels


def joined_by_run_id(runs: list[RunLogs]) -> list[RunLogs]:
    """Directories of one run (the same ``run_id``: each site's, across sites) joined into one, in the order the
    run was first named; different runs stay apart."""
    by_id: dict[str, list[RunLogs]] = {}
    for logs in runs:
        by_id.setdefault(logs.run_id, []).append(logs)
    return [parts[0] if len(parts) == 1 else merge_parts(parts) for parts in by_id.values()]


def summarize_runs(run_dirs: list[str], price_specs: list[str], skip_rounds: int = 0) -> list[RunSummary]:
    """One summary per run directory; raises ReportError with a one-line reason on bad input."""
    seen: dict[Path, str] = {}
    for run_dir in run_dirs:
        resolved = Path(run_dir).resolve()
        if resolved in seen:
            raise ReportError(f"{run_dir}: the same run directory as {seen[resolved]}; name each run once")
        seen[resolved] = run_dir
    runs = joined_by_run_id([load_run(run_dir) for run_dir in run_dirs])
    prices = parse_prices(price_specs)
    if prices:
        prices.check_known({gpu for logs in runs for gpu in run_gpu_names(logs)},
                           {record.node for logs in runs for record in logs.records})
    return [summarize(logs, skip_rounds=skip_rounds, prices=prices or None, label=label)
            for logs, label in zip(runs, unique_labels(runs))]
