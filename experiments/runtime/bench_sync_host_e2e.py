"""The outer sync's host work in a whole run: this checkout against an earlier commit, same config.

Two sites on this machine (``geodiloco run``, torch backend, blocking sync, int8 wire format with error
feedback: the defaults but for ``diloco.overlap: none``), an 84 M-parameter model (hidden 1024, 5
layers) so that the work on every parameter at each sync (pseudo-gradient, int8 encode and decode,
outer step, finite check) weighs. ``geodiloco run`` gives each site one CPU thread, as torchrun does
with several ranks per site. The baseline runs from a git worktree of ``--baseline`` with the same
Python environment; the two alternate run by run. Truth: the runtime's own idle records of real CPU
training (exposed sync = ``comm_s``), nothing predicted. Both must train the same losses.

Usage: python experiments/runtime/bench_sync_host_e2e.py [--baseline 88335c6] [--runs 1] [--rounds 5]
Writes experiments/results/runtime/sync_host_e2e.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results" / "runtime"
MODEL = {"hidden_size": 1024, "intermediate_size": 4096, "num_layers": 5, "num_heads": 16, "vocab_size": 256,
         "max_seq_len": 128}


def write_config(work: Path, rounds: int) -> Path:
    (work / "model.json").write_text(json.dumps(MODEL))
    config = {"run": {"name": "sync-host", "out_dir": str(work / "runs"), "seed": 0},
              "model": {"file": str(work / "model.json"), "seq_len": 64},
              "data": {"source": "stdlib", "max_bytes": 2_000_000, "eval_batches": 0},
              "diloco": {"rounds": rounds, "local_steps": 2, "batch_size": 1, "overlap": "none",
                         "compression": "int8"},
              "balancing": {"policy": "uniform"}, "comm": {"backend": "torch", "timeout_s": 300},
              "checkpoint": {"every_rounds": 1000, "keep": 1},
              "nodes": [{"name": "a"}, {"name": "b"}]}
    path = work / "config.json"
    path.write_text(json.dumps(config))
    return path


def run_once(label: str, checkout: Path, config: Path, run_dir: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    result = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", "run", "--config", str(config),
                             "--run-dir", str(run_dir)], cwd=checkout, env=env, capture_output=True, text=True,
                            timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"{label} run failed (exit {result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "idle.jsonl").read_text().splitlines()]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [round(row["loss"], 4) for row in sorted((row for row in metrics if row.get("node") != "global"
                                                       and "loss" in row), key=lambda row: (row["round"], row["node"]))]
    idle_s = sum(row["wait_s"] + row["comm_s"] + row["overhead_s"] for row in records)
    total_s = idle_s + sum(row["compute_s"] for row in records)
    return {"label": label, "comm_s_per_round": statistics.median(row["comm_s"] for row in records),
            "comm_s": sum(row["comm_s"] for row in records), "idle_s": idle_s, "idle_share": idle_s / total_s,
            "losses": losses}


def write(rows: list[dict], baseline: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sync_host_e2e.json").write_text(json.dumps({"baseline": baseline, "runs": rows}, indent=2) + "\n")
    lines = ["# The outer sync's host work in a whole run: this checkout against an earlier commit", "",
             f"Truth: the runtime's own idle records of real CPU training on this machine (2 sites, "
             f"`geodiloco run`, one CPU thread each, torch backend, blocking sync, int8 wire format, an 84 M-parameter "
             f"model); baseline commit `{baseline}`, runs alternating. "
             "`python experiments/runtime/bench_sync_host_e2e.py`.", "",
             "| code | exposed sync per node-round (median) | exposed sync, both nodes | total GPU idle | idle share |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['label']} | {row['comm_s_per_round']:.2f} s | {row['comm_s']:.1f} s | "
                     f"{row['idle_s']:.1f} s | {row['idle_share'] * 100:.1f} % |")
    same = len({tuple(row["losses"]) for row in rows}) == 1
    lines += ["", f"Each node's round losses the same in every run: {'yes' if same else 'no'} "
              f"({', '.join(f'{loss:.3f}' for loss in rows[0]['losses'])})."]
    (RESULTS / "sync_host_e2e.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default="88335c6", help="git revision to compare with (default 88335c6)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each (default 1)")
    parser.add_argument("--rounds", type=int, default=5, help="outer rounds per run (default 5)")
    args = parser.parse_args()
    if args.runs < 1 or args.rounds < 1:
        parser.error("--runs and --rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="sync-host-") as temp:
        work = Path(temp)
        baseline_tree = work / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(baseline_tree), args.baseline],
                       check=True, capture_output=True)
        try:
            config = write_config(work, args.rounds)
            rows = []
            for index in range(args.runs):
                for label, checkout in ((f"baseline {args.baseline}", baseline_tree), ("this checkout", ROOT)):
                    row = run_once(label, checkout, config, work / f"run-{index}-{len(rows)}")
                    rows.append(row)
                    print(f"{label}: exposed sync {row['comm_s_per_round']:.2f} s per node-round, "
                          f"total idle {row['idle_s']:.1f} s ({row['idle_share'] * 100:.1f} %)", flush=True)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline_tree)],
                           capture_output=True)
    write(rows, args.baseline)
    print(f"wrote {RESULTS / 'sync_host_e2e.md'}")


if __name__ == "__main__":
    main()
