"""Benchmark: what a site failure costs on the torch backend with elastic membership.

    sudo .venv/bin/python experiments/elastic/failure_drill.py                 # both drills, 3 repeats
    sudo .venv/bin/python experiments/elastic/failure_drill.py --repeats 1 --drills kill
    .venv/bin/python experiments/elastic/failure_drill.py --analyze-only       # redo the tables from the logs

Four emulated sites (experiments/configs/elastic.yaml: virtual GPUs, the ``time`` policy) each in
its own network namespace behind a 100 Mbit/s tbf-shaped link, every site under torchrun's elastic
agent, the rendezvous store in a process of its own. ``geodiloco run --drill`` injects the failure
for real: ``kill`` sends SIGKILL to node3's agent and worker halfway through round 3 and starts the
site again halfway through round 6; ``freeze`` sends SIGSTOP to node2's processes halfway through
round 3 (a hung machine whose sockets stay open) and SIGCONT halfway through round 5. Nothing is
simulated: the figures come from the run's own logs (drill.jsonl: when the drill acted;
membership.jsonl: when a worker noticed a lost peer; idle.jsonl: when each round started and what
it lost). Per drill, over repeats: seconds from the failure to the survivors noticing it and to
training resuming without the site, rounds of work lost, seconds from the site's return to its
first round, and GPU idle during the run (total and the part lost to the failure). Needs root.
Writes experiments/results/elastic/ and the README block between ``<!-- elastic:start -->`` and
``<!-- elastic:end -->``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from geodiloco.lab.drill import read_drill  # noqa: E402
from geodiloco.runtime.recovery import read_membership_events  # noqa: E402
from geodiloco.report.readme_block import replace_marked_block  # noqa: E402

CONFIG = ROOT / "experiments" / "configs" / "elastic.yaml"
RESULTS = ROOT / "experiments" / "results" / "elastic"
README = ROOT / "README.md"
START, END = "<!-- elastic:start -->", "<!-- elastic:end -->"
DRILLS = {
    "kill": "kill:node3@3,restart:node3@6",
    "freeze": "freeze:node2@3,thaw:node2@5",
}


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="runs per drill (default 3)")
    parser.add_argument("--drills", default=",".join(DRILLS), help="comma-separated: kill, freeze")
    parser.add_argument("--sites", default="netns", choices=["netns", "local"], help="emulated sites (default netns)")
    parser.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "elastic", help="full run directories")
    parser.add_argument("--results", type=Path, default=RESULTS, help="output folder")
    parser.add_argument("--analyze-only", action="store_true", help="redo the tables from the kept logs")
    return parser.parse_args(argv)


def run_drill(drill: str, repeat: int, args: argparse.Namespace) -> Path:
    run_dir = args.runs_dir / f"{drill}-{repeat}"
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    command = [sys.executable, "-m", "geodiloco.runtime.cli", "run", "--config", str(CONFIG), "--sites", args.sites,
               "--no-report", "--run-dir", str(run_dir), "--drill", DRILLS[drill], "--set", f"run.seed={repeat}"]
    started = time.monotonic()
    print(f"[failure_drill] {drill} #{repeat}: {' '.join(command[3:])}", flush=True)
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    (run_dir / "launcher.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"{drill} #{repeat} failed (exit {result.returncode}); see {run_dir / 'launcher.log'}")
    print(f"[failure_drill] {drill} #{repeat}: done in {time.monotonic() - started:.0f} s", flush=True)
    return run_dir


def measure(run_dir: Path) -> dict:
    """The figures of one run, from its logs (unix times throughout)."""
    drill = read_drill(run_dir)
    failure, comeback = drill[0], drill[-1]
    idle = [json.loads(line) for line in (run_dir / "idle.jsonl").read_text().splitlines() if line.strip()]
    events = [event for event in read_membership_events(run_dir) if event["time"] > failure["time"]]
    noticed = min((event["time"] for event in events if event["event"] == "peer_failed"), default=None)
    survivors = [row for row in idle if row["lost_s"] > 0 and row["round_start"] < failure["time"] + 1
                 and failure["node"] not in row["present_nodes"]]
    resumed_round = min(row["round"] for row in survivors)
    resumed_at = min(row["round_start"] + row["lost_s"] for row in survivors if row["round"] == resumed_round)
    done_before = [row["round"] for row in idle if row["round_end"] <= failure["time"] and row["node"] != failure["node"]]
    in_progress = max(done_before) + 1 if done_before else 0
    # a returning site's first round counts its wait since it came back as lost: its training starts at the end of that
    returned = [row for row in idle if row["node"] == failure["node"] and row["round_start"] + row["lost_s"] > comeback["time"]]
    rejoined_at = min(row["round_start"] + row["lost_s"] for row in returned) if returned else None
    let_in = [row["lost_s"] for row in idle if returned and row["round"] == min(r["round"] for r in returned)
              and row["node"] != failure["node"]]
    wall = sum(row["compute_s"] + row["wait_s"] + row["comm_s"] + row["overhead_s"] for row in idle)
    idle_s = sum(row["wait_s"] + row["comm_s"] + row["overhead_s"] for row in idle)
    lost = sum(row["lost_s"] for row in idle)
    return {
        "run": run_dir.name, "failed_node": failure["node"],
        "noticed_s": None if noticed is None else noticed - failure["time"],
        "resumed_s": resumed_at - failure["time"],
        "rounds_lost": in_progress - (resumed_round - 1) if in_progress else None,
        "rejoin_s": None if rejoined_at is None else rejoined_at - comeback["time"],
        "lost_failure_s": sum(row["lost_s"] for row in survivors if row["round"] == resumed_round)
        / len([row for row in survivors if row["round"] == resumed_round]),
        "lost_rejoin_s": sum(let_in) / len(let_in) if let_in else None,
        "round_s": statistics.median(row["round_end"] - row["round_start"] for row in idle if row["lost_s"] == 0),
        "idle_share": idle_s / wall, "lost_share": lost / wall, "lost_node_s": lost,
        "rounds": 1 + max(row["round"] for row in idle),
    }


def mean_spread(values: list[Optional[float]], unit: str = "", digits: int = 1) -> str:
    present = [value for value in values if value is not None]
    if not present:
        return "n/a"
    mean = sum(present) / len(present)
    if len(present) == 1:
        return f"{mean:.{digits}f}{unit}"
    return f"{mean:.{digits}f}{unit} ({min(present):.{digits}f}..{max(present):.{digits}f})"


def table(rows_by_drill: dict[str, list[dict]]) -> str:
    lines = ["| drill | runs | failure noticed after | training resumed after | rounds of work lost | "
             "time each survivor lost (work + restart) | returning site's first round after | "
             "time each other node lost letting it in | total GPU idle of the run (lost share) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for drill, rows in rows_by_drill.items():
        lines.append(
            f"| {DRILLS[drill]} | {len(rows)} | {mean_spread([row['noticed_s'] for row in rows], ' s')} | "
            f"{mean_spread([row['resumed_s'] for row in rows], ' s')} | "
            f"{mean_spread([row['rounds_lost'] for row in rows], '', 0)} | "
            f"{mean_spread([row['lost_failure_s'] for row in rows], ' s')} | "
            f"{mean_spread([row['rejoin_s'] for row in rows], ' s')} | "
            f"{mean_spread([row['lost_rejoin_s'] for row in rows], ' s')} | "
            f"{mean_spread([100 * row['idle_share'] for row in rows], ' %', 0)} "
            f"({mean_spread([100 * row['lost_share'] for row in rows], ' %', 0)}) |")
    return "\n".join(lines)


HOW = ("Measured by experiments/elastic/failure_drill.py: 4 emulated sites (experiments/configs/elastic.yaml, "
       "virtual GPUs, `time` policy, 8 rounds of ~3-4 s) in network namespaces behind 100 Mbit/s tbf-shaped "
       "links, real torchrun elastic agents, real SIGKILL/SIGSTOP of a site's processes halfway through round 3; "
       "the site comes back halfway through round 6 (kill: started again) or 5 (freeze: SIGCONT). Times from the "
       "run's own logs; mean (min..max) over runs. `comm.elastic.failure_timeout_s` 10 s, `last_call_s` 8 s, "
       "`keep_alive_s` 2 s.")


def median_round_s(rows_by_drill: dict[str, list[dict]]) -> float:
    return statistics.median(row["round_s"] for rows in rows_by_drill.values() for row in rows)


def write_results(rows_by_drill: dict[str, list[dict]], results: Path) -> str:
    results.mkdir(parents=True, exist_ok=True)
    (results / "runs.json").write_text(json.dumps(rows_by_drill, indent=1) + "\n")
    body = table(rows_by_drill)
    import platform
    import torch
    machine = (f"Machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; measured "
               f"{time.strftime('%Y-%m-%d', time.gmtime())} (UTC).")
    text = (f"# What a site failure costs (torch backend, elastic)\n\n{HOW} {machine}\n\n{body}\n\n"
            "Reading: a killed site is noticed within a second (its peers' next collective fails); a frozen one "
            "after the heartbeat timeout. Training resumes once the rendezvous has closed (the dead agent's "
            "keep-alive expires, then `last_call_s`) and the workers have started again. The round in progress "
            "is lost on every survivor; a site that comes back costs the others their round in progress again, "
            "because torchrun restarts every agent's workers to let it in. 'Lost' is part of 'other' in "
            "`geodiloco report`. The run-wide idle share is large only because these rounds are short "
            f"(median {median_round_s(rows_by_drill):.1f} s) next to the fixed cost of a restart (about 20 s "
            "here: the dead agent's keep-alive, `last_call_s`, and starting Python and torch again on a "
            "2-core machine); with rounds of minutes a failure costs the round in progress and these "
            "seconds.\n")
    (results / "elastic.md").write_text(text)
    return body


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    drills = [name.strip() for name in args.drills.split(",") if name.strip()]
    unknown = [name for name in drills if name not in DRILLS]
    if unknown:
        print(f"failure_drill: error: unknown drill {unknown}; use {', '.join(DRILLS)}", file=sys.stderr)
        return 2
    rows_by_drill: dict[str, list[dict]] = {}
    for drill in drills:
        for repeat in range(args.repeats):
            run_dir = args.runs_dir / f"{drill}-{repeat}"
            if not args.analyze_only:
                run_dir = run_drill(drill, repeat, args)
            if (run_dir / "drill.jsonl").is_file():
                rows_by_drill.setdefault(drill, []).append(measure(run_dir))
    if not rows_by_drill:
        print("failure_drill: no runs to analyze", file=sys.stderr)
        return 1
    body = write_results(rows_by_drill, args.results)
    if args.results.resolve() == RESULTS.resolve():  # the README shows the committed results only
        replace_marked_block(README, START, END, f"{HOW}\n\n{body}")
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
