"""One node's training process: ``python -m geodiloco.runtime.train --config run.yaml --node-name NAME``.

Started by torchrun at each site (or by ``geodiloco run`` on one machine). Each
outer round: take this round's plan, run the local phase (inner AdamW steps,
padded to the emulated GPU's step time), wait for the peers (readiness
exchange), take the outer step through the sync backend, then log and checkpoint.

The loop talks to the outer sync only through ``runtime.sync.OuterSync``: the
torch backend (one torch.distributed world, optional overlap and compression) or
the hivemind backend (no world across nodes; nodes join, fall behind and rejoin).
"""
from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shutil
from collections import Counter
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

import torch

from geodiloco.balancer.plan import Plan, RoundMeasurement
from geodiloco.balancer.records import IdleRecord
from geodiloco.common.schema import ConfigError
from geodiloco.runtime.auth import AuthError, require_secret
from geodiloco.runtime.comm import node_name_from_env
from geodiloco.runtime.config import RunConfig, load_config
from geodiloco.runtime.config_agreement import OtherSitesLeave
from geodiloco.runtime.preflight import preflight, quiet_gpu_notices
from geodiloco.runtime.heartbeat import PEER_FAILED_EXIT_CODE
from geodiloco.runtime.host_threads import warn_if_oversubscribed
from geodiloco.runtime.data_record import data_record, first_to_tell, record_key, resume_notice, write_record
from geodiloco.runtime.run_files import save_run_files
from geodiloco.runtime.run_dir import resume_changes
from geodiloco.runtime.recovery import elastic_job, log_membership_event, restarts_left, trained_in_job
from geodiloco.runtime.idle import RoundClock
from geodiloco.runtime import checkpoint
from geodiloco.runtime.checkpoint import latest_round
from geodiloco.runtime.checkpoint_writer import CheckpointWriteError
from geodiloco.runtime.agent import AGENT_PID_ENV, stop_own_agent
from geodiloco.runtime.fatal import record_fatal
from geodiloco.runtime.finite_guard import NonFiniteModel, check_some_node_finite, non_finite_nodes
from geodiloco.runtime.evaluation import final_model_regression
from geodiloco.runtime.metrics_sinks import build_sinks
from geodiloco.runtime.mig_devices import cuda_device_index, pin_mig_instance
from geodiloco.runtime.progress import progress_text
from geodiloco.runtime.runlog import RunLog
from geodiloco.runtime.sync import CannotStart, OutOfSync, RoundSync, SyncOutcome, TooFewToGoOn, join_world
from geodiloco.runtime.trainer import LocalResult, NodeTrainer
from geodiloco.runtime.stop_notice import post_stop_notice, watch_for_stop_notices

FORCED_EXIT_GRACE_S = 5.0


class StopRequested(BaseException):
    """SIGTERM or SIGINT arrived: stop at once; the last complete checkpoint stays. A BaseException, like
    KeyboardInterrupt: raised by the signal handler wherever the main thread is, it must not be taken for the
    failure of whatever ran there (a metrics writer caught it as its own error and turned itself off)."""


def install_stop_handlers() -> None:
    """Turn SIGTERM/SIGINT into StopRequested; force the exit if the process cannot act on it.

    A Python handler only runs when the main thread is back in the interpreter; blocked in a
    collective with a peer that froze, it would wait out ``comm.timeout_s`` (and torchrun's
    agent, restarting the workers without that peer, its own stop timeout). A thread woken by
    the signal itself (``signal.set_wakeup_fd``) ends the process after a short grace instead."""

    def handle(signum, _frame):
        raise StopRequested(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def force_exit_after_grace() -> None:
        signum = os.read(read_fd, 1)[0]
        time.sleep(FORCED_EXIT_GRACE_S)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(128 + signum)

    threading.Thread(target=force_exit_after_grace, name="geodiloco-stop", daemon=True).start()
    os.register_at_fork(after_in_child=restore_default_stop_signals)


def restore_default_stop_signals() -> None:
    """In a forked child (hivemind's DHT and averager processes): SIGTERM and SIGINT end it again. It inherited
    the handler above, whose StopRequested the child's event loop swallowed, so a SIGTERM to a node's process
    group left it running."""
    with contextlib.suppress(ValueError):  # not the child's main thread: nothing to undo there
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)


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
    sync_s: Optional[float] = None
    saved_round: Optional[int] = None
    finite: bool = True
    """Whether this node's parameters (so its pseudo-gradient) are finite; see runtime/finite_guard.py."""
    elapsed_s: float = 0.0
    """Seconds since training started on this node (``run.max_wall_s``)."""


RESUME_HINT = ("to continue, start every site with its command plus --resume (under torchrun with a new --run-id: "
               "a rendezvous that closed is not joined again)")


def resume_hint(run_dir: Path) -> str:
    """How to continue this run: the launcher's command when ``geodiloco run`` started this site, else each
    site's own (``RESUME_HINT``)."""
    from geodiloco.runtime.launcher_watch import launcher_resume_command
    command = launcher_resume_command(run_dir)
    return f"to continue: {command}" if command else RESUME_HINT


STORAGE_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def storage_failure(err: BaseException) -> bool:
    """Whether ``err`` is the disk's (a checkpoint write that failed, whatever the writer raised, or a full disk
    or quota anywhere else): a restart meets the same disk, so the site stops instead of being restarted."""
    return isinstance(err, CheckpointWriteError) or (isinstance(err, OSError) and err.errno in STORAGE_FULL_ERRNOS)


def storage_message(err: BaseException, run_dir: Path) -> str:
    """One line: what failed, the space left where the run writes, the checkpoint kept, and how to go on."""
    try:
        free = f"{shutil.disk_usage(run_dir).free / 2**20:,.0f} MiB free there now"
    except OSError:
        free = "its free space unknown"
    latest = latest_round(run_dir)
    what = (str(err) if isinstance(err, CheckpointWriteError)
            else f"writing {err.filename or run_dir}: {err.strerror}")
    if latest is None:
        return (f"stopping this site: {what} ({free}); no round was saved, so there is nothing to resume: free "
                "space or fix the path, then start the run again")
    return (f"stopping this site: {what} ({free}); the last complete checkpoint (after round {latest + 1}) stays in "
            f"{run_dir}; free space or fix the path, then {resume_hint(run_dir)}")


def resume_check(run_dir: Path, config: RunConfig) -> tuple[list[str], Optional[str]]:
    """``--resume`` against the config this run directory saved (``runtime/run_dir.py``): (the changed settings
    applied, as lines; why the resume is refused, or None). A site started by hand checks here what
    ``geodiloco run`` checks before it starts its nodes (there the saved config is the new one by now)."""
    try:
        return resume_changes(run_dir, config), None
    except ConfigError as err:
        return [], str(err)


def run_node(config: RunConfig, node_name: Optional[str], run_dir: Path, resume: bool,
             secret: Optional[bytes] = None) -> int:
    """Train this process's node for all rounds; returns an exit code."""
    install_stop_handlers()
    config_names = [node.name for node in config.nodes]
    node_name = node_name_from_env(node_name, config_names)
    use_cuda = torch.cuda.is_available() and os.environ.get("GEODILOCO_DEVICE", "auto") != "cpu"
    # a site whose worker stops before the world forms says so in the rendezvous store (runtime/stop_notice.py)
    watch = watch_for_stop_notices(node_name) if config.comm.backend == "torch" else None
    try:
        topology = join_world(config, node_name, use_cuda, secret)
        _joined_world.set()
        changes, refusal = resume_check(run_dir, config) if resume else ([], None)
        if config.comm.backend == "torch":
            from geodiloco.runtime.comm import SiteStart, agree_at_start
            from geodiloco.runtime.config_agreement import shared_view
            site = SiteStart(trained_in_job(run_dir, topology.node_name, elastic_job()), restarts_left(), refusal)
            for line in agree_at_start(topology, shared_view(config), list(config.node(node_name).gpus), site):
                if topology.is_leader:
                    print(f"[geodiloco] node {node_name}: {line}", file=sys.stderr, flush=True)
        elif refusal is not None:
            raise ConfigError(refusal)
    finally:
        if watch is not None:
            watch.stop()
    if topology.is_leader:
        for change in changes:
            print(f"[geodiloco] node {node_name}: resuming with a changed setting: {change}", flush=True)
    if config.run.deterministic:
        torch.use_deterministic_algorithms(True)
    device = torch.device(f"cuda:{cuda_device_index()}" if use_cuda else "cpu")
    if topology.is_leader:
        warn_if_oversubscribed(node_name, use_cuda, config.comm.outer_device == "cuda")
    trainer = NodeTrainer(config, topology, run_dir, device)
    try:
        return _train_rounds(trainer, resume)
    finally:
        write_error = trainer.checkpoint_writer.close()
        if write_error is not None:
            print(f"[geodiloco] node {topology.node_name}: {write_error}", file=sys.stderr, flush=True)
        if trainer.gpu_sampler is not None:
            trainer.gpu_sampler.stop()
        if trainer.cpu_share is not None:
            trainer.cpu_share.close()
        trainer.sync.close()


def _record_run_inputs(trainer: NodeTrainer, first_round: int) -> None:
    """A new run records its data's digests in the run directory, and keeps copies of a transformers model's
    config and of its tokenizer (``runtime/run_files.py``); a resumed one says when its data differs
    (``runtime/data_record.py``). One line per node leader, as for changed settings."""
    if not trainer.topology.is_leader:
        return  # the node's other ranks hold the same data: only its leader hashes it
    record = data_record(trainer.eval_set, getattr(trainer.shard, "corpus_array", None))
    if first_round == 0:
        write_record(trainer.run_dir, record)
        save_run_files(trainer.run_dir, trainer.config, trainer.model)
        return
    notice = resume_notice(trainer.run_dir, record)
    if notice is not None and first_to_tell(trainer.run_dir, f"data-{first_round}-{record_key(record)}"):
        print(f"[geodiloco] node {trainer.topology.node_name}: {notice}", file=sys.stderr, flush=True)


def _train_rounds(trainer: NodeTrainer, resume: bool) -> int:
    config, topology, sync = trainer.config, trainer.topology, trainer.sync
    start = sync.start(resume, trainer.sync_handles())
    run_id, pending_record = start.run_id, start.pending_record
    _record_run_inputs(trainer, start.first_round)
    if start.gpu_rows_by_node:
        trainer.adopt_founders_gpu_rows(start.gpu_rows_by_node)
    trainer.warm_up(config.diloco.batch_size)
    sync.exchange(None)
    log = RunLog(trainer.run_dir, build_sinks(config.logging, trainer.run_dir.name, trainer.run_dir,
                                              config.model_dump(mode="json"), start.first_round,
                                              topology.node_name)) if topology.is_coordinator else None
    shared_config_written = sync.logs_own_idle_only and (trainer.run_dir / "config.yaml").is_file()
    if log is not None and not shared_config_written:
        log.write_config(config.to_yaml())
        if start.first_round > 0 and not sync.barrier_free:  # async: the backend said where each node goes on
            print(f"[geodiloco] resuming {run_id} after round {start.first_round}", flush=True)
    if log is not None and start.first_round > 0:
        _redo_lost_global_row(trainer, log, run_id, start.first_round - 1)
    if log is not None and start.unlogged_reports:
        log.append("metrics.jsonl", _node_rows(run_id, start.unlogged_reports))
        log.append("idle.jsonl", [item["previous_record"] for item in start.unlogged_reports if item["previous_record"]])
    round_idx, lost_since = start.first_round, start.lost_since
    training_started = time.time()
    trainer.progress_origin = (training_started, start.first_round)
    last_round = ran_a_round = False
    while round_idx < config.diloco.rounds and not last_round:
        round_started = time.time()
        try:
            pending_record, last_round = _run_round(trainer, log, run_id, round_idx, pending_record, lost_since,
                                                    training_started)
            ran_a_round = True
        except StopRequested:
            if log is not None and sync.barrier_free:
                _log_unlogged_phases(trainer, log, run_id)
            if log is not None:
                log.close()  # TensorBoard and W&B keep the rounds logged so far (W&B buffers them until closed)
            raise
        except OutOfSync as behind:
            print(f"[geodiloco] node {topology.node_name}: {behind}; reloading the global state from peers",
                  flush=True)
            lost_since = round_started if lost_since is None else lost_since
            rejoined = sync.recover(behind)
            run_id, round_idx = rejoined.run_id, rejoined.first_round
            continue
        round_idx, lost_since = round_idx + 1, None
    finish_started = time.time()
    sync.finish(run_id, round_idx - 1)
    # a resumed run with no round left logs its saved record as it was: the time since is not this run's
    open_record = pending_record if ran_a_round else None
    if open_record:
        measured_until = open_record["round_end"]
        close_record(open_record, waited_from=finish_started, until=time.time())
    written_after_s = trainer.finish_checkpoint_write()
    if open_record:
        open_record["overhead_s"] += written_after_s
        open_record["round_end"] += written_after_s
        extend_gpu_values(open_record, trainer.gpu_sampler, measured_until)
    final = sync.exchange({"local_rank": topology.local_rank, "previous_record": pending_record,
                           "saved_round": trainer.saved_round, "record_open": ran_a_round,
                           "node": topology.node_name, "final_checksum": trainer.param_checksum()})
    exchanged_at = time.time()
    if not sync.barrier_free:
        trainer.commit_checkpoint(final)
    if trainer.pacer.slow_steps:
        print(f"[geodiloco] node {topology.node_name}: {trainer.pacer.slow_steps} steps were slower than the "
              "emulated GPU's target on this CPU; their real time was kept", file=sys.stderr, flush=True)
    if log is not None:
        last_records = _last_records(final, exchanged_at, topology.node_name, sync.barrier_free)
        if not ran_a_round:  # a resumed run with no round left: the rows its end logged stay as they were
            logged = log.logged_keys("idle.jsonl")
            last_records = [record for record in last_records if (record["round"], record["node"]) not in logged]
        log.append("idle.jsonl", last_records)
        if sync.barrier_free:
            _log_async_tail(trainer, log, run_id, round_idx - 1)
        last_evaluations = trainer.finished_evaluations(wait=True)
        log.append("metrics.jsonl", last_evaluations)
        for row in last_evaluations:
            print(f"[geodiloco] eval loss after round {row['round'] + 1}: {row['eval_loss']:.3f}", flush=True)
        regression = final_model_regression(log.rows("metrics.jsonl"))
        if regression:
            print(f"[geodiloco] warning: {regression}", file=sys.stderr, flush=True)
        log.close()
        if not sync.logs_own_idle_only:
            report_final_parameters(final)
        print(f"[geodiloco] run {run_id} finished: logs in {trainer.run_dir}", flush=True)
    sync.leave()
    return 0


def report_final_parameters(final: list[dict]) -> None:
    """One line proving the run ended on one model: the parameter checksum (sum of |parameters| in
    float64) every rank that reported at the end holds, or each rank's where they differ."""
    by_rank = [(item["node"], item["local_rank"], item["final_checksum"]) for item in final if "final_checksum" in item]
    if not by_rank:
        return
    first = by_rank[0][2]
    if all(abs(checksum - first) <= 1e-9 * max(abs(first), 1.0) for _, _, checksum in by_rank):
        ranks = Counter(node for node, _, _ in by_rank)
        holders = ", ".join(f"{node} ({count} ranks)" if count > 1 else node for node, count in ranks.items())
        print(f"[geodiloco] final parameter checksum {first!r} on every rank: {holders}", flush=True)
        return
    listed = ", ".join(f"{node} rank {rank} {checksum!r}" for node, rank, checksum in by_rank)
    print(f"[geodiloco] warning: the ranks ended on different parameters ({listed})", file=sys.stderr, flush=True)


def _last_records(final: list[dict], exchanged_at: float, node_name: str, barrier_free: bool) -> list[dict]:
    """The last idle records the final exchange brought, each still open one closed at ``exchanged_at``:
    every node's with a round barrier (they all left the exchange then); in async mode only this node's
    (the host waited there for the others' last items, which they sent and left)."""
    records = []
    for item in final:
        record = item["previous_record"] if item["local_rank"] == 0 else None
        if not record:
            continue
        if item.get("record_open") and (not barrier_free or record["node"] == node_name):
            close_record(record, waited_from=record["round_end"], until=exchanged_at)
        records.append(record)
    return records


def extend_gpu_values(record: dict, sampler, measured_until: float) -> None:
    """NVML figures of a record closed past ``measured_until`` (unix seconds): utilization, power and
    energy over its whole span again, and the energy of the added stretch (idle: the run's end) added
    to ``idle_energy_j``. Left as they are without a sampler or samples for the added stretch."""
    if sampler is None or record.get("energy_j") is None or record["round_end"] <= measured_until:
        return
    whole = sampler.summary(record["round_start"], record["round_end"])
    added_j = sampler.summary(measured_until, record["round_end"])["energy_j"]
    if whole["energy_j"] is None or added_j is None:
        return
    record.update(gpu_util=whole["gpu_util"], power_w=whole["power_w"], energy_j=whole["energy_j"])
    if record.get("idle_energy_j") is not None:
        record["idle_energy_j"] += added_j


def close_record(record: dict, waited_from: float, until: float) -> None:
    """Extend a node's last idle record to ``until`` (unix seconds), so the run's end is counted too.

    The run ends together: in ``finish`` (async: the others' last phases; hivemind: the final
    parameter check and the wait until every peer is done) and in the last exchange (a slower node's
    last checkpoint write), a node waits for its peers. From the record's end to ``waited_from`` is other
    overhead, from there to ``until`` waiting; the record's parts still add up to its span. The
    coordinator closes other nodes' records with its own clock, so their clocks' offset enters.
    """
    round_end = record["round_end"]
    record["overhead_s"] += max(0.0, min(waited_from, until) - round_end)
    record["wait_s"] += max(0.0, until - max(waited_from, round_end))
    record["round_end"] = max(round_end, until)


def wall_budget_spent(config: RunConfig, elapsed_s: float) -> bool:
    """Whether ``run.max_wall_s`` (seconds of training) has run out at an outer boundary."""
    return config.run.max_wall_s is not None and elapsed_s >= config.run.max_wall_s


def _run_round(trainer: NodeTrainer, log: Optional[RunLog], run_id: str, round_idx: int,
               pending_record: Optional[dict], lost_since: Optional[float] = None,
               training_started: Optional[float] = None) -> tuple[dict, bool]:
    """One outer round on this node; returns its idle record (logged with the next round) and
    whether it was this node's last (``diloco.rounds`` reached, or ``run.max_wall_s`` spent: the
    nodes decide that together from the readiness exchange; in async mode each node alone).
    ``lost_since``: unix time where discarded rounds before this one began (hivemind rejoin)."""
    config, topology, sync = trainer.config, trainer.topology, trainer.sync
    names = [node.name for node in config.nodes]
    clock = RoundClock()
    clock.mark("start")
    if lost_since is not None:
        clock.marks["lost_since"] = lost_since
    start_checksum = trainer.param_checksum()  # inside the round, so rounds tile the wall time
    present = sync.begin_round(round_idx)
    clock.members_wait_s = sync.members_wait_s
    plan = trainer.planner.plan(round_idx, present)
    node_plan = plan.node(topology.node_name)
    round_sync = RoundSync(round=round_idx, plan=plan, stats_by_node={}, weighting=trainer.weighting(plan),
                           last_round=round_idx + 1 == config.diloco.rounds)
    result = trainer.local_phase(round_idx, node_plan, time.perf_counter(), num_nodes=len(plan.nodes),
                                 round_sync=round_sync)
    clock.mark("local_done")
    clock.checkpoint_wait_s = trainer.finish_checkpoint_write()
    stats = RoundStats(node=topology.node_name, local_rank=topology.local_rank, round=round_idx,
                       steps=result.steps, batch_size=node_plan.batch_size, tokens=result.tokens,
                       loss=result.mean_loss, lr=result.lr, compute_s=clock.compute_s,
                       start_checksum=start_checksum,
                       step_times_s=result.step_times_s if topology.is_leader else [],
                       previous_record=pending_record if topology.is_leader else None,
                       sync_s=trainer.last_sync_s, saved_round=trainer.saved_round,
                       finite=trainer.local_model_finite(),
                       elapsed_s=time.time() - training_started if training_started is not None else 0.0)
    gathered = sync.exchange(asdict(stats))
    clock.mark("ready")
    if not sync.barrier_free:
        trainer.commit_checkpoint(gathered)
    leaders = {item["node"]: item for item in gathered if item["local_rank"] == 0}
    round_sync.stats_by_node = {name: leaders[name] for name in names if name in leaders}
    last_round = round_sync.last_round or wall_budget_spent(config, max(item["elapsed_s"] for item in gathered))
    round_sync.last_round = last_round
    if not sync.barrier_free:
        check_some_node_finite(round_sync.stats_by_node, round_idx)
    outcome = sync.outer_step(round_sync)
    trainer.after_outer_step(round_idx, non_finite_nodes(round_sync.stats_by_node))
    clock.mark("synced")
    clock.record_sync(outcome.sync_intervals, outcome.blocked_in_phase_s, outcome.waited_s)
    if outcome.sync_s is not None:
        trainer.last_sync_s = outcome.sync_s
    reported = outcome.reported_stats()
    for item in reported:
        measurement = RoundMeasurement(node=item["node"], round=round_idx, batch_size=item["batch_size"],
                                       local_steps=item["steps"], step_times_s=item["step_times_s"],
                                       compute_s=item["compute_s"], sync_s=item.get("sync_s"))
        trainer.measurements.append(measurement)
        trainer.planner.observe(measurement)
    sync.end_round(round_idx, run_id)
    if log is not None:
        trainer.sync_staleness = outcome.staleness
        _log_round(trainer, log, run_id, plan, reported, clock, last_round)
    if last_round and round_idx + 1 < config.diloco.rounds and config.run.max_wall_s is not None and topology.is_leader:
        print(f"[geodiloco] run.max_wall_s ({config.run.max_wall_s:g} s of training) is spent: the run ends after "
              f"round {round_idx + 1} of {config.diloco.rounds} (diloco.rounds)", flush=True)
    members = list(topology.present_names) if sync.barrier_free else list(outcome.stats_by_node)
    if (round_idx + 1) % config.checkpoint.every_rounds == 0 or last_round:
        clock.mark("end")
        trainer.save_checkpoint(round_idx, run_id, _idle_record(trainer, run_id, plan, result, clock, outcome),
                                members=members)
    clock.mark("end")
    return _idle_record(trainer, run_id, plan, result, clock, outcome), last_round


def _idle_record(trainer: NodeTrainer, run_id: str, plan: Plan, result: LocalResult, clock: RoundClock,
                 outcome: SyncOutcome) -> dict:
    node = trainer.node
    gpu_values = {}
    if trainer.gpu_sampler is not None:
        gpu_values = trainer.gpu_sampler.summary(clock.round_start, clock.marks["end"])
        gpu_values["idle_energy_j"] = trainer.gpu_sampler.idle_energy_j(
            clock.idle_windows(), (clock.marks["start"] + clock.members_wait_s, clock.marks["local_done"]),
            clock.blocked_in_phase_s)
    record = IdleRecord(
        run_id=run_id, round=plan.round, node=node.name, site=node.site, policy=plan.policy,
        local_steps=result.steps, batch_size=plan.node(node.name).batch_size, tokens=result.tokens,
        compute_s=clock.compute_s, wait_s=clock.wait_s, comm_s=clock.comm_s, comm_hidden_s=clock.comm_hidden_s,
        sync_bytes=outcome.sent_bytes, overhead_s=clock.overhead_s, lost_s=clock.lost_s,
        present_nodes=list(outcome.stats_by_node), round_start=clock.round_start,
        round_end=clock.marks["end"], staleness=outcome.staleness, mode=trainer.config.diloco.mode,
        gpus=list(node.gpus), num_gpus=node.num_gpus, source="runtime", **gpu_values)
    return asdict(record)


def _redo_lost_global_row(trainer: NodeTrainer, log: RunLog, run_id: str, round_idx: int) -> None:
    """Coordinator, resuming after ``round_idx``: a run stopped while that round's evaluation ran in the
    background logged no global row of it (the row goes out when the evaluation ends). The restored global
    model is that round's, so its row is logged now, evaluated again where the round was due one."""
    sync = trainer.sync
    if sync.barrier_free or sync.logs_own_idle_only:
        return
    rows = [row for row in log.rows("metrics.jsonl") if row.get("round") == round_idx]
    node_rows = [row for row in rows if row.get("node") != "global"]
    if not node_rows or len(node_rows) < len(rows):  # nothing of that round, or its global row is there
        return
    global_file = checkpoint.round_dir(trainer.run_dir, round_idx) / checkpoint.GLOBAL_FILE
    row = {"run_id": run_id, "round": round_idx, "node": "global", "eval_loss": None,
           "tokens": sum(item.get("tokens", 0) for item in node_rows),
           "wall_s": global_file.stat().st_mtime if global_file.is_file() else time.time()}
    every = trainer.config.data.eval_every_rounds
    due = every and ((round_idx + 1) % every == 0 or round_idx + 1 == trainer.config.diloco.rounds)
    if trainer.eval_set and due:
        print(f"[geodiloco] evaluating round {round_idx + 1} again: the run stopped before its evaluation was "
              "logged", flush=True)
        trainer.evaluate_in_background(row)
    else:
        log.append("metrics.jsonl", [row])


def _node_rows(run_id: str, reported: list[dict]) -> list[dict]:
    """metrics.jsonl rows of the node-phases in ``reported`` (each at its own round)."""
    return [{"run_id": run_id, "round": item["round"], "node": item["node"], "loss": item["loss"], "lr": item["lr"],
             "tokens": item["tokens"], "local_steps": item["steps"], "batch_size": item["batch_size"],
             "compute_s": item["compute_s"], "start_checksum": item["start_checksum"]} for item in reported]


def _log_round(trainer: NodeTrainer, log: RunLog, run_id: str, plan: Plan, reported: list[dict],
               clock: RoundClock, last_round: bool = False) -> None:
    """Coordinator: plan, per-node metrics, global eval loss, previous round's idle records, progress line.

    ``reported``: the node-phase statistics this round brought (sync: one per present node; async:
    this node's phase and every phase the others reported since its last pull).
    hivemind: every node's leader appends its own previous idle record; the round's first present
    node writes the rest."""
    config = trainer.config
    if trainer.sync.logs_own_idle_only:
        own = next((item.get("previous_record") for item in reported if item["node"] == trainer.node.name), None)
        log.append("idle.jsonl", [own] if own else [])
        if not trainer.sync.writes_round:
            return
        reported = [{**item, "previous_record": None} for item in reported]
    log.append("plan.jsonl", [plan.to_dict()])
    rows = _node_rows(run_id, reported)
    global_row = {"run_id": run_id, "round": plan.round, "node": "global", "eval_loss": None,
                  "tokens": sum(item["tokens"] for item in reported), "wall_s": clock.marks["synced"]}
    evaluated = trainer.finished_evaluations(wait=False)
    every = config.data.eval_every_rounds
    if trainer.eval_set and every and ((plan.round + 1) % every == 0 or last_round):
        trainer.evaluate_in_background(global_row)
    else:
        evaluated.append(global_row)
    log.append("metrics.jsonl", rows + evaluated)
    log.append("idle.jsonl", [item["previous_record"] for item in reported if item["previous_record"]])
    latest = {item["node"]: item for item in reported}
    steps = " ".join(f"{name}:{item['steps']}x{item['batch_size']}" for name, item in latest.items())
    name = trainer.topology.node_name
    if trainer.sync.barrier_free and name in latest:  # the others' phases here belong to other rounds
        loss_text = f"phase {plan.round + 1}/{config.diloco.rounds} loss {latest[name]['loss']:.3f} ({name})"
    else:
        loss_text = (f"round {plan.round + 1}/{config.diloco.rounds} loss "
                     f"{sum(item['loss'] for item in reported) / len(reported):.3f}")
    eval_text = "".join(f" eval@{row['round'] + 1} {row['eval_loss']:.3f}" for row in evaluated
                        if row["eval_loss"] is not None)
    stale = f" | staleness {trainer.sync_staleness}" if trainer.sync_staleness is not None else ""
    print(f"[geodiloco] {loss_text}{eval_text} | "
          f"{trainer.topology.node_name} local {clock.compute_s:.2f}s wait {clock.wait_s:.2f}s sync {clock.comm_s:.2f}s"
          f"{f' (+{clock.comm_hidden_s:.2f}s hidden)' if clock.comm_hidden_s > 0 else ''} | "
          f"steps x batch {steps}{stale}{progress_text(trainer, plan.round, time.time())}", flush=True)


def _log_unlogged_phases(trainer: NodeTrainer, log: RunLog, run_id: str) -> list[dict]:
    """Async host: log the phases other nodes pushed since its own last pull; returns them. At the run's end
    (their last phases), and when the host is stopped mid-run: those phases would be logged at its next pull,
    which will not come, and a resume keeps the rows of the rounds it resumes after (it drops the newer ones)."""
    tail = trainer.sync.drain_reports()
    log.append("metrics.jsonl", _node_rows(run_id, tail))
    log.append("idle.jsonl", [item["previous_record"] for item in tail if item["previous_record"]])
    return tail


def _log_async_tail(trainer: NodeTrainer, log: RunLog, run_id: str, last_round: int) -> None:
    """Async host, after every node finished: the phases the others reported after the host's own
    last pull, and one evaluation of the final global model (every node holds it now)."""
    tokens = sum(item["tokens"] for item in _log_unlogged_phases(trainer, log, run_id))
    final_row = {"run_id": run_id, "round": last_round, "node": "global", "eval_loss": None,
                 "tokens": tokens, "wall_s": time.time(), "final": True}
    if trainer.eval_set:
        log.append("metrics.jsonl", trainer.finished_evaluations(wait=True))
        trainer.evaluate_in_background(final_row)
    else:
        log.append("metrics.jsonl", [final_row])


def default_run_dir(config: RunConfig) -> Path:
    return Path(config.run.out_dir) / config.run.name


MODULE_PROG = "python -m geodiloco.runtime.train"


def build_arg_parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
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
    parser.add_argument("--secret-file", help="file holding the run's shared secret (default: GEODILOCO_SECRET_FILE, "
                                              "else GEODILOCO_SECRET); every site uses the same one (docs/security.md)")


def train_from_args(args: argparse.Namespace) -> int:
    quiet_gpu_notices()
    instance = pin_mig_instance()
    if instance:
        print(f"[geodiloco] local rank {os.environ.get('LOCAL_RANK', '0')} trains on MIG instance {instance}", flush=True)
    config = load_config(args.config, args.overrides)
    preflight(config, data=False)
    run_dir = Path(args.run_dir) if args.run_dir else default_run_dir(config)
    try:
        secret = require_secret(args.secret_file, len(config.nodes))
    except AuthError as err:
        from geodiloco.common.schema import ConfigError
        raise ConfigError(str(err)) from None
    try:
        return run_node(config, args.node, run_dir, args.resume, secret)
    except NonFiniteModel as err:
        latest = latest_round(run_dir)
        kept = f"the last good checkpoint (after round {latest + 1}) stays in {run_dir}" if latest is not None else \
            "no round was saved"
        print(f"[geodiloco] stopping: {err}; {kept}", file=sys.stderr, flush=True)
        return 1
    except AuthError as err:
        print(f"[geodiloco] cannot join the run: {err}", file=sys.stderr, flush=True)
        return 1
    except CannotStart as err:
        print(f"[geodiloco] cannot start: {err}", file=sys.stderr, flush=True)
        record_fatal(str(err))
        stop_own_agent()  # a restart would meet the same run directories
        return 1
    except TooFewToGoOn as err:
        latest = latest_round(run_dir)
        kept = (f"the last complete checkpoint (after round {latest + 1}) stays in {run_dir}; restart the sites, "
                "then every site with --resume" if latest is not None else "no round was saved")
        print(f"[geodiloco] stopping: {err}; {kept}, or lower comm.min_nodes", file=sys.stderr, flush=True)
        record_fatal(str(err))
        return 1
    except OtherSitesLeave as leaving:
        node = os.environ.get("GEODILOCO_NODE", args.node)
        log_membership_event(run_dir, "peer_failed", node=node, how="config", error=str(leaving))
        print(f"[geodiloco] node {node}: {leaving}; restarting this worker to form the world again",
              file=sys.stderr, flush=True)
        return PEER_FAILED_EXIT_CODE
    except StopRequested as stop:
        why = " (its elastic agent re-forms the world when a site joins or leaves, or the site is stopping)" \
            if restarts_left() else ""
        print(f"[geodiloco] node stopped by {stop}{why}; the last complete checkpoint is kept in {run_dir}",
              file=sys.stderr, flush=True)
        return 143
    except (RuntimeError, OSError) as err:  # OSError takes ConnectionError in
        if storage_failure(err):
            message = storage_message(err, run_dir)
            print(f"[geodiloco] {message}", file=sys.stderr, flush=True)
            record_fatal(message)
            stop_own_agent()  # a restart meets the same disk
            return 1
        if not lost_a_peer(err):
            raise
        reason = str(err).splitlines()[0].split(". ")[0][-160:]
        log_membership_event(run_dir, "peer_failed", node=os.environ.get("GEODILOCO_NODE", args.node), how="connection",
                             error=reason)
        why = ("it failed, or is re-forming the world with a site that joined or left; stopping this worker so the "
               "present sites restart from the last complete round" if restarts_left() else
               "it failed or was stopped; with no restart left (fixed membership, or --max-restarts used up) this "
               f"site stops here, its last complete checkpoint kept in {run_dir}; {resume_hint(run_dir)}")
        print(f"[geodiloco] lost a peer site ({reason}): {why}", file=sys.stderr, flush=True)
        return PEER_FAILED_EXIT_CODE


def lost_a_peer(err: BaseException) -> bool:
    """Whether a collective failed because a peer's connection went away (not a bug of ours)."""
    import torch.distributed as dist
    text = str(err)
    return isinstance(err, (dist.DistError, ConnectionError)) or any(
        marker in text for marker in ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                                      "Socket Timeout", "connection refused"))


def main(argv: Optional[list[str]] = None, prog: str = MODULE_PROG) -> int:
    """``prog``: how the user started it, for usage and errors (``geodiloco train`` or the module)."""
    from geodiloco.common.console import prefix_notices
    from geodiloco.common.schema import ConfigError
    prefix_notices()
    args = build_arg_parser(prog).parse_args(argv)
    from geodiloco.runtime.launcher_watch import exit_with_launcher, exit_with_parent
    exit_with_launcher()
    exit_with_parent(AGENT_PID_ENV)  # a worker of a site's agent: stopped with it, even one killed with SIGKILL
    try:
        return train_from_args(args)
    except ConfigError as err:
        print(f"{'geodiloco.runtime.train' if prog == MODULE_PROG else prog}: error: {err}", file=sys.stderr, flush=True)
        node = os.environ.get("GEODILOCO_NODE") or args.node
        message = f"node {node}: {err}" if node else str(err)
        record_fatal(message)
        if not _joined_world.is_set():  # once it has formed, the peers meet this worker's exit in their collectives
            post_stop_notice(message)
        stop_own_agent()
        return 2


_joined_world = threading.Event()
"""Set once this process joined its world (a later error, even after the group is destroyed, is not
one from before the world formed)."""


def exit_process(exit_code: int) -> None:
    """Leave without interpreter teardown, once logs are flushed and the process group is gone.

    At interpreter finalization gloo's C++ threads can still touch Python objects and
    abort the process ("terminate called without an active exception") after a run that
    finished; every result is already on disk by then, so nothing is lost by skipping it.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


if __name__ == "__main__":
    exit_process(main())
