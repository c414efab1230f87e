"""Measure real t(B) curves of the paper's four nodes as CPU shares, for the simulator's truth.

    sudo .venv/bin/python experiments/balancer/measure_cpu_curves.py     # about 3 minutes

Each of the paper's nodes becomes a real-compute site: a process in a cgroup limited
to a share of one core proportional to the node's speed in the paper (Table 3 fit,
experiments/configs/clusters/paper4.yaml), the four shares adding up to 1.6 cores.
The four processes run at once, as in a real run, each training the ``tiny`` model
(AdamW) at batch sizes 1..32 and timing every step. The result is written as a
cluster file, experiments/configs/clusters/paper4_cpu_measured.yaml, whose
``measured.points`` (median step time per batch) and ``measured.trace_s`` spread are
the simulator's ground truth: measured on real compute, not built from the predictor
the planner uses (which still plans from the nodes' GPU names, wrong in scale and shape).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PAPER_CLUSTER = ROOT / "experiments" / "configs" / "clusters" / "paper4.yaml"
OUT_CLUSTER = ROOT / "experiments" / "configs" / "clusters" / "paper4_cpu_measured.yaml"
TOTAL_CORES = 1.6
BATCH_SIZES = (1, 2, 4, 8, 16, 32)


def paper_shares(total_cores: float = TOTAL_CORES) -> dict[str, float]:
    """CPU share per paper node (the shares of ``run.sh --truth real``), adding up to ``total_cores``."""
    sys.path.insert(0, str(ROOT / "experiments" / "paper4"))
    from configs import real_shares
    return real_shares(total_cores)


def worker(args: argparse.Namespace) -> int:
    """One site: join its quota group, time ``--steps`` steps per batch size, print JSON lines."""
    import torch

    from geodiloco.lab.cpu_share import CpuQuota, find_cpu_hierarchy, group_name
    from geodiloco.predictor.workload import resolve_dims
    from geodiloco.runtime.models import build_model
    torch.set_num_threads(1)
    quota = CpuQuota(find_cpu_hierarchy(), group_name(os.getppid(), args.node), period_ms=20)
    quota.set_share(args.share)
    quota.add_process(os.getpid())
    try:
        model = build_model(resolve_dims(args.model), seed=0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for batch_size in args.batch_sizes:
            tokens = torch.randint(0, 256, (batch_size, args.seq_len + 1))
            times_s = []
            for step in range(args.warmup + args.steps):
                started = time.perf_counter()
                loss = model(tokens[:, :-1], tokens[:, 1:])
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                if step >= args.warmup:
                    times_s.append(time.perf_counter() - started)
            print(json.dumps({"node": args.node, "batch_size": batch_size, "times_s": times_s}), flush=True)
    finally:
        quota.release(os.getpid())
    return 0


def measure(args: argparse.Namespace) -> dict[str, dict[int, list[float]]]:
    from geodiloco.lab.site_procs import run_per_site
    shares = paper_shares(args.total_cores)
    names = list(shares)

    def argv_for_site(rank: int, _address: str) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--worker", "--node", names[rank],
                "--share", str(shares[names[rank]]), "--model", args.model, "--seq-len", str(args.seq_len),
                "--steps", str(args.steps), "--warmup", str(args.warmup),
                "--batch-sizes", *map(str, args.batch_sizes)]

    outputs = run_per_site(argv_for_site, len(names), None, timeout_s=1800, cwd=ROOT)
    return {names[rank]: {line["batch_size"]: line["times_s"] for line in lines} for rank, lines in enumerate(outputs)}


def cluster_file(curves: dict, args: argparse.Namespace) -> str:
    from geodiloco.balancer.cluster import load_cluster
    shares = paper_shares(args.total_cores)
    nodes = []
    for node in load_cluster(PAPER_CLUSTER).nodes:
        points = [{"batch_size": batch, "step_time_s": round(statistics.median(times), 5)}
                  for batch, times in sorted(curves[node.name].items())]
        nodes.append({"name": node.name, "site": node.site, "gpus": list(node.gpus),
                      "wan": node.wan.model_dump() if node.wan else None,
                      "measured": {"points": points}})
    spreads = {name: {batch: statistics.pstdev(times) / statistics.mean(times) for batch, times in by_batch.items()}
               for name, by_batch in curves.items()}
    header = [
        "# The paper's four nodes as real-compute sites on a 2-core CPU machine (written by",
        "# experiments/balancer/measure_cpu_curves.py; do not edit by hand).",
        f"# Each node: the `{args.model}` model (seq {args.seq_len}, AdamW, 1 thread) trained in a cgroup",
        f"# limited to a CPU share proportional to the node's speed in the paper (sum {args.total_cores:g} cores):",
        "#   " + ", ".join(f"{name} {share:g}" for name, share in shares.items()) + " cores;",
        f"# all four at once. measured.points = median of {args.steps} timed steps per batch (after "
        f"{args.warmup} warm-up).",
        "# Relative spread of the steps (std/mean) per node, over batch sizes: "
        + "; ".join(f"{name} {min(v.values()):.2f}-{max(v.values()):.2f}" for name, v in spreads.items()) + ".",
        "# The planner never reads measured:; it plans from the GPU names (wrong in scale and shape).",
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump({"nodes": nodes}, sort_keys=False)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="model preset that trains (default tiny)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sample (default 128)")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per batch size (default 8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per batch size (default 2)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=list(BATCH_SIZES))
    parser.add_argument("--total-cores", type=float, default=TOTAL_CORES, help="sum of the four shares (default 1.6)")
    parser.add_argument("--out", type=Path, default=OUT_CLUSTER, help="cluster file to write")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--node", help=argparse.SUPPRESS)
    parser.add_argument("--share", type=float, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    from geodiloco.lab.cpu_share import can_use_cpu_share
    usable, reason = can_use_cpu_share()
    if not usable:
        print(f"measure_cpu_curves: CPU quotas are not available here: {reason}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    curves = measure(args)
    args.out.write_text(cluster_file(curves, args))
    print(args.out.read_text())
    from geodiloco.lab.site_procs import display_path
    print(f"[measure_cpu_curves] wrote {display_path(args.out, ROOT)} in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
