"""Emulated sites without root: naming, tbf parameters, rate parsing, the launch script's command."""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
from pathlib import Path

import pytest

from balancer.cluster import NodeSpec
from runtime import sites as sites_mod
from runtime.delayline import Direction, next_wakeup_s, parse_endpoint, write_due_frames
from runtime.sites import Site, SiteLink, Sites, parse_rate_mbps, site_links, tbf_burst_bytes, tbf_rate

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "scripts" / "launch_site.sh"


def make_sites() -> Sites:
    return Sites(owner="1x0", prefix="gdl", bridge_namespace="gdl-1x0-br", subnet="10.213.0.0/24", mtu=1500,
                 sites=[Site("seoul", "gdl-1x0-s0", "10.213.0.1", "wan0", 100.0, 0.0),
                        Site("busan", "gdl-1x0-s1", "10.213.0.2", "wan0", None, 5.0)])


def test_site_link_rejects_bad_values():
    with pytest.raises(ValueError, match="bandwidth_mbps"):
        SiteLink("a", bandwidth_mbps=0)
    with pytest.raises(ValueError, match="latency_ms"):
        SiteLink("a", 10, latency_ms=-1)


def test_sites_lookup_command_and_env():
    sites = make_sites()
    assert sites["busan"].namespace == "gdl-1x0-s1"
    assert sites[0].name == "seoul"
    assert sites.command("busan", ["python", "-c", "pass"]) == [
        "ip", "netns", "exec", "gdl-1x0-s1", "python", "-c", "pass"]
    env = sites.env(1, master_port=29555, base={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "MASTER_ADDR": "10.213.0.1", "MASTER_PORT": "29555",
                   "GLOO_SOCKET_IFNAME": "wan0", "TP_SOCKET_IFNAME": "wan0"}
    assert sites.namespaces == ["gdl-1x0-s0", "gdl-1x0-s1", "gdl-1x0-br"]
    with pytest.raises(KeyError, match="seoul, busan"):
        sites["daegu"]


def test_tbf_rate_and_burst():
    assert tbf_rate(1000) == "1000000kbit"
    assert tbf_rate(2.5) == "2500kbit"
    assert tbf_burst_bytes(100, 1500) == 64 * 1024
    assert tbf_burst_bytes(1000, 1500) == 250_000  # 2 ms at 125 MB/s
    assert tbf_burst_bytes(10, 65000) == 4 * 65014


def test_parse_rate_mbps():
    assert parse_rate_mbps("1gbit") == 1000.0
    assert parse_rate_mbps("100Mbit") == 100.0
    assert parse_rate_mbps("500kbit") == 0.5
    assert parse_rate_mbps("250") == 250.0
    for bad in ("fast", "0mbit", "1tbit"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rate_mbps(bad)


def test_namespace_owner_only_matches_our_names():
    assert sites_mod.namespace_owner("gdl-123x4-s0", "gdl") == "123x4"
    assert sites_mod.namespace_owner("gdl-m-br", "gdl") == "m"
    assert sites_mod.namespace_owner("gdlx-123x4-s0", "gdl") is None
    assert sites_mod.namespace_owner("gdl-123x4-eth0", "gdl") is None
    assert sites_mod.namespace_owner("other", "gdl") is None


def test_validate_rejects_bad_prefix_subnet_and_duplicates():
    link = [SiteLink("a")]
    with pytest.raises(ValueError, match="prefix"):
        sites_mod._validate(link, "Bad-Prefix", "10.213.0.0/24", 1500)
    with pytest.raises(ValueError, match="private"):
        sites_mod._validate(link, "gdl", "8.8.8.0/24", 1500)
    with pytest.raises(ValueError, match="room for 2"):
        sites_mod._validate([SiteLink(str(i)) for i in range(3)], "gdl", "10.0.0.0/30", 1500)
    with pytest.raises(ValueError, match="unique"):
        sites_mod._validate([SiteLink("a"), SiteLink("a")], "gdl", "10.213.0.0/24", 1500)


def test_site_links_from_cluster_nodes():
    nodes = [NodeSpec(name="n1", wan={"bandwidth_mbps": 1000, "latency_ms": 10}), NodeSpec(name="n2")]
    assert site_links(nodes) == [SiteLink("n1", 1000, 10), SiteLink("n2", None, 0.0)]


def test_delay_line_holds_frames_until_due():
    read_fd, write_fd = os.pipe()
    direction = Direction(src_fd=-1, dst_fd=write_fd)
    direction.pending.extend([(1.0, b"first"), (2.0, b"second")])
    assert next_wakeup_s([direction], now_s=0.25, longest_s=0.5) == 0.5
    assert next_wakeup_s([direction], now_s=0.75, longest_s=0.5) == 0.25
    write_due_frames(direction, now_s=1.5)
    assert os.read(read_fd, 100) == b"first"
    assert [frame for _, frame in direction.pending] == [b"second"]
    os.close(read_fd)
    os.close(write_fd)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_endpoint("no-colon")
    assert parse_endpoint("gdl-1x0-s0:wan0") == ("gdl-1x0-s0", "wan0")


def run_launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LAUNCH), *args], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "TORCHRUN": "torchrun"})


def test_launch_site_dry_run_composes_torchrun_command():
    result = run_launch("--config", "run.yaml", "--node", "seoul", "--nnodes", "4", "--nproc-per-node", "2",
                        "--rdzv-endpoint", "10.1.0.1:29400", "--is-host", "--local-addr", "10.1.0.1",
                        "--ifname", "eth1", "--dry-run", "--", "--resume")
    assert result.returncode == 0, result.stderr
    assert shlex.split(result.stdout) == [
        "GEODILOCO_NODE=seoul", "GLOO_SOCKET_IFNAME=eth1", "TP_SOCKET_IFNAME=eth1", "torchrun",
        "--nnodes=4", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.1.0.1:29400",
        "--rdzv-id=geodiloco", "--rdzv-conf=is_host=true", "--local-addr=10.1.0.1", "--max-restarts=0",
        "-m", "runtime.train", "--config", "run.yaml", "--resume"]


def test_torchrun_accepts_the_composed_entry_arguments():
    """torchrun's parser must pass everything after the module through to the entry untouched."""
    from torch.distributed.run import get_args_parser

    result = run_launch("--config", "run.yaml", "--node", "seoul", "--nnodes", "2", "--nproc-per-node", "1",
                        "--rdzv-endpoint", "10.1.0.1:29400", "--local-addr", "10.1.0.1", "--ifname", "eth1",
                        "--dry-run", "--", "--run-dir", "runs/x", "--resume", "--set", "diloco.rounds=3")
    words = shlex.split(result.stdout)
    parsed = get_args_parser().parse_args(words[words.index("torchrun") + 1:])
    assert parsed.training_script == "runtime.train" and parsed.module
    assert parsed.training_script_args == ["--config", "run.yaml", "--run-dir", "runs/x", "--resume",
                                           "--set", "diloco.rounds=3"]


def test_launch_site_not_host_by_default():
    result = run_launch("--config", "run.yaml", "--node", "busan", "--nnodes", "2", "--nproc-per-node", "1",
                        "--rdzv-endpoint", "10.1.0.1:29400", "--local-addr", "10.1.0.2", "--ifname", "eth1",
                        "--run-id", "exp7", "--dry-run")
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert "--rdzv-conf=is_host=false" in words and "--rdzv-id=exp7" in words
    assert "GEODILOCO_NODE=busan" in words
    assert not any(word.startswith("--node") for word in words)


@pytest.mark.parametrize("args, message", [
    (["--node", "a", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", "h:1"], "--config is required"),
    (["--config", "r.yaml", "--node", "a", "--nnodes", "0", "--nproc-per-node", "1", "--rdzv-endpoint", "h:1"],
     "--nnodes must be a positive integer"),
    (["--config", "r.yaml", "--node", "a", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", "h"],
     "--rdzv-endpoint must be HOST:PORT"),
    (["--config", "r.yaml", "--bogus"], "unknown option '--bogus'"),
])
def test_launch_site_rejects_bad_arguments(args, message):
    result = run_launch(*args)
    assert result.returncode == 2
    assert message in result.stderr
