"""Hugging Face transformers causal LMs as training models (``model: {hf: {config|pretrained}}``).

The runtime trains any module whose ``forward(tokens, targets=None)`` returns logits, or the
mean next-token cross-entropy when ``targets`` are given (the built-in decoder's contract).
``HFCausalLM`` wraps ``AutoModelForCausalLM`` in that contract, so DiLoCo, the sync backends,
evaluation and checkpoints are unchanged: pseudo-gradients are taken over
``module.parameters()``, which lists a tied weight (embedding = head) once.

transformers is an optional extra (``pip install 'geodiloco[hf]'``); it is imported only here,
and only when a config asks for a transformers model.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from geodiloco.common.schema import ConfigError
from geodiloco.predictor.workload import hf_config_json

def read_hf_config(path: Path, field: str) -> dict:
    """config.json as a dict, read without transformers (the predictor needs only its shape)."""
    if not path.is_file():
        wanted = ("a save_pretrained directory (it holds config.json and the weights)" if field.endswith("pretrained")
                  else "a transformers config.json (or a directory holding one)")
        relative = "" if path.is_absolute() else f" (relative paths are read from the current directory, {Path.cwd()})"
        raise ConfigError(f"{field}: {path} does not exist{relative}; give {wanted}")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{field}: {path} is not a JSON transformers config ({err})") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigError(f"{field}: {path} has no model_type; a transformers config.json names one "
                          "(e.g. \"model_type\": \"llama\")")
    return data


class HFCausalLM(nn.Module):
    """A transformers causal LM behind the runtime's ``forward(tokens, targets)`` contract.

    ``targets`` are already shifted (the data pipeline yields inputs and next tokens), so the
    loss is computed here rather than through the model's ``labels`` (which would shift again).
    """

    def __init__(self, hf_model: nn.Module) -> None:
        super().__init__()
        self.hf = hf_model

    def forward(self, tokens: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        logits = self.hf(input_ids=tokens, use_cache=False).logits
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def build_hf_model(config: Optional[str], pretrained: Optional[str], seed: int) -> HFCausalLM:
    """A freshly initialised model from ``config`` (seeded: every node starts from the same
    weights) or the weights saved in the ``pretrained`` directory, in fp32."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if pretrained:
        hf_model = AutoModelForCausalLM.from_pretrained(pretrained)
    else:
        hf_config = AutoConfig.from_pretrained(str(hf_config_json(config, None)))
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        hf_model = AutoModelForCausalLM.from_config(hf_config)
        torch.random.set_rng_state(generator_state)
    hf_model = hf_model.float()
    hf_model.config.use_cache = False
    check_causal(hf_model, f"model.hf.{'pretrained' if pretrained else 'config'}")
    return HFCausalLM(hf_model)


@torch.no_grad()
def check_causal(hf_model: nn.Module, field: str) -> None:
    """Refuse a model whose outputs at a position depend on later tokens: transformers builds encoder
    models (BERT and its kin without ``is_decoder``) as "causal LMs" that attend both ways, and trained on
    next tokens they would read the answer. Two sequences that differ only in their last token must give
    the same logits everywhere before it."""
    vocab_size = int(getattr(hf_model.config, "vocab_size", 0) or 0)
    if vocab_size < 2:
        return
    was_training = hf_model.training
    hf_model.eval()
    try:
        tokens = torch.arange(1, 6).remainder(vocab_size).unsqueeze(0)
        changed = tokens.clone()
        changed[0, -1] = (changed[0, -1] + 1) % vocab_size
        before = hf_model(input_ids=tokens, use_cache=False).logits[0, :-1]
        after = hf_model(input_ids=changed, use_cache=False).logits[0, :-1]
    finally:
        hf_model.train(was_training)
    if not torch.allclose(before, after, rtol=1e-4, atol=1e-5):
        model_type = getattr(hf_model.config, "model_type", "?")
        raise ConfigError(f"{field}: the {model_type!r} model attends to later tokens (its outputs change with the "
                          "next token), so it is not a causal language model; set \"is_decoder\": true in its "
                          "config.json if the model type has a decoder mode, or use a decoder-only model")


def export_pretrained(model: HFCausalLM, out_dir: Path, tokenizer_dir: Optional[str]) -> None:
    """Write ``model`` as a ``save_pretrained`` directory (safetensors weights + config.json),
    with the run's tokenizer beside it when there is one, so ``from_pretrained(out_dir)`` loads it.

    The saved config is made for using the model, not for training it: ``use_cache`` back on (training
    turns it off; generating without it is many times slower), and the special token ids those of the
    tokenizer the model learned, where the config's own (a model class's defaults) would make
    ``generate()`` stop on an ordinary token or name ids outside the vocabulary."""
    hf_config = model.hf.config
    hf_config.use_cache = True
    tokenizer = None
    if tokenizer_dir:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        for name, token_id in special_token_ids(tokenizer, hf_config.vocab_size).items():
            setattr(hf_config, name, token_id)
            if getattr(model.hf, "generation_config", None) is not None:
                setattr(model.hf.generation_config, name, token_id)
    if getattr(model.hf, "generation_config", None) is not None:
        model.hf.generation_config.use_cache = True
    model.hf.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)


def special_token_ids(tokenizer, vocab_size: int) -> dict[str, Optional[int]]:
    """``bos_token_id``, ``eos_token_id`` and ``pad_token_id`` of ``tokenizer`` for the model's config: the
    tokenizer's own where it has one inside the vocabulary (a document separator serves as end of text, as
    the data pipeline appends it), else None (a default of the model class is no token of this tokenizer)."""
    from geodiloco.runtime.hf_data import separator_id
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": separator_id(tokenizer),
           "pad_token_id": tokenizer.pad_token_id}
    return {name: int(token_id) if token_id is not None and 0 <= int(token_id) < vocab_size else None
            for name, token_id in ids.items()}
