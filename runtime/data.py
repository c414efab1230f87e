"""Offline, real-text training data: byte-level tokens, one disjoint shard per node.

The default corpus is the Python standard library's own source files, which
every machine with Python has. Users point ``data.source`` at text files or
directories instead. Token ids are raw bytes (0..255).
"""
from __future__ import annotations

import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

TEXT_SUFFIXES = {".txt", ".md", ".py", ".rst", ".json", ".jsonl", ".csv", ".html", ".tex"}


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(path for path in root.rglob("*.py")
                  if "site-packages" not in path.parts and "test" not in path.parts)


def user_files(source: str) -> list[Path]:
    path = Path(source)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(item for item in path.rglob("*") if item.is_file() and item.suffix in TEXT_SUFFIXES)
        if files:
            return files
        raise ValueError(f"data.source: {source} holds no text files ({', '.join(sorted(TEXT_SUFFIXES))})")
    raise ValueError(f"data.source: {source} is neither 'stdlib' nor an existing file or directory")


def load_corpus(source: str, max_bytes: int) -> np.ndarray:
    """The corpus as uint8 byte tokens, files in sorted order, cut at ``max_bytes``."""
    files = stdlib_files() if source == "stdlib" else user_files(source)
    chunks: list[bytes] = []
    total_bytes = 0
    for path in files:
        content = path.read_bytes()
        chunks.append(content)
        total_bytes += len(content)
        if total_bytes >= max_bytes:
            break
    return np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)


@dataclass
class ShardCursor:
    """Position in a shard's shuffled order of windows; saved in checkpoints."""

    epoch: int = 0
    index: int = 0


class NodeShard:
    """Fixed-length windows from one node's contiguous slice of the corpus.

    Windows are visited in a seeded random order per epoch, so the stream is
    deterministic given (seed, node index) and resumable from a ShardCursor.
    """

    def __init__(self, tokens: np.ndarray, node_index: int, num_nodes: int, seq_len: int, seed: int) -> None:
        shard_len = len(tokens) // num_nodes
        self.tokens = torch.from_numpy(tokens[node_index * shard_len:(node_index + 1) * shard_len].astype(np.int64))
        self.seq_len = seq_len
        self.num_windows = (len(self.tokens) - 1) // seq_len
        if self.num_windows < 1:
            raise ValueError(f"the corpus shard of node {node_index} ({shard_len} bytes) is shorter than "
                             f"seq_len + 1 = {seq_len + 1}; use more data or fewer nodes")
        self.seed = seed
        self.node_index = node_index
        self.cursor = ShardCursor()
        self._order = self._epoch_order(0)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.node_index, epoch])
        return rng.permutation(self.num_windows)

    def set_cursor(self, cursor: ShardCursor) -> None:
        self.cursor = ShardCursor(cursor.epoch, cursor.index)
        self._order = self._epoch_order(cursor.epoch)

    def next_batch(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), each (batch_size, seq_len) int64."""
        starts = []
        for _ in range(batch_size):
            if self.cursor.index >= self.num_windows:
                self.cursor = ShardCursor(self.cursor.epoch + 1, 0)
                self._order = self._epoch_order(self.cursor.epoch)
            starts.append(int(self._order[self.cursor.index]) * self.seq_len)
            self.cursor.index += 1
        windows = torch.stack([self.tokens[start:start + self.seq_len + 1] for start in starts])
        return windows[:, :-1], windows[:, 1:]


def eval_batches(tokens: np.ndarray, seq_len: int, batch_size: int, num_batches: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fixed held-out batches from the corpus tail, the same on every node."""
    needed = num_batches * batch_size * (seq_len + 1)
    tail = torch.from_numpy(tokens[-needed:].astype(np.int64)).view(num_batches, batch_size, seq_len + 1)
    return [(batch[:, :-1], batch[:, 1:]) for batch in tail]
