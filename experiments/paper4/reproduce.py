"""Reproduce the source paper's 4-site experiment on this machine, for every balancing policy.

    experiments/paper4/run.sh            # full: 8 policies + the slowdown scenario (about 15 min on 2 cores)
    experiments/paper4/run.sh --quick    # 3 policies, 3 rounds (under 3 min); results under runs/
    experiments/paper4/run.sh --truth real --seeds 3     # evidence: real-compute sites, 3 seeds per policy
    .venv/bin/python experiments/paper4/reproduce.py --help

Evidence mode (``--truth real`` or ``--seeds N``): every policy runs once per seed, each
run holds out 512 sequences and keeps every round's global checkpoint, `geodiloco evaluate`
scores them afterwards, and evidence.py writes per-policy waiting and total idle (mean and
spread over seeds, with and without round 0) and loss at equal tokens and wall-clock into
experiments/paper4/evidence/<truth>-<wan>-<shards>/.

Each run is `geodiloco run` with a config from configs.py (four emulated sites in
network namespaces, virtual GPUs of the paper's nodes, real DiLoCo on the tiny
model); then analyze.py turns the kept logs into the tables and figures.
Without root (no network namespaces) it says so and runs the sites on loopback.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import analyze  # noqa: E402
import configs  # noqa: E402
import evidence  # noqa: E402
from runner import display_path, run_policy  # noqa: E402

from geodiloco.report.readme_block import replace_marked_block  # noqa: E402

README = Path(__file__).resolve().parent / "README.md"
RESULTS_START, RESULTS_END = "<!-- results:start -->", "<!-- results:end -->"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help=f"{len(configs.QUICK_POLICIES)} policies ({', '.join(configs.QUICK_POLICIES)}), "
                             "3 rounds, no slowdown scenario")
    parser.add_argument("--results", type=Path,
                        help="output folder (default: experiments/paper4/results; --quick: runs/paper4-quick/results)")
    parser.add_argument("--runs-dir", type=Path, help="run directories with checkpoints (default: runs/paper4[-quick])")
    parser.add_argument("--sites", choices=["auto", "netns", "local"], default="auto",
                        help="netns: one network namespace per site (root); local: loopback; auto: netns if possible")
    parser.add_argument("--wan", choices=["literal", "scaled"], default="literal",
                        help="literal: 1 Gbit/s links; scaled: links slowed so the tiny model's outer sync takes "
                             "llama-150m's share of a round")
    parser.add_argument("--local-steps", type=int, default=configs.Scaling.local_steps, help="baseline H")
    parser.add_argument("--time-scale", type=float, default=configs.Scaling.time_scale,
                        help="factor on every emulated step time")
    parser.add_argument("--rounds", type=int, help="outer rounds per run (default 10, --quick 3)")
    parser.add_argument("--policies", help="comma-separated subset of the paper-scenario policies")
    parser.add_argument("--no-slowdown", action="store_true", help="skip the slowdown scenario")
    parser.add_argument("--truth", choices=configs.TRUTHS, default="virtual",
                        help="virtual: sleep-padded virtual GPUs timed as the paper's nodes; real: real compute, "
                             "each node in a cgroup with a CPU share in the paper's proportions (root)")
    parser.add_argument("--seeds", type=int, help="runs per policy with seeds 0..N-1 (evidence mode; default 1)")
    parser.add_argument("--shards", choices=["iid", "non_iid"], default="iid",
                        help="data split among nodes (data.shards)")
    parser.add_argument("--analyze-only", action="store_true", help="redo tables and figures from the kept logs")
    return parser.parse_args(argv)


def choose_sites(requested: str) -> tuple[str, str]:
    """The --sites value to run with, and a note for the results."""
    if requested == "local":
        return "local", "sites on loopback (requested); links are not shaped"
    from geodiloco.lab.sites import can_use_netns
    usable, reason = can_use_netns()
    if usable:
        return "netns", "one network namespace per site, tbf-shaped links"
    if requested == "netns":
        raise SystemExit(f"reproduce: --sites netns is not possible here: {reason}")
    note = f"network namespaces unavailable ({reason}); sites run on loopback, links are not shaped"
    print(f"[paper4] note: {note}", flush=True)
    return "local", note


def require_cpu_shares() -> None:
    from geodiloco.lab.cpu_share import can_use_cpu_share
    usable, reason = can_use_cpu_share()
    if not usable:
        raise SystemExit(f"reproduce: --truth real needs CPU quotas (cgroups, root): {reason}")


def environment() -> dict:
    import numpy
    import pydantic
    import torch
    cpu_model = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        cpu_model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                          if line.startswith("model name")), "")
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "pydantic": pydantic.VERSION, "kernel": platform.release(), "machine": platform.machine(),
            "cpu_model": cpu_model, "cpu_count": os.cpu_count(), "torch_threads_per_process": 1,
            "load_average_at_start": list(os.getloadavg()), "date": time.strftime("%Y-%m-%d %H:%M %Z")}


def evidence_mode(args: argparse.Namespace) -> bool:
    return args.truth == "real" or args.seeds is not None


def plan_runs(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    policies = list(configs.QUICK_POLICIES if args.quick else configs.POLICIES)
    if args.policies:
        policies = [name.strip() for name in args.policies.split(",") if name.strip()]
        unknown = sorted(set(policies) - set(configs.POLICIES))
        if unknown:
            print(f"reproduce: error: --policies: unknown {unknown}; known: {', '.join(configs.POLICIES)}",
                  file=sys.stderr)
            raise SystemExit(2)
    slowdown = [] if (args.quick or args.no_slowdown or evidence_mode(args)) else list(configs.SLOWDOWN_POLICIES)
    return policies, slowdown


def seeded_jobs(args: argparse.Namespace, scaling: "configs.Scaling", policies: list[str]) -> list[tuple[str, dict]]:
    """(run name, config) per policy and seed; names end in -seedK in evidence mode."""
    if not evidence_mode(args):
        return [(f"paper-{p}", configs.run_config(p, scaling, configs.PAPER, shards=args.shards)) for p in policies]
    return [(f"paper-{p}-seed{seed}", configs.run_config(p, scaling, configs.PAPER, seed=seed, shards=args.shards,
                                                        offline_eval=True))
            for seed in range(args.seeds or 1) for p in policies]


def run_all(args: argparse.Namespace, results: Path, runs_dir: Path,
            planned: tuple[list[str], list[str]]) -> dict:
    scaling = configs.Scaling(rounds=args.rounds or (3 if args.quick else 10), local_steps=args.local_steps,
                              time_scale=args.time_scale, wan=args.wan, truth=args.truth)
    sites, sites_note = choose_sites(args.sites)
    if args.truth == "real":
        require_cpu_shares()
    policies, slowdown_policies = planned
    jobs = seeded_jobs(args, scaling, policies)
    jobs += [(f"slowdown-{p}", configs.run_config(p, scaling, configs.SLOWDOWN)) for p in slowdown_policies]
    manifest = {"command": " ".join(["experiments/paper4/run.sh", *sys.argv[1:]]),
                "quick": args.quick, "scaling": asdict(scaling), "truth": args.truth,
                "seeds": args.seeds or 1, "shards": args.shards,
                "cpu_shares": configs.real_shares() if args.truth == "real" else None, "round_scale": scaling.round_scale,
                "bandwidth_mbps": scaling.bandwidth_mbps(), "sites": sites, "sites_note": sites_note,
                "policies": policies, "slowdown_policies": slowdown_policies,
                "slowdown": {"node": configs.SLOWDOWN.slow_node, "from_round": configs.SLOWDOWN.slow_from_round,
                             "factor": configs.SLOWDOWN.slow_factor},
                "environment": environment(), "runs": []}
    started = time.perf_counter()
    for position, (name, config) in enumerate(jobs, 1):
        outcome = run_policy(name, config, configs.ROOT, results / "configs", runs_dir, results / "runs", sites)
        manifest["runs"].append(asdict(outcome))
        slow = sum(outcome.slow_steps.values())
        print(f"[paper4] {position}/{len(jobs)} {name}: {outcome.duration_s:.0f} s, "
              f"{slow} steps slower than their emulated target", flush=True)
    manifest["total_s"] = time.perf_counter() - started
    manifest["environment"]["load_average_at_end"] = list(os.getloadavg())
    (results / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def environment_text(manifest: dict) -> str:
    env = manifest["environment"]
    lines = ["# How these results were produced", "",
             f"Command: `{manifest['command']}` ({manifest['total_s'] / 60:.1f} min for all runs).", "",
             f"Machine: {env['cpu_model'] or env['machine']}, {env['cpu_count']} cores, Linux {env['kernel']}; "
             f"load average at start {env['load_average_at_start'][0]:.1f}, at end "
             f"{env['load_average_at_end'][0]:.1f} (the machine was shared). Date: {env['date']}.", "",
             f"Software: Python {env['python']}, torch {env['torch']} (CPU, 1 thread per process), "
             f"numpy {env['numpy']}, pydantic {env['pydantic']}.", "",
             f"Sites: {manifest['sites']} ({manifest['sites_note']}).", "",
             "Runs (each is the command below, from the repository root):", "", "```"]
    for run in manifest["runs"]:
        lines.append(f"{' '.join(run['command'])}    # {run['duration_s']:.0f} s")
    lines.append("```")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    suffix = "-quick" if args.quick else ""
    default_results = configs.ROOT / (f"runs/paper4{suffix}/results" if args.quick else "experiments/paper4/results")
    if evidence_mode(args):
        label = f"{args.truth}-{args.wan}-{args.shards}"
        default_results, suffix = evidence.EVIDENCE_ROOT / label, f"-{label}"
    results = (args.results or default_results).resolve()
    runs_dir = (args.runs_dir or configs.ROOT / f"runs/paper4{suffix}").resolve()
    if args.analyze_only and not (results / "manifest.json").is_file():
        print(f"reproduce: error: --analyze-only: {results} has no manifest.json; give the --results of an earlier "
              "run, or leave out --analyze-only", file=sys.stderr)
        return 2
    planned = None if args.analyze_only else plan_runs(args)
    results.mkdir(parents=True, exist_ok=True)
    if planned is not None:
        manifest = run_all(args, results, runs_dir, planned)
        (results / "environment.md").write_text(environment_text(manifest) + "\n")
    if evidence_mode(args):
        print(evidence.analyze(results))
        print(f"[paper4] results in {display_path(results, configs.ROOT)}", flush=True)
        return 0
    output = analyze.analyze(results)
    summary = (results / "summary.md").read_text()
    if results == (configs.ROOT / "experiments/paper4/results").resolve():
        readme_summary = analyze.summary_text(output["manifest"], output["sections"], output["report_commands"],
                                              figure_prefix="results/")
        replace_marked_block(README, RESULTS_START, RESULTS_END, readme_summary)
    print(summary)
    print(f"[paper4] results in {display_path(results, configs.ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
