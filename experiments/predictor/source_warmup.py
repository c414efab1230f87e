"""How far Lambda's published SQuAD step times sit from the steady step of the same run.

The cold model predicts a steady training step. Lambda's BERT SQuAD figures (most rows of
experiments/predictor/data/published_training_steps.yaml) are ``batch x max_steps / time_to_train``
over a run of 100 steps with no warm-up excluded, so each carries its run's one-time costs (the
first iteration, a stall) spread over 100 steps. Lambda's repository keeps the console log of every
run, with tqdm's per-iteration rate, so the steady step of the same run can be read beside the
published figure. This script reads both from the logs of single-GPU runs and reports their ratio:
no model is involved, so the spread is scatter in the truth itself.

Logs of 2020 print Lambda's own ``training throughput:`` line instead, over runs of one or two
epochs of a cut-down SQuAD set (1,033 features); they are reported apart, and the GTX 1080 Ti runs of
March 2020 (the Pascal rows, never fitted) apart again: their figure is the batch times tqdm's last
displayed rate, whose smoothing takes in the epoch's short last batch.

Needs a clone of lambdal/deeplearning-benchmark (the data file cites its commit):
    git clone https://github.com/lambdal/deeplearning-benchmark /tmp/lambda-benchmark
    .venv/bin/python experiments/predictor/source_warmup.py --lambda-repo /tmp/lambda-benchmark
Writes experiments/results/predictor/source_warmup.md.
"""
from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

COMMIT = "aa5addb6a53675a649a80036dad548f1c27cbcc4"
"""The commit of lambdal/deeplearning-benchmark the data file's 22.09-container rows cite."""
RESULTS = Path(__file__).resolve().parents[1] / "results" / "predictor" / "source_warmup.md"
LOG_PATH = re.compile(r"pytorch/results/(?P<host>[^/]+)/PyTorch_(?P<workload>bert_base_squad|bert_large_squad)_"
                      r"(?P<precision>FP16|FP32)/[^/]+\.txt$")
PASCAL_HOST = "1080Ti"
MULTI_GPU_HOST = re.compile(r"^(1cc_)?\d+x")
TQDM_RATE = re.compile(r"Iteration:\s+\d+%[^\[]*?(?P<n>\d+)/\d+ \[[^,\]]*,\s*(?P<rate>[\d.]+)(?P<unit>it/s|s/it)\]")
STEADY_ITERATIONS = (20, 100)
"""Iterations whose tqdm rates make the steady step: past the first iteration's one-time costs and
tqdm's smoothing of them, within the 100 steps the published figure counts."""


@dataclass(frozen=True)
class RunLog:
    host: str
    workload: str
    precision: str
    batch_size: int
    published_step_s: float
    steady_step_s: float
    from_e2e: bool
    """True where the figure is run_squad.py's training_sequences_per_second (e2e time), False where it is
    Lambda's own ``training throughput:`` line (2020 logs)."""

    @property
    def ratio(self) -> float:
        return self.published_step_s / self.steady_step_s


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, errors="replace",
                          check=True).stdout


def parse_log(path: str, text: str) -> RunLog | None:
    """The published and steady step of one single-GPU run, or None where the log lacks either."""
    match = LOG_PATH.match(path)
    batch = re.search(r"--train_batch_size=(\d+)", text)
    processes = re.search(r"--nproc_per_node=(\d+)", text)
    e2e = re.search(r"training_sequences_per_second\s*:\s*([\d.]+)", text)
    old = re.search(r"training throughput:\s*([\d.]+)", text)
    if not (match and batch and (e2e or old)) or (processes and processes.group(1) != "1"):
        return None
    low, high = STEADY_ITERATIONS
    rates = [float(m["rate"]) if m["unit"] == "it/s" else 1.0 / float(m["rate"])
             for m in TQDM_RATE.finditer(text) if low <= int(m["n"]) <= high]
    if not rates:
        return None
    batch_size = int(batch.group(1))
    throughput = float((e2e or old).group(1))
    return RunLog(match["host"], match["workload"], match["precision"], batch_size, batch_size / throughput,
                  1.0 / statistics.median(rates), from_e2e=e2e is not None)


def read_logs(repo: Path) -> list[RunLog]:
    paths = [path for path in git(repo, "ls-tree", "-r", "--name-only", COMMIT).split()
             if (m := LOG_PATH.match(path)) and not MULTI_GPU_HOST.match(m["host"])]
    logs = [parse_log(path, git(repo, "show", f"{COMMIT}:{path}")) for path in paths]
    return [log for log in logs if log is not None]


def spread(logs: list[RunLog]) -> str:
    ratios = sorted(log.ratio - 1.0 for log in logs)
    quantile = lambda q: ratios[min(len(ratios) - 1, round(q * (len(ratios) - 1)))]  # noqa: E731
    return (f"{len(ratios)} | {statistics.median(ratios):+.1%} | {quantile(0.1):+.1%} | {quantile(0.9):+.1%} | "
            f"{ratios[0]:+.1%} | {ratios[-1]:+.1%}")


def repeated_runs(logs: list[RunLog]) -> list[str]:
    """Runs of one host, workload, precision and batch logged more than once: how far their published figures differ."""
    groups: dict[tuple, list[RunLog]] = {}
    for log in logs:
        groups.setdefault((log.host, log.workload, log.precision, log.batch_size), []).append(log)
    lines = []
    for (host, workload, precision, batch), runs in sorted(groups.items()):
        if len(runs) > 1:
            steps_ms = sorted(run.published_step_s * 1e3 for run in runs)
            lines.append(f"| {host} | {workload} | {precision} | {batch} | "
                         f"{', '.join(f'{step:.1f}' for step in steps_ms)} | {steps_ms[-1] / steps_ms[0] - 1:+.1%} |")
    return lines


def markdown(logs: list[RunLog]) -> str:
    e2e = [log for log in logs if log.from_e2e]
    lambda_line = [log for log in logs if not log.from_e2e and log.host != PASCAL_HOST]
    pascal = [log for log in logs if not log.from_e2e and log.host == PASCAL_HOST]
    groups = [("e2e, 22.09 and later containers (hosts named *_v1*)", [log for log in e2e if "_v1" in log.host]),
              ("e2e, 20.x-21.x containers", [log for log in e2e if "_v1" not in log.host]),
              ("every e2e figure", e2e),
              ("`training throughput:` of 2020 logs (Turing, V100, Max-Q)", lambda_line),
              ("the same, GTX 1080 Ti (March 2020): batch x tqdm's last rate", pascal)]
    lines = [
        "# Lambda's published SQuAD step times against the steady step of the same run",
        "",
        f"Truth and figure both come from Lambda's own console logs (lambdal/deeplearning-benchmark at {COMMIT[:8]}, "
        "single-GPU runs of DeepLearningExamples' run_squad.py). The published step is the batch over the log's "
        "figure: run_squad.py's training_sequences_per_second (e2e: 100 steps over the run's time, no warm-up "
        "excluded) or, in 2020 logs, Lambda's `training throughput:` line. The steady step is 1 / the median tqdm "
        f"rate over iterations {STEADY_ITERATIONS[0]}-{STEADY_ITERATIONS[1]} of the same run. No model is involved. "
        "Command: `python experiments/predictor/source_warmup.py --lambda-repo CLONE`.",
        "",
        "Published step / steady step - 1 (what a model of the steady step cannot see):",
        "",
        "| figure | runs | median | 10th pct | 90th pct | least | most |",
        "|---|---|---|---|---|---|---|",
        *[f"| {name} | {spread(group)} |" for name, group in groups if group],
        "",
    ]
    repeats = repeated_runs(e2e + lambda_line)
    if repeats:
        lines += ["The same host, workload, precision and batch run more than once:", "",
                  "| host | workload | precision | batch | published step (ms) | spread |", "|---|---|---|---|---|---|",
                  *repeats, ""]
    lines += ["## Every run", "", "| host | workload | precision | batch | figure | published ms | steady ms | ratio |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {log.host} | {log.workload} | {log.precision} | {log.batch_size} | "
              f"{'e2e' if log.from_e2e else 'training throughput'} | {log.published_step_s * 1e3:.1f} | "
              f"{log.steady_step_s * 1e3:.1f} | {log.ratio:.3f} |"
              for log in sorted(logs, key=lambda log: (log.host, log.workload, log.precision, log.batch_size))]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lambda-repo", type=Path, required=True,
                        help="a clone of https://github.com/lambdal/deeplearning-benchmark (it must hold "
                             f"commit {COMMIT[:8]})")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the table (default: experiments/results/predictor/source_warmup.md)")
    args = parser.parse_args(argv)
    try:
        git(args.lambda_repo, "cat-file", "-e", f"{COMMIT}^{{commit}}")
    except (subprocess.CalledProcessError, FileNotFoundError):
        print(f"error: {args.lambda_repo} is not a clone of lambdal/deeplearning-benchmark holding commit {COMMIT[:8]}; "
              "clone it with: git clone https://github.com/lambdal/deeplearning-benchmark", file=sys.stderr)
        return 2
    logs = read_logs(args.lambda_repo)
    text = markdown(logs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text.split("## Every run")[0].rstrip())
    print(f"\nwrote {args.out} ({len(logs)} runs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
