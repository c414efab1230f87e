"""``geodiloco report`` (= ``python scripts/idle_report.py``): idle-time report of run directories."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Optional

from rich.console import Console

from geodiloco.report.errors import ReportError

PIPE_WIDTH = 160

DESCRIPTION = """\
Where GPU time went in one or more runs (or simulations): compute, waiting for
peers, WAN sync, idle share, GPU-seconds and GPU-hours wasted, cost and energy.
Reads only the run directory's logs (idle.jsonl, plan.jsonl, metrics.jsonl, config.yaml).

examples:
  geodiloco report runs/demo
  geodiloco report runs/demo --rounds --skip-rounds 1 --price experiments/configs/gpu_prices.yaml
  geodiloco report runs/uniform runs/time --compare --plot idle.png
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="run directory holding idle.jsonl (one or more)")
    parser.add_argument("--compare", action="store_true",
                        help="runs side by side, each relative to the first (idle per round, tokens per hour)")
    parser.add_argument("--rounds", action="store_true", help="add the per-round view")
    parser.add_argument("--skip-rounds", type=int, default=0, metavar="N",
                        help="leave out the first N rounds (warm-up); the report says so")
    parser.add_argument("--price", action="append", default=[], metavar="NAME=USD|FILE.yaml",
                        help="USD per GPU-hour of a GPU model (repeatable), or a YAML file mapping names to prices")
    parser.add_argument("--plot", metavar="FILE.png", help="write a timeline per node and round (and idle bars per run)")
    parser.add_argument("--json", nargs="?", const="-", metavar="FILE",
                        help="machine-readable report to FILE, or to stdout instead of the tables")
    parser.add_argument("--html", metavar="FILE.html", help="also write the terminal report as an HTML page")


def register(subparsers) -> None:
    """Add ``geodiloco report`` to the ``geodiloco`` parser."""
    parser = subparsers.add_parser("report", help="idle-time report of one or more run directories",
                                   description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(func=run_report)


def _renderables(summaries, args: argparse.Namespace) -> list:
    from geodiloco.report.tables import render_comparison, render_run

    if args.compare:
        return render_comparison(summaries)
    parts = []
    for summary in summaries:
        parts += render_run(summary, show_rounds=args.rounds)
    return parts


def _report(args: argparse.Namespace) -> int:
    from geodiloco.report.export import write_html, write_json
    from geodiloco.report.runs import summarize_runs

    check_run_dirs(args)
    check_output_paths(args)
    summaries = summarize_runs(args.run_dirs, args.price, args.skip_rounds)
    for summary in summaries:
        for warning in summary.warnings:
            print(f"warning: {summary.run_dir}: {warning}", file=sys.stderr)
    renderables = _renderables(summaries, args)
    # the files first: a reader of stdout that stops early (`| head`) must not cost them
    text = write_json(summaries, args.json) if args.json is not None else None
    if args.html:
        write_html(renderables, args.html)
        print(f"wrote {args.html}", file=sys.stderr)
    if args.plot:
        from geodiloco.report.plots import write_plot  # matplotlib takes a second or two to import: only to draw

        write_plot(summaries, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json == "-":
        print(text)
    else:
        piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
        console = PipeConsole(width=PIPE_WIDTH if piped else None, markup=False)  # names from logs are text, never markup
        print_uncut(console, renderables)
    sys.stdout.flush()
    return 0


def print_uncut(console: Console, renderables: list) -> None:
    """Print each part no narrower than it needs: rich would squeeze a wide table into a narrow terminal by cutting
    its numbers to "0…" without a word. A part wider than the terminal is printed at its own width (the terminal
    wraps its lines), once said on stderr."""
    from rich.measure import Measurement

    widest_needed, terminal_width = 0, console.width
    unbounded = console.options.update(max_width=10_000)
    for renderable in renderables:
        needed = Measurement.get(console, unbounded, renderable).minimum if not isinstance(renderable, str) else 0
        if needed > terminal_width:
            widest_needed = max(widest_needed, needed)
            console.width = needed  # Console.print(width=) cannot go past the console's own width
            console.print(renderable)
            console.width = terminal_width
        else:
            console.print(renderable)
    if widest_needed:
        print(f"note: the report's tables need {widest_needed} columns and the terminal has {terminal_width}: their lines "
              "wrap; widen the terminal, or use --json or --html", file=sys.stderr)


class PipeConsole(Console):
    """A reader that went away (``| head``) ends the report as it ends other commands (exit 141, quietly): rich's
    own console exits 1, as if the report had failed."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def check_run_dirs(args: argparse.Namespace) -> None:
    """At least one RUN_DIR; ``--json RUN_DIR`` (the directory taken as --json's FILE) says how to write it."""
    if args.run_dirs:
        return
    if args.json not in (None, "-") and Path(args.json).is_dir():
        raise ReportError(f"no RUN_DIR: --json took {args.json} as the file to write; put --json after the run "
                          f"directories (geodiloco report {args.json} --json) or give it a file name "
                          f"(--json report.json {args.json})")
    raise ReportError("no RUN_DIR: name at least one run directory (it holds idle.jsonl), e.g. "
                      "geodiloco report runs/demo")


def run_owned_file(path: Path, run_dirs: list[str]) -> bool:
    """An existing log or config a run wrote into one of ``run_dirs`` (overwriting it would lose the run's records)."""
    if not path.is_file() or not (path.suffix == ".jsonl" or path.name == "config.yaml"):
        return False
    return any(path.resolve().parent == Path(run_dir).resolve() for run_dir in run_dirs)


def check_output_paths(args: argparse.Namespace) -> None:
    """Fail before the report is printed when a file it was asked to write cannot be written there."""
    claimed: dict[Path, str] = {}
    for option, value in (("--json", args.json), ("--html", args.html), ("--plot", args.plot)):
        if value in (None, "-"):
            continue
        path = Path(value)
        if path.resolve() in claimed:
            raise ReportError(f"{option} {path}: the same file as {claimed[path.resolve()]}; one would overwrite the "
                              "other; give each output its own name")
        claimed[path.resolve()] = option
        if path.is_dir():
            raise ReportError(f"{option} {path}: a folder; give a file name")
        if run_owned_file(path, args.run_dirs):
            raise ReportError(f"{option} {path}: a file of the run itself; writing the report there would lose "
                              "the run's records; choose another name (e.g. report.json)")
        if not path.parent.is_dir():
            raise ReportError(f"{option} {path}: its folder {path.parent} does not exist; create it or choose "
                              "another path")
        if option == "--plot" and path.suffix.lower() != ".png":
            raise ReportError(f"--plot {path}: the figure is written as PNG; name the file *.png")


def run_report(args: argparse.Namespace, prog: str = "geodiloco report") -> int:
    """Run the report; bad input prints one line and returns 2 (never a traceback)."""
    try:
        return _report(args)
    except ReportError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def main(argv: Optional[list[str]] = None) -> int:
    """Entry of ``scripts/idle_report.py``: the same options as ``geodiloco report``."""
    parser = argparse.ArgumentParser(prog="idle_report.py", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run_report(parser.parse_args(argv), prog="idle_report.py")
