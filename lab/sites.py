"""Emulated sites on one machine: one network namespace per site, shaped links to a shared bridge.

Layout for N sites (all names live only inside the namespaces created here)::

    <prefix>-<owner>-s0 [wan0 10.213.0.1] --veth--> [s0]
    <prefix>-<owner>-s1 [wan0 10.213.0.2] --veth--> [s1]  br0 in <prefix>-<owner>-br
    ...

``bandwidth_mbps`` puts a ``tbf`` qdisc on both ends of the site's link, so the
site's upload (``wan0`` egress) and download (``sI`` egress) are each limited to
that rate. ``latency_ms`` > 0 replaces the veth by two TAP devices joined by a
userspace delay line (:mod:`lab.delayline`) that delays every frame by
``latency_ms`` each way; a packet between two sites crosses both sites' links,
so its one-way delay is the sum of their ``latency_ms``.

``<owner>`` is the creating process id (plus a sequence number), so parallel
runs never collide and namespaces left by a crashed run (owner no longer alive)
are removed by :func:`cleanup_stale`. ``python -m geodiloco.lab.sites up`` uses the
owner ``m`` (manual) and keeps the sites until ``down``.
"""
from __future__ import annotations

import argparse
import glob
import ipaddress
import itertools
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from geodiloco.common.schema import ConfigError
from geodiloco.lab.pids import process_alive

SITE_IFNAME = "wan0"
BRIDGE_IFNAME = "br0"
DEFAULT_PREFIX = "gdl"
DEFAULT_SUBNET = "10.213.0.0/24"
MANUAL_OWNER = "m"
TBF_MIN_BURST_BYTES = 64 * 1024
TBF_BURST_S = 0.002
TBF_QUEUE_LATENCY_MS = 50
DELAYLINE_READY_TIMEOUT_S = 10.0
DELAYLINE_STOP_TIMEOUT_S = 3.0
_PREFIX_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_sequence = itertools.count()


NETNS_RUN_DIR = "/run/netns"
"""Where ``ip netns add`` keeps the namespace handles that ``nsenter --net`` opens."""


class SitesError(RuntimeError):
    """Creating or removing emulated sites failed; the message names the command and its error."""


@dataclass(frozen=True)
class SiteLink:
    """One site's link to the others: ``bandwidth_mbps`` (Mbit/s each way, None = unshaped), one-way ``latency_ms``."""

    name: str
    bandwidth_mbps: float | None = None
    latency_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("SiteLink.name must be a non-empty string")
        if self.bandwidth_mbps is not None and self.bandwidth_mbps <= 0:
            raise ValueError(f"SiteLink {self.name!r}: bandwidth_mbps must be > 0 or None (unshaped), got {self.bandwidth_mbps}")
        if self.latency_ms < 0:
            raise ValueError(f"SiteLink {self.name!r}: latency_ms must be >= 0, got {self.latency_ms}")


@dataclass(frozen=True)
class Site:
    """A created site: its namespace, its address and the interface gloo must bind to."""

    name: str
    namespace: str
    address: str
    ifname: str
    bandwidth_mbps: float | None
    latency_ms: float

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this site's network namespace, with the host's mounts.

        ``nsenter --net`` rather than ``ip netns exec``: the latter also gives the process
        a private /sys without the cgroup mounts, so a real-compute node could not set its
        CPU quota (``emulate.cpu_share``) from inside its site.
        """
        return ["nsenter", f"--net={NETNS_RUN_DIR}/{self.namespace}", "--", *argv]


@dataclass
class Sites:
    """The sites of one emulated network; index by position or by site name."""

    owner: str
    prefix: str
    bridge_namespace: str
    sites: list[Site]
    subnet: str
    mtu: int
    delay_lines: list[subprocess.Popen] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return len(self.sites)

    def __iter__(self) -> Iterator[Site]:
        return iter(self.sites)

    def __getitem__(self, key: int | str) -> Site:
        if isinstance(key, int):
            return self.sites[key]
        for site in self.sites:
            if site.name == key:
                return site
        raise KeyError(f"no site named {key!r}; sites: {', '.join(s.name for s in self.sites)}")

    @property
    def namespaces(self) -> list[str]:
        return [site.namespace for site in self.sites] + [self.bridge_namespace]

    @property
    def master_addr(self) -> str:
        """Address of the first site: where the rendezvous / TCP store listens."""
        return self.sites[0].address

    def command(self, site: int | str, argv: Sequence[str]) -> list[str]:
        """``nsenter --net=/run/netns/<namespace> -- argv...`` for a process of ``site`` (see Site.command)."""
        return self[site].command(argv)

    def env(self, site: int | str, master_port: int | None = None,
            base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for a process of ``site``: ``base`` (default: ours) + MASTER_ADDR and the socket interface.

        gloo binds to 127.0.0.1 unless ``GLOO_SOCKET_IFNAME`` names the site's interface.
        """
        env = dict(os.environ if base is None else base)
        env["MASTER_ADDR"] = self.master_addr
        if master_port is not None:
            env["MASTER_PORT"] = str(master_port)
        env["GLOO_SOCKET_IFNAME"] = self[site].ifname
        env["TP_SOCKET_IFNAME"] = self[site].ifname
        return env


def run_ip(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    """Run an ``ip``/``tc`` command; on failure raise SitesError with the command and its stderr."""
    result = subprocess.run(list(argv), capture_output=True, text=True)
    if check and result.returncode != 0:
        raise SitesError(f"`{' '.join(argv)}` failed: {result.stderr.strip() or result.stdout.strip()}")
    return result


def list_namespaces() -> list[str]:
    result = run_ip(["ip", "netns", "list"], check=False)
    return [line.split()[0] for line in result.stdout.splitlines() if line.strip()]


def can_use_netns() -> tuple[bool, str]:
    """Whether this process can build emulated sites, and if not, why (for a printed skip reason)."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "creating network namespaces needs root (effective uid 0)"
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("nsenter", "util-linux")):
        if shutil.which(tool) is None:
            return False, f"`{tool}` ({package}) is not installed"
    probe = f"{DEFAULT_PREFIX}probe{os.getpid()}x{next(_sequence)}"
    created = run_ip(["ip", "netns", "add", probe], check=False)
    if created.returncode != 0:
        return False, f"`ip netns add` failed: {created.stderr.strip()}"
    try:
        veth = run_ip(["ip", "-n", probe, "link", "add", "p0", "type", "veth", "peer", "name", "p1"], check=False)
        if veth.returncode != 0:
            return False, f"cannot create a veth pair: {veth.stderr.strip()}"
        tbf = run_ip(["tc", "-n", probe, "qdisc", "add", "dev", "p0", "root", "tbf",
                      "rate", "100mbit", "burst", "64kb", "latency", "50ms"], check=False)
        if tbf.returncode != 0:
            return False, f"the kernel refuses a tbf qdisc: {tbf.stderr.strip()}"
    finally:
        run_ip(["ip", "netns", "del", probe], check=False)
    return True, "network namespaces, veth and tbf are available"


def can_use_tap() -> tuple[bool, str]:
    """Whether TAP devices (needed for ``latency_ms`` > 0) can be created."""
    if not os.path.exists("/dev/net/tun"):
        return False, "/dev/net/tun is missing (no TUN/TAP support), so latency_ms cannot be emulated"
    return True, "/dev/net/tun is available"


def tbf_rate(bandwidth_mbps: float) -> str:
    """``tc`` rate string; tc's ``kbit`` is 1000 bit/s."""
    return f"{round(bandwidth_mbps * 1000)}kbit"


def tbf_burst_bytes(bandwidth_mbps: float, mtu: int) -> int:
    """Bucket size: ``TBF_BURST_S`` of traffic at the rate, at least 64 KiB and a few frames."""
    rate_bytes_per_s = bandwidth_mbps * 1e6 / 8.0
    return int(max(TBF_MIN_BURST_BYTES, 4 * (mtu + 14), rate_bytes_per_s * TBF_BURST_S))


def shape(namespace: str, ifname: str, bandwidth_mbps: float, mtu: int) -> None:
    """Limit ``ifname``'s egress to ``bandwidth_mbps`` with a tbf qdisc."""
    run_ip(["tc", "-n", namespace, "qdisc", "replace", "dev", ifname, "root", "tbf",
            "rate", tbf_rate(bandwidth_mbps), "burst", str(tbf_burst_bytes(bandwidth_mbps, mtu)),
            "latency", f"{TBF_QUEUE_LATENCY_MS}ms"])


def namespace_owner(namespace: str, prefix: str) -> str | None:
    """The ``<owner>`` part of ``<prefix>-<owner>-<role>``, or None if the name is not one of ours."""
    match = re.fullmatch(re.escape(prefix) + r"-([0-9]+x[0-9]+|" + MANUAL_OWNER + r")-(br|s[0-9]+)", namespace)
    return match.group(1) if match else None


def owner_alive(owner: str) -> bool:
    """Whether the process that created namespaces with this owner tag is still running."""
    if owner == MANUAL_OWNER:
        return True
    return process_alive(int(owner.split("x")[0]))


def site_traffic(sites: "Sites") -> dict[str, dict[str, int]]:
    """Bytes each site's ``wan0`` has sent and received so far (kernel counters, Ethernet frames
    with their headers), keyed by site name; a site whose counters cannot be read is left out."""
    traffic = {}
    for site in sites:
        result = run_ip(["ip", "-n", site.namespace, "-s", "-j", "link", "show", SITE_IFNAME], check=False)
        try:
            stats = json.loads(result.stdout)[0]["stats64"]
        except (ValueError, IndexError, KeyError):
            continue
        traffic[site.name] = {"tx_bytes": int(stats["tx"]["bytes"]), "rx_bytes": int(stats["rx"]["bytes"])}
    return traffic


def delete_namespaces(namespaces: Sequence[str]) -> list[str]:
    """Delete namespaces (their veths go with them); return the error lines of those that failed."""
    errors = []
    for namespace in namespaces:
        result = run_ip(["ip", "netns", "del", namespace], check=False)
        if result.returncode != 0 and "No such file" not in result.stderr:
            errors.append(f"{namespace}: {result.stderr.strip()}")
    return errors


def cleanup_stale(prefix: str = DEFAULT_PREFIX, include_manual: bool = False) -> list[str]:
    """Delete this prefix's namespaces whose creating process is gone (a crashed run); return their names."""
    stale = []
    for namespace in list_namespaces():
        owner = namespace_owner(namespace, prefix)
        if owner is None:
            continue
        if (owner == MANUAL_OWNER and include_manual) or not owner_alive(owner):
            stale.append(namespace)
    stop_detached_delay_lines(stale)
    delete_namespaces(stale)
    return stale


def _validate(links: Sequence[SiteLink], prefix: str, subnet: str, mtu: int) -> ipaddress.IPv4Network:
    if not links:
        raise ValueError("netns_sites needs at least one SiteLink")
    names = [link.name for link in links]
    if len(set(names)) != len(names):
        raise ValueError(f"site names must be unique, got {names}")
    if not _PREFIX_PATTERN.match(prefix):
        raise ValueError(f"prefix must be 1-12 lowercase letters/digits starting with a letter, got {prefix!r}")
    if not 576 <= mtu <= 65535:
        raise ValueError(f"mtu must be in 576..65535 bytes, got {mtu}")
    network = ipaddress.ip_network(subnet, strict=True)
    if not (network.version == 4 and network.is_private):
        raise ValueError(f"subnet must be a private IPv4 network such as {DEFAULT_SUBNET}, got {subnet}")
    if network.num_addresses - 2 < len(links):
        raise ValueError(f"subnet {subnet} has room for {network.num_addresses - 2} sites, {len(links)} requested")
    return network


def start_delay_line(site_ns: str, bridge_ns: str, port_ifname: str, latency_ms: float,
                     detached: bool) -> subprocess.Popen:
    """Start the delay line that creates and joins the site's two TAP ends; wait until it says ``ready``.

    Attached lines exit when our end of their stdin closes (so also when we die);
    detached ones (manual ``up``) live until their namespaces are deleted.
    """
    argv = [sys.executable, "-m", "geodiloco.lab.delayline", "--a", f"{site_ns}:{SITE_IFNAME}",
            "--b", f"{bridge_ns}:{port_ifname}", "--delay-ms", str(latency_ms)]
    if not detached:
        argv.append("--until-stdin-eof")
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL if detached else subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL if detached else subprocess.PIPE, text=True, start_new_session=detached,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ready, _, _ = select.select([process.stdout], [], [], DELAYLINE_READY_TIMEOUT_S)
    line = process.stdout.readline().strip() if ready else ""
    if line != "ready":
        process.kill()
        _, stderr = process.communicate(timeout=DELAYLINE_STOP_TIMEOUT_S)
        raise SitesError(f"delay line for {site_ns} did not start: {(stderr or '').strip() or 'no ready signal'}")
    process.stdout.close()
    return process


def stop_delay_lines(processes: Sequence[subprocess.Popen]) -> None:
    """Close each line's stdin (its stop signal), then terminate/kill any still running."""
    for process in processes:
        if process.stdin is not None and not process.stdin.closed:
            process.stdin.close()
    for process in processes:
        try:
            process.wait(timeout=DELAYLINE_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=DELAYLINE_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()


def _add_bridge(bridge_ns: str, mtu: int) -> None:
    run_ip(["ip", "netns", "add", bridge_ns])
    run_ip(["ip", "-n", bridge_ns, "link", "set", "lo", "up"])
    run_ip(["ip", "-n", bridge_ns, "link", "add", BRIDGE_IFNAME, "mtu", str(mtu), "type", "bridge"])
    run_ip(["ip", "-n", bridge_ns, "link", "set", BRIDGE_IFNAME, "up"])


def _add_site(sites: Sites, index: int, link: SiteLink, address: str, prefixlen: int,
              detached: bool) -> Site:
    site_ns = f"{sites.prefix}-{sites.owner}-s{index}"
    port = f"s{index}"
    run_ip(["ip", "netns", "add", site_ns])
    sites.sites.append(Site(link.name, site_ns, address, SITE_IFNAME, link.bandwidth_mbps, link.latency_ms))
    run_ip(["ip", "-n", site_ns, "link", "set", "lo", "up"])
    if link.latency_ms > 0:
        sites.delay_lines.append(
            start_delay_line(site_ns, sites.bridge_namespace, port, link.latency_ms, detached))
    else:
        run_ip(["ip", "link", "add", SITE_IFNAME, "netns", site_ns, "type", "veth",
                "peer", "name", port, "netns", sites.bridge_namespace])
    run_ip(["ip", "-n", site_ns, "link", "set", SITE_IFNAME, "mtu", str(sites.mtu), "up"])
    run_ip(["ip", "-n", site_ns, "addr", "add", f"{address}/{prefixlen}", "dev", SITE_IFNAME])
    run_ip(["ip", "-n", sites.bridge_namespace, "link", "set", port, "mtu", str(sites.mtu),
            "master", BRIDGE_IFNAME, "up"])
    if link.bandwidth_mbps is not None:
        shape(site_ns, SITE_IFNAME, link.bandwidth_mbps, sites.mtu)
        shape(sites.bridge_namespace, port, link.bandwidth_mbps, sites.mtu)
    return sites.sites[-1]


def create_sites(links: Sequence[SiteLink], prefix: str = DEFAULT_PREFIX, owner: str | None = None,
                 subnet: str = DEFAULT_SUBNET, mtu: int = 1500, detached: bool = False) -> Sites:
    """Build the namespaces, links, addresses and shaping; on any failure remove what was made and raise.

    Namespaces already carrying this owner tag can only be left by an earlier process
    with the same pid (pid reuse after a crash), so they are removed first.
    """
    network = _validate(links, prefix, subnet, mtu)
    if any(link.latency_ms > 0 for link in links):
        ok, reason = can_use_tap()
        if not ok:
            raise SitesError(reason)
    owner = owner or f"{os.getpid()}x{next(_sequence)}"
    if owner != MANUAL_OWNER:
        delete_namespaces([ns for ns in list_namespaces() if namespace_owner(ns, prefix) == owner])
    sites = Sites(owner=owner, prefix=prefix, bridge_namespace=f"{prefix}-{owner}-br", sites=[],
                  subnet=str(network), mtu=mtu)
    hosts = network.hosts()
    try:
        _add_bridge(sites.bridge_namespace, mtu)
        for index, link in enumerate(links):
            _add_site(sites, index, link, str(next(hosts)), network.prefixlen, detached)
    except BaseException:
        destroy_sites(sites)
        raise
    return sites


def destroy_sites(sites: Sites) -> list[str]:
    """Stop the delay lines and delete every namespace of ``sites``; return error lines (empty = clean)."""
    stop_delay_lines(sites.delay_lines)
    existing = set(list_namespaces())
    return delete_namespaces([ns for ns in sites.namespaces if ns in existing])


def _raise_on_sigterm(signum, _frame) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while the sites exist, so ``finally`` tears them down.

    Only on the main thread and only if nobody else handles SIGTERM already.
    """
    install = (threading.current_thread() is threading.main_thread()
               and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    if install:
        signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        yield
    finally:
        if install:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def netns_sites(links: Sequence[SiteLink], prefix: str = DEFAULT_PREFIX, subnet: str = DEFAULT_SUBNET,
                mtu: int = 1500) -> Iterator[Sites]:
    """Emulated sites for the duration of a ``with`` block, removed on exit, Ctrl+C or SIGTERM.

    First removes namespaces of this prefix left by crashed runs. Processes still
    running inside a site when the block ends keep their network until they exit.
    """
    cleanup_stale(prefix)
    with _sigterm_raises():
        sites = create_sites(links, prefix=prefix, subnet=subnet, mtu=mtu)
        try:
            yield sites
        finally:
            errors = destroy_sites(sites)
            if errors:
                print("warning: could not remove emulated sites: " + "; ".join(errors), file=sys.stderr)


SHAPED_MBPS_RANGE = (0.001, 100_000.0)
"""Link rates a tbf qdisc takes (Mbit/s): tc counts in whole kbit/s, and its bucket is a 32-bit byte count."""
MAX_LATENCY_MS = 10_000.0
"""One-way delays a run can live with: beyond it a site cannot reach the rendezvous store in time."""


def site_links(nodes) -> list[SiteLink]:
    """One SiteLink per node of a cluster config (``balancer.cluster.NodeSpec``), shaped by its ``wan``; a rate or
    delay the kernel cannot emulate is refused here, before any namespace is made."""
    for index, node in enumerate(nodes):
        if node.wan is None:
            continue
        low, high = SHAPED_MBPS_RANGE
        if not low <= node.wan.bandwidth_mbps <= high:
            raise ConfigError(f"nodes[{index}].wan.bandwidth_mbps: {node.wan.bandwidth_mbps:g} Mbit/s cannot be "
                              f"emulated by --sites netns (tbf takes {low:g} to {high:,.0f}); give a rate in that "
                              "range")
        if node.wan.latency_ms > MAX_LATENCY_MS:
            raise ConfigError(f"nodes[{index}].wan.latency_ms: {node.wan.latency_ms:g} ms one way is past "
                              f"{MAX_LATENCY_MS:,.0f} ms, where the sites cannot reach the rendezvous store in "
                              "time; give a shorter delay")
    return [SiteLink(node.name,
                     node.wan.bandwidth_mbps if node.wan else None,
                     node.wan.latency_ms if node.wan else 0.0) for node in nodes]


# ----- command line: python -m geodiloco.lab.sites up|down|status -----

_RATE_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gbit|mbit|kbit)?\s*$", re.IGNORECASE)
_RATE_TO_MBPS = {"gbit": 1000.0, "mbit": 1.0, "kbit": 0.001, None: 1.0}


def parse_rate_mbps(text: str) -> float:
    """``1gbit`` / ``100mbit`` / ``500kbit`` / ``250`` (Mbit/s) -> Mbit/s."""
    match = _RATE_PATTERN.match(text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"rate must look like 1gbit, 100mbit, 500kbit or a number of Mbit/s, got {text!r}")
    unit = match.group(2).lower() if match.group(2) else None
    rate_mbps = float(match.group(1)) * _RATE_TO_MBPS[unit]
    low, high = SHAPED_MBPS_RANGE
    if not low <= rate_mbps <= high:
        raise argparse.ArgumentTypeError(f"rate {text!r} is {rate_mbps:g} Mbit/s; tbf takes {low * 1000:g}kbit to "
                                         f"{high / 1000:g}gbit")
    return rate_mbps


def describe(prefix: str) -> list[dict]:
    """Per live namespace of ``prefix``: owner, address, qdisc of its interfaces."""
    rows = []
    for namespace in sorted(list_namespaces()):
        owner = namespace_owner(namespace, prefix)
        if owner is None:
            continue
        addrs = json.loads(run_ip(["ip", "-n", namespace, "-j", "addr", "show"], check=False).stdout or "[]")
        qdiscs = json.loads(run_ip(["tc", "-n", namespace, "-j", "qdisc", "show"], check=False).stdout or "[]")
        rows.append({
            "namespace": namespace,
            "owner": owner,
            "alive": owner_alive(owner),
            "addresses": [f"{a['local']}/{a['prefixlen']} on {link['ifname']}" for link in addrs
                          for a in link.get("addr_info", []) if a.get("family") == "inet" and link["ifname"] != "lo"],
            "shaping": [f"{q['dev']}: tbf {q['options']['rate'] * 8 / 1e6:g} Mbit/s" for q in qdiscs
                        if q.get("kind") == "tbf" and "rate" in q.get("options", {})],
            "delay": delay_lines_of(namespace),
        })
    return rows


def delay_line_processes(namespace: str) -> list[tuple[int, str]]:
    """(pid, delay in ms as written) of each running delay line with an end in ``namespace`` (from /proc)."""
    found = []
    for cmdline_path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(cmdline_path, "rb") as handle:
                argv = handle.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "geodiloco.lab.delayline" in argv and any(arg.startswith(f"{namespace}:") for arg in argv):
            delay_ms = argv[argv.index("--delay-ms") + 1] if "--delay-ms" in argv else "?"
            found.append((int(cmdline_path.split("/")[2]), delay_ms))
    return found


def delay_lines_of(namespace: str) -> list[str]:
    """``pid: N ms`` for each running delay line with an end in ``namespace``."""
    return [f"pid {pid}: {delay_ms} ms" for pid, delay_ms in delay_line_processes(namespace)]


def stop_detached_delay_lines(namespaces: Sequence[str]) -> None:
    """SIGTERM the delay lines serving ``namespaces``: ``wan_emulate.sh up`` starts them detached, so no
    process holds their stdin to stop them, and they would outlive the namespaces they shaped."""
    for namespace in namespaces:
        for pid, _ in delay_line_processes(namespace):
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGTERM)


def _cmd_up(args) -> int:
    names = args.names.split(",") if args.names else [f"site{i}" for i in range(args.n)]
    if len(names) != args.n:
        print(f"error: --names gives {len(names)} names for {args.n} sites", file=sys.stderr)
        return 2
    if any(namespace_owner(ns, args.prefix) == MANUAL_OWNER for ns in list_namespaces()):
        print(f"error: sites with prefix {args.prefix!r} are already up; run `down` first", file=sys.stderr)
        return 2
    links = [SiteLink(name, args.rate, args.latency_ms) for name in names]
    sites = create_sites(links, prefix=args.prefix, owner=MANUAL_OWNER, subnet=args.subnet,
                         mtu=args.mtu, detached=True)
    for site in sites:
        print(f"{site.name}\t{site.namespace}\t{site.address}\t{site.ifname}")
    print(f"run a process in a site: GLOO_SOCKET_IFNAME={SITE_IFNAME} MASTER_ADDR={sites.master_addr} "
          f"ip netns exec {sites[0].namespace} <command>")
    return 0


def _cmd_down(args) -> int:
    removed = cleanup_stale(args.prefix, include_manual=True)
    print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
    return 0


def _cmd_status(args) -> int:
    from geodiloco.common.console import cli_console
    from rich.table import Table

    rows = describe(args.prefix)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title=f"emulated sites (prefix {args.prefix!r})")
    for column in ("namespace", "owner", "owner alive", "address", "shaping", "delay line"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["namespace"], row["owner"], "yes" if row["alive"] else "no (stale)",
                      "\n".join(row["addresses"]) or "-", "\n".join(row["shaping"]) or "-",
                      "\n".join(row["delay"]) or "-")
    cli_console().print(table)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m geodiloco.lab.sites",
                                     description="Emulated sites in network namespaces with shaped links.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--prefix", default=DEFAULT_PREFIX, help="namespace name prefix (default %(default)s)")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", parents=[common], help="create N sites on a shared bridge and leave them up")
    up.add_argument("n", type=int, help="number of sites")
    up.add_argument("--rate", type=parse_rate_mbps, default=None,
                    help="per-site link rate each way: 1gbit, 100mbit, or Mbit/s (default unshaped)")
    up.add_argument("--latency-ms", type=float, default=0.0, help="one-way delay of each site's link (ms)")
    up.add_argument("--names", default="", help="comma-separated site names (default site0..)")
    up.add_argument("--subnet", default=DEFAULT_SUBNET, help="private IPv4 subnet (default %(default)s)")
    up.add_argument("--mtu", type=int, default=1500, help="MTU of every link in bytes (default %(default)s)")
    up.set_defaults(func=_cmd_up)
    down = commands.add_parser("down", parents=[common], help="remove sites made by `up` and any left by crashed runs")
    down.set_defaults(func=_cmd_down)
    status = commands.add_parser("status", parents=[common], help="list the sites, their addresses and shaping")
    status.add_argument("--json", action="store_true", help="print JSON instead of a table")
    status.set_defaults(func=_cmd_status)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "up":
        ok, reason = can_use_netns()
        if not ok:
            print(f"error: {reason}", file=sys.stderr)
            return 1
        if args.n < 1:
            print("error: N must be >= 1", file=sys.stderr)
            return 2
    try:
        return args.func(args)
    except (SitesError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
