"""Outer-sync time, hivemind vs torch.distributed (gloo), same parameter count, same shaped link.

How it is measured: N emulated sites are created on this machine (one network
namespace each, a veth to a shared bridge, tbf at --rate-mbps on both ends of
every link; lab/sites.py). One Python process per site (1 thread) holds a
flat fp32 pseudo-gradient of --numel elements and runs --repeats outer syncs:

- gloo: barrier, then ``runtime.sync.wire.reduce_sum`` (all_reduce SUM of the
  weighted buffer, cast to the wire dtype);
- hivemind: the backend's readiness exchange (DHT barrier), then
  ``HivemindOuterSync.reduce_weighted`` (matchmaking + butterfly all-reduce with
  the chosen codec).

A sync's time is the slowest site's reduce_weighted (what the idle log calls
comm_s); the readiness exchange is timed apart (wait_s when nobody is late).
The ideal is 2(N-1)/N * bytes / rate for both (ring / butterfly). Without root
or network namespaces the sites share loopback, unshaped, and the table says so.

    sudo .venv/bin/python experiments/hivemind/bench_sync.py

prints the table and writes experiments/results/hivemind/sync.{md,json,png}.
About 3 minutes with the defaults.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
RESULTS_DIR = REPO / "experiments" / "results" / "hivemind"
MASTER_PORT = 29640
VARIANTS = {  # name -> (backend, wire dtype / codec, bytes per element on the wire)
    "gloo fp32": ("torch", "none", 4),
    "gloo fp16": ("torch", "fp16", 2),
    "hivemind fp32": ("hivemind", "none", 4),
    "hivemind fp16": ("hivemind", "fp16", 2),
    "hivemind 8bit": ("hivemind", "8bit", 1),
}


@dataclass
class Row:
    """One (sites, variant) cell; seconds, Mbit/s."""

    sites: int
    variant: str
    payload_mb: float
    ideal_s: float
    median_s: float
    best_s: float
    link_use: float
    exchange_median_s: float
    mean_error: float
    samples_s: list[float]


def ideal_s(num_sites: int, payload_bytes: float, rate_mbps: float | None) -> float:
    if rate_mbps is None:
        return float("nan")
    return 2 * (num_sites - 1) / num_sites * payload_bytes * 8 / (rate_mbps * 1e6)


# ----- one site's process --------------------------------------------------------------------------

def site_topology(rank: int, world: int):
    from geodiloco.runtime.comm import Topology
    return Topology(rank=0, world_size=1, node_name=f"site{rank}", node_index=rank, local_rank=0,
                    local_world_size=1, node_ranks=[0], leader_ranks=list(range(world)))


def torch_worker(args: argparse.Namespace) -> list[dict]:
    import datetime

    import torch.distributed as dist

    from geodiloco.runtime.comm import Topology
    from geodiloco.runtime.config import DilocoSection
    from geodiloco.runtime.sync.torch_backend import TorchOuterSync
    from geodiloco.runtime.sync.wire import ErrorFeedback, reduce_sum

    dist.init_process_group("gloo", init_method="env://", rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=600))
    topology = Topology(rank=args.rank, world_size=args.world, node_name=f"site{args.rank}", node_index=args.rank,
                        local_rank=0, local_world_size=1, node_ranks=[args.rank],
                        leader_ranks=list(range(args.world)))
    sync = TorchOuterSync(topology, DilocoSection(compression=args.codec))
    records = []
    for repeat in range(args.repeats):
        flat = pseudo_gradient(args.rank, args.numel)
        started = time.perf_counter()
        sync.barrier()
        ready = time.perf_counter()
        summed = reduce_sum(flat.mul_(1.0 / args.world), args.codec, ErrorFeedback(), sync.sync_group, args.world)
        records.append({"repeat": repeat, "exchange_s": ready - started, "sync_s": time.perf_counter() - ready,
                        "error": mean_error(summed, args)})
    sync.close()
    return records


def hivemind_worker(args: argparse.Namespace) -> list[dict]:

    from geodiloco.runtime.config import HivemindSection
    from geodiloco.runtime.sync.hivemind_backend import INITIAL_PEERS_ENV, MADDRS_FILE_ENV, HivemindOuterSync

    peers_file = Path(args.peers_file)
    if args.rank == 0:
        os.environ[MADDRS_FILE_ENV] = str(peers_file)
    else:
        while not peers_file.is_file():
            time.sleep(0.1)
        os.environ[INITIAL_PEERS_ENV] = ",".join(peers_file.read_text().split())
    options = HivemindSection(host_maddrs=[f"/ip4/{args.address}/tcp/0"], compression=args.codec,
                              start_wait_s=120, heartbeat_ttl_s=30, allreduce_timeout_s=600,
                              chunk_timeout_s=60)
    names = [f"site{rank}" for rank in range(args.world)]
    sync = HivemindOuterSync(site_topology(args.rank, args.world), options, "bench", names, args.numel)
    sync.found({"run_id": "bench"}, options.start_wait_s)
    records = []
    try:
        for repeat in range(args.repeats):
            flat = pseudo_gradient(args.rank, args.numel)
            sync.set_round(repeat, joined=0)
            started = time.perf_counter()
            gathered = sync.exchange({"node": names[args.rank], "round": repeat, "local_rank": 0})
            ready = time.perf_counter()
            summed = sync.reduce_weighted(flat, 1.0 / args.world, total_weight=1.0)
            records.append({"repeat": repeat, "exchange_s": ready - started, "sync_s": time.perf_counter() - ready,
                            "error": mean_error(summed, args), "present": len(gathered)})
    finally:
        sync.close()
    return records


def pseudo_gradient(rank: int, numel: int):
    """A site's stand-in pseudo-gradient: unit normal, seeded by the site (8-bit codecs need spread)."""
    import torch
    return torch.randn(numel, generator=torch.Generator().manual_seed(rank))


def mean_error(summed, args: argparse.Namespace) -> float:
    """Mean |result - exact mean of every site's pseudo-gradient| (the codec's error)."""
    exact = sum(pseudo_gradient(rank, args.numel) for rank in range(args.world)) / args.world
    return float((summed - exact).abs().mean())


MAX_ERROR = {"none": 1e-5, "fp16": 1e-3, "8bit": 0.05}


def worker(args: argparse.Namespace) -> int:
    import torch
    torch.set_num_threads(1)
    records = (torch_worker if args.backend == "torch" else hivemind_worker)(args)
    for record in records:
        print(json.dumps(record), flush=True)
        if not record["error"] <= MAX_ERROR[args.codec]:
            print(f"wrong outer-sync result: mean error {record['error']:.3g} with codec {args.codec}",
                  file=sys.stderr)
            return 1
    return 0


# ----- driver --------------------------------------------------------------------------------------

def site_network(num_sites: int, rate_mbps: float | None, shaped: bool, mtu: int):
    """Emulated sites (network namespaces), or None: every process on loopback."""
    import contextlib

    if not shaped:
        return contextlib.nullcontext(None)
    from geodiloco.lab.sites import SiteLink, netns_sites
    return netns_sites([SiteLink(f"site{i}", rate_mbps) for i in range(num_sites)], prefix="gdhm", mtu=mtu)


def measure(num_sites: int, variant: str, args: argparse.Namespace, shaped: bool, work_dir: Path) -> list[dict]:
    """Per repeat, the slowest site's sync and exchange seconds."""
    from geodiloco.lab.site_procs import SiteProcessError, run_per_site

    backend, codec, _ = VARIANTS[variant]
    peers_file = work_dir / f"peers-{num_sites}-{variant.replace(' ', '_')}.txt"
    peers_file.unlink(missing_ok=True)

    def argv_for_site(rank: int, address: str) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--worker", "--rank", str(rank),
                "--world", str(num_sites), "--numel", str(args.numel), "--repeats", str(args.repeats),
                "--backend", backend, "--codec", codec, "--address", address, "--peers-file", str(peers_file)]

    with site_network(num_sites, args.rate_mbps, shaped, args.mtu) as sites:
        try:
            outputs = run_per_site(argv_for_site, num_sites, sites, master_port=MASTER_PORT,
                                   timeout_s=args.timeout_s, cwd=REPO)
        except SiteProcessError as err:
            raise SystemExit(f"{variant}: {err}") from None
    return [{"sync_s": max(out[repeat]["sync_s"] for out in outputs),
             "exchange_s": max(out[repeat]["exchange_s"] for out in outputs),
             "error": max(out[repeat]["error"] for out in outputs)} for repeat in range(args.repeats)]


def make_row(num_sites: int, variant: str, samples: list[dict], args: argparse.Namespace, shaped: bool) -> Row:
    timed = samples[args.warmup:] or samples
    sync_s = [sample["sync_s"] for sample in timed]
    payload_bytes = args.numel * VARIANTS[variant][2]
    ideal = ideal_s(num_sites, payload_bytes, args.rate_mbps if shaped else None)
    median_s = statistics.median(sync_s)
    return Row(num_sites, variant, payload_bytes / 1e6, ideal, median_s, min(sync_s),
               ideal / median_s if shaped else float("nan"),
               statistics.median(sample["exchange_s"] for sample in timed),
               max(sample["error"] for sample in timed), sync_s)


def machine_description() -> str:
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    import torch
    from importlib.metadata import version
    load = os.getloadavg()[0]
    return (f"{cpu}, {os.cpu_count()} cores (load {load:.1f} at the start), Linux {platform.release()}, "
            f"Python {platform.python_version()}, torch {torch.__version__}, hivemind {version('hivemind')}; "
            "1 thread per process")


def markdown(rows: list[Row], args: argparse.Namespace, shaped: bool, note: str, machine: str) -> str:
    link = (f"emulated sites (network namespaces, tbf {args.rate_mbps:g} Mbit/s on both ends of each site's link, "
            f"MTU {args.mtu})" if shaped else f"loopback, unshaped ({note})")
    lines = [
        "# Outer-sync time: hivemind vs torch.distributed (gloo)",
        "",
        f"One outer sync of {args.numel:,} fp32 pseudo-gradient elements between N sites over {link}. "
        f"Median of {args.repeats - args.warmup} syncs after {args.warmup} warm-up; the time is the slowest "
        "site's `reduce_weighted` (comm_s in idle.jsonl). ideal = 2(N-1)/N x wire bytes / rate; "
        "link use = ideal / measured. exchange = the readiness barrier before it (gloo: barrier; "
        "hivemind: DHT round barrier), with every site ready at once. error = mean |result - exact| "
        "for unit-normal pseudo-gradients (the codec's rounding).",
        "",
        f"Machine: {machine}.",
        f"Command (as root): `{command_line(args)}`",
        "",
        "| sites | variant | wire MB | ideal (s) | median (s) | best (s) | link use | exchange (s) | error |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        use = "-" if row.link_use != row.link_use else f"{row.link_use:.0%}"
        ideal = "-" if row.ideal_s != row.ideal_s else f"{row.ideal_s:.2f}"
        lines.append(f"| {row.sites} | {row.variant} | {row.payload_mb:.1f} | {ideal} | {row.median_s:.2f} "
                     f"| {row.best_s:.2f} | {use} | {row.exchange_median_s:.2f} | {row.mean_error:.1e} |")
    return "\n".join(lines) + "\n"


def command_line(args: argparse.Namespace) -> str:
    words = ["python", "experiments/hivemind/bench_sync.py", "--sites", *map(str, args.sites),
             "--rate-mbps", f"{args.rate_mbps:g}", "--numel", str(args.numel), "--repeats", str(args.repeats),
             "--warmup", str(args.warmup), "--variants", *[f"'{variant}'" for variant in args.variants]]
    return " ".join(words)


def plot(rows: list[Row], args: argparse.Namespace, shaped: bool, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    site_counts = sorted({row.sites for row in rows})
    fig, axes = plt.subplots(1, len(site_counts), figsize=(5.2 * len(site_counts), 4.2), squeeze=False)
    colors = {"gloo": "#4c72b0", "hivemind": "#dd8452"}
    for axis, sites in zip(axes[0], site_counts):
        cells = [row for row in rows if row.sites == sites]
        positions = range(len(cells))
        axis.bar(positions, [row.median_s for row in cells],
                 color=[colors[row.variant.split()[0]] for row in cells])
        if shaped:
            axis.scatter(positions, [row.ideal_s for row in cells], marker="_", s=600, color="black",
                         label="ideal at the link rate", zorder=3)
            axis.legend(loc="upper right", fontsize=8)
        axis.set_xticks(list(positions), [row.variant.replace(" ", "\n") for row in cells], fontsize=8)
        axis.set_title(f"{sites} sites")
        axis.set_ylabel("outer sync (s, median)")
    link = f"{args.rate_mbps:g} Mbit/s tbf links" if shaped else "loopback, unshaped"
    fig.suptitle(f"Outer sync of {args.numel / 1e6:.1f} M fp32 elements, {link}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sites", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--rate-mbps", type=float, default=100.0)
    parser.add_argument("--numel", type=int, default=4_000_000, help="pseudo-gradient elements (fp32)")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="first syncs left out (hivemind's first is slow)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--timeout-s", type=float, default=600)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--world", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="torch", help=argparse.SUPPRESS)
    parser.add_argument("--codec", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--address", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--peers-file", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    from geodiloco.lab.sites import can_use_netns
    shaped, note = can_use_netns()
    if not shaped:
        print(f"note: no emulated sites ({note}); measuring on unshaped loopback", file=sys.stderr)
    machine = machine_description()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="geodiloco-bench-") as work_dir:
        for num_sites in args.sites:
            for variant in args.variants:
                samples = measure(num_sites, variant, args, shaped, Path(work_dir))
                rows.append(make_row(num_sites, variant, samples, args, shaped))
                row = rows[-1]
                print(f"{num_sites} sites {variant:14s} median {row.median_s:6.2f} s  ideal {row.ideal_s:6.2f} s  "
                      f"exchange {row.exchange_median_s:5.2f} s", flush=True)
    table = markdown(rows, args, shaped, note, machine)
    print(table)
    (args.out_dir / "sync.md").write_text(table)
    (args.out_dir / "sync.json").write_text(json.dumps(
        {"machine": machine, "shaped": shaped, "rate_mbps": args.rate_mbps, "numel": args.numel,
         "command": command_line(args), "rows": [asdict(row) for row in rows]}, indent=1))
    plot(rows, args, shaped, args.out_dir / "sync.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
