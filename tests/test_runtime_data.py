"""Data: real offline text, disjoint per-node shards, deterministic order, resumable cursor."""
import numpy as np
import pytest
import torch

from runtime.data import NodeShard, ShardCursor, eval_batches, load_corpus

TOKENS = (np.arange(10_240) % 251).astype(np.uint8)  # prime period: every 16- or 64-token window is distinct


def test_stdlib_corpus_is_real_python_text():
    corpus = load_corpus("stdlib", 50_000)
    assert len(corpus) == 50_000
    text = bytes(corpus).decode("utf-8", errors="replace")
    assert "def " in text and "import " in text


def test_user_text_directory(tmp_path):
    (tmp_path / "a.txt").write_text("alpha " * 100)
    (tmp_path / "b.md").write_text("beta " * 100)
    (tmp_path / "skip.bin").write_bytes(b"\x00" * 100)
    corpus = bytes(load_corpus(str(tmp_path), 10_000))
    assert corpus.startswith(b"alpha") and b"beta" in corpus and b"\x00" not in corpus


def test_missing_source_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="data.source"):
        load_corpus(str(tmp_path / "nope"), 1000)


def window_starts(shard: NodeShard, batches: int, batch_size: int) -> set:
    starts = set()
    for _ in range(batches):
        inputs, _ = shard.next_batch(batch_size)
        starts.update(tuple(row[:4].tolist()) for row in inputs)
    return starts


def test_shards_are_disjoint_and_targets_are_shifted_inputs():
    seq_len = 16
    shards = [NodeShard(TOKENS, index, 3, seq_len, seed=0) for index in range(3)]
    shard_len = len(TOKENS) // 3
    for index, shard in enumerate(shards):
        inputs, targets = shard.next_batch(5)
        assert inputs.shape == targets.shape == (5, seq_len)
        assert torch.equal(inputs[:, 1:], targets[:, :-1])
        assert torch.equal(shard.tokens, torch.from_numpy(TOKENS[index * shard_len:(index + 1) * shard_len].astype(np.int64)))


def test_order_is_deterministic_by_seed_and_differs_between_seeds():
    first = NodeShard(TOKENS, 0, 2, 16, seed=1).next_batch(8)[0]
    again = NodeShard(TOKENS, 0, 2, 16, seed=1).next_batch(8)[0]
    other = NodeShard(TOKENS, 0, 2, 16, seed=2).next_batch(8)[0]
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_epoch_visits_every_window_once_and_cursor_resumes():
    shard = NodeShard(TOKENS, 0, 1, 64, seed=0)
    seen = [shard.next_batch(1)[0] for _ in range(shard.num_windows)]
    assert len({tuple(row.view(-1).tolist()) for row in seen}) == shard.num_windows
    assert shard.cursor == ShardCursor(epoch=0, index=shard.num_windows)
    saved = ShardCursor(shard.cursor.epoch, shard.cursor.index)
    expected = shard.next_batch(3)[0]
    resumed = NodeShard(TOKENS, 0, 1, 64, seed=0)
    resumed.set_cursor(saved)
    assert torch.equal(resumed.next_batch(3)[0], expected)
    assert resumed.cursor.epoch == 1


def test_eval_batches_come_from_the_tail():
    batches = eval_batches(TOKENS, 16, 2, 3)
    assert len(batches) == 3
    tail = TOKENS[-3 * 2 * 17:]
    assert batches[-1][1][-1, -1].item() == tail[-1]
