"""A LLaMA-style decoder (RMSNorm, rotary embeddings, SwiGLU) built from ModelDims."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from geodiloco.predictor.workload import ModelDims

if TYPE_CHECKING:
    from geodiloco.runtime.config import ModelSection


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (x.float() * scale).type_as(x) * self.weight


def rotary_tables(head_dim: int, max_seq_len: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (max_seq_len, head_dim // 2) for rotary position embedding."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim))
    angles = torch.outer(torch.arange(max_seq_len).float(), inv_freq)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (even, odd) of the last dim of x (batch, heads, seq, head_dim)."""
    x_even, x_odd = x[..., 0::2], x[..., 1::2]
    rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
    return rotated.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.num_heads = dims.num_heads
        self.head_dim = dims.hidden_size // dims.num_heads
        self.qkv = nn.Linear(dims.hidden_size, 3 * dims.hidden_size, bias=False)
        self.out = nn.Linear(dims.hidden_size, dims.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        qkv = self.qkv(x).view(batch, seq, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        query, key, value = apply_rotary(qkv[0], cos, sin), apply_rotary(qkv[1], cos, sin), qkv[2]
        attended = F.scaled_dot_product_attention(query, key, value, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(batch, seq, hidden))


class SwiGLU(nn.Module):
    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.gate = nn.Linear(dims.hidden_size, dims.intermediate_size, bias=False)
        self.up = nn.Linear(dims.hidden_size, dims.intermediate_size, bias=False)
        self.down = nn.Linear(dims.intermediate_size, dims.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(dims.hidden_size)
        self.attn = Attention(dims)
        self.mlp_norm = RMSNorm(dims.hidden_size)
        self.mlp = SwiGLU(dims)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """Causal language model; ``forward(tokens, targets)`` returns the mean cross-entropy."""

    def __init__(self, dims: ModelDims) -> None:
        super().__init__()
        if dims.hidden_size % dims.num_heads:
            raise ValueError(f"hidden_size {dims.hidden_size} is not divisible by num_heads {dims.num_heads}")
        self.dims = dims
        self.embed = nn.Embedding(dims.vocab_size, dims.hidden_size)
        self.blocks = nn.ModuleList(Block(dims) for _ in range(dims.num_layers))
        self.norm = RMSNorm(dims.hidden_size)
        self.head = nn.Linear(dims.hidden_size, dims.vocab_size, bias=False)
        if dims.tie_embeddings:
            self.head.weight = self.embed.weight
        cos, sin = rotary_tables(dims.hidden_size // dims.num_heads, dims.max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        seq = tokens.shape[1]
        if seq > self.dims.max_seq_len:
            raise ValueError(f"sequence length {seq} exceeds the model's max_seq_len {self.dims.max_seq_len}")
        cos, sin = self.rope_cos[:seq], self.rope_sin[:seq]
        hidden = self.embed(tokens)
        for block in self.blocks:
            hidden = block(hidden, cos, sin)
        logits = self.head(self.norm(hidden))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def build_configured_model(model: "ModelSection", seed: int) -> nn.Module:
    """The config's model: the built-in decoder, or a transformers model (``model.hf``). Every
    node builds the same initial weights from ``seed`` (the outer sync assumes it)."""
    if model.hf is not None:
        from geodiloco.runtime.hf_model import build_hf_model
        return build_hf_model(model.hf.config, model.hf.pretrained, seed)
    return build_model(model.dims(), seed)


def build_model(dims: ModelDims, seed: int) -> Decoder:
    """Same seed, same initial weights on every node (the outer sync assumes it)."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = Decoder(dims)
    torch.random.set_rng_state(generator_state)
    return model


def parameter_count(model: nn.Module) -> int:
    return sum(param.numel() for param in model.parameters())
