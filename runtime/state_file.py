"""Checkpoint files that cannot run code and prove they are intact.

A state (nested dicts, lists, tuples, numbers, strings, tensors: what the trainer saves) is
written as one safetensors file: the tensors as safetensors tensors, everything else as JSON in
the file's metadata, with a SHA-256 over both. Loading parses no pickle (safetensors and JSON
only) and recomputes the hash, so a truncated, overwritten or carelessly edited file is refused with
``CorruptStateFile`` instead of being trained on. The hash is not keyed: it finds damage, not a
deliberate edit by someone who may write the run directory (they may write a matching hash too).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

if TYPE_CHECKING:
    import torch

# torch is imported where tensors are handled, not here: `geodiloco run` checks a run directory's
# checkpoints before any node starts, and needs no torch for that.

FORMAT = "geodiloco-state/1"
TENSOR_TAG, TUPLE_TAG, ITEMS_TAG, FLOAT_TAG = "__tensor__", "__tuple__", "__items__", "__float__"


class CorruptStateFile(ValueError):
    """A state file that is unreadable, not ours, or whose content does not match its hash."""


def _encode(value: Any, tensors: dict[str, torch.Tensor], buffers: Optional[dict[str, torch.Tensor]] = None) -> Any:
    import torch
    if isinstance(value, torch.Tensor):
        key = f"t{len(tensors)}"
        buffer = buffers.get(key) if buffers else None
        if buffer is not None and buffer.shape == value.shape and buffer.dtype == value.dtype:
            tensors[key] = buffer.copy_(value.detach())
        else:
            tensors[key] = value.detach().to("cpu").contiguous().clone()
        return {TENSOR_TAG: key}
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return {FLOAT_TAG: repr(value)}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, tuple):
        return {TUPLE_TAG: [_encode(item, tensors, buffers) for item in value]}
    if isinstance(value, list):
        return [_encode(item, tensors, buffers) for item in value]
    if isinstance(value, dict):
        if all(isinstance(key, str) and not key.startswith("__") for key in value):
            return {key: _encode(item, tensors, buffers) for key, item in value.items()}
        return {ITEMS_TAG: [[_encode(key, tensors, buffers), _encode(item, tensors, buffers)]
                            for key, item in value.items()]}
    raise TypeError(f"cannot store a {type(value).__name__} in a state file")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(item, tensors) for item in value]
    if not isinstance(value, dict):
        return value
    if TENSOR_TAG in value:
        return tensors[value[TENSOR_TAG]]
    if FLOAT_TAG in value:
        return float(value[FLOAT_TAG])
    if TUPLE_TAG in value:
        return tuple(_decode(item, tensors) for item in value[TUPLE_TAG])
    if ITEMS_TAG in value:
        return {_decode(key, tensors): _decode(item, tensors) for key, item in value[ITEMS_TAG]}
    return {key: _decode(item, tensors) for key, item in value.items()}


def content_hash(structure: str, tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the JSON structure and every tensor's name, dtype, shape and bytes."""
    import torch
    digest = hashlib.sha256(structure.encode())
    for key in sorted(tensors):
        tensor = tensors[key].contiguous()
        digest.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        if tensor.numel():
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def to_bytes(state: Any) -> bytes:
    """``state`` as bytes for the wire (JSON structure + safetensors; no pickle, so a peer's
    bytes can at worst be malformed, never run code). The reverse is ``from_bytes``."""
    from safetensors.torch import save

    tensors: dict[str, torch.Tensor] = {}
    structure = json.dumps(_encode(state, tensors), allow_nan=False).encode()
    return len(structure).to_bytes(8, "little") + structure + save(tensors)


def from_bytes(data: bytes) -> Any:
    """The state ``to_bytes`` wrote; ``CorruptStateFile`` for anything else."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    size = int.from_bytes(data[:8], "little")
    try:
        structure = json.loads(data[8:8 + size].decode())
        return _decode(structure, load(data[8 + size:]))
    except (SafetensorError, UnicodeDecodeError, json.JSONDecodeError, KeyError, ValueError, TypeError,
            RecursionError) as err:
        raise CorruptStateFile(f"malformed state from a peer ({err})") from None


@dataclass(frozen=True)
class EncodedState:
    """A state taken apart for writing: its JSON structure and its tensors, copied to host memory.

    Encoding is the snapshot: later in-place updates of the trainer's tensors do not reach it, so
    the slow part (hashing every byte, writing the file) can run beside training
    (runtime/checkpoint_writer.py)."""

    structure: str
    tensors: dict[str, torch.Tensor]


def encode_state(state: Any, reuse: Optional[EncodedState] = None) -> EncodedState:
    """``state`` encoded, every tensor copied to host memory. ``reuse``: an earlier snapshot of a state of the
    same layout, no longer needed (its file is written), whose host buffers receive the copies instead of new
    allocations: copying into memory already mapped is several times faster than cloning a large state."""
    tensors: dict[str, torch.Tensor] = {}
    structure = json.dumps(_encode(state, tensors, reuse.tensors if reuse else None), allow_nan=False,
                           sort_keys=True)
    return EncodedState(structure, tensors)


def write_encoded(encoded: EncodedState, path: Path) -> None:
    """Write an encoded state to ``path`` with its SHA-256 (not atomic by itself; see runtime/checkpoint.py)."""
    from safetensors.torch import save_file

    metadata = {"format": FORMAT, "structure": encoded.structure,
                "sha256": content_hash(encoded.structure, encoded.tensors)}
    save_file(encoded.tensors, str(path), metadata=metadata)


def save_state(state: Any, path: Path) -> None:
    """Write ``state`` to ``path`` (not atomic by itself; see runtime/checkpoint.py)."""
    write_encoded(encode_state(state), path)


def load_state(path: Path) -> Any:
    """The state saved in ``path``; ``CorruptStateFile`` unless it is complete and unchanged."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, safe_open

    try:
        path.open("rb").close()  # safetensors reports an unreadable file as missing
    except OSError as err:
        raise CorruptStateFile(f"{path}: cannot be read ({(err.strerror or str(err)).lower()})") from None
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CorruptStateFile(f"{path}: not a readable safetensors file ({err})") from None
    if metadata.get("format") != FORMAT or "structure" not in metadata or "sha256" not in metadata:
        raise CorruptStateFile(f"{path}: not a GeoDiLoCo state file (format {metadata.get('format')!r})")
    if content_hash(metadata["structure"], tensors) != metadata["sha256"]:
        raise CorruptStateFile(f"{path}: content does not match its SHA-256; the file was changed or damaged")
    try:
        return _decode(json.loads(metadata["structure"]), tensors)
    except (json.JSONDecodeError, KeyError, ValueError, TypeError, RecursionError) as err:
        raise CorruptStateFile(f"{path}: malformed structure ({err})") from None


def load_structure(path: Path) -> Any:
    """The non-tensor part of the state saved in ``path``, each tensor given as None, read from the file's
    header alone: a few kilobytes, where ``load_state`` reads and hashes every byte. Not verified by its
    hash, so only for choosing among files that are loaded (and verified) afterwards."""
    from safetensors import SafetensorError
    from safetensors.torch import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            names = list(handle.keys())
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise CorruptStateFile(f"{path}: not a readable safetensors file ({err})") from None
    if metadata.get("format") != FORMAT or "structure" not in metadata:
        raise CorruptStateFile(f"{path}: not a GeoDiLoCo state file (format {metadata.get('format')!r})")
    try:
        return _decode(json.loads(metadata["structure"]), dict.fromkeys(names))
    except (json.JSONDecodeError, KeyError, ValueError, TypeError, RecursionError) as err:
        raise CorruptStateFile(f"{path}: malformed structure ({err})") from None
