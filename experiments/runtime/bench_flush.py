"""What flushing checkpoints to disk costs the GPUs: ``checkpoint.flush`` true against false.

The embedded demo (``geodiloco run``: 4 emulated sites, virtual GPUs around real CPU
training of the tiny preset, a background checkpoint every round) is run with the
flush on and off, alternating, so machine noise hits both alike. Truth: wall-clock time
of the real runtime on this machine (its idle records); nothing predicted. With the
flush, each file and its folder are fsynced before ``latest`` moves (a power loss
leaves the last complete checkpoint usable); without it the files are only renamed
into place.

Usage: python experiments/runtime/bench_flush.py [--pairs 2] [--no-write]
Writes experiments/results/runtime/flush.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_checkpoint import RESULTS, demo_idle, demo_table_rows  # noqa: E402

FLUSH_MODES = (True, False)


def run_pairs(pairs: int) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(pairs):
            for flush in FLUSH_MODES:
                result = demo_idle(True, Path(tmp) / f"demo-flush-{flush}-{pair}", flush=flush)
                results.append(result)
                print(f"[{len(results)}/{2 * pairs}] demo flush={flush}: other "
                      f"{result['other_s_per_node_round']:.3f} s per node-round, total GPU idle "
                      f"{result['total_idle_share']:.1%}", flush=True)
    return results


def markdown(demo: list[dict], load: tuple[float, float]) -> str:
    lines = [
        "# Checkpoint flush to disk: on against off",
        "",
        f"Measured by `python experiments/runtime/bench_flush.py --pairs {len(demo) // 2}` on {platform.machine()}, "
        f"{os.cpu_count()} cores, torch {torch.__version__}; 1-minute load average {load[0]:.1f} before, "
        f"{load[1]:.1f} after. Truth: wall-clock time of the real runtime on this machine (the demo's idle records), "
        "`checkpoint.flush` true and false alternating, background writes in both.",
        "",
        "other = the idle report's other overhead per node and round; total GPU idle = (wait + exposed sync + "
        "other) / GPU time, weighted by each node's GPUs. The demo's nodes are virtual GPUs around real CPU "
        "training, so this is the runtime's mechanics on this machine's disk, not a GPU figure.",
        "",
        "| run | flush | other s per node-round | total GPU idle |",
        "|---|---|---|---|",
    ]
    return "\n".join(lines + demo_table_rows(demo, "flush", FLUSH_MODES)) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--pairs", type=int, default=2, help="demo runs per setting, alternating (default 2)")
    parser.add_argument("--no-write", action="store_true", help="print only; write no result files")
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    load_before = os.getloadavg()[0]
    demo = run_pairs(args.pairs)
    table = markdown(demo, (load_before, os.getloadavg()[0]))
    print(table)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "flush.md").write_text(table, encoding="utf-8")
        (RESULTS / "flush.json").write_text(json.dumps({"demo": demo}, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
