"""Non-finite guard: a site whose model goes NaN is left out and the others train on as if it
were absent; a run where every site goes NaN stops with exit 1 and saves nothing of that round."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from geodiloco.runtime import checkpoint
from geodiloco.runtime.launch import free_port
from geodiloco.runtime.recovery import read_membership_events
from tests.runtime_helpers import REPO_ROOT, geodiloco, small_config, write_config

NODES = [{"name": name, "gpus": ["RTX 3090"], "emulate": {"step_time_s": 0.01}} for name in ("a", "b", "c")]


def fixed_world(tmp_path, config: dict, names: list[str], run_name: str, poisoned: tuple[str, ...] = ()):
    """One ``python -m geodiloco.runtime.train`` per node by hand (as sites would start it);
    ``poisoned`` nodes get ``--set optim.inner.lr=1e30``."""
    config_path = write_config(tmp_path, config, f"{run_name}.yaml")
    run_dir = tmp_path / run_name
    port = free_port()
    processes = []
    for rank, name in enumerate(names):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(names)), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), GEODILOCO_NODE=name, GEODILOCO_DEVICE="cpu", OMP_NUM_THREADS="1")
        extra = ["--set", "optim.inner.lr=1e30"] if name in poisoned else []
        processes.append(subprocess.Popen(
            [sys.executable, "-m", "geodiloco.runtime.train", "--config", str(config_path), "--run-dir", str(run_dir),
             *extra], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    for process in processes:
        output, _ = process.communicate(timeout=180)
        outputs.append((process.returncode, output))
    return run_dir, outputs


@pytest.mark.slow
def test_a_nan_site_is_left_out_and_the_others_train_as_without_it(tmp_path):
    config = small_config(NODES, balancing={"policy": "uniform"})
    config["diloco"].update({"rounds": 2, "weighting": "tokens"})
    config["checkpoint"] = {"every_rounds": 1, "keep": 2}
    poisoned_dir, outputs = fixed_world(tmp_path, config, ["a", "b", "c"], "with_c", poisoned=("c",))
    for code, output in outputs:
        assert code == 0, output[-3000:]
    assert "node c: its model was non-finite (NaN or inf) in round 1; left out of the outer average" in outputs[2][1]
    events = [event for event in read_membership_events(poisoned_dir) if event["event"] == "non_finite"]
    assert [(event["node"], event["round"]) for event in events] == [("c", 0), ("c", 1)]

    absent_dir, outputs = fixed_world(tmp_path, config, ["a", "b"], "without_c")
    for code, output in outputs:
        assert code == 0, output[-3000:]
    for round_idx in range(2):
        with_c = checkpoint.load_global(poisoned_dir, round_idx)["outer"]["global_params"]
        without_c = checkpoint.load_global(absent_dir, round_idx)["outer"]["global_params"]
        assert all(bool(torch.isfinite(param).all()) for param in with_c)
        for got, want in zip(with_c, without_c):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    # the left-out node's own file holds the global parameters it was reset to, and no NaN anywhere
    node_c = checkpoint.load_node(poisoned_dir, 1, "c")
    assert all(bool(torch.isfinite(value).all()) for state in node_c["inner_optimizer"]["state"].values()
               for value in state.values() if isinstance(value, torch.Tensor))


@pytest.mark.slow
def test_every_site_nan_stops_the_run_and_saves_nothing_of_that_round(tmp_path):
    config = small_config(NODES[:2])
    config["optim"]["inner"]["lr"] = 1e30
    run_dir = tmp_path / "run"
    result = geodiloco("run", "--sites", "local", "--no-report", "--config", str(write_config(tmp_path, config)),
                       "--run-dir", str(run_dir), timeout=120)
    assert result.returncode == 1
    assert "every node's model is non-finite (NaN or inf) in round 1" in result.stderr
    assert "no round was saved" in result.stderr and "Traceback" not in result.stderr
    assert checkpoint.saved_global_rounds(run_dir) == []
