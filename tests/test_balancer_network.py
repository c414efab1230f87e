import pytest

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.network import OuterSyncModel, ring_allreduce_s


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


def test_every_node_spends_the_same_time_in_the_ring():
    nodes = [NodeSpec(name="a", wan={"bandwidth_mbps": 1000}), NodeSpec(name="b", wan={"bandwidth_mbps": 100}),
             NodeSpec(name="c")]
    model = OuterSyncModel(nodes, num_params=3_000_000, sync_dtype="fp32")
    # 12 MB in 3 chunks of 4 MB = 32 Mbit over the 100 Mbit/s link: 0.32 s a step, 4 steps
    assert list(model.node_sync_s()) == pytest.approx([1.28, 1.28, 1.28])


def test_no_wan_entries_means_no_sync_time():
    assert OuterSyncModel([NodeSpec(name="a"), NodeSpec(name="b")], 10**6).sync_s() == 0.0


def two_sites(mbps: float = 100.0) -> list:
    return [NodeSpec(name="a", wan={"bandwidth_mbps": mbps}), NodeSpec(name="b", wan={"bandwidth_mbps": mbps})]


def test_int8_puts_a_quarter_of_fp32_on_the_wire_plus_its_scales():
    from geodiloco.balancer.network import CHUNK_ELEMENTS, SyncSettings, encoded_bytes
    numel = 1000 * CHUNK_ELEMENTS
    assert encoded_bytes("int8", numel) == numel + 4 * 1000
    fp32 = OuterSyncModel(two_sites(), numel, settings=SyncSettings(codec="none")).sync_s()
    int8 = OuterSyncModel(two_sites(), numel, settings=SyncSettings(codec="int8")).sync_s()
    # 2 nodes, 100 Mbit/s: one step of half the payload each way, twice
    assert fp32 == pytest.approx(2 * (4 * numel / 2) * 8 / 100e6)
    assert int8 / fp32 == pytest.approx((numel + 4000) / (4 * numel))


def test_only_the_sync_longer_than_the_phase_is_exposed_under_overlap():
    from geodiloco.balancer.network import SyncSettings
    numel = 2_500_000  # fp32, 2 nodes at 100 Mbit/s: 0.8 s
    blocking = OuterSyncModel(two_sites(), numel, settings=SyncSettings("none"))
    delayed = OuterSyncModel(two_sites(), numel, settings=SyncSettings("delayed"))
    streaming = OuterSyncModel(two_sites(), numel, settings=SyncSettings("streaming", fragments=4))
    assert blocking.exposed_s(10.0) == pytest.approx(0.8)
    assert delayed.exposed_s(10.0) == 0.0 and delayed.exposed_s(0.5) == pytest.approx(0.3)
    assert streaming.one_sync_s() == pytest.approx(0.2)
    assert streaming.exposed_s(0.4) == pytest.approx(4 * (0.2 - 0.1))
    assert blocking.hide_phase_s() == 0.0 and delayed.hide_phase_s() == pytest.approx(0.8)


def test_the_sync_model_learns_from_measured_syncs():
    from geodiloco.balancer.network import SyncSettings
    model = OuterSyncModel(two_sites(), 2_500_000, settings=SyncSettings("delayed"))
    for _ in range(10):
        model.observe(1.6)  # the link delivers half its nominal rate
    assert model.sync_s() == pytest.approx(1.6, rel=1e-3)
    assert model.codec_sync_s("int8") == pytest.approx(0.4, rel=1e-2)
