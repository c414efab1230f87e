"""Scripts that reproduce published figures answer a missing input in one line with exit 2, naming the path and
what it should hold (they ended in tracebacks, and some made an empty results folder first)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script, args, message", [
    ("gpu/warm_accuracy.py", ["{tmp}/none.json"], "{tmp}/none.json: no such sweep file"),
    ("gpu/probe_accuracy.py", ["--results", "{tmp}/none"], "--results {tmp}/none: no such folder"),
    ("gpu/cold_accuracy.py", ["{tmp}/none"], "{tmp}/none: no such folder"),
    ("paper4/analyze.py", ["--results", "{tmp}/none"], "--results {tmp}/none: no manifest.json"),
    ("async/head_to_head.py", ["--analyze-only", "--results", "{tmp}/none", "--runs-dir", "{tmp}/runs"],
     "--analyze-only: {tmp}/none has no manifest.json"),
    ("paper4/reproduce.py", ["--policies", "uniform,bogus", "--results", "{tmp}/none", "--runs-dir", "{tmp}/runs"],
     "--policies: unknown ['bogus']"),
])
def test_a_missing_input_is_one_line_and_exit_2(tmp_path, script, args, message):
    result = subprocess.run([sys.executable, str(REPO / "experiments" / script),
                             *[arg.format(tmp=tmp_path) for arg in args]], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message.format(tmp=tmp_path) in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "none").exists()  # nothing was made on the way


def test_paper4_run_sh_takes_relative_result_paths_from_where_it_is_started(tmp_path):
    result = subprocess.run(["bash", str(REPO / "experiments" / "paper4" / "run.sh"), "--analyze-only", "--results",
                             "mine"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                            env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert result.returncode == 2, result.stderr
    assert f"{tmp_path / 'mine'} has no manifest.json" in result.stderr  # not REPO/mine


@pytest.mark.parametrize("script", ["runtime/bench_flush.py", "predictor/select_model.py", "hf/prepare_data.py",
                                    "runtime/bench_outer_step.py"])
def test_script_help_gives_its_summary_once_and_then_what_it_measures_and_writes(script):
    result = subprocess.run([sys.executable, str(REPO / "experiments" / script), "--help"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    summary = (REPO / "experiments" / script).read_text().split('"""')[1].split("\n\n")[0]
    assert result.stdout.count(summary.splitlines()[0]) == 1  # it was printed as the description and again below
    assert "Writes " in result.stdout or "Writes, under" in result.stdout
