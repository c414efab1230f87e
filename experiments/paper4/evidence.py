"""Evidence tables of the paper4 runs: several seeds per policy, total idle as the headline.

    .venv/bin/python experiments/paper4/evidence.py RESULTS_DIR     # one truth (written by reproduce.py)
    .venv/bin/python experiments/paper4/evidence.py --combine       # all of evidence/*/ -> experiments/results/evidence.md

Reads RESULTS/manifest.json and RESULTS/runs/paper-<policy>-seed<k>/ (idle.jsonl,
metrics.jsonl, eval.jsonl from `geodiloco evaluate`). Per policy, over seeds (mean and
min..max): waiting and total GPU idle (wait + exposed sync + other) as shares of node
time, for rounds 1+ (after the one round every policy plans from its prior alone) and
for all rounds; their change against uniform of the same seed; and eval loss at equal
tokens and at equal wall-clock with the eval set's standard error. Writes evidence.md,
evidence.json and loss.png into RESULTS.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from configs import POLICIES, ROOT  # noqa: E402
from results_data import read_jsonl, report_json  # noqa: E402
from runner import display_path  # noqa: E402

from geodiloco.report.readme_block import replace_marked_block  # noqa: E402

EVIDENCE_ROOT = ROOT / "experiments" / "paper4" / "evidence"
COMBINED = ROOT / "experiments" / "results" / "evidence.md"
WAN_TEXT = {
    "literal": "the paper's 1 Gbit/s",
    "scaled": "the sync takes the share of a round that llama-150m's takes at 1 Gbit/s",
}
TRUTH_TEXT = {
    "virtual": "virtual GPUs: each step padded with sleep to the paper-fitted time of the node (the predictor's "
               "t(B) shape x a per-node offset the planner does not read), no jitter",
    "real": "real compute: each node trains in a cgroup with a CPU share in the paper's proportions "
            "(sum 1.6 cores); step times, t(B) shape and noise are this CPU's",
}


def run_numbers(run_dir: Path) -> dict:
    """Idle shares (all rounds and rounds 1+) and the eval curve of one run."""
    every = report_json(run_dir, ROOT)
    warm = report_json(run_dir, ROOT, skip_rounds=1)
    idle = read_jsonl(run_dir / "idle.jsonl")
    start_s = min(row["round_start"] for row in idle)
    metrics = {row["round"]: row for row in read_jsonl(run_dir / "metrics.jsonl") if row.get("node") == "global"}
    evals = sorted(read_jsonl(run_dir / "eval.jsonl"), key=lambda row: row["round"])
    tokens = np.cumsum([metrics[row["round"]]["tokens"] for row in evals]).astype(float)
    return {
        "policy": every["policy"],
        "wait_share": every["total"]["wait_s"] / every["total"]["wall_s"],
        "idle_share": every["total"]["idle_s"] / every["total"]["wall_s"],
        "warm_wait_share": warm["total"]["wait_s"] / warm["total"]["wall_s"],
        "warm_idle_share": warm["total"]["idle_s"] / warm["total"]["wall_s"],
        "warm_sync_share": warm["total"]["comm_s"] / warm["total"]["wall_s"],
        "curve_tokens": tokens.tolist(),
        "curve_wall_s": [metrics[row["round"]]["wall_s"] - start_s for row in evals],
        "curve_loss": [row["eval_loss"] for row in evals],
        "curve_se": [row["eval_loss_se"] for row in evals],
        "eval_sequences": evals[0]["sequences"] if evals else 0,
    }


def interpolate(xs: list[float], ys: list[float], value: float) -> float:
    if not xs or value < xs[0] - 1e-9 or value > xs[-1] + 1e-9:
        return float("nan")
    return float(np.interp(value, xs, ys))


def spread(values: list[float]) -> dict:
    finite = [value for value in values if value == value]
    if not finite:
        return {"mean": float("nan"), "min": float("nan"), "max": float("nan"), "std": float("nan"), "n": 0}
    return {"mean": statistics.fmean(finite), "min": min(finite), "max": max(finite),
            "std": statistics.stdev(finite) if len(finite) > 1 else 0.0, "n": len(finite)}


def load_runs(results: Path) -> dict[str, dict[int, dict]]:
    """{policy: {seed: numbers}} from RESULTS/runs/paper-<policy>-seed<k>/."""
    runs: dict[str, dict[int, dict]] = {}
    for run_dir in sorted((results / "runs").glob("paper-*-seed*")):
        if not (run_dir / "eval.jsonl").is_file():
            continue
        policy, _, seed = run_dir.name[len("paper-"):].rpartition("-seed")
        runs.setdefault(policy, {})[int(seed)] = run_numbers(run_dir)
    return runs


def policy_rows(runs: dict[str, dict[int, dict]]) -> tuple[list[dict], float, float]:
    """Per policy, the spread over seeds of every figure; and the equal-tokens / equal-wall points."""
    every_run = [numbers for by_seed in runs.values() for numbers in by_seed.values()]
    equal_tokens = min(numbers["curve_tokens"][-1] for numbers in every_run)
    equal_wall_s = min(numbers["curve_wall_s"][-1] for numbers in every_run)
    uniform = runs.get("uniform", {})
    rows = []
    for policy in [p for p in POLICIES if p in runs]:
        by_seed = runs[policy]
        row = {"policy": policy, "seeds": sorted(by_seed)}
        for key in ("wait_share", "idle_share", "warm_wait_share", "warm_idle_share", "warm_sync_share"):
            row[key] = spread([numbers[key] for numbers in by_seed.values()])
        for key in ("warm_wait_share", "warm_idle_share", "wait_share", "idle_share"):
            row[f"{key}_vs_uniform"] = spread([numbers[key] / uniform[seed][key] - 1.0
                                               for seed, numbers in by_seed.items()
                                               if seed in uniform and uniform[seed][key] > 0])
        row["loss_at_equal_tokens"] = spread([interpolate(n["curve_tokens"], n["curve_loss"], equal_tokens)
                                              for n in by_seed.values()])
        row["loss_at_equal_wall"] = spread([interpolate(n["curve_wall_s"], n["curve_loss"], equal_wall_s)
                                            for n in by_seed.values()])
        row["final_loss"] = spread([n["curve_loss"][-1] for n in by_seed.values()])
        for key, axis, point in (("tokens", "curve_tokens", equal_tokens), ("wall", "curve_wall_s", equal_wall_s)):
            row[f"loss_at_equal_{key}_vs_uniform"] = spread([
                interpolate(n[axis], n["curve_loss"], point) - interpolate(uniform[seed][axis],
                                                                           uniform[seed]["curve_loss"], point)
                for seed, n in by_seed.items() if seed in uniform])
        row["eval_se"] = spread([n["curve_se"][-1] for n in by_seed.values() if n["curve_se"][-1] is not None])
        rows.append(row)
    return rows, equal_tokens, equal_wall_s


def pct(stats: dict, signed: bool = False) -> str:
    if stats["n"] == 0:
        return "-"
    sign = "+" if signed else ""
    return (f"{100 * stats['mean']:{sign}.1f} % ({100 * stats['min']:{sign}.1f}..{100 * stats['max']:{sign}.1f})"
            if stats["n"] > 1 else f"{100 * stats['mean']:{sign}.1f} %")


def loss_text(stats: dict) -> str:
    if stats["n"] == 0:
        return "-"
    return f"{stats['mean']:.3f} ± {stats['std']:.3f}"


def delta_text(stats: dict) -> str:
    if stats["n"] == 0:
        return "-"
    return f"{stats['mean']:+.3f} ± {stats['std']:.3f}"


def markdown(header: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])


def idle_table(rows: list[dict], warm: bool) -> str:
    prefix = "warm_" if warm else ""
    header = ["policy", "total GPU idle (% of node time)", "vs uniform", "waiting (% of node time)", "vs uniform"]
    lines = [[row["policy"], pct(row[f"{prefix}idle_share"]), pct(row[f"{prefix}idle_share_vs_uniform"], True),
              pct(row[f"{prefix}wait_share"]), pct(row[f"{prefix}wait_share_vs_uniform"], True)] for row in rows]
    return markdown(header, lines)


def convergence_table(rows: list[dict], equal_tokens: float, equal_wall_s: float) -> str:
    header = ["policy", f"eval loss @ {equal_tokens / 1e3:.0f} k tokens", "vs uniform, same seed",
              f"eval loss @ {equal_wall_s:.0f} s", "vs uniform, same seed", "final eval loss", "eval standard error"]
    lines = [[row["policy"], loss_text(row["loss_at_equal_tokens"]), delta_text(row["loss_at_equal_tokens_vs_uniform"]),
              loss_text(row["loss_at_equal_wall"]), delta_text(row["loss_at_equal_wall_vs_uniform"]),
              loss_text(row["final_loss"]), f"{row['eval_se']['mean']:.3f}" if row["eval_se"]["n"] else "-"]
             for row in rows]
    return markdown(header, lines)


def loss_figure(runs: dict[str, dict[int, dict]], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for policy in [p for p in POLICIES if p in runs]:
        for position, (seed, numbers) in enumerate(sorted(runs[policy].items())):
            label = policy if position == 0 else None
            color = f"C{POLICIES.index(policy)}"
            axes[0].plot(numbers["curve_wall_s"], numbers["curve_loss"], color=color, alpha=0.7, label=label)
            axes[1].plot(np.asarray(numbers["curve_tokens"]) / 1e3, numbers["curve_loss"], color=color, alpha=0.7)
    axes[0].set_xlabel("wall-clock (s since the run started)")
    axes[1].set_xlabel("tokens (thousands)")
    for axis in axes:
        axis.set_ylabel("eval loss (nats/token)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def describe(manifest: dict) -> str:
    scaling = manifest["scaling"]
    shares = manifest.get("cpu_shares")
    share_text = (" CPU shares (cores): " + ", ".join(f"{name} {value:g}" for name, value in shares.items()) + "."
                  if shares else "")
    return (f"Truth: {TRUTH_TEXT[manifest['truth']]}.{share_text} Planner prior: the predictor for the nodes' GPU "
            f"names (llama-150m GPU seconds), calibrated only by measured steps. {manifest['seeds']} seeds per policy, "
            f"{scaling['rounds']} rounds, baseline H = {scaling['local_steps']}, batch 4, data shards "
            f"`{manifest['shards']}`; WAN {manifest['bandwidth_mbps']:.1f} Mbit/s per site ({scaling['wan']}: "
            f"{WAN_TEXT[scaling['wan']]}); "
            f"sites: {manifest['sites']}.")


def analyze(results: Path) -> str:
    manifest = json.loads((results / "manifest.json").read_text())
    runs = load_runs(results)
    if not runs:
        raise SystemExit(f"evidence: no runs with eval.jsonl under {results / 'runs'}")
    rows, equal_tokens, equal_wall_s = policy_rows(runs)
    label = f"{manifest['truth']}-{manifest['scaling']['wan']}-{manifest['shards']}"
    loss_figure(runs, results / "loss.png", f"paper4 cluster, {label} truth: eval loss per seed")
    sequences = next(iter(next(iter(runs.values())).values()))["eval_sequences"]
    text = "\n".join([
        f"# Paper4 evidence: {label}", "",
        describe(manifest), "",
        "Total GPU idle = waiting for peers + exposed outer sync + other (checkpoint, logging), as a share of "
        "node time; the headline. Mean over seeds (min..max); `vs uniform` is the change against uniform with "
        "the same seed.", "",
        "## Rounds 1+ (after the round every policy plans from its prior alone)", "",
        idle_table(rows, warm=True), "",
        "## All rounds", "",
        idle_table(rows, warm=False), "",
        "## Convergence", "",
        f"Eval loss of each round's global model on {sequences} held-out sequences sampled uniformly from the "
        "whole corpus (`geodiloco evaluate`, after the run), interpolated at the largest token count and "
        "wall-clock every run reached; mean ± std over seeds. `vs uniform, same seed`: the difference to uniform "
        "run with the same seed (same initial model, data order and eval set), mean ± std over seeds; negative "
        "is better. The last column is the eval set's own standard error (std of per-sequence losses / "
        "sqrt(n)): a single loss is known to about twice it; paired differences on one set are known better, "
        "and the seed-to-seed std of the paired difference is the spread to compare against.", "",
        convergence_table(rows, equal_tokens, equal_wall_s), "",
        f"![eval loss]({display_path(results / 'loss.png', results)})", "",
        f"Regenerate: `{manifest['command']}` ({manifest['total_s'] / 60:.0f} min).",
    ])
    (results / "evidence.md").write_text(text + "\n")
    (results / "evidence.json").write_text(json.dumps({"label": label, "manifest": manifest, "rows": rows,
                                                       "equal_tokens": equal_tokens,
                                                       "equal_wall_s": equal_wall_s}, indent=1) + "\n")
    return text


def combine(root: Path = EVIDENCE_ROOT, out: Path = COMBINED) -> str:
    """One headline table over every evidence folder: total idle and waiting vs uniform, rounds 1+."""
    lines = []
    for path in sorted(root.glob("*/evidence.json")):
        data = json.loads(path.read_text())
        for row in data["rows"]:
            lines.append([data["label"], row["policy"], pct(row["warm_idle_share"]),
                          pct(row["warm_idle_share_vs_uniform"], True), pct(row["warm_wait_share"]),
                          pct(row["warm_wait_share_vs_uniform"], True),
                          delta_text(row["loss_at_equal_tokens_vs_uniform"]),
                          delta_text(row["loss_at_equal_wall_vs_uniform"])])
    header = ["truth-wan-shards", "policy", "total GPU idle", "vs uniform", "waiting", "vs uniform",
              "eval loss vs uniform @ equal tokens", "@ equal wall-clock"]
    text = "\n".join([
        "# Balancing against truths the planner did not build", "",
        "The paper's four-node cluster on this machine, every policy, several seeds, rounds 1+ (shares of node "
        "time; mean and min..max over seeds). `real` = real compute under CPU quotas (the planner's prior is "
        "wrong in scale and shape and learns from noisy steps); `virtual` = sleep-padded virtual GPUs. "
        "`literal` = 1 Gbit/s links (the tiny model's sync is negligible); `scaled` = links slowed so the sync "
        "takes the share of a round that llama-150m's takes at 1 Gbit/s. Details per row group: "
        + ", ".join(f"[{p.parent.name}](../paper4/evidence/{p.parent.name}/evidence.md)"
                    for p in sorted(root.glob("*/evidence.json"))) + ".", "",
        markdown(header, lines), "",
        "Regenerate: the `experiments/paper4/run.sh` commands in each folder's evidence.md, then "
        "`.venv/bin/python experiments/paper4/evidence.py --combine`.",
    ])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    return text


README = ROOT / "README.md"
README_START, README_END = "<!-- evidence:start -->", "<!-- evidence:end -->"
README_POLICIES = ("uniform", "steps_by_flops", "time", "hybrid", "adaptive", "deadline")
SIMULATED = ROOT / "experiments" / "results" / "balancer" / "independent_truth.json"


def readme_cell(row: dict) -> str:
    idle, wait = row["warm_idle_share"]["mean"], row["warm_wait_share"]["mean"]
    if row["policy"] == "uniform":
        return f"**{100 * idle:.1f} %** (wait {100 * wait:.1f} %)"
    return (f"**{100 * idle:.1f} %** ({100 * row['warm_idle_share_vs_uniform']['mean']:+.0f} %); wait "
            f"{100 * wait:.1f} % ({100 * row['warm_wait_share_vs_uniform']['mean']:+.0f} %)")


def simulated_row() -> list[str]:
    """The simulator's CPU-measured-truth scenario in the README table's shape (same cells)."""
    data = json.loads(SIMULATED.read_text())
    by_policy = {row["policy"]: row["seeds"] for row in data["cpu_measured"]}
    uniform = by_policy["uniform"]
    cells = []
    for policy in README_POLICIES:
        seeds = by_policy.get(policy)
        if not seeds:
            cells.append("-")
            continue
        stats = {"policy": policy,
                 "warm_idle_share": spread([seed["warm"]["idle_share"] for seed in seeds]),
                 "warm_wait_share": spread([seed["warm"]["wait_share"] for seed in seeds]),
                 "warm_idle_share_vs_uniform": spread([seed["warm"]["idle_share"] / base["warm"]["idle_share"] - 1
                                                       for seed, base in zip(seeds, uniform)]),
                 "warm_wait_share_vs_uniform": spread([seed["warm"]["wait_share"] / base["warm"]["wait_share"] - 1
                                                       for seed, base in zip(seeds, uniform)])}
        cells.append(readme_cell(stats))
    return [f"simulated: CPU-measured t(B) curves, stragglers + drift, sync at the paper's share, "
            f"{data['seeds']} seeds ([details](experiments/results/balancer/independent_truth.md))"] + cells + ["-"]


def readme_order(path: Path) -> tuple:
    """Real before virtual, 1 Gbit/s before the paper's WAN share, then by name."""
    label = path.parent.name
    return (not label.startswith("real"), "-scaled-" in label, label)


def readme_table(root: Path = EVIDENCE_ROOT) -> str:
    """Total GPU idle (and waiting) per policy and truth, rounds 1+, for the README."""
    header = ["paper's cluster, 3 seeds, rounds 1+"] + [f"`{policy}`" for policy in README_POLICIES] + [
        "`time`: eval loss vs uniform, equal tokens / equal wall-clock"]
    lines = []
    for path in sorted(root.glob("*/evidence.json"), key=readme_order):
        data = json.loads(path.read_text())
        rows = {row["policy"]: row for row in data["rows"]}
        time_row = rows.get("time")
        loss = (f"{delta_text(time_row['loss_at_equal_tokens_vs_uniform'])} / "
                f"{delta_text(time_row['loss_at_equal_wall_vs_uniform'])}"
                if time_row and "loss_at_equal_tokens_vs_uniform" in time_row else "-")
        label = f"[{data['label']}](experiments/paper4/evidence/{path.parent.name}/evidence.md)"
        lines.append([label] + [readme_cell(rows[policy]) if policy in rows else "-" for policy in README_POLICIES]
                     + [loss])
    if SIMULATED.is_file():
        lines.append(simulated_row())
    legend = ("`real` = real compute under CPU quotas, `virtual` = sleep-padded virtual GPUs; `literal` = 1 Gbit/s "
              "links, `scaled` = the sync takes the share of a round that llama-150m's takes at 1 Gbit/s (the "
              "paper's WAN share); `iid` / `non_iid` = data shards. Cells: **total GPU idle** as a share of node "
              "time (change vs uniform of the same seed); waiting (change). Mean over seeds; spreads, all rounds "
              "and all eight policies in each linked file and in "
              "[experiments/results/evidence.md](experiments/results/evidence.md). Regenerate: "
              "`experiments/paper4/run.sh --truth real --seeds 3 --rounds 6 [...]` "
              "(commands in each file), then `.venv/bin/python experiments/paper4/evidence.py --combine`.")
    return markdown(header, lines) + "\n\n" + legend


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="?", type=Path, help="an evidence folder written by reproduce.py")
    parser.add_argument("--combine", action="store_true", help="write experiments/results/evidence.md from all")
    args = parser.parse_args(argv)
    if args.combine:
        print(combine())
        replace_marked_block(README, README_START, README_END, readme_table())
    elif args.results:
        if not (args.results / "manifest.json").is_file():
            parser.error(f"{args.results}: no manifest.json; give an evidence folder written by reproduce.py")
        print(analyze(args.results))
    else:
        parser.error("give RESULTS or --combine")
    return 0


if __name__ == "__main__":
    sys.exit(main())
