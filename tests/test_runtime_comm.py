"""The torch backend's sums on a real 3-process gloo group: every codec sums in fp32, every rank
gets the same vector, and the readiness exchange gathers every node's statistics."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from geodiloco.runtime.comm import build_topology
from geodiloco.runtime.config import DilocoSection
from geodiloco.runtime.launch import free_port
from geodiloco.runtime.sync.torch_backend import TorchOuterSync
from geodiloco.runtime.sync.wire import ErrorFeedback, reduce_sum

pytestmark = pytest.mark.slow

NAMES = ["a", "b", "c"]
WEIGHTS = [0.2, 0.3, 0.5]
CODECS = ("none", "fp16", "bf16", "int8", "int4")


def contribution(rank: int) -> torch.Tensor:
    return torch.linspace(-1, 1, 5001) * (rank + 1) + 0.01 * rank


def _worker(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="3")
    dist.init_process_group("gloo")
    try:
        topology = build_topology(NAMES[rank], NAMES)
        sync = TorchOuterSync(topology, DilocoSection())
        gathered = sync.exchange({"node": topology.node_name, "tokens": 10 * (rank + 1)})
        out = {"nodes": [item["node"] for item in gathered]}
        for codec in CODECS:
            out[codec] = reduce_sum(contribution(rank) * WEIGHTS[rank], codec, ErrorFeedback(), sync.sync_group, 3)
        # 1 + 2^-8 + 2^-8: bf16 cannot hold 1 + 2^-8, so a sum done in bf16 stays at 1.0; summed in
        # fp32 it is 1 + 2^-7, which bf16 holds exactly.
        tiny = torch.full((4096,), [1.0, 2.0 ** -8, 2.0 ** -8][rank])
        out["bf16_small_terms"] = reduce_sum(tiny, "bf16", ErrorFeedback(), sync.sync_group, 3)
        results[rank] = out
    finally:
        dist.destroy_process_group()


def test_every_codec_sums_in_fp32_and_every_rank_agrees():
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(free_port(), results), nprocs=3, join=True)
    expected = sum(contribution(rank) * WEIGHTS[rank] for rank in range(3))
    bounds = {"none": 1e-6, "fp16": 2e-3, "bf16": 2e-2, "int8": 2e-2, "int4": 0.3}
    for rank in range(3):
        out = results[rank]
        assert out["nodes"] == NAMES
        for codec in CODECS:
            assert out[codec].dtype == torch.float32
            error = float((out[codec] - expected).abs().max())
            assert error <= bounds[codec], f"{codec}: max error {error:.3g}"
            assert torch.equal(out[codec], results[0][codec]), f"{codec}: ranks disagree"
        assert not torch.equal(out["int8"], expected)  # it really went over the wire in int8
        assert torch.all(out["bf16_small_terms"] == 1.0 + 2.0 ** -7)


def _deadline_worker(rank: int, port: int, results) -> None:
    from geodiloco.runtime.trainer import leader_decides
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="3")
    dist.init_process_group("gloo")
    try:
        # ranks 0 and 1 are node a's two GPUs, rank 2 is node b
        topology = build_topology(["a", "a", "b"][rank], ["a", "b"])
        # each rank's own clock says something else; node a follows its leader, rank 0
        results[rank] = [leader_decides(topology, decision) for decision in
                         ([False, True], [True, False], [True, True])[rank]]
    finally:
        dist.destroy_process_group()


def test_a_nodes_ranks_take_their_leaders_deadline_decision():
    """Under the deadline policy each rank measures its own elapsed time; if one rank of a node stopped
    while another started one more step, the node's DDP all-reduce would wait forever."""
    results = mp.Manager().dict()
    mp.spawn(_deadline_worker, args=(free_port(), results), nprocs=3, join=True)
    assert results[0] == results[1] == [False, True]
    assert results[2] == [True, True]
