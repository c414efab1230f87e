"""The transformers example end to end, and its published result.

Prepares the corpus and BPE tokenizer (experiments/hf/prepare_data.py) when they are missing,
runs ``geodiloco run --config experiments/configs/hf_llama.yaml`` (three sites: a transformers
LLaMA on a local JSONL corpus, the time policy, TensorBoard logs), then ``geodiloco report``,
and writes experiments/results/hf/example.md and the README block between
``<!-- hf-example:start -->`` and ``<!-- hf-example:end -->``.

Truth: virtual GPUs (each node's steps padded to twice the step time the source paper measured
on its GPUs) around real training of the small model on this CPU; the loss is real, the idle
figures show the mechanics on this machine, not GPU evidence.

Run from the repository root:  .venv/bin/python experiments/hf/run_example.py [--sites local|netns|auto]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from geodiloco.report.readme_block import replace_marked_block

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "experiments" / "configs" / "hf_llama.yaml"
DATA = ROOT / "runs" / "hf_example"
RESULTS = ROOT / "experiments" / "results" / "hf"
README = ROOT / "README.md"
START, END = "<!-- hf-example:start -->", "<!-- hf-example:end -->"


def geodiloco(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", *args], cwd=ROOT, text=True,
                          capture_output=True)


def losses_by_round(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    by_round: dict[int, dict] = {}
    for row in rows:
        entry = by_round.setdefault(row["round"], {"round": row["round"] + 1, "train": [], "eval": None})
        if row["node"] == "global":
            entry["eval"] = row.get("eval_loss")
        else:
            entry["train"].append(row["loss"])
    return [{"round": entry["round"], "train_loss": sum(entry["train"]) / len(entry["train"]),
             "eval_loss": entry["eval"]} for _, entry in sorted(by_round.items())]


def markdown(run_dir: Path, report: dict, losses: list[dict], sites: str, wall_s: float) -> str:
    total = report["total"]
    lines = [
        f"Three sites (seoul 4x RTX 2080 Ti, busan 4x A30, gwangju 2x RTX 3090 + 2x V100) train a transformers "
        f"`LlamaForCausalLM` (experiments/configs/hf/llama_tiny.json) on a JSONL corpus of Python's own sources with "
        f"a 4096-token BPE tokenizer, `time` policy, TensorBoard logs; sites: {sites}; {wall_s:.0f} s including start-up. "
        "Truth: virtual GPUs (steps padded to twice the paper's measured step time) around real CPU training; "
        "regenerate with `.venv/bin/python experiments/hf/run_example.py`.",
        "",
        "| round | mean train loss | eval loss (global model) |",
        "|---|---|---|",
    ]
    lines += [f"| {row['round']} | {row['train_loss']:.3f} | "
              f"{'' if row['eval_loss'] is None else format(row['eval_loss'], '.3f')} |" for row in losses]
    lines += [
        "",
        "| node | local steps (last round) | compute s | wait s | exposed sync s | idle % |",
        "|---|---|---|---|---|---|",
    ]
    last = report["per_round"][-1]["nodes"] if report["per_round"] else {}
    for node in report["nodes"]:
        lines.append(f"| {node['node']} | {last.get(node['node'], {}).get('local_steps', '')} | "
                     f"{node['compute_s']:.1f} | {node['wait_s']:.2f} | {node['comm_s']:.2f} | {node['idle_share']:.1%} |")
    lines += ["", f"Total GPU idle {total['idle_share']:.1%} of the GPU time (wait {total['wait_s']:.1f} s, exposed "
                  f"sync {total['comm_s']:.1f} s, other {total['overhead_s']:.1f} s, summed over nodes); "
                  f"{total['comm_hidden_s']:.1f} s of sync hidden behind compute."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sites", choices=["auto", "local", "netns"], default="auto")
    args = parser.parse_args(argv)
    if not (DATA / "tokenizer" / "tokenizer.json").is_file():
        subprocess.run([sys.executable, str(ROOT / "experiments" / "hf" / "prepare_data.py"), "--out", str(DATA)],
                       cwd=ROOT, check=True)
    run_dir = ROOT / "runs" / f"hf-example-{time.strftime('%Y%m%d-%H%M%S')}"
    started = time.perf_counter()
    done = geodiloco("run", "--config", str(CONFIG), "--sites", args.sites, "--run-dir", str(run_dir), "--no-report")
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", file=sys.stderr)
        return done.returncode
    sites = "network namespaces" if "sites: netns" in done.stdout else "loopback"
    report_json = run_dir / "report.json"
    if geodiloco("report", str(run_dir), "--json", str(report_json)).returncode != 0:
        print("geodiloco report failed", file=sys.stderr)
        return 1
    report = json.loads(report_json.read_text())["runs"][0]
    body = markdown(run_dir, report, losses_by_round(run_dir), sites, wall_s)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "example.md").write_text("# Transformers example run\n\n" + body + "\n")
    replace_marked_block(README, START, END, body)
    print(body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
