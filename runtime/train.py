"""One node's training process: ``python -m runtime.train --config run.yaml --node-name NAME``.

Started by torchrun at each site (or by ``geodiloco run`` on one machine). Each
outer round: take this round's plan, run the local phase (inner AdamW steps,
padded to the emulated GPU's step time), wait for the peers (readiness
exchange), all-reduce the weighted pseudo-gradients, take the outer Nesterov
step, then log and checkpoint.

With ``comm.backend: hivemind`` there is no torch.distributed world across nodes
(runtime/hivemind_sync.py): nodes that find peers training join them with the
peers' global state, a node that falls behind rejoins, each node's leader writes
its own idle rows, and the first present node of a round writes the round's plan,
metrics and global checkpoint.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
from torch.nn.parallel import DistributedDataParallel

from balancer.plan import NodePlan, Plan, RoundMeasurement
from balancer.planner import Planner
from balancer.records import IdleRecord
from runtime import checkpoint
from runtime.comm import TorchOuterSync, Topology, build_topology, init_process_group, node_name_from_env
from runtime.config import RunConfig, load_config
from runtime.hivemind_sync import OutOfSync
from runtime.data import NodeShard, ShardCursor, eval_batches, load_corpus
from runtime.diloco import COMPRESSION_DTYPES, OuterState, build_inner_optimizer, inner_lr, outer_weights
from runtime.emulation import StepPacer
from runtime.gpu_sampler import GpuSampler
from runtime.idle import RoundClock
from runtime.models import build_model
from runtime.runlog import LOG_NAMES, RunLog

FORCED_EXIT_GRACE_S = 10.0


class StopRequested(Exception):
    """SIGTERM or SIGINT arrived: stop at once; the last complete checkpoint stays."""


def install_stop_handlers() -> None:
    """Turn SIGTERM/SIGINT into StopRequested; force the exit if a collective blocks too long."""

    def handle(signum, _frame):
        watchdog = threading.Timer(FORCED_EXIT_GRACE_S, lambda: os._exit(128 + signum))
        watchdog.daemon = True
        watchdog.start()
        raise StopRequested(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


@dataclass
class LocalResult:
    """What the local phase of one round did on this node."""

    steps: int = 0
    tokens: int = 0
    step_times_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    lr: float = 0.0

    @property
    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else float("nan")


class NodeTrainer:
    """Holds one node's model, optimizers, data and outer state for the whole run."""

    def __init__(self, config: RunConfig, topology: Topology, run_dir: Path, device: torch.device) -> None:
        self.config = config
        self.topology = topology
        self.run_dir = run_dir
        self.device = device
        self.node = config.node(topology.node_name)
        self.dims = config.model.dims()
        self.seq_len = config.model.seq_len
        self.model = build_model(self.dims, config.run.seed).to(device)
        self.train_model = self.model
        if topology.local_world_size > 1:
            self.train_model = DistributedDataParallel(
                self.model, process_group=topology.node_group,
                device_ids=[device.index] if device.type == "cuda" else None)
        inner = config.optim.inner
        self.inner_optimizer = build_inner_optimizer(self.model, inner.optimizer, inner.lr,
                                                     inner.weight_decay, inner.betas)
        outer = config.optim.outer
        self.outer: Optional[OuterState] = None
        if topology.is_leader:
            outer_device = "cuda" if config.comm.outer_device == "cuda" else "cpu"
            self.outer = OuterState(self.model, outer.lr, outer.momentum, outer.nesterov, outer_device)
        corpus = load_corpus(config.data.source, config.data.max_bytes)
        eval_bytes = config.data.eval_batches * config.data.eval_batch_size * (self.seq_len + 1)
        train_tokens = corpus[:len(corpus) - eval_bytes] if eval_bytes else corpus
        self.eval_set = (eval_batches(corpus, self.seq_len, config.data.eval_batch_size, config.data.eval_batches)
                         if eval_bytes else [])
        self.shard = NodeShard(train_tokens, topology.node_index, topology.num_nodes, self.seq_len,
                               config.run.seed)
        self.pacer = StepPacer(self.node, topology.node_index, config.diloco.batch_size, config.run.seed,
                               self.dims, self.seq_len, config.model.precision)
        self.planner = self.new_planner()
        self.measurements: list[RoundMeasurement] = []
        self.hivemind = config.comm.backend == "hivemind"
        self.writes_round = True
        self.sync = build_outer_sync(config, topology, sum(param.numel() for param in self.model.parameters()))
        self.gpu_sampler = start_gpu_sampler(config, topology, device)

    def new_planner(self) -> Planner:
        config = self.config
        return Planner(config.balancing, config.nodes, self.dims, self.seq_len,
                       config.diloco.local_steps, config.diloco.batch_size, config.model.precision)

    # ----- local phase -------------------------------------------------------------------

    def _micro_batch(self, micro_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's slice of the node's next micro-batch (all ranks advance one cursor)."""
        inputs, targets = self.shard.next_batch(micro_size)
        ranks = self.topology.local_world_size
        if ranks > 1:
            inputs, targets = inputs[self.topology.local_rank::ranks], targets[self.topology.local_rank::ranks]
        return inputs.to(self.device), targets.to(self.device)

    def _set_lr(self, round_idx: int, step_idx: int, local_steps: int) -> float:
        inner, base_steps = self.config.optim.inner, self.config.diloco.local_steps
        progress = round_idx * base_steps + step_idx * base_steps / local_steps
        lr = inner_lr(inner.lr, progress, self.config.diloco.rounds * base_steps,
                      inner.warmup_steps, inner.min_lr_ratio)
        for group in self.inner_optimizer.param_groups:
            group["lr"] = lr
        return lr

    def inner_step(self, batch_size: int, micro_size: int) -> float:
        """One optimizer step over ``batch_size`` samples in micro-batches; returns the loss."""
        total_loss = 0.0
        remaining = batch_size
        while remaining > 0:
            size = min(micro_size, remaining)
            remaining -= size
            inputs, targets = self._micro_batch(size)
            if inputs.shape[0] == 0:
                continue
            syncing = remaining == 0 or not isinstance(self.train_model, DistributedDataParallel)
            context = self.train_model.no_sync() if not syncing else _null_context()
            with context:
                loss = self.train_model(inputs, targets) * (size / batch_size)
                loss.backward()
            total_loss += loss.item()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.inner.grad_clip)
        self.inner_optimizer.step()
        self.inner_optimizer.zero_grad(set_to_none=True)
        return total_loss

    def local_phase(self, round_idx: int, node_plan: NodePlan, round_started: float) -> LocalResult:
        result = LocalResult()
        for step_idx in range(node_plan.local_steps):
            if node_plan.deadline_s is not None and step_idx > 0:
                expected_step_s = sum(result.step_times_s) / len(result.step_times_s)
                if time.perf_counter() - round_started + expected_step_s > node_plan.deadline_s:
                    break
            step_started = time.perf_counter()
            result.lr = self._set_lr(round_idx, step_idx, node_plan.local_steps)
            result.losses.append(self.inner_step(node_plan.batch_size, node_plan.micro_batch_size))
            self.pacer.pad(step_started, round_idx, step_idx, node_plan.batch_size)
            result.step_times_s.append(time.perf_counter() - step_started)
            result.steps += 1
        result.tokens = result.steps * node_plan.batch_size * self.seq_len
        return result

    # ----- outer sync --------------------------------------------------------------------

    def weighting(self, plan: Plan) -> str:
        mode = self.config.diloco.weighting
        return plan.weighting if mode == "auto" else mode

    def outer_sync(self, plan: Plan, stats_by_node: dict[str, dict]) -> None:
        """Weighted pseudo-gradient reduction among the present nodes' leaders, outer step,
        in-node broadcast. ``stats_by_node`` holds the nodes present this round."""
        if self.outer is not None:
            present = list(stats_by_node)
            weights = outer_weights(self.weighting(plan),
                                    [stats_by_node[name]["tokens"] for name in present],
                                    [stats_by_node[name]["steps"] for name in present],
                                    [stats_by_node[name]["batch_size"] for name in present])
            flat = self.outer.pseudo_gradient(self.model)
            averaged = self.sync.reduce_weighted(flat, weights[present.index(self.node.name)],
                                                 COMPRESSION_DTYPES[self.config.diloco.compression],
                                                 total_weight=sum(weights))
            self.outer.apply(averaged)
            self.outer.load_into(self.model)
        self.sync.broadcast_in_node([param.data for param in self.model.parameters()])

    def warm_up(self, batch_size: int) -> None:
        """One forward/backward without an update, so one-time initialisation (allocator,
        kernel selection) does not inflate the first round's measured step times."""
        inputs, targets = self.shard.next_batch(batch_size)
        cursor = self.shard.cursor
        self.model(inputs.to(self.device), targets.to(self.device)).backward()
        self.inner_optimizer.zero_grad(set_to_none=True)
        self.shard.set_cursor(ShardCursor(cursor.epoch, cursor.index - inputs.shape[0]))

    @torch.no_grad()
    def param_checksum(self) -> float:
        """Sum of |parameters| in float64: equal on every node right after an outer sync."""
        return float(sum(param.detach().double().abs().sum() for param in self.model.parameters()))

    @torch.no_grad()
    def evaluate(self) -> Optional[float]:
        if not self.eval_set:
            return None
        self.model.eval()
        losses = [self.model(inputs.to(self.device), targets.to(self.device)).item()
                  for inputs, targets in self.eval_set]
        self.model.train()
        return sum(losses) / len(losses)

    # ----- checkpoints -------------------------------------------------------------------

    def save_checkpoint(self, round_idx: int, run_id: str, pending_record: dict) -> None:
        if self.topology.is_leader:
            checkpoint.save_node(self.run_dir, round_idx, self.node.name, {
                "round": round_idx,
                "inner_optimizer": self.inner_optimizer.state_dict(),
                "cursor": asdict(self.shard.cursor),
                "measurements": [asdict(item) for item in self.measurements],
                "pending_record": pending_record,
                "torch_rng": torch.get_rng_state(),
            })
        if self.topology.is_coordinator and self.writes_round:
            checkpoint.save_global(self.run_dir, round_idx, {
                "round": round_idx, "run_id": run_id, "outer": self.outer.state_dict(),
            })
        self.sync.barrier()
        if self.topology.is_coordinator and self.writes_round:
            checkpoint.mark_latest(self.run_dir, round_idx, self.config.checkpoint.keep)

    def load_checkpoint(self, round_idx: int) -> tuple[str, Optional[dict]]:
        """Restore the state after ``round_idx``; returns (run_id, this node's pending idle record)."""
        global_state = checkpoint.load_global(self.run_dir, round_idx)
        node_state = checkpoint.load_node(self.run_dir, round_idx, self.node.name)
        if self.outer is None:
            self.outer = OuterState(self.model, 1.0, 0.0, False)
        self.outer.load_state_dict(global_state["outer"])
        self.outer.load_into(self.model)
        if not self.topology.is_leader:
            self.outer = None
        self.inner_optimizer.load_state_dict(node_state["inner_optimizer"])
        self.shard.set_cursor(ShardCursor(**node_state["cursor"]))
        self.measurements = [RoundMeasurement(**item) for item in node_state["measurements"]]
        for measurement in self.measurements:
            self.planner.observe(measurement)
        torch.set_rng_state(node_state["torch_rng"])
        return global_state["run_id"], node_state.get("pending_record")

    # ----- state shared with joining nodes (hivemind) ------------------------------------

    def shared_state(self, round_idx: int, run_id: str) -> tuple[dict, list[torch.Tensor]]:
        """(metadata, tensors) a joiner needs after ``round_idx``: global params, outer momentum,
        run id and the planner's measurements (so it plans like its peers)."""
        params = self.outer.global_params
        momentum = [self.outer.optimizer.state.get(param, {}).get("momentum_buffer") for param in params]
        has_momentum = all(buffer is not None for buffer in momentum)
        metadata = {"round": round_idx, "run_id": run_id, "has_momentum": has_momentum,
                    "measurements": [asdict(item) for item in self.measurements]}
        return metadata, list(params) + (momentum if has_momentum else [])

    def load_shared_state(self, metadata: dict, tensors: list[torch.Tensor]) -> None:
        """Take a peer's global state (leader) and its measurement history (every rank)."""
        if self.outer is not None:
            count = len(self.outer.global_params)
            optimizer_state = self.outer.optimizer.state_dict()
            optimizer_state["state"] = ({index: {"momentum_buffer": tensors[count + index]} for index in range(count)}
                                        if metadata["has_momentum"] else {})
            self.outer.load_state_dict({"global_params": tensors[:count], "optimizer": optimizer_state})
            self.outer.load_into(self.model)
        self.measurements = [RoundMeasurement(**item) for item in metadata["measurements"]]
        self.planner = self.new_planner()
        for measurement in self.measurements:
            self.planner.observe(measurement)


@dataclass
class RoundStats:
    """One rank's contribution to the readiness exchange of a round."""

    node: str
    local_rank: int
    round: int
    steps: int
    batch_size: int
    tokens: int
    loss: float
    lr: float
    compute_s: float
    start_checksum: float
    step_times_s: list[float]
    previous_record: Optional[dict]


class _null_context:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_node(config: RunConfig, node_name: Optional[str], run_dir: Path, resume: bool) -> int:
    """Train this process's node for all rounds; returns an exit code."""
    install_stop_handlers()
    config_names = [node.name for node in config.nodes]
    node_name = node_name_from_env(node_name, config_names)
    use_cuda = torch.cuda.is_available() and os.environ.get("GEODILOCO_DEVICE", "auto") != "cpu"
    if config.comm.backend == "hivemind":
        from runtime.hivemind_sync import node_topology
        topology = node_topology(node_name, config_names, config.comm.timeout_s, use_cuda)
    else:
        init_process_group(config.comm.timeout_s, use_cuda)
        topology = build_topology(node_name, config_names)
    if config.run.deterministic:
        torch.use_deterministic_algorithms(True)
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if use_cuda else "cpu")
    trainer = NodeTrainer(config, topology, run_dir, device)
    try:
        return _train_rounds(trainer, resume)
    finally:
        if trainer.gpu_sampler is not None:
            trainer.gpu_sampler.stop()
        trainer.sync.close()


def build_outer_sync(config: RunConfig, topology: Topology, num_params: int):
    """The configured OuterSync backend (hivemind is imported only when chosen)."""
    if config.comm.backend != "hivemind":
        return TorchOuterSync(topology)
    from runtime.hivemind_sync import HivemindOuterSync, wire_codec
    return HivemindOuterSync(topology, config.comm.hivemind, config.run.name, [node.name for node in config.nodes],
                             num_params, wire_codec(config.comm.hivemind, config.diloco.compression))


def _fresh_run_id(config: RunConfig) -> str:
    return f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"


def _start_hivemind(trainer: NodeTrainer, resume: bool) -> tuple[str, int, Optional[dict]]:
    """Join peers already training, or found the run with the nodes starting now (lowest index wins)."""
    sync, topology, run_dir = trainer.sync, trainer.topology, trainer.run_dir
    decision = None
    if topology.is_leader:
        saved_round = checkpoint.latest_round(run_dir)
        if sync.running_round() is not None:
            decision = {"join": True}
        elif saved_round is not None and not resume:
            decision = {"error": f"{run_dir} already holds a checkpoint of round {saved_round} and no peer is "
                                 "training; pass --resume to continue it, or choose another --run-dir"}
        else:
            proposal = {"run_id": _fresh_run_id(trainer.config), "resume_round": saved_round if resume else None,
                        "node": topology.node_name}
            agreed = sync.found(proposal, trainer.config.comm.hivemind.start_wait_s)
            decision = {"join": True} if agreed is None else agreed
    decision = sync.share_in_node(decision)
    if "error" in decision:
        raise RuntimeError(decision["error"])
    if decision.get("join"):
        run_id, first_round = _join_from_peers(trainer)
        return run_id, first_round, None
    run_id, first_round, pending = decision["run_id"], 0, None
    if decision["resume_round"] is not None:
        run_id, pending = trainer.load_checkpoint(decision["resume_round"])
        first_round = decision["resume_round"] + 1
        if topology.is_leader and decision["node"] == topology.node_name:
            log = RunLog(run_dir)
            log.drop_rounds_from("idle.jsonl", decision["resume_round"])
            log.drop_rounds_from("metrics.jsonl", first_round)
            log.drop_rounds_from("plan.jsonl", first_round)
    sync.set_round(first_round, joined=first_round)
    if trainer.outer is not None:
        sync.publish_state(*trainer.shared_state(first_round - 1, run_id))
    return run_id, first_round, pending


def _join_from_peers(trainer: NodeTrainer) -> tuple[str, int]:
    """Load the peers' latest global state; returns (run id, the round this node joins)."""
    sync, topology = trainer.sync, trainer.topology
    info = None
    if topology.is_leader:
        loaded = sync.download_state(trainer.config.comm.init_timeout_s)
        if loaded is None:
            info = {"error": f"node {topology.node_name}: peers are training but none shared its state within "
                             f"comm.init_timeout_s ({trainer.config.comm.init_timeout_s:g} s)"}
        else:
            metadata, tensors = loaded
            trainer.load_shared_state(metadata, tensors)
            info = metadata
    info = sync.share_in_node(info)
    if "error" in info:
        raise RuntimeError(info["error"])
    if not topology.is_leader:
        trainer.load_shared_state(info, [])
    sync.broadcast_in_node([param.data for param in trainer.model.parameters()])
    next_round = info["round"] + 1
    sync.set_round(next_round, joined=next_round)
    print(f"[geodiloco] node {topology.node_name} joined run {info['run_id']} at round {next_round + 1} "
          "with its peers' global state", flush=True)
    return info["run_id"], next_round


def _reload_global_state(trainer: NodeTrainer, round_idx: int) -> None:
    """This node's parameters drifted from the majority's (a partial all-reduce, codec rounding):
    take a peer's global state after ``round_idx`` instead of its own."""
    topology = trainer.topology
    print(f"[geodiloco] node {topology.node_name}: parameters differ from the peers' at round {round_idx + 1}; "
          "reloading the global state from a peer", flush=True)
    if topology.is_leader:
        loaded = trainer.sync.download_state(trainer.config.comm.init_timeout_s, min_round=round_idx)
        if loaded is None:
            print(f"[geodiloco] node {topology.node_name}: no peer shared its state; keeping this node's",
                  flush=True)
        else:
            trainer.load_shared_state(*loaded)
    trainer.sync.broadcast_in_node([param.data for param in trainer.model.parameters()])


def _start_or_resume(trainer: NodeTrainer, resume: bool) -> tuple[str, int, Optional[dict]]:
    """Agree on run id and first round; restore state when resuming."""
    if trainer.hivemind:
        return _start_hivemind(trainer, resume)
    topology, run_dir = trainer.topology, trainer.run_dir
    saved_round = checkpoint.latest_round(run_dir) if topology.is_coordinator else None
    if topology.is_coordinator and saved_round is not None and not resume:
        proposal = {"error": f"{run_dir} already holds a checkpoint of round {saved_round}; "
                             "pass --resume to continue it, or choose another --run-dir"}
    else:
        proposal = {"run_id": _fresh_run_id(trainer.config), "resume_round": saved_round if resume else None}
    agreed = trainer.sync.exchange(proposal)[0]
    if "error" in agreed:
        raise RuntimeError(agreed["error"])
    resume_round = agreed["resume_round"]
    if resume_round is None:
        return agreed["run_id"], 0, None
    run_id, pending = trainer.load_checkpoint(resume_round)
    if topology.is_coordinator:
        log = RunLog(run_dir)
        log.drop_rounds_from("idle.jsonl", resume_round)
        log.drop_rounds_from("metrics.jsonl", resume_round + 1)
        log.drop_rounds_from("plan.jsonl", resume_round + 1)
    return run_id, resume_round + 1, pending


def _train_rounds(trainer: NodeTrainer, resume: bool) -> int:
    config, topology = trainer.config, trainer.topology
    run_id, first_round, pending_record = _start_or_resume(trainer, resume)
    trainer.warm_up(config.diloco.batch_size)
    trainer.sync.exchange(None)
    log = RunLog(trainer.run_dir) if topology.is_coordinator else None
    shared_config_written = trainer.hivemind and (trainer.run_dir / "config.yaml").is_file()
    if log is not None and not shared_config_written:
        log.write_config(config.to_yaml())
        if first_round > 0 and resume:
            print(f"[geodiloco] resuming {run_id} after round {first_round - 1}", flush=True)
    round_idx = first_round
    while round_idx < config.diloco.rounds:
        try:
            pending_record = _run_round(trainer, log, run_id, round_idx, pending_record)
        except OutOfSync as behind:
            print(f"[geodiloco] node {topology.node_name}: {behind}; reloading the global state from peers",
                  flush=True)
            run_id, round_idx = _join_from_peers(trainer)
            continue
        round_idx += 1
    final = trainer.sync.exchange({"local_rank": topology.local_rank, "previous_record": pending_record})
    if log is not None:
        log.append("idle.jsonl", [item["previous_record"] for item in final
                                  if item["local_rank"] == 0 and item["previous_record"]])
        print(f"[geodiloco] run {run_id} finished: logs in {trainer.run_dir}", flush=True)
    if trainer.pacer.slow_steps:
        print(f"[geodiloco] node {topology.node_name}: {trainer.pacer.slow_steps} steps were slower than the "
              "emulated GPU's target on this CPU; their real time was kept", file=sys.stderr, flush=True)
    return 0


def _run_round(trainer: NodeTrainer, log: Optional[RunLog], run_id: str, round_idx: int,
               pending_record: Optional[dict]) -> dict:
    """One outer round on this node; returns its idle record (logged with the next round)."""
    config, topology = trainer.config, trainer.topology
    names = [node.name for node in config.nodes]
    clock = RoundClock()
    start_checksum = trainer.param_checksum()
    clock.mark("start")
    present = None
    if trainer.hivemind:
        trainer.sync.set_round(round_idx)
        present = trainer.sync.planning_nodes(round_idx)
    plan = trainer.planner.plan(round_idx, present)
    node_plan = plan.node(topology.node_name)
    result = trainer.local_phase(round_idx, node_plan, time.perf_counter())
    clock.mark("local_done")
    stats = RoundStats(node=topology.node_name, local_rank=topology.local_rank, round=round_idx,
                       steps=result.steps, batch_size=node_plan.batch_size, tokens=result.tokens,
                       loss=result.mean_loss, lr=result.lr, compute_s=clock.compute_s,
                       start_checksum=start_checksum,
                       step_times_s=result.step_times_s if topology.is_leader else [],
                       previous_record=pending_record if topology.is_leader else None)
    gathered = trainer.sync.exchange(asdict(stats))
    clock.mark("ready")
    leaders = {item["node"]: item for item in gathered if item["local_rank"] == 0}
    stats_by_node = {name: leaders[name] for name in names if name in leaders}
    trainer.outer_sync(plan, stats_by_node)
    clock.mark("synced")
    for name, item in stats_by_node.items():
        measurement = RoundMeasurement(node=name, round=round_idx, batch_size=item["batch_size"],
                                       local_steps=item["steps"], step_times_s=item["step_times_s"],
                                       compute_s=item["compute_s"])
        trainer.measurements.append(measurement)
        trainer.planner.observe(measurement)
    if trainer.hivemind:
        trainer.writes_round = next(iter(stats_by_node)) == topology.node_name
        if trainer.sync.share_in_node(trainer.sync.diverged):
            _reload_global_state(trainer, round_idx)
        if trainer.outer is not None:
            trainer.sync.publish_state(*trainer.shared_state(round_idx, run_id))
    if log is not None:
        _log_round(trainer, log, run_id, plan, stats_by_node, clock)
    if (round_idx + 1) % config.checkpoint.every_rounds == 0 or round_idx + 1 == config.diloco.rounds:
        clock.mark("end")
        trainer.save_checkpoint(round_idx, run_id, _idle_record(trainer, run_id, plan, result, clock))
    clock.mark("end")
    return _idle_record(trainer, run_id, plan, result, clock)


def start_gpu_sampler(config: RunConfig, topology: Topology, device: torch.device) -> Optional[GpuSampler]:
    """The node leader samples its node's GPUs through NVML; None on CPU or when NVML fails."""
    if not topology.is_leader or device.type != "cuda" or config.run.gpu_sample_interval_s == 0:
        return None
    sampler = GpuSampler(interval_s=config.run.gpu_sample_interval_s,
                         device_indices=list(range(topology.local_world_size)))
    if not sampler.start():
        print(f"[geodiloco] node {topology.node_name}: GPU sampling off: {sampler.reason}", file=sys.stderr)
        return None
    return sampler


def _idle_record(trainer: NodeTrainer, run_id: str, plan: Plan, result: LocalResult, clock: RoundClock) -> dict:
    node = trainer.node
    gpu_values = (trainer.gpu_sampler.summary(clock.marks["start"], clock.marks["end"])
                  if trainer.gpu_sampler is not None else {})
    record = IdleRecord(
        run_id=run_id, round=plan.round, node=node.name, site=node.site, policy=plan.policy,
        local_steps=result.steps, batch_size=plan.node(node.name).batch_size, tokens=result.tokens,
        compute_s=clock.compute_s, wait_s=clock.wait_s, comm_s=clock.comm_s,
        overhead_s=clock.overhead_s, round_start=clock.marks["start"], round_end=clock.marks["end"],
        gpus=list(node.gpus), num_gpus=node.num_gpus, source="runtime", **gpu_values)
    return asdict(record)


def _log_round(trainer: NodeTrainer, log: RunLog, run_id: str, plan: Plan, stats_by_node: dict,
               clock: RoundClock) -> None:
    """Coordinator: plan, per-node metrics, global eval loss, previous round's idle records, progress line.

    hivemind: every node's leader appends its own previous idle record; the round's first present
    node writes the rest."""
    config = trainer.config
    if trainer.hivemind:
        own = stats_by_node.get(trainer.node.name, {}).get("previous_record")
        log.append("idle.jsonl", [own] if own else [])
        if not trainer.writes_round:
            return
        stats_by_node = {name: {**item, "previous_record": None} for name, item in stats_by_node.items()}
    log.append("plan.jsonl", [plan.to_dict()])
    rows = [{"run_id": run_id, "round": plan.round, "node": name, "loss": item["loss"], "lr": item["lr"],
             "tokens": item["tokens"], "local_steps": item["steps"], "batch_size": item["batch_size"],
             "compute_s": item["compute_s"], "start_checksum": item["start_checksum"]}
            for name, item in stats_by_node.items()]
    eval_loss = trainer.evaluate()
    total_tokens = sum(item["tokens"] for item in stats_by_node.values())
    rows.append({"run_id": run_id, "round": plan.round, "node": "global", "eval_loss": eval_loss,
                 "tokens": total_tokens, "wall_s": clock.marks["synced"]})
    log.append("metrics.jsonl", rows)
    log.append("idle.jsonl", [item["previous_record"] for item in stats_by_node.values()
                              if item["previous_record"]])
    steps = " ".join(f"{name}:{item['steps']}x{item['batch_size']}" for name, item in stats_by_node.items())
    train_loss = sum(item["loss"] for item in stats_by_node.values()) / len(stats_by_node)
    eval_text = f" eval {eval_loss:.3f}" if eval_loss is not None else ""
    print(f"[geodiloco] round {plan.round + 1}/{config.diloco.rounds} loss {train_loss:.3f}{eval_text} | "
          f"local {clock.compute_s:.2f}s wait {clock.wait_s:.2f}s sync {clock.comm_s:.2f}s | "
          f"steps x batch {steps}", flush=True)


def default_run_dir(config: RunConfig) -> Path:
    return Path(config.run.out_dir) / config.run.name


def build_arg_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.train",
        description="Train one node (site) of a GeoDiLoCo run. Start it under torchrun at every site, "
                    "or let `geodiloco run` start all nodes on this machine.")
    add_train_arguments(parser)
    return parser


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="run config YAML (see experiments/configs/)")
    parser.add_argument("--node-name", dest="node", help="which config node this site is (default: GEODILOCO_NODE, "
                                       "else torchrun's GROUP_RANK as an index into nodes:)")
    parser.add_argument("--run-dir", help="where logs and checkpoints go (default: run.out_dir/run.name); "
                                          "give every site the same path on its own disk")
    parser.add_argument("--resume", action="store_true", help="continue from the run directory's latest checkpoint")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set diloco.rounds=3 (repeatable)")


def train_from_args(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(config)
    try:
        return run_node(config, args.node, run_dir, args.resume)
    except StopRequested as stop:
        print(f"[geodiloco] node stopped by {stop}; the last complete checkpoint is kept in {run_dir}",
              file=sys.stderr, flush=True)
        return 143


def main(argv: Optional[list[str]] = None) -> int:
    from predictor.schema import ConfigError
    args = build_arg_parser().parse_args(argv)
    try:
        return train_from_args(args)
    except ConfigError as err:
        print(f"runtime.train: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
