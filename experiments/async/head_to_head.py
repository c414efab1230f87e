"""Benchmark: asynchronous DiLoCo (delayed Nesterov + dynamic local updates) against balanced
synchronous DiLoCo, on loss against wall-clock.

    sudo .venv/bin/python experiments/async/head_to_head.py                  # 3 modes x iid/non-iid x 3 seeds
    sudo .venv/bin/python experiments/async/head_to_head.py --seeds 1 --wall-s 40 --shards iid
    .venv/bin/python experiments/async/head_to_head.py --analyze-only        # redo the tables from the kept logs

Cluster: the source paper's four sites as network namespaces joined by tbf-shaped veths (real
TCP; links slowed so the tiny model's fp32 sync takes the share of a round that llama-150m's
takes at 1 Gbit/s, as experiments/sync/hide_sync.py), each node training the ``tiny`` model on
real compute in a cgroup limited to a CPU share: the fastest gets ``FAST_OVER_SLOW`` x the
slowest's share. Truth: real compute and real TCP, not the planner's model. Modes:

- ``sync-uniform``: DiLoCo as published (every node H steps, blocking fp32 sync);
- ``sync-time``: the ``time`` policy with the best overlap setting of the sync benchmark
  (streaming, int8);
- ``async-fp32`` / ``async-int8``: ``diloco.mode: async`` (delayed Nesterov, dynamic local updates
  from the ``adaptive`` policy), pushes and pulls in fp32 or int8 (error feedback, pulls as
  differences from the host's shadow of the node's model).

Every run stops at the first outer boundary after ``--wall-s`` seconds (``run.max_wall_s``), then
`geodiloco evaluate` scores every kept global checkpoint on 512 held-out sequences. Reported per
mode and shard mode, over seeds: time to a target eval loss, eval loss at equal wall-clock and at
equal tokens, total GPU idle (wait + exposed sync + other), staleness (async). Writes
experiments/results/async/ (tables, eval loss against wall-clock as PNG) and the README block
between ``<!-- async:start -->`` and ``<!-- async:end -->``. Needs root (namespaces, cgroups).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "experiments" / "paper4"))
sys.path.insert(0, str(ROOT))

import configs  # noqa: E402
from evidence import interpolate, spread  # noqa: E402
from results_data import read_jsonl  # noqa: E402
from runner import display_path, require_lab, run_policy, start_manifest  # noqa: E402

from geodiloco.balancer.policies import ASYNC_WEIGHTING  # noqa: E402
from geodiloco.report.readme_block import replace_marked_block  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "async"
README = ROOT / "README.md"
START, END = "<!-- async:start -->", "<!-- async:end -->"
MODES = ("sync-uniform", "sync-time", "async-fp32", "async-int8")
ASYNC_CODECS = {"async-fp32": "none", "async-int8": "int8"}
SHARDS = ("iid", "non_iid")
FAST_OVER_SLOW = 3.2
CPU_SHARES = {"node1": 0.20, "node2": 0.24, "node3": 0.64, "node4": 0.32}
"""CPU cores per node (node3, the paper's A30 node, is the fastest: 3.2 x node1)."""
ROUND_CAP = 10_000
"""``diloco.rounds`` is set out of reach: ``run.max_wall_s`` ends every run."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="runs per case with seeds 0..N-1 (default 3)")
    parser.add_argument("--wall-s", type=float, default=75.0, help="run.max_wall_s of every run (default 75)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated modes (default all)")
    parser.add_argument("--shards", default=",".join(SHARDS), help="comma-separated data.shards (default iid,non_iid)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="output folder (default experiments/results/async)")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "async", help="scratch run directories")
    parser.add_argument("--analyze-only", action="store_true", help="redo the tables from the kept logs")
    return parser.parse_args(argv)


def case_config(mode: str, shards: str, seed: int, wall_s: float) -> dict:
    scaling = configs.Scaling(rounds=ROUND_CAP, wan="scaled", truth="real")
    policy = "uniform" if mode == "sync-uniform" else "time"
    config = configs.run_config(policy, scaling, configs.PAPER, seed=seed, shards=shards, offline_eval=True)
    config["run"].update({"name": f"h2h-{mode}-{shards}", "max_wall_s": wall_s})
    diloco = config["diloco"]
    if mode == "sync-time":
        diloco.update({"overlap": "streaming", "compression": "int8", "fragments": 4})
    if mode in ASYNC_CODECS:
        # weighting as configured (`auto`): tokens in async mode (experiments/async/weighting.py chose it)
        diloco.update({"mode": "async", "compression": ASYNC_CODECS[mode]})
        del diloco["overlap"]
        config["balancing"]["policy"] = "adaptive"  # dynamic local updates: re-planned as speeds are heard of
    for node in config["nodes"]:
        node["emulate"]["cpu_share"] = CPU_SHARES[node["name"]]
    return config


def run_cases(args: argparse.Namespace) -> None:
    require_lab("head_to_head")
    modes = [name.strip() for name in args.modes.split(",") if name.strip()]
    shard_modes = [name.strip() for name in args.shards.split(",") if name.strip()]
    jobs = [(mode, shards, seed) for seed in range(args.seeds) for shards in shard_modes for mode in modes]
    manifest_path = args.results / "manifest.json"
    command = " ".join(["experiments/async/head_to_head.py", *sys.argv[1:]])
    bandwidth_mbps = configs.Scaling(rounds=ROUND_CAP, wan="scaled", truth="real").bandwidth_mbps()
    manifest, previous = start_manifest(manifest_path, command, {run_name(*job) for job in jobs},
                                        {"wall_s": args.wall_s, "cpu_shares": CPU_SHARES,
                                         "fast_over_slow": FAST_OVER_SLOW, "bandwidth_mbps": bandwidth_mbps,
                                         "async_weighting": ASYNC_WEIGHTING})
    started = time.perf_counter()
    for position, job in enumerate(jobs, 1):
        name = run_name(*job)
        outcome = run_policy(name, case_config(*job, args.wall_s), ROOT, args.results / "configs", args.runs_dir,
                             args.results / "runs", "netns")
        shutil.rmtree(args.runs_dir / name, ignore_errors=True)  # checkpoints: evaluated, no longer needed
        manifest["runs"].append({"name": name, "command": outcome.command, "duration_s": outcome.duration_s})
        print(f"[async] {position}/{len(jobs)} {name}: {outcome.duration_s:.0f} s", flush=True)
        manifest["total_s"] = previous.get("total_s", 0.0) + time.perf_counter() - started
        manifest["load_average_at_end"] = list(os.getloadavg())
        manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")


def run_name(mode: str, shards: str, seed: int) -> str:
    return f"{mode}-{shards}-seed{seed}"


def eval_curve(run_dir: Path, start_s: float) -> tuple[list[float], list[float], list[float]]:
    """(seconds since the run started, tokens trained by then, eval loss) of every evaluated global
    checkpoint. A checkpoint of round r is the state logged with the global metrics row of round r;
    tokens are every node-phase reported up to that row (async: the host's row counts the phases
    the others reported by its pull)."""
    rows = [row for row in read_jsonl(run_dir / "metrics.jsonl") if row.get("node") == "global" and not row.get("final")]
    cumulative, by_round = 0.0, {}
    for row in rows:
        cumulative += row["tokens"]
        by_round[row["round"]] = (row["wall_s"] - start_s, cumulative)
    points = sorted((by_round[row["round"]][0], by_round[row["round"]][1], row["eval_loss"])
                    for row in read_jsonl(run_dir / "eval.jsonl") if row["round"] in by_round)
    return [point[0] for point in points], [point[1] for point in points], [point[2] for point in points]


def run_numbers(run_dir: Path) -> dict:
    idle = read_jsonl(run_dir / "idle.jsonl")
    start_s = min(row["round_start"] for row in idle)
    node_s = sum(row["round_end"] - row["round_start"] for row in idle)
    total = {key: sum(row.get(key, 0.0) for row in idle) for key in ("compute_s", "wait_s", "comm_s", "overhead_s")}
    wall_s, tokens, loss = eval_curve(run_dir, start_s)
    staleness = [row["staleness"] for row in idle if row.get("staleness") is not None]
    return {"idle_share": (total["wait_s"] + total["comm_s"] + total["overhead_s"]) / node_s,
            "wait_share": total["wait_s"] / node_s, "sync_share": total["comm_s"] / node_s,
            "other_share": total["overhead_s"] / node_s, "utilization": total["compute_s"] / node_s,
            "phases": len(idle), "tokens": float(sum(row["tokens"] for row in idle)),
            "staleness": staleness, "curve_wall_s": wall_s, "curve_tokens": tokens, "curve_loss": loss}


def load_cases(results: Path) -> dict[tuple[str, str], dict[int, dict]]:
    cases: dict[tuple[str, str], dict[int, dict]] = {}
    for run_dir in sorted((results / "runs").glob("*-seed*")):
        if not (run_dir / "eval.jsonl").is_file():
            continue
        stem, _, seed = run_dir.name.rpartition("-seed")
        shards = next(item for item in SHARDS if stem.endswith("-" + item))
        mode = stem[:-len(shards) - 1]
        cases.setdefault((mode, shards), {})[int(seed)] = run_numbers(run_dir)
    return cases


def time_to_loss(numbers: dict, target: float) -> float:
    """Seconds until the eval curve (linearly interpolated) first reaches ``target``; nan if never."""
    xs, ys = numbers["curve_wall_s"], numbers["curve_loss"]
    for position, loss in enumerate(ys):
        if loss <= target:
            if position == 0:
                return xs[0]
            x0, x1, y0, y1 = xs[position - 1], xs[position], ys[position - 1], loss
            return x0 + (x1 - x0) * (y0 - target) / (y0 - y1) if y0 != y1 else x1
    return float("nan")


def shard_rows(cases: dict, shards: str) -> tuple[list[dict], dict]:
    """One row per mode for ``shards``, with the comparison points shared by all of them."""
    runs = [numbers for (mode, item), by_seed in cases.items() if item == shards for numbers in by_seed.values()]
    points = {"equal_wall_s": min(numbers["curve_wall_s"][-1] for numbers in runs),
              "equal_tokens": min(numbers["curve_tokens"][-1] for numbers in runs),
              # the loss every run reaches: the highest of the runs' best losses
              "target_loss": max(min(numbers["curve_loss"]) for numbers in runs)}
    rows = []
    for mode in [name for name in MODES if (name, shards) in cases]:
        by_seed = cases[(mode, shards)]
        stale = [value for numbers in by_seed.values() for value in numbers["staleness"]]
        rows.append({
            "mode": mode, "shards": shards, "seeds": sorted(by_seed),
            "time_to_target_s": spread([time_to_loss(numbers, points["target_loss"]) for numbers in by_seed.values()]),
            "loss_at_equal_wall": spread([interpolate(n["curve_wall_s"], n["curve_loss"], points["equal_wall_s"])
                                          for n in by_seed.values()]),
            "loss_at_equal_tokens": spread([interpolate(n["curve_tokens"], n["curve_loss"], points["equal_tokens"])
                                            for n in by_seed.values()]),
            **{key: spread([numbers[key] for numbers in by_seed.values()])
               for key in ("idle_share", "wait_share", "sync_share", "other_share", "utilization", "tokens")},
            "staleness_median": float(np.median(stale)) if stale else None,
            "staleness_worst": int(max(stale)) if stale else None,
        })
    return rows, points


def pct(stats: dict) -> str:
    return f"{stats['mean'] * 100:.1f} % ± {stats['std'] * 100:.1f}"


def plus_minus(stats: dict, digits: int = 3) -> str:
    return "-" if stats["n"] == 0 else f"{stats['mean']:.{digits}f} ± {stats['std']:.{digits}f}"


def table(rows: list[dict], points: dict) -> str:
    header = ["mode", f"time to eval loss {points['target_loss']:.3f} (s)",
              f"eval loss @ {points['equal_wall_s']:.0f} s", f"eval loss @ {points['equal_tokens'] / 1e6:.2f}M tokens",
              "total GPU idle", "waiting", "exposed sync", "other", "tokens trained (M)", "staleness median / worst"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        stale = "-" if row["staleness_median"] is None else f"{row['staleness_median']:g} / {row['staleness_worst']}"
        lines.append("| " + " | ".join([
            row["mode"], plus_minus(row["time_to_target_s"], 1), plus_minus(row["loss_at_equal_wall"]),
            plus_minus(row["loss_at_equal_tokens"]), pct(row["idle_share"]), pct(row["wait_share"]),
            pct(row["sync_share"]), pct(row["other_share"]),
            f"{row['tokens']['mean'] / 1e6:.2f} ± {row['tokens']['std'] / 1e6:.2f}", stale]) + " |")
    return "\n".join(lines)


def plot(cases: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shard_modes = [item for item in SHARDS if any(key[1] == item for key in cases)]
    figure, axes = plt.subplots(1, len(shard_modes), figsize=(6 * len(shard_modes), 4), squeeze=False)
    colors = {"sync-uniform": "tab:gray", "sync-time": "tab:blue", "async-fp32": "tab:orange", "async-int8": "tab:red"}
    for axis, shards in zip(axes[0], shard_modes):
        for mode in MODES:
            for seed, numbers in sorted(cases.get((mode, shards), {}).items()):
                axis.plot(numbers["curve_wall_s"], numbers["curve_loss"], color=colors[mode], alpha=0.8,
                          label=mode if seed == min(cases[(mode, shards)]) else None)
        axis.set_title(f"shards: {shards}")
        axis.set_xlabel("wall-clock (s)")
        axis.set_ylabel("eval loss (512 held-out sequences)")
        axis.legend()
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def best_async(by_mode: dict) -> str | None:
    """The async mode with the lower loss at equal wall-clock (None when no async mode ran)."""
    present = [mode for mode in ASYNC_CODECS if mode in by_mode]
    return min(present, key=lambda mode: by_mode[mode]["loss_at_equal_wall"]["mean"]) if present else None


def plan_advice(run_dir: Path, codec: str):
    """What ``geodiloco plan`` advises for this cluster once it has seen a balanced sync run's measured
    steps (``runtime.config`` + ``balancer.mode_advice``, the same code as the CLI)."""
    from geodiloco.balancer.mode_advice import advise_mode
    from geodiloco.balancer.network import SyncSettings
    from geodiloco.balancer.plan import RoundMeasurement
    from geodiloco.balancer.planner import Planner
    from geodiloco.runtime.config import load_config
    config = load_config(str(run_dir / "config.yaml"), [])
    diloco = config.diloco
    planner = Planner(config.balancing, config.nodes, config.model.dims(), config.model.seq_len, diloco.local_steps,
                      diloco.batch_size, config.model.precision,
                      sync_settings=SyncSettings(diloco.overlap, diloco.compression, diloco.fragments))
    idle = read_jsonl(run_dir / "idle.jsonl")
    for row in idle:
        planner.observe(RoundMeasurement(node=row["node"], round=row["round"], batch_size=row["batch_size"],
                                         local_steps=row["local_steps"], step_times_s=[], compute_s=row["compute_s"]))
    plan = planner.plan(max(row["round"] for row in idle) + 1)
    return advise_mode(plan, config.nodes, planner.sync.num_params, planner.sync.measured_factor, codec=codec)


def advice_line(results: Path, shards: str, rows: list[dict]) -> str:
    run_dir = results / "runs" / run_name("sync-time", shards, 0)
    by_mode = {row["mode"]: row for row in rows}
    async_mode = best_async(by_mode)
    if not (run_dir / "config.yaml").is_file() or async_mode is None or "sync-time" not in by_mode:
        return ""
    advice = plan_advice(run_dir, ASYNC_CODECS[async_mode])
    faster = "async" if by_mode[async_mode]["loss_at_equal_wall"]["mean"] < \
        by_mode["sync-time"]["loss_at_equal_wall"]["mean"] else "sync"
    less_idle = "async" if by_mode[async_mode]["idle_share"]["mean"] < by_mode["sync-time"]["idle_share"]["mean"] \
        else "sync"
    return (f"`geodiloco plan` (after the sync-time run's measured steps, async as {async_mode}) advises "
            f"**{advice.recommended}**: "
            f"{advice.reason}. Measured: {faster} reached the lower loss at equal wall-clock and {less_idle} had less "
            f"GPU idle, so the advice was {'right' if advice.recommended == faster else 'wrong'}.")


def verdict(rows: list[dict]) -> str:
    by_mode = {row["mode"]: row for row in rows}
    async_mode = best_async(by_mode)
    if async_mode is None or "sync-time" not in by_mode:
        return ""
    sync, async_ = by_mode["sync-time"], by_mode[async_mode]
    wall_gap = async_["loss_at_equal_wall"]["mean"] - sync["loss_at_equal_wall"]["mean"]
    winner = async_mode if wall_gap < 0 else "balanced sync (sync-time)"
    return (f"At equal wall-clock, {winner} reaches the lower eval loss ({abs(wall_gap):.3f} apart; "
            f"sync-time {sync['loss_at_equal_wall']['mean']:.3f}, {async_mode} "
            f"{async_['loss_at_equal_wall']['mean']:.3f}); total GPU idle: sync-time "
            f"{sync['idle_share']['mean'] * 100:.1f} %, {async_mode} {async_['idle_share']['mean'] * 100:.1f} %.")


def analyze(results: Path) -> str:
    manifest = json.loads((results / "manifest.json").read_text())
    cases = load_cases(results)
    sections, summary = [], {}
    readme_lines = []
    for shards in [item for item in SHARDS if any(key[1] == item for key in cases)]:
        rows, points = shard_rows(cases, shards)
        summary[shards] = {"rows": rows, "points": points}
        advice = advice_line(results, shards, rows)
        sections += [f"## Shards: {shards}", "", table(rows, points), "", verdict(rows), "", advice, ""]
        readme_lines += [f"**{shards}**", "", table(rows, points), "", verdict(rows), "", advice, ""]
    plot(cases, results / "loss_vs_wall.png")
    (results / "head_to_head.json").write_text(json.dumps(summary, indent=1) + "\n")
    shares = ", ".join(f"{name} {share:g}" for name, share in manifest["cpu_shares"].items())
    text = "\n".join([
        "# Asynchronous DiLoCo against balanced synchronous DiLoCo",
        "",
        f"Four sites as network namespaces behind tbf-shaped links of {manifest['bandwidth_mbps']:.3g} Mbit/s (real "
        f"TCP), each node training the tiny model on real compute in a cgroup CPU share ({shares} cores; the fastest "
        f"{manifest['fast_over_slow']:g} x the slowest). Every run stops at the first outer boundary after "
        f"{manifest['wall_s']:g} s (`run.max_wall_s`); every kept global checkpoint is scored on 512 held-out "
        "sequences afterwards. Mean ± std over seeds. Truth: real compute and real TCP, not the planner's model.",
        "",
        "Modes: `sync-uniform` = DiLoCo as published (H steps everywhere, blocking fp32 sync); `sync-time` = the "
        "`time` policy with streaming int8 sync (the sync benchmark's best); `async-fp32` / `async-int8` = "
        "`diloco.mode: async` (delayed Nesterov with N = 4, dynamic local updates from the `adaptive` policy, "
        f"`{manifest.get('async_weighting', 'normalized')}` outer weighting: what `weighting: auto` plans in async "
        "mode, chosen in experiments/async/weighting.py ([weighting.md](weighting.md))), pushes and pulls through "
        "the host node's link in fp32 or int8 (error feedback; pulls as differences).",
        "",
        "Target loss: the highest of all runs' best eval losses (every run reaches it). Idle shares are of node "
        "time; waiting in async is the time a push waited behind other nodes' updates at the host and, at the "
        "end, for the others to finish. Staleness: global versions applied between a node's pull and its update.",
        "",
        *sections,
        "![eval loss against wall-clock](loss_vs_wall.png)",
        "",
        "Regenerate: " + "; then ".join(f"`sudo .venv/bin/python {command}`" for command in manifest["commands"])
        + f" ({manifest.get('total_s', 0) / 60:.0f} min; load average {manifest['load_average_at_start'][0]:.1f} at "
        f"the last start).",
    ])
    (results / "head_to_head.md").write_text(text + "\n")
    if results.resolve() == RESULTS.resolve() and README.is_file() and START in README.read_text():
        replace_marked_block(README, START, END, "\n".join(readme_lines).strip())  # the committed results only
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.results = args.results.resolve()
    if args.analyze_only and not (args.results / "manifest.json").is_file():
        print(f"[async] error: --analyze-only: {args.results} has no manifest.json; give the --results of an "
              "earlier run, or leave out --analyze-only", file=sys.stderr)
        return 2
    args.results.mkdir(parents=True, exist_ok=True)
    if not args.analyze_only:
        run_cases(args)
    print(analyze(args.results))
    print(f"[async] results in {display_path(args.results, ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
