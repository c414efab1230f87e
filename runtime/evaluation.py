"""Evaluation of the global model off the critical path.

After each outer sync the coordinator copies the new global parameters into a
separate model and computes the held-out loss in a background thread, while
the next local phase runs. So evaluation costs no round time (on a GPU it
shares the device with training; on a CPU the emulation's padding absorbs it).
The ``global`` metrics row of a round is written once its evaluation is done.
"""
from __future__ import annotations

import threading
from typing import Optional

import torch

from predictor.workload import ModelDims
from runtime.models import build_model


class BackgroundEvaluator:
    """At most one evaluation in flight; ``start`` waits for the previous one first."""

    def __init__(self, dims: ModelDims, seed: int, batches: list, device: torch.device) -> None:
        self.model = build_model(dims, seed).to(device).eval()
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
        self._thread = threading.Thread(target=self._evaluate, name="geodiloco-eval", daemon=True)
        self._thread.start()

    @torch.no_grad()
    def _evaluate(self) -> None:
        losses = [self.model(inputs.to(self.device), targets.to(self.device)).item()
                  for inputs, targets in self.batches]
        self._pending_row["eval_loss"] = sum(losses) / len(losses)

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
