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
import tempfile
from pathlib import Path
from typing import Optional

import torch

from geodiloco.predictor.schema import ConfigError
from geodiloco.runtime import checkpoint
from geodiloco.runtime.config import load_config
from geodiloco.runtime.models import build_configured_model
from geodiloco.runtime.run_dir import check_saved_tokenizer


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
        listed = ", ".join(f"{index + 1} ({checkpoint.round_dir(run_dir, index).name})" for index in kept)
        raise ConfigError(f"--round {round_number}: not kept in {run_dir}; kept rounds (1-based, as the console "
                          f"prints them; the folders and the JSONL logs count from 0): {listed}")
    return round_number - 1


def export_global_model(run_dir: Path, out_dir: Path, round_number: Optional[int] = None) -> str:
    """Write the global model after round ``round_number`` (default: the latest) to ``out_dir``;
    returns a one-line description."""
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{run_dir}: no config.yaml; pass a run directory of geodiloco run")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError(f"--out {out_dir}: exists and is not empty; choose a new directory")
    config = load_config(config_path)
    check_saved_tokenizer(config, config_path)
    round_idx = chosen_round(run_dir, round_number)
    params = checkpoint.load_global(run_dir, round_idx)["outer"]["global_params"]
    model = build_configured_model(config.model, config.run.seed)
    with torch.no_grad():
        for target, source in zip(model.parameters(), params, strict=True):
            target.copy_(source)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:  # written beside out_dir, then moved into place: a failed export leaves nothing to clean up
        what = write_model_files(config, model, partial)
        umask = os.umask(0)
        os.umask(umask)
        partial.chmod(0o777 & ~umask)  # mkdtemp's folder is private; the export is as a mkdir would make it
        if out_dir.exists():
            out_dir.rmdir()  # empty, checked above
        partial.rename(out_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return f"round {round_idx + 1} of {run_dir} as {what} in {out_dir}"


def write_model_files(config, model: torch.nn.Module, out_dir: Path) -> str:
    """The model's files in ``out_dir``; returns what they are."""
    if config.model.hf is not None:
        from geodiloco.runtime.hf_model import export_pretrained
        export_pretrained(model, out_dir, config.data.tokenizer)
        return "a transformers save_pretrained directory"
    from safetensors.torch import save_model
    save_model(model, str(out_dir / "model.safetensors"))
    (out_dir / "dims.json").write_text(json.dumps(config.model.dims().to_dict(), indent=2) + "\n")
    return "model.safetensors + dims.json"
