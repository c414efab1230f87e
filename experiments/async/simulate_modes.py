"""Sync against async DiLoCo at 64 nodes, in the simulator (throughput and idle only).

    .venv/bin/python experiments/async/simulate_modes.py            # writes experiments/results/async/simulated.md
    .venv/bin/python experiments/async/simulate_modes.py --nodes 64 --links 1000,1000x10 --seeds 3

Cluster: 64 nodes, the source paper's four node kinds (four GPUs each) repeated 16 times; each
node's true step time at batch 4 is its kind's paper-fitted time (experiments/configs/clusters/
paper4.yaml) times a log-normal spread drawn once (std 0.3), and one node in eight is slowed
a further 2.5 x (older or shared cards): the fastest node is over 3 x the slowest. The planner
sees only GPU names and learns from measured steps. llama-150m, seq 1024, H = 100, batch 4.
Truth: the simulator's (``balancer.simulate.GroundTruth``: the file's ``measured:`` times, with
per-step noise 0.02, stragglers 1 %, drift 2 % per round), not the predictor.

- ``sync-uniform``: H everywhere, blocking fp32 ring all-reduce (``balancer.simulate``).
- ``sync-time``: ``time`` policy, streaming int8 sync in 4 fragments (``balancer.simulate``).
- ``async-fp32`` / ``async-int8``: every node runs the ``time`` policy's steps (dynamic local
  updates) at its true speed with the same noise; at each phase end it pushes its
  pseudo-gradient over its own link, and pulls the model (fp32, or an int8 difference) over
  the host's link, which serves pulls one at a time
  (first come, first served). Staleness = pushes the host applied between a node's pull and
  its push. Event-driven, until the sync-time run's wall-clock.

What the simulator can say: GPU idle (waiting + exposed transfer), tokens per hour, staleness,
and whether ``geodiloco plan``'s mode advice picked the mode with less idle. What it cannot:
convergence. It has no model of how loss depends on staleness or on the outer optimizer, so
"async has less idle" is not "async reaches a loss sooner"; the real-compute benchmark
(head_to_head.py) measures that.
"""
from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from geodiloco.balancer.mode_advice import advise_mode  # noqa: E402
from geodiloco.balancer.network import encoded_bytes  # noqa: E402
from geodiloco.balancer.setup import load_setup  # noqa: E402
from geodiloco.balancer.simulate import (GroundTruth, Stragglers, drift_matrix, run_fixed_steps,  # noqa: E402
                                         simulate)
from geodiloco.balancer.step_time import predictor_gpu_model  # noqa: E402

PAPER_CLUSTER = ROOT / "experiments" / "configs" / "clusters" / "paper4.yaml"
RESULTS = ROOT / "experiments" / "results" / "async"
SPREAD_SIGMA = 0.3
SLOW_EVERY = 8
SLOW_FACTOR = 2.5
ROUNDS = 30


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=64, help="cluster size (default 64)")
    parser.add_argument("--links", default="1000,100,1000x10",
                        help="comma-separated link cases: MBPS (every link) or MBPSxK (the host's link K times "
                             "faster); default 1000,100,1000x10")
    parser.add_argument("--seeds", type=int, default=3, help="clusters and noise draws per bandwidth (default 3)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def parse_link(case: str) -> tuple[float, float]:
    """``1000`` -> (1000, 1); ``1000x10`` -> (1000, 10): Mbit/s of every link, host link factor."""
    bandwidth, _, factor = case.partition("x")
    return float(bandwidth), float(factor or 1)


def cluster_file(count: int, bandwidth_mbps: float, seed: int, directory: Path, host_factor: float = 1.0) -> Path:
    """A ``count``-node cluster YAML whose ``measured:`` times are the simulator's truth."""
    kinds = yaml.safe_load(PAPER_CLUSTER.read_text())["nodes"]
    rng = np.random.default_rng(seed)
    nodes = []
    for index in range(count):
        kind = kinds[index % len(kinds)]
        step_s = kind["measured"]["step_time_s"] * float(np.exp(SPREAD_SIGMA * rng.standard_normal()))
        if index % SLOW_EVERY == SLOW_EVERY - 1:
            step_s *= SLOW_FACTOR
        link_mbps = bandwidth_mbps * (host_factor if index == 0 else 1.0)
        nodes.append({"name": f"n{index:03d}", "site": f"s{index:03d}", "gpus": kind["gpus"],
                      "wan": {"bandwidth_mbps": link_mbps, "latency_ms": 20.0},
                      "measured": {"batch_size": 4, "step_time_s": round(step_s, 5)}})
    data = {"model": {"preset": "llama-150m", "seq_len": 1024},
            "diloco": {"local_steps": 100, "batch_size": 4},
            "balancing": {"simulation": {"seed": seed}}, "nodes": nodes}
    path = directory / f"cluster-{count}-{int(bandwidth_mbps)}mbps-host{host_factor:g}x-seed{seed}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sync_case(path: Path, policy: str, overlap: str, compression: str) -> dict:
    setup = load_setup(str(path), policy=policy, overlap=overlap, compression=compression)
    planner = setup.planner()
    result = simulate(planner, ROUNDS)
    node_s = result.wall_s * len(result.nodes)
    return {"idle_share": float(result.idle_s.sum()) / node_s, "wait_share": float(result.wait_s.sum()) / node_s,
            "sync_share": float(result.comm_s.sum()) / node_s, "wall_s": result.wall_s,
            "tokens_per_hour": float(result.tokens.sum()) / result.wall_s * 3600, "staleness": [],
            "planner": planner}


def async_case(path: Path, balanced_planner, wall_s: float, seed: int, codec: str) -> dict:
    """Event simulation of async DiLoCo with the balanced planner's steps (see the module docstring)."""
    setup = load_setup(str(path), policy="time")
    planner = balanced_planner
    nodes = planner.nodes
    settings = setup.balancing.simulation
    rng = np.random.default_rng(seed + 1000)
    truth = GroundTruth(nodes, planner.bank, settings, planner.batch_size,
                        predictor_gpu_model(planner.dims, planner.seq_len, planner.precision), rng)
    plan = planner.plan_arrays(ROUNDS)
    true_step_s = truth.step_s(plan.batch_size, plan.micro_batch_size)
    stragglers = Stragglers(settings.straggler_prob, *settings.straggler_factor)
    payload_bits = 8.0 * encoded_bytes(codec, planner.sync.num_params)
    bandwidth_bps = np.array([node.wan.bandwidth_mbps * 1e6 for node in nodes])
    latency_s = np.array([node.wan.latency_ms / 1e3 for node in nodes])
    push_s = payload_bits / bandwidth_bps + latency_s
    pull_s = payload_bits / bandwidth_bps[0] + latency_s
    push_s[0], pull_s[0] = 0.0, 0.0  # the host's own copy
    count = len(nodes)
    cycles = 4 * ROUNDS
    drift = drift_matrix(cycles, count, settings.drift_per_round, rng)
    compute_s = np.zeros(count)
    idle_s = np.zeros(count)
    tokens = 0.0
    staleness: list[int] = []
    version, host_free = 0, 0.0
    cycle = np.zeros(count, dtype=np.int64)
    pulled_version = np.zeros(count, dtype=np.int64)
    events = []
    for node in range(count):
        spent = float(run_fixed_steps(true_step_s[node:node + 1] * drift[0, node], plan.local_steps[node:node + 1],
                                      truth.noise[node:node + 1], rng, stragglers)[0])
        compute_s[node] += spent
        heapq.heappush(events, (spent + push_s[node], node, spent))
    while events:
        arrived, node, _ = heapq.heappop(events)
        if arrived > wall_s:
            continue
        staleness.append(int(version - pulled_version[node]))
        version += 1
        tokens += float(plan.local_steps[node] * plan.batch_size[node] * planner.seq_len)
        pull_start = max(arrived, host_free) if node != 0 else arrived
        pull_end = pull_start + pull_s[node]
        if node != 0:
            host_free = pull_end
        pulled_version[node] = version
        phase_end_before = arrived - push_s[node]
        idle_s[node] += pull_end - phase_end_before
        cycle[node] += 1
        row = min(int(cycle[node]), cycles - 1)
        spent = float(run_fixed_steps(true_step_s[node:node + 1] * drift[row, node], plan.local_steps[node:node + 1],
                                      truth.noise[node:node + 1], rng, stragglers)[0])
        compute_s[node] += spent
        heapq.heappush(events, (pull_end + spent + push_s[node], node, spent))
    node_s = compute_s + idle_s
    return {"idle_share": float(idle_s.sum() / node_s.sum()), "wait_share": 0.0,
            "sync_share": float(idle_s.sum() / node_s.sum()), "wall_s": wall_s,
            "tokens_per_hour": tokens / wall_s * 3600, "staleness": staleness}


def run(args: argparse.Namespace) -> dict:
    directory = args.results / "simulated_clusters"
    directory.mkdir(parents=True, exist_ok=True)
    rows = {}
    for case in [item.strip() for item in args.links.split(",") if item.strip()]:
        bandwidth, host_factor = parse_link(case)
        per_mode: dict[str, list[dict]] = {"sync-uniform": [], "sync-time": [], "async-fp32": [], "async-int8": []}
        advice_right = []
        for seed in range(args.seeds):
            path = cluster_file(args.nodes, bandwidth, seed, directory, host_factor)
            per_mode["sync-uniform"].append(sync_case(path, "uniform", "none", "none"))
            balanced = sync_case(path, "time", "streaming", "int8")
            per_mode["sync-time"].append(balanced)
            for codec, mode in (("none", "async-fp32"), ("int8", "async-int8")):
                per_mode[mode].append(async_case(path, balanced["planner"], balanced["wall_s"], seed, codec))
            planner = balanced["planner"]
            advice = advise_mode(planner.to_plan(planner.plan_arrays(ROUNDS)), planner.nodes,
                                 planner.sync.num_params, planner.sync.measured_factor, codec="int8")
            winner = "async" if per_mode["async-int8"][-1]["idle_share"] < balanced["idle_share"] else "sync"
            advice_right.append({"advised": advice.recommended, "simulated_less_idle": winner,
                                 "predicted_sync_idle": advice.sync_idle_share,
                                 "predicted_async_idle": advice.async_idle_share})
        rows[case] = {"modes": {mode: summarize(cases) for mode, cases in per_mode.items()},
                                  "advice": advice_right}
    return rows


def summarize(cases: list[dict]) -> dict:
    stale = [value for case in cases for value in case["staleness"]]
    return {key: (statistics.fmean(case[key] for case in cases), statistics.pstdev(case[key] for case in cases))
            for key in ("idle_share", "sync_share", "tokens_per_hour")} | {
        "staleness_median": float(np.median(stale)) if stale else None,
        "staleness_worst": int(max(stale)) if stale else None}


def report(rows: dict, args: argparse.Namespace) -> str:
    lines = ["# Sync against async DiLoCo at 64 nodes, simulated", "",
             f"{args.nodes} nodes (the paper's four node kinds x {args.nodes // 4}, each node's true step time "
             f"spread log-normally (std {SPREAD_SIGMA}) and one in {SLOW_EVERY} slowed {SLOW_FACTOR} x), "
             f"llama-150m, H = 100, batch 4, {ROUNDS} rounds of sync-time, async run to the same wall-clock; "
             f"{args.seeds} cluster draws per bandwidth (mean ± std). Truth: the simulator's `measured:` times with "
             "noise, stragglers and drift, not the predictor. The simulator says nothing about convergence.", ""]
    for case, row in rows.items():
        bandwidth, host_factor = parse_link(case)
        host = "" if host_factor == 1 else f"; the host's link {bandwidth * host_factor:g} Mbit/s"
        lines += [f"## Links {bandwidth:g} Mbit/s, 20 ms{host}", "",
                  "| mode | total GPU idle | exposed sync / transfer | tokens per hour (M) | staleness median / worst |",
                  "|---|---|---|---|---|"]
        for mode, stats in row["modes"].items():
            stale = "-" if stats["staleness_median"] is None else \
                f"{stats['staleness_median']:g} / {stats['staleness_worst']}"
            lines.append(f"| {mode} | {stats['idle_share'][0] * 100:.1f} % ± {stats['idle_share'][1] * 100:.1f} | "
                         f"{stats['sync_share'][0] * 100:.1f} % | {stats['tokens_per_hour'][0] / 1e6:.1f} | {stale} |")
        right = sum(item["advised"] == item["simulated_less_idle"] for item in row["advice"])
        advised = ", ".join(f"{mode} in {sum(item['advised'] == mode for item in row['advice'])}"
                            for mode in ("sync", "async") if any(item["advised"] == mode for item in row["advice"]))
        lines += ["", f"`geodiloco plan` (async with int8) advised {advised} draws; the simulation had less idle "
                      f"with that mode (sync-time against async-int8) in {right} of {len(row['advice'])} draws.", ""]
    lines += [f"Regenerate: `{' '.join(['.venv/bin/python experiments/async/simulate_modes.py', *sys.argv[1:]])}`."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.results = args.results.resolve()
    args.results.mkdir(parents=True, exist_ok=True)
    rows = run(args)
    text = report(rows, args)
    (args.results / "simulated.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.results / "simulated.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
