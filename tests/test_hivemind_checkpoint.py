"""The global checkpoint under hivemind: three nodes' real round loops in one process, on loopback.

The round's first node writes the global checkpoint. When its own average of a round was partial
(here: part of its all-reduce never came back, so it kept the round's starting state while its
peers applied the full average), that round must leave no global file, and ``latest`` must only
ever name a round whose global file holds the full average."""
import threading
from types import SimpleNamespace

import pytest
import torch

from geodiloco.runtime import checkpoint
from geodiloco.runtime.config import HivemindSection, RunConfig
from geodiloco.runtime.sync.hivemind_backend import MISSING_SHARE_KEY, HivemindOuterSync, node_topology
from geodiloco.runtime.sync.hivemind_session import common_resume_round
from geodiloco.runtime.sync.protocol import CannotStart
from geodiloco.runtime.train import _train_rounds
from geodiloco.runtime.trainer import NodeTrainer
from tests.runtime_helpers import small_config

NAMES = ["a", "b", "c"]


def node_config(initial_peers: list[str], rounds: int = 2) -> RunConfig:
    config = small_config([{"name": name, "local_steps": 1, "batch_size": 2} for name in NAMES])
    config["diloco"]["rounds"] = rounds
    config["data"]["eval_batches"] = 0
    # a reducer's reply may take over a second while the full suite loads both cores: with a 1 s request
    # timeout, a real partial average once left site c without round 2's global file
    config["comm"] = {"backend": "hivemind", "timeout_s": 60, "init_timeout_s": 30,
                      "hivemind": {"initial_peers": initial_peers, "host_maddrs": ["/ip4/127.0.0.1/tcp/0"],
                                   "heartbeat_ttl_s": 10.0, "round_timeout_s": 30.0, "start_wait_s": 30.0,
                                   "matchmaking_time_s": 6.0, "request_timeout_s": 4.0}}
    return RunConfig.model_validate(config)


def start_trainers(run_dir, trainers: dict[str, NodeTrainer], rounds: int = 2) -> None:
    """One trainer (and hivemind peer) per node into ``trainers``: all sharing ``run_dir`` as on one machine,
    or each in its own when ``run_dir`` maps node names to directories (a site each)."""
    for name in NAMES:
        config = node_config(trainers["a"].sync.maddrs if trainers else [], rounds)
        node_dir = run_dir[name] if isinstance(run_dir, dict) else run_dir
        trainers[name] = NodeTrainer(config, node_topology(name, NAMES, 60, use_cuda=False), node_dir,
                                     torch.device("cpu"))


def lose_part_of_the_average(sync, round_idx: int) -> None:
    """The node's averager reports that part of round ``round_idx``'s all-reduce never came back, as
    ``StateSharingAverager._aggregate_with_group`` does after a peer's reducer timed out."""
    real_step = sync.averager.step

    def step(**kwargs):
        gathered = real_step(**kwargs)
        return {**gathered, MISSING_SHARE_KEY: 0.5} if sync.current_round == round_idx else gathered

    sync.averager.step = step


def train_all(trainers: dict[str, NodeTrainer], resume: bool = False) -> None:
    """Every node's round loop (found, rounds, finish, last commit) in its own thread."""
    errors = []

    def train(trainer):
        try:
            _train_rounds(trainer, resume=resume)
        except Exception as err:  # surfaced below
            errors.append(err)
        finally:
            trainer.checkpoint_writer.close()

    threads = [threading.Thread(target=train, args=(trainer,)) for trainer in trainers.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads), "a node's round loop did not end"


@pytest.mark.slow
def test_a_round_whose_writer_kept_a_partial_average_leaves_no_global_checkpoint(tmp_path, capsys):
    run_dir, trainers = tmp_path / "run", {}
    try:
        start_trainers(run_dir, trainers)
        lose_part_of_the_average(trainers["a"].sync, round_idx=0)
        train_all(trainers)
        full_average = [param.clone() for param in trainers["b"].outer.global_params]
        peer_average = trainers["c"].outer.global_params
    finally:
        for trainer in trainers.values():
            trainer.sync.close()
    out = capsys.readouterr().out

    # a, the writer, kept the starting state of round 1 while b and c applied the full average: round 1
    # leaves node files but no global one, and a says why
    assert "node a: 50.0 % of the outer all-reduce of round 1 never came back" in out, out
    assert ("[geodiloco] node a: no global checkpoint of round 1: part of this node's outer all-reduce never came "
            "back (50.0 %), so its parameters are not the round's full average") in out, out
    assert not checkpoint.has_global(run_dir, 0)
    assert (checkpoint.round_dir(run_dir, 0) / checkpoint.node_file_name("a")).is_file()
    # round 2 was a full average on every node (a reloaded its peers' state): committed, and the only
    # global state a resume or an export can find
    assert checkpoint.latest_round(run_dir) == 1
    assert checkpoint.kept_rounds(run_dir) == [1]
    assert all(checkpoint.newest_verified_round(run_dir, name) == 1 for name in NAMES)
    saved = checkpoint.load_global(run_dir, 1)["outer"]["global_params"]
    for got, held_by_b, held_by_c in zip(saved, full_average, peer_average):
        torch.testing.assert_close(got, held_by_b, rtol=0, atol=1e-6)
        torch.testing.assert_close(got, held_by_c, rtol=0, atol=1e-6)


@pytest.mark.parametrize("present, group, target, missing_share, reason", [
    ("abc", "abc", None, 0.0, None),
    ("abc", "ab", None, 0.0, "its averaging group lacked c (present at the round's readiness exchange)"),
    ("abcd", "ab", None, 0.0, "its averaging group lacked c, d (present at the round's readiness exchange)"),
    ("abcd", "ab", 2, 0.0, None),  # target_group_size: groups of two average separately by design
    ("abc", "abc", None, 0.25, "part of this node's outer all-reduce never came back (25.0 %)"),
    ("a", "a", None, 0.0, None),  # alone in the round: its own update is the round's average
])
def test_a_writer_withholds_the_global_checkpoint_of_a_round_it_did_not_fully_average(
        present, group, target, missing_share, reason):
    sync = object.__new__(HivemindOuterSync)
    sync._present, sync.options = list(present), HivemindSection(target_group_size=target)
    withheld = sync._partial_average(missing_share, list(group))
    if reason is None:
        assert withheld is None
    else:
        assert withheld.startswith(reason), withheld


def test_a_drifted_writer_that_found_no_peer_to_reload_from_withholds_the_global_checkpoint(capsys):
    sync = object.__new__(HivemindOuterSync)
    sync.topology = node_topology("a", NAMES, 60, use_cuda=False)
    sync.handles = SimpleNamespace(params=[], outer=None)
    sync.init_timeout_s, sync.diverged, sync.global_withheld = 1.0, True, None
    sync.download_state = lambda timeout_s, min_round, checksum=None: None
    sync.averager = None
    sync.end_round(3, "run-x")
    assert sync.global_withheld == ("its parameters differ from the majority's and no peer shared the global state "
                                    "to reload")
    assert "node a: no peer shared its state; keeping this node's" in capsys.readouterr().out


def close_all(trainers: dict[str, NodeTrainer]) -> None:
    for trainer in trainers.values():
        trainer.sync.close()


def round_folders(run_dir) -> list[str]:
    return sorted(path.name for path in (run_dir / "checkpoints").glob("round_*"))


@pytest.mark.slow
def test_with_a_run_directory_per_site_each_site_commits_prunes_and_resumes_from_its_own(tmp_path):
    site_dirs = {name: tmp_path / f"site_{name}" for name in NAMES}
    trainers: dict[str, NodeTrainer] = {}
    try:
        start_trainers(site_dirs, trainers, rounds=3)
        train_all(trainers)
        finals = {name: [param.clone() for param in trainer.outer.global_params] for name, trainer in trainers.items()}
    finally:
        close_all(trainers)
    for name, site_dir in site_dirs.items():
        # checkpoint.keep is 2: round 1 is pruned at every site, not only at the round writer's (a)
        assert round_folders(site_dir) == ["round_00001", "round_00002"], name
        assert checkpoint.latest_round(site_dir) == 2, name
        assert checkpoint.kept_rounds(site_dir) == [1, 2], name
        assert [path.name for path in checkpoint.round_dir(site_dir, 2).glob("node_*")] == [f"node_{name}.safetensors"]
        saved = checkpoint.load_global(site_dir, 2)["outer"]["global_params"]
        for got, held in zip(saved, finals[name]):
            torch.testing.assert_close(got, held, rtol=0, atol=0)

    trainers = {}
    try:
        start_trainers(site_dirs, trainers, rounds=4)
        train_all(trainers, resume=True)
    finally:
        close_all(trainers)
    for name, site_dir in site_dirs.items():
        assert checkpoint.latest_round(site_dir) == 3, name
        assert round_folders(site_dir) == ["round_00002", "round_00003"], name


@pytest.mark.parametrize("resumable, expected", [
    ([("a", [4, 3]), ("b", [4, 3]), ("c", [4, 3])], 3 + 1),
    ([("a", [4, 3]), ("b", [3, 2]), ("c", [4, 3])], 3),  # b's round 5 file was withheld or lost
    ([("a", [4, 3]), ("b", []), ("c", [3])], 3),  # b holds none: it cannot resume and says so when it loads
])
def test_founders_resume_from_the_newest_round_each_of_them_holds(resumable, expected):
    assert common_resume_round(resumable) == expected


def test_founders_without_a_common_round_are_told_which_rounds_each_holds():
    with pytest.raises(CannotStart, match=r"hold no checkpoint of the same round \(a: rounds 4, 5; b: rounds 2, 3\)"):
        common_resume_round([("a", [4, 3]), ("b", [2, 1])])
