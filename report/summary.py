"""Where GPU time went in one run: per node and in total, optionally per round.

Units: seconds for times, GPU-seconds = seconds x the node's GPU count,
GPU-hours per 1,000 rounds = GPU-seconds / rounds x 1000 / 3600, USD from a
price table in USD per GPU-hour. "Idle" = wait_s + comm_s + overhead_s, with comm_s the
exposed sync; sync hidden behind compute (comm_hidden_s) is shown beside it, not counted.
"Compute utilization" = compute_s over node time.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Optional

from geodiloco.report.energy import NOT_AVAILABLE, EnergyTotals, energy_totals
from geodiloco.report.errors import ReportError
from geodiloco.report.pricing import PriceTable, gpu_key
from geodiloco.report.records import NodeRound
from geodiloco.report.run_dir import RunLogs, expand_gpu_names

SECONDS_PER_HOUR = 3600.0
ROUNDS_PER_KILO = 1000.0


@dataclass
class NodeSummary:
    """One node's (or the whole run's, ``node == "total"``) time over the reported rounds."""

    node: str
    site: str
    gpus: list[str]
    num_gpus: int
    rounds: int
    compute_s: float
    wait_s: float
    comm_s: float
    overhead_s: float
    idle_s: float
    wall_s: float
    tokens: int
    idle_share: float
    idle_gpu_s: float
    wall_gpu_s: float
    idle_gpu_h_per_1k_rounds: float
    predicted_idle_s: Optional[float] = None
    usd_per_hour: Optional[float] = None
    idle_cost_usd: Optional[float] = None
    idle_cost_usd_per_1k_rounds: Optional[float] = None
    energy: EnergyTotals = field(default_factory=EnergyTotals)
    comm_hidden_s: float = 0.0
    sync_bytes: int = 0
    lost_s: float = 0.0
    """Part of ``overhead_s``: work thrown away and restarts after a site failed or rejoined (node-seconds)."""
    lost_gpu_s: float = 0.0
    """``lost_s`` in GPU-seconds (each node's times its GPUs), the unit of ``idle_gpu_s``."""
    compute_utilization: float = 0.0
    """Compute over node time (GPU-weighted in the total): 1 - idle share."""
    wait_gpu_s: float = 0.0
    comm_gpu_s: float = 0.0
    overhead_gpu_s: float = 0.0
    """``wait_s``, ``comm_s`` and ``overhead_s`` in GPU-seconds: the parts of ``idle_gpu_s``."""


@dataclass
class NodeRoundView:
    """One node's line of the per-round view."""

    idle_s: float
    local_steps: int
    batch_size: int
    predicted_idle_s: Optional[float] = None


@dataclass
class RoundSummary:
    """One outer round across nodes: its span and GPU-seconds wasted."""

    round: int
    wall_s: float
    idle_gpu_s: float
    nodes: dict[str, NodeRoundView]
    predicted_idle_s: Optional[float] = None


@dataclass
class RunSummary:
    """The report of one run directory."""

    label: str
    run_dir: str
    run_id: str
    policy: str
    sources: list[str]
    rounds_in_log: int
    rounds: list[int]
    skipped_rounds: list[int]
    nodes: list[NodeSummary]
    total: NodeSummary
    per_round: list[RoundSummary]
    run_wall_s: float
    """Seconds some node was in a round: from the first round's start to the last round's end, less
    ``stopped_s``."""
    tokens: int
    tokens_per_hour: Optional[float]
    energy_note: str
    final_loss: Optional[float] = None
    final_eval_loss: Optional[float] = None
    warnings: list[str] = field(default_factory=list)
    records: list[NodeRound] = field(default_factory=list, repr=False)
    membership: list[str] = field(default_factory=list)
    """Who left or rejoined the run after which round (``membership.jsonl``), one line per change."""
    prices_used: list[tuple[str, float, str]] = field(default_factory=list)
    """(GPU name or "node NODE", USD per GPU-hour, where the price came from) of every price the costs used."""
    stopped_s: float = 0.0
    """Seconds between the run's sessions when no node was in a round (a stop, then ``--resume``): the
    run was not running, so they count neither as run time nor as idle GPU time."""
    running_launcher: Optional[int] = None
    """The pid of the ``geodiloco run`` still training this run (its figures are so far), else None."""

    @property
    def energy_available(self) -> bool:
        return self.total.energy.available

    @property
    def has_prices(self) -> bool:
        return self.total.idle_cost_usd is not None


def select_rounds(records: list[NodeRound], skip_rounds: int) -> tuple[list[int], list[int]]:
    """Split the logged rounds into (kept, skipped): the first ``skip_rounds`` are warm-up."""
    if skip_rounds < 0:
        raise ReportError(f"--skip-rounds must be >= 0, got {skip_rounds}")
    logged = sorted({record.round for record in records})
    if skip_rounds >= len(logged):
        raise ReportError(f"--skip-rounds {skip_rounds} leaves no round to report: the run logged "
                          f"{len(logged)} round(s); use a smaller number")
    return logged[skip_rounds:], logged[:skip_rounds]


def node_order(logs: RunLogs) -> list[str]:
    """Nodes in config order, then any others by name."""
    logged = {record.node for record in logs.records}
    ordered = [name for name in logs.config_gpus() if name in logged]
    return ordered + sorted(logged - set(ordered))


def node_gpu_names(logs: RunLogs, node: str) -> list[str]:
    """The node's GPU names from its log records, else from ``config.yaml``."""
    for record in logs.records:
        if record.node == node and record.gpus:
            return expand_gpu_names(record.gpus)
    return logs.config_gpus().get(node, [])


def run_gpu_names(logs: RunLogs) -> set[str]:
    return {gpu for node in node_order(logs) for gpu in node_gpu_names(logs, node)}


def node_usd_per_hour(node: str, gpu_names: list[str], num_gpus: int, prices: PriceTable) -> float:
    """The node's price per hour: its own ``node:`` price per GPU, else each named GPU's price; a count unlike
    the names scales the mean."""
    node_price = prices.node_price(node)
    if node_price is not None:
        return node_price * num_gpus
    if not gpu_names:
        raise ReportError(f"cannot price node {node!r}: its GPUs are not named in idle.jsonl (gpus) "
                          f"or config.yaml (nodes[].gpus); price it by node: --price \"node:{node}=USD_PER_GPU_HOUR\"")
    per_gpu = []
    for name in gpu_names:
        price = prices.price(name)
        if price is None:
            close = prices.close_names(name)
            near = (f"; the prices have {' and '.join(repr(other) for other in close)}: if that is this GPU, write "
                    f"its name as the run does ({name!r})") if close else ""
            raise ReportError(f"no price for GPU {name!r} of node {node!r}; add --price \"{name}=USD_PER_GPU_HOUR\""
                              f"{near}")
        per_gpu.append(price)
    if len(per_gpu) == num_gpus:
        return sum(per_gpu)
    return sum(per_gpu) / len(per_gpu) * num_gpus


def _planned_idle(logs: RunLogs, rounds: set[int]) -> dict[tuple[int, str], float]:
    """The plans' predicted idle per (round, node); none for an asynchronous run, whose plans predict
    the wait at a round barrier it does not have."""
    planned: dict[tuple[int, str], float] = {}
    if any(record.mode == "async" for record in logs.records):
        return planned
    for plan in logs.plans:
        if plan.round not in rounds:
            continue
        for node_plan in plan.nodes:
            if node_plan.predicted_idle_s is not None:
                planned[(plan.round, node_plan.name)] = node_plan.predicted_idle_s
    return planned


def summarize_node(node: str, site: str, gpus: list[str], records: list[NodeRound],
                   planned: dict[tuple[int, str], float], prices: Optional[PriceTable]) -> NodeSummary:
    """Sum one node's records; GPU-seconds use each record's GPU count."""
    num_gpus = max(record.gpu_count for record in records)
    idle_s = sum(record.idle_s for record in records)
    wall_s = sum(record.wall_s for record in records)
    idle_gpu_s = sum(record.idle_s * record.gpu_count for record in records)
    predictions = [planned[(record.round, node)] for record in records if (record.round, node) in planned]
    summary = NodeSummary(
        node=node, site=site, gpus=gpus, num_gpus=num_gpus, rounds=len(records),
        compute_s=sum(record.compute_s for record in records),
        wait_s=sum(record.wait_s for record in records),
        comm_s=sum(record.comm_s for record in records),
        overhead_s=sum(record.overhead_s for record in records),
        idle_s=idle_s, wall_s=wall_s, tokens=sum(record.tokens for record in records),
        idle_share=idle_s / wall_s if wall_s > 0 else 0.0,
        comm_hidden_s=sum(record.comm_hidden_s for record in records),
        sync_bytes=sum(record.sync_bytes for record in records),
        lost_s=sum(record.lost_s for record in records),
        lost_gpu_s=sum(record.lost_s * record.gpu_count for record in records),
        compute_utilization=sum(record.compute_s for record in records) / wall_s if wall_s > 0 else 0.0,
        wait_gpu_s=sum(record.wait_s * record.gpu_count for record in records),
        comm_gpu_s=sum(record.comm_s * record.gpu_count for record in records),
        overhead_gpu_s=sum(record.overhead_s * record.gpu_count for record in records),
        idle_gpu_s=idle_gpu_s,
        wall_gpu_s=sum(record.wall_s * record.gpu_count for record in records),
        idle_gpu_h_per_1k_rounds=idle_gpu_s / len(records) * ROUNDS_PER_KILO / SECONDS_PER_HOUR,
        predicted_idle_s=sum(predictions) if predictions else None,
        energy=energy_totals(records),
    )
    if prices:
        summary.usd_per_hour = node_usd_per_hour(node, gpus, num_gpus, prices)
        summary.idle_cost_usd = sum(record.idle_s * summary.usd_per_hour / num_gpus * record.gpu_count
                                    for record in records) / SECONDS_PER_HOUR
        summary.idle_cost_usd_per_1k_rounds = summary.idle_cost_usd / len(records) * ROUNDS_PER_KILO
    return summary


def prices_used(nodes: list[NodeSummary], prices: Optional[PriceTable]) -> list[tuple[str, float, str]]:
    """The prices the nodes' costs came from: a node's own price, else its GPUs'."""
    if not prices:
        return []
    by_node = [(f"node {node.node}", prices.node_price(node.node), prices.node_sources[node.node])
               for node in nodes if prices.node_price(node.node) is not None]
    gpu_keys = {gpu_key(gpu) for node in nodes if prices.node_price(node.node) is None for gpu in node.gpus}
    return prices.applied(gpu_keys) + by_node


def membership_changes(events: list[dict]) -> list[str]:
    """Lines naming the nodes a world went on without or with again (``resumed`` events: its members before and
    now), the nodes left out of an average for a non-finite model, and ``--drill`` events (the round they fired
    in, and the one asked for where it differs, both counted as the logs count, from 0). ``peer_failed`` events name the node that
    noticed, not the one that failed, so they are not used."""
    lines = []
    for event in events:
        if event.get("event") == "resumed":
            before, present = list(event.get("members_before") or []), list(event.get("present") or [])
            left = [name for name in before if name not in present]
            back = [name for name in present if name not in before]
            change = "; ".join(part for part in (f"without {', '.join(left)}" if left else "",
                                                 f"with {', '.join(back)} again" if back else "") if part)
            if change:
                lines.append(f"after round {event.get('after_round')}: went on {change} ({', '.join(present)} present)")
        elif event.get("event") == "drill":
            asked, fired = event.get("round"), event.get("fired_in_round", event.get("round"))
            when = (f" in round {fired - 1}" if fired == asked else
                    f" in round {fired - 1}, asked for round {asked - 1}") if isinstance(fired, int) and \
                isinstance(asked, int) else ""
            note = f" ({event['note']})" if event.get("note") else ""
            lines.append(f"drill: {event.get('action')} {event.get('node')}{when}{note}")
        elif event.get("event") == "non_finite":
            lines.append(f"round {event.get('round')}: node {event.get('node')} left out of the average (its model "
                         "went non-finite)")
    return lines


def _optional_sum(values: list[Optional[float]]) -> Optional[float]:
    present = [value for value in values if value is not None]
    return sum(present) if present else None


def summarize_total(nodes: list[NodeSummary], records: list[NodeRound], rounds: int) -> NodeSummary:
    """The run's total: sums over nodes; the idle share is GPU-weighted (idle GPU-s / wall GPU-s). Per 1,000
    rounds it is the sum of the nodes' rows, each over the rounds that node logged: in async mode, or with a node
    absent for some rounds, nodes log different numbers of rounds, and dividing the run's idle by its number of
    distinct rounds would fall below the sum of its own rows."""
    idle_gpu_s = sum(node.idle_gpu_s for node in nodes)
    wall_gpu_s = sum(node.wall_gpu_s for node in nodes)
    idle_s = sum(node.idle_s for node in nodes)
    wall_s = sum(node.wall_s for node in nodes)
    idle_cost = _optional_sum([node.idle_cost_usd for node in nodes])
    return NodeSummary(
        node="total", site="", gpus=[gpu for node in nodes for gpu in node.gpus],
        num_gpus=sum(node.num_gpus for node in nodes), rounds=rounds,
        compute_s=sum(node.compute_s for node in nodes), wait_s=sum(node.wait_s for node in nodes),
        comm_s=sum(node.comm_s for node in nodes), overhead_s=sum(node.overhead_s for node in nodes),
        idle_s=idle_s, wall_s=wall_s, tokens=sum(node.tokens for node in nodes),
        idle_share=idle_gpu_s / wall_gpu_s if wall_gpu_s > 0 else (idle_s / wall_s if wall_s > 0 else 0.0),
        comm_hidden_s=sum(node.comm_hidden_s for node in nodes), sync_bytes=sum(node.sync_bytes for node in nodes),
        lost_s=sum(node.lost_s for node in nodes), lost_gpu_s=sum(node.lost_gpu_s for node in nodes),
        compute_utilization=(sum(record.compute_s * record.gpu_count for record in records) / wall_gpu_s
                             if wall_gpu_s > 0 else 0.0),
        idle_gpu_s=idle_gpu_s, wall_gpu_s=wall_gpu_s,
        wait_gpu_s=sum(node.wait_gpu_s for node in nodes), comm_gpu_s=sum(node.comm_gpu_s for node in nodes),
        overhead_gpu_s=sum(node.overhead_gpu_s for node in nodes),
        idle_gpu_h_per_1k_rounds=sum(node.idle_gpu_h_per_1k_rounds for node in nodes),
        predicted_idle_s=_optional_sum([node.predicted_idle_s for node in nodes]),
        usd_per_hour=_optional_sum([node.usd_per_hour for node in nodes]),
        idle_cost_usd=idle_cost,
        idle_cost_usd_per_1k_rounds=_optional_sum([node.idle_cost_usd_per_1k_rounds for node in nodes]),
        energy=cluster_energy(nodes, records),
    )


def cluster_energy(nodes: list[NodeSummary], records: list[NodeRound]) -> EnergyTotals:
    """The run's energy: summed joules, the wall-time-weighted mean utilization, and the nodes' mean powers
    summed (they draw at once: the mean over node-rounds would be one average node's power beside the whole
    run's energy)."""
    totals = energy_totals(records)
    totals.mean_power_w = _optional_sum([node.energy.mean_power_w for node in nodes])
    return totals


STOPPED_MIN_S = 1.0
"""A gap between records shorter than this is the runtime's own bookkeeping between rounds (well
under a millisecond in a run), not a stop."""


def running_and_stopped_s(records: list[NodeRound]) -> tuple[float, float]:
    """(seconds some node was in a round, seconds of the gaps of at least STOPPED_MIN_S in which none was).

    A run stopped and resumed later has such a gap; counting it would make the run look slower than
    it trained. A failure inside an elastic run is not a gap: the survivors' records hold the time
    lost to it."""
    spans = sorted((record.round_start, record.round_end) for record in records)
    running_s = stopped_s = 0.0
    first_start, last_end = spans[0]
    for start, end in spans[1:]:
        if start - last_end >= STOPPED_MIN_S:
            running_s += last_end - first_start
            stopped_s += start - last_end
            first_start = start
        last_end = max(last_end, end)
    return running_s + last_end - first_start, stopped_s


def summarize_rounds(records: list[NodeRound], planned: dict[tuple[int, str], float]) -> list[RoundSummary]:
    by_round: dict[int, list[NodeRound]] = {}
    for record in records:
        by_round.setdefault(record.round, []).append(record)
    rows = []
    for round_index in sorted(by_round):
        group = by_round[round_index]
        views = {record.node: NodeRoundView(record.idle_s, record.local_steps, record.batch_size,
                                            planned.get((round_index, record.node))) for record in group}
        predictions = [view.predicted_idle_s for view in views.values()]
        rows.append(RoundSummary(
            round=round_index,
            wall_s=max(record.round_end for record in group) - min(record.round_start for record in group),
            idle_gpu_s=sum(record.idle_s * record.gpu_count for record in group),
            nodes=views, predicted_idle_s=_optional_sum(predictions)))
    return rows


def _final_losses(logs: RunLogs, last_round: int) -> tuple[Optional[float], Optional[float]]:
    """The mean train loss of the last reported round and the latest eval loss up to it. A run stopped
    after logging a round's metrics but before its idle records has a later round in metrics.jsonl
    than the report covers; its loss would belong to no reported round."""
    reported = [row for row in logs.metrics if row.round <= last_round]
    # a node whose loss went non-finite is left out of its round, as the run leaves it out of the average
    with_loss = [row for row in reported if row.loss is not None and math.isfinite(row.loss)]
    with_eval = [row for row in reported if row.eval_loss is not None and math.isfinite(row.eval_loss)]
    final_loss = None
    if with_loss:
        last_round = max(row.round for row in with_loss)
        last = [row.loss for row in with_loss if row.round == last_round]
        final_loss = sum(last) / len(last)
    # the last of the latest round's rows: an async run's final evaluation follows its host's last round
    final_eval = max(reversed(with_eval), key=lambda row: row.round).eval_loss if with_eval else None
    return final_loss, final_eval


def _energy_note(total: EnergyTotals, node_rounds: int) -> str:
    if not total.available:
        return NOT_AVAILABLE
    how = "measured" if total.idle_energy_measured else "estimated at each round's mean power"
    coverage = "" if total.rounds_with_energy == node_rounds else \
        f"; covers {total.rounds_with_energy} of {node_rounds} node-rounds"
    return f"idle energy {how}{coverage}"


def summarize(logs: RunLogs, skip_rounds: int = 0, prices: Optional[PriceTable] = None,
              label: Optional[str] = None) -> RunSummary:
    """Summarize a loaded run, leaving out the first ``skip_rounds`` rounds (warm-up)."""
    kept, skipped = select_rounds(logs.records, skip_rounds)
    kept_set = set(kept)
    records = [record for record in logs.records if record.round in kept_set]
    planned = _planned_idle(logs, kept_set)
    nodes = []
    for node in node_order(logs):
        node_records = [record for record in records if record.node == node]
        if not node_records:
            continue
        site = node_records[-1].site
        nodes.append(summarize_node(node, site, node_gpu_names(logs, node),
                                    node_records, planned, prices))
    total = summarize_total(nodes, records, len(kept))
    run_wall_s, stopped_s = running_and_stopped_s(records)
    tokens = sum(record.tokens for record in records)
    final_loss, final_eval = _final_losses(logs, max(kept))
    return RunSummary(
        label=label or logs.name, run_dir=logs.where, run_id=logs.run_id, policy=logs.policy,
        sources=sorted({record.source for record in records}),
        rounds_in_log=len(kept) + len(skipped), rounds=kept, skipped_rounds=skipped,
        nodes=nodes, total=total, per_round=summarize_rounds(records, planned),
        run_wall_s=run_wall_s, tokens=tokens,
        tokens_per_hour=tokens / run_wall_s * SECONDS_PER_HOUR if run_wall_s > 0 else None,
        energy_note=_energy_note(total.energy, len(records)),
        final_loss=final_loss, final_eval_loss=final_eval,
        warnings=list(logs.warnings), records=records, stopped_s=stopped_s, prices_used=prices_used(nodes, prices),
        membership=membership_changes(logs.membership), running_launcher=logs.running_launcher)
