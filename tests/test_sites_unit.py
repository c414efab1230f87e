"""Emulated sites without root: naming, tbf parameters, rate parsing, the launch script's command."""
from __future__ import annotations

import argparse
import hashlib
import hmac
import importlib.util
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.lab import sites as sites_mod
from geodiloco.lab.delayline import Direction, next_wakeup_s, parse_endpoint, write_due_frames
from geodiloco.common.schema import ConfigError
from geodiloco.lab.sites import Site, SiteLink, Sites, parse_rate_mbps, site_links, tbf_burst_bytes, tbf_rate

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "scripts" / "launch_site.sh"


def load_bench():
    spec = importlib.util.spec_from_file_location(
        "bench_outer_sync", REPO / "experiments" / "runtime" / "bench_outer_sync.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


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
        "nsenter", "--net=/run/netns/gdl-1x0-s1", "--", "python", "-c", "pass"]
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
    assert parse_rate_mbps("1kbit") == 0.001 and parse_rate_mbps("100gbit") == 100_000.0  # what tbf takes
    for past in ("0.0001kbit", "101gbit"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"tbf takes 1kbit to 100gbit"):
            parse_rate_mbps(past)


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


@pytest.mark.parametrize("wan, message", [
    ({"bandwidth_mbps": 0.0001}, r"^nodes\[1\].wan.bandwidth_mbps: 0.0001 Mbit/s cannot be emulated by --sites netns "
                                 r"\(tbf takes 0.001 to 100,000\); give a rate in that range$"),
    ({"bandwidth_mbps": 1e9}, r"^nodes\[1\].wan.bandwidth_mbps: 1e\+09 Mbit/s cannot be emulated"),
    ({"bandwidth_mbps": 100, "latency_ms": 100_000}, r"^nodes\[1\].wan.latency_ms: 100000 ms one way is past 10,000 ms"),
])
def test_a_link_the_kernel_cannot_shape_is_refused_naming_its_field(wan, message):
    nodes = [NodeSpec(name="n1", wan={"bandwidth_mbps": 1000}), NodeSpec(name="n2", wan=wan)]
    with pytest.raises(ConfigError, match=message):
        site_links(nodes)


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


SITE_SECRET = "launch-site-test-secret-0123456789"


def expected_rdzv_id(run_id: str) -> str:
    """HMAC-SHA256(secret, "rendezvous:" + run id), first 16 hex digits, after the run id."""
    digest = hmac.new(SITE_SECRET.encode(), f"rendezvous:{run_id}".encode(), hashlib.sha256).hexdigest()
    return f"{run_id}-{digest[:16]}"


SITES_CONFIG_DIR = Path(tempfile.mkdtemp(prefix="launch-site-"))
(SITES_CONFIG_DIR / "run.yaml").write_text(yaml.safe_dump({"model": {"preset": "tiny"}, "nodes": [
    {"name": name, "gpus": ["RTX 3090"]} for name in ("a", "seoul", "busan")]}))


def run_launch(*args: str, secret: str = SITE_SECRET) -> subprocess.CompletedProcess:
    """launch_site.sh run where ``run.yaml`` is a config of nodes a, seoul and busan."""
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "TORCHRUN": "torchrun", "PYTHON": sys.executable}
    if secret:
        env["GEODILOCO_SECRET"] = secret
    return subprocess.run(["bash", str(LAUNCH), *args], capture_output=True, text=True, timeout=30, env=env,
                          cwd=SITES_CONFIG_DIR)


def test_launch_site_dry_run_composes_torchrun_command():
    result = run_launch("--config", "run.yaml", "--node", "seoul", "--nnodes", "4", "--nproc-per-node", "2",
                        "--rdzv-endpoint", "10.1.0.1:29400", "--is-host", "--local-addr", "10.1.0.1",
                        "--ifname", "eth1", "--dry-run", "--", "--resume")
    assert result.returncode == 0, result.stderr
    assert shlex.split(result.stdout) == [
        "GEODILOCO_NODE=seoul", "GLOO_SOCKET_IFNAME=eth1", "TP_SOCKET_IFNAME=eth1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "torchrun",
        "--nnodes=1:4", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=10.1.0.1:29400",
        f"--rdzv-id={expected_rdzv_id('geodiloco')}", f"--rdzv-conf=is_host=true,{DEFAULT_RDZV_TIMEOUTS}", "--local-addr=10.1.0.1",
        "--max-restarts=10", "--monitor-interval=0.5", "-m", "geodiloco.runtime.train", "--config", "run.yaml", "--resume"]


def test_launch_site_runs_the_geodiloco_agent_unless_torchrun_is_named():
    args = ["--config", "run.yaml", "--node", "seoul", "--nnodes", "2", "--nproc-per-node", "1",
            "--rdzv-endpoint", "10.1.0.1:29400", "--local-addr", "10.1.0.1", "--ifname", "eth1", "--dry-run"]
    env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "PYTHON": sys.executable, "GEODILOCO_SECRET": SITE_SECRET}
    result = subprocess.run(["bash", str(LAUNCH), *args], capture_output=True, text=True, timeout=30, env=env,
                            cwd=SITES_CONFIG_DIR)
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert words[4:7] == [sys.executable, "-m", "geodiloco.runtime.agent"]
    assert words[7] == "--nnodes=1:2"


DEFAULT_RDZV_TIMEOUTS = ("join_timeout=600,last_call_timeout=8,close_timeout=30,keep_alive_interval=2,"
                         "keep_alive_max_attempt=3")


def test_launch_site_timeouts_are_the_configs_defaults():
    """The script cannot read YAML; its defaults must stay those of comm.elastic."""
    from geodiloco.runtime.config import RunConfig
    from geodiloco.runtime.elastic_launch import rendezvous_conf
    config = RunConfig.model_validate({"model": {"preset": "tiny"}, "nodes": [{"name": "a", "gpus": ["RTX 3090"]}]})
    assert rendezvous_conf(config) == f"is_host=false,{DEFAULT_RDZV_TIMEOUTS}"


def test_launch_site_fixed_and_min_nodes():
    common = ["--config", "run.yaml", "--node", "a", "--nnodes", "4", "--nproc-per-node", "1",
              "--rdzv-endpoint", "10.1.0.1:29400", "--local-addr", "10.1.0.2", "--ifname", "eth1", "--dry-run"]
    elastic = shlex.split(run_launch(*common, "--min-nodes", "3", "--max-restarts", "5").stdout)
    assert "--nnodes=3:4" in elastic and "--max-restarts=5" in elastic
    fixed = shlex.split(run_launch(*common, "--fixed").stdout)
    assert "--nnodes=4" in fixed and "--max-restarts=0" in fixed
    assert f"--rdzv-conf=is_host=false,{DEFAULT_RDZV_TIMEOUTS}" in fixed
    too_many = run_launch(*common, "--min-nodes", "5")
    assert too_many.returncode == 2 and "--min-nodes must be an integer from 1 to --nnodes" in too_many.stderr


def test_launch_site_takes_min_nodes_restarts_and_timeouts_from_the_config(tmp_path):
    config = yaml.safe_load((SITES_CONFIG_DIR / "run.yaml").read_text())
    config["comm"] = {"min_nodes": 2, "elastic": {"max_restarts": 2, "last_call_s": 3, "keep_alive_s": 5,
                                                  "join_timeout_s": 30}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    common = ["--config", str(tmp_path / "run.yaml"), "--node", "a", "--nnodes", "3", "--nproc-per-node", "1",
              "--rdzv-endpoint", "10.1.0.1:29400", "--local-addr", "10.1.0.2", "--ifname", "eth1", "--dry-run"]
    words = shlex.split(run_launch(*common).stdout)
    assert "--nnodes=2:3" in words and "--max-restarts=2" in words
    assert ("--rdzv-conf=is_host=false,join_timeout=30,last_call_timeout=3,close_timeout=30,keep_alive_interval=5,"
            "keep_alive_max_attempt=3") in words
    overridden = shlex.split(run_launch(*common, "--min-nodes", "1", "--max-restarts", "7").stdout)
    assert "--nnodes=1:3" in overridden and "--max-restarts=7" in overridden
    config["comm"]["elastic"]["enabled"] = False
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    fixed = shlex.split(run_launch(*common).stdout)
    # a fixed run waits for its sites as long as the config says too
    assert "--nnodes=3" in fixed and "--max-restarts=0" in fixed
    assert ("--rdzv-conf=is_host=false,join_timeout=30,last_call_timeout=3,close_timeout=30,keep_alive_interval=5,"
            "keep_alive_max_attempt=3") in fixed
    too_few = run_launch(*common[:5], "1", *common[6:])  # --nnodes 1 below the config's comm.min_nodes 2
    assert too_few.returncode == 2 and "comm.min_nodes (2) is above --nnodes (1)" in too_few.stderr


def test_torchrun_accepts_the_composed_entry_arguments():
    """torchrun's parser must pass everything after the module through to the entry untouched."""
    from torch.distributed.run import get_args_parser

    result = run_launch("--config", "run.yaml", "--node", "seoul", "--nnodes", "2", "--nproc-per-node", "1",
                        "--rdzv-endpoint", "10.1.0.1:29400", "--local-addr", "10.1.0.1", "--ifname", "eth1",
                        "--dry-run", "--", "--run-dir", "runs/x", "--resume", "--set", "diloco.rounds=3")
    words = shlex.split(result.stdout)
    parsed = get_args_parser().parse_args(words[words.index("torchrun") + 1:])
    assert parsed.training_script == "geodiloco.runtime.train" and parsed.module
    assert parsed.training_script_args == ["--config", "run.yaml", "--run-dir", "runs/x", "--resume",
                                           "--set", "diloco.rounds=3"]


def test_launch_site_not_host_by_default():
    result = run_launch("--config", "run.yaml", "--node", "busan", "--nnodes", "2", "--nproc-per-node", "1",
                        "--rdzv-endpoint", "10.1.0.1:29400", "--local-addr", "10.1.0.2", "--ifname", "eth1",
                        "--run-id", "exp7", "--dry-run")
    assert result.returncode == 0, result.stderr
    words = shlex.split(result.stdout)
    assert f"--rdzv-conf=is_host=false,{DEFAULT_RDZV_TIMEOUTS}" in words  and f"--rdzv-id={expected_rdzv_id('exp7')}" in words
    assert "GEODILOCO_NODE=busan" in words
    assert not any(word.startswith("--node") for word in words)
    assert not any(SITE_SECRET in word for word in words)


def test_launch_site_needs_a_secret(tmp_path):
    common = ["--config", "run.yaml", "--node", "a", "--nnodes", "2", "--nproc-per-node", "1",
              "--rdzv-endpoint", "10.1.0.1:29400", "--local-addr", "10.1.0.2", "--ifname", "eth1", "--dry-run"]
    missing = run_launch(*common, secret="")
    assert missing.returncode == 2 and "no shared secret: set GEODILOCO_SECRET" in missing.stderr
    secret_file = tmp_path / "secret"
    secret_file.write_text(SITE_SECRET + "\n")
    from_file = run_launch(*common, "--secret-file", str(secret_file), secret="")
    assert from_file.returncode == 0, from_file.stderr
    assert f"--rdzv-id={expected_rdzv_id('geodiloco')}" in shlex.split(from_file.stdout)
    short = run_launch(*common, secret="short")
    assert short.returncode == 2 and "holds 5 bytes; use at least 16" in short.stderr


@pytest.mark.parametrize("args, message", [
    (["--node", "a", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", "h:1"], "--config is required"),
    (["--config", "r.yaml", "--node", "a", "--nnodes", "0", "--nproc-per-node", "1", "--rdzv-endpoint", "h:1"],
     "--nnodes must be a positive integer"),
    (["--config", "r.yaml", "--node", "a", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", "h"],
     "--rdzv-endpoint must be HOST:PORT"),
    (["--config", "r.yaml", "--bogus"], "unknown option '--bogus'"),
    (["--config", "r.yaml", "--node", "a", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", "h:1",
      "--local-addr", "127.0.0.1", "--ifname", "lo"], "--ifname lo: the loopback interface cannot reach other sites"),
])
def test_launch_site_rejects_bad_arguments(args, message):
    result = run_launch(*args)
    assert result.returncode == 2
    assert message in result.stderr


def test_launch_site_says_what_it_waits_for_before_torchrun_goes_quiet():
    common = ["--config", "run.yaml", "--node", "seoul", "--nproc-per-node", "1", "--rdzv-endpoint", "10.1.0.1:29400",
              "--local-addr", "10.1.0.2", "--ifname", "eth1"]
    env = {"PATH": "/usr/bin:/bin", "TORCHRUN": "true", "PYTHON": sys.executable, "GEODILOCO_SECRET": SITE_SECRET}
    elastic = subprocess.run(["bash", str(LAUNCH), *common, "--nnodes", "3", "--min-nodes", "2"], capture_output=True,
                             text=True, timeout=30, env=env, cwd=SITES_CONFIG_DIR)
    assert elastic.returncode == 0, elastic.stderr
    assert ("[geodiloco] site seoul: joining the rendezvous at 10.1.0.1:29400; training starts once at least 2 of 3 "
            "sites have joined (waits up to 600 s: comm.elastic.join_timeout_s)") in elastic.stderr


@pytest.mark.parametrize("config, node, message", [
    ("missing.yaml", "a", "--config missing.yaml is not a readable file"),
    ("run.yaml", "nosuch", "--node-name 'nosuch' is not one of the config's nodes (a, seoul, busan)"),
])
def test_launch_site_checks_the_config_and_the_node_before_starting(config, node, message):
    result = run_launch("--config", config, "--node", node, "--nnodes", "2", "--nproc-per-node", "1",
                        "--rdzv-endpoint", "10.1.0.1:29400", "--local-addr", "10.1.0.2", "--ifname", "eth1", "--dry-run")
    assert result.returncode == 2 and message in result.stderr and result.stdout == ""


def test_bench_parameter_count_and_ideal_ring_time():
    bench = load_bench()
    # tiny: embedding 256*128 + 2 layers * (4*128^2 + 3*128*352 + 2*128) + norm 128 + head 128*256
    assert bench.llama_param_count("tiny") == 32768 + 2 * (65536 + 135168 + 256) + 128 + 32768
    # llama-150m: 32000*1024 twice + 12 * (4*1024^2 + 3*1024*4096 + 2048) + 1024
    assert bench.llama_param_count("llama-150m") == 266_888_192
    assert bench.ideal_ring_s(2, 1_000_000_000, 1000.0) == pytest.approx(8.0)
    assert bench.ideal_ring_s(4, 1_000_000_000, 1000.0) == pytest.approx(12.0)


def test_bench_row_link_use_is_ideal_over_measured():
    bench = load_bench()
    args = argparse.Namespace(numel=250_000_000, rate_mbps=1000.0)
    row = bench.make_row(2, "float16", [5.0, 4.0, 6.0], args)
    assert row.payload_mb == 500.0
    assert row.ideal_s == pytest.approx(4.0)
    assert row.median_s == 5.0 and row.best_s == 4.0
    assert row.link_use == pytest.approx(0.8)
    assert row.bus_mbps == pytest.approx(800.0)


def test_launch_site_names_an_option_given_without_its_value():
    for args, option in ((["--config"], "--config"), (["--config", "run.yaml", "--node-name"], "--node-name"),
                         (["--node-name", "--dry-run"], "--node-name")):
        result = run_launch(*args)
        assert result.returncode == 2, result
        assert result.stderr.startswith(f"launch_site.sh: error: {option} needs a value (see --help)"), result.stderr


def test_nodes_on_this_machine_listen_on_loopback_and_a_netns_site_on_its_own_interface():
    # gloo otherwise listens on the address the host name resolves to, which the network may reach
    from geodiloco.runtime.config import parse_config
    from geodiloco.runtime.launch import node_env
    config = parse_config({"nodes": [{"name": "seoul", "gpus": ["A30"]}, {"name": "busan", "gpus": ["A30"]}]}, "x")
    local = node_env(config, 1, "127.0.0.1", 29555)
    assert (local["GLOO_SOCKET_IFNAME"], local["TP_SOCKET_IFNAME"], local["MASTER_ADDR"]) == ("lo", "lo", "127.0.0.1")
    site = make_sites().env(1, master_port=29555, base=local)
    assert (site["GLOO_SOCKET_IFNAME"], site["TP_SOCKET_IFNAME"]) == ("wan0", "wan0")
