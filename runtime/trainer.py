"""One node's training state and operations: model, optimizers, data, outer state.

NodeTrainer runs the local phase (inner steps, padded to the virtual GPU's time),
the outer sync through the configured backend, evaluation and checkpoints. The
round loop that drives it is in runtime/train.py.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.plan import NodePlan, Plan, RoundMeasurement
from geodiloco.balancer.network import SyncSettings, hivemind_codec
from geodiloco.balancer.planner import Planner
from geodiloco.predictor.unknown_gpus import adopt_more_rows, adopt_rows, adopted_rows, own_rows
from geodiloco.predictor.workload import parameter_tensor_count
from geodiloco.runtime import checkpoint
from geodiloco.runtime.checkpoint_writer import CheckpointWriter
from geodiloco.runtime.batching import StepSamples, accumulate_gradients, is_out_of_memory, micro_batch_sizes, run_fitting
from geodiloco.runtime.comm import Topology
from geodiloco.runtime.config import RunConfig
from geodiloco.runtime.config_agreement import check_same_config, shared_view
from geodiloco.runtime.run_dir import run_id_for
from geodiloco.runtime.data_sources import node_data
from geodiloco.runtime.diloco import OuterState, build_inner_optimizer, inner_lr
from geodiloco.lab.cpu_share import NodeCpuShare, start_node_share
from geodiloco.lab.virtual_gpu import StepPacer
from geodiloco.runtime.evaluation import BackgroundEvaluator
from geodiloco.runtime.gpu_sampler import GpuSampler
from geodiloco.runtime.mig_devices import PINNED_ENV
from geodiloco.runtime.models import build_configured_model
from geodiloco.runtime.finite_guard import NonFiniteModel, all_finite, check_global_finite
from geodiloco.runtime.recovery import log_membership_event, write_members
from geodiloco.runtime.precision import node_has_bf16, training_precision
from geodiloco.runtime.state_file import EncodedState, encode_state
from geodiloco.runtime.sync import RoundSync, SyncHandles, build_outer_sync


def stop_before_deadline(elapsed_s: float, expected_step_s: float, deadline_s: float, num_nodes: int) -> bool:
    """Whether to end the local phase rather than start one more step (all times in seconds).

    One more step that ends ``overshoot`` after the deadline makes each of the other
    ``num_nodes - 1`` nodes wait that long; stopping makes this node wait
    ``expected_step_s - overshoot`` itself. Total waiting is smaller with the step
    when ``overshoot < expected_step_s / num_nodes``, so a node whose plan ends just
    at the deadline (the slowest) is not cut short by a fraction of a percent of jitter.
    """
    overshoot_s = elapsed_s + expected_step_s - deadline_s
    return overshoot_s >= expected_step_s / max(1, num_nodes)


def leader_decides(topology: Topology, decision: bool) -> bool:
    """The node leader's ``decision``, the same on every rank of the node. Each rank's clock and step times
    differ a little, and a rank that started one more step alone would wait in the node's DDP all-reduce
    for ranks already at the outer sync: the node would hang."""
    if topology.node_group is None or topology.local_world_size == 1:
        return decision
    flag = torch.tensor([1 if decision else 0], dtype=torch.int32)
    dist.broadcast(flag, src=topology.node_ranks[0], group=topology.node_group)
    return bool(flag.item())


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


def start_cpu_share(node: NodeSpec) -> Optional[NodeCpuShare]:
    """This process under its node's ``emulate.cpu_share`` quota (real compute), or None."""
    emulate = node.emulate
    if emulate is None or emulate.cpu_share is None:
        return None
    owner = os.environ.get("GEODILOCO_CPU_GROUP_OWNER")
    return start_node_share(node.name, emulate.cpu_share, emulate.cpu_period_ms, emulate.slowdown_factor,
                            owner_pid=int(owner) if owner else None)


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
        self.model = build_configured_model(config.model, config.run.seed).to(device)
        self.train_model = self.model
        if topology.local_world_size > 1:
            self.train_model = DistributedDataParallel(
                self.model, process_group=topology.node_group,
                device_ids=[device.index] if device.type == "cuda" else None)
        self.precision = training_precision(config.model.precision, device,
                                            node_has_bf16(device, topology.node_group))
        if self.precision.note and topology.is_leader and device.type == "cuda":
            print(f"[geodiloco] node {self.node.name}: {self.precision.note}", file=sys.stderr, flush=True)
        inner = config.optim.inner
        self.inner_optimizer = build_inner_optimizer(self.model, inner.optimizer, inner.lr,
                                                     inner.weight_decay, inner.betas)
        outer = config.optim.outer
        self.outer: Optional[OuterState] = None
        if topology.is_leader:
            outer_device = "cuda" if config.comm.outer_device == "cuda" else "cpu"
            self.outer = OuterState(self.model, outer.lr, outer.momentum, outer.nesterov, outer_device)
        self.eval_set, self.shard = build_data(config, topology)
        self.pacer = StepPacer(self.node, topology.node_index, config.diloco.batch_size, config.run.seed,
                               self.dims, self.seq_len, config.model.precision)
        self.cpu_share = start_cpu_share(self.node)
        self.config_view = shared_view(config)
        """The settings every site must share (``runtime.config_agreement``), computed once."""
        self.planner = self.new_planner()
        self.measurements: list[RoundMeasurement] = []
        self.last_sync_s: Optional[float] = None
        self.saved_round: Optional[int] = None
        self.commits_saved_round = False
        self.checkpoint_writer = CheckpointWriter(config.checkpoint.background)
        checkpoint.set_flush_to_disk(config.checkpoint.flush)
        self._snapshots: dict[str, EncodedState] = {}
        """The last checkpoint's host copies by file ("node", "global"), reused by the next snapshot."""
        self.sync = build_outer_sync(config, topology, sum(param.numel() for param in self.model.parameters()),
                                     self.planner.sync.sync_s())
        self.gpu_sampler = start_gpu_sampler(config, topology, device)
        self.evaluator: Optional[BackgroundEvaluator] = None
        self.sync_staleness: Optional[int] = None
        """Staleness of this node's last update (async), for the progress line."""
        self.progress_origin: Optional[tuple[float, int]] = None
        """(unix time training started in this process, the first round it ran): the progress line's clock."""
        self._warned_batch_growth: set[tuple[int, int]] = set()
        self.micro_batch_cap: Optional[int] = None
        """Samples per pass this node's GPU memory was found to hold (after an out-of-memory error), which
        caps the planned micro-batch for the rest of the run; None until memory ran out."""

    def adopt_founders_gpu_rows(self, rows_by_node: list[tuple[str, dict]]) -> None:
        """Plan from the rows the run's founders sent with their proposals (hivemind; the torch backend
        agrees on them in ``runtime.comm.agree_at_start``), replanning with the measurements so far."""
        self._say_gpu_rows(adopt_rows(rows_by_node))
        self._replan()

    def adopt_joiners_gpu_rows(self, rows_by_node: list[tuple[str, dict]]) -> None:
        """Plan nodes that joined after the founding from the rows they plan their own GPUs with (hivemind
        heartbeats), replanning only when one of them changes a row this node planned with."""
        lines = adopt_more_rows(rows_by_node)
        self._say_gpu_rows(lines)
        if lines:
            self._replan()

    def _replan(self) -> None:
        """A fresh planner that has seen ``self.measurements`` (after a restore, or new GPU rows)."""
        self.planner = self.new_planner()
        for measurement in self.measurements:
            self.planner.observe(measurement)

    def _say_gpu_rows(self, lines: list[str]) -> None:
        if self.topology.is_leader:
            for line in lines:
                print(f"[geodiloco] node {self.node.name}: {line}", file=sys.stderr, flush=True)

    def new_planner(self) -> Planner:
        config = self.config
        diloco = config.diloco
        return Planner(config.balancing.for_mode(diloco.mode), config.nodes, self.dims, self.seq_len,
                       diloco.local_steps, diloco.batch_size, config.model.precision, sync_settings=planned_sync(config))

    # ----- local phase -------------------------------------------------------------------

    def _set_lr(self, round_idx: int, step_idx: int, local_steps: int) -> float:
        inner, base_steps = self.config.optim.inner, self.config.diloco.local_steps
        progress = round_idx * base_steps + step_idx * base_steps / local_steps
        lr = inner_lr(inner.lr, progress, self.config.diloco.rounds * base_steps,
                      inner.warmup_steps, inner.min_lr_ratio)
        for group in self.inner_optimizer.param_groups:
            group["lr"] = lr
        return lr

    def inner_step(self, batch_size: int, micro_size: int) -> StepSamples:
        """One optimizer step on the mean loss over the node's batch, in micro-batches shared
        by the node's ranks (see ``runtime.batching``: every rank trains at least one sample
        per micro-batch, which can make the effective batch larger than ``batch_size``).
        Returns the node's mean loss and the samples trained, the same on every rank."""
        ranks = self.topology.local_world_size
        micro_size = min(micro_size, self.micro_batch_cap or micro_size)
        self._warn_if_batch_grows(batch_size, micro_size, ranks)
        step = self.within_memory(lambda micro: accumulate_gradients(
            self.train_model, self.shard.next_batch, batch_size, micro, self.topology.local_rank, ranks,
            self.device, self.topology.node_group, self.precision), micro_size, f"batch {batch_size}")
        self.precision.step(self.inner_optimizer, lambda: torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), self.config.optim.inner.grad_clip))
        self.inner_optimizer.zero_grad(set_to_none=True)
        return step

    def within_memory(self, passes, micro_size: int, what: str):
        """``passes(micro_size)``: forward/backward passes of ``micro_size`` samples each. When the GPU's
        memory runs out, a one-rank node retries the same samples at half the micro-batch, down to one
        sample per pass (same gradient: accumulation), keeps the micro-batch that fit for the rest of
        the run, and says so once. A node of several ranks cannot retry alone (its DDP peers wait in the
        all-reduce), so it stops the run with what to change, as does a pass of one sample that does
        not fit."""
        from geodiloco.common.schema import ConfigError
        try:
            if self.topology.local_world_size > 1:
                return passes(micro_size)
            result, fitted = run_fitting(passes, micro_size, self._undo_passes(self.shard.position_state()))
        except Exception as err:
            if is_out_of_memory(err):
                raise ConfigError(self._out_of_memory_message(micro_size, what)) from None
            raise
        if fitted < micro_size:
            self.micro_batch_cap = fitted
            if self.topology.is_leader:
                print(f"[geodiloco] node {self.node.name}: out of GPU memory at {micro_size} samples per pass "
                      f"({what}); training in passes of {fitted} from now on (the same samples and gradient, "
                      "accumulated). The planner's memory estimate was too high for this GPU: raise "
                      "balancing.memory_headroom to plan smaller passes from the start", file=sys.stderr, flush=True)
        return result

    def _undo_passes(self, position: dict):
        """What undoes failed passes that started at data ``position``: their gradients, the samples
        they read, and (on a GPU) the memory the allocator still caches for them."""
        def undo() -> None:
            self.inner_optimizer.zero_grad(set_to_none=True)
            self.shard.load_position_state(position)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        return undo

    def _out_of_memory_message(self, micro_size: int, what: str) -> str:
        """``micro_size``: the samples per pass that did not fit (a one-rank node got down to one)."""
        ranks = self.topology.local_world_size
        model = self.config.model
        if ranks > 1:
            return (f"node {self.node.name} ran out of GPU memory at {micro_size} samples per pass on its "
                    f"{ranks} GPUs ({what}); raise balancing.memory_headroom so the planner takes smaller "
                    "micro-batches, or lower diloco.batch_size")
        return (f"node {self.node.name} ran out of GPU memory with one sample per pass ({what}, seq_len "
                f"{model.seq_len}, precision {model.precision}): the model does not fit this GPU; use a "
                "smaller model, a shorter model.seq_len, or model.precision bf16 / fp16")

    def _warn_if_batch_grows(self, batch_size: int, micro_size: int, ranks: int) -> None:
        """Once per (batch, micro-batch) plan: say when the node trains more samples than planned."""
        effective = sum(micro_batch_sizes(batch_size, micro_size, ranks))
        if effective == batch_size or (batch_size, micro_size) in self._warned_batch_growth:
            return
        self._warned_batch_growth.add((batch_size, micro_size))
        if self.topology.is_leader:
            print(f"[geodiloco] node {self.node.name}: planned batch {batch_size} (micro-batch {micro_size}) "
                  f"leaves some of its {ranks} GPUs without a sample; training an effective batch of "
                  f"{effective} so every GPU takes part in each micro-step. To train the planned batch, give "
                  f"this node a batch that is a multiple of {ranks} (diloco.batch_size, or nodes[].batch_size)",
                  file=sys.stderr, flush=True)

    def local_phase(self, round_idx: int, node_plan: NodePlan, round_started: float,
                    num_nodes: int = 1, round_sync: Optional[RoundSync] = None) -> LocalResult:
        """Run the plan's inner steps; under a deadline, stop early (see ``stop_before_deadline``).
        ``round_sync``: lets the sync backend act before each step (streaming sync)."""
        result = LocalResult()
        if self.cpu_share is not None:
            self.cpu_share.enter_round(round_idx)
        for step_idx in range(node_plan.local_steps):
            if node_plan.deadline_s is not None and step_idx > 0:
                expected_step_s = sum(result.step_times_s) / len(result.step_times_s)
                if leader_decides(self.topology, stop_before_deadline(time.perf_counter() - round_started, expected_step_s,
                                                          node_plan.deadline_s, num_nodes)):
                    break
            if round_sync is not None:
                self.sync.before_step(step_idx, node_plan.local_steps, round_sync)
            step_started = time.perf_counter()
            result.lr = self._set_lr(round_idx, step_idx, node_plan.local_steps)
            step = self.inner_step(node_plan.batch_size, node_plan.micro_batch_size)
            result.losses.append(step.mean_loss)
            self.pacer.pad(step_started, round_idx, step_idx, step.samples)
            result.step_times_s.append(time.perf_counter() - step_started)
            result.steps += 1
            result.tokens += step.samples * self.seq_len
        self.pacer.end_phase()
        return result

    # ----- outer sync --------------------------------------------------------------------

    def weighting(self, plan: Plan) -> str:
        mode = self.config.diloco.weighting
        return plan.weighting if mode == "auto" else mode

    def sync_handles(self) -> SyncHandles:
        """The state the sync backend may touch (see ``runtime.sync.protocol.SyncHandles``)."""
        return SyncHandles(params=list(self.model.parameters()), outer=self.outer,
                           export_state=self.shared_state, import_state=self.load_shared_state,
                           load_checkpoint=self.load_checkpoint, restore=self.restore,
                           checksum=self.param_checksum,
                           new_run_id=lambda: run_id_for(self.config, self.run_dir), run_dir=self.run_dir,
                           gpu_rows=own_rows(list(self.node.gpus)), config_view=self.config_view,
                           adopt_gpu_rows=self.adopt_joiners_gpu_rows,
                           save_final_global=self.save_final_global)

    def warm_up(self, batch_size: int) -> None:
        """One forward/backward without an update, so one-time initialisation (allocator,
        kernel selection) does not inflate the first round's measured step times. One pass of
        the planner's micro-batch for this node (a batch that needs accumulation would not fit
        in one pass); memory that runs out here caps the micro-batch as in a step."""
        ranks = self.topology.local_world_size
        micro_size = -(-self.planner.largest_micro_batch(self.node.name, batch_size) // ranks)  # this rank's share

        def one_pass(micro: int) -> None:
            inputs, targets = self.shard.next_batch(micro)
            with self.precision.autocast():
                loss = self.model(inputs.to(self.device), targets.to(self.device))
            loss.backward()

        position = self.shard.position_state()
        self.within_memory(one_pass, micro_size, f"warm-up pass of batch {batch_size}")
        self.inner_optimizer.zero_grad(set_to_none=True)
        self.shard.load_position_state(position)

    def local_model_finite(self) -> bool:
        return all_finite(self.model.parameters())

    def after_outer_step(self, round_idx: int, non_finite: list[str]) -> None:
        """After the outer step: a global model that is not finite stops the run (leaders check it);
        a node that was left out for a non-finite model clears its inner optimizer (the backend
        already put the global parameters back), and its leader logs the event."""
        if self.outer is not None:
            check_global_finite(self.outer.global_params, round_idx)
        if self.node.name in non_finite:
            self.inner_optimizer.state.clear()
            if self.topology.is_leader:
                log_membership_event(self.run_dir, "non_finite", node=self.node.name, round=round_idx)
                print(f"[geodiloco] node {self.node.name}: its model was non-finite (NaN or inf) in round "
                      f"{round_idx + 1}; left out of the outer average and reset to the global model",
                      file=sys.stderr, flush=True)

    @torch.no_grad()
    def param_checksum(self) -> float:
        """Sum of |parameters| in float64: equal on every node right after an outer sync."""
        return float(sum(param.detach().double().abs().sum() for param in self.model.parameters()))

    def evaluate_in_background(self, row: dict) -> None:
        """Start evaluating the current global model: the leader's global copy (with overlap the
        local model is the global one plus progress not yet synced)."""
        if not self.eval_set:
            return
        if self.evaluator is None:
            self.evaluator = BackgroundEvaluator(build_configured_model(self.config.model, self.config.run.seed),
                                                 self.eval_set, self.device)
        params = self.outer.global_params if self.outer is not None else list(self.model.parameters())
        with self.sync.state_lock():
            self.evaluator.start([param.detach() for param in params], row)

    def finished_evaluations(self, wait: bool = False) -> list[dict]:
        return self.evaluator.finished_rows(wait) if self.evaluator is not None else []

    # ----- checkpoints -------------------------------------------------------------------

    def save_checkpoint(self, round_idx: int, run_id: str, pending_record: dict, members: list[str]) -> None:
        """Node file: inner optimizer, data position, planner history, RNG, the sync backend's state
        (syncs in flight, error feedback) and, with ``diloco.overlap``, the local parameters
        (they differ from the global ones while a sync is in flight). Global file (the same on every
        node; written once per run directory): the global parameters, outer optimizer and planner
        history, beside the round's ``members`` (the nodes present).

        Here the states are only snapshotted (copied to host memory); ``checkpoint_writer`` hashes and
        writes the files, in the background unless ``checkpoint.background`` is false, and sets
        ``saved_round`` once they are on disk (``finish_checkpoint_write`` waits for that)."""
        self.checkpoint_writer.wait()  # normally ended at the exchange already: its host buffers are free again
        node_snapshot = global_snapshot = None
        if self.topology.is_leader:
            state = {
                "round": round_idx,
                "inner_optimizer": self.inner_optimizer.state_dict(),
                "grad_scaler": self.precision.state_dict(),
                "data_position": self.shard.position_state(),
                "measurements": [asdict(item) for item in self.measurements],
                "pending_record": pending_record,
                "torch_rng": torch.get_rng_state(),
                "sync": self.sync.state_dict(),
            }
            if self.config.diloco.overlap != "none":
                state["local_params"] = [param.detach() for param in self.model.parameters()]
            if not all_finite(self.model.parameters()):
                raise NonFiniteModel(f"node {self.node.name}'s model is non-finite (NaN or inf) at the end of round "
                                     f"{round_idx + 1}; nothing of this round is saved")
            node_snapshot = encode_state(state, reuse=self._snapshots.get("node"))
            self._snapshots["node"] = node_snapshot
        writes_global = self._writes_global(round_idx)
        # async: the host alone writes global files, and one left by a run it resumed holds an older model
        if writes_global and (self.sync.barrier_free or not checkpoint.has_global(self.run_dir, round_idx)):
            global_snapshot = self._global_snapshot(round_idx, run_id)
        run_dir, node_name = self.run_dir, self.node.name

        def write() -> None:
            if node_snapshot is not None:
                checkpoint.save_node(run_dir, round_idx, node_name, node_snapshot)
            if global_snapshot is not None:
                write_members(run_dir, round_idx, members)
                checkpoint.save_global(run_dir, round_idx, global_snapshot)
            self.saved_round = round_idx
            self.commits_saved_round = writes_global

        self.checkpoint_writer.submit(write, f"round {round_idx + 1} of node {node_name}")

    def _global_snapshot(self, round_idx: int, run_id: str, final: bool = False) -> EncodedState:
        """``final``: the run's final global model (async), written over the round's own (``save_final_global``)."""
        with self.sync.state_lock():
            snapshot = encode_state({"round": round_idx, "run_id": run_id,
                                     "outer": self.outer.state_dict(copy=False),
                                     "measurements": [asdict(item) for item in self.measurements],
                                     "sync": self.sync.global_state_dict(),
                                     **({"final": True} if final else {})},
                                    reuse=self._snapshots.get("global"))
        self._snapshots["global"] = snapshot
        return snapshot

    def save_final_global(self, round_idx: int, run_id: str, members: list[str]) -> None:
        """Write the global model as it is now as round ``round_idx``'s global checkpoint, replacing the
        one saved at that round's end, and wait until it is on disk. Async mode: the other nodes' last
        pushes land after the host saved its own last round, so without this the run's final model
        (the one every node ends on and the final evaluation scores) would be in no checkpoint, and
        ``export`` would give an older one."""
        self.checkpoint_writer.wait()
        snapshot = self._global_snapshot(round_idx, run_id, final=True)
        write_members(self.run_dir, round_idx, members)
        checkpoint.save_global(self.run_dir, round_idx, snapshot)

    def _writes_global(self, round_idx: int) -> bool:
        """Whether this node writes (and later commits) the round's global checkpoint: its leader, when the
        backend has it write the round, unless its parameters are not the round's full average (hivemind:
        its own all-reduce was partial, ``global_withheld``). Then no node writes it, and ``latest`` stays on
        the last round whose global file holds a full average: a resume or an export never starts from a
        partial one."""
        if not (self.topology.is_leader and self.sync.writes_global_file):
            return False
        if self.sync.global_withheld:
            print(f"[geodiloco] node {self.node.name}: no global checkpoint of round {round_idx + 1}: "
                  f"{self.sync.global_withheld}; `latest` stays on the last fully averaged round", flush=True)
            return False
        return True

    def finish_checkpoint_write(self) -> float:
        """Wait for the checkpoint write under way (if any), so that the next exchange reports its round;
        returns the seconds waited (idle: other overhead). Raises CheckpointWriteError if it failed."""
        return self.checkpoint_writer.wait()

    def commit_checkpoint(self, gathered: list) -> None:
        """Point ``latest`` at the round this node saved last once every node's leader in
        ``gathered`` (the next readiness exchange) reports having saved it too.

        Two-phase without a barrier of its own: the files are written at a round's end and
        committed with the next exchange, so no extra collective crosses the WAN (where it would
        queue behind a sync in flight). A crash in between leaves ``latest`` on the round before."""
        if self.saved_round is None:
            return
        leaders = [item for item in gathered if isinstance(item, dict) and item.get("local_rank") == 0]
        if not all(item.get("saved_round") == self.saved_round for item in leaders):
            return
        if self.commits_saved_round:
            checkpoint.mark_latest(self.run_dir, self.saved_round, self.config.checkpoint.keep)
        self.saved_round = None

    def load_checkpoint(self, round_idx: int) -> tuple[str, Optional[dict]]:
        """Restore the state after ``round_idx`` from this run directory; returns (run_id, this
        node's pending idle record)."""
        return self.restore(checkpoint.load_global(self.run_dir, round_idx),
                            checkpoint.load_node(self.run_dir, round_idx, self.node.name), keep_in_flight=True)

    def restore(self, global_state: dict, node_state: Optional[dict], keep_in_flight: bool) -> tuple[str, Optional[dict]]:
        """Take a round's global state and, when given, this node's own state of that round.

        ``node_state`` None or partial (a node rejoining after missed rounds: its data position and
        a peer's inner optimizer state). ``keep_in_flight`` False (the members changed): syncs that
        were in flight and the error feedback are dropped, the local model starts from the global one.
        Returns (run_id, this node's pending idle record)."""
        node_state = node_state or {}
        if self.outer is None:
            self.outer = OuterState(self.model, 1.0, 0.0, False)
        self.outer.load_state_dict(global_state["outer"])
        self.outer.load_into(self.model)
        self.sync.load_global_state_dict(global_state.get("sync", {}))
        if not self.topology.is_leader:
            self.outer = None
        if keep_in_flight and "local_params" in node_state:
            with torch.no_grad():
                for param, saved in zip(self.model.parameters(), node_state["local_params"]):
                    param.copy_(saved)
        # with other members the error feedback's layout (chunks per node) and the syncs in flight
        # no longer fit: start both afresh
        self.sync.load_state_dict(node_state.get("sync", {}) if keep_in_flight else {})
        if "inner_optimizer" in node_state:
            self.inner_optimizer.load_state_dict(node_state["inner_optimizer"])
        self.precision.load_state_dict(node_state.get("grad_scaler", {}))
        if "data_position" in node_state:
            self.shard.load_position_state(node_state["data_position"])
        history = global_state.get("measurements", node_state.get("measurements", []))
        self.measurements = [RoundMeasurement(**item) for item in history]
        self._replan()
        if "torch_rng" in node_state:
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
                    "measurements": [asdict(item) for item in self.measurements],
                    "gpu_rows_by_node": [[node, rows] for node, rows in adopted_rows()],
                    "node": self.node.name, "config_view": self.config_view}
        return metadata, list(params) + (momentum if has_momentum else [])

    def load_shared_state(self, metadata: dict, tensors: list[torch.Tensor]) -> None:
        """Take a peer's global state (leader) and its measurement history (every rank); a peer whose
        run settings differ from this node's stops it (``runtime.config_agreement``)."""
        if metadata.get("config_view") is not None:
            check_same_config(self.config_view, metadata["config_view"], self.node.name,
                              metadata.get("node", "of the peer"))
        if self.outer is not None:
            count = len(self.outer.global_params)
            optimizer_state = self.outer.optimizer.state_dict()
            optimizer_state["state"] = ({index: {"momentum_buffer": tensors[count + index]} for index in range(count)}
                                        if metadata["has_momentum"] else {})
            self.outer.load_state_dict({"global_params": tensors[:count], "optimizer": optimizer_state})
            self.outer.load_into(self.model)
        self.measurements = [RoundMeasurement(**item) for item in metadata["measurements"]]
        # This node's own rows are not adopted here but with the other joiners of its round, from the
        # heartbeats in config order (``planning_nodes``): adopting them first would plan a GPU name two
        # joiners of one round share from this node's row here and from the earlier node's on the peers.
        peers_rows = [(node, rows) for node, rows in metadata.get("gpu_rows_by_node") or []]
        if peers_rows:
            self._say_gpu_rows(adopt_rows(peers_rows))
        self._replan()


def planned_sync(config: RunConfig) -> SyncSettings:
    """The sync as the planner prices it: ``diloco:``'s settings, and under hivemind the codec on its wire."""
    diloco, comm = config.diloco, config.comm
    if comm.backend == "hivemind":
        return SyncSettings(diloco.overlap, hivemind_codec(comm.hivemind.compression, diloco.compression), 1,
                            "hivemind")
    return SyncSettings(diloco.overlap, diloco.compression,
                        min(diloco.fragments, parameter_tensor_count(config.model.dims())))


def build_data(config: RunConfig, topology: Topology) -> tuple[list, object]:
    """(eval batches, this node's training shard): see runtime/data_sources.py. Shards follow the
    config's nodes (a node keeps its data when others are absent)."""
    return node_data(config, topology.node_index, len(config.nodes))


def start_gpu_sampler(config: RunConfig, topology: Topology, device: torch.device) -> Optional[GpuSampler]:
    """The node leader samples its node's GPUs through NVML; None on CPU or when NVML fails."""
    if not topology.is_leader or device.type != "cuda" or config.run.gpu_sample_interval_s == 0:
        return None
    if os.environ.get(PINNED_ENV):
        print(f"[geodiloco] node {topology.node_name}: GPU sampling off: this node trains on MIG instances, and NVML "
              "reports power and utilization for the whole GPU, shared with other instances", file=sys.stderr)
        return None
    sampler = GpuSampler(interval_s=config.run.gpu_sample_interval_s,
                         device_indices=list(range(topology.local_world_size)))
    if not sampler.start():
        print(f"[geodiloco] node {topology.node_name}: GPU sampling off: {sampler.reason}", file=sys.stderr)
        return None
    return sampler


