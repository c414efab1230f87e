"""AMD compute partitions: an MI300X in DPX/QPX/CPX mode lists 2/4/8 devices named like the whole GPU.

Expected values come from AMD's MI300X datasheet (304 CUs, 192 GB at 5.3 TB/s, 1307.4 dense BF16
TFLOPS) and the partition modes' fractions (CPX: 8 devices of 38 CUs).
"""
import re

import pytest

from geodiloco.predictor import detect
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.specs import detected_gpu, resolve_gpu
from gpu_fakes import install_fake_torch_cuda


@pytest.mark.parametrize("compute_units, name, share", [(38, "MI300X CPX", 1 / 8), (76, "MI300X QPX", 1 / 4),
                                                         (152, "MI300X DPX", 1 / 2), (304, "MI300X", 1.0)])
def test_a_detected_partition_is_planned_at_its_share_of_the_gpu(compute_units, name, share):
    row = detected_gpu("AMD Instinct MI300X", 191.5 * share, compute_units)
    assert (row.name, row.sm_count) == (name, compute_units)
    assert row.bf16_tflops == pytest.approx(1307.4 * share)
    assert row.memory_bandwidth_gbps == pytest.approx(5300 * share)
    assert row.memory_gb == pytest.approx(192 * share)


@pytest.mark.parametrize("name, compute_units, row_name", [
    ("AMD Instinct MI300X", 300, "MI300X"),            # not a partition count: the whole row stays
    ("AMD Instinct MI250X / MI250", 104, "MI250 GCD"),  # a die of another row, not a partition
    ("NVIDIA A100-SXM4-40GB", 54, "A100-SXM4-40GB"),    # NVIDIA parts split by MIG, named as such
])
def test_devices_that_are_not_partitions_keep_their_row(name, compute_units, row_name):
    assert detected_gpu(name, None, compute_units).name == row_name


@pytest.mark.parametrize("name, row_name, compute_units", [
    ("MI300X CPX", "MI300X CPX", 38), ("AMD Instinct MI325X QPX", "MI325X QPX", 76), ("MI300X SPX", "MI300X", 304)])
def test_a_partition_mode_written_in_a_config_resolves(name, row_name, compute_units):
    row, _ = resolve_gpu(name)
    assert (row.name, row.sm_count) == (row_name, compute_units)


@pytest.mark.parametrize("name, compute_units, row_name, share", [
    ("MI300A TPX", 76, "MI300A TPX", 1 / 3), ("AMD Instinct MI300A CPX", 38, "MI300A CPX", 1 / 6)])
def test_the_mi300a_splits_by_its_six_dies(name, compute_units, row_name, share):
    # MI300A: 228 CUs on 6 XCDs, 128 GB HBM3 at 5.3 TB/s, 980.6 dense BF16 TFLOPS; TPX = 3 devices, CPX = 6
    row, _ = resolve_gpu(name)
    assert (row.name, row.sm_count) == (row_name, compute_units)
    assert row.bf16_tflops == pytest.approx(980.6 * share)
    assert row.memory_gb == pytest.approx(128 * share)
    detected = detected_gpu("AMD Instinct MI300A", 128 * share, compute_units)
    assert (detected.name, detected.sm_count) == (row_name, compute_units)


@pytest.mark.parametrize("name, says", [("MI300A QPX", "MI300A has no QPX mode; its compute-partition modes: SPX "
                                                       "(1 device), TPX (3 devices), CPX (6 devices)"),
                                        ("MI300X TPX", "MI300X has no TPX mode")])
def test_a_mode_the_part_lacks_lists_its_modes(name, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        resolve_gpu(name)


@pytest.mark.parametrize("name", ["MI250X CPX", "A100-SXM4-40GB CPX"])
def test_a_partition_mode_on_a_part_without_one_says_so(name):
    with pytest.raises(ConfigError, match="has no compute partitions"):
        resolve_gpu(name)


def test_torch_detection_of_a_cpx_machine_lists_eighths_of_an_mi300x(monkeypatch):
    install_fake_torch_cuda(monkeypatch, "AMD Instinct MI300X", int(23.9 * 2**30), 38, count=8)
    gpus, reason = detect.torch_cuda_gpus()
    assert reason == "" and [gpu["datasheet"] for gpu in gpus] == ["MI300X CPX"] * 8


def rocm_smi(outputs: dict):
    """A fake ``rocm-smi``: the JSON it prints for each option set (an option it lacks exits 1)."""
    import subprocess

    def run(args, **kwargs):
        for option, stdout in outputs.items():
            if option in args:
                return subprocess.CompletedProcess(args, 0, stdout=stdout, stderr="")
        return subprocess.CompletedProcess(args, 1, stdout="", stderr="unrecognized arguments")
    return run


CPX_CARDS = {f"card{index}": {"Card Series": "AMD Instinct MI300X", "VRAM Total Memory (B)": str(24 * 10**9)}
             for index in range(8)}


def test_rocm_smi_on_a_cpx_machine_lists_partitions_by_their_mode():
    import json
    modes = {key: {"Compute Partition": "CPX"} for key in CPX_CARDS}
    gpus, reason = detect.rocm_smi_gpus(run=rocm_smi({"--showproductname": json.dumps(CPX_CARDS),
                                                      "--showcomputepartition": json.dumps(modes)}))
    assert reason == "" and [gpu["datasheet"] for gpu in gpus] == ["MI300X CPX"] * 8
    assert {gpu["compute_partition"] for gpu in gpus} == {"CPX"}


def test_rocm_smi_on_an_mi300a_in_tpx_mode_lists_thirds():
    import json
    cards = {f"card{index}": {"Card Series": "AMD Instinct MI300A"} for index in range(3)}
    modes = {key: {"Compute Partition": "TPX"} for key in cards}
    gpus, reason = detect.rocm_smi_gpus(run=rocm_smi({"--showproductname": json.dumps(cards),
                                                      "--showcomputepartition": json.dumps(modes)}))
    assert reason == "" and [gpu["datasheet"] for gpu in gpus] == ["MI300A TPX"] * 3
    row, _ = resolve_gpu(gpus[0]["datasheet"])
    assert (row.sm_count, row.memory_gb) == (76, pytest.approx(128 / 3))  # MI300A: 228 CUs, 128 GB, in thirds


def test_a_rocm_smi_without_the_partition_option_still_lists_the_cards():
    import json
    gpus, reason = detect.rocm_smi_gpus(run=rocm_smi({"--showproductname": json.dumps({"card0": CPX_CARDS["card0"]})}))
    assert reason == "" and [(gpu["datasheet"], gpu["compute_partition"]) for gpu in gpus] == [("MI300X", "SPX")]
