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

from geodiloco.predictor.schema import ConfigError
from geodiloco.predictor.workload import hf_config_json

def read_hf_config(path: Path, field: str) -> dict:
    """config.json as a dict, read without transformers (the predictor needs only its shape)."""
    if not path.is_file():
        raise ConfigError(f"{field}: {path} does not exist; give a transformers config.json "
                          "(or a directory holding one)")
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
    return HFCausalLM(hf_model)


def export_pretrained(model: HFCausalLM, out_dir: Path, tokenizer_dir: Optional[str]) -> None:
    """Write ``model`` as a ``save_pretrained`` directory (safetensors weights + config.json),
    with the run's tokenizer beside it when there is one, so ``from_pretrained(out_dir)`` loads it."""
    model.hf.save_pretrained(out_dir)
    if tokenizer_dir:
        from transformers import AutoTokenizer
        AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(out_dir)
