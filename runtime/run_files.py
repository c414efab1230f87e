"""The model config and tokenizer a transformers run trained with, kept in its run directory.

``config.yaml`` names them by path (``model.hf.config`` or ``.pretrained``, ``data.tokenizer``),
and those files belong to the user: a tokenizer retrained in place, an edited config.json or a
pretrained directory moved away would make ``geodiloco evaluate`` score with another tokenizer,
``export`` bundle the wrong one, or both fail on shapes that no longer match the checkpoints.
So a new run copies them into ``RUN_DIR/hf_model/config.json`` and ``RUN_DIR/tokenizer/`` (the
tokenizer's own files only: a model directory given as the tokenizer is not copied whole), and
``evaluate`` and ``export`` read the copies. Runs from before the copies read the paths, as before.
"""
from __future__ import annotations

import shlex
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from torch import nn

from geodiloco.common.schema import ConfigError

MODEL_DIR = "hf_model"
TOKENIZER_DIR = "tokenizer"


def save_run_files(run_dir: Path, config, model: nn.Module) -> None:
    """At a new run's start: the transformers config of ``model`` (an ``HFCausalLM``) and the run's tokenizer,
    each written once (several node leaders may share the run directory; the first to finish keeps it)."""
    if config.model.hf is not None and hasattr(model, "hf"):
        _write_folder(run_dir / MODEL_DIR, lambda folder: model.hf.config.save_pretrained(folder))
    if config.data.tokenizer:
        from geodiloco.runtime.hf_data import load_tokenizer
        _write_folder(run_dir / TOKENIZER_DIR,
                      lambda folder: load_tokenizer(config.data.tokenizer).save_pretrained(folder))


def _write_folder(target: Path, write: Callable[[Path], object]) -> None:
    if target.is_dir():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        write(partial)
        partial.rename(target)
    except OSError:
        if not target.is_dir():  # not another node's copy in place: a real failure
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def load_run_config(run_dir: Path):
    """The run's ``config.yaml`` with ``model.hf`` and ``data.tokenizer`` pointing at the run's own copies where it
    has them, set before the config is checked: the paths it names may be gone since (the model is then built
    from its config; the checkpoints hold every weight)."""
    from geodiloco.common.schema import load_yaml_mapping
    from geodiloco.runtime.config import parse_config
    config_path = run_dir / "config.yaml"
    saved = load_yaml_mapping(config_path)
    model, data = saved.get("model"), saved.get("data")
    if isinstance(model, dict) and model.get("hf") and (run_dir / MODEL_DIR / "config.json").is_file():
        model["hf"] = {"config": str(run_dir / MODEL_DIR / "config.json")}
    if isinstance(data, dict) and data.get("tokenizer") and (run_dir / TOKENIZER_DIR).is_dir():
        data["tokenizer"] = str(run_dir / TOKENIZER_DIR)
    return parse_config(saved, str(config_path))


def load_parameters(model: nn.Module, params: list, source: str) -> None:
    """Copy checkpoint ``params`` into ``model``, refusing a model of another shape in one line: the model
    config the run names changed since it trained (``source`` says where the model came from)."""
    targets = list(model.parameters())
    if len(targets) != len(params):
        raise ConfigError(f"{source}: builds a model of {len(targets)} parameter tensors, the run's checkpoint "
                          f"holds {len(params)}; the model config changed since the run trained: restore it")
    for index, (target, saved) in enumerate(zip(targets, params)):
        if tuple(target.shape) != tuple(saved.shape):
            raise ConfigError(f"{source}: parameter tensor {index} is {tuple(target.shape)} in the model it builds "
                              f"but {tuple(saved.shape)} in the run's checkpoint; the model config changed since "
                              "the run trained: restore it")
        target.data.copy_(saved.to(target.dtype))


IGNORED_CONFIG_KEYS = {"transformers_version", "use_cache", "torch_dtype", "dtype", "architectures"}
"""Keys of a transformers config that ``save_pretrained`` or the runtime set on their own (the runtime trains in
fp32 with the cache off), so they say nothing about whether the user's config.json was edited."""


def check_kept_files(run_dir: Path, config) -> None:
    """On ``--resume``: the model config.json and tokenizer the config names still match the copies the run kept
    when it started. The checkpoints were trained with those: an edited config.json would fail on every node's
    restart with shapes that no longer fit, and a retrained tokenizer would feed the model other token ids than
    it learned while ``evaluate`` and ``export`` go on using the kept one."""
    hf = config.model.hf
    kept_config = run_dir / MODEL_DIR / "config.json"
    if hf is not None and kept_config.is_file():
        from geodiloco.predictor.workload import hf_config_json
        field = "model.hf.config" if hf.config else "model.hf.pretrained"
        named = hf_config_json(hf.config, hf.pretrained)
        changes = _config_changes(kept_config, named)
        if changes:
            raise ConfigError(f"--resume: {field}: {named} changed since this run started ({changes}); the run "
                              f"trained with its copy {kept_config}: put that back "
                              f"(cp {shlex.quote(str(kept_config))} {shlex.quote(str(named))}), "
                              "or start a new run")
    kept_tokenizer = run_dir / TOKENIZER_DIR
    if config.data.tokenizer and kept_tokenizer.is_dir():
        changes = _tokenizer_changes(kept_tokenizer, config.data.tokenizer)
        if changes:
            raise ConfigError(f"--resume: data.tokenizer: {config.data.tokenizer} changed since this run started "
                              f"({changes}); the model learned the token ids of the run's copy {kept_tokenizer}: "
                              f"put that back (cp -r {shlex.quote(f'{kept_tokenizer}/.')} {shlex.quote(config.data.tokenizer)}), "
                              "or start a new run")


def _config_changes(kept: Path, named: Path) -> str:
    """The settings that differ between two transformers config.json files, as text ('' when none)."""
    from transformers import AutoConfig
    if not named.is_file():
        return ""  # a moved config is read from the run's copy where it matters (evaluate, export)
    before, after = (AutoConfig.from_pretrained(str(path)).to_dict() for path in (kept, named))
    keys = sorted(key for key in set(before) | set(after)
                  if not key.startswith("_") and key not in IGNORED_CONFIG_KEYS and before.get(key) != after.get(key))
    return ", ".join(f"{key} {before.get(key)!r} -> {after.get(key)!r}" for key in keys[:5])


def _tokenizer_changes(kept: Path, named: str) -> str:
    """How the tokenizer at ``named`` differs from the run's copy in what the model sees: its vocabulary
    (token -> id) and its special tokens ('' when it does not)."""
    from geodiloco.runtime.hf_data import load_tokenizer
    if not Path(named).is_dir():
        return ""  # a missing tokenizer is refused by the preflight, with its own message
    before, after = load_tokenizer(str(kept)), load_tokenizer(named)
    vocab_before, vocab_after = before.get_vocab(), after.get_vocab()
    if vocab_before != vocab_after:
        moved = sum(1 for token, token_id in vocab_after.items() if vocab_before.get(token) != token_id)
        return f"vocabulary of {len(vocab_before)} tokens -> {len(vocab_after)}, {moved} token(s) new or renumbered"
    if before.special_tokens_map != after.special_tokens_map:
        return f"special tokens {before.special_tokens_map} -> {after.special_tokens_map}"
    changed = [text for text in TOKENIZER_PROBES if before.encode(text) != after.encode(text)]
    if changed:
        return f"the same vocabulary splits text differently (e.g. {changed[0]!r}: merges or normalization changed)"
    return ""


TOKENIZER_PROBES = (
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX, 1234567890 times: isn't it?",
    "def train(model, data):\n    return model.fit(data)  # tabs\tand spaces",
    "Unicode: café, naïve, Straße, 東京, emoji 🙂",
    "the the the there their then them these those other another together",
)
"""Texts both tokenizers encode on ``--resume``: a vocabulary can stay the same while merges or normalization
change how text splits into it."""
