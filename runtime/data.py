"""Offline, real-text training data: byte-level tokens, one disjoint shard per node,
and an eval set held out uniformly from the whole corpus.

The default corpus is the Python standard library's own source files, which
every machine with Python has. Users point ``data.source`` at text files or
directories instead. Token ids are raw bytes (0..255). Offsets into the corpus
are in tokens (= bytes). The windowing below works on any token array: a tokenized
Hugging Face dataset (runtime/hf_data.py) goes through the same functions.
"""
from __future__ import annotations

import os
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Literal, Optional

import numpy as np

from geodiloco.common.schema import ConfigError

if TYPE_CHECKING:
    import torch

TEXT_SUFFIXES = {".txt", ".text", ".md", ".py", ".rst", ".json", ".jsonl", ".csv", ".html", ".tex"}
"""Files of a ``data.source`` folder that are read (any case: ``.TXT`` too); others are skipped and counted."""


STDLIB_SKIPPED_PARTS = ("site-packages", "test")


def iter_stdlib_files() -> Iterator[Path]:
    """The standard library's ``*.py`` files outside ``site-packages`` and ``test``, in sorted path
    order (``sorted(root.rglob("*.py"))``), found lazily: a corpus of a few hundred kilobytes needs
    the first dozen files, not a walk and sort of all of them (most of a process's data loading)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if any(part in root.parts for part in STDLIB_SKIPPED_PARTS):
        return
    yield from _sorted_py_files(root)


def _sorted_py_files(directory: Path) -> Iterator[Path]:
    """Depth-first with each directory's entries sorted by name: the order of ``sorted()`` on
    paths (part by part), as rglob would find them (symlinked directories are not entered)."""
    try:
        with os.scandir(directory) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
    except PermissionError:
        return
    for entry in entries:
        if entry.name in STDLIB_SKIPPED_PARTS:
            continue
        if entry.name.endswith(".py"):
            yield directory / entry.name
        if entry.is_dir(follow_symlinks=False):
            yield from _sorted_py_files(directory / entry.name)


def user_files(source: str) -> list[Path]:
    path = Path(source)
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(item for item in path.rglob("*") if item.is_file() and is_text_file(item))
        if files:
            return files
        raise ConfigError(f"data.source: {source} holds no text files ({', '.join(sorted(TEXT_SUFFIXES))})")
    raise ConfigError(f"data.source: {source} is neither 'stdlib' nor an existing file or directory")


def is_text_file(path: Path) -> bool:
    return path.suffix.lower() in TEXT_SUFFIXES


def corpus_notices(source: str, max_bytes: int) -> list[str]:
    """What a user's ``data.source`` folder gives the run that they may not expect: files skipped for their
    suffix, and text past ``data.max_bytes`` left out (the stdlib corpus says nothing)."""
    path = Path(source)
    if source == "stdlib" or not path.exists():
        return []
    files = [path] if path.is_file() else [item for item in path.rglob("*") if item.is_file()]
    read = [item for item in files if path.is_file() or is_text_file(item)]
    kept = set(read)
    skipped = sorted(item.name for item in files if item not in kept)
    notices = []
    if skipped:
        shown = ", ".join(skipped[:3]) + (", ..." if len(skipped) > 3 else "")
        notices.append(f"data.source: skipped {len(skipped)} file(s) whose suffix is not a text one ({shown}); "
                       f"read: {', '.join(sorted(TEXT_SUFFIXES))}")
    total_bytes = sum(item.stat().st_size for item in read)
    if total_bytes > max_bytes:
        notices.append(f"data.source: {source} holds {total_bytes:,} bytes of text; the run reads its first "
                       f"{max_bytes:,} (data.max_bytes), files in sorted order")
    return notices


def load_corpus(source: str, max_bytes: int) -> np.ndarray:
    """The corpus as uint8 byte tokens, files in sorted order, cut at ``max_bytes``."""
    files = iter_stdlib_files() if source == "stdlib" else user_files(source)
    chunks: list[bytes] = []
    total_bytes = 0
    for path in files:
        content = path.read_bytes()
        chunks.append(content)
        total_bytes += len(content)
        if total_bytes >= max_bytes:
            break
    return np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)


def load_token_file(path: str, dtype: str) -> np.ndarray:
    """Token ids tokenized beforehand, memory-mapped read-only: a ``.npy`` file (its own dtype, one dimension)
    or raw values of ``dtype`` back to back (nanoGPT's ``train.bin``: uint16). Pages are read as windows are
    drawn, so a corpus larger than memory trains; ``ConfigError`` names ``data.token_file`` for a bad file."""
    file = Path(path)
    if not file.is_file():
        where = "" if file.is_absolute() else f" (relative paths are read from the current directory, {Path.cwd()})"
        raise ConfigError(f"data.token_file: {path} is not a file{where}")
    if file.suffix == ".npy":
        try:
            tokens = np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as err:
            raise ConfigError(f"data.token_file: {path} is not a readable .npy array ({err})") from None
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ConfigError(f"data.token_file: {path} holds an array of {tokens.dtype} of shape {tokens.shape}; "
                              "token ids are one flat array of integers (np.save(path, ids.ravel()))")
        if dtype != "uint16" and np.dtype(dtype) != tokens.dtype:
            raise ConfigError(f"data.token_dtype: {dtype}, but {path} is a .npy array of {tokens.dtype}, which is what "
                              "it is read as; leave data.token_dtype out for .npy files")
        return tokens
    itemsize = np.dtype(dtype).itemsize
    size = file.stat().st_size
    if size == 0 or size % itemsize:
        raise ConfigError(f"data.token_file: {path} has {size} bytes, not a whole number of {dtype} values "
                          f"({itemsize} bytes each); set data.token_dtype to the type it was written with")
    tokens = np.memmap(file, dtype=np.dtype(dtype), mode="r")
    check_value_width(tokens, dtype, path)
    return tokens


WIDER_TYPE = {"uint16": "uint32", "uint32": "int64", "int32": "int64"}
"""The type whose values, read as the key's, come out as (value, 0, value, 0, ...) on a little-endian machine."""
WIDTH_SAMPLE = 1 << 20
"""Values read from the start of a token file to tell its width: 2-8 MiB."""


def check_value_width(tokens: np.ndarray, dtype: str, path: str) -> None:
    """Ids written twice as wide as ``dtype`` (uint32 read as uint16) fit any vocabulary and train on garbage: every
    second value is the zero high half of an id. Refuse a file whose odd values are (nearly) all zero while its even
    ones are not: real text has no such pattern. Narrower ids read wide come out too large for the vocabulary,
    which ``check_token_ids`` refuses."""
    if dtype not in WIDER_TYPE or len(tokens) < 64:
        return
    sample = np.asarray(tokens[:min(len(tokens), WIDTH_SAMPLE) // 2 * 2])
    odd_zero, even_zero = float(np.mean(sample[1::2] == 0)), float(np.mean(sample[0::2] == 0))
    if odd_zero >= 0.99 and even_zero < 0.5:
        raise ConfigError(f"data.token_file: {path} read as {dtype} has a 0 in every second value ({odd_zero:.0%} of "
                          f"them): it looks written as {WIDER_TYPE[dtype]}; set data.token_dtype: {WIDER_TYPE[dtype]}")


ShardMode = Literal["iid", "non_iid"]

EVAL_SAMPLE_STREAM = 1_000_001
"""Second seed word of the eval sample's generator (node indices never reach it)."""
IID_DEAL_STREAM = 1_000_002
"""Second seed word of the generator that deals i.i.d. windows to nodes."""


@dataclass
class ShardCursor:
    """Position in a shard's shuffled order of windows; saved in checkpoints."""

    epoch: int = 0
    index: int = 0


def window_tokens(seq_len: int) -> int:
    """Tokens in one training or eval window: ``seq_len`` inputs plus the last target."""
    return seq_len + 1


CorpusCap = tuple[str, str, int]
"""(the source's setting, the cap's setting, the cap): ("data.source", "data.max_bytes", 8_000_000) for a byte
corpus, ("data.hf_dataset", "data.max_tokens", N) for a tokenized one, ("data.token_file", "data.token_file", 0) for
a token file (read whole: no cap). Tells a short source from a low cap."""


def more_text_hint(num_tokens: int, cap: Optional[CorpusCap], unit: str) -> str:
    """What gives a corpus of ``num_tokens`` more windows: more text when the source is shorter than its cap,
    else a higher cap."""
    if cap is None:
        return "give the corpus more text"
    source, cap_setting, limit = cap
    if source == cap_setting:  # no cap: the whole source is read
        return f"give {source} more tokens (it holds {num_tokens})"
    if num_tokens < limit:
        return f"give {source} more text (it holds only {num_tokens} {unit}, under {cap_setting} {limit})"
    return f"raise {cap_setting}"


def eval_window_starts(num_tokens: int, seq_len: int, num_windows: int, seed: int,
                       cap: Optional[CorpusCap] = None) -> np.ndarray:
    """Token offsets of the held-out windows, sorted: a seeded uniform sample without
    replacement of the corpus cut into back-to-back ``seq_len + 1`` windows.

    Sampled from the whole corpus, so the eval loss measures the same distribution
    every node trains on (the corpus tail is one file, not a representative sample).
    ``cap``: the setting and cap the corpus was read under, to tell a short source from a low cap.
    """
    if num_windows == 0:
        return np.zeros(0, dtype=np.int64)
    length = window_tokens(seq_len)
    grid_windows = num_tokens // length
    if num_windows >= grid_windows:
        more = more_text_hint(num_tokens, cap, "bytes" if cap is None or cap[1] == "data.max_bytes" else "tokens")
        raise ConfigError(f"data.eval_batches x data.eval_batch_size = {num_windows} eval windows of "
                          f"{length} tokens leave no training data in a corpus of {grid_windows} such windows; "
                          f"lower them or {more}")
    rng = np.random.default_rng([seed, EVAL_SAMPLE_STREAM])
    return np.sort(rng.choice(grid_windows, size=num_windows, replace=False)).astype(np.int64) * length


def eval_batches(tokens: np.ndarray, starts: np.ndarray, seq_len: int,
                 batch_size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The held-out windows at ``starts`` as (inputs, targets) batches of ``batch_size``,
    the same on every node; ``len(starts)`` must be a multiple of ``batch_size``."""
    if len(starts) % batch_size:
        raise ValueError(f"{len(starts)} eval windows do not fill batches of data.eval_batch_size = {batch_size}")
    windows = gather_windows(tokens, starts, seq_len)
    return [(batch[:, :-1], batch[:, 1:]) for batch in windows.split(batch_size)]


def gather_windows(tokens: np.ndarray, starts: np.ndarray, seq_len: int) -> torch.Tensor:
    """(len(starts), seq_len + 1) int64 windows of ``tokens`` beginning at ``starts``. Only those windows are
    read and widened, so a memory-mapped corpus is never loaded whole."""
    import torch
    offsets = np.arange(window_tokens(seq_len), dtype=np.int64)
    return torch.from_numpy(tokens[np.asarray(starts, dtype=np.int64)[:, None] + offsets].astype(np.int64))


def outside_held_out(starts: np.ndarray, seq_len: int, held_out_starts: np.ndarray) -> np.ndarray:
    """Mask of the windows at ``starts`` that share no token with any held-out window
    (both ``seq_len + 1`` tokens long)."""
    length = window_tokens(seq_len)
    held_out = np.sort(np.asarray(held_out_starts, dtype=np.int64))
    if len(held_out) == 0:
        return np.ones(len(starts), dtype=bool)
    after = np.searchsorted(held_out, starts)
    next_gap = held_out[np.minimum(after, len(held_out) - 1)] - starts
    previous_gap = starts - held_out[np.maximum(after - 1, 0)]
    clashes_next = (after < len(held_out)) & (np.abs(next_gap) < length)
    clashes_previous = (after > 0) & (np.abs(previous_gap) < length)
    return ~(clashes_next | clashes_previous)


def non_iid_window_starts(num_tokens: int, node_index: int, num_nodes: int, seq_len: int) -> np.ndarray:
    """Node ``node_index``'s contiguous ``num_tokens // num_nodes`` slice, cut into windows
    every ``seq_len`` tokens (consecutive windows share one token), as token offsets."""
    slice_tokens = num_tokens // num_nodes
    count = max(0, (slice_tokens - 1) // seq_len)
    return node_index * slice_tokens + np.arange(count, dtype=np.int64) * seq_len


def iid_window_starts(num_tokens: int, node_index: int, num_nodes: int, seq_len: int,
                      held_out_starts: np.ndarray, seed: int) -> np.ndarray:
    """Every ``num_nodes``-th window of one seeded permutation of the corpus's back-to-back
    ``seq_len + 1`` windows (held-out ones removed), sorted token offsets: each node's windows
    spread uniformly over the whole corpus, and nodes never share a token."""
    length = window_tokens(seq_len)
    grid = np.arange(num_tokens // length, dtype=np.int64) * length
    kept = grid[outside_held_out(grid, seq_len, held_out_starts)]
    dealt = np.random.default_rng([seed, IID_DEAL_STREAM]).permutation(kept)[node_index::num_nodes]
    return np.sort(dealt)


class NodeShard:
    """One node's training windows of the corpus, streamed in a seeded order.

    ``shards``: ``non_iid`` (the default here, the stream NodeShard always had) gives node i
    the i-th contiguous slice of the corpus, so nodes see different files; ``iid`` deals
    windows from the whole corpus (see ``iid_window_starts``). Windows sharing a token with a
    ``held_out_starts`` window (the eval set) are left out in both modes. Windows are visited
    in a seeded random order per epoch, so the stream is deterministic given (seed, node
    index) and resumable from a ShardCursor.
    """

    def __init__(self, tokens: np.ndarray, node_index: int, num_nodes: int, seq_len: int, seed: int,
                 shards: ShardMode = "non_iid", held_out_starts: Optional[np.ndarray] = None,
                 cap: Optional[CorpusCap] = None) -> None:
        held_out = np.zeros(0, dtype=np.int64) if held_out_starts is None else np.asarray(held_out_starts)
        if shards == "iid":
            starts = iid_window_starts(len(tokens), node_index, num_nodes, seq_len, held_out, seed)
        elif shards == "non_iid":
            starts = non_iid_window_starts(len(tokens), node_index, num_nodes, seq_len)
            starts = starts[outside_held_out(starts, seq_len, held_out)]
        else:
            raise ValueError(f"data.shards: {shards!r} is not 'iid' or 'non_iid'")
        if len(starts) < 1:
            unit = "bytes" if cap is None or cap[1] == "data.max_bytes" else "tokens"
            raise ConfigError(f"data: node {node_index} gets no {window_tokens(seq_len)}-token training window "
                              f"from a corpus of {len(tokens)} {unit} split {num_nodes} ways ({shards}) after the eval "
                              f"windows; {more_text_hint(len(tokens), cap, unit)}, or use fewer nodes, a shorter "
                              "model.seq_len or a smaller eval set")
        self._corpus = tokens
        self.window_starts = starts
        self.seq_len = seq_len
        self.num_windows = len(starts)
        self.seed = seed
        self.node_index = node_index
        self.cursor = ShardCursor()
        self._order = self._epoch_order(0)

    @property
    def corpus_array(self) -> np.ndarray:
        """The whole corpus (every node's shard is a view of it), as an array (memory-mapped for a token file)."""
        return self._corpus

    def _epoch_order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.node_index, epoch])
        return rng.permutation(self.num_windows)

    def position_state(self) -> dict:
        """Where the stream is, for checkpoints (``load_position_state`` takes it back)."""
        return {"cursor": asdict(self.cursor)}

    def load_position_state(self, state: dict) -> None:
        self.set_cursor(ShardCursor(**state["cursor"]))

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
            starts.append(self.window_starts[self._order[self.cursor.index]])
            self.cursor.index += 1
        windows = gather_windows(self._corpus, np.asarray(starts, dtype=np.int64), self.seq_len)
        return windows[:, :-1], windows[:, 1:]
