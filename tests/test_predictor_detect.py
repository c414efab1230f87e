"""Detection: NVML through a mock at its boundary, CPU fallback, on-disk cache."""
import json
import sys
import types

import pytest

from geodiloco.predictor import detect
from gpu_fakes import install_fake_torch_cuda
from geodiloco.predictor.specs import detected_gpu, lookup_gpu


class FakeNVMLError(Exception):
    pass


def fake_pynvml(init_error=None, devices=()):
    module = types.ModuleType("pynvml")
    module.NVMLError = FakeNVMLError
    module.NVML_CLOCK_SM, module.NVML_CLOCK_MEM = 1, 2

    def init():
        if init_error:
            raise FakeNVMLError(init_error)

    module.nvmlInit = init
    module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: len(devices)
    module.nvmlDeviceGetHandleByIndex = lambda index: devices[index]
    module.nvmlDeviceGetName = lambda handle: handle["name"]

    def memory_info(handle):
        if isinstance(handle["bytes"], Exception):
            raise handle["bytes"]
        return types.SimpleNamespace(total=handle["bytes"])

    module.nvmlDeviceGetMemoryInfo = memory_info
    module.nvmlDeviceGetMaxClockInfo = lambda handle, clock: 1410 if clock == 1 else 1215
    return module


@pytest.fixture
def cached_cpu(tmp_path, monkeypatch):
    """A CPU cache entry so nothing is measured."""
    monkeypatch.setenv("GEODILOCO_CACHE_DIR", str(tmp_path))
    key = detect._cache_key(detect.compute_threads())
    entry = {"matmul_tflops": 0.05, "memory_bandwidth_gbps": 8.0, "host_op_us": 4.0, "library": "test",
             "matmul_size": 1024, "measured_at": "now", "threads": detect.compute_threads()}
    (tmp_path / detect.CACHE_FILE_NAME).write_text(json.dumps({key: entry}))
    return entry


def test_nvml_library_missing_falls_back_to_cpu_with_reason(monkeypatch, cached_cpu):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_error="NVML Shared Library Not Found"))
    monkeypatch.setattr(detect, "torch_cuda_gpus", lambda: ([], "torch.cuda reports no GPU"))
    machine = detect.describe_this_machine()
    assert machine["kind"] == "cpu" and machine["gpus"] == []
    assert any("NVML Shared Library Not Found" in reason for reason in machine["fallback_reasons"])
    assert machine["cpu"]["matmul_tflops"] == 0.05


def test_nvml_gpus_are_read_and_matched_to_datasheet_rows(monkeypatch):
    devices = [{"name": "NVIDIA A100-SXM4-40GB", "bytes": 40 * 2**30},
               {"name": b"Tesla V100-SXM2-32GB", "bytes": 32 * 2**30}]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices=devices))
    machine = detect.describe_this_machine(measure=False)
    assert machine["kind"] == "gpu" and machine["source"] == "nvml"
    first, second = machine["gpus"]
    assert (first["datasheet"], first["sm_count"], first["memory_gb"]) == ("A100-SXM4-40GB", 108, 40.0)
    assert second["datasheet"] == "V100-SXM2-32GB" and first["sm_clock_max_mhz"] == 1410


def test_a_gpu_on_the_hosts_memory_is_detected_with_the_machines_memory(monkeypatch):
    """The GB10 (DGX Spark) shares the host's memory, and NVML answers "Not Supported" for its memory
    (NVIDIA's DGX Spark known issues): NVML detection keeps the GPU, with the machine's memory."""
    devices = [{"name": "NVIDIA GB10", "bytes": FakeNVMLError("Not Supported")}]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices=devices))
    monkeypatch.setattr(detect, "memory_total_gb", lambda: 119.7)
    machine = detect.describe_this_machine(measure=False)
    assert machine["source"] == "nvml"
    [gpu] = machine["gpus"]
    assert (gpu["name"], gpu["datasheet"], gpu["memory_gb"], gpu["unified_memory"]) == ("NVIDIA GB10", "GB10", 119.7, True)
    assert gpu["sm_count"] == 48


def test_any_other_nvml_memory_error_still_falls_back_with_its_reason(monkeypatch, cached_cpu):
    devices = [{"name": "NVIDIA A100-SXM4-40GB", "bytes": FakeNVMLError("GPU is lost")}]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices=devices))
    monkeypatch.setattr(detect, "torch_cuda_gpus", lambda: ([], "torch.cuda reports no GPU"))
    machine = detect.describe_this_machine()
    assert machine["kind"] == "cpu"
    assert any("NVML query failed: GPU is lost" in reason for reason in machine["fallback_reasons"])


def test_unknown_gpu_name_from_nvml_has_no_datasheet_row(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(devices=[{"name": "NVIDIA Mystery", "bytes": 2**30}]))
    [gpu] = detect.describe_this_machine(measure=False)["gpus"]
    assert gpu["datasheet"] is None and "sm_count" not in gpu


def test_cpu_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("GEODILOCO_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def fake_measure():
        calls.append(1)
        return {"matmul_tflops": 0.2, "memory_bandwidth_gbps": 9.0, "host_op_us": 3.0, "library": "x",
                "matmul_size": 1024, "measured_at": "now"}

    monkeypatch.setattr(detect, "measure_cpu", fake_measure)
    assert detect.cpu_peak()["matmul_tflops"] == 0.2
    assert detect.cpu_peak()["matmul_tflops"] == 0.2
    assert len(calls) == 1
    assert (tmp_path / "cache" / detect.CACHE_FILE_NAME).is_file()
    detect.cpu_peak(refresh=True)
    assert len(calls) == 2


def test_cpu_spec_uses_the_measured_rates(cached_cpu):
    spec = detect.cpu_spec()
    assert spec.is_cpu and spec.fp32_tflops == 0.05 and spec.memory_bandwidth_gbps == 8.0
    assert spec.matmul_rate("bf16")[0] == 0.05


def test_measure_cpu_returns_positive_rates():
    measured = detect.measure_cpu(size=128, copy_sizes_mb=(0.25, 1.0), repeats=1)
    assert measured["matmul_tflops"] > 0 and measured["memory_bandwidth_gbps"] > 0 and measured["host_op_us"] > 0
    assert [size for size, _ in measured["bandwidth_curve"]] == [0.25 * 2**20, 2**20]


class FakeRocmSmi:
    """What ``rocm-smi --showproductname --showmeminfo vram --json`` prints on a two-GPU MI250X box."""

    def __init__(self, stdout: str, returncode: int = 0) -> None:
        self.stdout, self.returncode = stdout, returncode

    def __call__(self, args, **kwargs):
        import subprocess
        assert args[0] == "rocm-smi" and "--json" in args
        return subprocess.CompletedProcess(args, self.returncode, stdout=self.stdout, stderr="rocm-smi: boom")


ROCM_JSON = ('{"card0": {"Card Series": "AMD Instinct MI250X / MI250", "Card Model": "0x740c", '
             '"VRAM Total Memory (B)": "68702699520"}, "card1": {"card series": "AMD Instinct MI300X", '
             '"VRAM Total Memory (B)": "205822885888"}, "system": {"Driver version": "6.8.5"}}')


def test_rocm_smi_gpus_are_read_and_matched_to_datasheet_rows():
    gpus, reason = detect.rocm_smi_gpus(run=FakeRocmSmi(ROCM_JSON))
    assert reason == ""
    assert [gpu["name"] for gpu in gpus] == ["AMD Instinct MI250X / MI250", "AMD Instinct MI300X"]
    assert [gpu["memory_gb"] for gpu in gpus] == [63.98, 191.69]
    assert [gpu["datasheet"] for gpu in gpus] == ["MI250X", "MI300X"]


def test_rocm_smi_failure_is_a_reason_not_an_error():
    gpus, reason = detect.rocm_smi_gpus(run=FakeRocmSmi("", returncode=2))
    assert gpus == [] and "rocm-smi failed (exit 2): rocm-smi: boom" == reason
    gpus, reason = detect.rocm_smi_gpus(run=FakeRocmSmi("not json"))
    assert gpus == [] and reason.startswith("rocm-smi printed no JSON")


MI250_JSON = ('{"card0": {"Card Series": "AMD Instinct MI250", "VRAM Total Memory (B)": "68702699520"}, '
              '"card1": {"Card Series": "AMD Instinct MI250", "VRAM Total Memory (B)": "68702699520"}}')


def test_a_die_listed_under_its_package_name_gets_the_row_of_its_memory():
    """ROCm lists each of an MI250's two dies as a 64 GiB device named like the 128 GB package."""
    gpus, _ = detect.rocm_smi_gpus(run=FakeRocmSmi(MI250_JSON))
    assert [gpu["datasheet"] for gpu in gpus] == ["MI250 GCD", "MI250 GCD"]
    assert lookup_gpu("MI250 GCD").fp16_tflops == pytest.approx(362.1 / 2, rel=1e-3)


@pytest.mark.parametrize("name, memory_gib, row", [
    ("AMD Instinct MI250", 127.98, "MI250"),           # the whole package (memory matches its row)
    ("NVIDIA A100-PCIE-40GB", 39.39, "A100-PCIE-40GB"),
    ("NVIDIA A100 80GB PCIe", 79.15, "A100-PCIE-80GB"),
    ("NVIDIA A100-SXM4-40GB", None, "A100-SXM4-40GB"),  # memory unknown: the name decides
    ("NVIDIA GeForce RTX 4090", 23.99, "RTX 4090"),
    ("NVIDIA B300 SXM6 AC", 268.0, "B300"),              # drivers show ~7 % less than the 288 GB sold
])
def test_detected_memory_keeps_a_row_that_already_matches(name, memory_gib, row):
    assert detected_gpu(name, memory_gib).name == row


@pytest.mark.parametrize("sm_count, row", [(104, "MI250 GCD"), (110, "MI250X"), (None, "MI250X")])
def test_torch_name_of_an_mi250_die_is_told_apart_by_its_compute_units(sm_count, row):
    """torch prints "AMD Instinct MI250X / MI250" for an MI250 die (104 CUs); an MI250X die has 110."""
    assert detected_gpu("AMD Instinct MI250X / MI250", 63.98, sm_count).name == row


def test_torch_cuda_detection_passes_memory_and_compute_units(monkeypatch):
    install_fake_torch_cuda(monkeypatch, "AMD Instinct MI250X / MI250", 68702699520, 104, hip="6.0")
    gpus, reason = detect.torch_cuda_gpus()
    assert reason == "" and gpus[0]["datasheet"] == "MI250 GCD" and gpus[0]["runtime"] == "rocm"


RADEON_JSON = ('{"card0": {"Card Series": "Navi 31 [Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M]", "Card Model": "0x744c", '
               '"VRAM Total Memory (B)": "25753026560"}, '
               '"card1": {"Card Series": "Navi 31 [Radeon Pro W7900]", "VRAM Total Memory (B)": "51522830336"}, '
               '"card2": {"Card Series": "AMD Radeon RX 7900 GRE", "VRAM Total Memory (B)": "17163091968"}, '
               '"card3": {"Card Series": "Navi 31 [Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M]", '
               '"VRAM Total Memory (B)": "21458059264"}}')


def test_rocm_smi_radeon_cards_get_their_rows_by_name_and_memory():
    """rocm-smi prints a Radeon's "Card Series" as its marketing name or, where its ROCm lacks that, as the PCI ID
    database's "<chip> [<products>]", which for Navi 31 lists every RX 7900: the device's memory picks the part."""
    gpus, reason = detect.rocm_smi_gpus(run=FakeRocmSmi(RADEON_JSON))
    assert reason == ""
    assert [gpu["datasheet"] for gpu in gpus] == ["RX 7900 XTX", "Radeon PRO W7900", "RX 7900 GRE", "RX 7900 XT"]


def test_torch_on_rocm_counts_an_rdna_gpus_compute_units_not_its_workgroup_processors(monkeypatch):
    """ROCm reports an RDNA GPU's workgroup processors (two CUs each) as multiprocessors: 48 on an RX 7900 XTX."""
    install_fake_torch_cuda(monkeypatch, "AMD Radeon RX 7900 XTX", 25753026560, 48, hip="6.2", arch="gfx1100")
    [gpu], reason = detect.torch_cuda_gpus()
    assert reason == "" and (gpu["datasheet"], gpu["sm_count"], gpu["runtime"]) == ("RX 7900 XTX", 96, "rocm")
    assert gpu["sm_count"] == lookup_gpu("RX 7900 XTX").sm_count


@pytest.mark.parametrize("arch, hip, reported, units", [
    ("gfx1100", True, 48, 96),                  # RX 7900 XTX
    ("gfx1201", True, 32, 64),                  # RX 9070 XT
    ("gfx90a:sramecc+:xnack-", True, 104, 104),  # CDNA counts CUs: an MI250 die
    ("gfx942", True, 304, 304),
    ("", True, 48, 48),                         # no architecture reported: as reported
    ("gfx1100", False, 48, 48),                 # not a ROCm build
])
def test_compute_units_double_only_rdna_workgroup_processors(arch, hip, reported, units):
    import types
    props = types.SimpleNamespace(multi_processor_count=reported, gcnArchName=arch)
    assert detect.compute_units(props, hip) == units


def table_registry():
    """A fresh registry over the shipped table, so that notices already logged elsewhere are logged again."""
    from geodiloco.predictor.specs import DATA_FILE, GpuRegistry, read_gpu_file
    registry = GpuRegistry()
    for spec in read_gpu_file(DATA_FILE):
        registry.add(spec)
    return registry


@pytest.mark.parametrize("name, memory_gib, row", [
    ("NVIDIA GeForce RTX 4060 Ti", 15.7, "RTX 4060 Ti 16GB"),   # NVML prints one name for both sizes
    ("NVIDIA GeForce RTX 4060 Ti", 7.6, "RTX 4060 Ti 8GB"),
    ("NVIDIA GeForce RTX 3080", 11.8, "RTX 3080 12GB"),
    ("NVIDIA GeForce RTX 3080", 9.8, "RTX 3080"),
])
def test_a_driver_name_shared_by_two_sizes_is_settled_by_memory_without_a_notice(name, memory_gib, row, caplog):
    with caplog.at_level("WARNING", logger="geodiloco.predictor"):
        assert table_registry().resolve_detected(name, memory_gib).name == row
    assert not [record for record in caplog.records if "could be several parts" in record.getMessage()]


@pytest.mark.parametrize("name, memory_gib, row", [
    # as NVML printed it on an H200 SXM machine (experiments/results/gpu/h200-a/detect.txt); the NVL prints
    # "NVIDIA H200 NVL", and both have 141 GB, so the printed name alone tells them apart
    ("NVIDIA H200", 140.4, "H200"),
    ("NVIDIA H200 NVL", 140.4, "H200-NVL"),
    ("NVIDIA H800", 79.6, "H800-SXM"),         # the PCIe card prints "NVIDIA H800 PCIe"
    ("NVIDIA H800 PCIe", 79.6, "H800-PCIE"),
])
def test_a_driver_name_of_one_part_needs_no_notice_when_memory_cannot_tell(name, memory_gib, row, caplog):
    with caplog.at_level("WARNING", logger="geodiloco.predictor"):
        assert table_registry().resolve_detected(name, memory_gib).name == row
    assert not [record for record in caplog.records if "could be several parts" in record.getMessage()]


def test_a_name_without_the_vendor_stays_a_choice_even_when_detected(caplog):
    """"H200" is how people write either part; only the driver's full name picks one."""
    with caplog.at_level("WARNING", logger="geodiloco.predictor"):
        assert table_registry().resolve_detected("H200", 140.4).name == "H200"
    notices = [record.getMessage() for record in caplog.records if "could be several parts" in record.getMessage()]
    assert len(notices) == 1 and "H200-NVL" in notices[0]


def test_a_shared_driver_name_without_memory_takes_the_default_and_says_so_once(caplog):
    registry = table_registry()
    with caplog.at_level("WARNING", logger="geodiloco.predictor"):
        assert registry.resolve_detected("NVIDIA GeForce RTX 4060 Ti").name == "RTX 4060 Ti 8GB"
        assert registry.resolve_detected("NVIDIA GeForce RTX 4060 Ti").name == "RTX 4060 Ti 8GB"
    notices = [record.getMessage() for record in caplog.records if "could be several parts" in record.getMessage()]
    assert len(notices) == 1 and "RTX 4060 Ti 16GB" in notices[0] and '"RTX 4060 Ti 8GB"' in notices[0]


def test_a_pci_name_whose_parts_all_have_rows_is_settled_by_memory_without_a_notice(caplog):
    with caplog.at_level("WARNING", logger="geodiloco.predictor"):
        assert table_registry().resolve_detected("Navi 31 [Radeon RX 7900 XT/7900 XTX]", 23.98).name == "RX 7900 XTX"
        assert table_registry().resolve_detected("Navi 31 [Radeon RX 7900 XT/7900 XTX]", 19.98).name == "RX 7900 XT"
    assert not [record for record in caplog.records if "could be several parts" in record.getMessage()]


def test_a_pci_name_that_lists_a_part_without_a_row_keeps_its_notice_though_memory_picks_a_row(caplog):
    """Navi 31's PCI name also lists the RX 7900M, which has no row and may be the 16 GB device: the GRE that the
    memory fits is planned, and said to be a choice."""
    with caplog.at_level("WARNING", logger="geodiloco.predictor"):
        assert table_registry().resolve_detected("Navi 31 [Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M]",
                                                 15.98).name == "RX 7900 GRE"
    [notice] = [record.getMessage() for record in caplog.records if "could be several parts" in record.getMessage()]
    assert "planned as RX 7900 GRE, the listed part with a row that the device's memory fits" in notice
    assert "Radeon RX 7900M (no row)" in notice and '"RX 7900 GRE"' in notice


@pytest.mark.parametrize("name, memory_gib, row", [
    # rocm-smi's PCI ID database names (1002:747e and 1002:7590, as lspci prints them in public logs)
    ("Navi 32 [Radeon RX 7700 XT / 7800 XT]", 15.98, "RX 7800 XT"),
    ("Navi 32 [Radeon RX 7700 XT / 7800 XT]", 11.98, "RX 7700 XT"),
    ("Navi 44 [Radeon RX 9060 XT]", 15.92, "RX 9060 XT"),
    ("Navi 44 [Radeon RX 9060 XT]", 7.98, "RX 9060 XT 8GB"),
    ("AMD Radeon RX 9060 XT", 7.98, "RX 9060 XT 8GB"),   # the marketing name ROCm prints for both sizes
])
def test_navi_32_and_navi_44_parts_are_settled_by_memory_without_a_notice(name, memory_gib, row, caplog):
    with caplog.at_level("WARNING", logger="geodiloco.predictor"):
        assert table_registry().resolve_detected(name, memory_gib).name == row
    assert not [record for record in caplog.records if "could be several parts" in record.getMessage()]
