"""A short real DiLoCo run on this machine's GPUs: two nodes, each its own torchrun agent.

Layout (``node_layouts``): with one GPU both nodes run one rank each on GPU 0;
their outer all-reduce goes over gloo on CPU tensors (``comm.outer_device: cpu``),
because NCCL refuses two ranks on one device and the runtime's object
collectives and barriers already use gloo. With two or more GPUs the GPUs are
split between the nodes (each agent sees only its own through
``CUDA_VISIBLE_DEVICES``, as on separate machines), the pseudo-gradient
all-reduce runs over nccl (``comm.outer_device: cuda``), and a node with two or
more GPUs trains them with DDP over nccl.

The runtime's only device switch is ``GEODILOCO_DEVICE`` (``cpu`` forces the CPU;
anything else uses CUDA when torch sees it), and ``geodiloco run`` pins every
node to the CPU (runtime/launch.py), so the run starts ``python -m geodiloco.runtime.train``
under torchrun exactly as a site would. The run's ``model.precision`` (bf16 by
default) is what the runtime's inner steps autocast to on the GPU
(runtime/precision.py) and what its planner predicts.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Callable, Optional

import yaml

from geodiloco.runtime.auth import launch_env
from geodiloco.runtime.launch import free_port

REPO = Path(__file__).resolve().parents[2]
NODE_NAMES = ("node-a", "node-b")
STOP_GRACE_S = 15.0
POLL_S = 0.5
CHECKSUM_RTOL = 1e-6


@dataclass(frozen=True)
class NodeLayout:
    """One node of the check run: its name and the GPU indices (as torch numbers them) it owns."""

    name: str
    gpu_indices: tuple[int, ...]

    @property
    def ranks(self) -> int:
        return max(1, len(self.gpu_indices))


def node_layouts(gpu_count: int) -> list[NodeLayout]:
    """Two nodes: both on GPU 0 with one GPU (or none), else the GPUs split in two (first node larger)."""
    if gpu_count <= 1:
        shared = (0,) if gpu_count == 1 else ()
        return [NodeLayout(name, shared) for name in NODE_NAMES]
    first = (gpu_count + 1) // 2
    return [NodeLayout(NODE_NAMES[0], tuple(range(first))),
            NodeLayout(NODE_NAMES[1], tuple(range(first, gpu_count)))]


def outer_device(gpu_count: int) -> str:
    """nccl (cuda) for the outer all-reduce when the node leaders sit on different GPUs, else gloo (cpu)."""
    return "cuda" if gpu_count >= 2 else "cpu"


def describe_layout(layouts: list[NodeLayout], device: str, outer: str) -> str:
    """One sentence saying what runs where and over which backend."""
    if device == "cpu":
        return "2 nodes x 1 rank on the CPU (GEODILOCO_DEVICE=cpu), outer all-reduce over gloo"
    parts = [f"{layout.name}: {layout.ranks} rank(s) on GPU {','.join(map(str, layout.gpu_indices))}"
             for layout in layouts]
    shared = len({layout.gpu_indices for layout in layouts}) == 1
    outer_text = ("outer all-reduce over nccl between the node leaders" if outer == "cuda"
                  else "outer all-reduce over gloo on CPU tensors (NCCL refuses two ranks on one GPU)")
    in_node = [layout.name for layout in layouts if layout.ranks > 1]
    ddp_text = f"; in-node DDP over nccl on {', '.join(in_node)}" if in_node else "; no in-node DDP (1 rank per node)"
    share_text = "; both nodes share the GPU, so each step is expected to take about 2x a lone step" if shared else ""
    return f"{'; '.join(parts)}; compute on cuda; {outer_text}{ddp_text}{share_text}"


@dataclass(frozen=True)
class RunSettings:
    """What the check run trains: preset, tokens per sample, rounds x local steps at a batch size."""

    preset: str
    seq_len: int
    batch_size: int
    rounds: int
    local_steps: int
    timeout_s: float
    precision: str = "bf16"


def run_config(settings: RunSettings, layouts: list[NodeLayout], gpu_name: Optional[str], outer: str) -> dict:
    """The run config: the runtime trains (autocast) and plans at ``settings.precision``. One
    checkpoint, at the end (llama-150m's are GBs)."""
    return {
        "run": {"name": "gpu-validate", "out_dir": "runs", "seed": 0, "gpu_sample_interval_s": 0.5},
        "model": {"preset": settings.preset, "seq_len": settings.seq_len, "precision": settings.precision},
        "data": {"source": "stdlib", "max_bytes": 4_000_000, "eval_batches": 2, "eval_batch_size": 4},
        "optim": {"inner": {"lr": 1.0e-3, "warmup_steps": 5}},
        "diloco": {"rounds": settings.rounds, "local_steps": settings.local_steps,
                   "batch_size": settings.batch_size, "weighting": "tokens",
                   # blocking fp32: the kit checks that nodes start every round from the same parameters
                   "overlap": "none", "compression": "none"},
        "balancing": {"policy": "uniform"},
        "comm": {"backend": "torch", "outer_device": outer, "timeout_s": 120, "init_timeout_s": 90},
        "checkpoint": {"every_rounds": settings.rounds, "keep": 1},
        "nodes": [{"name": layout.name, "gpus": [gpu_name] * layout.ranks if gpu_name else []}
                  for layout in layouts],
    }


def torchrun_command(config_path: Path, run_dir: Path, layout: NodeLayout, port: int, is_host: bool) -> list[str]:
    """One site's torchrun agent (c10d rendezvous on loopback), as tests/test_runtime_torchrun.py starts it."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc-per-node={layout.ranks}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-conf=is_host={'true' if is_host else 'false'}", "--max-restarts=0",
            "-m", "geodiloco.runtime.train", "--config", str(config_path), "--node-name", layout.name,
            "--run-dir", str(run_dir)]


def node_env(layout: NodeLayout, device: str, base: dict[str, str], split_gpus: bool) -> dict[str, str]:
    """The agent's environment: the device switch, and its own GPUs only when the GPUs are split."""
    env = dict(base)
    env["GEODILOCO_DEVICE"] = device
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH", "")]))
    env.setdefault("OMP_NUM_THREADS", "4")
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    if split_gpus and layout.gpu_indices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index) for index in layout.gpu_indices)
    return env


@dataclass
class AgentResult:
    """One torchrun agent: its exit code and the end of its output (the run directory is temporary)."""

    node: str
    exit_code: Optional[int]
    log_tail: str = ""


@dataclass
class RunOutcome:
    """How the run went: exit codes, wall time, GPU memory seen, and what the run directory holds."""

    layout_text: str
    config: dict
    agents: list[AgentResult]
    wall_s: float
    timed_out: bool
    memory_before_gib: Optional[float] = None
    memory_peak_gib: Optional[float] = None
    summary: dict = field(default_factory=dict)
    checks: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check["passed"] for check in self.checks)

    def to_dict(self) -> dict:
        return asdict(self)


def stop_agent(process: subprocess.Popen) -> None:
    """SIGTERM the agent's session (agent and its workers), SIGKILL what is left after the grace period."""
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        if process.poll() is not None:
            return
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue


def wait_for_agents(processes: list[subprocess.Popen], timeout_s: float,
                    sample_memory: Callable[[], Optional[float]]) -> tuple[bool, Optional[float]]:
    """Wait for every agent (or the timeout; a failed agent stops the others); returns (timed out, peak GiB)."""
    deadline = time.monotonic() + timeout_s
    peak_gib: Optional[float] = None
    while any(process.poll() is None for process in processes):
        used_gib = sample_memory()
        if used_gib is not None:
            peak_gib = used_gib if peak_gib is None else max(peak_gib, used_gib)
        if any(process.poll() not in (None, 0) for process in processes):
            break
        if time.monotonic() > deadline:
            for process in processes:
                stop_agent(process)
            return True, peak_gib
        time.sleep(POLL_S)
    for process in processes:
        stop_agent(process)
    return False, peak_gib


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Agent:
    """A started torchrun agent, with the file its output goes to."""

    node: str
    process: subprocess.Popen
    log_path: Path
    log_handle: IO[str]


def start_agents(layouts: list[NodeLayout], config_path: Path, run_dir: Path, device: str, split: bool) -> list[Agent]:
    """One agent per node, each in its own session so that stopping it stops its workers too."""
    port = free_port()
    base_env = {**os.environ, **launch_env()}  # the run's shared secret, as `geodiloco run` makes one
    agents = []
    for index, layout in enumerate(layouts):
        log_path = run_dir.parent / f"{run_dir.name}-{layout.name}.log"
        handle = open(log_path, "w")
        process = subprocess.Popen(torchrun_command(config_path, run_dir, layout, port, index == 0), cwd=REPO,
                                   env=node_env(layout, device, dict(base_env), split), stdout=handle,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        agents.append(Agent(layout.name, process, log_path, handle))
    return agents


def launch(settings: RunSettings, run_dir: Path, gpu_count: int, gpu_name: Optional[str], device: str = "cuda",
           sample_memory: Callable[[], Optional[float]] = lambda: None) -> RunOutcome:
    """Start both agents, wait for them, then summarize and check the run directory.

    ``device``: "cuda" (the check) or "cpu" (the same run with GEODILOCO_DEVICE=cpu, for tests).
    ``sample_memory``: GiB in use on the GPUs, polled while the run goes (None: unknown).
    """
    layouts = node_layouts(gpu_count if device == "cuda" else 0)
    outer = outer_device(gpu_count) if device == "cuda" else "cpu"
    config = run_config(settings, layouts, gpu_name, outer)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir.parent / f"{run_dir.name}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    memory_before = sample_memory()
    started = time.perf_counter()
    agents = start_agents(layouts, config_path, run_dir, device, split=device == "cuda" and gpu_count >= 2)
    try:
        timed_out, memory_peak = wait_for_agents([agent.process for agent in agents], settings.timeout_s,
                                                 sample_memory)
    finally:
        for agent in agents:
            stop_agent(agent.process)
            agent.log_handle.close()
    results = [AgentResult(agent.node, agent.process.returncode, tail(agent.log_path)) for agent in agents]
    outcome = RunOutcome(describe_layout(layouts, device, outer), config, results,
                         time.perf_counter() - started, timed_out, memory_before, memory_peak)
    outcome.summary = summarize_run(run_dir)
    cold = cold_step_predictions(config)
    for row in outcome.summary["rows"]:
        row["cold_step_s"] = cold.get(row["node"])
    outcome.checks = run_checks(outcome, settings, [layout.name for layout in layouts],
                                expect_gpu=device == "cuda")
    return outcome


# ---------------------------------------------------------------- reading the run directory


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def summarize_run(run_dir: Path) -> dict:
    """Per round and node: steps x batch, mean step (s), predicted step (s), loss, wait/sync (s),
    GPU utilization; per round the start checksums and the global eval loss."""
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    idle = {(row["round"], row["node"]): row for row in read_jsonl(run_dir / "idle.jsonl")}
    plans = {plan["round"]: {node["name"]: node for node in plan["nodes"]}
             for plan in read_jsonl(run_dir / "plan.jsonl")}
    rows, evals = [], {}
    for row in metrics:
        if row.get("node") == "global":
            evals[row["round"]] = row.get("eval_loss")
            continue
        round_idx, node = row["round"], row["node"]
        record = idle.get((round_idx, node), {})
        planned = plans.get(round_idx, {}).get(node, {})
        steps = row.get("local_steps") or 0
        rows.append({"round": round_idx, "node": node, "local_steps": steps, "batch_size": row.get("batch_size"),
                     "mean_step_s": row["compute_s"] / steps if steps else None,
                     "predicted_step_s": planned.get("predicted_step_s"), "loss": row.get("loss"),
                     "start_checksum": row.get("start_checksum"), "wait_s": record.get("wait_s"),
                     "comm_s": record.get("comm_s"), "gpu_util": record.get("gpu_util"),
                     "power_w": record.get("power_w")})
    rows.sort(key=lambda item: (item["round"], item["node"]))
    return {"rows": rows, "eval_loss": {str(key): value for key, value in sorted(evals.items())}}


def cold_step_predictions(config: dict) -> dict[str, Optional[float]]:
    """Per node, the predictor's datasheet-only t(B) (s) for what the run trains (its precision, the node's GPUs);
    None for a node without GPU names. The planner's own predictions after round 1 are calibrated on
    measured steps, so this is the number that tests the datasheet model."""
    from geodiloco.predictor.model import node_step_model
    from geodiloco.predictor.workload import resolve_dims

    dims = resolve_dims(config["model"]["preset"])
    predictions: dict[str, Optional[float]] = {}
    for node in config["nodes"]:
        if not node["gpus"]:
            predictions[node["name"]] = None
            continue
        model = node_step_model(node["gpus"], dims, config["model"]["seq_len"], precision=config["model"]["precision"])
        predictions[node["name"]] = model.predict(config["diloco"]["batch_size"])
    return predictions


def checksum_spread(rows: list[dict], round_idx: int) -> Optional[float]:
    """Largest relative difference of the nodes' parameter checksums at the start of a round."""
    sums = [row["start_checksum"] for row in rows if row["round"] == round_idx and row["start_checksum"] is not None]
    if len(sums) < 2:
        return None
    return (max(sums) - min(sums)) / max(abs(max(sums)), 1e-30)


def round_loss(rows: list[dict], round_idx: int) -> Optional[float]:
    losses = [row["loss"] for row in rows if row["round"] == round_idx and row["loss"] is not None]
    return sum(losses) / len(losses) if losses else None


def check(name: str, passed: bool, detail: str) -> dict:
    return {"check": name, "passed": bool(passed), "detail": detail}


def run_checks(outcome: RunOutcome, settings: RunSettings, node_names: list[str], expect_gpu: bool) -> list[dict]:
    """What a healthy run shows: clean exits, every round logged by every node, identical global
    parameters at each round start (the outer sync agreed), a falling loss, and (on GPU) GPU memory in use."""
    rows = outcome.summary.get("rows", [])
    codes = {agent.node: agent.exit_code for agent in outcome.agents}
    checks = [check("agents exited 0", not outcome.timed_out and all(code == 0 for code in codes.values()),
                    "timed out" if outcome.timed_out else f"exit codes {codes}")]
    expected = {(round_idx, name) for round_idx in range(settings.rounds) for name in node_names}
    logged = {(row["round"], row["node"]) for row in rows}
    checks.append(check("every node logged every round", expected <= logged,
                        f"{len(logged & expected)}/{len(expected)} (round, node) rows"))
    spreads = [checksum_spread(rows, round_idx) for round_idx in range(settings.rounds)]
    known = [spread for spread in spreads if spread is not None]
    checks.append(check("nodes start every round from the same parameters",
                        len(known) == settings.rounds and max(known) <= CHECKSUM_RTOL,
                        f"largest relative checksum difference {max(known):.1e}" if known else "no checksums"))
    first, last = round_loss(rows, 0), round_loss(rows, settings.rounds - 1)
    falling = first is not None and last is not None and math.isfinite(last) and last < first
    checks.append(check("training loss fell", falling,
                        f"round 1 {first:.3f} -> round {settings.rounds} {last:.3f}"
                        if first is not None and last is not None else "no losses logged"))
    evals = [value for value in outcome.summary.get("eval_loss", {}).values() if value is not None]
    checks.append(check("global eval loss finite", bool(evals) and all(math.isfinite(v) for v in evals),
                        ", ".join(f"{value:.3f}" for value in evals) or "none logged"))
    if expect_gpu:
        rise = (outcome.memory_peak_gib - outcome.memory_before_gib
                if outcome.memory_peak_gib is not None and outcome.memory_before_gib is not None else None)
        utils = [row["gpu_util"] for row in rows if row.get("gpu_util") is not None]
        detail = (f"GPU memory in use rose by {rise:.2f} GiB during the run" if rise is not None
                  else "GPU memory not readable") + (f"; mean NVML utilization {sum(utils) / len(utils):.0f} %"
                                                     if utils else "; no NVML utilization logged")
        checks.append(check("the nodes trained on the GPU", (rise is not None and rise > 0.1) or
                            any(util > 0 for util in utils), detail))
    return checks
