"""Shared helpers for runtime tests: small configs and running `geodiloco run` in a subprocess."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent


def small_config(nodes: list[dict], **sections) -> dict:
    """A tiny, fast run config; ``sections`` replace whole top-level sections."""
    config = {
        "run": {"name": "test", "out_dir": "runs", "seed": 0},
        "model": {"preset": "tiny", "seq_len": 32},
        "data": {"source": "stdlib", "max_bytes": 300_000, "eval_batches": 1, "eval_batch_size": 4},
        "optim": {"inner": {"lr": 1.0e-3, "warmup_steps": 2}},
        # blocking fp32 sync: these tests check other behaviour; overlap and codecs have their own
        "diloco": {"rounds": 2, "local_steps": 3, "batch_size": 4, "overlap": "none", "compression": "none"},
        # fixed membership: torchrun agents cost seconds per run; elastic runs have their own tests
        "comm": {"timeout_s": 60, "elastic": {"enabled": False}},
        "nodes": nodes,
    }
    config.update(sections)
    return config


def write_config(tmp_path: Path, config: dict, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def geodiloco(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd or REPO_ROOT)


def start_run(config_path: Path, run_dir: Path, *extra: str, new_session: bool = False) -> subprocess.Popen:
    """`geodiloco run` in the background (for tests that signal or watch it); ``new_session``: as the
    foreground job of a terminal of its own, whose Ctrl+C is ``os.killpg(pid, SIGINT)`` (SIGINT is
    reset to its default: a pytest-xdist worker ignores it, and a child would inherit that)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    as_foreground_job = (lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) if new_session else None
    return subprocess.Popen([sys.executable, "-m", "geodiloco.runtime.cli", "run", "--no-report", "--config", str(config_path),
                             "--run-dir", str(run_dir), *extra], start_new_session=new_session,
                            preexec_fn=as_foreground_job,
                            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
