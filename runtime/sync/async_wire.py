"""Compressed pushes and pulls of asynchronous DiLoCo (``diloco.compression`` under ``mode: async``).

Push: a node encodes its pseudo-gradient plus the rounding residual of its previous push
(error feedback, as in the synchronous codecs of runtime/sync/wire.py); the residual of this
one is kept for the next.

Pull: the host keeps, per remote node, a *shadow*: exactly the model that node holds. A reply
carries ``encode(global - shadow)``; host and node both add the decoded difference (the same
bytes through the same decode), so the node's model equals its shadow bit for bit, and what
the rounding left out is part of the next difference: the error never accumulates.

Tensors travel as raw bytes (uint8 views) with their dtype and length named in the message
body (runtime/sync/messages.py).
"""
from __future__ import annotations

from typing import Optional

import torch

from geodiloco.balancer.network import CHUNK_ELEMENTS
from geodiloco.runtime.sync.wire import FLOAT_WIRE_DTYPES, Encoded, decode, encode


def _padded(flat: torch.Tensor, codec: str) -> torch.Tensor:
    if codec in FLOAT_WIRE_DTYPES:
        return flat
    length = -(-flat.numel() // CHUNK_ELEMENTS) * CHUNK_ELEMENTS
    if length == flat.numel():
        return flat
    return torch.cat([flat, flat.new_zeros(length - flat.numel())])


def pack(codec: str, flat: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(tensors to send, what they decode to (length of ``flat``)) for a flat fp32 vector."""
    if codec == "none":
        return [flat], flat
    encoded = encode(codec, _padded(flat, codec))
    tensors = [encoded.payload] + ([encoded.scales] if encoded.scales is not None else [])
    return tensors, decode(codec, encoded)[:flat.numel()]


def unpack(codec: str, tensors: list[torch.Tensor], numel: int) -> torch.Tensor:
    """The flat fp32 vector of ``numel`` elements that ``pack`` sent."""
    if codec == "none":
        return tensors[0]
    scales = tensors[1] if len(tensors) > 1 else None
    return decode(codec, Encoded(tensors[0], scales))[:numel]


class PushFeedback:
    """A node's push with error feedback: what it sends and the residual it carries (checkpointed)."""

    def __init__(self, codec: str) -> None:
        self.codec = codec
        self.residual: Optional[torch.Tensor] = None

    def encode(self, pseudo_gradient: torch.Tensor) -> list[torch.Tensor]:
        compensated = pseudo_gradient if self.residual is None else pseudo_gradient + self.residual
        tensors, decoded = pack(self.codec, compensated)
        if self.codec != "none":
            self.residual = compensated - decoded
        return tensors

    def state_dict(self) -> dict:
        return {"residual": self.residual}

    def load_state_dict(self, state: dict) -> None:
        self.residual = state.get("residual")


class PullShadows:
    """The host's copy of each remote node's model; pulls are encoded differences from it."""

    def __init__(self, codec: str, names: list[str], global_flat: torch.Tensor) -> None:
        self.codec = codec
        self.shadows = {name: global_flat.clone() for name in names} if codec != "none" else {}

    def encode(self, node: str, global_flat: torch.Tensor) -> list[torch.Tensor]:
        """What to send ``node`` so it holds (about) ``global_flat``: the whole model (``none``) or
        the encoded difference from its shadow, which moves by the decoded difference."""
        if self.codec == "none":
            return [global_flat]
        shadow = self.shadows[node]
        tensors, decoded = pack(self.codec, global_flat - shadow)
        shadow.add_(decoded)
        return tensors


def apply_pull(codec: str, tensors: list[torch.Tensor], pulled_flat: torch.Tensor) -> torch.Tensor:
    """The node's side of ``PullShadows.encode``: its new model from its previous one."""
    if codec == "none":
        return tensors[0]
    return pulled_flat + unpack(codec, tensors, pulled_flat.numel())
