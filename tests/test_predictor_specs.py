"""GPU datasheet table: spellings, errors, user rows, the rate mixed precision really gets."""
import pytest

from geodiloco.common.schema import ConfigError
from geodiloco.predictor.specs import GpuRegistry, load_user_gpus, lookup_gpu, normalize_name, read_gpu_file, resolve_gpu

REQUIRED_GPUS = ["RTX 2080 Ti", "TITAN RTX", "RTX 3090", "RTX 4090", "A30", "V100-PCIE-16GB", "V100-PCIE-32GB",
                 "V100-SXM2-16GB", "V100-SXM2-32GB", "T4", "A10", "L4", "L40S", "A100-SXM4-40GB",
                 "A100-SXM4-80GB", "H100-SXM", "H100-PCIE", "H200"]


@pytest.mark.parametrize("spelling, expected", [
    ("NVIDIA GeForce RTX 2080 Ti", "RTX 2080 Ti"),
    ("Tesla V100-SXM2-32GB", "V100-SXM2-32GB"),
    ("Tesla V100-PCIE-16GB", "V100-PCIE-16GB"),
    ("NVIDIA A30", "A30"),
    ("nvidia titan rtx", "TITAN RTX"),
    ("NVIDIA H100 80GB HBM3", "H100-SXM"),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
])
def test_vendor_spellings_resolve(spelling, expected):
    assert lookup_gpu(spelling).name == expected


def test_required_gpus_have_rows_with_sources():
    for name in REQUIRED_GPUS:
        spec = lookup_gpu(name)
        assert spec.source and spec.sm_count > 0 and spec.memory_bandwidth_gbps > 0


def test_unknown_gpu_names_closest_rows():
    with pytest.raises(ConfigError) as err:
        lookup_gpu("RTX 2080 Tii")
    assert "RTX 2080 Ti" in str(err.value) and "closest known" in str(err.value)


@pytest.mark.parametrize("name", ["Tesla K80", "Tesla M60", "Radeon VII"])
def test_a_gpu_unlike_every_row_gets_no_lookalike_suggestion(name):
    # "K80" shares characters with "H800" but is another GPU: naming it would mislead
    with pytest.raises(ConfigError) as err:
        lookup_gpu(name)
    assert "closest known" not in str(err.value) and "GPUs known (list them: geodiloco predict --list-gpus)" in str(
        err.value)


def test_geforce_mixed_precision_runs_at_half_the_headline():
    spec = lookup_gpu("RTX 3090")
    rate, column, _ = spec.matmul_rate("fp16")
    assert (rate, column) == (71, "fp16_fp32acc_tflops")
    assert rate == spec.fp16_tflops / 2


def test_datacenter_bf16_and_fp32_rates():
    assert lookup_gpu("A30").matmul_rate("bf16")[0] == 165
    assert lookup_gpu("A30").matmul_rate("fp32")[0] == 10.3
    assert lookup_gpu("A30").matmul_rate("tf32")[0] == 82


def test_bf16_without_hardware_falls_back_to_fp16_with_a_note():
    rate, column, note = lookup_gpu("V100-SXM2-32GB").matmul_rate("bf16")
    assert rate == 125 and column == "fp16_fp32acc_tflops" and "no BF16" in note


def test_normalize_name_drops_vendor_words():
    assert normalize_name("NVIDIA GeForce RTX 2080 Ti") == "rtx2080ti"


USER_ROW = """
gpus:
  - name: Lab Card 9000
    aliases: [NVIDIA Lab Card 9000]
    architecture: ampere
    sm_count: 10
    memory_gb: 8
    memory_bandwidth_gbps: 100
    fp32_tflops: 5
    fp16_fp32acc_tflops: 20
    source: "our lab's measurement sheet"
"""


def test_user_gpu_file_adds_a_row(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(USER_ROW)
    [spec] = load_user_gpus(path)
    assert lookup_gpu("nvidia lab card 9000") == spec
    assert spec.matmul_rate("bf16")[0] == 20


def test_user_gpu_file_errors_name_the_field(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(USER_ROW.replace("sm_count: 10", "sm_count: -1"))
    with pytest.raises(ConfigError) as err:
        read_gpu_file(path)
    assert "gpus[0].sm_count" in str(err.value)


def test_a_gpu_file_refuses_an_infinite_rate_and_two_rows_of_one_name(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(USER_ROW.replace("memory_bandwidth_gbps: 100", "memory_bandwidth_gbps: .inf"))
    with pytest.raises(ConfigError, match=r"gpus\[0\]\.memory_bandwidth_gbps: Input should be a finite number"):
        read_gpu_file(path)
    row = USER_ROW.split("gpus:\n", 1)[1]
    path.write_text("gpus:\n" + row + row)
    with pytest.raises(ConfigError) as err:
        read_gpu_file(path)
    assert str(err.value) == (f"{path}: gpus[1] is a second row named 'Lab Card 9000': one file holds one row per GPU "
                              "(rename one, or remove it; a row in another file overrides the shipped one)")


def test_a_misspelt_required_key_is_named_once_as_the_key_it_misspells(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(USER_ROW.replace("memory_bandwidth_gbps", "memory_bandwith_gbps"))
    with pytest.raises(ConfigError) as err:
        read_gpu_file(path)
    assert str(err.value) == (f"{path}: gpus[0].memory_bandwith_gbps: unknown key; did you mean "
                              "'memory_bandwidth_gbps' (required, and missing)?")


def test_registry_later_rows_override_earlier(tmp_path):
    path = tmp_path / "gpus.yaml"
    path.write_text(USER_ROW)
    [first] = read_gpu_file(path)
    path.write_text(USER_ROW.replace("memory_gb: 8", "memory_gb: 16"))
    [second] = read_gpu_file(path)
    registry = GpuRegistry()
    registry.add(first)
    registry.add(second)
    assert registry.lookup("Lab Card 9000").memory_gb == 16


def test_bandwidth_curve_interpolates_in_log_size():
    from dataclasses import replace
    cpu_like = replace(lookup_gpu("A30"), bandwidth_curve=((2**20, 60.0), (2**24, 20.0)))
    assert cpu_like.bandwidth_gbps_for(2**10) == 60.0
    assert cpu_like.bandwidth_gbps_for(2**22) == pytest.approx(40.0)
    assert cpu_like.bandwidth_gbps_for(2**30) == 20.0
    assert lookup_gpu("A30").bandwidth_gbps_for(2**22) == 933


@pytest.mark.parametrize("name, memory_gb, bandwidth_gbps", [("RTX 5090 D", 32, 1792), ("RTX 5090 D v2", 24, 1344)])
def test_the_china_market_5090s_keep_the_chip_but_not_its_tensor_rate(name, memory_gb, bandwidth_gbps):
    """NVIDIA's figures: 2,375 AI TOPS against the RTX 5090's 3,352, the same 21,760 cores at 2407 MHz;
    the v2 has 24 GB on 384 bit at 28 Gbps."""
    capped, full = lookup_gpu(name), lookup_gpu("RTX 5090")
    assert (capped.sm_count, capped.fp32_tflops) == (full.sm_count, full.fp32_tflops)
    assert (capped.memory_gb, capped.memory_bandwidth_gbps) == (memory_gb, bandwidth_gbps)
    assert capped.fp16_tflops == pytest.approx(2375 / 8, abs=0.06)
    assert capped.bf16_tflops == pytest.approx(full.bf16_tflops * 2375 / 3352, abs=0.1)


def test_the_rtx_pro_4000_sff_is_its_own_70_w_board_not_the_rtx_pro_4000():
    """The sources: 8,960 cores at 1337 MHz, 24 GB GDDR7 on 192 bit at 432 GB/s; NVIDIA's 770 sparse FP4 TOPS are
    8 x its dense FP16 rate, 96 TFLOPS, which 70 SMs x 1024 x 1337 MHz matches to within 1 %."""
    sff, notice = resolve_gpu("NVIDIA RTX PRO 4000 Blackwell SFF Edition")
    board = resolve_gpu("NVIDIA RTX PRO 4000 Blackwell")[0]
    assert (sff.name, notice) == ("RTX PRO 4000 Blackwell SFF", None) and board.name == "RTX PRO 4000 Blackwell"
    assert (sff.sm_count, sff.memory_gb, sff.memory_bandwidth_gbps, sff.boost_clock_mhz) == (70, 24, 432, 1337)
    assert sff.fp32_tflops == pytest.approx(8960 * 2 * 1337 / 1e6, abs=0.06)
    assert sff.fp16_tflops == pytest.approx(770 / 8, rel=0.01)
    assert sff.fp16_fp32acc_tflops == sff.bf16_tflops == sff.fp16_tflops and sff.pcie_gen == 5
    assert board.memory_bandwidth_gbps > sff.memory_bandwidth_gbps and board.fp16_tflops > 1.9 * sff.fp16_tflops


@pytest.mark.parametrize("written, message", [
    ("4 A30", "'4 A30': write a GPU count as \"4 x A30\""),
    ("4 2080 Ti", "'4 2080 Ti': write a GPU count as \"4 x 2080 Ti\""),
    ("4 xA30", "'4 xA30': write a GPU count as \"4 x A30\" (a space on both sides of the x)"),
    ("2 xRTX 3090", "'2 xRTX 3090': write a GPU count as \"2 x RTX 3090\""),
    ("A30 x 4", "'A30 x 4': write the GPU count first: \"4 x A30\""),
    ("2 x RTX 3090, 2 x A30", "one entry per kind of GPU; write them as list items: [\"2 x RTX 3090\", \"2 x A30\"]"),
    ("3× RTX 2080 Ti + 1× Titan RTX", "write them as list items: [\"3× RTX 2080 Ti\", \"1× Titan RTX\"]"),
])
def test_a_count_written_another_way_is_refused_with_the_form_that_works(written, message):
    # each would have read as one unknown GPU of that whole name: a one-GPU node planned like a stand-in
    from geodiloco.predictor.specs import expand_gpu_counts
    with pytest.raises(ConfigError) as refused:
        expand_gpu_counts([written])
    assert message in str(refused.value)


def test_names_that_only_look_like_counts_are_left_alone():
    from geodiloco.predictor.specs import expand_gpu_counts
    assert expand_gpu_counts(["2080 Ti", "Quadro RTX 8000", "4x A30", "3 Zorg"]) == \
        ["2080 Ti", "Quadro RTX 8000", "A30", "A30", "A30", "A30", "3 Zorg"]
