"""vGPU profiles as a guest driver names them resolve to a share of their board.

Expected values come from the datasheets (an A10 has 24 GB, 600 GB/s and 125 dense BF16 TFLOPS) and
from how NVIDIA vGPU divides a board: a time-sliced profile of m GB runs one of board-memory / m turns
(a 4Q profile is one of six on an A10), a MIG-backed one ("A100-3-20C") is that MIG instance.
"""
import pytest

from geodiloco.predictor.schema import ConfigError
from geodiloco.predictor.specs import resolve_gpu
from geodiloco.predictor.vgpu import VgpuProfile, split_vgpu_name


@pytest.mark.parametrize("name, board, memory_gb, series, mig_slices", [
    ("NVIDIA A10-4Q", "NVIDIA A10", 4, "Q", None),
    ("GRID A100-3-20C", "A100", 20, "C", 3),
    ("NVIDIA L40S-48C", "NVIDIA L40S", 48, "C", None),
])
def test_vgpu_names_split_into_board_and_profile(name, board, memory_gb, series, mig_slices):
    board_name, profile = split_vgpu_name(name)
    assert (board_name, profile.memory_gb, profile.series) == (board, memory_gb, series)
    assert (profile.mig.gpu_slices if profile.mig else None) == mig_slices


@pytest.mark.parametrize("name", ["Tesla V100-SXM2-16GB", "NVIDIA A100-PCIE-40GB", "A800-40GB-Active", "H100-PCIE"])
def test_driver_names_of_whole_gpus_are_not_vgpus(name):
    assert split_vgpu_name(name) is None


@pytest.mark.parametrize("name, memory_gb, share", [
    ("NVIDIA A10-4Q", 4, 1 / 6), ("NVIDIA A10-12Q", 12, 1 / 2), ("NVIDIA A10-24Q", 24, 1.0)])
def test_a_time_sliced_profile_is_its_share_of_the_board(name, memory_gb, share):
    row, notice = resolve_gpu(name)
    assert row.memory_gb == memory_gb
    assert row.bf16_tflops == pytest.approx(125 * share)
    assert row.memory_bandwidth_gbps == pytest.approx(600 * share)
    assert (notice is None) == (share == 1.0)
    if notice:
        assert "time-sliced vGPU" in notice and f"{share:.3g}" in notice


def test_a_mig_backed_profile_is_its_mig_instance():
    row, _ = resolve_gpu("NVIDIA A100-PCIE-40GB-3-20C")
    assert row.name == "A100-PCIE-40GB vGPU 3-20C"
    assert (row.sm_count, row.memory_gb) == (42, 20)
    assert row.bf16_tflops == pytest.approx(312 * 42 / 108)
    assert row.memory_bandwidth_gbps == pytest.approx(1555 / 2)


@pytest.mark.parametrize("name, message", [
    ("NVIDIA A10-48Q", "needs 48 GB and A10 has 24 GB"),
    ("NVIDIA RTX 4090-8Q", "GeForce card"),
    ("NVIDIA Mystery-8Q", "vGPU of a GPU the table does not know"),
])
def test_impossible_vgpu_names_say_why(name, message):
    with pytest.raises(ConfigError, match=message):
        resolve_gpu(name)


def test_the_profile_label_round_trips():
    assert VgpuProfile(4, "Q").label == "4Q"
