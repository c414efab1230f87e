#!/usr/bin/env python3
"""Regenerate the README's pictures of the idle-time report from run directories.

    python experiments/report/make_readme_figures.py runs/demo [runs/other ...] [--out DIR]

Writes DIR/report_terminal.png (the terminal report of `geodiloco report RUN_DIR
--rounds`, drawn with matplotlib in a monospace font, or the --compare view for
several runs) and DIR/timeline.png (the `--plot` figure). DIR defaults to
experiments/results/report. The numbers are whatever the given run measured:
rerun `geodiloco run` (it prints its run directory) and then this script.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from geodiloco.report.errors import ReportError  # noqa: E402
from geodiloco.report.plots import write_plot  # noqa: E402
from geodiloco.report.runs import summarize_runs  # noqa: E402
from geodiloco.report.tables import render_comparison, render_run  # noqa: E402
from geodiloco.report.terminal_image import save_terminal_png  # noqa: E402

TERMINAL_PNG = "report_terminal.png"
TIMELINE_PNG = "timeline.png"


def _shown_path(run_dir: str) -> str:
    """The path as a reader would type it: relative paths as given, absolute ones as runs/NAME."""
    path = Path(run_dir)
    return str(path) if not path.is_absolute() else f"runs/{path.name}"


def make_figures(run_dirs: list[str], out_dir: Path, prices: list[str], skip_rounds: int) -> list[Path]:
    summaries = summarize_runs(run_dirs, prices, skip_rounds)
    for summary, run_dir in zip(summaries, run_dirs):
        summary.run_dir = _shown_path(run_dir)
    options = ["--skip-rounds", str(skip_rounds)] if skip_rounds else []
    for price in prices:
        options += ["--price", shlex.quote(price)]
    if len(summaries) > 1:
        renderables, options = render_comparison(summaries), ["--compare"] + options
    else:
        renderables, options = render_run(summaries[0], show_rounds=True), ["--rounds"] + options
    command = ["geodiloco", "report", *(_shown_path(run_dir) for run_dir in run_dirs), *options]
    out_dir.mkdir(parents=True, exist_ok=True)
    return [save_terminal_png(renderables, out_dir / TERMINAL_PNG, command_words=command),
            write_plot(summaries, out_dir / TIMELINE_PNG)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "report")
    parser.add_argument("--price", action="append", default=[], metavar="NAME=USD")
    parser.add_argument("--skip-rounds", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        written = make_figures(args.run_dirs, args.out, args.price, args.skip_rounds)
    except ReportError as err:
        print(f"make_readme_figures.py: error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
