"""Rich renderables of a run summary and of a comparison; the CLI prints them, the figure script draws them."""
from __future__ import annotations

import statistics
from typing import Optional

from rich import box
from rich.console import RenderableType
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from geodiloco.report import formatting as fmt
from geodiloco.report.compare import compare, least_idle, node_names
from geodiloco.report.summary import NodeSummary, RunSummary

IDLE_STYLE = "bold red"
GOOD_STYLE = "bold green"
BLANK = Text("")


def _round_span(rounds: list[int]) -> str:
    if not rounds:
        return "none"
    if rounds == list(range(rounds[0], rounds[-1] + 1)):
        return f"{rounds[0]}–{rounds[-1]}" if len(rounds) > 1 else str(rounds[0])
    return ", ".join(map(str, rounds))


def run_header(summary: RunSummary) -> Text:
    """Who, what and how much: run name, policy, reported rounds (and warm-up left out), throughput."""
    text = Text()
    text.append(f"Run {summary.label}", style="bold cyan")
    text.append(f"  policy {summary.policy}  ·  run_id {summary.run_id}  ·  source {'+'.join(summary.sources)}\n")
    text.append(f"{summary.run_dir}\n", style="dim")
    text.append(f"{len(summary.rounds)} round{'s' if len(summary.rounds) != 1 else ''} reported ({_round_span(summary.rounds)}; from 0, as the logs count: "
                "the console's round 1 is round 0)")
    if summary.skipped_rounds:
        text.append(f"; warm-up rounds {_round_span(summary.skipped_rounds)} excluded "
                    f"(--skip-rounds {len(summary.skipped_rounds)})", style="yellow")
    text.append(f"\nwall clock {fmt.seconds(summary.run_wall_s)} s")
    if summary.stopped_s:
        text.append(f" (+{fmt.seconds(summary.stopped_s)} s stopped between sessions, not counted)", style="dim")
    text.append(f"  ·  {fmt.count(summary.tokens)} tokens  ·  {fmt.count(summary.tokens_per_hour)} tokens/h")
    if summary.final_loss is not None or summary.final_eval_loss is not None:
        which = "latest" if summary.running_launcher else "final"
        text.append(f"  ·  {which} loss {fmt.number(summary.final_loss, 3)}")
        if summary.final_eval_loss is not None:
            text.append(f" (eval {fmt.number(summary.final_eval_loss, 3)})")
    if summary.running_launcher:
        text.append(f"\nin progress: its launcher (pid {summary.running_launcher}) is still training; the figures "
                    "are those of the rounds logged so far", style="yellow")
    return text


def waste_line(summary: RunSummary) -> Text:
    total = summary.total
    text = Text("GPU waste: ")
    text.append(f"{fmt.seconds(total.idle_gpu_s)} GPU-s idle", style=IDLE_STYLE)
    text.append(f" of {fmt.seconds(total.wall_gpu_s)} GPU-s ({fmt.percent(total.idle_share)}): waiting "
                f"{fmt.seconds(total.wait_gpu_s)}, exposed sync {fmt.seconds(total.comm_gpu_s)}, other "
                f"{fmt.seconds(total.overhead_gpu_s)} GPU-s; {fmt.number(total.idle_gpu_h_per_1k_rounds, 3)} GPU-h per "
                "1,000 rounds; "
                f"compute utilization {fmt.percent(total.compute_utilization)}")
    if total.comm_hidden_s > 0:
        text.append(f"; {fmt.seconds(total.comm_hidden_s)} s of sync hidden behind compute (summed over nodes)")
    if total.lost_gpu_s > 0:
        share = total.lost_gpu_s / total.idle_gpu_s if total.idle_gpu_s > 0 else 0.0
        text.append(f"; {fmt.seconds(total.lost_gpu_s)} GPU-s of the idle ({fmt.percent(share)}) lost to site failures "
                    "and restarts", style=IDLE_STYLE)
    if total.idle_cost_usd is not None:
        text.append("; ")
        text.append(f"{fmt.usd(total.idle_cost_usd)} idle", style=IDLE_STYLE)
        text.append(f" ({fmt.usd(total.idle_cost_usd_per_1k_rounds)} per 1,000 rounds)")
    return text


def prices_line(summary: RunSummary) -> Text:
    """Which price each cost used, grouped by where it came from (a file, or --price on the command line)."""
    by_source: dict[str, list[str]] = {}
    for name, usd, source in summary.prices_used:
        by_source.setdefault(source, []).append(f"{name} {usd:g}")
    return Text("priced in USD per GPU-hour: " + "; ".join(f"{', '.join(names)} ({source})"
                                                          for source, names in by_source.items()), style="dim")


def _number_column(table: Table, header: str, style: str = "") -> None:
    table.add_column(header, justify="right", no_wrap=True, style=style)


def keep_whole(table: Table) -> Table:
    """Give every no-wrap column (numbers, names) the width of its widest cell and header line as its minimum:
    rich shrinks a table that is too wide for the terminal by cutting such cells to "0…", and measures its
    minimum width as if they could be; with these minimums the report prints it whole (``report/cli.py``)."""
    for column in table.columns:
        if not column.no_wrap:
            continue
        texts = [str(column.header)] + [cell.plain if isinstance(cell, Text) else str(cell) for cell in column._cells]
        column.min_width = max(cell_len(line) for text in texts for line in text.splitlines() or [""])
    return table


def _node_cells(node: NodeSummary, show_overhead: bool, show_predicted: bool, show_cost: bool,
                show_hidden: bool = False) -> list[str]:
    cells = [node.node, node.site, fmt.gpus(node.gpus, node.num_gpus) if node.node != "total" else str(node.num_gpus),
             fmt.seconds(node.compute_s), fmt.seconds(node.wait_s), fmt.seconds(node.comm_s)]
    if show_hidden:
        cells.append(fmt.seconds(node.comm_hidden_s))
    if show_overhead:
        cells.append(fmt.seconds(node.overhead_s))
    cells += [fmt.seconds(node.idle_s), fmt.percent(node.idle_share), fmt.percent(node.compute_utilization),
              fmt.seconds(node.idle_gpu_s), fmt.number(node.idle_gpu_h_per_1k_rounds, 3)]
    if show_predicted:
        cells.append(fmt.seconds(node.predicted_idle_s))
    if show_cost:
        cells += [fmt.usd(node.idle_cost_usd), fmt.usd(node.idle_cost_usd_per_1k_rounds)]
    return cells


def node_table(summary: RunSummary) -> Table:
    """Per node and in total: compute, waiting for peers, WAN sync, idle share and its GPU-time and cost."""
    show_overhead = summary.total.overhead_s > 0
    show_predicted = summary.total.predicted_idle_s is not None
    show_cost = summary.has_prices
    show_hidden = summary.total.comm_hidden_s > 0
    table = Table(title="GPU time per node (s = seconds of the node, all its GPUs at once; GPU-s = s x GPUs; "
                        "sync = WAN outer sync the GPUs waited on; idle = wait + sync + other; "
                        "util = compute share (the total row's idle % and util % weigh nodes by GPUs); GPU-h/1k rnd = idle "
                        "GPU-hours per 1,000 rounds)"
                        + ("; hidden = sync overlapped with compute, not idle" if show_hidden else ""),
                  box=box.SIMPLE_HEAVY, title_justify="left")
    table.add_column("node", style="bold", no_wrap=True)
    table.add_column("site", no_wrap=True)
    gpu_parts = [part for node in summary.nodes for part in fmt.gpus(node.gpus, node.num_gpus).split(" + ")]
    table.add_column("GPUs", min_width=max(len(part) + 2 for part in gpu_parts) if gpu_parts else None)
    for header in (["compute s", "wait s", "sync s"] + (["hidden\nsync s"] if show_hidden else [])
                   + (["other s"] if show_overhead else [])):
        _number_column(table, header)
    _number_column(table, "idle s", style=IDLE_STYLE)
    for header in ["idle %", "util %", "idle\nGPU-s", "GPU-h\n/1k rnd"]:
        _number_column(table, header)
    if show_predicted:
        _number_column(table, "predicted\nwait+sync s", style="dim")
    if show_cost:
        _number_column(table, "idle $", style=IDLE_STYLE)
        _number_column(table, "idle $\n/1k rnd")
    for position, node in enumerate(summary.nodes):
        table.add_row(*_node_cells(node, show_overhead, show_predicted, show_cost, show_hidden),
                      end_section=position == len(summary.nodes) - 1)
    table.add_row(*_node_cells(summary.total, show_overhead, show_predicted, show_cost, show_hidden), style="bold")
    return keep_whole(table)


def energy_view(summary: RunSummary) -> RenderableType:
    """Energy per node from NVML samples, or one line saying it is not available."""
    if not summary.energy_available:
        return Text(f"Energy {summary.energy_note}", style="dim")
    table = Table(title="Energy (NVML; a node's power is its GPUs' mean total, the total row's the nodes' sum)",
                  box=box.SIMPLE_HEAVY, title_justify="left", caption=summary.energy_note, caption_justify="left")
    table.add_column("node", style="bold")
    for header in ["GPU util %", "power W", "energy kWh", "idle energy kWh", "idle energy J"]:
        _number_column(table, header)
    rows = summary.nodes + [summary.total]
    for position, node in enumerate(rows):
        energy = node.energy
        table.add_row(node.node, fmt.number(energy.mean_gpu_util, 1), fmt.number(energy.mean_power_w, 0),
                      fmt.significant(energy.energy_kwh), fmt.significant(energy.idle_energy_kwh),
                      fmt.number(energy.idle_energy_j, 0),
                      end_section=position == len(rows) - 2, style="bold" if node.node == "total" else None)
    return keep_whole(table)


def round_table(summary: RunSummary) -> Table:
    """Per round: its span, each node's idle seconds with its local steps H and batch size B."""
    nodes = [node.node for node in summary.nodes]
    show_predicted = any(row.predicted_idle_s is not None for row in summary.per_round)
    asynchronous = any(record.mode == "async" for record in summary.records)
    table = Table(title="Per round (idle s, H local steps, B batch size)", box=box.SIMPLE_HEAVY,
                  title_justify="left",
                  caption=("async: a round is each node's phase of that number, and the nodes' phases overlap, so "
                           "a round's wall s spans them all and the rows add up to more than the run's wall clock")
                  if asynchronous else None)
    _number_column(table, "round", style="bold")
    _number_column(table, "wall s")
    for name in nodes:
        table.add_column(name, justify="right")
    _number_column(table, "idle\nGPU-s", style=IDLE_STYLE)
    if show_predicted:
        _number_column(table, "predicted\nwait+sync s", style="dim")
    for row in summary.per_round:
        cells = [str(row.round), fmt.seconds(row.wall_s)]
        for name in nodes:
            view = row.nodes.get(name)
            cells.append(fmt.DASH if view is None else
                         f"{fmt.seconds(view.idle_s)}  H {view.local_steps} B {view.batch_size}")
        cells.append(fmt.seconds(row.idle_gpu_s))
        if show_predicted:
            cells.append(fmt.seconds(row.predicted_idle_s))
        table.add_row(*cells)
    return keep_whole(table)


def staleness_table(summary: RunSummary) -> Optional[Table]:
    """Asynchronous runs: per node, the distribution of its updates' staleness (global versions
    applied between its pull and its update); None for synchronous runs."""
    by_node: dict[str, list[int]] = {}
    for record in summary.records:
        if record.staleness is not None:
            by_node.setdefault(record.node, []).append(record.staleness)
    if not by_node:
        return None
    table = Table(title="Staleness per node (async)", caption="global versions applied between a node's pull and its update",
                  box=box.SIMPLE_HEAVY, title_justify="left", caption_justify="left")
    table.add_column("node")
    for header in ("updates", "median", "p90", "worst", "mean"):
        _number_column(table, header)
    for node, values in by_node.items():
        ordered = sorted(values)
        p90 = ordered[min(len(ordered) - 1, int(round(0.9 * (len(ordered) - 1))))]
        table.add_row(node, str(len(ordered)), f"{statistics.median(ordered):g}", str(p90), str(ordered[-1]),
                      f"{statistics.fmean(ordered):.2f}")
    return keep_whole(table)


def render_run(summary: RunSummary, show_rounds: bool = False) -> list[RenderableType]:
    """The full report of one run, top to bottom."""
    parts: list[RenderableType] = [run_header(summary), BLANK, node_table(summary), waste_line(summary)]
    if summary.prices_used:
        parts.append(prices_line(summary))
    if summary.membership:
        parts.append(Text("membership: " + "; ".join(summary.membership), style="yellow"))
    parts.append(BLANK)
    stale = staleness_table(summary)
    if stale is not None:
        parts += [stale, BLANK]
    if show_rounds:
        parts += [round_table(summary), BLANK]
    parts += [energy_view(summary), BLANK]
    return parts


def run_kinds(summary: RunSummary) -> list[str]:
    """What sets a run apart in a comparison: ``async`` (its rounds are each node's phases) and ``simulated``
    (its times come from ``geodiloco simulate``, not from processes)."""
    kinds = []
    if any(record.mode == "async" for record in summary.records):
        kinds.append("async")
    if "simulate" in summary.sources:
        kinds.append("simulated")
    return kinds


KIND_NOTES = {"async": "async: a round is each node's phase of that number, not a shared sync",
              "simulated": "simulated: times from geodiloco simulate, not from a run"}


def comparison_table(summaries: list[RunSummary]) -> Table:
    """One row per run: idle per round and throughput, each relative to the first run."""
    show_cost = all(summary.has_prices for summary in summaries)
    show_energy = any(summary.energy_available for summary in summaries)
    show_loss = any(summary.final_loss is not None for summary in summaries)
    show_eval = any(summary.final_eval_loss is not None for summary in summaries)
    kinds = sorted({kind for summary in summaries for kind in run_kinds(summary)})
    table = Table(title=f"Comparison (relative to the first run, {summaries[0].label})", box=box.SIMPLE_HEAVY,
                  title_justify="left", caption="; ".join(KIND_NOTES[kind] for kind in kinds) or None,
                  caption_justify="left")
    table.add_column("run", style="bold", no_wrap=True)
    table.add_column("policy", no_wrap=True)
    for header in ["rounds", "wall s", "idle\nGPU-s", "idle %", "GPU-h\n/1k rnd", "idle vs\nfirst",
                   "tokens/h", "tokens/h\nvs first"]:
        _number_column(table, header)
    if show_cost:
        _number_column(table, "idle $\n/1k rnd")
    if show_energy:
        _number_column(table, "idle\nkWh")
    if show_loss:
        _number_column(table, "final\nloss")
    if show_eval:
        _number_column(table, "final\neval")
    best = least_idle(summaries)
    for summary, row in zip(summaries, compare(summaries)):
        change_style = GOOD_STYLE if (row.idle_change or 0) < 0 else (IDLE_STYLE if (row.idle_change or 0) > 0 else "")
        cells: list[RenderableType] = [
            summary.label + (" ★" if summary is best else ""),
            " · ".join([summary.policy] + run_kinds(summary)), str(len(summary.rounds)),
            fmt.seconds(summary.run_wall_s), fmt.seconds(summary.total.idle_gpu_s), fmt.percent(summary.total.idle_share),
            fmt.number(row.idle_gpu_h_per_1k_rounds, 3), Text(fmt.signed_percent(row.idle_change), style=change_style),
            fmt.count(row.tokens_per_hour), fmt.ratio(row.tokens_per_hour_ratio)]
        if show_cost:
            cells.append(fmt.usd(summary.total.idle_cost_usd_per_1k_rounds))
        if show_energy:
            cells.append(fmt.significant(summary.total.energy.idle_energy_kwh))
        if show_loss:
            cells.append(fmt.number(summary.final_loss, 3))
        if show_eval:
            cells.append(fmt.number(summary.final_eval_loss, 3))
        table.add_row(*cells)
    return keep_whole(table)


def idle_by_node_table(summaries: list[RunSummary]) -> Table:
    """Idle seconds per node (rows) by run (columns), with totals: the paper's Table 3 layout."""
    table = Table(title="Idle seconds per node by run (seconds of the node, as the source paper's Table 3 counts them)", box=box.SIMPLE_HEAVY, title_justify="left")
    table.add_column("node", style="bold")
    for summary in summaries:
        table.add_column(f"{summary.label}\n({summary.policy})", justify="right")
    names = node_names(summaries)
    for name in names:
        cells = [name]
        for summary in summaries:
            node = next((node for node in summary.nodes if node.node == name), None)
            cells.append(fmt.DASH if node is None else fmt.seconds(node.idle_s))
        table.add_row(*cells, end_section=name == names[-1])
    table.add_row("total", *[fmt.seconds(summary.total.idle_s) for summary in summaries], style="bold")
    return keep_whole(table)


def verdict(summaries: list[RunSummary]) -> Text:
    best = least_idle(summaries)
    row = compare(summaries)[summaries.index(best)]
    text = Text("Least idle: ")
    text.append(f"{best.label} ({best.policy})", style=GOOD_STYLE)
    text.append(f", {fmt.percent(best.total.idle_share)} of GPU time idle; "
                f"{fmt.number(best.total.idle_gpu_h_per_1k_rounds, 3)} GPU-h per 1,000 rounds, "
                f"{fmt.signed_percent(row.idle_change)} vs {summaries[0].label}")
    return text


def model_verdict(summaries: list[RunSummary]) -> Optional[Text]:
    """The run whose final global model scored the lowest eval loss, where two or more runs were scored: the
    least idle run need not train the better model (an async run idles less and may end worse)."""
    scored = [summary for summary in summaries if summary.final_eval_loss is not None]
    if len(scored) < 2:
        return None
    best = min(scored, key=lambda summary: summary.final_eval_loss)
    text = Text("Lowest final eval loss: ")
    text.append(f"{best.label} ({best.policy})", style=GOOD_STYLE)
    text.append(f", {fmt.number(best.final_eval_loss, 3)}")
    least = least_idle(summaries)
    if least is not best and least.final_eval_loss is not None:
        text.append(f"; the least idle run, {least.label}, ended at {fmt.number(least.final_eval_loss, 3)}",
                    style=IDLE_STYLE)
    return text


def render_comparison(summaries: list[RunSummary]) -> list[RenderableType]:
    skipped = {len(summary.skipped_rounds) for summary in summaries}
    parts: list[RenderableType] = [comparison_table(summaries), BLANK, idle_by_node_table(summaries),
                                   verdict(summaries)]
    model = model_verdict(summaries)
    if model is not None:
        parts.append(model)
    if skipped != {0}:
        parts.append(Text(f"warm-up rounds excluded: --skip-rounds {max(skipped)}", style="yellow"))
    return parts
