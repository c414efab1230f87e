"""Checks `geodiloco run` makes on its run directory before a site starts: one launcher at a time, a resume that
names the field it may not change and refuses fewer rounds than were done, a path that is a file, and the resume
command printed so that it can be pasted."""
from __future__ import annotations

import pytest

from geodiloco.common.schema import ConfigError
from geodiloco.runtime import checkpoint
from geodiloco.runtime.config import apply_override, parse_config
from geodiloco.runtime.launch import hold_run_dir, say_how_to_resume
from geodiloco.runtime.run_dir import check_run_dir, resume_changes

NODES = [{"name": "a", "emulate": {"step_time_s": 0.2}}, {"name": "b", "emulate": {"step_time_s": 0.3}}]


def saved_run(run_dir, rounds_done: int, **diloco):
    """A run directory as a run leaves it after ``rounds_done`` rounds: its config and its latest pointer."""
    config = parse_config({"model": {"preset": "tiny"}, "diloco": {"rounds": 6, **diloco}, "nodes": NODES}, "run.yaml")
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(config.to_yaml())
    checkpoint.save_global(run_dir, rounds_done - 1, {"outer": {"step": rounds_done}})
    checkpoint.mark_latest(run_dir, rounds_done - 1, keep=2)
    return config


def test_a_second_launcher_into_the_same_run_directory_is_refused_until_the_first_ends(tmp_path):
    first = hold_run_dir(tmp_path)
    with pytest.raises(ConfigError, match=r"in use by another geodiloco run \(pid \d+\); wait for it to end"):
        hold_run_dir(tmp_path)
    first.close()
    hold_run_dir(tmp_path).close()


def test_a_resume_names_the_node_field_it_may_not_change_and_refuses_fewer_rounds_than_done(tmp_path):
    config = saved_run(tmp_path / "run", rounds_done=4)
    changed = config.model_copy(deep=True)
    changed.nodes[0].gpus = ["A30"]
    with pytest.raises(ConfigError) as refused:
        resume_changes(tmp_path / "run", changed)
    assert str(refused.value).startswith("--resume: nodes[0].gpus ([] -> ['A30']) cannot change")
    assert "'name': 'b'" not in str(refused.value)  # the field, not the whole list
    assert str(refused.value).endswith("comm.hivemind, nodes[N].wan, nodes[N].emulate")
    # a node's virtual GPU and its emulated link hold nothing of the checkpoint: they may change
    emulated = config.model_copy(deep=True)
    emulated.nodes[0].emulate.step_time_s = 0.25
    assert resume_changes(tmp_path / "run", emulated) == ["nodes[0].emulate.step_time_s: 0.2 -> 0.25"]
    fewer = config.model_copy(deep=True)
    fewer.diloco.rounds = 2
    with pytest.raises(ConfigError, match=r"diloco.rounds 2 is below the 4 rounds this run has done; give at least 4"):
        resume_changes(tmp_path / "run", fewer)
    fewer.diloco.rounds = 4
    assert resume_changes(tmp_path / "run", fewer) == ["diloco.rounds: 6 -> 4"]


def test_a_run_dir_that_is_a_file_and_a_set_with_an_empty_key_are_named(tmp_path):
    taken = tmp_path / "afile"
    taken.write_text("x")
    for resume in (False, True):
        with pytest.raises(ConfigError, match="a file, not a run directory; choose another --run-dir"):
            check_run_dir(taken, resume)
    for override in ("=3", ".diloco=3", "diloco..rounds=3"):
        with pytest.raises(ConfigError, match="the key path has an empty part"):
            apply_override({"diloco": {"rounds": 2}}, override)


def test_the_resume_command_after_an_interrupt_can_be_pasted_when_the_path_has_spaces(tmp_path, capsys):
    run_dir = tmp_path / "with space" / "run 1"
    saved_run(run_dir, rounds_done=3)
    say_how_to_resume(run_dir, ["a", "b"])  # only the global file and latest: the committed round is named
    assert capsys.readouterr().err == (f"[geodiloco] a resume continues after round 3 (its checkpoint is complete in "
                                       f"{run_dir}); continue with: geodiloco run --resume --run-dir '{run_dir}'\n")


def test_runs_started_in_one_second_get_their_own_directories_and_the_run_id_is_the_directorys_name(tmp_path,
                                                                                                   monkeypatch):
    import time as time_module

    from geodiloco.runtime.config import load_config as load
    from geodiloco.runtime.run_dir import new_run_dir, run_id_for
    config = load(None, [f"run.out_dir={tmp_path / 'runs'}"])
    monkeypatch.setattr(time_module, "strftime", lambda fmt, *args: "20261127-120000")
    first, second, third = new_run_dir(config), new_run_dir(config), new_run_dir(config)
    assert [path.name for path in (first, second, third)] == ["demo-20261127-120000", "demo-20261127-120000-2",
                                                              "demo-20261127-120000-3"]
    assert all(path.is_dir() for path in (first, second, third))
    assert run_id_for(config, second) == "demo-20261127-120000-2"
    (second / "idle.jsonl").write_text("{}\n")  # a world starting afresh where an earlier one logged: a new id
    monkeypatch.setattr(time_module, "strftime", lambda fmt, *args: "20261127-120005")
    assert run_id_for(config, second).startswith("demo-20261127-120005-")
    # runs with their own --run-dir started in one second (a sweep) get ids of their own
    ids = {run_id_for(config, tmp_path / f"sweep-{index}") for index in range(20)}
    assert len(ids) >= 19 and all(run_id.startswith("demo-20261127-120005-") for run_id in ids)
