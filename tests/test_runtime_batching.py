"""Uneven batches inside a node: micro-batch sizes, and a real 3-rank DDP node (gloo on CPU)
whose step equals one process's step on the mean loss over the same samples."""
import contextlib
import io
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from geodiloco.balancer.plan import NodePlan
from geodiloco.predictor.workload import ModelDims
from geodiloco.runtime.batching import accumulate_gradients, micro_batch_sizes
from geodiloco.runtime.comm import build_topology
from geodiloco.runtime.config import parse_config
from geodiloco.runtime.launch import free_port
from geodiloco.runtime.models import build_model
from geodiloco.runtime.trainer import NodeTrainer

DIMS = ModelDims(hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2, vocab_size=32, max_seq_len=8)
SEQ_LEN = 8
RANKS = 3
LR = 0.5
CASES = [(4, 4), (5, 5), (8, 6), (2, 2)]
"""(planned batch, planned micro-batch) per node: uneven shares, accumulation, fewer samples than ranks."""


def sequences() -> torch.Tensor:
    """(12, SEQ_LEN + 1) token windows, the same in every process."""
    generator = torch.Generator().manual_seed(7)
    return torch.randint(0, DIMS.vocab_size, (12, SEQ_LEN + 1), generator=generator)


class CountingModel(nn.Module):
    """The decoder, counting the samples this rank forwards."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.samples_seen = 0

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.samples_seen += inputs.shape[0]
        return self.inner(inputs, targets)


def stream(data: torch.Tensor):
    position = 0

    def next_batch(size: int):
        nonlocal position
        windows = data[position:position + size]
        position += size
        return windows[:, :-1], windows[:, 1:]
    return next_batch


def trainer_round(run_dir: str) -> dict:
    """A whole NodeTrainer of this 3-rank node runs 2 steps at a planned batch of 2."""
    config = parse_config({"model": {"seq_len": SEQ_LEN}, "data": {"max_bytes": 20_000, "eval_batches": 0},
                           "nodes": [{"name": "trio"}]}, "<test>")
    trainer = NodeTrainer(config, build_topology("trio", ["trio"]), run_dir, torch.device("cpu"))
    warnings = io.StringIO()
    with contextlib.redirect_stderr(warnings):
        result = trainer.local_phase(0, NodePlan(name="trio", local_steps=2, batch_size=2), time.perf_counter())
    return {"tokens": result.tokens, "losses": result.losses, "warnings": warnings.getvalue()}


def _node_rank(rank: int, port: int, results, run_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(RANKS))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    try:
        out = {}
        for batch_size, micro_size in CASES:
            model = CountingModel(build_model(DIMS, 0))
            node_model = DistributedDataParallel(model)
            step = accumulate_gradients(node_model, stream(sequences()), batch_size, micro_size,
                                        rank, RANKS, torch.device("cpu"))
            torch.optim.SGD(model.parameters(), lr=LR).step()
            out[batch_size] = {"params": [param.detach().clone() for param in model.inner.parameters()],
                               "mean_loss": step.mean_loss, "samples": step.samples,
                               "rank_samples": model.samples_seen}
        out["trainer"] = trainer_round(run_dir)
        results[rank] = out
    finally:
        dist.destroy_process_group()


def one_process_step(samples: int) -> tuple[list[torch.Tensor], float]:
    """Parameters after one SGD step on the mean loss over the first ``samples`` sequences."""
    model = build_model(DIMS, 0)
    windows = sequences()[:samples]
    loss = model(windows[:, :-1], windows[:, 1:])
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return [param.detach() for param in model.parameters()], loss.item()


def per_rank_mean_step(samples: int) -> list[torch.Tensor]:
    """The old weighting: the average over ranks of each rank's mean loss over its strided share."""
    model = build_model(DIMS, 0)
    windows = sequences()[:samples]
    losses = [model(windows[rank::RANKS, :-1], windows[rank::RANKS, 1:]) for rank in range(RANKS)]
    (sum(losses) / RANKS).backward()
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return [param.detach() for param in model.parameters()]


@pytest.mark.parametrize("batch_size, micro_size, ranks, expected", [
    (6, 6, 4, [6]), (7, 3, 1, [3, 2, 2]), (8, 6, 3, [4, 4]), (5, 1, 3, [3, 3]), (2, 2, 3, [3])])
def test_micro_batch_sizes(batch_size, micro_size, ranks, expected):
    assert micro_batch_sizes(batch_size, micro_size, ranks) == expected


def test_micro_batches_give_every_rank_a_sample_within_the_per_rank_memory_bound():
    for ranks in range(1, 6):
        for batch_size in range(1, 25):
            for micro_size in range(1, batch_size + 1):
                sizes = micro_batch_sizes(batch_size, micro_size, ranks)
                per_rank_cap = -(-micro_size // ranks)
                assert all(ranks <= size <= ranks * per_rank_cap for size in sizes)
                assert len(sizes) <= -(-batch_size // micro_size)
                growth = sum(sizes) - batch_size
                assert 0 <= growth < ranks
                if batch_size >= ranks and (per_rank_cap >= 2 or batch_size % ranks == 0):
                    assert growth == 0


@pytest.mark.slow
def test_three_rank_node_steps_like_one_process_on_the_mean_loss(tmp_path):
    results = mp.Manager().dict()
    mp.spawn(_node_rank, args=(free_port(), results, str(tmp_path)), nprocs=RANKS, join=True)
    for batch_size, _ in CASES:
        trained = max(batch_size, RANKS)
        expected_params, expected_loss = one_process_step(trained)
        for rank in range(RANKS):
            out = results[rank][batch_size]
            assert out["samples"] == trained
            assert out["rank_samples"] >= 1
            assert out["mean_loss"] == pytest.approx(expected_loss, rel=1e-6)
            for got, want in zip(out["params"], expected_params):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert sum(results[rank][batch_size]["rank_samples"] for rank in range(RANKS)) == trained
    uneven = per_rank_mean_step(5)
    assert max((old - new).abs().max().item() for old, new in zip(uneven, one_process_step(5)[0])) > 1e-4

    trainer_rounds = [results[rank]["trainer"] for rank in range(RANKS)]
    assert all(item["tokens"] == 2 * RANKS * SEQ_LEN for item in trainer_rounds)
    assert trainer_rounds[1]["losses"] == trainer_rounds[0]["losses"] == trainer_rounds[2]["losses"]
    assert "node trio: planned batch 2" in trainer_rounds[0]["warnings"]
    assert "effective batch of 3" in trainer_rounds[0]["warnings"]
    assert trainer_rounds[0]["warnings"].count("[geodiloco] node trio") == 1 and not trainer_rounds[1]["warnings"]
