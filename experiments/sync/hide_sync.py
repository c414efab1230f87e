"""Benchmark: how much of the outer sync each overlap mode and codec hides, and what it costs in loss.

    .venv/bin/python experiments/sync/hide_sync.py                 # 3 seeds x overlap none/delayed/streaming x none/int8
    .venv/bin/python experiments/sync/hide_sync.py --seeds 1 --rounds 4 --overlaps none,delayed --compressions none
    .venv/bin/python experiments/sync/hide_sync.py --analyze-only  # redo the tables from the kept logs

The paper's four-node cluster on real compute (each node a cgroup with a CPU share in the paper's
proportions, as ``experiments/paper4/run.sh --truth real``), the ``time`` policy, links slowed so
the tiny model's outer sync takes the share of a round that llama-150m's takes at 1 Gbit/s
(``--wan scaled``: tbf-shaped veths between network namespaces, real TCP). Every run is
`geodiloco run`, then `geodiloco evaluate` scores every round's global model on 512 held-out
sequences. Per case, over seeds: compute utilization, total GPU idle (wait + exposed sync +
other), the sync hidden behind compute, bytes on the wire per node and round (measured on each
site's link by the kernel, and as the runtime counts its payload), eval loss at equal tokens and
at equal wall-clock. Needs root (namespaces, cgroups). Writes experiments/results/sync/ and the
README block between ``<!-- sync:start -->`` and ``<!-- sync:end -->``.
"""
from __future__ import annotations

import argparse
import json
import os
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

from geodiloco.report.readme_block import replace_marked_block  # noqa: E402

RESULTS = ROOT / "experiments" / "results" / "sync"
README = ROOT / "README.md"
START, END = "<!-- sync:start -->", "<!-- sync:end -->"
POLICY = "time"
OVERLAPS = ("none", "delayed", "streaming")
COMPRESSIONS = ("none", "int8")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="runs per case with seeds 0..N-1 (default 3)")
    parser.add_argument("--rounds", type=int, default=6, help="outer rounds per run (default 6)")
    parser.add_argument("--overlaps", default=",".join(OVERLAPS), help="comma-separated diloco.overlap values")
    parser.add_argument("--compressions", default=",".join(COMPRESSIONS),
                        help="comma-separated diloco.compression values")
    parser.add_argument("--fragments", type=int, default=4, help="diloco.fragments for streaming (default 4)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="output folder (default experiments/results/sync)")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "sync", help="full run directories")
    parser.add_argument("--analyze-only", action="store_true", help="redo the tables from the kept logs")
    return parser.parse_args(argv)


def case_name(overlap: str, compression: str) -> str:
    return f"{overlap}-{compression}"


def case_config(overlap: str, compression: str, seed: int, rounds: int, fragments: int) -> dict:
    scaling = configs.Scaling(rounds=rounds, wan="scaled", truth="real")
    config = configs.run_config(POLICY, scaling, configs.PAPER, seed=seed, offline_eval=True)
    config["run"]["name"] = f"sync-{case_name(overlap, compression)}"
    config["diloco"].update({"overlap": overlap, "compression": compression, "fragments": fragments})
    return config


def run_cases(args: argparse.Namespace) -> None:
    require_lab("hide_sync")
    overlaps = [name.strip() for name in args.overlaps.split(",") if name.strip()]
    compressions = [name.strip() for name in args.compressions.split(",") if name.strip()]
    jobs = [(overlap, compression, seed) for seed in range(args.seeds) for overlap in overlaps
            for compression in compressions]
    manifest_path = args.results / "manifest.json"
    names = {f"{case_name(overlap, compression)}-seed{seed}" for overlap, compression, seed in jobs}
    command = " ".join(["experiments/sync/hide_sync.py", *sys.argv[1:]])
    manifest, previous = start_manifest(manifest_path, command, names, {
        "policy": POLICY, "rounds": args.rounds, "seeds": args.seeds, "fragments": args.fragments,
        "cpu_shares": configs.real_shares(),
        "bandwidth_mbps": configs.Scaling(rounds=args.rounds, wan="scaled", truth="real").bandwidth_mbps()})
    started = time.perf_counter()
    for position, (overlap, compression, seed) in enumerate(jobs, 1):
        name = f"{case_name(overlap, compression)}-seed{seed}"
        config = case_config(overlap, compression, seed, args.rounds, args.fragments)
        outcome = run_policy(name, config, ROOT, args.results / "configs", args.runs_dir, args.results / "runs",
                             "netns")
        manifest["runs"].append({"name": name, "command": outcome.command, "duration_s": outcome.duration_s})
        print(f"[sync] {position}/{len(jobs)} {name}: {outcome.duration_s:.0f} s", flush=True)
    manifest["total_s"] = previous.get("total_s", 0.0) + time.perf_counter() - started
    manifest["load_average_at_end"] = list(os.getloadavg())
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")


def phase_shares(records: list[dict]) -> dict:
    """Shares of node time (sum over the records' wall time) of each phase, and compute utilization."""
    wall_s = sum(row["round_end"] - row["round_start"] for row in records)
    total = {key: sum(row.get(key, 0.0) for row in records)
             for key in ("compute_s", "wait_s", "comm_s", "overhead_s", "comm_hidden_s")}
    return {"utilization": total["compute_s"] / wall_s,
            "idle_share": (total["wait_s"] + total["comm_s"] + total["overhead_s"]) / wall_s,
            "wait_share": total["wait_s"] / wall_s, "sync_share": total["comm_s"] / wall_s,
            "other_share": total["overhead_s"] / wall_s, "hidden_share": total["comm_hidden_s"] / wall_s}


def run_numbers(run_dir: Path) -> dict:
    """One run's phase shares in three views, bytes per node-round and its eval curve.

    Views: ``warm`` = rounds 1+ (round 0 plans from the prior alone); ``steady`` = rounds 1 to
    R-2 (also without the last round, whose outer step drains every sync in flight); ``all``."""
    idle = read_jsonl(run_dir / "idle.jsonl")
    rounds = sorted({row["round"] for row in idle})
    start_s = min(row["round_start"] for row in idle)
    metrics = {row["round"]: row for row in read_jsonl(run_dir / "metrics.jsonl") if row.get("node") == "global"}
    evals = sorted(read_jsonl(run_dir / "eval.jsonl"), key=lambda row: row["round"])
    traffic_path = run_dir / "site_traffic.json"
    traffic = json.loads(traffic_path.read_text()) if traffic_path.is_file() else {}
    numbers = {"rounds": len(rounds),
               "runtime_bytes_per_round": float(np.mean([row.get("sync_bytes", 0) for row in idle])),
               "link_bytes_per_round": (float(np.mean([site["tx_bytes"] for site in traffic.values()])) / len(rounds)
                                        if traffic else float("nan")),
               "curve_tokens": np.cumsum([metrics[row["round"]]["tokens"] for row in evals]).astype(float).tolist(),
               "curve_wall_s": [metrics[row["round"]]["wall_s"] - start_s for row in evals],
               "curve_loss": [row["eval_loss"] for row in evals]}
    views = {"warm": [row for row in idle if row["round"] >= 1],
             "steady": [row for row in idle if 1 <= row["round"] < rounds[-1]],
             "all": idle}
    for label, records in views.items():
        for key, value in phase_shares(records).items():
            numbers[f"{label}_{key}"] = value
    return numbers


def load_cases(results: Path) -> dict[str, dict[int, dict]]:
    cases: dict[str, dict[int, dict]] = {}
    for run_dir in sorted((results / "runs").glob("*-seed*")):
        if (run_dir / "eval.jsonl").is_file():
            case, _, seed = run_dir.name.rpartition("-seed")
            cases.setdefault(case, {})[int(seed)] = run_numbers(run_dir)
    return cases


def case_rows(cases: dict[str, dict[int, dict]]) -> tuple[list[dict], float, float]:
    every_run = [numbers for by_seed in cases.values() for numbers in by_seed.values()]
    equal_tokens = min(numbers["curve_tokens"][-1] for numbers in every_run)
    equal_wall_s = min(numbers["curve_wall_s"][-1] for numbers in every_run)
    baseline = cases.get(case_name("none", "none"), {})
    rows = []
    order = [case_name(overlap, compression) for overlap in OVERLAPS for compression in ("none", "fp16", "bf16",
                                                                                         "int8", "int4")]
    for case in [name for name in order if name in cases] + sorted(set(cases) - set(order)):
        by_seed = cases[case]
        row = {"case": case, "seeds": sorted(by_seed)}
        for key in next(iter(by_seed.values())):
            if key.endswith(("_share", "utilization", "_per_round")):
                row[key] = spread([numbers[key] for numbers in by_seed.values()])
        for key, axis, point in (("tokens", "curve_tokens", equal_tokens), ("wall", "curve_wall_s", equal_wall_s)):
            row[f"loss_at_equal_{key}"] = spread([interpolate(n[axis], n["curve_loss"], point)
                                                  for n in by_seed.values()])
            row[f"loss_at_equal_{key}_vs_blocking"] = spread([
                interpolate(n[axis], n["curve_loss"], point)
                - interpolate(baseline[seed][axis], baseline[seed]["curve_loss"], point)
                for seed, n in by_seed.items() if seed in baseline])
        rows.append(row)
    return rows, equal_tokens, equal_wall_s


def share(stats: dict) -> str:
    return f"{stats['mean'] * 100:.1f} % ({stats['min'] * 100:.1f}..{stats['max'] * 100:.1f})"


def kib(stats: dict) -> str:
    return "-" if stats["n"] == 0 else f"{stats['mean'] / 1024:,.0f}"


def loss_delta(stats: dict) -> str:
    return "-" if stats["n"] == 0 else f"{stats['mean']:+.3f} ± {stats['std']:.3f}"


def table(rows: list[dict], equal_tokens: float, equal_wall_s: float) -> str:
    header = ["overlap-codec", "compute utilization", "total GPU idle", "exposed sync", "waiting", "other",
              "hidden sync", "steady state: utilization / idle", "KiB/node/round on the link",
              "KiB/node/round (runtime)", f"eval loss @ {equal_tokens / 1e6:.2f}M tokens", "vs blocking",
              f"eval loss @ {equal_wall_s:.0f} s", "vs blocking"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["case"], share(row["warm_utilization"]), share(row["warm_idle_share"]),
                 share(row["warm_sync_share"]), share(row["warm_wait_share"]), share(row["warm_other_share"]),
                 share(row["warm_hidden_share"]),
                 f"{row['steady_utilization']['mean'] * 100:.1f} % / {row['steady_idle_share']['mean'] * 100:.1f} %",
                 kib(row["link_bytes_per_round"]), kib(row["runtime_bytes_per_round"]),
                 f"{row['loss_at_equal_tokens']['mean']:.3f}", loss_delta(row["loss_at_equal_tokens_vs_blocking"]),
                 f"{row['loss_at_equal_wall']['mean']:.3f}", loss_delta(row["loss_at_equal_wall_vs_blocking"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def all_rounds_table(rows: list[dict]) -> str:
    header = ["overlap-codec", "compute utilization", "total GPU idle", "exposed sync", "waiting", "other"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join([row["case"], share(row["all_utilization"]), share(row["all_idle_share"]),
                                        share(row["all_sync_share"]), share(row["all_wait_share"]),
                                        share(row["all_other_share"])]) + " |")
    return "\n".join(lines)


def analyze(results: Path) -> str:
    manifest = json.loads((results / "manifest.json").read_text())
    cases = load_cases(results)
    if not cases:
        raise SystemExit(f"hide_sync: no finished runs under {results / 'runs'} (run directories are not committed: "
                         "run the cases first, without --analyze-only)")
    rows, equal_tokens, equal_wall_s = case_rows(cases)
    (results / "sync.json").write_text(json.dumps({"rows": rows, "equal_tokens": equal_tokens,
                                                   "equal_wall_s": equal_wall_s}, indent=1) + "\n")
    text = "\n".join([
        "# Hiding the outer sync: overlap x compression",
        "",
        f"The paper's four-node cluster on real compute (CPU shares {manifest['cpu_shares']} cores), policy "
        f"`{manifest['policy']}`, {manifest['rounds']} rounds, links of {manifest['bandwidth_mbps']:.3g} Mbit/s "
        "(tbf between network namespaces) so the tiny model's fp32 sync takes the share of a round that "
        f"llama-150m's takes at 1 Gbit/s; {manifest['seeds']} seeds per case (mean and min..max); streaming with "
        f"{manifest['fragments']} fragments. Truth: real compute and real TCP over shaped links, not the "
        "planner's model.",
        "",
        "Rounds 1+ (round 0 plans from the prior alone; the last round includes the final drain, "
        "which the steady-state column leaves out too):",
        "",
        table(rows, equal_tokens, equal_wall_s),
        "",
        "All rounds:",
        "",
        all_rounds_table(rows),
        "",
        "Shares are of node time (compute + wait + exposed sync + other). Hidden sync is sync time that "
        "overlapped this node's compute (not idle, not part of the sum). Other: logging and the checkpoint "
        "written every round (kept for the offline evaluation). Bytes on the link: what each site's "
        "`wan0` sent during the whole run (kernel counters: TCP/IP headers, the readiness exchange and "
        "rendezvous included) / rounds; runtime: the payload the outer sync put on the wire. Eval loss: "
        "512 held-out sequences, `vs blocking` = minus `none-none` of the same seed (± std over seeds).",
        "",
        "Regenerate: " + "; then ".join(f"`{command}`" for command in manifest.get("commands", [manifest["command"]]))
        + f" ({manifest['total_s'] / 60:.0f} min in all; load average {manifest['load_average_at_start'][0]:.1f} at "
        f"the last start, {manifest['load_average_at_end'][0]:.1f} at its end).",
    ])
    (results / "sync.md").write_text(text + "\n")
    if results.resolve() == RESULTS.resolve():  # the README shows the committed results only
        replace_marked_block(README, START, END, readme_table(rows))
    return text


def readme_table(rows: list[dict]) -> str:
    lines = ["| overlap-codec | compute utilization | total GPU idle | bytes/node/round on the link | "
             "eval loss vs blocking @ equal tokens |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['case']} | {share(row['warm_utilization'])} | {share(row['warm_idle_share'])} | "
                     f"{kib(row['link_bytes_per_round'])} KiB | {loss_delta(row['loss_at_equal_tokens_vs_blocking'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.results = args.results.resolve()
    if args.analyze_only and not (args.results / "manifest.json").is_file():
        print(f"[sync] error: --analyze-only: {args.results} has no manifest.json; give the --results of an "
              "earlier run, or leave out --analyze-only", file=sys.stderr)
        return 2
    args.results.mkdir(parents=True, exist_ok=True)
    if not args.analyze_only:
        run_cases(args)
    print(analyze(args.results))
    print(f"[sync] results in {display_path(args.results, ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
