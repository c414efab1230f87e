"""Transformer workload description: LLaMA-style decoder dimensions and presets.

The presets are the single source of model shapes: runtime/models.py builds the
torch module from them, and the predictor's cost model reads them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelDims:
    """Shape of a LLaMA-style decoder (RMSNorm, rotary, SwiGLU, untied head)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    max_seq_len: int
    tie_embeddings: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, ModelDims] = {
    # Trains in seconds on one CPU core; byte-level vocabulary.
    "tiny": ModelDims(hidden_size=128, intermediate_size=352, num_layers=2,
                      num_heads=4, vocab_size=256, max_seq_len=256),
    # A few million parameters; still CPU-friendly.
    "small": ModelDims(hidden_size=256, intermediate_size=688, num_layers=4,
                       num_heads=8, vocab_size=256, max_seq_len=512),
    # OpenDiLoCo / source-paper configuration (about 150 M parameters).
    "llama-150m": ModelDims(hidden_size=1024, intermediate_size=4096, num_layers=12,
                            num_heads=16, vocab_size=32000, max_seq_len=1024),
}


def preset_dims(name: str) -> ModelDims:
    """Dimensions of a named preset; the error lists the known names."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise ValueError(f"unknown model preset {name!r}; known presets: {known}") from None
