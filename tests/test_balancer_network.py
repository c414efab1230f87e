import pytest

from balancer.cluster import NodeSpec
from balancer.network import OuterSyncModel, pseudo_gradient_bytes, ring_allreduce_s


def test_ring_time_is_the_ideal_ring_formula_without_latency():
    payload = 40 * 2**20 * 4
    expected = 2 * 3 / 4 * payload * 8 / 100e6
    assert ring_allreduce_s(payload, [100, 100, 100, 100]) == pytest.approx(expected)


def test_ring_time_is_set_by_the_slowest_link_and_largest_latency():
    payload = 1_000_000
    # 2 nodes: 2 steps of 500 kB over 10 Mbit/s (0.4 s) + 5 ms each
    assert ring_allreduce_s(payload, [1000, 10], [1, 5]) == pytest.approx(2 * (0.4 + 0.005))


def test_single_node_has_no_outer_sync():
    assert ring_allreduce_s(10**9, [100]) == 0.0


def test_pseudo_gradient_bytes_follow_the_sync_dtype():
    assert pseudo_gradient_bytes(1000, "fp32") == 4000
    assert pseudo_gradient_bytes(1000, "bf16") == 2000
    assert pseudo_gradient_bytes(1000, "int8") == 1000
    with pytest.raises(ValueError, match="known: fp32"):
        pseudo_gradient_bytes(1000, "fp8")


def test_every_node_spends_the_same_time_in_the_ring():
    nodes = [NodeSpec(name="a", wan={"bandwidth_mbps": 1000}), NodeSpec(name="b", wan={"bandwidth_mbps": 100}),
             NodeSpec(name="c")]
    model = OuterSyncModel(nodes, num_params=3_000_000, sync_dtype="fp32")
    # 12 MB in 3 chunks of 4 MB = 32 Mbit over the 100 Mbit/s link: 0.32 s a step, 4 steps
    assert list(model.node_sync_s()) == pytest.approx([1.28, 1.28, 1.28])


def test_no_wan_entries_means_no_sync_time():
    assert OuterSyncModel([NodeSpec(name="a"), NodeSpec(name="b")], 10**6).sync_s() == 0.0
