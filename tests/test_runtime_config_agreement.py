"""Sites that start with different run settings stop at once, each naming the settings, instead of
hanging at the end of the run or failing in the first all-reduce."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from geodiloco.common.schema import ConfigError
from geodiloco.runtime.config import parse_config
from geodiloco.runtime.config_agreement import (OtherSitesLeave, check_all_same, differences, leave_or_go_on,
                                                settle_differences, shared_view)
from geodiloco.runtime.launch import free_port
from tests.runtime_helpers import REPO_ROOT, small_config, write_config

NODES = [{"name": name, "gpus": ["RTX 3090"], "emulate": {"step_time_s": 0.01}} for name in ("a", "b")]
SECRET = "the-runs-shared-secret-123456"


def view(**sections):
    return shared_view(parse_config(small_config(NODES, **sections), "<test>"))


def test_only_settings_of_one_site_may_differ():
    base = view()
    per_site = view(run={"name": "other", "out_dir": "elsewhere", "seed": 0},
                    checkpoint={"background": False, "flush": False},
                    comm={"timeout_s": 99, "elastic": {"enabled": False}},
                    optim={"inner": {"lr": 3.0e-3, "warmup_steps": 2}})
    assert differences(per_site, base) == []
    changed = view(diloco={"rounds": 5, "local_steps": 3, "batch_size": 4, "overlap": "none", "compression": "none"},
                   model={"preset": "small", "seq_len": 32})
    paths = [path for path, _, _ in differences(changed, base)]
    assert "diloco.rounds" in paths and "model.dims.hidden_size" in paths and "model.dims.num_layers" in paths


def test_the_error_names_the_nodes_and_each_setting_with_both_values():
    base = view()
    other = view(diloco={"rounds": 5, "local_steps": 3, "batch_size": 4, "overlap": "none", "compression": "none"},
                 balancing={"policy": "time"})
    with pytest.raises(ConfigError) as raised:
        check_all_same([("a", base), ("b", other)])
    message = str(raised.value)
    assert message.startswith("node b's config differs from node a's in ")
    assert "diloco.rounds: 5 at node b, 2 at node a" in message
    assert "balancing.policy: 'time' at node b, 'uniform' at node a" in message
    assert message.endswith("copy one config file to every site")
    check_all_same([("a", base), ("b", view())])  # the same settings: no error


def test_the_outer_device_must_agree_on_the_torch_backend_but_not_under_hivemind():
    # torch: the outer all-reduce runs over gloo for cpu and nccl for cuda; mixed, the nodes could not meet in it
    on_gpu = view(comm={"outer_device": "cuda", "elastic": {"enabled": False}})
    assert differences(on_gpu, view()) == [("comm.outer_device", "cuda", "cpu")]
    hivemind = {"backend": "hivemind", "hivemind": {"initial_peers": []}}
    assert differences(view(comm={**hivemind, "outer_device": "cuda"}), view(comm=hivemind)) == []


def start_worker(config_path, run_dir, name, rank, port, *extra):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               GEODILOCO_NODE=name, GEODILOCO_DEVICE="cpu", OMP_NUM_THREADS="1", GEODILOCO_SECRET=SECRET)
    return subprocess.Popen([sys.executable, "-m", "geodiloco.runtime.train", "--config", str(config_path),
                             "--run-dir", str(run_dir), *extra], env=env, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


RUN_VIEW, EDITED_VIEW = {"diloco": {"rounds": 2}}, {"diloco": {"rounds": 4}}


@pytest.mark.parametrize("views, trained, expected", [
    # a site that joins a running run with an edited config leaves, even when it is not outnumbered
    ([("a", RUN_VIEW), ("c", EDITED_VIEW)], {"a"}, ("a", ["c"])),
    ([("a", EDITED_VIEW), ("b", RUN_VIEW), ("c", RUN_VIEW)], {"b", "c"}, ("b", ["a"])),
    # nobody trained yet in this job (or both sides did): a strict majority keeps the run
    ([("a", RUN_VIEW), ("b", RUN_VIEW), ("c", EDITED_VIEW)], set(), ("a", ["c"])),
    ([("a", EDITED_VIEW), ("b", RUN_VIEW), ("c", RUN_VIEW)], {"a", "b"}, ("b", ["a"])),
    # a node's ranks count once: two ranks of c do not outvote a and b
    ([("a", RUN_VIEW), ("b", RUN_VIEW), ("c", EDITED_VIEW), ("c", EDITED_VIEW)], set(), ("a", ["c"])),
    # no side can be told: every site stops (check_all_same)
    ([("a", RUN_VIEW), ("b", EDITED_VIEW)], set(), None),
    ([("a", RUN_VIEW), ("b", EDITED_VIEW)], {"a", "b"}, None),
    ([("a", RUN_VIEW), ("b", RUN_VIEW)], {"a"}, None),  # all agree
])
def test_the_side_that_keeps_the_run_is_the_running_one_or_the_majority(views, trained, expected):
    assert settle_differences(views, trained) == expected


def test_the_leaving_site_is_told_to_fix_its_config_and_the_others_that_it_leaves():
    views = [("a", view()), ("b", view()), ("c", view(diloco={**small_config(NODES)["diloco"], "rounds": 4}))]
    with pytest.raises(ConfigError, match=r"node c's config differs from node a's in diloco.rounds: 4 at node c, "
                                          r"2 at node a; .*: this site leaves the run and the other sites go on"):
        leave_or_go_on(views, "c", trained=set())
    with pytest.raises(OtherSitesLeave, match=r"^c joined with a config that differs from the run's \(diloco.rounds: "
                                              r"4 at node c, 2 at node a\); it leaves and the run goes on without it$"):
        leave_or_go_on(views, "a", trained=set())
    leave_or_go_on(views[:2], "a", trained=set())  # all agree: nothing raised


@pytest.mark.slow
def test_two_torch_sites_with_different_rounds_both_stop_and_say_why(tmp_path):
    config = small_config(NODES)
    edited = small_config(NODES)
    edited["diloco"]["rounds"] = 4
    paths = [write_config(tmp_path, config, "a.yaml"), write_config(tmp_path, edited, "b.yaml")]
    port = free_port()
    workers = [start_worker(path, tmp_path / f"run_{name}", name, rank, port)
               for rank, (name, path) in enumerate(zip("ab", paths))]
    outputs = [worker.communicate(timeout=120)[0] for worker in workers]
    for worker, output in zip(workers, outputs):
        assert worker.returncode == 2, output[-3000:]
        assert "node b's config differs from node a's in diloco.rounds: 4 at node b, 2 at node a" in output
        assert "Traceback" not in output
    assert not (tmp_path / "run_a" / "checkpoints").exists()


@pytest.mark.slow
def test_hivemind_founders_with_different_settings_all_stop_and_say_why(tmp_path):
    from tests.test_hivemind_run import hivemind_config, start_node, stop_all
    config = hivemind_config(NODES, rounds=2, start_wait_s=20.0)
    edited = hivemind_config(NODES, rounds=2, start_wait_s=20.0)
    edited["optim"]["outer"] = {"lr": 0.5}
    paths = [write_config(tmp_path, config, "a.yaml"), write_config(tmp_path, edited, "b.yaml")]
    run_dir, peers_file = tmp_path / "run", tmp_path / "peers.txt"
    run_dir.mkdir()
    processes = [start_node(paths[0], run_dir, "a", peers_file, first=True)]
    try:
        processes.append(start_node(paths[1], run_dir, "b", peers_file, first=False))
        codes = [process.wait(timeout=150) for process in processes]
    finally:
        stop_all(processes)
    for name, code in zip("ab", codes):
        log = (tmp_path / f"{name}.log").read_text()
        assert code == 2, log[-3000:]
        assert "node b's config differs from node a's in optim.outer.lr: 0.5 at node b, 0.7 at node a" in log
        assert "Traceback" not in log
    assert not (run_dir / "checkpoints").exists()


def test_a_joiner_whose_settings_differ_from_its_peers_stops(tmp_path):
    """Hivemind: the global state a joiner downloads carries the peer's run settings."""
    import torch
    import torch.distributed as dist

    from geodiloco.runtime.comm import build_topology
    from geodiloco.runtime.trainer import NodeTrainer

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        config = parse_config({"model": {"seq_len": 32}, "data": {"max_bytes": 20_000, "eval_batches": 0},
                               "comm": {"min_nodes": 1}, "nodes": [{"name": "a"}, {"name": "c"}]}, "<test>")
        trainer = NodeTrainer(config, build_topology("c", ["a", "c"], min_nodes=1), tmp_path, torch.device("cpu"))
        metadata, tensors = trainer.shared_state(0, "run-x")
        assert metadata["config_view"] == shared_view(config)
        trainer.load_shared_state({**metadata, "node": "a"}, tensors)  # the same settings: taken
        peers = {**metadata, "node": "a", "config_view": {**metadata["config_view"],
                                                          "diloco": {**metadata["config_view"]["diloco"], "rounds": 9}}}
        with pytest.raises(ConfigError, match="node c's config differs from node a's in diloco.rounds: "
                                              f"{config.diloco.rounds} at node c, 9 at node a"):
            trainer.load_shared_state(peers, tensors)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_sites_started_by_hand_check_their_run_dirs_as_geodiloco_run_does(tmp_path):
    """A used run directory without --resume, --resume with a setting its checkpoint was written for, and
    --resume where nothing was saved: each stops every site with one line; an allowed change is listed."""
    config = small_config(NODES, diloco={**small_config(NODES)["diloco"], "rounds": 1})
    path = write_config(tmp_path, config)

    def start_both(prefix: str, *extra: str) -> list[tuple[int, str]]:
        port = free_port()
        workers = [start_worker(path, tmp_path / f"{prefix}_{name}", name, rank, port, *extra)
                   for rank, name in enumerate("ab")]
        outputs = [worker.communicate(timeout=120)[0] for worker in workers]
        return [(worker.returncode, output) for worker, output in zip(workers, outputs)]

    assert [code for code, _ in start_both("run")] == [0, 0]
    for code, output in start_both("run"):
        assert code == 1, output[-3000:]
        assert ("cannot start: the run directory of nodes a, b already holds a checkpoint (after round 1; this "
                "node's is") in output
        assert "pass --resume to continue it, or choose another --run-dir" in output and "Traceback" not in output
    resumed = start_both("run", "--resume", "--set", "diloco.rounds=2")
    assert [code for code, _ in resumed] == [0, 0], resumed[0][1][-3000:]
    # node a coordinated the first run: its run directory holds the saved config.yaml
    assert "[geodiloco] node a: resuming with a changed setting: diloco.rounds: 1 -> 2" in resumed[0][1]
    for code, output in start_both("run", "--resume", "--set", "diloco.rounds=2", "--set", "model.seq_len=16"):
        assert code == 2, output[-3000:]
        assert "node a: --resume: model.seq_len (32 -> 16) cannot change in a resumed run" in output, output[-3000:]
    for code, output in start_both("empty", "--resume"):
        assert code == 1, output[-3000:]
        assert "cannot start: --resume: no node's run directory holds a checkpoint" in output, output[-3000:]
    assert not (tmp_path / "empty_a" / "checkpoints").exists()
