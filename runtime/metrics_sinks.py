"""Live metrics in TensorBoard and Weights & Biases, beside the JSONL logs.

The JSONL logs (runtime/runlog.py) stay the source of truth for ``geodiloco report``; the sinks
here receive the same rows as they are written (once per round) and turn them into scalars
with the round as the step:

- ``node/<name>/``: ``train_loss``, ``lr``, ``tokens_per_s``, ``local_steps``, ``batch_size``,
  ``compute_s``, ``wait_s``, ``exposed_sync_s``, ``idle_s`` (the last three from the idle
  records, which are logged one round late);
- ``global/``: ``eval_loss``, ``tokens`` (of the round, all nodes).

``tensorboard`` and ``wandb`` are optional extras, imported only when configured.
"""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Protocol

NODE_METRIC_FIELDS = {"loss": "train_loss", "lr": "lr", "local_steps": "local_steps",
                      "batch_size": "batch_size", "compute_s": "compute_s"}


class ScalarWriter(Protocol):
    def scalars(self, values: dict[str, float], step: int) -> None: ...
    def close(self) -> None: ...


def metric_scalars(log_name: str, row: dict) -> dict[str, float]:
    """The scalars one JSONL row contributes ({} for rows without any)."""
    if log_name == "metrics.jsonl" and row.get("node") == "global":
        values = {"global/tokens": row.get("tokens")}
        if row.get("eval_loss") is not None:
            values["global/eval_loss"] = row["eval_loss"]
        return {key: float(value) for key, value in values.items() if value is not None}
    if log_name == "metrics.jsonl" and row.get("node"):
        prefix = f"node/{row['node']}/"
        values = {prefix + name: row[key] for key, name in NODE_METRIC_FIELDS.items() if row.get(key) is not None}
        if row.get("compute_s"):
            values[prefix + "tokens_per_s"] = row["tokens"] / row["compute_s"]
        return {key: float(value) for key, value in values.items()}
    if log_name == "idle.jsonl" and row.get("node"):
        prefix = f"node/{row['node']}/"
        idle_s = row.get("wait_s", 0.0) + row.get("comm_s", 0.0) + row.get("overhead_s", 0.0) + row.get("lost_s", 0.0)
        return {prefix + "wait_s": float(row.get("wait_s", 0.0)), prefix + "exposed_sync_s": float(row.get("comm_s", 0.0)),
                prefix + "idle_s": float(idle_s)}
    return {}


class TensorBoardWriter:
    """Event files under ``log_dir`` (one per process: hivemind leaders each log their own node). ``first_round``: the
    round a resumed run starts from; the points the run had logged from it on are purged (those rounds are
    trained again, as the JSONL logs drop their rows), so no round shows twice."""

    def __init__(self, log_dir: Path, first_round: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter
        suffix = f".{socket.gethostname()}.{os.getpid()}"
        self.writer = SummaryWriter(log_dir=str(log_dir), filename_suffix=suffix,
                                    purge_step=first_round if first_round > 0 else None)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbWriter:
    """One W&B run per logging process, grouped by the run's name; ``mode`` offline keeps it local
    (``wandb sync`` uploads it later). A resumed run goes on in the same W&B run (its id is kept in
    ``id_file``), and every chart's x axis is the round (``round``), not W&B's count of log calls."""

    def __init__(self, project: str, run_name: str, run_dir: Path, mode: str, entity: Optional[str],
                 config: dict, id_file: Optional[Path] = None, first_round: int = 0) -> None:
        import wandb
        self.wandb = wandb
        kept_id = id_file.read_text().strip() if id_file is not None and first_round > 0 and id_file.is_file() else None
        self.run = wandb.init(project=project, entity=entity, name=run_name, group=run_name,
                              dir=str(run_dir), mode=os.environ.get("WANDB_MODE", mode), config=config,
                              id=kept_id or None, resume="allow" if kept_id else None)
        if id_file is not None:
            id_file.write_text(self.run.id + "\n")
        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log({**values, "round": step})

    def close(self) -> None:
        self.run.finish()


class MetricSinks:
    """Forwards JSONL rows to the configured writers; a writer that fails is turned off with one
    notice rather than stopping the training."""

    def __init__(self, writers: list[ScalarWriter]) -> None:
        self.writers = writers

    def rows(self, log_name: str, rows: Iterable[dict]) -> None:
        for row in rows:
            values = metric_scalars(log_name, row)
            if values and "round" in row:
                self._write(values, int(row["round"]))

    def _write(self, values: dict[str, float], step: int) -> None:
        for writer in list(self.writers):
            try:
                writer.scalars(values, step)
            except Exception as err:  # a metrics service must never stop training
                print(f"[geodiloco] metrics: {type(writer).__name__} failed ({err}); turned off", file=sys.stderr)
                self.writers.remove(writer)

    def close(self) -> None:
        for writer in self.writers:
            try:
                writer.close()
            except Exception as err:
                print(f"[geodiloco] metrics: closing {type(writer).__name__} failed ({err})", file=sys.stderr)
        self.writers = []


WANDB_ID_FILE = ".wandb_run_id"


def build_sinks(logging: Any, run_name: str, run_dir: Path, config: dict, first_round: int = 0,
                writer_name: str = "run") -> Optional[MetricSinks]:
    """The sinks of the config's ``logging`` section, or None when none is configured. ``first_round``: where a
    resumed run starts (0 for a new one); ``writer_name``: which logging process this is (the coordinator, or a
    hivemind node's leader), so each resumes its own W&B run."""
    writers: list[ScalarWriter] = []
    if logging.tensorboard:
        _start_writer(writers, "TensorBoard",
                      lambda: TensorBoardWriter(Path(logging.tensorboard) / run_name, first_round))
    if logging.wandb is not None:
        wandb = logging.wandb
        id_file = run_dir / f"{WANDB_ID_FILE}.{writer_name}"
        _start_writer(writers, "W&B", lambda: WandbWriter(wandb.project, run_name, run_dir, wandb.mode, wandb.entity,
                                                         config, id_file, first_round),
                      hint="log in (wandb login), set WANDB_API_KEY, or set logging.wandb.mode: offline")
    return MetricSinks(writers) if writers else None


def _start_writer(writers: list, service: str, start: Callable[[], ScalarWriter], hint: str = "") -> None:
    """Append the writer ``start`` makes; a service that cannot start (no API key, no network) is left out
    with one notice, since metrics must never stop training."""
    try:
        writers.append(start())
    except Exception as err:
        detail = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
        print(f"[geodiloco] metrics: {service} could not start ({detail}); training goes on without it"
              + (f" ({hint})" if hint else ""), file=sys.stderr, flush=True)
