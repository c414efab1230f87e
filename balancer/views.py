"""What `geodiloco plan` and `geodiloco simulate` print: JSON shapes and rich tables (seconds)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from geodiloco.balancer.plan import Plan
from geodiloco.common.console import cli_console


def plan_summary(plan: Plan) -> dict:
    """``geodiloco plan --json``: per-node H, B and predictions, plus totals (seconds)."""
    return {
        "policy": plan.policy,
        "round": plan.round,
        "weighting": plan.weighting,
        "nodes": [{
            "name": node.name, "local_steps": node.local_steps, "batch_size": node.batch_size,
            "micro_batch_size": node.micro_batch_size, "predicted_step_s": node.predicted_step_s,
            "step_uncertainty": node.step_uncertainty,
            "predicted_compute_s": node.predicted_compute_s, "predicted_wait_s": node.predicted_wait_s,
            "predicted_comm_s": node.predicted_comm_s, "predicted_idle_s": node.predicted_idle_s,
            "deadline_s": node.deadline_s, "expected_local_steps": expected_steps(node),
        } for node in plan.nodes],
        "predicted_round_s": plan.predicted_round_s,
        "predicted_idle_s": plan.predicted_idle_s,
        "predicted_sync_s": plan.predicted_sync_s,
        "sync_advice": plan.sync_advice,
    }


def print_plan(plan: Plan, setup, console: Console | None = None, advice=None) -> None:
    console = console or cli_console()
    gpus = {node.name: node.gpus for node in setup.cluster.nodes}
    table = Table(title=f"plan, policy {plan.policy}, round {plan.round} ({setup.model}, seq {setup.seq_len}, "
                        f"{setup.precision}, baseline H={setup.local_steps} B={setup.batch_size})")
    for column in ("node", "GPUs", "H", "B", "micro", "step s", "+-", "compute s", "wait s", "sync s", "deadline s"):
        table.add_column(column, justify="left" if column in ("node", "GPUs") else "right")
    for node in plan.nodes:
        table.add_row(node.name, _gpu_text(gpus.get(node.name, [])), _steps_text(node), str(node.batch_size),
                      str(node.micro_batch_size), f"{node.predicted_step_s:.3f}", f"{node.step_uncertainty:.0%}", f"{node.predicted_compute_s:.2f}",
                      f"{node.predicted_wait_s:.2f}", f"{node.predicted_comm_s:.2f}",
                      "-" if node.deadline_s is None else f"{node.deadline_s:.2f}")
    if len(plan.nodes) > MAX_TABLE_NODES:
        console.print(f"plan, policy {plan.policy}, round {plan.round}: {len(plan.nodes)} nodes; per-node rows left out "
                      f"(use --json); {_spread('local steps H', [node.local_steps for node in plan.nodes])}; "
                      f"{_spread('batch B', [node.batch_size for node in plan.nodes])}", soft_wrap=True)
    else:
        console.print(table)
    for line in batches_below_gpu_count([(node.name, node.batch_size) for node in plan.nodes],
                                        setup.cluster.nodes):
        console.print(f"[bold yellow]note:[/] {line}", soft_wrap=True)
    wait_s = sum(node.predicted_wait_s for node in plan.nodes)
    gpu_idle_s, gpu_s = plan.gpu_idle_s(setup.cluster.nodes)
    share = f" ({gpu_idle_s / gpu_s:.1%})" if gpu_s > 0 else ""
    console.print(f"predicted round {plan.predicted_round_s:.2f} s; GPU idle {gpu_idle_s:,.2f} of {gpu_s:,.2f} GPU-s{share}: "
                  "waiting + exposed outer sync (logging, evaluation and checkpoints come on top)", soft_wrap=True)
    console.print(f"summed over nodes: idle {plan.predicted_idle_s:,.2f} s, waiting {wait_s:,.2f} s; "
                  f"outer-average weighting: {plan.weighting}", soft_wrap=True)
    sync = setup.sync
    exposed_s = max((node.predicted_comm_s for node in plan.nodes), default=0.0)
    console.print(f"outer sync: {plan.predicted_sync_s:.2f} s per round (overlap {sync.overlap}, codec {sync.codec}"
                  f"{f', {sync.fragments} fragments' if sync.overlap == 'streaming' else ''}); "
                  f"{exposed_s:.2f} s exposed, {max(0.0, plan.predicted_sync_s - exposed_s):.2f} s hidden behind compute")
    if plan.sync_advice:
        console.print(f"[bold yellow]advice:[/] {plan.sync_advice}")
    if advice is not None:
        console.print(f"[bold]mode:[/] expect diloco.mode: {advice.recommended} to be faster: {advice.reason}")


MAX_TABLE_NODES = 40
"""Above this many nodes a table of one row per node is a wall of text: plan and simulate print a summary
(the rows stay in --json / --out)."""


def _spread(what: str, values: list[int]) -> str:
    ordered = sorted(values)
    return f"{what} {ordered[0]}..{ordered[-1]} (median {ordered[len(ordered) // 2]})"


def expected_steps(node) -> int:
    """Steps a node is predicted to finish: under the deadline policy its ``local_steps`` is a cap, and the node
    stops at the deadline after about ``predicted_compute_s / predicted_step_s`` of them."""
    if node.deadline_s is None or node.predicted_step_s <= 0:
        return node.local_steps
    return int(round(node.predicted_compute_s / node.predicted_step_s))


def _steps_text(node) -> str:
    expected = expected_steps(node)
    return str(node.local_steps) if expected == node.local_steps else f"{expected} of {node.local_steps}"


def batches_below_gpu_count(node_batches, nodes) -> list[str]:
    """Lines on the real-GPU nodes whose planned batch leaves some of their GPUs without a sample.
    ``node_batches``: (node name, planned batch) pairs. Run with one rank per GPU, every GPU trains at least
    one sample (runtime/batching.py), so such a node trains more samples than its B; its predicted step time
    already counts them. One line per node, or one line for all when more than ``MAX_NOTED_NODES``."""
    ranks = {node.name: node.ranks for node in nodes}
    below = [(name, batch, ranks[name]) for name, batch in node_batches if batch < ranks.get(name, 1)]
    if not below:
        return []
    if len(below) > MAX_NOTED_NODES:
        name, batch, gpus = below[0]
        return [f"{len(below)} nodes have a batch smaller than their GPU count (node {name}: batch {batch}, "
                f"{gpus} GPUs); with one rank per GPU each trains one sample on every GPU per step (their step s "
                "counts them); give each a batch that is a multiple of its GPU count to train the one you plan "
                "(nodes[].batch_size or diloco.batch_size)"]
    return [f"node {name}: batch {batch} is smaller than its {gpus} GPUs; with one rank per GPU it trains {gpus} "
            f"samples per step (each GPU takes at least one; its step s counts them); give it a batch that is a "
            f"multiple of {gpus} to train the one you plan (nodes[].batch_size or diloco.batch_size)"
            for name, batch, gpus in below]


MAX_NOTED_NODES = 5


def _gpu_text(gpus: list) -> str:
    counts: dict = {}
    for gpu in gpus:
        counts[gpu] = counts.get(gpu, 0) + 1
    return ", ".join(f"{count} x {gpu}" if count > 1 else gpu for gpu, count in counts.items()) or "-"


def print_simulation(result, console: Console | None = None) -> None:
    console = console or cli_console()
    summary = result.summary()
    table = Table(title=f"simulated {summary['rounds']} rounds, policy {summary['policy']} (seconds, summed over rounds)")
    for column in ("node", "steps", "B (last)", "tokens", "compute s", "wait s", "sync s", "idle s",
                   "predicted idle s"):
        table.add_column(column, justify="left" if column == "node" else "right")
    for node in summary["nodes"]:
        table.add_row(node["name"], str(node["steps_total"]), str(node["batch_size"]), f"{node['tokens']:,}",
                      f"{node['compute_s']:.2f}", f"{node['wait_s']:.2f}", f"{node['comm_s']:.2f}",
                      f"{node['idle_s']:.2f}", f"{node['predicted_idle_s']:.2f}")
    table.add_row("total", "", "", f"{summary['tokens']:,}", f"{summary['compute_s']:.2f}", f"{summary['wait_s']:.2f}",
                  f"{summary['comm_s']:.2f}", f"{summary['idle_s']:.2f}", f"{summary['predicted_idle_s']:.2f}",
                  style="bold")
    if len(summary["nodes"]) > MAX_TABLE_NODES:
        console.print(f"{len(summary['nodes'])} nodes; per-node rows left out (use --json or --out)")
    else:
        console.print(table)
    last_batches = [(node.name, int(batch)) for node, batch in zip(result.nodes, result.batch_size[-1])]
    for line in batches_below_gpu_count(last_batches, result.nodes):
        console.print(f"[bold yellow]note:[/] {line}", soft_wrap=True)
    console.print(f"GPU idle {summary['gpu_idle_s']:,.1f} of {summary['gpu_s']:,.1f} GPU-s ({summary['gpu_idle_share']:.1%}): "
                  f"waiting {summary['gpu_wait_s']:,.1f}, exposed sync {summary['gpu_sync_s']:,.1f} GPU-s", soft_wrap=True)
    console.print(f"wall {summary['wall_s']:.1f} s; waiting {summary['wait_s']:.2f} s (node-s); "
                  f"tokens per round {summary['tokens_per_round']:,.0f}; tokens per hour {summary['tokens_per_hour']:,.0f}; "
                  f"outer-average weighting: {summary['weighting']}")
