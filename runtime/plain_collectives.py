"""Collectives for Python values without pickle: ``all_gather_object``'s and
``broadcast_object_list``'s jobs, carried as bytes of runtime/state_file.py's format (JSON +
safetensors), so a value from a peer is parsed, never executed."""
from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from geodiloco.runtime.state_file import from_bytes, to_bytes


def _as_tensor(payload: bytes, size: int) -> torch.Tensor:
    buffer = torch.zeros(size, dtype=torch.uint8)
    if payload:
        buffer[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    return buffer


def all_gather_values(value: Any, group=None) -> list[Any]:
    """Every rank's ``value`` (rank order) on every rank of ``group`` (default: the world)."""
    world_size = dist.get_world_size(group)
    payload = to_bytes(value)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([len(payload)], dtype=torch.int64), group=group)
    longest = max(int(size.item()) for size in sizes)
    received = [torch.zeros(longest, dtype=torch.uint8) for _ in range(world_size)]
    dist.all_gather(received, _as_tensor(payload, longest), group=group)
    return [from_bytes(buffer[:int(size.item())].numpy().tobytes()) for buffer, size in zip(received, sizes)]


def broadcast_value(value: Any, src: int, group=None) -> Any:
    """Global rank ``src``'s ``value`` on every rank of ``group`` (others pass anything)."""
    is_source = dist.get_rank() == src
    payload = to_bytes(value) if is_source else b""
    size = torch.tensor([len(payload)], dtype=torch.int64)
    dist.broadcast(size, src=src, group=group)
    buffer = _as_tensor(payload, int(size.item()))
    dist.broadcast(buffer, src=src, group=group)
    return value if is_source else from_bytes(buffer.numpy().tobytes())
