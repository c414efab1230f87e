"""``geodiloco export``: a round's global model as files other tools load.

A transformers model (``model.hf``) becomes a ``save_pretrained`` directory (safetensors weights,
config.json, and the run's tokenizer), so ``AutoModelForCausalLM.from_pretrained(DIR)`` loads it
and ``model: {hf: {pretrained: DIR}}`` starts a new run from it. The built-in decoder becomes
``model.safetensors`` (its state dict) beside ``dims.json`` (its ModelDims).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

import torch

from geodiloco.common.schema import ConfigError
from geodiloco.runtime import checkpoint
from geodiloco.runtime.models import build_configured_model
from geodiloco.runtime.evaluation import model_source
from geodiloco.runtime.run_dir import check_saved_tokenizer
from geodiloco.runtime.run_files import load_parameters, load_run_config
from geodiloco.runtime.state_file import CorruptStateFile


def chosen_round(run_dir: Path, round_number: Optional[int]) -> int:
    """0-based index of the round to export: ``round_number`` (1-based, as the console prints "round 5/6"; the
    JSONL logs' ``round`` and the ``round_NNNNN`` folders count from 0) or the latest."""
    kept = checkpoint.kept_rounds(run_dir)
    if not kept:
        raise ConfigError(f"{run_dir}: no committed checkpoint to export (checkpoints/latest and a "
                          f"round_*/{checkpoint.GLOBAL_FILE})")
    if round_number is None:
        return kept[-1]
    if round_number - 1 not in kept:
        raise ConfigError(f"--round {round_number}: not kept in {run_dir}; kept rounds (1-based, as the console "
                          f"prints them; the folders and the JSONL logs count from 0): {kept_list(run_dir, kept)}")
    return round_number - 1


def kept_list(run_dir: Path, kept: list[int]) -> str:
    return ", ".join(f"{index + 1} ({checkpoint.round_dir(run_dir, index).name})" for index in kept)


def intact_global_params(run_dir: Path, round_number: Optional[int]) -> tuple[int, list]:
    """(0-based round, global parameters) of ``round_number`` (1-based), or of the newest kept round whose
    checkpoint verifies: a damaged newer one is named on stderr and passed over, as a resume does."""
    round_idx = chosen_round(run_dir, round_number)
    if round_number is not None:
        try:
            return round_idx, checkpoint.load_global(run_dir, round_idx)["outer"]["global_params"]
        except CorruptStateFile as err:
            others = [index for index in checkpoint.kept_rounds(run_dir) if index != round_idx]
            hint = f"; other kept rounds: {kept_list(run_dir, others)}" if others else ""
            raise ConfigError(f"--round {round_number}: {err}{hint}") from None
    refused = []
    for candidate in reversed(checkpoint.kept_rounds(run_dir)):
        try:
            params = checkpoint.load_global(run_dir, candidate)["outer"]["global_params"]
        except CorruptStateFile as err:
            refused.append(str(err))
            print(f"[geodiloco] checkpoint refused: {err}; an older round is exported instead", file=sys.stderr,
                  flush=True)
            continue
        return candidate, params
    raise ConfigError(f"{run_dir}: no kept round's global checkpoint is intact ({'; '.join(refused)})")


def export_global_model(run_dir: Path, out_dir: Path, round_number: Optional[int] = None) -> str:
    """Write the global model after round ``round_number`` (default: the latest) to ``out_dir``;
    returns a one-line description."""
    config_path = run_dir / "config.yaml"
    if not run_dir.is_dir():
        what = "a file, not a run directory" if run_dir.exists() else "no such directory"
        raise ConfigError(f"{run_dir}: {what}; pass a run directory of geodiloco run")
    if not config_path.is_file():
        raise ConfigError(f"{run_dir}: no config.yaml; pass a run directory of geodiloco run")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(f"--out {out_dir}: exists and is not empty; choose a new directory")
    config = load_run_config(run_dir)
    check_saved_tokenizer(config, config_path)
    round_idx, params = intact_global_params(run_dir, round_number)
    model = build_configured_model(config.model, config.run.seed)
    load_parameters(model, params, model_source(config))
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    except OSError as err:
        raise ConfigError(f"--out {out_dir}: cannot write in {out_dir.parent} "
                          f"({(err.strerror or str(err)).lower()}); choose another directory") from None
    try:  # written beside out_dir, then moved into place: a failed export leaves nothing to clean up
        what = write_model_files(config, model, partial)
        give_umask_modes(partial)
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        partial.rename(out_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return f"round {round_idx + 1} of {run_dir} as {what} in {out_dir}"


def give_umask_modes(folder: Path) -> None:
    """The modes a mkdir and a plain write would give under the umask: mkdtemp's folder is private, and some
    writers (safetensors) leave their files private too."""
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.rglob("*"):
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
    folder.chmod(0o777 & ~umask)


def write_model_files(config, model: torch.nn.Module, out_dir: Path) -> str:
    """The model's files in ``out_dir``; returns what they are."""
    if config.model.hf is not None:
        from geodiloco.runtime.hf_model import export_pretrained
        export_pretrained(model, out_dir, config.data.tokenizer)
        if config.data.token_file:
            return ("a transformers save_pretrained directory without a tokenizer (the run trained on the ids of "
                    f"data.token_file {config.data.token_file}: add the tokenizer that wrote them)")
        if not config.data.tokenizer:
            return ("a transformers save_pretrained directory without a tokenizer (the run trained on bytes: "
                    "token id = byte value of UTF-8 text)")
        return "a transformers save_pretrained directory"
    from safetensors.torch import save_model
    save_model(model, str(out_dir / "model.safetensors"))
    (out_dir / "dims.json").write_text(json.dumps(config.model.dims().to_dict(), indent=2) + "\n")
    return "model.safetensors + dims.json"
