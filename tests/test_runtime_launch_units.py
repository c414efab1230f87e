"""The launcher's hold on a run directory another user may have prepared: links there are not written through."""
from __future__ import annotations

import pytest

from geodiloco.common.schema import ConfigError
from geodiloco.runtime.checkpoint import write_text_durably
from geodiloco.runtime.launch import LOCK_FILE, hold_run_dir


def test_a_link_in_place_of_the_lock_file_is_refused_and_its_target_left_alone(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / LOCK_FILE).symlink_to(victim)
    with pytest.raises(ConfigError, match=f"--run-dir {run_dir}: cannot take its {LOCK_FILE} .*a link there is refused"):
        hold_run_dir(run_dir)
    assert victim.read_text() == "keep me\n"


def test_the_saved_config_replaces_a_link_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "config.yaml").symlink_to(victim)
    write_text_durably(tmp_path / "config.yaml", "run: {name: x}\n")
    assert victim.read_text() == "keep me\n"
    assert not (tmp_path / "config.yaml").is_symlink() and (tmp_path / "config.yaml").read_text() == "run: {name: x}\n"


def test_the_lock_is_taken_once(tmp_path):
    held = hold_run_dir(tmp_path)
    try:
        with pytest.raises(ConfigError, match="in use by another geodiloco run"):
            hold_run_dir(tmp_path)
    finally:
        held.close()
