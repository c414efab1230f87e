"""GeForce laptop GPUs, the MI300A and the MI350 series in the GPU table: their figures are the published ones,
and a laptop name never plans a node as the desktop card of the same number.

The expected values below are typed from the sources each row cites (NVIDIA's laptop spec tables, AMD's
figures), not read back from predictor/data/gpus.yaml. Laptop rows take the top of NVIDIA's boost range.
"""
import pytest

from geodiloco.predictor.specs import registry, resolve_gpu

# row: (CUDA cores, SMs, memory GB, bus bits, Gbps per pin, boost MHz at the top of the published range)
LAPTOP_DATASHEET = {
    "RTX 2080 Laptop GPU": (2944, 46, 8, 256, 14, 1590),
    "RTX 2070 Laptop GPU": (2304, 36, 8, 256, 14, 1440),
    "RTX 2060 Laptop GPU": (1920, 30, 6, 192, 14, 1200),
    "RTX 3050 Ti Laptop GPU": (2560, 20, 4, 128, 12, 1695),
    "RTX 3060 Laptop GPU": (3840, 30, 6, 192, 14, 1702),
    "RTX 3070 Laptop GPU": (5120, 40, 8, 256, 14, 1620),
    "RTX 3070 Ti Laptop GPU": (5888, 46, 8, 256, 14, 1485),
    "RTX 3080 Laptop GPU 16GB": (6144, 48, 16, 256, 14, 1710),
    "RTX 3080 Laptop GPU 8GB": (6144, 48, 8, 256, 14, 1710),
    "RTX 3080 Ti Laptop GPU": (7424, 58, 16, 256, 16, 1590),
    "RTX 4050 Laptop GPU": (2560, 20, 6, 96, 16, 2370),
    "RTX 4060 Laptop GPU": (3072, 24, 8, 128, 16, 2370),
    "RTX 4070 Laptop GPU": (4608, 36, 8, 128, 16, 2175),
    "RTX 4080 Laptop GPU": (7424, 58, 12, 192, 18, 2280),
    "RTX 4090 Laptop GPU": (9728, 76, 16, 256, 18, 2040),
}


@pytest.mark.parametrize("row", sorted(LAPTOP_DATASHEET))
def test_laptop_rows_carry_the_published_figures(row):
    cores, sms, memory_gb, bus_bits, gbps, boost = LAPTOP_DATASHEET[row]
    spec = registry().by_name[row]
    assert (spec.sm_count, spec.memory_gb, spec.boost_clock_mhz) == (sms, memory_gb, boost)
    assert spec.memory_bandwidth_gbps == pytest.approx(bus_bits / 8 * gbps)
    assert spec.consumer and "Laptop GPU" in spec.model
    # "derived" rows: FP32 = cores x 2 x boost, FP16 tensor = SMs x 1024 x boost, FP32 accumulate at half rate
    assert spec.fp32_tflops == pytest.approx(cores * 2 * boost / 1e6, abs=0.06)
    assert spec.fp16_tflops == pytest.approx(sms * 1024 * boost / 1e6, abs=0.06)
    assert spec.fp16_fp32acc_tflops == pytest.approx(spec.fp16_tflops / 2, abs=0.06)
    assert "top of the published range" in spec.source


def test_the_4090_laptop_gpu_and_the_desktop_4090_are_different_rows():
    laptop, laptop_notice = resolve_gpu("NVIDIA GeForce RTX 4090 Laptop GPU")
    desktop, desktop_notice = resolve_gpu("NVIDIA GeForce RTX 4090")
    assert (laptop.name, desktop.name) == ("RTX 4090 Laptop GPU", "RTX 4090")
    assert (laptop.sm_count, laptop.memory_gb) == (76, 16)
    assert (desktop.sm_count, desktop.memory_gb) == (128, 24)
    assert laptop_notice is None and desktop_notice is None


@pytest.mark.parametrize("desktop_name, desktop_row", [
    ("NVIDIA GeForce RTX 3080", "RTX 3080"),
    ("NVIDIA GeForce RTX 3080 Ti", "RTX 3080 Ti"),
    ("NVIDIA GeForce RTX 3070", "RTX 3070"),
    ("NVIDIA GeForce RTX 4080", "RTX 4080"),
    ("NVIDIA GeForce RTX 4060", "RTX 4060"),
    ("NVIDIA GeForce RTX 2080", "RTX 2080"),
])
def test_desktop_names_keep_their_desktop_rows(desktop_name, desktop_row):
    assert resolve_gpu(desktop_name)[0].name == desktop_row
    laptop = resolve_gpu(desktop_name + " Laptop GPU")[0]
    assert laptop.name != desktop_row and "Laptop GPU" in laptop.model


def test_a_turing_max_q_name_plans_the_laptop_part_not_the_desktop_card():
    max_q, _ = resolve_gpu("NVIDIA GeForce RTX 2080 with Max-Q Design")
    desktop, _ = resolve_gpu("NVIDIA GeForce RTX 2080")
    assert max_q.name == "RTX 2080 Laptop GPU" and desktop.name == "RTX 2080"
    assert max_q.boost_clock_mhz == 1590 and desktop.boost_clock_mhz == 1800


@pytest.mark.parametrize("memory_gib, row", [(7.8, "RTX 3080 Laptop GPU 8GB"), (15.7, "RTX 3080 Laptop GPU 16GB")])
def test_detection_tells_the_3080_laptop_sizes_apart_by_memory(memory_gib, row):
    assert registry().resolve_detected("NVIDIA GeForce RTX 3080 Laptop GPU", memory_gib=memory_gib).name == row


# AMD: (CUs, peak engine clock MHz, memory GB, memory GB/s, dense FP16/BF16 TFLOPS, dense FP8 TFLOPS)
AMD_DATASHEET = {
    "MI300A": (228, 2100, 128, 5300, 980.6, 1961.2),
    "MI350X": (256, 2200, 288, 8000, 2306.9, 4613.7),
    "MI355X": (256, 2400, 288, 8000, 2516.6, 5033.2),
}


@pytest.mark.parametrize("row", sorted(AMD_DATASHEET))
def test_amd_rows_carry_the_published_figures(row):
    cus, clock, memory_gb, bandwidth, fp16, fp8 = AMD_DATASHEET[row]
    spec = resolve_gpu(f"AMD Instinct {row}")[0]
    assert spec.name == row and spec.vendor == "amd" and not spec.consumer
    assert (spec.sm_count, spec.boost_clock_mhz, spec.memory_gb, spec.memory_bandwidth_gbps) == (
        cus, clock, memory_gb, bandwidth)
    assert (spec.fp16_tflops, spec.fp16_fp32acc_tflops, spec.bf16_tflops, spec.fp8_tflops) == (fp16, fp16, fp16, fp8)


def test_the_mi350_series_has_no_tf32_and_plans_tf32_as_fp32():
    for row in ("MI350X", "MI355X"):
        spec = resolve_gpu(row)[0]
        rate, column, note = spec.matmul_rate("tf32")
        assert spec.tf32_tflops is None and column == "fp32_tflops" and "no TF32" in note
    assert resolve_gpu("MI300A")[0].tf32_tflops == 490.3


def test_an_mi355x_in_cpx_mode_is_planned_at_an_eighth_of_the_gpu():
    part = registry().resolve_detected("AMD Instinct MI355X", sm_count=32)
    assert part.sm_count == 32 and part.memory_gb == pytest.approx(288 / 8)
    assert part.bf16_tflops == pytest.approx(2516.6 / 8)
