"""A multi-rank node's leader on its ranks' threads: exposed sync with ``comm.sync_threads: 1`` against the default.

torchrun gives each rank of a multi-GPU site one CPU thread, and only the node's leader does the outer sync's
host work (pseudo-gradient, int8 codec, outer step, moving the model) while its other ranks wait for it. By
default the leader now borrows their threads for that work (runtime/host_threads.py). Here one node with two
ranks (torchrun --standalone, CPU, gloo) trains an 84 M-parameter model (hidden 1024, 5 layers), so the sync's
host work weighs; with one node the all-reduce itself is trivial and the exposed sync is that host work. The
two settings alternate run by run. Truth: the runtime's own idle records of real CPU training (exposed sync =
``comm_s``); nothing predicted. Both settings must end on bitwise the same parameters (the same checksum).

Usage: python experiments/runtime/bench_sync_threads.py [--runs 2] [--rounds 4]
Writes experiments/results/runtime/sync_threads.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results" / "runtime"
MODEL = {"hidden_size": 1024, "intermediate_size": 4096, "num_layers": 5, "num_heads": 16, "vocab_size": 256,
         "max_seq_len": 128}
OVERLAPS = {"blocking (overlap none)": "none", "streaming (the default)": "streaming"}
SECRET = "bench-sync-threads-experiment-secret"


def write_config(work: Path, overlap: str, sync_threads: int | None, rounds: int) -> Path:
    (work / "model.json").write_text(json.dumps(MODEL))
    comm = {"backend": "torch", "timeout_s": 300, "elastic": {"enabled": False}}
    if sync_threads is not None:
        comm["sync_threads"] = sync_threads
    config = {"run": {"name": "sync-threads", "out_dir": str(work / "runs"), "seed": 0},
              "model": {"file": str(work / "model.json"), "seq_len": 64},
              "data": {"source": "stdlib", "max_bytes": 2_000_000, "eval_batches": 0},
              "diloco": {"rounds": rounds, "local_steps": 2, "batch_size": 2, "overlap": overlap,
                         "compression": "int8"},
              "balancing": {"policy": "uniform"}, "comm": comm, "checkpoint": {"every_rounds": 1000, "keep": 1},
              "nodes": [{"name": "a", "gpus": ["2 x A30"]}]}
    path = work / f"run-{overlap}-{sync_threads}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_once(work: Path, overlap: str, sync_threads: int | None, rounds: int, index: int) -> dict:
    config = write_config(work, overlap, sync_threads, rounds)
    run_dir = work / f"run-{overlap}-{sync_threads}-{index}"
    env = dict(os.environ, GEODILOCO_DEVICE="cpu", GEODILOCO_SECRET=SECRET)
    env.pop("OMP_NUM_THREADS", None)  # torchrun sets 1 per rank, as at a multi-GPU site
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "geodiloco.runtime.train", "--config", str(config), "--node-name", "a",
                           "--run-dir", str(run_dir)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise SystemExit(f"run failed (exit {done.returncode}):\n{output[-3000:]}")
    records = [json.loads(line) for line in (run_dir / "idle.jsonl").read_text().splitlines() if line.strip()]
    checksum = re.search(r"final parameter checksum (\S+) on every rank", output)
    threads = re.search(r"host work on (\d+) CPU threads", output)
    idle_s = sum(row["wait_s"] + row["comm_s"] + row["overhead_s"] for row in records)
    total_s = idle_s + sum(row["compute_s"] for row in records)
    return {"overlap": overlap, "sync_threads": sync_threads, "leader_threads": int(threads.group(1)) if threads else 1,
            "comm_s_per_round": statistics.median(row["comm_s"] for row in records),
            "comm_s": sum(row["comm_s"] for row in records), "idle_share": idle_s / total_s,
            "final_checksum": checksum.group(1) if checksum else None}


def write(rows: list[dict], rounds: int) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "sync_threads.json").write_text(json.dumps(rows, indent=2) + "\n")
    lines = [
        "# A multi-rank node's leader on its ranks' threads",
        "",
        "Truth: the runtime's own idle records of real CPU training on this machine "
        f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}): one node "
        "with two ranks under `torchrun --standalone` (one thread each, as torchrun sets), gloo, an 84 M-parameter "
        f"model, int8 wire format, {rounds} rounds per run, `comm.sync_threads: 1` and the default alternating. With "
        "one node the all-reduce is trivial, so the exposed sync is the leader's host work. "
        "Command: `python experiments/runtime/bench_sync_threads.py`.",
        "",
        "| sync | comm.sync_threads | leader's threads | exposed sync per round (median over runs of the per-run median) "
        "| exposed sync per run | idle share | final checksum |",
        "|---|---|---|---|---|---|---|",
    ]
    for overlap_name, overlap in OVERLAPS.items():
        for setting in (1, None):
            runs = [row for row in rows if row["overlap"] == overlap and row["sync_threads"] == setting]
            if not runs:
                continue
            checksums = ", ".join(sorted({str(row["final_checksum"]) for row in runs}))
            per_run = ", ".join(f"{row['comm_s']:.1f} s" for row in runs)
            shares = ", ".join(f"{row['idle_share']:.1%}" for row in runs)
            label = setting if setting is not None else "default"
            median_s = statistics.median(row["comm_s_per_round"] for row in runs)
            lines.append(f"| {overlap_name} | {label} | {runs[0]['leader_threads']} | {median_s:.2f} s | {per_run} | "
                         f"{shares} | {checksums} |")
    lines += ["", "The same final checksum in both settings: the leader's elementwise work gives the same bits on any "
              "number of threads. A site with more ranks and cores gives its leader more threads (its ranks' threads, "
              "within the node's share of the host's cores; runtime/host_threads.py)."]
    (RESULTS / "sync_threads.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--runs", type=int, default=2, help="runs of each setting (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=4, help="outer rounds per run (default: %(default)s)")
    args = parser.parse_args()
    if args.runs < 1 or args.rounds < 1:
        parser.error("--runs and --rounds must be at least 1")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("this machine has one core: the leader has no other rank's thread to borrow")
    rows = []
    with tempfile.TemporaryDirectory(prefix="sync-threads-") as scratch:
        for overlap in OVERLAPS.values():
            for index in range(args.runs):
                for setting in (1, None):
                    rows.append(run_once(Path(scratch), overlap, setting, args.rounds, index))
                    row = rows[-1]
                    print(f"  {overlap:9s} sync_threads={setting}: leader on {row['leader_threads']} threads, "
                          f"exposed sync {row['comm_s_per_round']:.2f} s per round", flush=True)
    write(rows, args.rounds)
    print((RESULTS / "sync_threads.md").read_text())


if __name__ == "__main__":
    main()
