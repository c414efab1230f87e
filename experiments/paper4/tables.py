"""The result tables of the paper4 reproduction, as rows (for JSON) and Markdown.

Units: seconds per outer round (mean over the reported rounds), shares of node
time in percent. "Wait" is the time a node sat idle at the outer sync waiting
for slower peers (``wait_s`` of the idle log), which is what the source paper's
Table 3 reports and what balancing removes; "idle" adds the outer sync and the
per-round bookkeeping (``geodiloco report``'s definition).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import yaml

from configs import PAPER_CLUSTER
from results_data import RunData

_TABLE3 = yaml.safe_load(PAPER_CLUSTER.read_text())["paper_table3"]  # the paper's idle s/round per node
PAPER_TABLE3 = {policy: row["idle_s"] for policy, row in _TABLE3.items()}
PAPER_NAME = {policy: row["label"] for policy, row in _TABLE3.items()}
BALANCED = ("steps_by_flops", "time", "hybrid", "adaptive", "deadline")


def fmt(value: Optional[float], digits: int = 2, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}{suffix}"


def percent(value: Optional[float], digits: int = 1) -> str:
    return "-" if value is None else fmt(100.0 * value, digits, " %")


def change(value: Optional[float], digits: int = 0) -> str:
    """A relative change as a signed percentage (-0.39 -> "-39 %")."""
    if value is None or math.isnan(value):
        return "-"
    return f"{100.0 * value:+.{digits}f} %"


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def idle_row(run: RunData, round_scale: float, warm: bool = False) -> dict:
    """Waiting and idle of one run, per round, per node and in total."""
    report = run.warm_report if warm else run.report
    rounds = len(report["rounds"])
    total = report["total"]
    wait_per_round = {node["node"]: node["wait_s"] / rounds for node in report["nodes"]}
    return {
        "policy": run.policy, "rounds": rounds,
        "wait_s_per_round": wait_per_round,
        "wait_share": {node["node"]: node["wait_s"] / node["wall_s"] for node in report["nodes"]},
        "total_wait_s_per_round": total["wait_s"] / rounds,
        "total_wait_share": total["wait_s"] / total["wall_s"],
        "paper_scale_wait_s_per_round": total["wait_s"] / rounds / round_scale,
        "total_idle_s_per_round": total["idle_s"] / rounds,
        "total_idle_share": total["idle_s"] / total["wall_s"],
        "sync_s_per_round": total["comm_s"] / rounds / len(report["nodes"]),
        "paper_wait_s_per_round": PAPER_TABLE3.get(run.policy),
    }


def add_reductions(rows: list[dict]) -> list[dict]:
    """``wait_change_vs_uniform``: relative change of total waiting per round against the uniform row."""
    baseline = next((row for row in rows if row["policy"] == "uniform"), None)
    paper_baseline = sum(PAPER_TABLE3["uniform"])
    for row in rows:
        row["wait_change_vs_uniform"] = (row["total_wait_s_per_round"] / baseline["total_wait_s_per_round"] - 1.0
                                         if baseline and baseline["total_wait_s_per_round"] > 0 else None)
        paper = row["paper_wait_s_per_round"]
        row["paper_change_vs_baseline"] = sum(paper) / paper_baseline - 1.0 if paper else None
    return rows


def idle_table(runs: Sequence[RunData], round_scale: float, warm: bool = False) -> tuple[list[dict], str]:
    rows = add_reductions([idle_row(run, round_scale, warm) for run in runs])
    nodes = runs[0].nodes
    header = (["policy"] + [f"{name} s" for name in nodes] +
              ["total s/round", "% of node time", "paper-scale s/round", "vs uniform",
               "paper Table 3 (s/round)", "paper vs baseline", "idle incl. sync+other s/round (%)"])
    lines = []
    for row in rows:
        paper = row["paper_wait_s_per_round"]
        paper_text = (" / ".join(fmt(value, 1) for value in paper) + f" = {sum(paper):.1f}") if paper else "-"
        label = row["policy"] + (f" ({PAPER_NAME[row['policy']]})" if row["policy"] in PAPER_NAME else "")
        lines.append([label] + [fmt(row["wait_s_per_round"][name]) for name in nodes] +
                     [fmt(row["total_wait_s_per_round"]), percent(row["total_wait_share"]),
                      fmt(row["paper_scale_wait_s_per_round"], 1), change(row["wait_change_vs_uniform"]),
                      paper_text, change(row["paper_change_vs_baseline"]),
                      f"{fmt(row['total_idle_s_per_round'])} ({percent(row['total_idle_share'])})"])
    return rows, markdown(header, lines)


def fidelity_table(runs: Sequence[RunData], slow_steps: dict) -> tuple[list[dict], str]:
    """Measured local phase / emulated target per node (1.00 = the virtual GPU's time was kept)."""
    rows, lines = [], []
    nodes = runs[0].nodes
    for run in runs:
        ratio = {name: run.node(name)["compute_s"] / run.target_compute_s[name] for name in nodes}
        slow = slow_steps.get(run.name, {})
        steps = {name: sum(record["local_steps"] for record in run.records if record["node"] == name)
                 for name in nodes}
        rows.append({"run": run.name, "compute_over_target": ratio, "slow_steps": slow, "steps": steps})
        lines.append([run.name] + [f"{ratio[name]:.3f} ({slow.get(name, 0)}/{steps[name]})" for name in nodes])
    header = ["run"] + [f"{name}: measured/target (slow steps)" for name in nodes]
    return rows, markdown(header, lines)


def common_point(runs: Sequence[RunData], axis: str) -> float:
    """The largest ``axis`` value (seconds or tokens) that every run reached."""
    return min(float(getattr(run.curve, axis)[-1]) for run in runs)


def convergence_table(runs: Sequence[RunData], time_scale: float, emulated_seq_len: int,
                      real_seq_len: int) -> tuple[dict, str]:
    """Final loss, loss at equal wall-clock and at equal tokens, and throughput, per policy."""
    equal_wall_s = common_point(runs, "wall_s")
    equal_tokens = common_point(runs, "tokens")
    uniform = next((run for run in runs if run.policy == "uniform"), None)
    rows = []
    for run in runs:
        samples_per_hour = run.report["tokens"] / real_seq_len / run.report["run_wall_s"] * 3600.0
        rows.append({
            "policy": run.policy, "rounds": run.rounds, "tokens": int(run.curve.tokens[-1]),
            "wall_s": float(run.curve.wall_s[-1]), "final_eval_loss": float(run.curve.eval_loss[-1]),
            "loss_at_equal_wall": run.curve.loss_at("wall_s", equal_wall_s),
            "loss_at_equal_tokens": run.curve.loss_at("tokens", equal_tokens),
            "tokens_per_hour": run.report["tokens_per_hour"], "samples_per_hour": samples_per_hour,
            "paper_gpu_tokens_per_hour": samples_per_hour * emulated_seq_len * time_scale,
        })
    if uniform is not None:
        base = next(row for row in rows if row["policy"] == "uniform")
        for row in rows:
            row["wall_delta_vs_uniform"] = row["loss_at_equal_wall"] - base["loss_at_equal_wall"]
            row["tokens_delta_vs_uniform"] = row["loss_at_equal_tokens"] - base["loss_at_equal_tokens"]
            row["throughput_vs_uniform"] = row["samples_per_hour"] / base["samples_per_hour"]
    header = ["policy", "tokens", "wall s", "final eval loss", f"loss @ {equal_wall_s:.1f} s",
              "vs uniform", f"loss @ {equal_tokens / 1e3:.0f} k tokens", "vs uniform",
              "samples/h", "x uniform", "projected llama-150m tokens/h"]
    lines = [[row["policy"], f"{row['tokens']:,}", fmt(row["wall_s"], 1), fmt(row["final_eval_loss"], 3),
              fmt(row["loss_at_equal_wall"], 3), signed(row.get("wall_delta_vs_uniform")),
              fmt(row["loss_at_equal_tokens"], 3), signed(row.get("tokens_delta_vs_uniform")),
              f"{row['samples_per_hour']:,.0f}", fmt(row.get("throughput_vs_uniform"), 2, "x"),
              f"{row['paper_gpu_tokens_per_hour'] / 1e6:.1f} M"] for row in rows]
    result = {"equal_wall_s": equal_wall_s, "equal_tokens": equal_tokens, "rows": rows,
              "verdicts": verdicts(rows)}
    return result, markdown(header, lines)


def signed(value: Optional[float], digits: int = 3) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:+.{digits}f}"


def verdicts(rows: list[dict], tolerance: float = 0.01) -> dict:
    """Per balanced policy: is its loss at equal tokens / wall-clock no worse than uniform's (within ``tolerance``)?"""
    result = {}
    for row in rows:
        if row["policy"] not in BALANCED or "tokens_delta_vs_uniform" not in row:
            continue
        result[row["policy"]] = {
            "equal_tokens": _verdict(row["tokens_delta_vs_uniform"], tolerance),
            "equal_wall_clock": _verdict(row["wall_delta_vs_uniform"], tolerance),
        }
    return result


def _verdict(delta: float, tolerance: float) -> str:
    if math.isnan(delta):
        return "not comparable"
    if delta < -tolerance:
        return "better"
    if delta <= tolerance:
        return "same (within 0.01)"
    return "worse"


def round_wait(run: RunData, first: int, last: Optional[int]) -> float:
    """Total waiting (s, all nodes) per round over rounds ``first``..``last``."""
    records = run.round_records(first, last)
    rounds = {record["round"] for record in records}
    return sum(record["wait_s"] for record in records) / max(1, len(rounds))


def slowdown_table(runs: Sequence[RunData], slow_node: str, from_round: int) -> tuple[list[dict], str]:
    """Waiting per round before, at and after ``slow_node`` slows down in round ``from_round``."""
    rows, lines = [], []
    for run in runs:
        last_round = max(record["round"] for record in run.records)
        slow_steps = [record["local_steps"] for record in run.records
                      if record["node"] == slow_node and record["round"] == last_round]
        row = {"policy": run.policy,
               "wait_before_s": round_wait(run, 0, from_round - 1),
               "wait_at_change_s": round_wait(run, from_round, from_round),
               "wait_after_s": round_wait(run, from_round + 1, None),
               "total_wait_share": run.report["total"]["wait_s"] / run.report["total"]["wall_s"],
               "slow_node_last_steps": slow_steps[0] if slow_steps else None,
               "tokens_per_hour": run.report["tokens_per_hour"],
               "final_eval_loss": float(run.curve.eval_loss[-1])}
        rows.append(row)
    base = next((row for row in rows if row["policy"] == "uniform"), None)
    for row in rows:
        row["throughput_vs_uniform"] = row["tokens_per_hour"] / base["tokens_per_hour"] if base else None
        lines.append([row["policy"], fmt(row["wait_before_s"]), fmt(row["wait_at_change_s"]),
                      fmt(row["wait_after_s"]), percent(row["total_wait_share"]),
                      str(row["slow_node_last_steps"]), fmt(row["throughput_vs_uniform"], 2, "x"),
                      fmt(row["final_eval_loss"], 3)])
    header = ["policy", f"wait s/round, rounds 0-{from_round - 1}", f"round {from_round}",
              f"rounds {from_round + 1}-{max(record['round'] for record in runs[0].records)}", "wait % of node time", f"{slow_node} H (last round)",
              "tokens/h x uniform", "final eval loss"]
    return rows, markdown(header, lines)


def finite(values) -> bool:
    return bool(np.all(np.isfinite(np.asarray(values, dtype=float))))
