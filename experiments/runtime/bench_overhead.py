"""Runtime overhead per inner step vs a bare PyTorch loop of the same model and batch.

Both loops run in one process, interleaved block by block, so machine noise hits
them alike; the figure is the ratio of medians. The runtime side is the real
local phase (NodeTrainer.local_phase: lr schedule, micro-batching, clipping,
pacer, step timing); the bare side fetches batches from its own shard the same
way and runs model + AdamW + clipping. The per-round cost of the outer machinery (readiness exchange,
pseudo-gradient, all-reduce, outer step, logs) is reported separately,
amortized over the configured local steps.

Usage: python experiments/runtime/bench_overhead.py [--blocks 5] [--steps 20]
Writes experiments/results/runtime/overhead.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from geodiloco.balancer.plan import NodePlan
from geodiloco.runtime.comm import build_topology
from geodiloco.runtime.config import parse_config
from geodiloco.runtime.data import NodeShard
from geodiloco.runtime.models import build_model
from geodiloco.runtime.sync import RoundSync
from geodiloco.runtime.trainer import NodeTrainer

RESULTS = Path(__file__).resolve().parents[1] / "results" / "runtime"


def make_trainer(preset: str, seq_len: int, batch_size: int, run_dir: Path) -> NodeTrainer:
    config = parse_config({
        "model": {"preset": preset, "seq_len": seq_len},
        "data": {"max_bytes": 2_000_000, "eval_batches": 0},
        "diloco": {"rounds": 1000, "local_steps": 100, "batch_size": batch_size},
        "nodes": [{"name": "solo"}],
    }, "<bench>")
    topology = build_topology("solo", ["solo"])
    return NodeTrainer(config, topology, run_dir, torch.device("cpu"))


def bare_loop(model, optimizer, shard: NodeShard, steps: int, batch_size: int, grad_clip: float) -> list[float]:
    """The plain loop: fetch a batch, forward, backward, clip, AdamW step."""
    times_s = []
    for _ in range(steps):
        started = time.perf_counter()
        inputs, targets = shard.next_batch(batch_size)
        model(inputs, targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times_s.append(time.perf_counter() - started)
    return times_s


def measure(preset: str, seq_len: int, batch_size: int, steps: int, blocks: int) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = make_trainer(preset, seq_len, batch_size, Path(run_dir))
        trainer.sync.start(False, trainer.sync_handles())
        trainer.warm_up(batch_size)
        bare_model = build_model(trainer.dims, 0)
        bare_optimizer = torch.optim.AdamW(bare_model.parameters(), lr=3e-4, weight_decay=0.1)
        bare_shard = NodeShard(trainer.shard.corpus_array.astype("uint8"), 0, 1, seq_len, seed=1)
        plan = NodePlan(name="solo", local_steps=steps, batch_size=batch_size)
        runtime_step_s, bare_step_s, round_extra_s = [], [], []
        for block in range(blocks):
            bare_step_s.append(statistics.median(
                bare_loop(bare_model, bare_optimizer, bare_shard, steps, batch_size, 1.0)))
            result = trainer.local_phase(block, plan, time.perf_counter())
            runtime_step_s.append(statistics.median(result.step_times_s))
            started = time.perf_counter()
            stats = trainer.sync.exchange({"node": "solo", "local_rank": 0, "tokens": result.tokens,
                                           "steps": result.steps, "batch_size": batch_size, "finite": True})
            round_plan = trainer.planner.plan(block)
            trainer.sync.outer_step(RoundSync(round=block, plan=round_plan,
                                              stats_by_node={item["node"]: item for item in stats},
                                              weighting=trainer.weighting(round_plan)))
            trainer.after_outer_step(block, [])
            round_extra_s.append(time.perf_counter() - started)
    runtime_s, bare_s = statistics.median(runtime_step_s), statistics.median(bare_step_s)
    return {"preset": preset, "seq_len": seq_len, "batch_size": batch_size, "steps_per_block": steps,
            "blocks": blocks, "bare_step_ms": 1000 * bare_s, "runtime_step_ms": 1000 * runtime_s,
            "overhead_pct": 100 * (runtime_s / bare_s - 1),
            "outer_round_ms": 1000 * statistics.median(round_extra_s),
            "outer_round_pct_of_100_steps": 100 * statistics.median(round_extra_s) / (100 * runtime_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="folder for overhead.{json,md} (default: experiments/results/runtime)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29617", "RANK": "0", "WORLD_SIZE": "1"})
    dist.init_process_group("gloo")
    load_before = os.getloadavg()[0]
    rows = [measure("tiny", 128, 8, args.steps, args.blocks), measure("small", 128, 8, args.steps // 2, args.blocks)]
    dist.destroy_process_group()
    load_after = os.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overhead.json").write_text(json.dumps(rows, indent=2))
    lines = ["# Runtime overhead per inner step vs a bare PyTorch loop", "",
             f"Measured by `python experiments/runtime/bench_overhead.py` on {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores, 1 torch thread, torch {torch.__version__}; medians of {args.blocks} interleaved "
             f"blocks of {args.steps} steps (small: {args.steps // 2}); 1-minute load average {load_before:.1f} "
             f"before, {load_after:.1f} after. Truth: wall-clock time of the runtime's own inner steps against a "
             "bare PyTorch loop on the same model and data, on this CPU. Negative overhead = within the machine's "
             "noise.", "",
             "| preset | seq | batch | bare ms/step | runtime ms/step | overhead | outer round (1 node) ms | per 100 steps |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['preset']} | {row['seq_len']} | {row['batch_size']} | {row['bare_step_ms']:.1f} | "
                     f"{row['runtime_step_ms']:.1f} | {row['overhead_pct']:+.2f} % | {row['outer_round_ms']:.1f} | "
                     f"{row['outer_round_pct_of_100_steps']:.2f} % |")
    (args.out / "overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
