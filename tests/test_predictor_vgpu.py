"""vGPU profiles as a guest driver names them resolve to a share of their board.

Expected values come from the datasheets (an A10 has 24 GB, 600 GB/s and 125 dense BF16 TFLOPS) and
from how NVIDIA vGPU divides a board: a time-sliced profile of m GB runs one of board-memory / m turns
(a 4Q profile is one of six on an A10), a MIG-backed one ("A100-3-20C") is that MIG instance.
Board codes ("A100D", "H100XM") are the boards NVIDIA's vGPU type tables list them under (NVIDIA AI
Enterprise, "Virtual GPU Types for Supported GPUs"); their MIG instances' shares are NVIDIA's: an A100
slice is 14 SMs (the GPU instance profiles `nvidia-smi mig -lgip` lists), an H100 1g instance has 1/7 of
the SMs and 1/8 of the memory and 3g has 3/7 and 4/8 (MIG user guide, "Supported MIG Profiles").
"""
import pytest

from geodiloco.common.schema import ConfigError
from geodiloco.predictor.specs import resolve_gpu
from geodiloco.predictor.vgpu import VgpuProfile, split_vgpu_name


@pytest.mark.parametrize("name, board, memory_gb, series, mig_slices", [
    ("NVIDIA A10-4Q", "NVIDIA A10", 4, "Q", None),
    ("GRID A100-3-20C", "A100", 20, "C", 3),
    ("NVIDIA L40S-48C", "NVIDIA L40S", 48, "C", None),
    ("NVIDIA A100D-3-40C", "A100-PCIE-80GB", 40, "C", 3),
    ("GRID A100DX-40C", "A100-SXM4-80GB", 40, "C", None),
    ("H100XM-1-10C", "H100-SXM", 10, "C", 1),
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


# (vGPU name, row, its board's row, SMs, memory GB, bandwidth GB/s, dense BF16 TFLOPS): the board from
# NVIDIA's vGPU type tables, its datasheet rates, and the MIG user guide's share of them
BOARD_CODE_MIG_ROWS = [
    ("NVIDIA A100D-3-40C", "A100-PCIE-80GB vGPU 3-40C", "A100-PCIE-80GB", 42, 40, 1935 / 2, 312 * 42 / 108),
    ("GRID A100DX-1-10C", "A100-SXM4-80GB vGPU 1-10C", "A100-SXM4-80GB", 14, 10, 2039 / 8, 312 * 14 / 108),
    ("A100X-3-20C", "A100-SXM4-40GB vGPU 3-20C", "A100-SXM4-40GB", 42, 20, 1555 / 2, 312 * 42 / 108),
    ("a800d-2-20c", "A800-PCIE-80GB vGPU 2-20C", "A800-PCIE-80GB", 28, 20, 1935 * 2 / 8, 312 * 28 / 108),
    ("H100XM-1-10C", "H100-SXM vGPU 1-10C", "H100-SXM", round(132 / 7), 10, 3350 / 8, 989.5 / 7),
    ("NVIDIA H100L-3-47C", "H100-NVL vGPU 3-47C", "H100-NVL", round(132 * 3 / 7), 47, 3900 / 2, 835.5 * 3 / 7),
    ("H800XM-7-80C", "H800-SXM vGPU 7-80C", "H800-SXM", 132, 80, 3350, 989.5),
    # the profile's 18 of 141 GB (the guide gives 1/8; the name rounds it), as test_predictor_mig's B200 1g.23gb
    ("H200X-1-18C", "H200 vGPU 1-18C", "H200", round(132 / 7), 18, 4800 * 18 / 141, 989.5 / 7),
    # a plain "H200-" type is the H200 NVL's (NVIDIA's tables), not the SXM part's
    ("H200-1-18C", "H200-NVL vGPU 1-18C", "H200-NVL", round(132 / 7), 18, 4800 * 18 / 141, 835.5 / 7),
]


@pytest.mark.parametrize("name, row_name, board, sm_count, memory_gb, bandwidth_gbps, bf16_tflops",
                         BOARD_CODE_MIG_ROWS)
def test_a_board_code_names_its_board_for_a_mig_backed_profile(
        name, row_name, board, sm_count, memory_gb, bandwidth_gbps, bf16_tflops):
    row, notice = resolve_gpu(name)
    assert notice is None
    assert (row.name, row.extra["mig_parent"]) == (row_name, board)
    assert (row.sm_count, row.memory_gb) == (sm_count, memory_gb)
    assert row.memory_bandwidth_gbps == pytest.approx(bandwidth_gbps)
    assert row.bf16_tflops == pytest.approx(bf16_tflops)


# (vGPU name, its board's row, memory GB, share, the board's dense FP16 tensor TFLOPS and bandwidth GB/s)
BOARD_CODE_TIME_SLICED = [
    ("NVIDIA A100DX-40C", "A100-SXM4-80GB", 40, 1 / 2, 312, 2039),
    ("A100D-16C", "A100-PCIE-80GB", 16, 1 / 5, 312, 1935),
    ("H100L-47C", "H100-NVL", 47, 1 / 2, 835.5, 3900),
    ("H100XM-80C", "H100-SXM", 80, 1.0, 989.5, 3350),
    ("GRID V100X-8C", "V100-SXM2-16GB", 8, 1 / 2, 125, 900),
    ("V100DX-16C", "V100-SXM2-32GB", 16, 1 / 2, 125, 900),
    ("NVIDIA V100D-8C", "V100-PCIE-32GB", 8, 1 / 4, 112, 900),
    # plain codes: NVIDIA's "H100-" / "H800-" / "H200-" types are the PCIe 80GB and NVL boards, not the SXM ones
    ("H100-40C", "H100-PCIE", 40, 1 / 2, 756, 2000),
    ("NVIDIA H800-20C", "H800-PCIE", 20, 1 / 4, 756, 2000),
]


@pytest.mark.parametrize("name, board, memory_gb, share, fp16_tflops, bandwidth_gbps", BOARD_CODE_TIME_SLICED)
def test_a_board_code_names_its_board_for_a_time_sliced_profile(
        name, board, memory_gb, share, fp16_tflops, bandwidth_gbps):
    row, notice = resolve_gpu(name)
    assert row.extra["vgpu_board"] == board
    assert row.memory_gb == memory_gb
    assert row.fp16_tflops == pytest.approx(fp16_tflops * share)
    assert row.memory_bandwidth_gbps == pytest.approx(bandwidth_gbps * share)
    assert (notice is None) == (share == 1.0)


@pytest.mark.parametrize("name, message", [
    ("NVIDIA A10-48Q", "needs 48 GB and A10 has 24 GB"),
    ("NVIDIA RTX 4090-8Q", "GeForce card"),
    ("NVIDIA Mystery-8Q", "vGPU of a GPU the table does not know"),
    ("NVIDIA A100D-3-20C", "A100-PCIE-80GB has no MIG profile 3g.20gb"),
    ("H800L-1-12C", "MIG instance of a GPU the table does not know: unknown GPU 'H800L'"),
    ("NVIDIA H20X-70C", "vGPU of a GPU the table does not know: unknown GPU 'NVIDIA H20X'"),
])
def test_impossible_vgpu_names_say_why(name, message):
    with pytest.raises(ConfigError, match=message):
        resolve_gpu(name)


def test_the_profile_label_round_trips():
    assert VgpuProfile(4, "Q").label == "4Q"
