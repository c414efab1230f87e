"""Tables and figures of the paper4 reproduction from the kept run logs.

    .venv/bin/python experiments/paper4/analyze.py [--results experiments/paper4/results]

Reads RESULTS/manifest.json (written by reproduce.py: scaling, runs, environment)
and RESULTS/runs/<scenario>-<policy>/ (idle.jsonl, metrics.jsonl, plan.jsonl,
config.yaml), and writes into RESULTS: idle.md, convergence.md, slowdown.md,
fidelity.md, summary.md (all of them, for the README), results.json, and the
figures wait.png, loss.png, loss_slowdown.png, timeline.png, timeline_slowdown.png
(the last two drawn by `geodiloco report --plot`). Needs no processes or root;
rerun it after editing the tables without repeating the runs.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import figures  # noqa: E402
import tables  # noqa: E402
from configs import EMULATED_SEQ_LEN, PAPER_LOCAL_STEPS, POLICIES, ROOT  # noqa: E402
from results_data import RunData, load_run  # noqa: E402
from runner import display_path  # noqa: E402

DEFAULT_RESULTS = ROOT / "experiments" / "paper4" / "results"


def load_scenario(results: Path, scenario: str, policies: list[str]) -> list[RunData]:
    runs = []
    for policy in policies:
        name = f"{scenario}-{policy}"
        run_dir = results / "runs" / name
        if (run_dir / "idle.jsonl").is_file():
            runs.append(load_run(run_dir, results / "configs" / f"{name}.yaml", ROOT))
    return runs


def timeline(runs: list[RunData], results: Path, name: str) -> str:
    """`geodiloco report RUN... --plot` of the given runs; returns the command as run."""
    run_dirs = [display_path(results / "runs" / run.name, ROOT) for run in runs]
    plot_path = display_path(results / name, ROOT)
    command = ["geodiloco", "report", *run_dirs, "--compare", "--plot", plot_path]
    subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", *command[1:]], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    return " ".join(command)


def write(results: Path, name: str, text: str) -> None:
    (results / name).write_text(text.rstrip() + "\n")


def scaling_text(manifest: dict) -> str:
    scaling = manifest["scaling"]
    return (f"Baseline H = {scaling['local_steps']} (paper: {PAPER_LOCAL_STEPS}), batch 4, "
            f"emulated step times x {scaling['time_scale']} (time_scale), so one round here is "
            f"{manifest['round_scale']:.3f} x a paper round's local phase; {scaling['rounds']} rounds; "
            f"WAN {manifest['bandwidth_mbps']:.1f} Mbit/s per site ({scaling['wan']}); real model "
            f"`{scaling['model']}` at seq {scaling['seq_len']} on this CPU, emulated `llama-150m` at seq "
            f"{EMULATED_SEQ_LEN}.")


def analyze(results: Path) -> dict:
    manifest = json.loads((results / "manifest.json").read_text())
    policies = [policy for policy in POLICIES if policy in manifest["policies"]]
    paper_runs = load_scenario(results, "paper", policies)
    if not paper_runs:
        raise SystemExit(f"paper4: no runs under {results / 'runs'} (run directories are not committed: "
                         "run experiments/paper4/run.sh first, without --analyze-only)")
    slow_runs = load_scenario(results, "slowdown", [p for p in POLICIES if p in manifest["slowdown_policies"]])
    round_scale = manifest["round_scale"]
    slow_steps = {outcome["name"]: outcome["slow_steps"] for outcome in manifest["runs"]}
    scaling = manifest["scaling"]

    idle_rows, idle_md = tables.idle_table(paper_runs, round_scale)
    warm_rows, warm_md = tables.idle_table(paper_runs, round_scale, warm=True)
    convergence, convergence_md = tables.convergence_table(paper_runs, scaling["time_scale"], EMULATED_SEQ_LEN,
                                                          scaling["seq_len"])
    fidelity_rows, fidelity_md = tables.fidelity_table(paper_runs + slow_runs, slow_steps)
    figures.wait_bars(idle_rows, results / "wait.png")
    tokens_label = f"tokens trained, all nodes (thousands; {scaling['model']} model, seq {scaling['seq_len']})"
    figures.loss_curves(paper_runs, results / "loss.png", "eval loss per policy (paper scenario)", tokens_label)
    commands = [timeline(paper_runs, results, "timeline.png")]
    output = {"manifest": manifest, "idle": idle_rows, "idle_without_round0": warm_rows,
              "convergence": convergence, "fidelity": fidelity_rows}
    sections = [("Waiting per policy beside the paper's Table 3 (all rounds)", idle_md),
                ("The same without round 0 (the round planned from the predictor alone)", warm_md),
                ("Convergence and throughput", convergence_md)]
    write(results, "idle.md", f"{idle_md}\n\nWithout round 0:\n\n{warm_md}")
    write(results, "convergence.md", convergence_md)
    if slow_runs:
        event = manifest["slowdown"]
        slow_rows, slow_md = tables.slowdown_table(slow_runs, event["node"], event["from_round"])
        figures.loss_curves(slow_runs, results / "loss_slowdown.png",
                            f"eval loss per policy, {event['node']} {event['factor']}x slower from round "
                            f"{event['from_round']}", tokens_label)
        commands.append(timeline(slow_runs, results, "timeline_slowdown.png"))
        output["slowdown"] = slow_rows
        sections.append((f"Slowdown: {event['node']} runs {event['factor']}x slower from round "
                         f"{event['from_round']}", slow_md))
        write(results, "slowdown.md", slow_md)
    sections.append(("Emulation fidelity: measured local phase / virtual GPU target", fidelity_md))
    write(results, "fidelity.md", fidelity_md)
    output["report_commands"] = commands
    write(results, "summary.md", summary_text(manifest, sections, commands))
    (results / "results.json").write_text(json.dumps(output, indent=1, default=float) + "\n")
    output["sections"] = sections
    return output


FIGURES = [("wait.png", "Waiting per policy: share of node time, and paper-scale seconds beside Table 3"),
           ("timeline.png", "Timeline per policy (geodiloco report --plot): compute, wait, sync per node and round"),
           ("loss.png", "Eval loss per policy against wall-clock and tokens")]
SLOWDOWN_FIGURES = [("timeline_slowdown.png", "Timeline of the slowdown scenario"),
                    ("loss_slowdown.png", "Eval loss in the slowdown scenario")]


def summary_text(manifest: dict, sections: list[tuple[str, str]], commands: list[str],
                 figure_prefix: str = "") -> str:
    """All tables, then the figures (links relative to where the text is written, via ``figure_prefix``)."""
    parts = [scaling_text(manifest), ""]
    for title, body in sections:
        parts += [f"#### {title}", "", body, ""]
    figures_shown = FIGURES + (SLOWDOWN_FIGURES if manifest["slowdown_policies"] else [])
    for name, caption in figures_shown:
        parts += [f"![{caption}]({figure_prefix}{name})", ""]
    parts += ["Timelines drawn with:", "", "```"] + commands + ["```"]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="folder with manifest.json and runs/")
    args = parser.parse_args(argv)
    if not (args.results / "manifest.json").is_file():
        parser.error(f"--results {args.results}: no manifest.json; give the folder reproduce.py wrote")
    analyze(args.results)
    print((args.results / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
