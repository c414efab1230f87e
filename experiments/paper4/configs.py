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
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from balancer.cluster import NodeSpec, load_cluster
from predictor.model import node_step_model
from predictor.workload import parameter_count, resolve_dims

ROOT = Path(__file__).resolve().parents[2]
PAPER_CLUSTER = ROOT / "experiments" / "configs" / "clusters" / "paper4.yaml"
EMULATED_MODEL = "llama-150m"
EMULATED_SEQ_LEN = 1024
PAPER_LOCAL_STEPS = 100
PAPER_BATCH_SIZE = 4
PAPER_BANDWIDTH_MBPS = 1000.0
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

    @property
    def round_scale(self) -> float:
        """Emulated seconds per paper second of local phase: H'/H x time_scale."""
        return self.local_steps / PAPER_LOCAL_STEPS * self.time_scale

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


def speed_offset(node: NodeSpec) -> float:
    """Paper-fitted step time / the predictor's, both at the paper's batch (the planner does not know it)."""
    model = node_step_model(node.gpus, resolve_dims(EMULATED_MODEL), EMULATED_SEQ_LEN, precision=PRECISION)
    return node.measured.step_time_s / model.predict(node.measured.batch_size)


def node_entry(node: NodeSpec, scaling: Scaling, scenario: Scenario) -> dict:
    slowdown = [{"from_round": 0, "factor": round(speed_offset(node), 6)}]
    if scenario.slow_node == node.name:
        slowdown.append({"from_round": scenario.slow_from_round, "factor": scenario.slow_factor})
    return {
        "name": node.name, "site": node.site, "gpus": list(node.gpus),
        "emulate": {"gpu": "from_gpus", "model": EMULATED_MODEL, "seq_len": EMULATED_SEQ_LEN,
                    "time_scale": scaling.time_scale, "slowdown": slowdown},
        "wan": {"bandwidth_mbps": round(scaling.bandwidth_mbps(), 3)},
    }


def run_config(policy: str, scaling: Scaling, scenario: Scenario = PAPER) -> dict:
    """A complete run config (the mapping `geodiloco run --config` reads)."""
    return {
        "run": {"name": f"{scenario.name}-{policy}", "out_dir": "runs", "seed": 0},
        "model": {"preset": scaling.model, "seq_len": scaling.seq_len, "precision": PRECISION},
        "data": {"source": "stdlib", "max_bytes": 2_000_000, "eval_batches": 4, "eval_batch_size": 8},
        "optim": {"inner": {"lr": 1.0e-3, "warmup_steps": 10, "weight_decay": 0.1, "grad_clip": 1.0},
                  "outer": {"lr": 0.7, "momentum": 0.9, "nesterov": True}},
        "diloco": {"rounds": scaling.rounds, "local_steps": scaling.local_steps,
                   "batch_size": PAPER_BATCH_SIZE, "weighting": "auto"},
        "balancing": {"policy": policy},
        "comm": {"backend": "torch", "timeout_s": 300},
        "checkpoint": {"every_rounds": scaling.rounds, "keep": 1},
        "nodes": [node_entry(node, scaling, scenario) for node in paper_nodes()],
    }
