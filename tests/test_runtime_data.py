"""Data: real offline text, i.i.d. / non-i.i.d. disjoint per-node shards, an eval set held out
uniformly, deterministic order, resumable cursor; the eval loss and its standard error."""
import json
import math
import statistics

import numpy as np
import pytest
import torch

from geodiloco.common.schema import ConfigError
from geodiloco.predictor.workload import ModelDims
from geodiloco.runtime.comm import Topology
from geodiloco.runtime.config import parse_config
from geodiloco.runtime.data import NodeShard, ShardCursor, eval_batches, eval_window_starts, load_corpus
from geodiloco.runtime.evaluation import BackgroundEvaluator, mean_and_standard_error
from geodiloco.runtime.models import build_model
from geodiloco.runtime.trainer import build_data

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


def test_a_folders_upper_case_suffixes_are_read_and_what_is_left_out_is_told(tmp_path, capsys):
    from geodiloco.runtime.data import corpus_notices
    from geodiloco.runtime.preflight import check_byte_corpus
    (tmp_path / "A.TXT").write_text("alpha " * 2000)
    (tmp_path / "b.text").write_text("beta " * 2000)
    (tmp_path / "c.log").write_text("gamma " * 100)
    corpus = bytes(load_corpus(str(tmp_path), 100_000))
    assert corpus.startswith(b"alpha") and b"beta" in corpus and b"gamma" not in corpus
    assert corpus_notices(str(tmp_path), 100_000) == [
        "data.source: skipped 1 file(s) whose suffix is not a text one (c.log); read: .csv, .html, .json, .jsonl, "
        ".md, .py, .rst, .tex, .text, .txt"]
    cut = corpus_notices(str(tmp_path), 15_000)[1]
    assert cut == (f"data.source: {tmp_path} holds 22,000 bytes of text; the run reads its first 15,000 "
                   "(data.max_bytes), files in sorted order")
    config = parse_config({"model": {"preset": "tiny", "seq_len": 32}, "data": {"source": str(tmp_path),
                           "max_bytes": 15_000, "eval_batches": 1, "eval_batch_size": 2},
                           "nodes": [{"name": "a"}, {"name": "b"}]}, "run.yaml")
    check_byte_corpus(config)  # what geodiloco run checks before it starts the nodes, and tells once
    assert f"[geodiloco] {cut}" in capsys.readouterr().out


def test_bytes_past_a_small_vocabulary_are_refused_before_the_nodes_start(tmp_path):
    from geodiloco.runtime.preflight import check_byte_corpus

    def config_with(vocab_size: int):
        dims = {"hidden_size": 32, "intermediate_size": 64, "num_layers": 1, "num_heads": 2, "num_kv_heads": 2,
                "vocab_size": vocab_size, "max_seq_len": 64}
        dims_file = tmp_path.parent / f"dims-{vocab_size}.json"
        dims_file.write_text(json.dumps(dims))
        return parse_config({"model": {"file": str(dims_file), "seq_len": 32}, "data": {"source": str(tmp_path),
                             "eval_batches": 1, "eval_batch_size": 2}, "nodes": [{"name": "a"}]}, "run.yaml")

    (tmp_path / "ascii.txt").write_text("plain ascii text " * 100)
    check_byte_corpus(config_with(200))  # every byte is below 200: a small vocabulary is enough
    (tmp_path / "utf8.txt").write_text("caf\u00e9 na\u00efve " * 100)  # UTF-8 bytes 0xc3 (195), 0xa9, 0xaf
    check_byte_corpus(config_with(196))
    with pytest.raises(ConfigError, match=r"^data.source: byte-level text holds byte value 195, but the model's "
                                          r"embedding has 195 rows \(vocab_size\); byte-level data needs vocab_size "
                                          r">= 196 \(256 covers every byte\), or tokenize it"):
        check_byte_corpus(config_with(195))


def test_missing_source_names_the_field(tmp_path):
    with pytest.raises(ValueError, match="data.source"):
        load_corpus(str(tmp_path / "nope"), 1000)


MODES = ("iid", "non_iid")
SEQ_LEN = 16
WINDOW = SEQ_LEN + 1


def held_out(count: int, seed: int = 0) -> np.ndarray:
    return eval_window_starts(len(TOKENS), SEQ_LEN, count, seed)


def shards_for(mode: str, num_nodes: int, held_out_starts: np.ndarray, seed: int = 0) -> list[NodeShard]:
    return [NodeShard(TOKENS, index, num_nodes, SEQ_LEN, seed, shards=mode, held_out_starts=held_out_starts)
            for index in range(num_nodes)]


def covered_tokens(starts) -> set:
    """Corpus offsets of every token inside the windows beginning at ``starts``."""
    return {int(start) + offset for start in starts for offset in range(WINDOW)}


def streamed_windows(shard: NodeShard, count: int) -> list[tuple]:
    windows = []
    for _ in range(count):
        inputs, targets = shard.next_batch(1)
        assert torch.equal(inputs[0, 1:], targets[0, :-1])
        windows.append(tuple(inputs[0].tolist()) + (targets[0, -1].item(),))
    return windows


@pytest.mark.parametrize("mode", MODES)
def test_shards_are_disjoint_from_each_other_and_from_the_eval_windows(mode):
    eval_starts = held_out(24)
    shards = shards_for(mode, 3, eval_starts)
    eval_tokens = covered_tokens(eval_starts)
    per_node = [covered_tokens(shard.window_starts) for shard in shards]
    for index, tokens in enumerate(per_node):
        assert tokens and not tokens & eval_tokens
        for other in per_node[index + 1:]:
            assert not tokens & other
    if mode == "iid":
        assert sum(shard.num_windows for shard in shards) + len(eval_starts) == len(TOKENS) // WINDOW


@pytest.mark.parametrize("mode", MODES)
def test_an_epoch_streams_exactly_the_shard_windows(mode):
    shard = shards_for(mode, 3, held_out(24))[1]
    expected = sorted(tuple(TOKENS[start:start + WINDOW].tolist()) for start in shard.window_starts)
    assert sorted(streamed_windows(shard, shard.num_windows)) == expected
    assert shard.cursor == ShardCursor(epoch=0, index=shard.num_windows)


def test_iid_windows_span_the_corpus_while_non_iid_stay_in_their_slice():
    num_nodes, tenth = 4, len(TOKENS) // 10
    eval_starts = held_out(24)
    for shard in shards_for("iid", num_nodes, eval_starts):
        assert shard.window_starts.min() < tenth and shard.window_starts.max() > len(TOKENS) - tenth
    slice_tokens = len(TOKENS) // num_nodes
    for index, shard in enumerate(shards_for("non_iid", num_nodes, eval_starts)):
        assert shard.window_starts.min() >= index * slice_tokens
        assert shard.window_starts.max() + WINDOW <= (index + 1) * slice_tokens
        assert shard.window_starts.max() - shard.window_starts.min() < slice_tokens


def test_non_iid_without_eval_keeps_the_contiguous_slice_stream():
    """The stream NodeShard always gave (tests/test_runtime_reference.py rebuilds runs from it)."""
    num_nodes, node, seed = 3, 2, 5
    slice_tokens = len(TOKENS) // num_nodes
    part = TOKENS[node * slice_tokens:(node + 1) * slice_tokens].astype(np.int64)
    order = np.random.default_rng([seed, node, 0]).permutation((slice_tokens - 1) // SEQ_LEN)
    expected = torch.stack([torch.from_numpy(part[index * SEQ_LEN:index * SEQ_LEN + WINDOW]) for index in order[:6]])
    inputs, targets = NodeShard(TOKENS, node, num_nodes, SEQ_LEN, seed).next_batch(6)
    assert inputs.dtype == torch.int64
    assert torch.equal(inputs, expected[:, :-1]) and torch.equal(targets, expected[:, 1:])


@pytest.mark.parametrize("mode", MODES)
def test_order_is_deterministic_by_seed_and_differs_between_seeds(mode):
    def first_batch(seed):
        return NodeShard(TOKENS, 0, 2, SEQ_LEN, seed, shards=mode, held_out_starts=held_out(8, seed)).next_batch(8)[0]
    assert torch.equal(first_batch(1), first_batch(1))
    assert not torch.equal(first_batch(1), first_batch(2))


def test_iid_dealing_depends_on_the_seed():
    assert not np.array_equal(shards_for("iid", 2, held_out(8), seed=1)[0].window_starts,
                              shards_for("iid", 2, held_out(8), seed=2)[0].window_starts)


@pytest.mark.parametrize("mode", MODES)
def test_epoch_visits_every_window_once_and_cursor_resumes(mode):
    eval_starts = eval_window_starts(len(TOKENS), 64, 4, 0)

    def fresh():
        return NodeShard(TOKENS, 0, 1, 64, seed=0, shards=mode, held_out_starts=eval_starts)
    shard = fresh()
    seen = [shard.next_batch(1)[0] for _ in range(shard.num_windows)]
    assert len({tuple(row.view(-1).tolist()) for row in seen}) == shard.num_windows
    assert shard.cursor == ShardCursor(epoch=0, index=shard.num_windows)
    saved = ShardCursor(shard.cursor.epoch, shard.cursor.index)
    expected = shard.next_batch(3)[0]
    resumed = fresh()
    resumed.set_cursor(saved)
    assert torch.equal(resumed.next_batch(3)[0], expected)
    assert resumed.cursor.epoch == 1


def test_eval_windows_are_a_seeded_uniform_sample_of_the_whole_corpus():
    starts = held_out(60)
    assert np.array_equal(starts, held_out(60)) and not np.array_equal(starts, held_out(60, seed=1))
    assert len(set(starts.tolist())) == 60 and all(start % WINDOW == 0 for start in starts)
    tenth = len(TOKENS) // 10
    assert starts.min() < tenth and starts.max() > len(TOKENS) - tenth
    batches = eval_batches(TOKENS, starts, SEQ_LEN, 4)
    assert len(batches) == 15 and all(inputs.shape == targets.shape == (4, SEQ_LEN) for inputs, targets in batches)
    inputs, targets = batches[-1]
    assert inputs[-1].tolist() == TOKENS[starts[-1]:starts[-1] + SEQ_LEN].tolist()
    assert targets[-1, -1].item() == TOKENS[starts[-1] + SEQ_LEN]


def test_an_eval_set_as_large_as_the_corpus_names_the_fields():
    with pytest.raises(ValueError, match="data.eval_batches x data.eval_batch_size"):
        held_out(len(TOKENS) // WINDOW)


def test_config_defaults_to_iid_and_rejects_other_modes():
    nodes = [{"name": "a"}]
    assert parse_config({"nodes": nodes}, "<test>").data.shards == "iid"
    assert parse_config({"data": {"shards": "non_iid"}, "nodes": nodes}, "<test>").data.shards == "non_iid"
    with pytest.raises(ConfigError, match="data.shards"):
        parse_config({"data": {"shards": "random"}, "nodes": nodes}, "<test>")


@pytest.mark.parametrize("mode", MODES)
def test_trainer_data_holds_the_eval_set_out_of_every_node(mode):
    seq_len, seed = 32, 3
    config = parse_config({"run": {"seed": seed}, "model": {"seq_len": seq_len},
                           "data": {"max_bytes": 60_000, "shards": mode, "eval_batches": 3, "eval_batch_size": 2},
                           "nodes": [{"name": "a"}, {"name": "b"}]}, "<test>")
    corpus = load_corpus("stdlib", 60_000)
    eval_starts = eval_window_starts(len(corpus), seq_len, 6, seed)
    expected_eval = torch.stack([torch.from_numpy(corpus[start:start + seq_len].astype(np.int64))
                                 for start in eval_starts])
    eval_tokens = {int(start) + offset for start in eval_starts for offset in range(seq_len + 1)}
    node_tokens = []
    for index, name in enumerate(("a", "b")):
        topology = Topology(rank=index, world_size=2, node_name=name, node_index=index, local_rank=0,
                            local_world_size=1, node_ranks=[index], leader_ranks=[0, 1])
        eval_set, shard = build_data(config, topology)
        assert len(eval_set) == 3 and torch.equal(torch.cat([inputs for inputs, _ in eval_set]), expected_eval)
        node_tokens.append({int(start) + offset for start in shard.window_starts for offset in range(seq_len + 1)})
        assert not node_tokens[-1] & eval_tokens
    assert node_tokens[0] and node_tokens[1] and not node_tokens[0] & node_tokens[1]


def test_standard_error_matches_a_hand_computation():
    losses = [2.0, 2.5, 3.5, 4.0]
    mean, standard_error = mean_and_standard_error(losses)
    assert mean == pytest.approx(3.0)
    assert standard_error == pytest.approx(statistics.stdev(losses) / 2.0)
    assert standard_error == pytest.approx(math.sqrt((1.0 + 0.25 + 0.25 + 1.0) / 3) / 2.0)
    assert mean_and_standard_error([1.5]) == (1.5, None)


def test_background_evaluation_reports_the_mean_and_its_standard_error():
    dims = ModelDims(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, vocab_size=256, max_seq_len=32)
    batches = eval_batches(TOKENS, held_out(6), SEQ_LEN, 3)
    evaluator = BackgroundEvaluator(build_model(dims, 1), batches=batches, device=torch.device("cpu"))
    model = build_model(dims, 0)
    evaluator.start([param.detach() for param in model.parameters()], {"round": 0})
    [row] = evaluator.finished_rows(wait=True)
    with torch.no_grad():
        sequence_losses = [model(inputs[j:j + 1], targets[j:j + 1]).item()
                           for inputs, targets in batches for j in range(inputs.shape[0])]
        batch_losses = [model(inputs, targets).item() for inputs, targets in batches]
    assert len(set(sequence_losses)) == 6
    assert row["eval_loss"] == pytest.approx(statistics.fmean(batch_losses), rel=1e-6)
    # the spread of six losses near 5.5 is ~0.01: float32 rounding of batched vs single-sequence forwards
    # (~1e-7 of a loss) moves their standard error by ~1e-5 of itself
    assert row["eval_loss_se"] == pytest.approx(statistics.stdev(sequence_losses) / math.sqrt(6), rel=1e-3)
