"""Read one kept run (idle.jsonl, metrics.jsonl, config.yaml) into the numbers the tables need.

Per-node idle comes from the project's own report (`geodiloco report --json`), so
the figures here are the ones a user of the report sees; ``warm_report`` leaves out
round 0, the one round every policy plans from the predictor alone. Loss curves come from
metrics.jsonl (``node: "global"`` rows: eval loss of the averaged model after
each outer sync, ``wall_s`` in unix seconds). Emulation fidelity compares each
node's measured local phase with the time its virtual GPU was set to take.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from geodiloco.runtime.config import load_config
from geodiloco.lab.virtual_gpu import StepPacer


@dataclass
class EvalCurve:
    """Eval loss after each outer round, against seconds since the run started and tokens so far."""

    rounds: np.ndarray
    wall_s: np.ndarray
    tokens: np.ndarray
    samples: np.ndarray
    eval_loss: np.ndarray

    def loss_at(self, axis: str, value: float) -> float:
        """Eval loss linearly interpolated at ``value`` of ``axis`` (``wall_s`` or ``tokens``); NaN outside."""
        xs = getattr(self, axis)
        if len(xs) == 0 or value < xs[0] - 1e-9 or value > xs[-1] + 1e-9:
            return float("nan")
        return float(np.interp(value, xs, self.eval_loss))


@dataclass
class RunData:
    """One policy's run: the report's summary, per-round records, the loss curve and emulation fidelity."""

    name: str
    policy: str
    scenario: str
    report: dict
    warm_report: dict
    records: list[dict]
    curve: EvalCurve
    target_compute_s: dict = field(default_factory=dict)

    @property
    def nodes(self) -> list[str]:
        return [node["node"] for node in self.report["nodes"]]

    @property
    def rounds(self) -> int:
        return len(self.report["rounds"])

    def node(self, name: str) -> dict:
        return next(node for node in self.report["nodes"] if node["node"] == name)

    def round_records(self, first: int = 0, last: int | None = None) -> list[dict]:
        return [record for record in self.records
                if record["round"] >= first and (last is None or record["round"] <= last)]


def read_jsonl(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows


def report_json(run_dir: Path, root: Path, skip_rounds: int = 0) -> dict:
    """The run's entry of `geodiloco report RUN_DIR --json --skip-rounds N`."""
    command = [sys.executable, "-m", "geodiloco.runtime.cli", "report", str(run_dir), "--json", "--skip-rounds", str(skip_rounds)]
    completed = subprocess.run(command, cwd=root, capture_output=True, text=True, check=True)
    return json.loads(completed.stdout)["runs"][0]


def eval_curve(metrics: list[dict], start_s: float, seq_len: int) -> EvalCurve:
    rows = sorted((row for row in metrics if row.get("node") == "global" and row.get("eval_loss") is not None),
                  key=lambda row: row["round"])
    tokens = np.cumsum([row["tokens"] for row in rows]).astype(float)
    return EvalCurve(rounds=np.array([row["round"] for row in rows]),
                     wall_s=np.array([row["wall_s"] - start_s for row in rows]),
                     tokens=tokens, samples=tokens / seq_len,
                     eval_loss=np.array([row["eval_loss"] for row in rows]))


def target_compute(config_path: Path, records: list[dict]) -> dict:
    """Seconds each node's local phases were emulated to take: steps run x the virtual GPU's step time."""
    config = load_config(config_path)
    dims = config.model.dims()
    totals: dict = {}
    for index, node in enumerate(config.nodes):
        pacer = StepPacer(node, index, config.diloco.batch_size, config.run.seed, dims,
                          config.model.seq_len, config.model.precision)
        totals[node.name] = sum(record["local_steps"] * pacer.nominal_step_s(record["round"], record["batch_size"])
                                for record in records if record["node"] == node.name)
    return totals


def load_run(run_dir: Path, config_path: Path, root: Path) -> RunData:
    """``config_path``: the config the run was started with (the run directory's config.yaml
    is the runtime's full dump, which a newer runtime may not read back)."""
    records = read_jsonl(run_dir / "idle.jsonl")
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    config = load_config(config_path)
    start_s = min(record["round_start"] for record in records)
    report = report_json(run_dir, root)
    scenario = run_dir.name.partition("-")[0]
    return RunData(name=run_dir.name, policy=report["policy"], scenario=scenario, report=report,
                   warm_report=report_json(run_dir, root, skip_rounds=1), records=records,
                   curve=eval_curve(metrics, start_s, config.model.seq_len),
                   target_compute_s=target_compute(config_path, records))
