"""What a round's checkpoint costs the GPUs: blocking writes against background writes.

Two measurements, each with ``checkpoint.background`` false and true interleaved, so
machine noise hits both alike (truth: wall-clock time of the real runtime on this
machine; nothing predicted):

1. the round's end, per model preset: the seconds ``NodeTrainer.save_checkpoint``
   holds the training thread (blocking: snapshot + SHA-256 + file write; background:
   the snapshot only), and the seconds the background write then takes beside it;
2. the embedded demo (``geodiloco run``: 4 emulated sites, virtual GPUs around real
   CPU training of the tiny preset, a checkpoint every round), run end to end: the
   idle report's "other" seconds and total GPU idle.

Usage: python experiments/runtime/bench_checkpoint.py [--presets tiny small llama-150m]
       [--repeats 5] [--demo-runs 2]
Writes experiments/results/runtime/checkpoint.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from geodiloco.runtime.comm import build_topology
from geodiloco.runtime.config import parse_config
from geodiloco.runtime.trainer import NodeTrainer

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results" / "runtime"
MODES = (False, True)


def make_trainer(preset: str, background: bool, run_dir: Path) -> NodeTrainer:
    config = parse_config({
        "model": {"preset": preset, "seq_len": 128},
        "data": {"max_bytes": 1_000_000, "eval_batches": 0},
        "diloco": {"rounds": 1000, "local_steps": 10, "batch_size": 2},
        "checkpoint": {"background": background, "keep": 1000},
        "nodes": [{"name": "solo"}],
    }, "<bench>")
    trainer = NodeTrainer(config, build_topology("solo", ["solo"]), run_dir, torch.device("cpu"))
    trainer.sync.start(False, trainer.sync_handles())
    trainer.warm_up(2)  # the AdamW moments exist, as after any round
    return trainer


def round_end_seconds(trainer: NodeTrainer, round_idx: int) -> tuple[float, float]:
    """(seconds save_checkpoint held the caller, seconds until the files were on disk)."""
    started = time.perf_counter()
    trainer.save_checkpoint(round_idx, "bench", {"round": round_idx}, members=["solo"])
    returned = time.perf_counter()
    trainer.finish_checkpoint_write()
    return returned - started, time.perf_counter() - started


def bench_round_end(preset: str, repeats: int) -> dict:
    held = {mode: [] for mode in MODES}
    written = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {mode: make_trainer(preset, mode, Path(tmp) / f"bg-{mode}") for mode in MODES}
        params = sum(param.numel() for param in trainers[True].model.parameters())
        for repeat in range(repeats + 1):
            for mode in MODES:
                held_s, written_s = round_end_seconds(trainers[mode], repeat)
                if repeat:  # the first save of each pays one-off allocation; left out
                    held[mode].append(held_s)
                    written[mode].append(written_s)
        file_bytes = sum(path.stat().st_size for path in (Path(tmp) / "bg-True").rglob("*.safetensors")) / (repeats + 1)
    row = {"preset": preset, "parameters": params, "bytes_per_round": file_bytes}
    for mode in MODES:
        name = "background" if mode else "blocking"
        row[f"{name}_held_s"] = statistics.median(held[mode])
        row[f"{name}_written_s"] = statistics.median(written[mode])
    print(f"{preset}: blocking {row['blocking_held_s']:.3f} s, background {row['background_held_s']:.3f} s "
          f"(write {row['background_written_s']:.3f} s beside training)", flush=True)
    return row


def run_demo(run_dir: Path, *options: str) -> list[dict]:
    """Run the demo (``geodiloco run`` with ``options``) into ``run_dir``; its idle records."""
    command = [str(Path(sys.executable).with_name("geodiloco")), "run", "--run-dir", str(run_dir), "--no-report",
               *options]
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {completed.returncode}: {completed.stderr[-2000:]}")
    return [json.loads(line) for line in (run_dir / "idle.jsonl").read_text().splitlines() if line.strip()]


def total_idle_share(rows: list[dict]) -> float:
    """(wait + exposed sync + other) / GPU time of idle records, weighted by each node's GPUs."""
    gpus = {row["node"]: row["num_gpus"] for row in rows}
    wall = sum((row["round_end"] - row["round_start"]) * gpus[row["node"]] for row in rows)
    idle = sum((row["wait_s"] + row["comm_s"] + row["overhead_s"]) * gpus[row["node"]] for row in rows)
    return idle / wall


def demo_idle(background: bool, run_dir: Path, flush: bool = True) -> dict:
    """One run of the embedded demo with these checkpoint settings: its idle parts and total GPU idle share."""
    rows = run_demo(run_dir, "--set", f"checkpoint.background={str(background).lower()}",
                    "--set", f"checkpoint.flush={str(flush).lower()}")
    parts = {key: sum(row[key] for row in rows) for key in ("compute_s", "wait_s", "comm_s", "overhead_s")}
    return {"background": background, "flush": flush, "rounds": len({row["round"] for row in rows}), **parts,
            "other_s_per_node_round": parts["overhead_s"] / len(rows), "total_idle_share": total_idle_share(rows)}


def bench_demo(runs: int) -> list[dict]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(runs):
            for mode in MODES:
                result = demo_idle(mode, Path(tmp) / f"demo-{mode}-{repeat}")
                results.append(result)
                print(f"demo background={mode}: other {result['other_s_per_node_round']:.3f} s per node-round, "
                      f"total GPU idle {result['total_idle_share']:.1%}", flush=True)
    return results


def markdown(round_end: list[dict], demo: list[dict], repeats: int, load: tuple[float, float]) -> str:
    lines = [
        "# Checkpoint writes: blocking against background",
        "",
        f"Measured by `python experiments/runtime/bench_checkpoint.py` on {platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}; 1-minute load average {load[0]:.1f} before, {load[1]:.1f} after. Truth: wall-clock "
        "time of the real runtime on this machine, `checkpoint.background` false and true interleaved.",
        "",
        f"## The round's end (one node, CPU, median of {repeats} rounds)",
        "",
        "held = seconds `save_checkpoint` keeps the training thread (every GPU of the node idles that long); "
        "write = seconds until the files are on disk (beside training, with background writes).",
        "",
        "| preset | parameters | MB per round | blocking: held s | background: held s | held ratio | background: write s |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in round_end:
        lines.append(f"| {row['preset']} | {row['parameters'] / 1e6:.1f} M | {row['bytes_per_round'] / 1e6:.0f} | "
                     f"{row['blocking_held_s']:.3f} | {row['background_held_s']:.3f} | "
                     f"{row['blocking_held_s'] / row['background_held_s']:.1f}x | {row['background_written_s']:.3f} |")
    lines += [
        "",
        "## The embedded demo, end to end (`geodiloco run`, a checkpoint every round)",
        "",
        "other = the idle report's other overhead per node and round (checkpoint, logging, planning); total GPU idle "
        "= (wait + exposed sync + other) / GPU time, weighted by each node's GPUs. The demo's nodes are virtual GPUs "
        "around real CPU training, so these are the runtime's mechanics on this machine, not a GPU figure.",
        "",
        "| run | background | other s per node-round | total GPU idle |",
        "|---|---|---|---|",
    ]
    return "\n".join(lines + demo_table_rows(demo, "background", MODES)) + "\n"


def demo_table_rows(demo: list[dict], setting: str, modes: tuple) -> list[str]:
    """Markdown rows of alternating demo runs: each run (numbered by pair) with ``setting`` on or off,
    then the mean of each setting's runs (other seconds per node-round, total GPU idle share)."""
    lines = [f"| {index // 2 + 1} | {'yes' if row[setting] else 'no'} | "
             f"{row['other_s_per_node_round']:.3f} | {row['total_idle_share']:.1%} |" for index, row in enumerate(demo)]
    for mode in modes:
        rows = [row for row in demo if row[setting] == mode]
        if rows:
            lines.append(f"| mean | {'yes' if mode else 'no'} | "
                         f"{statistics.fmean(row['other_s_per_node_round'] for row in rows):.3f} | "
                         f"{statistics.fmean(row['total_idle_share'] for row in rows):.1%} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small", "llama-150m"])
    parser.add_argument("--repeats", type=int, default=5, help="rounds saved per mode and preset (default 5)")
    parser.add_argument("--demo-runs", type=int, default=2, help="demo runs per mode (default 2; 0 skips the demo)")
    parser.add_argument("--no-write", action="store_true", help="print only; write no result files")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    from geodiloco.runtime.launch import free_port
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"})
    dist.init_process_group("gloo")
    round_end = [bench_round_end(preset, args.repeats) for preset in args.presets]
    dist.destroy_process_group()
    demo = bench_demo(args.demo_runs) if args.demo_runs else []
    table = markdown(round_end, demo, args.repeats, (load_before, os.getloadavg()[0]))
    print(table)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "checkpoint.md").write_text(table, encoding="utf-8")
        (RESULTS / "checkpoint.json").write_text(json.dumps({"round_end": round_end, "demo": demo}, indent=2) + "\n",
                                                 encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
