"""Figures of the paper4 reproduction: loss curves per policy and waiting per policy beside the paper."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from results_data import RunData  # noqa: E402
from tables import PAPER_NAME, PAPER_TABLE3  # noqa: E402


def loss_curves(runs: Sequence[RunData], path: Path, title: str, tokens_label: str) -> None:
    """Eval loss after each outer sync against wall-clock seconds (left) and tokens seen (right)."""
    figure, (by_time, by_tokens) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for run in runs:
        style = {"marker": "o", "markersize": 3, "linewidth": 1.4,
                 "linestyle": "--" if run.policy == "uniform" else "-", "label": run.policy}
        by_time.plot(run.curve.wall_s, run.curve.eval_loss, **style)
        by_tokens.plot(run.curve.tokens / 1e3, run.curve.eval_loss, **style)
    by_time.set_xlabel("wall-clock since the run started (s)")
    by_tokens.set_xlabel(tokens_label)
    by_time.set_ylabel("eval loss of the averaged model (nats/byte)")
    for axes in (by_time, by_tokens):
        axes.grid(alpha=0.3)
    by_tokens.legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def wait_bars(rows: Sequence[dict], path: Path) -> None:
    """Waiting per round as a share of node time, ours per policy; the paper's seconds where it has them."""
    policies = [row["policy"] for row in rows]
    positions = np.arange(len(policies))
    figure, (share_axes, seconds_axes) = plt.subplots(1, 2, figsize=(12, 4.2))
    share_axes.bar(positions, [100.0 * row["total_wait_share"] for row in rows], color="#e8a33d")
    share_axes.set_ylabel("waiting, % of node time (this reproduction)")
    width = 0.4
    ours = [row["paper_scale_wait_s_per_round"] for row in rows]
    paper = [sum(PAPER_TABLE3[name]) if name in PAPER_TABLE3 else np.nan for name in policies]
    seconds_axes.bar(positions - width / 2, ours, width, label="this reproduction (scaled to the paper's H and time)",
                     color="#e8a33d")
    seconds_axes.bar(positions + width / 2, paper, width, label="paper, Table 3", color="#5a6fb0")
    seconds_axes.set_ylabel("waiting, s per round, all nodes")
    seconds_axes.legend(fontsize=8)
    labels = [f"{name}\n({PAPER_NAME[name]})" if name in PAPER_NAME else name for name in policies]
    for axes in (share_axes, seconds_axes):
        axes.set_xticks(positions, labels, rotation=30, ha="right", fontsize=8)
        axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
