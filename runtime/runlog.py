"""The run directory's JSON Lines logs, written by the coordinator (rank 0).

``metrics.jsonl`` (loss, lr, tokens per node and round; eval loss of the global
model), ``idle.jsonl`` (balancer.records.IdleRecord), ``plan.jsonl`` (one Plan per
round) and ``config.yaml`` (the resolved config). Each line is flushed when
written, so a crash loses at most the line in flight.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from geodiloco.runtime.checkpoint import temp_beside

if TYPE_CHECKING:
    from geodiloco.runtime.metrics_sinks import MetricSinks


class RunLog:
    """``sinks``: TensorBoard / W&B writers that receive every row as it is logged."""

    def __init__(self, run_dir: Path, sinks: Optional["MetricSinks"] = None) -> None:
        self.run_dir = run_dir
        self.sinks = sinks
        run_dir.mkdir(parents=True, exist_ok=True)

    def write_config(self, config_yaml: str) -> None:
        (self.run_dir / "config.yaml").write_text(config_yaml)

    def append(self, log_name: str, rows: Iterable[dict]) -> None:
        rows = list(rows)
        with open(self.run_dir / log_name, "a", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, sort_keys=True) + "\n")
            handle.flush()
        if self.sinks is not None:
            self.sinks.rows(log_name, rows)

    def close(self) -> None:
        if self.sinks is not None:
            self.sinks.close()

    def logged_keys(self, log_name: str) -> set[tuple[int, str]]:
        """(round, node) of every row of ``log_name`` (rows without both are left out)."""
        return {(row["round"], row["node"]) for _, row in self._rows(log_name)
                if isinstance(row, dict) and "round" in row and "node" in row}

    def rows(self, log_name: str) -> list[dict]:
        """The readable rows of ``log_name`` that are JSON objects."""
        return [row for _, row in self._rows(log_name) if isinstance(row, dict)]

    def _rows(self, log_name: str) -> Iterable[tuple[str, Any]]:
        """(line, parsed row) of every readable line of ``log_name`` (none when it does not exist)."""
        path = self.run_dir / log_name
        for line in path.read_text().splitlines() if path.is_file() else []:
            try:
                yield line, json.loads(line)
            except json.JSONDecodeError:
                continue

    def drop_rounds_from(self, log_name: str, first_dropped_round: int) -> None:
        """Remove rows of rounds >= ``first_dropped_round`` (they are redone after a resume). The file is
        replaced atomically, so a process killed meanwhile leaves the old log, not an empty one."""
        self.drop_rows(log_name, lambda row: row.get("round", -1) >= first_dropped_round)

    def drop_rows(self, log_name: str, dropped: Callable[[dict], bool]) -> None:
        """Remove the rows for which ``dropped`` is true (an async resume redoes each node's phases after its
        own). Replaced atomically, as ``drop_rounds_from``; lines that are not JSON objects are kept."""
        path = self.run_dir / log_name
        if not path.is_file():
            return
        kept = [line for line, row in self._rows(log_name) if not (isinstance(row, dict) and dropped(row))]
        with temp_beside(path, str(os.getpid())) as temp_path:
            temp_path.write_text("".join(line + "\n" for line in kept))
            os.replace(temp_path, path)
