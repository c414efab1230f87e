"""Reliability: what a user gets back when the input is hostile or broken (exit code, message, what survives)."""
from __future__ import annotations

import pytest
import yaml

from geodiloco.common.schema import ConfigError
from geodiloco.runtime.config import load_config
from tests.runtime_helpers import geodiloco, small_config


@pytest.mark.parametrize("section, bad_name", [
    ("node", "x/../../../../rel/pwn"),
    ("node", ".."),
    ("node", "a b"),
    ("run", "../outside"),
    ("run", "."),
])
def test_names_that_could_leave_the_run_directory_are_refused(tmp_path, section, bad_name):
    config = small_config([{"name": "a", "gpus": ["RTX 3090"]}])
    if section == "node":
        config["nodes"][0]["name"] = bad_name
    else:
        config["run"]["name"] = bad_name
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert f"{section} name {bad_name!r} may only hold ASCII letters, digits" in str(err.value)


def test_the_launcher_refuses_a_traversing_node_name_before_writing_anything(tmp_path):
    config = small_config([{"name": "x/../../pwn", "gpus": ["RTX 3090"]}])
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    result = geodiloco("run", "--sites", "local", "--config", str(path), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "node name 'x/../../pwn' may only hold" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path.parent / "pwn").exists()


def saved_run(run_dir, rounds: int, nodes=("a", "b")) -> None:
    """Checkpoint files as a run writes them: global state, members and every node's file per round."""
    import torch

    from geodiloco.runtime import checkpoint
    from geodiloco.runtime.recovery import write_members
    for round_idx in range(rounds):
        checkpoint.save_global(run_dir, round_idx, {"round": round_idx, "run_id": "r",
                                                    "outer": {"global_params": [torch.full((4,), float(round_idx))]}})
        write_members(run_dir, round_idx, list(nodes))
        for node in nodes:
            checkpoint.save_node(run_dir, round_idx, node, {"round": round_idx, "cursor": {"epoch": 0, "index": round_idx}})
        checkpoint.point_latest(run_dir, round_idx)


@pytest.mark.parametrize("damaged", ["global.safetensors", "node_b.safetensors", "members.json"])
def test_a_damaged_newest_checkpoint_is_refused_and_the_previous_round_resumes(tmp_path, capsys, damaged):
    from geodiloco.runtime import checkpoint
    from geodiloco.runtime.recovery import choose_resume_point, saved_rounds
    saved_run(tmp_path, 3)
    path = checkpoint.round_dir(tmp_path, 2) / damaged
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    reports = [saved_rounds(tmp_path, node) for node in ("a", "b")]
    assert f"checkpoint refused: {path}" in capsys.readouterr().err
    point = choose_resume_point(reports, ["a", "b"])
    assert point is not None and point.round == 1
    assert checkpoint.newest_verified_round(tmp_path, "b") == (1 if damaged != "members.json" else 2)


def test_a_garbage_latest_pointer_is_ignored_not_a_traceback(tmp_path, capsys):
    from geodiloco.runtime import checkpoint
    saved_run(tmp_path, 2)
    (tmp_path / "checkpoints" / "latest").write_text("abc\n")
    assert checkpoint.latest_round(tmp_path) is None
    assert "not a round number; ignored" in capsys.readouterr().err


def test_simulate_never_overwrites_a_run_and_bounds_its_rounds(tmp_path):
    run_dir = tmp_path / "real-run"
    run_dir.mkdir()
    (run_dir / "idle.jsonl").write_text('{"round": 0}\n')
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"nodes": [{"name": "a", "gpus": ["A30"]}, {"name": "b", "gpus": ["RTX 3090"]}]}))
    refused = geodiloco("simulate", "--cluster", str(cluster), "--rounds", "2", "--out", str(run_dir))
    assert refused.returncode == 2 and "already holds idle.jsonl (a run's logs); choose a new directory" in refused.stderr
    assert (run_dir / "idle.jsonl").read_text() == '{"round": 0}\n' and not (run_dir / "config.yaml").exists()
    huge = geodiloco("simulate", "--cluster", str(cluster), "--rounds", "1000000000")
    assert huge.returncode == 2 and "--rounds must be between 1 and 100,000" in huge.stderr
    assert "Traceback" not in refused.stderr + huge.stderr


SEQ_TOO_LONG = (("--seq-len", "5000"), "--seq-len (model.seq_len) 5000 exceeds the model's max_seq_len 1024")
BATCH_TOO_LARGE = (("--batch-size", "100000000"), "--batch-size (diloco.batch_size) must be between 1 and 1,000,000")


@pytest.mark.parametrize("command, option, expected", [
    ("plan", *SEQ_TOO_LONG), ("simulate", *SEQ_TOO_LONG), ("plan", *BATCH_TOO_LARGE), ("simulate", *BATCH_TOO_LARGE),
    ("simulate", ("--seed", "-1"), "balancing.simulation.seed: Input should be greater than or equal to 0 (got -1)"),
])
def test_plan_and_simulate_refuse_what_predict_refuses(tmp_path, command, option, expected):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"nodes": [{"name": "a", "gpus": ["A30"]}, {"name": "b", "gpus": ["RTX 3090"]}]}))
    result = geodiloco(command, "--cluster", str(cluster), *option, timeout=60)
    assert result.returncode == 2 and expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_predict_answers_an_absurd_batch_size_in_one_line():
    result = geodiloco("predict", "--gpu", "A30", "--batch-size", "10000000000000", timeout=30)
    assert result.returncode == 2
    assert "--batch-size must be between 1 and 1,000,000" in result.stderr and "Traceback" not in result.stderr


BAD_INPUTS = [
    (["--set", "nodes.9.name=x"], "--set nodes.9.name: nodes is a list of 4 entries; use an index from 0 to 3"),
    (["--set", "diloco.rounds.x=1"], "--set diloco.rounds.x: diloco.rounds is a value, not a section"),
    (["--set", "data.source=DIR/missing"], "data.source: DIR/missing is neither 'stdlib' nor an existing file"),
    (["--set", "data.source=DIR/five.txt"], "eval windows of 129 tokens leave no training data in a corpus of 0 "
                                            "such windows; lower them or give data.source more text (it holds "
                                            "only 5 bytes, under data.max_bytes"),
    (["--set", "nodes.0.gpus=['0 x A30']"], "'0 x A30': a GPU count must be at least 1"),
    (["--set", "diloco.batch_size=1000000000"], "diloco.batch_size: Input should be less than or equal to 1000000"),
    (["--config", "DIR/binary.yaml"], "binary.yaml: not a text file (not UTF-8); pass a YAML config"),
]


@pytest.mark.parametrize("args, message", BAD_INPUTS, ids=[str(index) for index in range(len(BAD_INPUTS))])
def test_bad_input_is_one_line_before_any_node_starts(tmp_path, args, message):
    """In-process (what the launcher runs before starting nodes): the config loads or preflight fails."""
    from geodiloco.runtime.preflight import preflight
    (tmp_path / "five.txt").write_text("hello")
    (tmp_path / "binary.yaml").write_bytes(bytes(range(128, 256)) * 8)
    args = [arg.replace("DIR", str(tmp_path)) for arg in args]
    config_path = args[1] if args[0] == "--config" else None
    overrides = [] if config_path else [args[1]]
    with pytest.raises(ConfigError) as err:
        preflight(load_config(config_path, overrides))
    assert message.replace("DIR", str(tmp_path)) in str(err.value)
    assert "\n" not in str(err.value).strip()


def test_the_launcher_answers_bad_input_with_exit_2_and_no_traceback(tmp_path):
    result = geodiloco("run", "--sites", "local", "--set", "nodes.0.gpus=['0 x A30']", "--run-dir",
                       str(tmp_path / "run"))
    assert result.returncode == 2
    assert result.stderr.startswith("geodiloco run: error: ") and "a GPU count must be at least 1" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_a_gpu_the_table_lacks_is_planned_with_a_notice_not_refused(caplog):
    from geodiloco.runtime.preflight import preflight
    with caplog.at_level("WARNING", logger="geodiloco.predictor"):
        preflight(load_config(None, ["nodes.0.gpus=[Z9000]"]))
    notices = [record.getMessage() for record in caplog.records if "'Z9000'" in record.getMessage()]
    assert len(notices) == 1 and "is not in the table" in notices[0] and "planned like an L4" in notices[0]


def test_a_model_too_large_for_a_nodes_gpus_is_refused_before_any_node_starts(tmp_path):
    """About 13 B parameters with AdamW state (16 bytes each, ~200 GiB) cannot train on an 11 GiB
    RTX 2080 Ti at any batch size; the demo's nodes have those."""
    from geodiloco.runtime.preflight import preflight
    dims = tmp_path / "big.yaml"
    dims.write_text("hidden_size: 5120\nintermediate_size: 13824\nnum_layers: 40\nnum_heads: 40\n"
                    "vocab_size: 32000\nmax_seq_len: 2048\n")
    with pytest.raises(ConfigError) as err:
        preflight(load_config(None, [f"model.file={dims}", "model.preset=null", "model.seq_len=128"]), data=False)
    message = str(err.value)
    assert message.startswith("nodes[0].gpus: the model (13016 M parameters, seq_len 128) needs about"), message
    assert "more than RTX 2080 Ti holds (11 GiB)" in message and "\n" not in message
    preflight(load_config(None, ["model.preset=llama-150m"]), data=False)  # 150 M fits everywhere


def test_checkpoint_keep_counts_checkpoints_not_rounds(tmp_path):
    from geodiloco.runtime import checkpoint
    for round_idx in (1, 3, 5, 6):  # saved every 2 rounds; round 6 is being written by the next save
        checkpoint.round_dir(tmp_path, round_idx).mkdir(parents=True)
    checkpoint.mark_latest(tmp_path, 5, keep=2)
    assert sorted(path.name for path in (tmp_path / "checkpoints").glob("round_*")) == [
        "round_00003", "round_00005", "round_00006"]
    assert (tmp_path / "checkpoints" / checkpoint.LATEST_FILE).read_text().strip() == "5"


def test_checkpoint_keep_spares_the_newest_file_of_a_node_that_is_away(tmp_path):
    from geodiloco.runtime import checkpoint
    # c trained rounds 0-1 and left; a and b went on to round 4; d left after round 0
    for round_idx in range(5):
        folder = checkpoint.round_dir(tmp_path, round_idx)
        folder.mkdir(parents=True)
        for name in ("global.safetensors", "members.json", *(checkpoint.node_file_name(node) for node in "ab")):
            (folder / name).write_text("x")
        for node, last_round in (("c", 1), ("d", 0)):
            if round_idx <= last_round:
                (folder / checkpoint.node_file_name(node)).write_text(str(round_idx))
    checkpoint.mark_latest(tmp_path, 4, keep=2)
    left = {path.parent.name + "/" + path.name for path in (tmp_path / "checkpoints").glob("round_*/*")}
    newest = {f"round_0000{r}/{name}" for r in (3, 4) for name in
              ("global.safetensors", "members.json", "node_a.safetensors", "node_b.safetensors")}
    # the away nodes' data positions stay (alone in their folders); every other old file is gone
    assert left == newest | {"round_00001/node_c.safetensors", "round_00000/node_d.safetensors"}
    checkpoint.mark_latest(tmp_path, 4, keep=2)  # a second pass changes nothing
    assert {path.parent.name + "/" + path.name for path in (tmp_path / "checkpoints").glob("round_*/*")} == left


def test_a_metrics_service_that_cannot_start_is_left_out_and_training_goes_on(tmp_path, monkeypatch, capsys):
    import types

    from geodiloco.runtime import metrics_sinks

    def no_api_key(*args, **kwargs):
        raise RuntimeError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(metrics_sinks, "WandbWriter", no_api_key)
    logging = types.SimpleNamespace(tensorboard=None, wandb=types.SimpleNamespace(project="p", mode="online",
                                                                                 entity=None))
    assert metrics_sinks.build_sinks(logging, "run", tmp_path, {}) is None
    err = capsys.readouterr().err
    assert "W&B could not start (No API key configured" in err and "logging.wandb.mode: offline" in err


def test_a_jsonl_corpus_without_the_text_field_is_refused_before_any_node_starts(tmp_path):
    import types

    from geodiloco.runtime.preflight import check_text_field
    corpus = tmp_path / "part_00.jsonl"
    corpus.write_text('\n{"text": "hello", "id": 1}\n')
    hf = types.SimpleNamespace(path="json", data_files=[str(tmp_path / "*.jsonl")], text_field="body")
    with pytest.raises(ConfigError, match=r"records have no 'body' field; their fields are id, text"):
        check_text_field(types.SimpleNamespace(data=types.SimpleNamespace(hf_dataset=hf)))
    hf.text_field = "text"
    check_text_field(types.SimpleNamespace(data=types.SimpleNamespace(hf_dataset=hf)))


def test_a_workers_configuration_error_stops_every_site_at_once(tmp_path):
    import subprocess
    import sys
    import threading
    import time

    from geodiloco.runtime.fatal import read_fatal, record_fatal
    from geodiloco.runtime.launch import watch_all
    fatal_file = tmp_path / "fatal_error.txt"
    sites = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    environ = {"GEODILOCO_FATAL_FILE": str(fatal_file)}
    threading.Timer(0.5, record_fatal, ("node b: data.x: bad", environ)).start()
    started = time.monotonic()
    codes = watch_all(sites, fatal_file)
    assert time.monotonic() - started < 20 and all(code is not None and code != 0 for code in codes)
    record_fatal("node a: a later error", environ)  # the first worker's message is the one kept
    assert read_fatal(fatal_file) == "node b: data.x: bad"


def test_a_worker_that_stops_on_bad_input_records_it_for_the_launcher(tmp_path, monkeypatch, capsys):
    from geodiloco.runtime import train
    from geodiloco.runtime.fatal import read_fatal
    monkeypatch.setenv("GEODILOCO_FATAL_FILE", str(tmp_path / "fatal_error.txt"))
    monkeypatch.setenv("GEODILOCO_NODE", "b")
    assert train.main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert read_fatal(tmp_path / "fatal_error.txt").startswith("node b: ")
    assert "missing.yaml" in read_fatal(tmp_path / "fatal_error.txt")


def test_export_round_numbers_are_the_consoles_and_a_wrong_one_lists_both_numberings(tmp_path):
    from geodiloco.runtime import checkpoint
    from geodiloco.runtime.export import chosen_round
    for round_idx in (4, 5):
        checkpoint.round_dir(tmp_path, round_idx).mkdir(parents=True)
        (checkpoint.round_dir(tmp_path, round_idx) / checkpoint.GLOBAL_FILE).write_bytes(b"")
    checkpoint.point_latest(tmp_path, 5)
    assert chosen_round(tmp_path, 6) == 5 and chosen_round(tmp_path, None) == 5
    with pytest.raises(ConfigError, match=r"kept rounds \(1-based.*\): 5 \(round_00004\), 6 \(round_00005\)"):
        chosen_round(tmp_path, 1)


@pytest.mark.parametrize("args, env, message", [
    (["--node-name", "nosuch"], {"RANK": "0", "WORLD_SIZE": "1"}, "--node-name 'nosuch' is not one of the config's nodes (a, b)"),
    (["--node-name", "a"], {}, "RANK and WORLD_SIZE not set: this command trains one node's worker"),
])
def test_a_worker_started_wrongly_by_hand_gets_one_line_not_a_traceback(tmp_path, monkeypatch, capsys, args, env,
                                                                         message):
    from geodiloco.runtime import train
    for key in ("RANK", "WORLD_SIZE", "GEODILOCO_NODE", "GROUP_RANK", "GEODILOCO_FATAL_FILE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    config = small_config([{"name": "a", "gpus": ["RTX 3090"]}, {"name": "b", "gpus": ["RTX 3090"]}])
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    assert train.main(["--config", str(path), "--run-dir", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_nodes_started_by_the_launcher_do_not_repeat_its_gpu_notices(caplog):
    import logging

    from geodiloco.predictor.unknown_gpus import _resolved, device_spec
    from geodiloco.runtime.preflight import NOTICE_LOGGERS, quiet_gpu_notices
    logger = logging.getLogger("geodiloco.predictor")
    levels = {name: logging.getLogger(name).level for name in NOTICE_LOGGERS}
    try:
        with caplog.at_level(logging.WARNING):
            device_spec("Lab Card 9002")
        assert "Lab Card 9002' is not in the table" in caplog.text
        quiet_gpu_notices({"GEODILOCO_GPU_NOTICES": "shown"})
        with caplog.at_level(logging.NOTSET):
            _resolved.pop("Lab Card 9001", None)
            device_spec("Lab Card 9001")
        assert "Lab Card 9001" not in caplog.text
        quiet_gpu_notices({})
        assert logger.level == logging.ERROR
        assert logging.getLogger("geodiloco.balancer").level == logging.ERROR
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
        _resolved.pop("Lab Card 9001", None)
        _resolved.pop("Lab Card 9002", None)


def test_a_resume_drops_the_rows_of_rounds_it_redoes_and_keeps_the_others(tmp_path):
    import json

    from geodiloco.runtime.runlog import RunLog
    rows = [{"round": round_idx, "node": node} for round_idx in (2, 3) for node in "abc"] + [
        {"round": 4, "node": node} for node in "ab"] + [{"note": "no round"}]
    (tmp_path / "idle.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    # resuming after round 3: round 4 is redone; round 3's rows stay as the run logged them
    RunLog(tmp_path).drop_rounds_from("idle.jsonl", 4)
    kept = [json.loads(line) for line in (tmp_path / "idle.jsonl").read_text().splitlines()]
    assert [(row.get("round"), row.get("node")) for row in kept] == [
        (2, "a"), (2, "b"), (2, "c"), (3, "a"), (3, "b"), (3, "c"), (None, None)]
    assert list(tmp_path.iterdir()) == [tmp_path / "idle.jsonl"]  # the temporary file was renamed into place


def test_a_round_is_on_disk_before_latest_points_at_it(tmp_path, monkeypatch):
    """After a power loss, ``latest`` must not name a round whose files were still only in the page cache."""
    import os

    from geodiloco.runtime import checkpoint
    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    monkeypatch.setattr(checkpoint.os, "fsync", recording_fsync)
    checkpoint.save_global(tmp_path, 3, {"x": 1})
    checkpoint.mark_latest(tmp_path, 3, keep=2)
    assert synced[0].startswith("global.safetensors.tmp") and synced[1] == "round_00003"
    assert synced[2].startswith("latest.tmp") and synced[3] == "checkpoints"


def test_checkpoint_flush_false_skips_the_fsyncs_but_still_replaces_files_whole(tmp_path, monkeypatch):
    import os

    from geodiloco.runtime import checkpoint
    synced = []
    monkeypatch.setattr(checkpoint.os, "fsync", synced.append)
    monkeypatch.setattr(checkpoint, "_flush_to_disk", True)
    checkpoint.set_flush_to_disk(False)
    checkpoint.save_global(tmp_path, 3, {"x": 1})
    checkpoint.mark_latest(tmp_path, 3, keep=2)
    assert synced == []
    assert checkpoint.latest_round(tmp_path) == 3
    assert checkpoint.load_global(tmp_path, 3)["x"] == 1
    assert sorted(os.listdir(checkpoint.round_dir(tmp_path, 3))) == ["global.safetensors"]  # no temp file left


def test_checkpoint_flush_must_be_a_boolean(tmp_path):
    from tests.runtime_helpers import write_config
    config = small_config([{"name": "a"}])
    config["checkpoint"] = {"flush": "sometimes"}
    with pytest.raises(ConfigError, match="checkpoint.flush"):
        load_config(write_config(tmp_path, config))
    config["checkpoint"] = {"flush": False}
    assert load_config(write_config(tmp_path, config)).checkpoint.flush is False


def test_a_hivemind_site_that_did_not_found_the_resume_drops_its_own_newer_rounds(tmp_path):
    """Per-site run directories: site b resumes the run founded by site a after round 2; b's round 3
    (written before the stop) must go, or redoing round 3 would find its old global file and keep it."""
    import types

    from geodiloco.runtime import checkpoint
    from geodiloco.runtime.sync.hivemind_session import start_hivemind
    for round_idx in (2, 3):
        checkpoint.save_global(tmp_path, round_idx, {"round": round_idx})
        checkpoint.save_node(tmp_path, round_idx, "b", {"round": round_idx})
    checkpoint.point_latest(tmp_path, 3)
    handles = types.SimpleNamespace(run_dir=tmp_path, new_run_id=lambda: "fresh", outer=None,
                                    load_checkpoint=lambda round_idx: ("run-x", None), gpu_rows={},
                                    config_view={})
    sync = types.SimpleNamespace(
        handles=handles, topology=types.SimpleNamespace(is_leader=True, node_name="b"), founders_gpu_rows=[],
        founders_config_views=[], founders_resumable_rounds=[("a", [2, 1]), ("b", [3, 2])],
        running_round=lambda: None, options=types.SimpleNamespace(start_wait_s=1.0),
        found=lambda proposal, wait_s: {"run_id": "run-x", "resume_round": 2, "node": "a"},
        share_in_node=lambda value: value, set_round=lambda *args, **kwargs: None)
    start = start_hivemind(sync, resume=True)
    assert start.first_round == 3
    assert not checkpoint.round_dir(tmp_path, 3).exists() and checkpoint.latest_round(tmp_path) == 2


def test_a_process_a_node_forks_ends_on_sigterm(tmp_path):
    """hivemind's DHT and averager processes are forked from the node: they must not keep the node's SIGTERM
    handler (its StopRequested was swallowed in their event loops, and a node's process group outlived a SIGTERM)."""
    import signal
    import subprocess
    import sys
    script = (
        "import os, signal, time\n"
        "from geodiloco.runtime.train import install_stop_handlers\n"
        "install_stop_handlers()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        time.sleep(30)\n"
        "    except BaseException:\n"
        "        time.sleep(30)  # what an event loop that swallows the exception amounts to\n"
        "    os._exit(0)\n"
        "time.sleep(0.5)\n"
        "os.kill(pid, signal.SIGTERM)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(int(signal.SIGTERM))
