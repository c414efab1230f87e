"""The site entry under torchrun: two agents (c10d rendezvous), one node with 2 ranks (DDP inside the node)."""
import os
import subprocess
import sys

import pytest

from geodiloco.runtime import checkpoint
from geodiloco.runtime.launch import free_port
from tests.runtime_helpers import REPO_ROOT, read_jsonl, small_config, write_config

pytestmark = pytest.mark.slow


def torchrun_site(config_path, run_dir, node, nproc, port, is_host, env_extra=None):
    env = dict(os.environ, OMP_NUM_THREADS="1", GEODILOCO_DEVICE="cpu", **(env_extra or {}))
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--nproc-per-node={nproc}",
               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
               f"--rdzv-conf=is_host={'true' if is_host else 'false'}", "--max-restarts=0",
               "-m", "geodiloco.runtime.train", "--config", str(config_path), "--node-name", node, "--run-dir", str(run_dir)]
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_two_sites(tmp_path, config):
    """Site a under torchrun with 2 ranks, site b with 1; both must exit 0. Returns the run directory and
    site a's output (its rank 0 coordinates the run)."""
    config_path = write_config(tmp_path, config)
    run_dir = tmp_path / "run"
    port = free_port()
    host = torchrun_site(config_path, run_dir, "a", 2, port, True)
    other = torchrun_site(config_path, run_dir, "b", 1, port, False)
    outputs = [process.communicate(timeout=150) for process in (host, other)]
    assert host.returncode == 0 and other.returncode == 0, "\n".join(err[-2000:] for _, err in outputs)
    return run_dir, outputs[0][0] + outputs[0][1]


def test_two_sites_under_torchrun_with_a_two_rank_node(tmp_path):
    nodes = [{"name": "a", "gpus": ["2 x A30"], "local_steps": 3, "batch_size": 4, "emulate": {"step_time_s": 0.05}},
             {"name": "b", "gpus": ["RTX 3090"], "local_steps": 2, "batch_size": 4, "emulate": {"step_time_s": 0.05}}]
    run_dir, _ = run_two_sites(tmp_path, small_config(nodes))

    records = read_jsonl(run_dir / "idle.jsonl")
    assert sorted((r["round"], r["node"], r["local_steps"]) for r in records) == [
        (0, "a", 3), (0, "b", 2), (1, "a", 3), (1, "b", 2)]
    metrics = [row for row in read_jsonl(run_dir / "metrics.jsonl") if row["node"] != "global"]
    for round_idx in range(2):
        assert len({row["start_checksum"] for row in metrics if row["round"] == round_idx}) == 1
    assert checkpoint.latest_round(run_dir) == 1
    assert sorted(path.name for path in checkpoint.round_dir(run_dir, 1).iterdir()) == [
        "global.safetensors", "members.json", "node_a.safetensors", "node_b.safetensors"]


def test_streaming_int8_sync_with_a_two_rank_node_under_torchrun(tmp_path):
    """Fragments land mid-phase on the leader and are broadcast to its second rank at the same steps;
    a rank that skipped a broadcast would hang the run or fail it."""
    nodes = [{"name": "a", "gpus": ["2 x A30"], "local_steps": 4, "batch_size": 4, "emulate": {"step_time_s": 0.05}},
             {"name": "b", "gpus": ["RTX 3090"], "local_steps": 3, "batch_size": 4, "emulate": {"step_time_s": 0.05}}]
    config = small_config(nodes)
    config["diloco"].update({"rounds": 3, "overlap": "streaming", "fragments": 3, "compression": "int8"})
    run_dir, _ = run_two_sites(tmp_path, config)
    records = read_jsonl(run_dir / "idle.jsonl")
    assert sorted((r["round"], r["node"]) for r in records) == [(r, n) for r in range(3) for n in "ab"]
    assert all(r["sync_bytes"] > 0 for r in records)
    node_state = checkpoint.load_node(run_dir, 2, "a")
    assert len(node_state["sync"]["feedback"]) == 3 and node_state["sync"]["in_flight"] == []


def test_async_mode_with_a_two_rank_host_node_under_torchrun(tmp_path):
    """The host node has two ranks: its second rank gets every pulled model by broadcast and takes part
    in the node-local exchanges; both nodes end on the same final model (the final evaluation runs)."""
    nodes = [{"name": "a", "gpus": ["2 x A30"], "batch_size": 4, "emulate": {"step_time_s": 0.05}},
             {"name": "b", "gpus": ["RTX 3090"], "batch_size": 4, "emulate": {"step_time_s": 0.1}}]
    config = small_config(nodes)
    config["diloco"] = {"rounds": 3, "local_steps": 3, "batch_size": 4, "mode": "async", "compression": "none"}
    run_dir, host_output = run_two_sites(tmp_path, config)
    records = read_jsonl(run_dir / "idle.jsonl")
    assert sorted((r["round"], r["node"]) for r in records) == [(r, n) for r in range(3) for n in "ab"]
    assert all(r["mode"] == "async" and isinstance(r["staleness"], int) and r["staleness"] >= 0 for r in records)
    # a rank 1 that missed a pulled model's broadcast would end on other parameters than rank 0 and node b
    assert "final parameter checksum" in host_output and "on every rank: a (2 ranks), b" in host_output, \
        host_output[-3000:]
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert any(row.get("final") and row["eval_loss"] is not None for row in metrics)
    assert checkpoint.latest_round(run_dir) == 2
