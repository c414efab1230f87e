"""Figure (b): outer-sync time of a llama-150m-sized all-reduce over emulated 1 Gbit/s sites.

How it is measured: for N in --sites, N emulated sites are created on this
machine (one network namespace each, a veth to a shared bridge, tbf at
--rate-mbps on both ends of every link; see docs/sites.md). One Python process
per site (1 thread) joins a gloo process group at the site's address and
all-reduces a buffer with the parameter count of ``PRESETS[--preset]`` (float32,
and float16 = the runtime's fp16 compression). Each timed all-reduce starts
after a barrier; its time is the slowest rank's. The ideal is a ring all-reduce
at the link rate, 2(N-1)/N * bytes / rate; "link use" = ideal / measured.

    sudo .venv/bin/python experiments/runtime/bench_outer_sync.py

prints the table (with the same all-reduce over unshaped links: the CPU
floor) and writes experiments/results/runtime/outer_sync.{md,json,png}.
Needs root (network namespaces). About 4 minutes with the defaults.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS_DIR = REPO / "experiments" / "results" / "runtime"
BYTES_PER_ELEMENT = {"float32": 4, "float16": 2, "bfloat16": 2}
MASTER_PORT = 29620


def llama_param_count(preset: str) -> int:
    """Embedding + layers (4h^2 attention + 3hi SwiGLU MLP + 2h norms) + final norm + untied head."""
    from geodiloco.predictor.workload import PRESETS

    dims = PRESETS[preset]
    h, i, vocab = dims.hidden_size, dims.intermediate_size, dims.vocab_size
    per_layer = 4 * h * h + 3 * h * i + 2 * h
    head = 0 if dims.tie_embeddings else h * vocab
    return vocab * h + dims.num_layers * per_layer + h + head


def ideal_ring_s(num_sites: int, payload_bytes: int, rate_mbps: float) -> float:
    """Ring all-reduce lower bound: each site sends and receives 2(N-1)/N of the buffer at the link rate."""
    return 2 * (num_sites - 1) / num_sites * payload_bytes * 8 / (rate_mbps * 1e6)


@dataclass
class Row:
    """One (sites, dtype) cell of the table; times in seconds, rates in Mbit/s."""

    sites: int
    dtype: str
    payload_mb: float
    ideal_s: float
    median_s: float
    best_s: float
    link_use: float
    bus_mbps: float
    samples_s: list[float]
    unshaped_median_s: float | None = None


def worker(args: argparse.Namespace) -> int:
    """One site's process: join the group, time all-reduces of each dtype, print one JSON line each."""
    import datetime
    import time

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=600))
    for dtype_name in args.dtypes:
        buffer = torch.ones(args.numel, dtype=getattr(torch, dtype_name))
        for repeat in range(args.repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(buffer)
            elapsed_s = time.perf_counter() - start
            print(json.dumps({"dtype": dtype_name, "repeat": repeat, "elapsed_s": elapsed_s}), flush=True)
        expected = float(args.world ** args.repeats)
        if buffer[0].item() != expected or buffer[-1].item() != expected:
            print(f"wrong all-reduce result: {buffer[0].item()} != {expected}", file=sys.stderr)
            return 1
        del buffer
    dist.destroy_process_group()
    return 0


def measure(num_sites: int, args: argparse.Namespace, rate_mbps: float | None) -> dict[str, list[float]]:
    """Per dtype, the slowest rank's time of each repeat (``rate_mbps`` None = unshaped links)."""
    from geodiloco.lab.site_procs import SiteProcessError, run_per_site
    from geodiloco.lab.sites import SiteLink, netns_sites

    def argv_for_site(rank: int, _address: str) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--worker", "--rank", str(rank),
                "--world", str(num_sites), "--numel", str(args.numel), "--repeats", str(args.repeats),
                "--dtypes", *args.dtypes]

    links = [SiteLink(f"site{i}", rate_mbps) for i in range(num_sites)]
    with netns_sites(links, prefix="gdlb", mtu=args.mtu) as sites:
        try:
            outputs = run_per_site(argv_for_site, num_sites, sites, master_port=MASTER_PORT,
                                   timeout_s=args.timeout_s)
        except SiteProcessError as err:
            raise SystemExit(str(err)) from None
    times: dict[str, list[float]] = {}
    for dtype_name in args.dtypes:
        for repeat in range(args.repeats):
            times.setdefault(dtype_name, []).append(max(
                rec["elapsed_s"] for out in outputs for rec in out
                if rec["dtype"] == dtype_name and rec["repeat"] == repeat))
    return times


def make_row(num_sites: int, dtype_name: str, samples_s: list[float], args: argparse.Namespace,
             unshaped_s: list[float] | None = None) -> Row:
    payload_bytes = args.numel * BYTES_PER_ELEMENT[dtype_name]
    ideal_s = ideal_ring_s(num_sites, payload_bytes, args.rate_mbps)
    median_s = statistics.median(samples_s)
    bus_mbps = 2 * (num_sites - 1) / num_sites * payload_bytes * 8 / median_s / 1e6
    return Row(num_sites, dtype_name, payload_bytes / 1e6, ideal_s, median_s, min(samples_s),
               ideal_s / median_s, bus_mbps, samples_s,
               statistics.median(unshaped_s) if unshaped_s else None)


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}, "
            f"torch {torch.__version__} (gloo on CPU, 1 thread per process)")


def command_line(args: argparse.Namespace) -> str:
    """The command that reproduces this table (output directory left out)."""
    words = ["python", "experiments/runtime/bench_outer_sync.py", "--sites", *map(str, args.sites),
             "--rate-mbps", f"{args.rate_mbps:g}", "--preset", args.preset, "--dtypes", *args.dtypes,
             "--repeats", str(args.repeats), "--mtu", str(args.mtu)]
    if args.numel_overridden:
        words += ["--numel", str(args.numel)]
    if not args.unshaped:
        words.append("--no-unshaped")
    return " ".join(words)


def markdown_table(rows: list[Row], args: argparse.Namespace, machine: str) -> str:
    size_note = "an overridden element count" if args.numel_overridden else f"the `{args.preset}` parameter count"
    lines = [
        f"# Outer-sync time over emulated {args.rate_mbps:g} Mbit/s links",
        "",
        f"All-reduce of {args.numel:,} elements ({size_note}) between N emulated sites "
        f"(network namespaces, tbf {args.rate_mbps:g} Mbit/s on both ends of each site's link, MTU {args.mtu}). "
        f"Median of {args.repeats} runs; ideal = ring all-reduce 2(N-1)/N * bytes / rate; "
        "link use = ideal / measured (goal >= 80 %). \"unshaped\" = the same all-reduce without tbf: "
        "the floor set by this machine's CPUs (kernel networking and the reduction of every site on shared cores).",
        "",
        f"Machine: {machine}.",
        f"Command (as root): `{command_line(args)}`",
        "",
        "| sites | dtype | payload (MB) | ideal (s) | measured median (s) | best (s) | bus bandwidth (Mbit/s) "
        "| link use | unshaped (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row.sites} | {row.dtype} | {row.payload_mb:.1f} | {row.ideal_s:.2f} | {row.median_s:.2f} "
                     f"| {row.best_s:.2f} | {row.bus_mbps:.0f} | {row.link_use:.0%} "
                     f"| {'-' if row.unshaped_median_s is None else f'{row.unshaped_median_s:.2f}'} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{row.sites} sites\n{row.dtype}" for row in rows]
    positions = range(len(rows))
    fig, ax = plt.subplots(figsize=(7, 3.8))
    ax.bar([p - 0.2 for p in positions], [row.ideal_s for row in rows], width=0.4, label="ideal ring all-reduce")
    bars = ax.bar([p + 0.2 for p in positions], [row.median_s for row in rows], width=0.4, label="measured (median)")
    for bar, row in zip(bars, rows):
        ax.annotate(f"{row.link_use:.0%}", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(positions), labels)
    ax.set_ylabel("outer sync time (s)")
    ax.set_title(f"{args.preset} all-reduce over {args.rate_mbps:g} Mbit/s emulated links (label: link use)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sites", type=int, nargs="+", default=[2, 4], help="site counts to measure")
    parser.add_argument("--rate-mbps", type=float, default=1000.0, help="link rate each way (Mbit/s)")
    parser.add_argument("--preset", default="llama-150m", help="model preset whose parameter count is reduced")
    parser.add_argument("--numel", type=int, default=None, help="override the element count (quick checks)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16"], choices=sorted(BYTES_PER_ELEMENT))
    parser.add_argument("--repeats", type=int, default=3, help="timed all-reduces per dtype and site count")
    parser.add_argument("--no-unshaped", dest="unshaped", action="store_false",
                        help="skip the unshaped (CPU floor) measurement")
    parser.add_argument("--mtu", type=int, default=1500, help="link MTU in bytes")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up on a site count after this")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR, help="where outer_sync.{md,json,png} go")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        return worker(args)
    from geodiloco.lab.sites import can_use_netns

    ok, reason = can_use_netns()
    if not ok:
        print(f"cannot emulate sites here: {reason}", file=sys.stderr)
        return 1
    args.numel_overridden = args.numel is not None
    args.numel = args.numel or llama_param_count(args.preset)
    load_before = os.getloadavg()[0]
    rows = []
    for num_sites in args.sites:
        times = measure(num_sites, args, args.rate_mbps)
        floor = measure(num_sites, args, None) if args.unshaped else {}
        for dtype_name in args.dtypes:
            rows.append(make_row(num_sites, dtype_name, times[dtype_name], args, floor.get(dtype_name)))
            print(f"{num_sites} sites {dtype_name}: {rows[-1].median_s:.2f} s (ideal {rows[-1].ideal_s:.2f} s, "
                  f"link use {rows[-1].link_use:.0%})", flush=True)
    machine = f"{machine_description()}; 1-minute load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after"
    table = markdown_table(rows, args, machine)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "outer_sync.md").write_text(table)
    (args.out / "outer_sync.json").write_text(json.dumps({
        "preset": args.preset, "numel": args.numel, "rate_mbps": args.rate_mbps, "mtu": args.mtu,
        "repeats": args.repeats, "machine": machine, "rows": [asdict(row) for row in rows]}, indent=2) + "\n")
    plot(rows, args, args.out / "outer_sync.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
