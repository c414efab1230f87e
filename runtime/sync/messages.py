"""Point-to-point messages between an asynchronous node and the global model's host.

A message is a header (int64: kind, body bytes), the body (a Python value as
runtime/state_file.py bytes: JSON + safetensors, never pickle), then the tensors the body lists
under ``tensors`` as (dtype, elements): a pseudo-gradient, the global model or an encoded
difference (runtime/sync/async_wire.py). Two-rank process groups carry them with
torch.distributed point-to-point: gloo for CPU tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field

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
WIRE_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "uint8": torch.uint8}
MAX_TENSORS = 4


class ProtocolError(RuntimeError):
    """A peer sent a message this protocol does not expect (another version, or not a GeoDiLoCo node)."""


@dataclass
class Message:
    kind: int
    body: dict
    tensors: list[torch.Tensor] = field(default_factory=list)


def _dtype_name(tensor: torch.Tensor) -> str:
    for name, dtype in WIRE_DTYPES.items():
        if tensor.dtype == dtype:
            return name
    raise ValueError(f"cannot send a {tensor.dtype} tensor (use one of {', '.join(WIRE_DTYPES)})")


def send_message(message: Message, peer_rank: int, group) -> int:
    """Send ``message`` to global rank ``peer_rank``; returns the bytes put on the wire."""
    tensors = [tensor.detach().contiguous().cpu() for tensor in message.tensors]
    body = to_bytes({**message.body, "tensors": [[_dtype_name(tensor), tensor.numel()] for tensor in tensors]})
    header = torch.tensor([message.kind, len(body)], dtype=torch.int64)
    dist.send(header, dst=peer_rank, group=group)
    dist.send(torch.frombuffer(bytearray(body), dtype=torch.uint8), dst=peer_rank, group=group)
    for tensor in tensors:
        dist.send(tensor, dst=peer_rank, group=group)
    return header.numel() * 8 + len(body) + sum(tensor.numel() * tensor.element_size() for tensor in tensors)


def receive_message(peer_rank: int, group, expected: tuple[int, ...]) -> Message:
    """The next message from global rank ``peer_rank``; ``ProtocolError`` unless its kind is one of
    ``expected`` and its tensor list is well formed."""
    header = torch.zeros(2, dtype=torch.int64)
    dist.recv(header, src=peer_rank, group=group)
    kind, body_size = (int(value) for value in header.tolist())
    if kind not in expected or body_size < 0:
        wanted = ", ".join(KIND_NAMES.get(item, str(item)) for item in expected)
        raise ProtocolError(f"rank {peer_rank} sent message kind {kind} ({body_size} body bytes); expected {wanted}")
    body_buffer = torch.zeros(body_size, dtype=torch.uint8)
    dist.recv(body_buffer, src=peer_rank, group=group)
    body = from_bytes(body_buffer.numpy().tobytes())
    listed = body.pop("tensors", []) if isinstance(body, dict) else None
    if not isinstance(listed, list) or len(listed) > MAX_TENSORS or not all(
            isinstance(item, list) and len(item) == 2 and item[0] in WIRE_DTYPES and isinstance(item[1], int)
            and item[1] >= 0 for item in listed):
        raise ProtocolError(f"rank {peer_rank} sent a malformed tensor list: {listed!r:.200}")
    tensors = []
    for dtype_name, numel in listed:
        tensor = torch.zeros(numel, dtype=WIRE_DTYPES[dtype_name])
        dist.recv(tensor, src=peer_rank, group=group)
        tensors.append(tensor)
    return Message(kind, body, tensors)
