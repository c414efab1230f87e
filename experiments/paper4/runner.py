"""Start one emulated-cluster run with `geodiloco run` and keep its small logs.

Each run is the real CLI in a child process (four training processes, one per
site), so what is measured is what a user gets. The run directory (with
checkpoints) stays under the runs folder; idle.jsonl, metrics.jsonl, plan.jsonl,
config.yaml and the console output are copied next to the results.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

KEPT_LOGS = ("idle.jsonl", "metrics.jsonl", "plan.jsonl", "config.yaml", "eval.jsonl", "site_traffic.json")
SLOW_STEPS = re.compile(r"node (\S+): (\d+) steps were slower than the emulated GPU's target")


@dataclass
class RunOutcome:
    """What one `geodiloco run` did: exit code, seconds it took, steps slower than their target per node."""

    name: str
    command: list[str]
    exit_code: int
    duration_s: float
    slow_steps: dict


def display_path(path: Path, root: Path) -> str:
    """``path`` relative to the checkout when inside it (no machine-specific prefixes in the results)."""
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def slow_steps_from_console(text: str) -> dict:
    """``{node: count}`` from the runtime's "N steps were slower than the emulated GPU's target" lines."""
    return {node: int(count) for node, count in SLOW_STEPS.findall(text)}


def geodiloco_command(config_path: str, run_dir: str, sites: str) -> list[str]:
    return ["geodiloco", "run", "--config", config_path, "--sites", sites, "--run-dir", run_dir, "--no-report"]


def evaluate_offline(run_dir: Path, root: Path, kept: Path) -> None:
    """`geodiloco evaluate RUN_DIR`: every kept round's global model on the held-out set (eval.jsonl)."""
    completed = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", "evaluate", str(run_dir)], cwd=root,
                               capture_output=True, text=True)
    (kept / "evaluate.log").write_text(completed.stdout + completed.stderr)
    if completed.returncode != 0:
        raise RuntimeError(f"geodiloco evaluate {run_dir} failed:\n{completed.stderr[-2000:]}")


def run_policy(name: str, config: dict, root: Path, configs_dir: Path, runs_dir: Path, kept_dir: Path,
               sites: str) -> RunOutcome:
    """Write the config, run it from ``root``, copy its logs to ``kept_dir/name``; raises on failure."""
    configs_dir.mkdir(parents=True, exist_ok=True)
    config_path = configs_dir / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    run_dir = runs_dir / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    command = geodiloco_command(display_path(config_path, root), display_path(run_dir, root), sites)
    started = time.perf_counter()
    completed = subprocess.run([sys.executable, "-m", "geodiloco.runtime.cli", *command[1:]], cwd=root,
                               capture_output=True, text=True)
    duration_s = time.perf_counter() - started
    console = completed.stdout + completed.stderr
    kept = kept_dir / name
    if kept.exists():
        shutil.rmtree(kept)
    kept.mkdir(parents=True)
    (kept / "console.log").write_text(console)
    if completed.returncode != 0:
        tail = "\n".join(console.splitlines()[-20:])
        raise RuntimeError(f"run {name} failed with exit code {completed.returncode}:\n{tail}")
    if config.get("data", {}).get("eval_every_rounds") == 0:
        evaluate_offline(run_dir, root, kept)
    for log_name in KEPT_LOGS:
        source = run_dir / log_name
        if source.is_file():
            shutil.copyfile(source, kept / log_name)
    return RunOutcome(name=name, command=command, exit_code=completed.returncode,
                      duration_s=duration_s, slow_steps=slow_steps_from_console(console))


def require_lab(script: str) -> None:
    """Stop ``script`` with a clear message unless network namespaces and CPU quotas are usable (root)."""
    from geodiloco.lab.cpu_share import can_use_cpu_share
    from geodiloco.lab.sites import can_use_netns
    for check in (can_use_netns, can_use_cpu_share):
        usable, reason = check()
        if not usable:
            raise SystemExit(f"{script}: needs root for namespaces and CPU quotas: {reason}")


def start_manifest(manifest_path: Path, command: str, run_names: set, settings: dict) -> tuple[dict, dict]:
    """(new manifest, previous one) of a benchmark that (re)runs ``run_names``: the previous manifest's
    commands and its other runs are kept, with ``settings``, the load average and the date."""
    import json
    import os
    previous = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    kept = [run for run in previous.get("runs", []) if run["name"] not in run_names]
    if not kept:  # every run is made anew: the earlier commands and their time no longer describe the results
        previous = {}
    manifest = {"command": command, "commands": previous.get("commands", []) + [command], **settings,
                "load_average_at_start": list(os.getloadavg()), "date": time.strftime("%Y-%m-%d %H:%M %Z"),
                "runs": kept}
    return manifest, previous
