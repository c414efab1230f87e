"""What ``geodiloco run`` may do with a run directory, decided before any node starts.

- A directory that holds a checkpoint is only written to by that run's own ``--resume``.
- ``--resume`` needs a checkpoint to resume from.
- ``--resume`` with changed settings: the ones that can change mid-run (``RESUMABLE``) are applied
  and listed; any other change is refused naming the setting (the checkpoint was written for it).
"""
from __future__ import annotations

import re
import secrets
import time
from pathlib import Path
from typing import Any, Optional

import yaml

from geodiloco.common.schema import ConfigError
from geodiloco.runtime import checkpoint
from geodiloco.runtime.config import RunConfig, with_absolute_paths

CONFIG_FILE = "config.yaml"
RESUMABLE = ("diloco.rounds", "balancing", "checkpoint", "logging", "run.out_dir", "run.gpu_sample_interval_s",
             "run.max_wall_s", "data.eval_every_rounds", "comm.timeout_s", "comm.transfer_timeout_factor",
             "comm.transfer_min_timeout_s", "comm.init_timeout_s", "comm.elastic", "comm.min_nodes", "comm.hivemind")
"""Settings a resumed run may change: top-level sections or dotted keys (and everything below them)."""


AUTO_RUN_DIR = re.compile(r"-\d{8}-\d{6}(-\d+)?$")
"""The tail of a run directory ``geodiloco run`` named itself (``new_run_dir``); its run id takes the name."""


def new_run_dir(config) -> Path:
    """``run.out_dir/run.name-YYYYmmdd-HHMMSS``, made here so that two runs started in the same second get
    two directories (the second gets ``-2``, and so on) instead of one refusing the other's."""
    base = Path(config.run.out_dir) / f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    base.parent.mkdir(parents=True, exist_ok=True)
    candidate, number = base, 1
    while True:
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            number += 1
            candidate = base.with_name(f"{base.name}-{number}")


def run_id_for(config: RunConfig, run_dir: Path) -> str:
    """A new run's id: the name of a run directory ``new_run_dir`` made (so the logs and the directory say the
    same time) while it holds no log yet, else ``run.name-YYYYmmdd-HHMMSS-XXXX`` now, XXXX random (runs started in
    one second with their own --run-dir, a sweep, get ids of their own; a world that starts afresh after an
    elastic restart is another run than the one that logged there)."""
    if (run_dir.name.startswith(f"{config.run.name}-") and AUTO_RUN_DIR.search(run_dir.name)
            and not (run_dir / "idle.jsonl").exists()):
        return run_dir.name
    return f"{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def saved_config(run_dir: Path) -> Optional[Path]:
    path = run_dir / CONFIG_FILE
    return path if path.is_file() else None


def check_run_dir(run_dir: Path, resume: bool) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--run-dir {run_dir}: a file, not a run directory; choose another --run-dir")
    rounds = checkpoint.saved_global_rounds(run_dir)
    if rounds and not resume:
        raise ConfigError(f"--run-dir {run_dir} already holds a checkpoint (after round {rounds[-1] + 1}); pass "
                          "--resume to continue it, or choose another --run-dir")
    if resume and not rounds:
        raise ConfigError(f"--resume: {run_dir} holds no checkpoint to resume from; run without --resume to "
                          "start a new run there")


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: leaf value}; a list of sections (``nodes``) is entered item by item (``nodes[0].emulate.x``),
    so a change names its field rather than the whole list; a list of plain values is one leaf."""
    if isinstance(data, dict):
        flat: dict[str, Any] = {}
        for key, value in data.items():
            flat.update(flatten(value, f"{prefix}{key}."))
        return flat
    if isinstance(data, list) and data and all(isinstance(item, dict) for item in data):
        flat = {}
        for index, item in enumerate(data):
            flat.update(flatten(item, f"{prefix[:-1]}[{index}]."))
        return flat
    return {prefix[:-1]: data}


def changed_settings(saved: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """{dotted key: (saved value, new value)} for every leaf that differs."""
    before, after = flatten(saved), flatten(new)
    return {key: (before.get(key), after.get(key)) for key in sorted(set(before) | set(after))
            if before.get(key) != after.get(key)}


RESUMABLE_NODE_FIELDS = re.compile(r"nodes\[\d+\]\.(wan|emulate)(\.|$)")
"""A node's emulated link and virtual GPU may change on resume too: the checkpoint holds neither (the link is
also what ``--sites`` may switch between netns and loopback)."""


def resumable(key: str) -> bool:
    return (any(key == allowed or key.startswith(allowed + ".") for allowed in RESUMABLE)
            or RESUMABLE_NODE_FIELDS.match(key) is not None)


def resume_changes(run_dir: Path, config: RunConfig) -> list[str]:
    """Check ``config`` against the run's saved config; returns the applied changes as text lines.
    Raises ConfigError naming the settings a resume cannot change."""
    path = saved_config(run_dir)
    if path is None:
        return []
    saved = with_absolute_paths(yaml.safe_load(path.read_text()) or {}, Path.cwd())  # runs saved with relative paths
    done = checkpoint.latest_round(run_dir)
    if done is not None and config.diloco.rounds < done + 1:
        raise ConfigError(f"--resume: diloco.rounds {config.diloco.rounds} is below the {done + 1} rounds this run has "
                          f"done; give at least {done + 1} (the run then ends at once), or start a new run")
    changes = changed_settings(saved, yaml.safe_load(config.to_yaml()))
    refused = [key for key in changes if not resumable(key)]
    if refused:
        listed = ", ".join(f"{key} ({changes[key][0]!r} -> {changes[key][1]!r})" for key in refused[:5])
        raise ConfigError(f"--resume: {listed} cannot change in a resumed run (its checkpoint was written for the "
                          f"saved value); drop the change, or start a new run. Settings that may change: "
                          f"{', '.join(RESUMABLE)}, nodes[N].wan, nodes[N].emulate")
    from geodiloco.runtime.run_files import check_kept_files
    check_kept_files(run_dir, config)
    return [f"{key}: {before!r} -> {after!r}" for key, (before, after) in changes.items()]


def check_saved_tokenizer(config: RunConfig, config_path: Path) -> None:
    """The tokenizer a finished transformers run's config names is still there (``export`` and ``evaluate``
    load it)."""
    tokenizer = config.data.tokenizer
    if tokenizer and config.model.hf is not None and not Path(tokenizer).is_dir():
        raise ConfigError(f"data.tokenizer: {tokenizer} (from {config_path}) no longer exists; the run's tokenizer "
                          "is needed: put it back there, or edit data.tokenizer in that file")
