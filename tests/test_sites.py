"""Emulated sites for real: namespaces, tbf-shaped links, delay lines, gloo and torchrun across sites.

Skipped (with the reason) where network namespaces cannot be created, e.g. without root.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from geodiloco.lab.sites import SiteLink, cleanup_stale, delay_lines_of, list_namespaces, netns_sites

REPO = Path(__file__).resolve().parents[1]
PREFIX = "gdlt"
NETNS_OK, NETNS_REASON = (False, "not checked")
try:
    from geodiloco.lab.sites import can_use_netns

    NETNS_OK, NETNS_REASON = can_use_netns()
except Exception as err:  # noqa: BLE001 - any failure of the probe is a reason to skip
    NETNS_REASON = f"probe failed: {err}"

pytestmark = [pytest.mark.netns, pytest.mark.slow,
              pytest.mark.skipif(not NETNS_OK, reason=f"network namespaces unavailable: {NETNS_REASON}")]

GLOO_WORKER = textwrap.dedent("""
    import datetime, json, sys, time
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, numel = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    small = torch.full((3,), float(rank + 1))
    dist.all_reduce(small)
    big = torch.ones(numel)
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(big)
    elapsed_s = time.perf_counter() - start
    print(json.dumps({"small": small.tolist(), "big_sum_ok": bool(torch.all(big == 2.0)), "elapsed_s": elapsed_s}))
    dist.destroy_process_group()
""")

ECHO = textwrap.dedent("""
    import socket, sys, time
    role, address = sys.argv[1], sys.argv[2]
    if role == "server":
        server = socket.create_server((address, 7007))
        print("listening", flush=True)
        conn, _ = server.accept()
        while data := conn.recv(64):
            conn.sendall(data)
    else:
        conn = socket.create_connection((address, 7007), timeout=10)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rtts = []
        for _ in range(5):
            start = time.perf_counter()
            conn.sendall(b"x")
            conn.recv(64)
            rtts.append(time.perf_counter() - start)
        print(min(rtts))
""")

TORCHRUN_ENTRY = textwrap.dedent("""
    import datetime, json, os, sys
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    args = sys.argv[1:]
    out_dir = args[args.index("--out") + 1]
    record = {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "sum": value.item(),
              "node": os.environ.get("GEODILOCO_NODE"), "ifname": os.environ.get("GLOO_SOCKET_IFNAME")}
    with open(os.path.join(out_dir, f"rank{dist.get_rank()}.json"), "w") as handle:
        json.dump(record, handle)
    dist.destroy_process_group()
""")


def run_in_sites(commands: list[list[str]], envs: list[dict], timeout_s: float) -> list[str]:
    """Start one process per site, wait for all, return their stdouts; kill all on timeout."""
    processes = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True) for cmd, env in zip(commands, envs)]
    outputs = []
    try:
        for process in processes:
            stdout, stderr = process.communicate(timeout=timeout_s)
            assert process.returncode == 0, f"site process failed ({process.returncode}): {stderr[-2000:]}"
            outputs.append(stdout)
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return outputs


def test_gloo_all_reduce_across_two_shaped_sites(tmp_path):
    rate_mbps, numel = 50.0, 1_000_000
    script = tmp_path / "gloo_worker.py"
    script.write_text(GLOO_WORKER)
    with netns_sites([SiteLink("seoul", rate_mbps), SiteLink("busan", rate_mbps)], prefix=PREFIX) as sites:
        commands = [sites.command(rank, [sys.executable, str(script), str(rank), str(numel)]) for rank in range(2)]
        envs = [sites.env(rank, master_port=29531) for rank in range(2)]
        outputs = run_in_sites(commands, envs, timeout_s=90)
    results = [json.loads(out.strip().splitlines()[-1]) for out in outputs]
    ideal_s = 2 * (2 - 1) / 2 * numel * 4 * 8 / (rate_mbps * 1e6)
    for result in results:
        assert result["small"] == [3.0, 3.0, 3.0]
        assert result["big_sum_ok"]
        assert result["elapsed_s"] >= 0.7 * ideal_s, f"faster than a {rate_mbps} Mbit/s link allows: {result}"
    assert not set(sites.namespaces) & set(list_namespaces())


def test_latency_adds_one_way_delay_per_link(tmp_path):
    latencies_ms = (15.0, 5.0)
    script = tmp_path / "echo.py"
    script.write_text(ECHO)
    with netns_sites([SiteLink("a", 100.0, latencies_ms[0]), SiteLink("b", None, latencies_ms[1])],
                     prefix=PREFIX) as sites:
        server = subprocess.Popen(sites.command(1, [sys.executable, str(script), "server", sites[1].address]),
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "listening"
            client = subprocess.run(sites.command(0, [sys.executable, str(script), "client", sites[1].address]),
                                    capture_output=True, text=True, timeout=30)
        finally:
            server.kill()
            server.wait()
        delay_lines = list(sites.delay_lines)
    assert client.returncode == 0, client.stderr
    min_rtt_s = float(client.stdout)
    expected_rtt_s = 2 * sum(latencies_ms) / 1000.0
    assert min_rtt_s >= 0.95 * expected_rtt_s
    assert all(process.poll() is not None for process in delay_lines)


def test_teardown_on_exception_leaves_nothing():
    with pytest.raises(RuntimeError, match="boom"):
        with netns_sites([SiteLink("a", 10.0, 2.0), SiteLink("b")], prefix=PREFIX) as sites:
            created = sites.namespaces
            assert set(created) <= set(list_namespaces())
            raise RuntimeError("boom")
    assert not set(created) & set(list_namespaces())
    assert all(process.poll() is not None for process in sites.delay_lines)


HOLDER = textwrap.dedent("""
    import json, os, signal, sys, time
    from geodiloco.lab.sites import SiteLink, netns_sites
    with netns_sites([SiteLink("a", 10.0, 2.0), SiteLink("b", 10.0)], prefix=sys.argv[1]) as sites:
        print(json.dumps(sites.namespaces), flush=True)
        if sys.argv[2] == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
""")


def start_holder(mode: str) -> tuple[subprocess.Popen, list[str]]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, PREFIX, mode], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    line = holder.stdout.readline()
    if not line:
        holder.wait(timeout=30)
        pytest.fail(f"the process holding the sites failed: {holder.stderr.read()[-2000:]}")
    return holder, json.loads(line)


def test_sigterm_tears_sites_down():
    holder, created = start_holder("hold")
    assert set(created) <= set(list_namespaces())
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=30) == 128 + signal.SIGTERM
    assert not set(created) & set(list_namespaces())


def test_stale_namespaces_of_a_crashed_run_are_removed():
    holder, created = start_holder("crash")
    assert holder.wait(timeout=30) == -signal.SIGKILL
    assert set(created) <= set(list_namespaces())
    removed = cleanup_stale(PREFIX)
    assert set(created) <= set(removed)
    assert not set(created) & set(list_namespaces())
    deadline = time.monotonic() + 5
    while any(delay_lines_of(ns) for ns in created) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(delay_lines_of(ns) for ns in created)


def test_torchrun_agents_rendezvous_across_sites(tmp_path):
    (tmp_path / "sites_allreduce_entry.py").write_text(TORCHRUN_ENTRY)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with netns_sites([SiteLink("seoul", 100.0), SiteLink("busan", 100.0)], prefix=PREFIX) as sites:
        commands = []
        for index, site in enumerate(sites):
            host_flag = ["--is-host"] if index == 0 else []
            commands.append(site.command([
                "bash", str(REPO / "scripts" / "launch_site.sh"), "--config", "unused.yaml", "--node", site.name,
                "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", f"{sites.master_addr}:29400",
                *host_flag, "--run-id", "sitestest", "--entry", "sites_allreduce_entry", "--", "--out", str(out_dir)]))
        # the script's own launcher (runtime/agent.py, torchrun's agent) with this interpreter
        env = {**os.environ, "PYTHONPATH": str(tmp_path), "OMP_NUM_THREADS": "1", "PYTHON": sys.executable}
        env.pop("TORCHRUN", None)
        run_in_sites(commands, [env, env], timeout_s=120)
    records = sorted((json.loads(path.read_text()) for path in out_dir.glob("rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == [0, 1]
    assert all(r["sum"] == 3.0 and r["world_size"] == 2 and r["ifname"] == "wan0" for r in records)
    assert sorted(r["node"] for r in records) == ["busan", "seoul"]


def wan_emulate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / "wan_emulate.sh"), *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})


def test_wan_emulate_up_status_down():
    prefix = f"gw{os.getpid()}"
    up = wan_emulate("up", "2", "--rate", "100mbit", "--latency-ms", "3", "--prefix", prefix)
    try:
        assert up.returncode == 0, up.stderr
        assert wan_emulate("up", "2", "--prefix", prefix).returncode == 2
        status = wan_emulate("status", "--json", "--prefix", prefix)
        rows = {row["namespace"]: row for row in json.loads(status.stdout)}
        assert sorted(rows) == [f"{prefix}-m-br", f"{prefix}-m-s0", f"{prefix}-m-s1"]
        assert rows[f"{prefix}-m-s1"]["addresses"] == ["10.213.0.2/24 on wan0"]
        assert rows[f"{prefix}-m-s0"]["shaping"] == ["wan0: tbf 100 Mbit/s"]
        assert sorted(rows[f"{prefix}-m-br"]["shaping"]) == ["s0: tbf 100 Mbit/s", "s1: tbf 100 Mbit/s"]
        assert len(rows[f"{prefix}-m-s0"]["delay"]) == 1 and rows[f"{prefix}-m-s0"]["delay"][0].endswith("3.0 ms")
    finally:
        down = wan_emulate("down", "--prefix", prefix)
    assert down.returncode == 0 and "removed 3 namespaces" in down.stdout
    assert not [ns for ns in list_namespaces() if ns.startswith(f"{prefix}-")]
    deadline = time.monotonic() + 5
    while any(delay_lines_of(f"{prefix}-m-s{i}") for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(delay_lines_of(f"{prefix}-m-s{i}") for i in range(2))
