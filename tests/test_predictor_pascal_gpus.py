"""Pascal GPUs (GeForce GTX 10 series, TITAN X/Xp, Tesla P100/P40/P4, Quadro P6000) in the GPU table.

The expected figures are typed from NVIDIA's spec pages and datasheets (CUDA cores, boost clock, memory and its
speed and bus), not read back from predictor/data/gpus.yaml. Pascal has no tensor cores: mixed precision GEMMs
(FP16 inputs, FP32 accumulate) run at the FP32 rate, and GP102/GP104 compute FP16 at 1/64 of FP32, so their
rows carry no FP16 rate at all.
"""
import sys
from pathlib import Path

import pytest
import yaml

from geodiloco.balancer.cluster import NodeSpec
from geodiloco.balancer.config import BalancingConfig
from geodiloco.balancer.planner import Planner
from geodiloco.predictor.kernels import matmul_rate_tflops, micro_batch_time
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.specs import registry
from geodiloco.predictor.workload import preset_dims

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "predictor"))

import bench_published  # noqa: E402
import fit_efficiency  # noqa: E402

# row: (CUDA cores, SMs, memory GB, bus bits, Gbps per pin, boost MHz)
GP10X_DATASHEET = {
    "GTX 1080 Ti": (3584, 28, 11, 352, 11, 1582),
    "GTX 1080": (2560, 20, 8, 256, 10, 1733),
    "GTX 1070 Ti": (2432, 19, 8, 256, 8, 1683),
    "GTX 1070": (1920, 15, 8, 256, 8, 1683),
    "GTX 1060 6GB": (1280, 10, 6, 192, 8, 1708),
    "TITAN Xp": (3840, 30, 12, 384, 11.4, 1582),
    "TITAN X (Pascal)": (3584, 28, 12, 384, 10, 1531),
    "Quadro P6000": (3840, 30, 24, 384, 9, 1560),
    "Tesla P40": (3840, 30, 24, 384, 7.2, 1531),
    "Tesla P4": (2560, 20, 8, 256, 6, 1063),
}
# P100 datasheets: (FP32 TFLOPS, FP16 TFLOPS, memory GB, GB/s, NVLink GB/s both directions)
P100_DATASHEET = {
    "P100-SXM2-16GB": (10.6, 21.2, 16, 732, 160),
    "P100-PCIE-16GB": (9.3, 18.7, 16, 732, None),
    "P100-PCIE-12GB": (9.3, 18.7, 12, 549, None),
}


@pytest.mark.parametrize("row", sorted(GP10X_DATASHEET))
def test_gp102_gp104_rows_carry_the_published_figures_and_no_fp16_rate(row):
    cores, sms, memory_gb, bus_bits, gbps, boost = GP10X_DATASHEET[row]
    spec = registry().by_name[row]
    assert (spec.architecture, spec.sm_count, spec.memory_gb, spec.boost_clock_mhz) == ("pascal", sms, memory_gb, boost)
    # the Tesla datasheets round their bandwidth (346 and 192 GB/s)
    assert spec.memory_bandwidth_gbps == pytest.approx(bus_bits / 8 * gbps, abs=0.5)
    assert spec.fp32_tflops == pytest.approx(cores * 2 * boost / 1e6, abs=0.01)
    assert (spec.fp16_tflops, spec.fp16_fp32acc_tflops, spec.bf16_tflops, spec.tf32_tflops) == (None,) * 4
    assert spec.consumer == (not row.startswith(("Tesla", "Quadro")))


@pytest.mark.parametrize("row", sorted(P100_DATASHEET))
def test_p100_rows_carry_the_datasheet_rates(row):
    fp32, fp16, memory_gb, bandwidth, nvlink = P100_DATASHEET[row]
    spec = registry().by_name[row]
    assert (spec.fp32_tflops, spec.fp16_tflops, spec.memory_gb, spec.memory_bandwidth_gbps) == (
        fp32, fp16, memory_gb, bandwidth)
    assert spec.fp16_fp32acc_tflops is None and spec.bf16_tflops is None
    assert spec.peer_link_gbps == nvlink and spec.sm_count == 56


@pytest.mark.parametrize("row, precision", [("GTX 1080 Ti", "fp16"), ("GTX 1080 Ti", "bf16"),
                                            ("P100-SXM2-16GB", "fp16"), ("Tesla P40", "bf16")])
def test_mixed_precision_gemms_on_pascal_run_at_the_fp32_rate_and_say_so(row, precision):
    spec = registry().by_name[row]
    rate, column, note = spec.matmul_rate(precision)
    assert (rate, column) == (spec.fp32_tflops, "fp32_tflops")
    assert "no FP16 tensor rate; FP32 used" in note
    assert matmul_rate_tflops(spec, precision) == spec.fp32_tflops


def test_a_1080_ti_step_at_fp16_saves_memory_traffic_not_matmul_time():
    dims, gtx = preset_dims("llama-150m"), registry().by_name["GTX 1080 Ti"]
    full = micro_batch_time(gtx, dims, 512, "fp32", 8)
    mixed = micro_batch_time(gtx, dims, 512, "fp16", 8)
    assert mixed.matmul_compute_s == pytest.approx(full.matmul_compute_s)
    assert mixed.elementwise_s < 0.9 * full.elementwise_s  # half-width activations, less autocast's casts
    # a 2080 Ti has tensor cores: its fp16 GEMMs take a fraction of the time
    turing = micro_batch_time(registry().by_name["RTX 2080 Ti"], dims, 512, "fp16", 8)
    assert turing.matmul_compute_s < 0.4 * mixed.matmul_compute_s


def test_a_flops_policy_on_a_gpu_without_that_rate_names_the_field_and_the_fix():
    planner = Planner(BalancingConfig(policy="steps_by_flops"), [NodeSpec(name="lab", gpus=["GTX 1080 Ti"]),
                                                                 NodeSpec(name="cloud", gpus=["RTX 3090"])],
                      preset_dims("tiny"), 128, 100, 4)
    with pytest.raises(ConfigError, match=r"GPU 'GTX 1080 Ti' \(GTX 1080 Ti\) has no fp16_tflops in its datasheet "
                                          r"row .* set balancing.flops_field to one every node's GPU has, such as "
                                          r"fp32_tflops"):
        planner.plan(0)
    by_fp32 = Planner(BalancingConfig(policy="steps_by_flops", flops_field="fp32_tflops"),
                      [NodeSpec(name="lab", gpus=["GTX 1080 Ti"]), NodeSpec(name="cloud", gpus=["RTX 3090"])],
                      preset_dims("tiny"), 128, 100, 4).plan(0)
    steps = {node.name: node.local_steps for node in by_fp32.nodes}
    assert steps["cloud"] > 2.5 * steps["lab"]  # 35.6 against 11.3 TFLOPS


def test_the_published_1080_ti_rows_are_placed_as_lambda_printed_them_and_kept_out_of_the_fit():
    rows = yaml.safe_load(bench_published.OUTSIDE_SCOPE_FILE.read_text())["measurements"]
    workloads = yaml.safe_load(bench_published.DATA_FILE.read_text())["workloads"]
    placed = {result["id"]: result for result in (bench_published.evaluate(row, workloads) for row in rows)}
    assert len(placed) == 6 and {result["gpu"] for result in placed.values()} == {"GTX 1080 Ti"}
    assert all(result["gpu_notice"] is None for result in placed.values())
    # Lambda's CSV: BERT-base SQuAD fp16, 35 sequences/s at batch 20; Transformer-XL base fp32, 2774 tokens/s at
    # batch 4 x 192 tokens; each a mean its compile script truncated, read as the mean of its three run logs
    # (training throughput: 35.2, 35.2, 35; Training throughput: 2772.99, 2774.91, 2774.77 tok/s; the data file
    # keeps three decimals)
    assert placed["lambda-v0-bertbasesquad-gtx-1080ti-fp16-s384-b20"]["measured_s"] == pytest.approx(
        20 / ((35.2 + 35.2 + 35.0) / 3), rel=1e-4)
    assert placed["lambda-v0-transformerxlbase-gtx-1080ti-fp32-s192-b4"]["measured_s"] == pytest.approx(
        4 * 192 / ((2772.99 + 2774.91 + 2774.77) / 3), rel=1e-4)
    fitted = fit_efficiency.dev_rows(yaml.safe_load(bench_published.DATA_FILE.read_text())["measurements"], workloads)
    assert not {row["id"] for row in fitted} & set(placed)


def test_the_example_pascal_lab_plans_every_node_from_its_own_row():
    from geodiloco.balancer.cluster import load_cluster
    from geodiloco.runtime.cli import main

    path = Path(__file__).resolve().parents[1] / "experiments" / "configs" / "clusters" / "pascal_lab.yaml"
    nodes = load_cluster(path).nodes
    planner = Planner(BalancingConfig(policy="time"), nodes, preset_dims("small"), 512, 50, 8, precision="fp16")
    steps = {node.name: node.local_steps for node in planner.plan(0).nodes}
    # a node of two 1080 Tis (DDP over the node's batch) steps faster than a node of one
    assert steps["lab-1"] > steps["lab-2"]
    # GP100 at 1303 MHz computes 9.3 TFLOPS against the 1080 Ti's 11.3, with no tensor cores on either
    assert steps["cloud-p100"] < steps["lab-2"]
    assert main(["plan", "--cluster", str(path), "--policy", "time", "--precision", "fp16"]) == 0
