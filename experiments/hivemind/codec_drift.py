"""How far a hivemind codec's rounding parts the nodes' models, and how often they reload because of it.

    .venv/bin/python experiments/hivemind/codec_drift.py [--rounds 8] [--out experiments/results/hivemind]

hivemind hands each peer the average as its own tensor plus the codec's rounding of its delta, so the
replicas part a little every round; a node whose round-start checksum (sum of |parameters|) strays from
the majority's by more than ``comm.hivemind.resync_tolerance`` reloads the global state from a peer.
This runs the demo's three-site hivemind config (experiments/configs/hivemind.yaml, loopback, the tiny
model) for --rounds rounds under: fp16; 8bit at the default tolerance (1e-4 for 8bit); 8bit at 1e-6 (the
one default before). Truth: the runs' own checksums (metrics.jsonl) and reload lines; nothing predicted.

Writes OUT/codec_drift.md and codec_drift.json. About 2-3 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "configs" / "hivemind.yaml"
VARIANTS = [("fp16", ["comm.hivemind.compression=fp16"]),
            ("8bit, default tolerance (1e-4)", ["comm.hivemind.compression=8bit"]),
            ("8bit, tolerance 1e-6", ["comm.hivemind.compression=8bit", "comm.hivemind.resync_tolerance=1e-6"])]


def run_variant(run_dir: Path, overrides: list[str], rounds: int) -> dict:
    """One run; per round the relative spread of the nodes' round-start checksums, and the reloads."""
    command = [sys.executable, "-m", "geodiloco.runtime.cli", "run", "--config", str(CONFIG), "--sites", "local",
               "--no-report", "--run-dir", str(run_dir), "--set", f"diloco.rounds={rounds}"]
    for override in overrides:
        command += ["--set", override]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=REPO,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if done.returncode != 0:
        sys.exit(f"codec_drift.py: the run failed ({' '.join(overrides)}):\n{done.stderr[-2000:]}")
    by_round: dict[int, list[float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("node") != "global" and row.get("start_checksum") is not None:
            by_round.setdefault(row["round"], []).append(row["start_checksum"])
    spreads = [(max(values) - min(values)) / max(abs(value) for value in values)
               for _, values in sorted(by_round.items())]
    output = done.stdout + done.stderr
    return {"spread_by_round": spreads, "reloads": output.count("reloading the global state from a peer"),
            "final_checksums": sorted({line.rsplit(" ", 1)[-1] for line in output.splitlines()
                                       if "final parameter checksum" in line})}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "hivemind")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for index, (label, overrides) in enumerate(VARIANTS):
            print(f"[codec_drift] {label} ...", flush=True)
            rows.append({"variant": label, **run_variant(Path(scratch) / f"run{index}", overrides, args.rounds)})
    lines = ["# hivemind codecs: how far the replicas part, and how often they reload", "",
             f"Measured by `python experiments/hivemind/codec_drift.py --rounds {args.rounds}`: three nodes of "
             "experiments/configs/hivemind.yaml on loopback (tiny model). Truth: the runs' own round-start "
             "checksums (sum of |parameters|, metrics.jsonl) and their reload lines.", "",
             "| variant | checksum spread per round (relative, rounds 1+) | largest | node reloads | final checksums |",
             "|---|---|---|---|---|"]
    for row in rows:
        later = row["spread_by_round"][1:]
        lines.append(f"| {row['variant']} | {' '.join(f'{value:.1e}' for value in later)} | "
                     f"{max(later, default=0.0):.1e} | {row['reloads']} | {len(row['final_checksums'])} distinct |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "codec_drift.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.out / "codec_drift.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
