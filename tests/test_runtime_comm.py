"""TorchOuterSync on a real 2-process gloo group: weighted sums in each wire dtype, readiness exchange."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from runtime.comm import TorchOuterSync, build_topology
from runtime.launch import free_port

pytestmark = pytest.mark.slow


def _worker(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2")
    dist.init_process_group("gloo")
    try:
        topology = build_topology(["a", "b"][rank], ["a", "b"])
        sync = TorchOuterSync(topology)
        gathered = sync.exchange({"node": topology.node_name, "tokens": 10 * (rank + 1)})
        values = torch.linspace(-1, 1, 1001) * (rank + 1)
        out = {"nodes": [item["node"] for item in gathered], "leader": topology.is_leader}
        for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
            out[name] = sync.reduce_weighted(values.clone(), [0.25, 0.75][rank], dtype)
        results[rank] = out
    finally:
        dist.destroy_process_group()


def test_weighted_sum_in_each_wire_dtype():
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(free_port(), results), nprocs=2, join=True)
    expected = torch.linspace(-1, 1, 1001) * (0.25 * 1 + 0.75 * 2)
    for rank in (0, 1):
        out = results[rank]
        assert out["nodes"] == ["a", "b"] and out["leader"]
        assert out["fp32"].dtype == torch.float32
        torch.testing.assert_close(out["fp32"], expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(out["fp16"], expected, rtol=0, atol=2e-3)
        torch.testing.assert_close(out["bf16"], expected, rtol=0, atol=2e-2)
        assert not torch.equal(out["bf16"], expected)  # it really went over the wire in bf16
    assert torch.equal(results[0]["fp16"], results[1]["fp16"])
