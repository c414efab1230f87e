"""The eval set and each node's training shard, from whichever source ``data`` names.

Byte-level text (``data.source``), a tokenized Hugging Face dataset (``data.hf_dataset``, not
streamed) and a file of token ids (``data.token_file``, memory-mapped) each become one token array,
windowed by runtime/data.py; a streamed dataset is read by runtime/hf_data.py's ``StreamShard``. Every node computes the same eval set.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np
import torch

from geodiloco.runtime.config import RunConfig
from geodiloco.runtime.data import (NodeShard, eval_batches, eval_window_starts, load_corpus, load_token_file,
                                    window_tokens)

Batches = list[tuple[torch.Tensor, torch.Tensor]]


def load_tokens(config: RunConfig) -> np.ndarray:
    """The whole (non-streamed) corpus as a token array."""
    data = config.data
    if data.token_file is not None:
        tokens = load_token_file(data.token_file, data.token_dtype)
        check_token_ids(tokens, config)
        return tokens
    if data.hf_dataset is None:
        return load_corpus(data.source, data.max_bytes)
    from geodiloco.runtime.hf_data import load_token_corpus
    tokens = load_token_corpus(data.hf_dataset, data.tokenizer, data.max_tokens)
    check_token_ids(tokens, config)
    return tokens


def check_token_ids(tokens: np.ndarray, config: RunConfig) -> None:
    """Token ids past the model's embedding would fail deep inside the first forward pass."""
    from geodiloco.common.schema import ConfigError
    vocab_size = config.model.dims().vocab_size
    if not len(tokens):
        return
    smallest, largest = id_range(tokens)
    if config.data.token_file is not None and (largest >= vocab_size or smallest < 0):
        raise ConfigError(f"data.token_file: {config.data.token_file} holds token id "
                          f"{largest if largest >= vocab_size else smallest}, but the model's embedding has rows "
                          f"0-{vocab_size - 1} (vocab_size {vocab_size}); give the model the tokenizer's vocab_size, "
                          "or check data.token_dtype")
    if largest >= vocab_size:
        raise ConfigError(f"data.tokenizer: produces token id {largest}, but the model's embedding has "
                          f"{vocab_size} rows (vocab_size); use a tokenizer that fits or a larger vocab_size")


ID_RANGE_CHUNK = 1 << 24
"""Token ids per slice when a corpus's smallest and largest id are found: one pass over a memory-mapped file in
slices of 16 Mi ids (32-128 MiB), never the whole file in memory at once."""


def id_range(tokens: np.ndarray) -> tuple[int, int]:
    """(smallest, largest) id, in one pass over ``tokens``."""
    smallest, largest = None, None
    for start in range(0, len(tokens), ID_RANGE_CHUNK):
        chunk = np.asarray(tokens[start:start + ID_RANGE_CHUNK])
        low, high = int(chunk.min()), int(chunk.max())
        smallest = low if smallest is None else min(smallest, low)
        largest = high if largest is None else max(largest, high)
    return smallest, largest


def streamed(config: RunConfig) -> bool:
    return config.data.hf_dataset is not None and config.data.hf_dataset.streaming


def eval_set(config: RunConfig, batch_size: Optional[int] = None) -> Batches:
    """The held-out batches (``batch_size`` defaults to ``data.eval_batch_size``)."""
    data = config.data
    size = batch_size or data.eval_batch_size
    num_windows = data.eval_batches * data.eval_batch_size
    if num_windows == 0:
        return []
    if streamed(config):
        return _streamed_eval_batches(_streamed_eval(config)[1], config.model.seq_len, size)
    corpus = load_tokens(config)
    starts = eval_window_starts(len(corpus), config.model.seq_len, num_windows, config.run.seed, cap=corpus_cap(config))
    return eval_batches(corpus, starts, config.model.seq_len, size)


def corpus_cap(config: RunConfig) -> tuple[str, str, int]:
    """The corpus's source setting and the cap it was read under (runtime.data.CorpusCap)."""
    data = config.data
    if data.token_file is not None:
        return "data.token_file", "data.token_file", 0
    if data.hf_dataset is None:
        return "data.source", "data.max_bytes", data.max_bytes
    return "data.hf_dataset", "data.max_tokens", data.max_tokens


def node_data(config: RunConfig, node_index: int, num_nodes: int) -> tuple[Batches, Union[NodeShard, Any]]:
    """(eval batches, node ``node_index``'s training shard of ``num_nodes``)."""
    data, seq_len = config.data, config.model.seq_len
    num_windows = data.eval_batches * data.eval_batch_size
    if streamed(config):
        from geodiloco.runtime.hf_data import StreamShard, load_tokenizer, stream_layout
        held_out_by_file, eval_tokens = _streamed_eval(config)
        layout = stream_layout(data.hf_dataset, node_index, num_nodes, data.shards, held_out_by_file)
        shard = StreamShard(data.hf_dataset, load_tokenizer(data.tokenizer), layout, seq_len)
        return _streamed_eval_batches(eval_tokens, seq_len, data.eval_batch_size), shard
    corpus = load_tokens(config)
    cap = corpus_cap(config)
    held_out = eval_window_starts(len(corpus), seq_len, num_windows, config.run.seed, cap=cap)
    batches = eval_batches(corpus, held_out, seq_len, data.eval_batch_size) if len(held_out) else []
    shard = NodeShard(corpus, node_index, num_nodes, seq_len, config.run.seed, shards=data.shards,
                      held_out_starts=held_out, cap=cap)
    return batches, shard


def _streamed_eval(config: RunConfig) -> tuple[list[int], np.ndarray]:
    """(held-out documents per data file, the eval set's packed tokens) of a streamed dataset."""
    from geodiloco.runtime.hf_data import eval_docs_per_file, load_tokenizer, stream_files
    data = config.data
    files = stream_files(data.hf_dataset, data.shards)
    num_windows = data.eval_batches * data.eval_batch_size
    if num_windows == 0:
        return [0] * len(files), np.zeros(0, dtype=np.int64)
    held_out_by_file, eval_tokens = eval_docs_per_file(data.hf_dataset, load_tokenizer(data.tokenizer), files,
                                                       config.model.seq_len, num_windows)
    check_token_ids(eval_tokens, config)
    return held_out_by_file, eval_tokens


def _streamed_eval_batches(eval_tokens: np.ndarray, seq_len: int, batch_size: int) -> Batches:
    """The eval tokens are back-to-back windows: the byte corpus's batching applies as is."""
    starts = np.arange(len(eval_tokens) // window_tokens(seq_len), dtype=np.int64) * window_tokens(seq_len)
    return eval_batches(eval_tokens, starts, seq_len, batch_size) if len(starts) else []
