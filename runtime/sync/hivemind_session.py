"""How a node starts, joins and resynchronizes under the hivemind backend.

There is no torch.distributed world across nodes: nodes that find peers training
join them with the peers' global state, the first nodes found the run together
(or resume it from their checkpoints), and a node whose parameters drifted from
the peers' reloads the global state from one of them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from geodiloco.common.schema import ConfigError
from geodiloco.runtime import checkpoint
from geodiloco.runtime.config_agreement import check_all_same
from geodiloco.runtime.runlog import RunLog
from geodiloco.runtime.sync.protocol import CannotStart, StartPoint, TooFewNodes

if TYPE_CHECKING:
    from geodiloco.runtime.sync.hivemind_backend import HivemindOuterSync


def start_hivemind(sync: "HivemindOuterSync", resume: bool) -> StartPoint:
    """Join peers already training, or found the run with the nodes starting now (lowest index wins)."""
    handles, topology = sync.handles, sync.topology
    run_dir = handles.run_dir
    decision = None
    if topology.is_leader:
        # every verified round when resuming (the founders agree on one they all hold), else the newest only
        resumable = checkpoint.verified_rounds(run_dir, topology.node_name, stop_at_first=not resume)
        saved_round = resumable[0] if resumable else None
        if sync.running_round() is not None:
            decision = {"join": True}
        elif saved_round is not None and not resume:
            decision = {"error": f"{run_dir} already holds a checkpoint (after round {saved_round + 1}) and no peer "
                                 "is training; pass --resume to continue it, or choose another --run-dir"}
        else:
            proposal = {"run_id": handles.new_run_id(), "resume_round": saved_round if resume else None,
                        "resumable_rounds": resumable if resume else [], "node": topology.node_name,
                        "gpu_rows": handles.gpu_rows, "config_view": handles.config_view}
            try:
                agreed = sync.found(proposal, sync.options.start_wait_s)
            except TooFewNodes as too_few:
                agreed, decision = None, {"error": str(too_few)}
            else:
                decision = {"join": True} if agreed is None else {**agreed, "founders_gpu_rows": sync.founders_gpu_rows}
            if agreed is not None:
                try:  # every founder stops when any two differ, as a torch world does
                    check_all_same(sync.founders_config_views)
                    if agreed["resume_round"] is not None:
                        decision["resume_round"] = common_resume_round(sync.founders_resumable_rounds)
                except ConfigError as err:
                    decision = {"config_error": str(err)}
                except CannotStart as err:
                    decision = {"error": str(err)}
    decision = sync.share_in_node(decision)
    if "config_error" in decision:
        raise ConfigError(decision["config_error"])
    if "error" in decision:
        raise CannotStart(decision["error"])
    if topology.is_leader:
        checkpoint.note_node_uses_dir(run_dir, topology.node_name)
    if decision.get("join"):
        return join_from_peers(sync, first_join=True)
    run_id, first_round, pending = decision["run_id"], 0, None
    if decision["resume_round"] is not None:
        run_id, pending = handles.load_checkpoint(decision["resume_round"])
        first_round = decision["resume_round"] + 1
        if topology.is_leader:
            print(f"[geodiloco] node {topology.node_name}: resuming {run_id} after round {first_round} from "
                  f"{run_dir}", flush=True)
        if topology.is_leader:
            # every site's own directory: rounds after the resume point are redone, and a stale newer round
            # left there would later be taken for the redone one (its global file is not written again)
            checkpoint.drop_rounds_after(run_dir, decision["resume_round"])
            checkpoint.point_latest(run_dir, decision["resume_round"])
        if topology.is_leader and decision["node"] == topology.node_name:
            log = RunLog(run_dir)
            log.drop_rounds_from("idle.jsonl", first_round)
            log.drop_rounds_from("metrics.jsonl", first_round)
            log.drop_rounds_from("plan.jsonl", first_round)
        if topology.is_leader and (first_round - 1, topology.node_name) in RunLog(run_dir).logged_keys("idle.jsonl"):
            pending = None  # the row the run logged for that round (at the next round or its end) stays
    sync.set_round(first_round, joined=first_round)
    if handles.outer is not None:
        sync.publish_state(*handles.export_state(first_round - 1, run_id))
    return StartPoint(run_id, first_round, pending,
                      gpu_rows_by_node=[tuple(item) for item in decision.get("founders_gpu_rows") or []] or None)


def common_resume_round(resumable_by_founder: list[tuple[str, list[int]]]) -> int:
    """The newest round that every founder holding a checkpoint can resume from: with a run directory
    per site each founder has its own saved rounds, and the newest of one site may be missing (pruned,
    or withheld as a partial average) at another. ``resumable_by_founder``: (node, its verified rounds);
    founders with none are left out (they cannot resume at all and say so when they load)."""
    holders = [(name, set(rounds)) for name, rounds in resumable_by_founder if rounds]
    if not holders:
        raise CannotStart("--resume: no starting node holds a committed checkpoint in its run directory")
    common = set.intersection(*(rounds for _, rounds in holders))
    if not common:
        held = "; ".join(f"{name}: rounds {', '.join(str(round_idx + 1) for round_idx in sorted(rounds))}"
                         for name, rounds in holders)
        raise CannotStart(f"--resume: the starting nodes hold no checkpoint of the same round ({held}); "
                          "resume the sites whose rounds overlap, or start from a fresh --run-dir")
    return max(common)


def join_from_peers(sync: "HivemindOuterSync", first_join: bool = False) -> StartPoint:
    """Load the peers' global state; returns (run id, the round this node joins).

    A node that falls behind takes the latest state and the next round: its peers still count
    it as a member and expect it. A node joining for the first time announces the round after
    the one its peers work on and waits for their state after that round, so every peer knows
    of it before that round starts and none averages without it by a stale view.
    """
    handles, topology = sync.handles, sync.topology
    info = _take_peers_state(sync, first_join) if topology.is_leader else None
    info = sync.share_in_node(info)
    if "cannot_start" in info:
        raise CannotStart(info["cannot_start"])
    if "error" in info:
        raise RuntimeError(info["error"])
    if not topology.is_leader:
        handles.import_state(info, [])
    sync.broadcast_in_node([param.data for param in handles.params])
    next_round = info["round"] + 1
    sync.set_round(next_round, joined=next_round)
    print(f"[geodiloco] node {topology.node_name} joined run {info['run_id']} at round {next_round + 1} "
          "with its peers' global state", flush=True)
    return StartPoint(info["run_id"], next_round)


def _take_peers_state(sync: "HivemindOuterSync", first_join: bool) -> dict:
    """Leader: the peers' state taken into this node (its metadata), or why not (``cannot_start``: the run is in
    its last round; ``error``: no peer shared its state in time)."""
    try:
        after_round = sync.announce_join() if first_join else -1
    except CannotStart as ending:
        return {"cannot_start": str(ending)}
    loaded = sync.download_state(sync.init_timeout_s, min_round=after_round)
    if loaded is None:
        return {"error": f"node {sync.topology.node_name}: peers are training but none shared its state within "
                         f"comm.init_timeout_s ({sync.init_timeout_s:g} s)"}
    metadata, tensors = loaded
    sync.handles.import_state(metadata, tensors)
    return metadata


def reload_global_state(sync: "HivemindOuterSync", round_idx: int, checksum: Optional[float] = None) -> bool:
    """This node's parameters drifted from the majority's (a partial all-reduce, codec rounding):
    take a peer's global state after ``round_idx`` instead of its own (given ``checksum``, only a state
    whose parameters agree with it: the majority's, not another drifted node's). Returns False when the
    leader found no peer to take it from and kept its own (the other ranks follow their leader: True)."""
    handles, topology = sync.handles, sync.topology
    print(f"[geodiloco] node {topology.node_name}: parameters differ from the peers' at round {round_idx + 1}; "
          "reloading the global state from a peer", flush=True)
    reloaded = True
    if topology.is_leader:
        sync.share_state(False)
        loaded = sync.download_state(sync.init_timeout_s, min_round=round_idx, checksum=checksum)
        sync.share_state(True)
        reloaded = loaded is not None
        if loaded is None:
            print(f"[geodiloco] node {topology.node_name}: no peer shared its state; keeping this node's",
                  flush=True)
        else:
            handles.import_state(*loaded)
    sync.broadcast_in_node([param.data for param in handles.params])
    return reloaded


def finish_hivemind(sync: "HivemindOuterSync", run_id: str, last_round: int) -> None:
    """Leave together: the nodes compare their final parameters, one that differs from the
    majority's (an incomplete last all-reduce) reloads the global state from a peer, and every
    node waits until the others are done."""
    handles, topology = sync.handles, sync.topology
    differs = sync.final_parameters_differ(run_id, handles.checksum()) if topology.is_leader else None
    if sync.share_in_node(differs):
        reloaded = reload_global_state(sync, last_round, checksum=sync.majority_checksum)
        if reloaded and sync.writes_round and topology.is_leader and handles.save_final_global is not None:
            # the round's global file was written from this node's drifted parameters: the majority's replace it
            handles.save_final_global(last_round, run_id, sync.last_round_members())
    checksum = handles.checksum()
    if topology.is_leader:
        sync.wait_for_peers_to_finish(run_id)
        print(f"[geodiloco] node {topology.node_name}: final parameter checksum {checksum!r}", flush=True)
