"""PNG figures: a Gantt timeline per node and round (compute / wait / sync), and idle per node by run."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from geodiloco.report.compare import node_names  # noqa: E402
from geodiloco.report.errors import ReportError  # noqa: E402
from geodiloco.report.summary import RunSummary  # noqa: E402

PHASE_COLORS = {"compute": "#4c9a5b", "wait for peers": "#e8a33d", "WAN sync": "#c8453b", "other": "#9a9a9a"}
BAR_HEIGHT = 0.6
MAX_ROUND_LABELS = 25
MAX_ROUND_LINES = 200


def _phases(record) -> list[tuple[str, float]]:
    return [("compute", record.compute_s), ("wait for peers", record.wait_s),
            ("WAN sync", record.comm_s), ("other", record.overhead_s)]


def labelled_round_starts(round_starts: list[tuple[int, float]], span_s: float) -> list[tuple[int, float]]:
    """The (round, start s) pairs that get a label: at most ``MAX_ROUND_LABELS``, each at least a
    ``MAX_ROUND_LABELS``-th of the time axis after the one before, so rounds of unequal lengths (a resume, a slow
    round) never print their labels over each other."""
    gap_s = span_s / MAX_ROUND_LABELS if span_s > 0 else 0.0
    chosen: list[tuple[int, float]] = []
    for round_index, start_s in round_starts:
        if not chosen or start_s - chosen[-1][1] >= gap_s:
            chosen.append((round_index, start_s))
    return chosen


def draw_timeline(axes: Axes, summary: RunSummary) -> None:
    """One row per node; each round's phases laid end to end from the round's start (seconds since the run's start)."""
    nodes = [node.node for node in summary.nodes]
    origin_s = min(record.round_start for record in summary.records)
    for row, name in enumerate(nodes):
        spans: dict[str, list[tuple[float, float]]] = {phase: [] for phase in PHASE_COLORS}
        for record in (record for record in summary.records if record.node == name):
            start_s = record.round_start - origin_s
            for phase, duration_s in _phases(record):
                if duration_s > 0:
                    spans[phase].append((start_s, duration_s))
                    start_s += duration_s
        for phase, phase_spans in spans.items():
            axes.broken_barh(phase_spans, (row - BAR_HEIGHT / 2, BAR_HEIGHT),
                             facecolors=PHASE_COLORS[phase], edgecolor="white", linewidth=0.3)
    first_start_s: dict[int, float] = {}
    for record in summary.records:
        first_start_s[record.round] = min(first_start_s.get(record.round, np.inf), record.round_start - origin_s)
    round_starts = sorted(first_start_s.items())
    for round_index, start_s in labelled_round_starts(round_starts, max(record.round_end for record in
                                                                         summary.records) - origin_s):
        axes.axvline(start_s, color="#444444", linewidth=0.5, linestyle=":", zorder=0)
        axes.text(start_s, -BAR_HEIGHT / 2 - 0.08, f" round {round_index}", fontsize=7, color="#444444", va="bottom")
    if len(round_starts) <= MAX_ROUND_LINES:
        for _, start_s in round_starts:
            axes.axvline(start_s, color="#444444", linewidth=0.5, linestyle=":", zorder=0)
    axes.set_yticks(range(len(nodes)), [f"{name}\n{node.site}" for name, node in zip(nodes, summary.nodes)])
    axes.set_ylim(len(nodes) - 0.5, -0.85)
    axes.set_xlabel("time since the first reported round started (s)")
    axes.set_title(f"{summary.label} ({summary.policy}): idle {summary.total.idle_gpu_s:.1f} GPU-s "
                   f"= {summary.total.idle_share * 100:.1f} % of GPU time", loc="left", fontsize=10)
    axes.grid(axis="x", alpha=0.3)


def draw_idle_bars(axes: Axes, summaries: list[RunSummary]) -> None:
    """Grouped bars: idle GPU-seconds of each node (its idle seconds x its GPUs, the unit of the titles' totals),
    one bar per run."""
    names = node_names(summaries)
    positions = np.arange(len(names))
    width = 0.8 / len(summaries)
    for index, summary in enumerate(summaries):
        idle_by_node = {node.node: node.idle_gpu_s for node in summary.nodes}
        heights = [idle_by_node.get(name, 0.0) for name in names]
        bars = axes.bar(positions + (index - (len(summaries) - 1) / 2) * width, heights, width,
                        label=f"{summary.label} ({summary.policy}), total {summary.total.idle_gpu_s:.1f} GPU-s")
        axes.bar_label(bars, fmt="%.1f", fontsize=7, padding=1)
    axes.set_xticks(positions, names)
    axes.set_ylabel("idle per node (GPU-s)")
    axes.set_title("Idle per node by run (wait + WAN sync + other)", loc="left", fontsize=10)
    axes.legend(fontsize=8)
    axes.grid(axis="y", alpha=0.3)


def write_plot(summaries: list[RunSummary], path: str | Path, with_bars: bool | None = None) -> Path:
    """Write the timeline of each run (and, for several runs, the idle bars) to a PNG at ``path``."""
    target = Path(path)
    if target.suffix.lower() != ".png":
        raise ReportError(f"--plot {target}: the figure is written as PNG; name the file *.png")
    if not target.parent.is_dir():
        raise ReportError(f"--plot {target}: folder {target.parent} does not exist")
    with_bars = len(summaries) > 1 if with_bars is None else with_bars
    heights = [1.2 + 0.55 * len(summary.nodes) for summary in summaries] + ([3.6] if with_bars else [])
    figure, axes_list = plt.subplots(len(heights), 1, figsize=(12, sum(heights) + 0.6),
                                     gridspec_kw={"height_ratios": heights}, squeeze=False)
    for axes, summary in zip(axes_list[:, 0], summaries):
        draw_timeline(axes, summary)
    if with_bars:
        draw_idle_bars(axes_list[-1, 0], summaries)
    legend = [Patch(facecolor=color, label=phase) for phase, color in PHASE_COLORS.items()]
    figure.legend(handles=legend, loc="upper right", ncol=4, fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0, 1, 0.97))
    try:
        figure.savefig(target, dpi=120)
    except OSError as err:
        raise ReportError(f"--plot {target}: cannot write: {err.strerror or err}") from None
    finally:
        plt.close(figure)
    return target
