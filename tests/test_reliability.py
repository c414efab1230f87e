"""Reliability: what a user gets back when the input is hostile or broken (exit code, message, what survives)."""
from __future__ import annotations

import pytest
import yaml

from geodiloco.predictor.schema import ConfigError
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
    assert f"{section} name {bad_name!r} may only hold letters, digits" in str(err.value)


def test_the_launcher_refuses_a_traversing_node_name_before_writing_anything(tmp_path):
    config = small_config([{"name": "x/../../pwn", "gpus": ["RTX 3090"]}])
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    result = geodiloco("run", "--sites", "local", "--config", str(path), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "node name 'x/../../pwn' may only hold" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path.parent / "pwn").exists()
