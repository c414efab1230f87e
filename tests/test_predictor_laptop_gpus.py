"""GeForce and professional laptop GPUs, the MI300A and the MI350 series in the GPU table: their figures are the
published ones, and a laptop name never plans a node as the desktop card of the same number.

The expected values below are typed from the sources each row cites (NVIDIA's laptop spec tables, TechPowerUp
and Notebookcheck for the Turing Max-Q parts, AMD's figures), not read back from predictor/data/gpus.yaml. Ampere
and Ada laptop rows take the top of NVIDIA's boost range. The Turing laptop rows are Max-Q rows: the only Turing
laptop names the driver prints for parts sold on the desktop too are "... with Max-Q Design"; a full-power Turing
laptop prints the desktop name. Parts sold only in laptops (GTX 1650 Ti, MX450, MX550, Quadro T2000) print their own.
"""
import pytest

from geodiloco.predictor.specs import registry, resolve_gpu

# row: (CUDA cores, SMs, memory GB, bus bits, Gbps per pin, boost MHz at the top of the published range)
LAPTOP_DATASHEET = {
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
    # Ampere's GA107 without the Ti: Notebookcheck's TGP table, 1058-1740 MHz over 35-80 W
    "RTX 3050 Laptop GPU": (2048, 16, 4, 128, 12, 1740),
    # its 2023 6 GB refresh: Notebookcheck, 2560 cores on 96 bit, 1058-1740 MHz over 35-80 W; 12 Gbps per GPU
    # databases (cpu-gpu.alldbin.com, TechPowerUp as cputronic.com mirrors it)
    "RTX 3050 6GB Laptop GPU": (2560, 20, 6, 96, 12, 1740),
    # Blackwell (CES 2025 launch table for cores, memory and bus; boost at the top TGP from GPU databases)
    "RTX 5090 Laptop GPU": (10496, 82, 24, 256, 28, 2160),
    "RTX 5080 Laptop GPU": (7680, 60, 16, 256, 28, 2287),
    "RTX 5070 Laptop GPU": (4608, 36, 8, 128, 24, 2347),
    "RTX 5060 Laptop GPU": (3328, 26, 8, 128, 24, 2497),
    # professional parts (GPU databases): RTX 5000 Ada Laptop 2190 MHz at 150 W, 18 Gbps; RTX 4000 Ada Laptop
    # 2264 MHz at 150 W, 18 Gbps; RTX A500 Laptop 7.3 TFLOPS FP32 (so 1782 MHz), 14 Gbps on 64 bit
    "RTX 5000 Ada Laptop GPU": (9728, 76, 16, 256, 18, 2190),
    "RTX 4000 Ada Laptop GPU": (7424, 58, 12, 192, 18, 2264),
    "RTX A500 Laptop GPU": (2048, 16, 4, 64, 14, 1782),
}
PROFESSIONAL_LAPTOP_ROWS = {"RTX 5000 Ada Laptop GPU", "RTX 4000 Ada Laptop GPU", "RTX A500 Laptop GPU"}
"""Full-rate FP32 accumulate, like their desktop workstation boards."""


def assert_derived_laptop_row(spec, figures, consumer=True, tensor=True):
    """The row holds the typed figures, and its rates follow the table's "derived" rule: FP32 = cores x 2 x
    boost, FP16 tensor = SMs x 1024 x boost, FP32 accumulate at half rate on GeForce parts and at full rate
    on professional ones; a part without tensor cores (TU11x) has FP32 only, which mixed precision plans at."""
    cores, sms, memory_gb, bus_bits, gbps, boost = figures
    assert (spec.sm_count, spec.memory_gb, spec.boost_clock_mhz) == (sms, memory_gb, boost)
    assert spec.memory_bandwidth_gbps == pytest.approx(bus_bits / 8 * gbps)
    assert spec.consumer == consumer
    assert spec.fp32_tflops == pytest.approx(cores * 2 * boost / 1e6, abs=0.06)
    if not tensor:
        assert (spec.fp16_tflops, spec.fp16_fp32acc_tflops, spec.bf16_tflops) == (None, None, None)
        assert spec.matmul_rate("fp16")[0] == spec.fp32_tflops
        return
    assert spec.fp16_tflops == pytest.approx(sms * 1024 * boost / 1e6, abs=0.06)
    accumulate_share = 0.5 if consumer else 1.0
    assert spec.fp16_fp32acc_tflops == pytest.approx(spec.fp16_tflops * accumulate_share, abs=0.06)


@pytest.mark.parametrize("row", sorted(LAPTOP_DATASHEET))
def test_laptop_rows_carry_the_published_figures(row):
    spec = registry().by_name[row]
    assert_derived_laptop_row(spec, LAPTOP_DATASHEET[row], consumer=row not in PROFESSIONAL_LAPTOP_ROWS)
    assert "Laptop GPU" in spec.model
    assert "top of the published range" in spec.source


# Turing Max-Q row: (CUDA cores, SMs, memory GB, bus bits, Gbps per pin, boost MHz at the top of the Max-Q range)
# 2080 Max-Q: Notebookcheck, 80 W at 735-1095 MHz and 90 W at 990-1230 MHz, 12 Gbps (TechPowerUp: 384.0 GB/s);
# 2070 Max-Q: 885/1185 MHz, 12 Gbps = 384 GB/s (NVIDIA launch range 1185-1440 MHz, TechPowerUp);
# 2060 Max-Q: 975/1185 MHz at 65 W, 11 Gbps = 264 GB/s (TechPowerUp);
# 2080 SUPER Max-Q: 735/975 MHz at 80 W, 11 Gbps = 352 GB/s (TechPowerUp; the only Max-Q boost figure found)
TURING_MAX_Q_DATASHEET = {
    "RTX 2080 SUPER Max-Q": (3072, 48, 8, 256, 11, 975),
    "RTX 2080 Max-Q": (2944, 46, 8, 256, 12, 1230),
    "RTX 2070 Max-Q": (2304, 36, 8, 256, 12, 1185),
    "RTX 2060 Max-Q": (1920, 30, 6, 192, 11, 1185),
}


@pytest.mark.parametrize("row", sorted(TURING_MAX_Q_DATASHEET))
def test_turing_max_q_rows_carry_the_published_max_q_figures(row):
    spec = registry().by_name[row]
    assert_derived_laptop_row(spec, TURING_MAX_Q_DATASHEET[row])
    assert spec.model == row and spec.architecture == "turing"
    assert spec.bf16_tflops is None
    assert "top of the published Max-Q range" in spec.source


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
])
def test_desktop_names_keep_their_desktop_rows(desktop_name, desktop_row):
    assert resolve_gpu(desktop_name)[0].name == desktop_row
    laptop = resolve_gpu(desktop_name + " Laptop GPU")[0]
    assert laptop.name != desktop_row and "Laptop GPU" in laptop.model


@pytest.mark.parametrize("number, max_q_boost, max_q_gbps, desktop_boost", [
    ("2080", 1230, 384, 1800),
    ("2070", 1185, 384, 1710),
    ("2060", 1185, 264, 1680),
])
def test_a_turing_max_q_name_plans_the_max_q_part_not_the_desktop_card(number, max_q_boost, max_q_gbps,
                                                                       desktop_boost):
    desktop, _ = resolve_gpu(f"NVIDIA GeForce RTX {number}")
    assert desktop.name == f"RTX {number}" and desktop.boost_clock_mhz == desktop_boost
    for name in (f"NVIDIA GeForce RTX {number} with Max-Q Design", f"GeForce RTX {number} with Max-Q Design"):
        max_q, notice = resolve_gpu(name)
        assert max_q.name == f"RTX {number} Max-Q" and notice is None
        assert (max_q.boost_clock_mhz, max_q.memory_bandwidth_gbps) == (max_q_boost, max_q_gbps)
        # the same chip as the desktop card (and the full-power laptop, which prints the desktop name)
        assert (max_q.sm_count, max_q.memory_gb) == (desktop.sm_count, desktop.memory_gb)
        assert max_q.fp16_tflops < desktop.fp16_tflops and max_q.memory_bandwidth_gbps < desktop.memory_bandwidth_gbps


@pytest.mark.parametrize("spelling", ["RTX 2080 Laptop", "RTX 2080 Mobile", "RTX 2080 Laptop GPU",
                                      "NVIDIA GeForce RTX 2080 Laptop GPU", "RTX 2080 Max-Q"])
def test_a_turing_laptop_spelling_without_a_power_class_takes_the_max_q_row(spelling):
    spec, notice = resolve_gpu(spelling)
    assert spec.name == "RTX 2080 Max-Q" and notice is None


def test_the_2080_super_max_q_is_its_own_part_not_the_2080_max_q_or_the_desktop_super():
    super_max_q, notice = resolve_gpu("NVIDIA GeForce RTX 2080 Super with Max-Q Design")
    assert super_max_q.name == "RTX 2080 SUPER Max-Q" and notice is None
    desktop_super = resolve_gpu("NVIDIA GeForce RTX 2080 SUPER")[0]
    assert desktop_super.name == "RTX 2080 SUPER" and desktop_super.sm_count == super_max_q.sm_count == 48
    assert resolve_gpu("NVIDIA GeForce RTX 2080 with Max-Q Design")[0].sm_count == 46


def test_a_laptop_size_the_table_lacks_is_unknown_not_the_other_size():
    """The 6 GB RTX 3050 laptop part is its own row, never the 4 GB part (2 GB apart is a different part, not a
    rounding of the same size); a size no RTX 3050 laptop part comes in takes the unknown-GPU path with its
    notice rather than the nearest size."""
    six, notice = resolve_gpu("NVIDIA GeForce RTX 3050 6GB Laptop GPU")
    assert (six.name, six.memory_gb, notice) == ("RTX 3050 6GB Laptop GPU", 6, None)
    assert resolve_gpu("RTX 3050 Laptop GPU 6GB")[0].name == "RTX 3050 6GB Laptop GPU"
    assert resolve_gpu("NVIDIA GeForce RTX 3050 4GB Laptop GPU")[0].name == "RTX 3050 Laptop GPU"
    assert resolve_gpu("NVIDIA GeForce RTX 3050 Laptop GPU") == (registry().by_name["RTX 3050 Laptop GPU"], None)
    with pytest.raises(ValueError, match="none matches '8 GB'"):
        resolve_gpu("RTX 3050 Laptop GPU 8GB")
    assert resolve_gpu("H100 NVL 94GB")[0].name == "H100-NVL"  # a size a few percent off still means the row


@pytest.mark.parametrize("desktop_name, desktop_row, laptop_row", [
    ("NVIDIA RTX 5000 Ada Generation", "RTX 5000 Ada", "RTX 5000 Ada Laptop GPU"),
    ("NVIDIA RTX 4000 Ada Generation", "RTX 4000 Ada", "RTX 4000 Ada Laptop GPU"),
])
def test_a_professional_laptop_name_never_plans_the_desktop_board(desktop_name, desktop_row, laptop_row):
    assert resolve_gpu(desktop_name)[0].name == desktop_row
    laptop, notice = resolve_gpu(desktop_name + " Laptop GPU")
    assert laptop.name == laptop_row and notice is None
    desktop = resolve_gpu(desktop_name)[0]
    assert (laptop.sm_count, laptop.memory_gb) != (desktop.sm_count, desktop.memory_gb)  # another chip or board


# GB10 (DGX Spark): NVIDIA's figures: 1 PFLOP FP4 with sparsity, about 31 TFLOPS FP32, 128 GB at 273 GB/s,
# 48 SMs; no FP16 or BF16 figure is published, so FP32-accumulate is taken at GeForce Blackwell's half rate
def test_gb10_carries_nvidias_figures_and_is_found_by_its_driver_and_system_names():
    for name in ("NVIDIA GB10", "DGX Spark"):
        spec, notice = resolve_gpu(name)
        assert spec.name == "GB10" and notice is None
    assert (spec.sm_count, spec.memory_gb, spec.memory_bandwidth_gbps) == (48, 128, 273)
    assert spec.fp16_tflops == pytest.approx(1000 / 8) and spec.fp32_tflops == pytest.approx(31.0)
    assert spec.bf16_tflops == pytest.approx(spec.fp16_tflops / 2) and spec.pcie_gen is None
    assert "unconfirmed" in spec.source


@pytest.mark.parametrize("memory_gib, row", [(7.8, "RTX 3080 Laptop GPU 8GB"), (15.7, "RTX 3080 Laptop GPU 16GB")])
def test_detection_tells_the_3080_laptop_sizes_apart_by_memory(memory_gib, row):
    assert registry().resolve_detected("NVIDIA GeForce RTX 3080 Laptop GPU", memory_gib=memory_gib).name == row


# Laptop parts the open driver lists under their own names, typed from the sources their rows cite (Notebookcheck,
# NVIDIA's tables as printed by ComputerBase, Tom's Hardware and xda, TechPowerUp's figures as GPU databases mirror
# them): driver name -> (row, CUDA cores, memory GB, bus bits, Gbps per pin, boost MHz, tensor cores, GeForce).
# The boost is the top of the published range of that variant (its Max-Q range for a "with Max-Q Design" name).
DRIVER_NAMED_LAPTOP_DATASHEET = {
    "Quadro RTX 5000 with Max-Q Design": ("Quadro RTX 5000 Max-Q", 3072, 16, 256, 14, 1350, True, False),
    "Quadro RTX 4000 with Max-Q Design": ("Quadro RTX 4000 Max-Q", 2560, 8, 256, 14, 1380, True, False),
    "Quadro RTX 3000 with Max-Q Design": ("Quadro RTX 3000 Max-Q", 2304, 6, 192, 12, 1215, True, False),
    "Quadro T2000": ("Quadro T2000", 1024, 4, 128, 8, 1785, False, False),
    "NVIDIA GeForce GTX 1660 Ti with Max-Q Design": ("GTX 1660 Ti Max-Q", 1536, 6, 192, 12, 1335, False, True),
    "NVIDIA GeForce GTX 1650 Ti": ("GTX 1650 Ti", 1024, 4, 128, 12, 1485, False, True),
    "NVIDIA GeForce GTX 1650 Ti with Max-Q Design": ("GTX 1650 Ti Max-Q", 1024, 4, 128, 10, 1365, False, True),
    "NVIDIA GeForce GTX 1650 with Max-Q Design": ("GTX 1650 Max-Q", 1024, 4, 128, 8, 1245, False, True),
    "NVIDIA GeForce MX550": ("MX550", 1024, 2, 64, 12, 1320, False, True),
    "NVIDIA GeForce MX450": ("MX450", 896, 2, 64, 10, 1575, False, True),
    "NVIDIA RTX A4000 Laptop GPU": ("RTX A4000 Laptop GPU", 5120, 8, 256, 12, 1680, True, False),
    "NVIDIA RTX A4500 Laptop GPU": ("RTX A4500 Laptop GPU", 5888, 16, 256, 16, 1500, True, False),
    "NVIDIA RTX A5000 Laptop GPU": ("RTX A5000 Laptop GPU", 6144, 16, 256, 14, 1575, True, False),
    "NVIDIA RTX A5500 Laptop GPU": ("RTX A5500 Laptop GPU", 7424, 16, 256, 16, 1500, True, False),
    "NVIDIA GeForce RTX 2050": ("RTX 2050", 2048, 4, 64, 14, 1477, True, True),
    "NVIDIA GeForce RTX 5050 Laptop GPU": ("RTX 5050 Laptop GPU", 2560, 8, 128, 24, 2662, True, True),
    "NVIDIA GeForce MX570": ("MX570", 2048, 2, 64, 12, 1155, True, True),
    "NVIDIA GeForce MX570 A": ("MX570", 2048, 2, 64, 12, 1155, True, True),
    # NVIDIA's FP32 figures as the launch press printed them: 12.1 and 9.2 TFLOPS, so 2363 and 2246 MHz
    "NVIDIA RTX 1000 Ada Generation Laptop GPU": ("RTX 1000 Ada Laptop GPU", 2560, 6, 96, 16, 2363, True, False),
    "NVIDIA RTX 500 Ada Generation Laptop GPU": ("RTX 500 Ada Laptop GPU", 2048, 4, 64, 12, 2246, True, False),
    # 38.7 TFLOPS FP32 in the launch table, so 38.7e6 / (2 x 7680) = 2520 MHz
    "NVIDIA RTX PRO 4000 Blackwell Generation Laptop GPU": ("RTX PRO 4000 Blackwell Laptop GPU", 7680, 16, 256, 28, 2520,
                                                            True, False),
}


@pytest.mark.parametrize("driver_name", sorted(DRIVER_NAMED_LAPTOP_DATASHEET))
def test_a_laptop_part_named_by_the_driver_resolves_to_its_row_with_the_published_figures(driver_name):
    row, cores, memory_gb, bus_bits, gbps, boost, tensor, geforce = DRIVER_NAMED_LAPTOP_DATASHEET[driver_name]
    spec, notice = resolve_gpu(driver_name)
    assert (spec.name, notice) == (row, None)
    sms = cores // (64 if spec.architecture == "turing" else 128)
    assert_derived_laptop_row(spec, (cores, sms, memory_gb, bus_bits, gbps, boost), consumer=geforce, tensor=tensor)
    assert "top of the published" in spec.source and driver_name in spec.source


@pytest.mark.parametrize("laptop_name, desktop_name", [
    ("Quadro RTX 5000 with Max-Q Design", "NVIDIA Quadro RTX 5000"),
    ("Quadro RTX 4000 with Max-Q Design", "NVIDIA Quadro RTX 4000"),
    ("NVIDIA GeForce GTX 1650 with Max-Q Design", "NVIDIA GeForce GTX 1650"),
    ("NVIDIA GeForce GTX 1660 Ti with Max-Q Design", "NVIDIA GeForce GTX 1660 Ti"),
    ("NVIDIA GeForce RTX 5050 Laptop GPU", "NVIDIA GeForce RTX 5050"),
    ("NVIDIA RTX PRO 4000 Blackwell Generation Laptop GPU", "NVIDIA RTX PRO 4000 Blackwell"),
    ("NVIDIA RTX A4000 Laptop GPU", "NVIDIA RTX A4000"),
])
def test_a_laptop_part_never_plans_as_the_desktop_card_of_its_number(laptop_name, desktop_name):
    laptop, desktop = resolve_gpu(laptop_name)[0], resolve_gpu(desktop_name)[0]
    assert laptop.name != desktop.name
    assert (laptop.boost_clock_mhz, laptop.memory_bandwidth_gbps) != (desktop.boost_clock_mhz, desktop.memory_bandwidth_gbps)


def test_a_max_q_part_without_a_row_is_unknown_not_the_full_power_part():
    """Quadro T2000 has a row; its Max-Q part (40 W, other clocks and memory) does not, and must not plan as it."""
    assert resolve_gpu("Quadro T2000")[0].name == "Quadro T2000"
    with pytest.raises(ValueError, match="unknown GPU"):
        resolve_gpu("Quadro T2000 with Max-Q Design")


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
