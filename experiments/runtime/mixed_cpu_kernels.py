"""Two sites whose CPUs run different torch kernels: do they train one model? This checkout against an
earlier commit, and what keeping them on one model costs.

Site b runs with ``ATEN_CPU_CAPABILITY=default``, torch's own switch to the scalar kernels that a CPU
without AVX2 runs (an old or low-power x86 part); site a runs this machine's vectorized ones. Both are
launched with torchrun, one rank each, torch backend, on this machine. For each of two sync settings
(blocking fp32, and the defaults: streaming with int8) the script runs this checkout and a git worktree
of ``--baseline``, and reads the runtime's own records: every round's start checksum per node (sum of
|parameters| in float64; with a blocking sync both nodes start every round on the global model) and
the run's final line (the same checksum on every rank, or a warning that they differ). Truth: real
CPU training; nothing predicted.

It also times, on this machine, what the fix costs: the portable outer step against torch's fused one
(``OuterState.apply``, interleaved, best of ``--repeats``) and the start agreement's own work (the digest
of the initial model, the rounding probe), at ``--params`` parameters on one thread.

Usage: python experiments/runtime/mixed_cpu_kernels.py [--baseline 7973afa] [--params 25e6 100e6]
Writes experiments/results/runtime/mixed_cpu_kernels.{md,json}.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml
from torch import nn

from geodiloco.runtime.diloco import OuterState
from geodiloco.runtime.sync.start_model import rounding_digest, tensors_digest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "experiments" / "results" / "runtime"
SETTINGS = {"blocking, fp32": {"overlap": "none", "compression": "none"},
            "streaming, int8 (the defaults)": {"overlap": "streaming", "compression": "int8"}}
SECRET = "mixed-cpu-kernels-experiment-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(work: Path, setting: dict, rounds: int) -> Path:
    nodes = [{"name": name, "local_steps": 3, "batch_size": 4} for name in ("a", "b")]
    config = {"run": {"name": "mixed-kernels", "out_dir": str(work / "runs"), "seed": 0},
              "model": {"preset": "tiny", "seq_len": 32},
              "data": {"source": "stdlib", "max_bytes": 300_000, "eval_batches": 1, "eval_batch_size": 4},
              "diloco": {"rounds": rounds, "local_steps": 3, "batch_size": 4, **setting},
              "balancing": {"policy": "uniform"},
              "comm": {"backend": "torch", "timeout_s": 120, "elastic": {"enabled": False}},
              "nodes": nodes}
    path = work / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def site(checkout: Path, config: Path, run_dir: Path, node: str, port: int, capability: str | None):
    env = dict(os.environ, OMP_NUM_THREADS="1", GEODILOCO_DEVICE="cpu", GEODILOCO_SECRET=SECRET,
               PYTHONPATH=str(checkout))
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               f"--rdzv-conf=is_host={'true' if node == 'a' else 'false'}", "--max-restarts=0",
               "-m", "geodiloco.runtime.train", "--config", str(config), "--node-name", node, "--run-dir", str(run_dir)]
    return subprocess.Popen(command, cwd=checkout, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run_once(label: str, checkout: Path, setting_name: str, work: Path, rounds: int) -> dict:
    config = write_config(work, SETTINGS[setting_name], rounds)
    run_dir = work / "run"
    port = free_port()
    sites = [site(checkout, config, run_dir, "a", port, None), site(checkout, config, run_dir, "b", port, "default")]
    outputs = [process.communicate(timeout=600)[0] for process in sites]
    if any(process.returncode for process in sites):
        raise SystemExit(f"{label} ({setting_name}) failed:\n" + "\n".join(output[-3000:] for output in outputs))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    checksums = {}
    for row in metrics:
        if row["node"] != "global":
            checksums.setdefault(row["round"], {})[row["node"]] = row["start_checksum"]
    final = next((line for line in outputs[0].splitlines()
                  if "final parameter checksum" in line or "ended on different parameters" in line), "")
    rounds_equal = sum(1 for by_node in checksums.values() if len(set(by_node.values())) == 1)
    largest = max(abs(by_node["a"] - by_node["b"]) / abs(by_node["a"]) for by_node in checksums.values())
    row = {"checkout": label, "setting": setting_name, "rounds": len(checksums), "rounds_equal": rounds_equal,
           "largest_relative_difference": largest, "final_line": final.replace(str(run_dir), "RUN_DIR"),
           "notices": [line for line in outputs[0].splitlines() if "other initial parameters" in line or "round differently" in line]}
    print(f"  {label:9s} {setting_name}: {rounds_equal}/{len(checksums)} rounds start equal; final: {final[:90]}",
          flush=True)
    return row


def model_of(params: int) -> nn.Module:
    width = 1024
    rows = max(1, params // (width * 8))
    return nn.Sequential(*[nn.Linear(width, rows, bias=False) for _ in range(8)])


def time_steps(params: int, repeats: int) -> dict:
    """Seconds of one outer step, fused against portable (best of ``repeats``, interleaved), and of the start
    agreement's work, on one thread."""
    torch.set_num_threads(1)
    model = model_of(params)
    fused, portable = OuterState(model, 0.7, 0.9, True), OuterState(model, 0.7, 0.9, True)
    portable.portable = True
    averaged = torch.randn(fused.numel) * 1e-3
    best = {"fused_s": float("inf"), "portable_s": float("inf")}
    for _ in range(repeats):
        for name, outer in (("fused_s", fused), ("portable_s", portable)):
            began = time.perf_counter()
            outer.apply(averaged)
            best[name] = min(best[name], time.perf_counter() - began)
    began = time.perf_counter()
    tensors_digest(fused.global_params)
    digest_s = time.perf_counter() - began
    began = time.perf_counter()
    rounding_digest(torch.device("cpu"), 0.7, 0.9, True)
    probe_s = time.perf_counter() - began
    return {"params": fused.numel, **best, "ratio": best["portable_s"] / best["fused_s"], "digest_s": digest_s,
            "probe_s": probe_s}


def write(runs: list[dict], steps: list[dict], baseline: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "mixed_cpu_kernels.json").write_text(json.dumps({"runs": runs, "steps": steps}, indent=2) + "\n")
    lines = [
        "# Two sites whose CPUs run different torch kernels",
        "",
        "Truth: real CPU training on this machine (torchrun, two sites, one rank each, torch backend); site b runs "
        "with `ATEN_CPU_CAPABILITY=default` (the scalar kernels of a CPU without AVX2), site a with this CPU's "
        f"{torch.backends.cpu.get_cpu_capability()} kernels. Checksums: the runtime's own round-start records (sum of "
        "|parameters| in float64). Baseline: a git worktree of " + f"`{baseline}`. "
        f"Machine: {platform.processor() or platform.machine()}, torch {torch.__version__}. "
        "Command: `python experiments/runtime/mixed_cpu_kernels.py`.",
        "",
        "| checkout | sync | rounds whose start checksums agree | largest relative difference | the run's final line |",
        "|---|---|---|---|---|",
    ]
    for row in runs:
        lines.append(f"| {row['checkout']} | {row['setting']} | {row['rounds_equal']} of {row['rounds']} | "
                     f"{row['largest_relative_difference']:.1e} | {row['final_line'].replace('[geodiloco] ', '')} |")
    lines += ["", "With streaming, a round starts on the global model plus the progress made while its syncs were in "
              "flight, so round-start checksums differ between nodes by design; the final line, after the last "
              "round drains every sync, is the check there.", "",
              "What keeping the nodes on one model costs (one thread; best of the repeats, the two interleaved):", "",
              "| parameters | fused outer step | portable outer step | ratio | digest of the initial model (once) | "
              "rounding probe (once) |", "|---|---|---|---|---|---|"]
    for row in steps:
        lines.append(f"| {row['params'] / 1e6:.0f} M | {row['fused_s']:.3f} s | {row['portable_s']:.3f} s | "
                     f"{row['ratio']:.2f}x | {row['digest_s']:.3f} s | {row['probe_s'] * 1e3:.1f} ms |")
    lines += ["", "The portable step is taken only when the nodes' rounding probes differ; nodes that agree keep "
              "torch's fused step. The initial model is sent only when the digests differ."]
    (RESULTS / "mixed_cpu_kernels.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--baseline", default="7973afa", help="commit to compare with (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds per run (default: %(default)s)")
    parser.add_argument("--params", type=float, nargs="+", default=[25e6, 100e6],
                        help="model sizes for the outer-step timing (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats (default: %(default)s)")
    args = parser.parse_args()
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        raise SystemExit("this CPU runs torch's scalar kernels already: there is no second kernel set to compare")
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        baseline_tree = Path(scratch) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(baseline_tree), args.baseline],
                       check=True, capture_output=True)
        try:
            for setting_name in SETTINGS:
                for label, checkout in (("baseline", baseline_tree), ("this", ROOT)):
                    work = Path(scratch) / f"{label}-{len(runs)}"
                    work.mkdir()
                    runs.append(run_once(label, checkout, setting_name, work, args.rounds))
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(baseline_tree)],
                           capture_output=True)
    steps = []
    for params in args.params:
        steps.append(time_steps(int(params), args.repeats))
        print(f"  {steps[-1]['params'] / 1e6:.0f} M parameters: fused {steps[-1]['fused_s']:.3f} s, portable "
              f"{steps[-1]['portable_s']:.3f} s ({steps[-1]['ratio']:.2f}x)", flush=True)
    write(runs, steps, args.baseline)
    print((RESULTS / "mixed_cpu_kernels.md").read_text())


if __name__ == "__main__":
    main()
