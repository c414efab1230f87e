"""Point-to-point messages between an asynchronous node and the global model's host.

A message is three sends on a two-rank process group: a header (int64: kind, body bytes,
tensor elements), the body (a Python value as runtime/state_file.py bytes: JSON + safetensors,
never pickle) and, when the header says so, one flat fp32 tensor (a pseudo-gradient or the
global parameters). torch.distributed point-to-point carries them: gloo for CPU tensors, the
world's backend otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from geodiloco.runtime.state_file import from_bytes, to_bytes

PUSH = 1
"""node -> host: a phase's statistics and pseudo-gradient; the reply carries the newest global model."""
DONE = 2
"""node -> host: this node ran its last phase; the reply (once every node is done) is the final model."""
RECORD = 3
"""node -> host: this node's last idle record and saved round; no reply."""
REPLY = 4
"""host -> node: the answer to PUSH or DONE."""

KIND_NAMES = {PUSH: "push", DONE: "done", RECORD: "record", REPLY: "reply"}


class ProtocolError(RuntimeError):
    """A peer sent a message this protocol does not expect (another version, or not a GeoDiLoCo node)."""


@dataclass
class Message:
    kind: int
    body: Any
    tensor: Optional[torch.Tensor] = None


def send_message(message: Message, peer_rank: int, group) -> int:
    """Send ``message`` to global rank ``peer_rank``; returns the bytes put on the wire."""
    body = to_bytes(message.body)
    numel = 0 if message.tensor is None else message.tensor.numel()
    header = torch.tensor([message.kind, len(body), numel], dtype=torch.int64)
    dist.send(header, dst=peer_rank, group=group)
    dist.send(torch.frombuffer(bytearray(body), dtype=torch.uint8), dst=peer_rank, group=group)
    if message.tensor is not None:
        dist.send(message.tensor.detach().to(torch.float32).contiguous(), dst=peer_rank, group=group)
    return header.numel() * 8 + len(body) + numel * 4


def receive_message(peer_rank: int, group, expected: tuple[int, ...]) -> Message:
    """The next message from global rank ``peer_rank``; ``ProtocolError`` unless its kind is one of
    ``expected``."""
    header = torch.zeros(3, dtype=torch.int64)
    dist.recv(header, src=peer_rank, group=group)
    kind, body_size, numel = (int(value) for value in header.tolist())
    if kind not in expected or body_size < 0 or numel < 0:
        wanted = ", ".join(KIND_NAMES.get(item, str(item)) for item in expected)
        raise ProtocolError(f"rank {peer_rank} sent message kind {kind} ({body_size} body bytes); expected {wanted}")
    body_buffer = torch.zeros(body_size, dtype=torch.uint8)
    dist.recv(body_buffer, src=peer_rank, group=group)
    body = from_bytes(body_buffer.numpy().tobytes())
    tensor = None
    if numel:
        tensor = torch.zeros(numel, dtype=torch.float32)
        dist.recv(tensor, src=peer_rank, group=group)
    return Message(kind, body, tensor)
