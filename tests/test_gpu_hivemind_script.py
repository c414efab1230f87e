"""experiments/gpu/hivemind_cuda.sh refuses bad options before it starts any node (the runs themselves
need a GPU host and minutes: experiments/results/gpu/h200-d/)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "experiments" / "gpu" / "hivemind_cuda.sh"


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out"), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("args, message", [
    (["cuda", "--threads", "0"], "--threads must be a count or torch"),
    (["cpu", "--threads", "many"], "--threads must be a count or torch"),
    (["--outer-device", "tpu"], "--outer-device must be cpu or cuda"),
    (["cuda", "--rounds", "-1"], "--rounds must be a positive count"),
    (["cuda", "--fast"], "unknown option '--fast'"),
])
def test_bad_options_exit_2_naming_the_option_and_start_nothing(tmp_path, args, message):
    result = _run(tmp_path, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "out" / "a.log").exists()


def test_help_explains_the_thread_split():
    result = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    assert "--threads: each node's OMP_NUM_THREADS (default: this host's cores / 2" in result.stdout
