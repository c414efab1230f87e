"""Which outer-average weighting async DiLoCo should use: FedNova's ``normalized`` against ``tokens``.

    .venv/bin/python experiments/async/weighting.py                 # 2 clusters x 3 cases x 3 seeds, ~20 min
    .venv/bin/python experiments/async/weighting.py --seeds 0 --clusters straggler
    .venv/bin/python experiments/async/weighting.py --analyze-only  # redo the table from the kept logs

In async mode the host applies each node's pseudo-gradient alone, as it arrives, from a model the
node pulled several updates earlier. ``normalized`` weights a node's update by tau_eff / H_i of its
share (FedNova), so a node that ran few steps (a straggler under the adaptive policy) counts many
times its tokens. Cases per cluster and seed: async with ``normalized`` (what ``weighting: auto``
gave under the adaptive policy before), async with ``tokens``, and the same cluster as balanced
sync DiLoCo (``weighting: auto``) for reference. Clusters: ``paper`` (experiments/configs/async.yaml,
the source paper's four nodes, 1.9x apart) and ``straggler`` (experiments/configs/async_straggler.yaml,
one node five to nine times slower). Every run stops at the first phase end after 45 s.

Truth: real training of the tiny model on this machine's CPU (the losses are real); the step times are
virtual GPUs (each node's steps padded to the time measured on its GPUs), not the planner's model.
Reported: the final global model's eval loss (the one every node ends on, and ``export`` writes),
the best eval loss of a kept round, per seed and as a mean. Writes
experiments/results/async/weighting.md and keeps each run's metrics.jsonl beside it.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results" / "async"
CLUSTERS = {"paper": ROOT / "experiments" / "configs" / "async.yaml",
            "straggler": ROOT / "experiments" / "configs" / "async_straggler.yaml"}
CASES = {"async-normalized": ["diloco.weighting=normalized"], "async-tokens": ["diloco.weighting=tokens"],
         "sync-auto": ["diloco.mode=sync", "diloco.weighting=auto"]}
WALL_S = 45


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--clusters", nargs="+", choices=sorted(CLUSTERS), default=sorted(CLUSTERS))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--analyze-only", action="store_true", help="only rebuild the table from the kept logs")
    return parser.parse_args(argv)


def run_dir_name(cluster: str, case: str, seed: int) -> str:
    return f"weighting-{cluster}-{case}-seed{seed}"


def run_case(cluster: str, case: str, seed: int, scratch: Path, kept: Path) -> float:
    """One run in ``scratch``; its metrics.jsonl is kept under ``kept``. Returns its wall seconds."""
    run_dir = scratch / run_dir_name(cluster, case, seed)
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = [*CASES[case], f"run.seed={seed}", f"run.max_wall_s={WALL_S}"]
    command = [sys.executable, "-m", "geodiloco.runtime.cli", "run", "--config", str(CLUSTERS[cluster]),
               "--sites", "local", "--no-report", "--run-dir", str(run_dir)]
    for item in sets:
        command += ["--set", item]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"[weighting] {run_dir.name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    target = kept / run_dir.name
    target.mkdir(parents=True, exist_ok=True)
    shutil.copy(run_dir / "metrics.jsonl", target / "metrics.jsonl")
    return time.perf_counter() - started


def global_evals(metrics_path: Path) -> tuple[float, float]:
    """(the final global model's eval loss, the best eval loss of the run's evaluated rounds)."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    scored = [row for row in rows if row.get("node") == "global" and row.get("eval_loss") is not None]
    return scored[-1]["eval_loss"], min(row["eval_loss"] for row in scored)


def analyze(results: Path, clusters: list[str], seeds: list[int]) -> str:
    kept = results / "weighting_runs"
    lines = ["# Outer-average weighting under async DiLoCo", "",
             "Truth: real training of the tiny model on CPU (real losses); step times from virtual GPUs (each node's "
             "steps padded to the time measured on its GPUs), not the planner's model. Every run stops at the first "
             f"phase end after {WALL_S} s. Final: the eval loss of the final global model (the one every node ends on "
             "and `export` writes); best: the lowest eval loss of an evaluated round. Regenerate: "
             "`.venv/bin/python experiments/async/weighting.py`.", ""]
    for cluster in clusters:
        lines += [f"## Cluster `{cluster}` ({CLUSTERS[cluster].relative_to(ROOT)})", "",
                  "| case | final eval loss, mean | per seed | best round's eval loss, mean |", "|---|---|---|---|"]
        for case in CASES:
            pairs = [global_evals(kept / run_dir_name(cluster, case, seed) / "metrics.jsonl") for seed in seeds]
            finals, bests = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
            lines.append(f"| {case} | {statistics.fmean(finals):.3f} | {', '.join(f'{value:.3f}' for value in finals)} "
                         f"| {statistics.fmean(bests):.3f} |")
        lines.append("")
    lines.append(f"Seeds: {', '.join(map(str, seeds))}.")
    text = "\n".join(lines) + "\n"
    (results / "weighting.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kept = args.results / "weighting_runs"
    if not args.analyze_only:
        scratch = ROOT / "runs" / "async-weighting"
        jobs = [(cluster, case, seed) for seed in args.seeds for cluster in args.clusters for case in CASES]
        for index, (cluster, case, seed) in enumerate(jobs, 1):
            wall_s = run_case(cluster, case, seed, scratch, kept)
            print(f"[weighting] {index}/{len(jobs)} {cluster} {case} seed {seed}: {wall_s:.0f} s", flush=True)
    print(analyze(args.results, args.clusters, args.seeds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
