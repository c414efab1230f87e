"""MIG instances resolve from the names drivers print to a row scaled to the instance.

Expected values come from NVIDIA's documents, not from the code: the datasheets' dense rates and
bandwidths, the MIG user guide's fractions (a 1g instance of an A100 40GB has 1/8 of the memory,
3g has 4/8; an H100 3g has 3/7 of the SMs) and its profile lists, and the SM counts that MIG
instances of an A100 report (14 per slice).
"""
import logging
import sys
import types

import pytest

from geodiloco.predictor import detect, unknown_gpus
from geodiloco.predictor.mig import MigProfile, split_mig_name
from geodiloco.predictor.model import node_step_model
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.specs import detected_gpu, lookup_gpu, resolve_gpu
from geodiloco.predictor.workload import resolve_dims


@pytest.mark.parametrize("name, parent, profile", [
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "NVIDIA A100-SXM4-40GB", MigProfile(1, 5, 1)),
    ("NVIDIA A100-PCIE-40GB MIG 1g.5gb", "NVIDIA A100-PCIE-40GB", MigProfile(1, 5, 1)),
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb+me", "NVIDIA A100-SXM4-40GB", MigProfile(1, 5, 1)),
    ("A100-SXM4-40GB MIG 1c.3g.20gb", "A100-SXM4-40GB", MigProfile(3, 20, 1)),
    ("nvidia.com/mig-3g.40gb", "", MigProfile(3, 40, 3)),
    ("MIG 1g.5gb", "", MigProfile(1, 5, 1)),
    ("H200 3g.71gb", "H200", MigProfile(3, 71, 3)),
])
def test_mig_names_split_into_parent_and_profile(name, parent, profile):
    assert split_mig_name(name) == (parent, profile)


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-40GB", "RTX 3060 8GB", "NVIDIA GeForce RTX 4060 Ti 16GB"])
def test_names_without_a_profile_are_not_mig(name):
    assert split_mig_name(name) is None


# (driver string, parent row, SMs, memory GB, bandwidth GB/s, dense BF16 TFLOPS), from the datasheet and the MIG guide
MIG_ROWS = [
    ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100-SXM4-40GB", 14, 5, 1555 / 8, 312 * 14 / 108),
    ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "A100-SXM4-40GB", 42, 20, 1555 * 4 / 8, 312 * 42 / 108),
    ("NVIDIA A100-SXM4-40GB MIG 7g.40gb", "A100-SXM4-40GB", 98, 40, 1555, 312 * 98 / 108),
    ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "A100-SXM4-80GB", 14, 10, 2039 / 8, 312 * 14 / 108),
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", "H100-SXM", 57, 40, 3350 / 2, 989.5 * 3 / 7),
    ("NVIDIA H100 80GB HBM3 MIG 1g.20gb", "H100-SXM", 19, 20, 3350 * 2 / 8, 989.5 / 7),
    ("NVIDIA A30 MIG 2g.12gb", "A30", 28, 12, 933 / 2, 165 / 2),
    ("NVIDIA B200 MIG 1g.23gb", "B200", 21, 23, 7700 * 23 / 180, 2250 / 7),
]


@pytest.mark.parametrize("name, parent, sm_count, memory_gb, bandwidth_gbps, bf16_tflops", MIG_ROWS)
def test_driver_names_of_mig_instances_give_the_parent_scaled_to_the_instance(
        name, parent, sm_count, memory_gb, bandwidth_gbps, bf16_tflops):
    row, notice = resolve_gpu(name)
    assert notice is None
    assert row.name.startswith(parent + " MIG ")
    assert row.extra["mig_parent"] == parent
    assert (row.sm_count, row.memory_gb) == (sm_count, memory_gb)
    assert row.memory_bandwidth_gbps == pytest.approx(bandwidth_gbps, rel=1e-9)
    assert row.bf16_tflops == pytest.approx(bf16_tflops, rel=1e-9)
    assert row.peer_link is None and row.peer_link_gbps is None
    assert lookup_gpu(row.name) == row


def test_a_detected_instance_uses_the_sm_count_the_driver_reports():
    row = detected_gpu("NVIDIA H100 80GB HBM3 MIG 1g.10gb", memory_gib=9.75, sm_count=16)
    assert row.sm_count == 16
    assert row.bf16_tflops == pytest.approx(989.5 * 16 / 132)
    assert row.memory_bandwidth_gbps == pytest.approx(3350 / 8)


@pytest.mark.parametrize("name, expected_parent", [
    ("A100 MIG 3g.20gb", ("A100-PCIE-40GB", "A100-SXM4-40GB")),
    ("A100 MIG 3g.40gb", ("A100-SXM4-80GB",)),
])
def test_a_parent_name_that_fits_several_parts_is_narrowed_by_the_profile(name, expected_parent):
    row, notice = resolve_gpu(name)
    assert row.extra["mig_parent"] in expected_parent
    if len(expected_parent) > 1:
        assert notice and "fits" in notice and all(parent in notice for parent in expected_parent)


@pytest.mark.parametrize("name, parts", [
    ("A100-SXM4-40GB MIG 3g.40gb", ["no MIG profile 3g.40gb", "1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb"]),
    ("H100-SXM MIG 2g.40gb", ["1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"]),
    ("H200 MIG 2g.10gb", ["1g.18gb, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb"]),
    ("B200 MIG 5g.90gb", ["1g.23gb, 1g.45gb, 2g.45gb, 3g.90gb, 4g.90gb, 7g.180gb"]),
    ("A30 MIG 3g.18gb", ["1g.6gb, 2g.12gb, 4g.24gb"]),
    ("RTX 4090 MIG 1g.6gb", ["RTX 4090 does not support MIG"]),
    ("MIG 1g.5gb", ["names a MIG profile but not its GPU", "A100-SXM4-40GB MIG 1g.5gb"]),
    ("Lab Card MIG 1g.5gb", ["MIG instance of a GPU the table does not know", "unknown GPU 'Lab Card'"]),
])
def test_impossible_mig_names_say_why_and_list_the_parts_profiles(name, parts):
    with pytest.raises(ConfigError) as raised:
        resolve_gpu(name)
    for part in parts:
        assert part in str(raised.value)


def test_a_node_plans_with_an_instance_memory_and_no_peer_link():
    dims = resolve_dims("llama-150m")
    whole = node_step_model(["A100-SXM4-40GB"], dims, seq_len=1024)
    slice_model = node_step_model(["A100-SXM4-40GB MIG 2g.10gb"], dims, seq_len=1024)
    assert 0 < slice_model.max_batch_size() < whole.max_batch_size() / 4
    assert slice_model.predict(2) > 3 * whole.predict(2)
    with pytest.raises(ConfigError, match="does not fit in A100-SXM4-40GB MIG 1g.5gb memory"):
        node_step_model(["A100-SXM4-40GB MIG 1g.5gb"], dims, seq_len=1024).predict(1)
    pair = node_step_model(["A100-SXM4-40GB MIG 3g.20gb"] * 2, dims, seq_len=1024)
    pcie_pair = node_step_model(["A100-PCIE-40GB", "A100-SXM4-40GB"], dims, seq_len=1024)
    assert pair.allreduce_s() == pytest.approx(pcie_pair.allreduce_s())
    assert any("MIG instances have no peer-to-peer path" in note for note in pair.explain(4)["notes"])


def test_an_impossible_mig_name_in_a_plan_falls_back_to_the_stand_in_and_says_why(caplog):
    with caplog.at_level(logging.WARNING, logger="geodiloco.predictor"):
        spec = unknown_gpus.device_spec("RTX 3090 MIG 2g.12gb")
    assert spec.name == "RTX 3090 MIG 2g.12gb" and spec.source.startswith("stand-in")
    assert "(RTX 3090 does not support MIG)" in caplog.text


class FakeNVMLError(Exception):
    pass


def fake_mig_pynvml(instances, parent_name="NVIDIA A100-SXM4-40GB"):
    """NVML on one A100 in MIG mode with ``instances``: (name NVML prints, bytes, SMs) per occupied slot."""
    parent = {"name": parent_name}
    slots = {slot: {"name": name, "bytes": size, "sms": sms} for slot, (name, size, sms) in enumerate(instances)}
    module = types.ModuleType("pynvml")
    module.NVMLError = FakeNVMLError
    module.NVML_CLOCK_SM, module.NVML_CLOCK_MEM, module.NVML_DEVICE_MIG_ENABLE = 1, 2, 1
    module.nvmlInit = module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: 1
    module.nvmlDeviceGetHandleByIndex = lambda index: parent
    module.nvmlDeviceGetName = lambda handle: handle["name"]
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(total=handle.get("bytes", 40 * 2**30))
    module.nvmlDeviceGetMaxClockInfo = lambda handle, clock: 1410
    module.nvmlDeviceGetMigMode = lambda handle: (1, 1)
    module.nvmlDeviceGetMaxMigDeviceCount = lambda handle: 7

    def instance(handle, slot):
        if slot not in slots:
            raise FakeNVMLError("Not Found")
        return slots[slot]

    module.nvmlDeviceGetMigDeviceHandleByIndex = instance
    module.nvmlDeviceGetAttributes = lambda handle: types.SimpleNamespace(multiprocessorCount=handle["sms"])
    return module


def test_nvml_in_mig_mode_lists_the_instances_not_the_whole_gpu(monkeypatch):
    instances = [("MIG 3g.20gb", int(19.5 * 2**30), 42), ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", int(4.75 * 2**30), 14)]
    monkeypatch.setitem(sys.modules, "pynvml", fake_mig_pynvml(instances))
    machine = detect.describe_this_machine(measure=False)
    assert machine["source"] == "nvml"
    assert [(gpu["name"], gpu["datasheet"], gpu["sm_count"], gpu["mig_slot"]) for gpu in machine["gpus"]] == [
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "A100-SXM4-40GB MIG 3g.20gb", 42, 0),
        ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "A100-SXM4-40GB MIG 1g.5gb", 14, 1)]
    assert machine["gpus"][1]["memory_gb"] == 4.75


def test_nvml_on_a_gpu_without_mig_mode_lists_the_gpu(monkeypatch):
    module = fake_mig_pynvml([])
    module.nvmlDeviceGetMigMode = lambda handle: (0, 0)
    monkeypatch.setitem(sys.modules, "pynvml", module)
    [gpu] = detect.describe_this_machine(measure=False)["gpus"]
    assert (gpu["name"], gpu["datasheet"], gpu["sm_count"]) == ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB", 108)


def test_the_example_mig_cluster_plans_the_faster_slice_for_more_steps():
    from pathlib import Path

    from geodiloco.balancer.cluster import load_cluster
    from geodiloco.balancer.config import BalancingConfig
    from geodiloco.balancer.planner import Planner

    cluster = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "clusters" / "mig.yaml"
    planner = Planner(BalancingConfig(policy="time"), load_cluster(cluster).nodes, resolve_dims("llama-150m"),
                      1024, 100, 4)
    steps = {node.name: node.local_steps for node in planner.plan(0).nodes}
    # An H100 3g instance has 3/7 of 989.5 BF16 TFLOPS and half of 3.35 TB/s; an A100 3g instance
    # 42 of 108 SMs (121 TFLOPS) and half of 1.56 TB/s: the H100 slice must be given more steps.
    assert steps["cloud"] > 1.5 * steps["campus-a"]
    assert steps["campus-a"] > steps["campus-b"]


def test_resolve_lists_a_parts_mig_profiles_and_a_wrong_profile_exits_2(capsys):
    from geodiloco.runtime.cli import main

    assert main(["predict", "--resolve", "NVIDIA A30", "--resolve", "RTX 3090"]) == 0
    out = capsys.readouterr().out
    assert "MIG profiles: 1g.6gb, 2g.12gb, 4g.24gb" in out and out.count("MIG profiles") == 1
    assert main(["predict", "--resolve", "A30 MIG 3g.18gb"]) == 2
    assert "A30 has no MIG profile 3g.18gb" in capsys.readouterr().err
