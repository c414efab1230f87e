"""Run configs of the paper4 reproduction: the source paper's cluster, emulated on one machine.

What each node is (see README.md, "What is emulated"):

- Real: four training processes (one per node), each in its own network namespace
  behind a tbf-shaped link, training the ``tiny`` preset on this CPU, with real DiLoCo
  outer syncs (gloo all-reduce of the pseudo-gradients).
- Emulated: the GPUs. Each inner step is padded (``emulate.gpu: from_gpus``) to the
  predictor's t(B) for the node's GPUs running ``llama-150m`` at seq 1024, times
  ``time_scale`` and times a per-node offset so that at batch 4 the step lasts the
  paper-fitted time of ``experiments/configs/clusters/paper4.yaml`` (fit to Table 3).
  The offset is written as an ``emulate.slowdown`` event from round 0: the planner
  never reads slowdowns, so it plans from the predictor's estimate of the node's GPUs
  and has to learn the offset from measured steps, like on real hardware.

``truth="real"`` replaces the virtual GPUs by real compute: each node trains the
``tiny`` model at seq 128 in a cgroup limited to a CPU share proportional to its
speed in the paper (``emulate.cpu_share``, the four shares adding up to 1.6 cores),
so its step time, t(B) shape and noise are whatever this CPU does. The planner still
plans from the nodes' GPU names: wrong in scale (GPU seconds for a CPU) and in shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from geodiloco.balancer.cluster import NodeSpec, load_cluster
from geodiloco.predictor.model import node_step_model
from geodiloco.predictor.workload import parameter_count, resolve_dims

ROOT = Path(__file__).resolve().parents[2]
PAPER_CLUSTER = ROOT / "experiments" / "configs" / "clusters" / "paper4.yaml"
EMULATED_MODEL = "llama-150m"
EMULATED_SEQ_LEN = 1024
PAPER_LOCAL_STEPS = 100
PAPER_BATCH_SIZE = 4
PAPER_BANDWIDTH_MBPS = 1000.0
REAL_TOTAL_CORES = 1.6
REAL_SEQ_LEN = 128
CPU_MEASURED_CLUSTER = ROOT / "experiments" / "configs" / "clusters" / "paper4_cpu_measured.yaml"
TRUTHS = ("virtual", "real")
PRECISION = "bf16"
POLICIES = ("uniform", "batch_by_flops", "max_batch_by_memory", "steps_by_flops",
            "time", "hybrid", "adaptive", "deadline")
SLOWDOWN_POLICIES = ("uniform", "steps_by_flops", "adaptive", "deadline")
QUICK_POLICIES = ("uniform", "steps_by_flops", "deadline")


@dataclass(frozen=True)
class Scaling:
    """How the paper's run is shrunk to fit this machine.

    ``local_steps``: baseline H (paper: 100). ``time_scale``: every emulated step time is
    multiplied by it. ``seq_len``/``model``: what really trains on the CPU.
    ``wan``: ``literal`` = the paper's 1 Gbit/s on every link (the tiny model's sync then
    takes far less than llama-150m's); ``scaled`` = bandwidth chosen so the tiny model's
    outer sync takes the same share of a round as llama-150m's at 1 Gbit/s.
    """

    rounds: int = 10
    local_steps: int = 20
    time_scale: float = 0.75
    model: str = "tiny"
    seq_len: int = 32
    wan: str = "literal"
    truth: str = "virtual"

    @property
    def round_scale(self) -> float:
        """Seconds here per paper second of local phase: H'/H x time_scale (real truth: x the CPU's
        step time at batch 4 over the paper's, for the slowest node, from the measured curves)."""
        return self.local_steps / PAPER_LOCAL_STEPS * self.effective_time_scale

    @property
    def effective_time_scale(self) -> float:
        if self.truth == "virtual":
            return self.time_scale
        return real_time_scale()

    def bandwidth_mbps(self) -> float:
        """Link rate (Mbit/s) of every site."""
        if self.wan == "literal":
            return PAPER_BANDWIDTH_MBPS
        ratio = parameter_count(resolve_dims(self.model)) / parameter_count(resolve_dims(EMULATED_MODEL))
        return PAPER_BANDWIDTH_MBPS * ratio / self.round_scale


@dataclass(frozen=True)
class Scenario:
    """``slow_node`` runs ``slow_factor`` x slower from round ``slow_from_round`` on (None = no slowdown)."""

    name: str = "paper"
    slow_node: Optional[str] = None
    slow_from_round: int = 5
    slow_factor: float = 2.0


PAPER = Scenario()
SLOWDOWN = Scenario(name="slowdown", slow_node="node1")


def paper_nodes() -> list[NodeSpec]:
    return load_cluster(PAPER_CLUSTER).nodes


def real_shares(total_cores: float = REAL_TOTAL_CORES) -> dict[str, float]:
    """CPU share per node, proportional to 1 / its paper-fitted step time, adding up to ``total_cores``."""
    speed = {node.name: 1.0 / node.measured.step_time_s for node in paper_nodes()}
    total = sum(speed.values())
    return {name: round(total_cores * value / total, 4) for name, value in speed.items()}


def real_time_scale() -> float:
    """CPU seconds per paper second for the slowest node at batch 4 (from the measured curves;
    1.0 when they were not measured here). Only sets the WAN share and the paper-scale column."""
    if not CPU_MEASURED_CLUSTER.is_file():
        return 1.0
    from geodiloco.balancer.step_time import measured_step_model
    paper = {node.name: node.measured.step_time_s for node in paper_nodes()}
    slowest = max(paper, key=paper.get)
    measured = next(node for node in load_cluster(CPU_MEASURED_CLUSTER).nodes if node.name == slowest)
    return measured_step_model(measured.measured, None).predict(PAPER_BATCH_SIZE) / paper[slowest]


def speed_offset(node: NodeSpec) -> float:
    """Paper-fitted step time / the predictor's, both at the paper's batch (the planner does not know it)."""
    model = node_step_model(node.gpus, resolve_dims(EMULATED_MODEL), EMULATED_SEQ_LEN, precision=PRECISION)
    return node.measured.step_time_s / model.predict(node.measured.batch_size)


def node_entry(node: NodeSpec, scaling: Scaling, scenario: Scenario) -> dict:
    if scaling.truth == "real":
        return real_node_entry(node, scaling, scenario)
    slowdown = [{"from_round": 0, "factor": round(speed_offset(node), 6)}]
    if scenario.slow_node == node.name:
        slowdown.append({"from_round": scenario.slow_from_round, "factor": scenario.slow_factor})
    return {
        "name": node.name, "site": node.site, "gpus": list(node.gpus),
        "emulate": {"gpu": "from_gpus", "model": EMULATED_MODEL, "seq_len": EMULATED_SEQ_LEN,
                    "time_scale": scaling.time_scale, "slowdown": slowdown},
        "wan": {"bandwidth_mbps": round(scaling.bandwidth_mbps(), 3)},
    }


def real_node_entry(node: NodeSpec, scaling: Scaling, scenario: Scenario) -> dict:
    """A real-compute node: a CPU share in the paper's proportions; a slowdown divides the share."""
    slowdown = ([{"from_round": scenario.slow_from_round, "factor": scenario.slow_factor}]
                if scenario.slow_node == node.name else [])
    return {
        "name": node.name, "site": node.site, "gpus": list(node.gpus),
        "emulate": {"cpu_share": real_shares()[node.name], "slowdown": slowdown},
        "wan": {"bandwidth_mbps": round(scaling.bandwidth_mbps(), 3)},
    }


REAL_MAX_BATCH = 32
"""The largest batch of the paper's policy B (Table 2). Under the real truth the planner sizes
memory for the tiny model on 24-32 GB GPUs, which would allow thousands of samples: more than
this CPU machine's memory holds. So every real-truth run caps the batch at the paper's largest."""


def real_balancing(policy: str) -> dict:
    return {"policy": policy, "max_batch_size": REAL_MAX_BATCH}


def run_config(policy: str, scaling: Scaling, scenario: Scenario = PAPER, seed: int = 0,
               shards: str = "iid", offline_eval: bool = False) -> dict:
    """A complete run config (the mapping `geodiloco run --config` reads).

    ``offline_eval``: hold out a large eval set (512 sequences) that the run never evaluates
    itself (so evaluation steals no CPU from a real-compute node); every round's global
    checkpoint is kept for `geodiloco evaluate`.
    """
    seq_len = REAL_SEQ_LEN if scaling.truth == "real" else scaling.seq_len
    data = {"source": "stdlib", "max_bytes": 2_000_000, "eval_batches": 4, "eval_batch_size": 8, "shards": shards}
    checkpoint = {"every_rounds": scaling.rounds, "keep": 1}
    if offline_eval:
        data.update({"eval_batches": 32, "eval_batch_size": 16, "eval_every_rounds": 0})
        checkpoint = {"every_rounds": 1, "keep": scaling.rounds}
    return {
        "run": {"name": f"{scenario.name}-{policy}", "out_dir": "runs", "seed": seed},
        "model": {"preset": scaling.model, "seq_len": seq_len, "precision": PRECISION},
        "data": data,
        "optim": {"inner": {"lr": 1.0e-3, "warmup_steps": 10, "weight_decay": 0.1, "grad_clip": 1.0},
                  "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True}},
        "diloco": {"rounds": scaling.rounds, "local_steps": scaling.local_steps,
                   "batch_size": PAPER_BATCH_SIZE, "weighting": "auto", "overlap": "none", "compression": "none"},
        "balancing": real_balancing(policy) if scaling.truth == "real" else {"policy": policy},
        # fixed membership: the published figures were measured without torchrun's agents in the way
        "comm": {"backend": "torch", "timeout_s": 300, "elastic": {"enabled": False}},
        "checkpoint": checkpoint,
        "nodes": [node_entry(node, scaling, scenario) for node in paper_nodes()],
    }
