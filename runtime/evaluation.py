"""Evaluation of the global model off the critical path.

After each outer sync the coordinator copies the new global parameters into a
separate model and computes the held-out loss in a background thread, while
the next local phase runs. So evaluation costs no round time (on a GPU it
shares the device with training; on a CPU the emulation's padding absorbs it).
The ``global`` metrics row of a round is written once its evaluation is done.
It carries ``eval_loss`` (mean per-sequence cross-entropy, nats per token) and
``eval_loss_se`` (its standard error over the sequences), so two runs' eval
losses can be told apart from the noise of a finite eval set.
"""
from __future__ import annotations

import json
import math
import sys
import threading
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F

from geodiloco.runtime.host_threads import with_creators_threads
from geodiloco.runtime.models import build_configured_model
from geodiloco.runtime.state_file import CorruptStateFile


class BackgroundEvaluator:
    """At most one evaluation in flight; ``start`` waits for the previous one first."""

    def __init__(self, model: torch.nn.Module, batches: list, device: torch.device) -> None:
        """``model``: a second instance of the trained architecture (its weights are overwritten)."""
        self.model = model.to(device).eval()
        self.batches = batches
        self.device = device
        self._thread: Optional[threading.Thread] = None
        self._pending_row: Optional[dict] = None
        self._finished: list[dict] = []

    @torch.no_grad()
    def start(self, params: list[torch.Tensor], row: dict) -> None:
        """Evaluate ``params`` (the global model) and attach ``eval_loss`` to ``row`` when done."""
        self._join()
        for target, source in zip(self.model.parameters(), params):
            target.copy_(source.to(target.device, target.dtype))
        self._pending_row = dict(row)
        self._thread = threading.Thread(target=with_creators_threads(self._evaluate), name="geodiloco-eval",
                                        daemon=True)
        self._thread.start()

    @torch.no_grad()
    def _evaluate(self) -> None:
        losses: list[float] = []
        for inputs, targets in self.batches:
            losses.extend(per_sequence_losses(self.model, inputs.to(self.device), targets.to(self.device)).tolist())
        mean, standard_error = mean_and_standard_error(losses)
        self._pending_row["eval_loss"] = mean
        self._pending_row["eval_loss_se"] = standard_error

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._finished.append(self._pending_row)
            self._thread, self._pending_row = None, None

    def finished_rows(self, wait: bool = False) -> list[dict]:
        """Rows whose evaluation is done (``wait``: also the one in flight)."""
        if self._thread is not None and (wait or not self._thread.is_alive()):
            self._join()
        rows, self._finished = self._finished, []
        return rows


def per_sequence_losses(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(batch,) mean cross-entropy of each sequence over its tokens (nats per token), float32."""
    logits = model(inputs).float()
    token_losses = F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1), reduction="none")
    return token_losses.view(targets.shape).mean(dim=1)


def mean_and_standard_error(values: list[float]) -> tuple[float, Optional[float]]:
    """Mean of ``values`` and its standard error (sample std with n - 1 / sqrt(n));
    the error is None below two values, where it is undefined."""
    count = len(values)
    mean = math.fsum(values) / count
    if count < 2:
        return mean, None
    variance = math.fsum((value - mean) ** 2 for value in values) / (count - 1)
    return mean, math.sqrt(variance / count)


def held_out_batches(config, batch_size: Optional[int] = None) -> list:
    """The run's held-out eval set (the windows every node left out of training), in batches."""
    from geodiloco.runtime.data_sources import eval_set
    return eval_set(config, batch_size)


@torch.no_grad()
def evaluate_checkpoints(run_dir: Path, progress=None) -> list[dict]:
    """Eval loss and its standard error of every kept round's global model, on the run's held-out set.

    Rows: ``round``, ``eval_loss`` (mean per-sequence loss, nats per token), ``eval_loss_se``,
    ``sequences``, and ``final`` where the round's file holds an async run's final model instead of the round's. Runs on this process's CPU, after (not during) the run.
    """
    from geodiloco.runtime import checkpoint
    from geodiloco.runtime.run_dir import check_saved_tokenizer
    from geodiloco.runtime.run_files import load_parameters, load_run_config
    config = load_run_config(run_dir)
    check_saved_tokenizer(config, run_dir / "config.yaml")
    batches = held_out_batches(config)
    if not batches:
        raise ValueError(f"{run_dir}: the run held out no eval set (data.eval_batches is 0)")
    from geodiloco.runtime.data_record import evaluate_notice
    notice = evaluate_notice(run_dir, batches)
    if notice is not None:
        print(f"[geodiloco] warning: {notice}", file=sys.stderr, flush=True)
    rounds = checkpoint.kept_rounds(run_dir)
    if not rounds and not checkpoint.saved_global_rounds(run_dir):
        raise ValueError(f"{run_dir}: no checkpoint yet: the run has not saved a round (a running one saves after "
                         f"every {config.checkpoint.every_rounds} round(s)); evaluate it again later")
    if not rounds:
        raise ValueError(f"{run_dir}: no checkpoints/round_*/global.safetensors; keep them with checkpoint.every_rounds: 1 "
                         "and checkpoint.keep >= diloco.rounds")
    model = build_configured_model(config.model, config.run.seed).eval()
    rows = []
    refused = []
    for round_idx in rounds:
        try:
            state = checkpoint.load_global(run_dir, round_idx)
            params = state["outer"]["global_params"]
        except CorruptStateFile as err:
            refused.append(str(err))
            print(f"[geodiloco] round {round_idx + 1} (logs: {round_idx}) skipped: checkpoint refused: {err}",
                  file=sys.stderr, flush=True)
            continue
        load_parameters(model, params, model_source(config))
        losses: list[float] = []
        for inputs, targets in batches:
            losses.extend(per_sequence_losses(model, inputs, targets).tolist())
        mean, standard_error = mean_and_standard_error(losses)
        rows.append({"round": round_idx, "eval_loss": mean, "eval_loss_se": standard_error,
                     "sequences": len(losses), **({"final": True} if state.get("final") else {})})
        if progress is not None:
            progress(rows[-1])
    if not rows:
        raise ValueError(f"{run_dir}: no kept round's global checkpoint is intact ({'; '.join(refused)})")
    return rows


def model_source(config) -> str:
    """Where the evaluated or exported model's shape comes from, for errors."""
    if config.model.hf is not None:
        return f"model.hf ({config.model.hf.config or config.model.hf.pretrained})"
    return "model" + (f".file ({config.model.file})" if config.model.file else f".preset ({config.model.preset})")


def merged_rows(earlier: list[dict], rows: list[dict]) -> list[dict]:
    """``rows`` with the ``earlier`` rows of rounds they do not score (rounds whose checkpoints are gone since an
    earlier evaluate, or refused now), in round order."""
    scored = {row["round"] for row in rows}
    return sorted([row for row in earlier if row.get("round") not in scored] + rows, key=lambda row: row["round"])


def read_eval_rows(path: Path) -> list[dict]:
    """The rows an earlier ``geodiloco evaluate`` wrote to ``path`` (none if there is no such file); a line that is
    not a row of it is left out and said once."""
    if not path.is_file():
        return []
    rows, unreadable = [], 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("round"), int) and "eval_loss" in row:
            rows.append(row)
        elif line.strip():
            unreadable += 1
    if unreadable:
        print(f"[geodiloco] {path}: {unreadable} line(s) that are not evaluation rows were dropped", file=sys.stderr)
    return rows


FINAL_REGRESSION_SE = 3.0
"""How many standard errors of the eval loss the final model may score above the run's best evaluated round before
the run warns (eval sets are small; a smaller gap is noise)."""


def final_model_regression(metrics_rows: list[dict]) -> Optional[str]:
    """What to say when the run's final global model scores clearly worse than an earlier evaluated round (an
    async run whose last updates were stale can end there), or None. The advice does not name a round to export:
    an async run's final model replaces the global file of the newest round every node saved."""
    scored = [row for row in metrics_rows if row.get("node") == "global" and row.get("eval_loss") is not None
              and math.isfinite(row["eval_loss"])]
    if len(scored) < 2:
        return None
    final, earlier = scored[-1], scored[:-1]
    best = min(earlier, key=lambda row: row["eval_loss"])
    noise = FINAL_REGRESSION_SE * max(final.get("eval_loss_se") or 0.0, best.get("eval_loss_se") or 0.0)
    if final["eval_loss"] <= best["eval_loss"] + max(noise, 0.01 * best["eval_loss"]):
        return None
    return (f"the final global model scores eval loss {final['eval_loss']:.3f}, above the {best['eval_loss']:.3f} of "
            f"round {best['round'] + 1}: the run's last updates made the model worse; `geodiloco evaluate RUN_DIR` "
            "scores the rounds still kept (checkpoint.keep) and `geodiloco export RUN_DIR --round N` writes the one "
            "you choose")
