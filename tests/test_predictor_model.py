"""Node step-time model: pacing, splits, memory limits, all-reduce, CPU nodes."""
import dataclasses
import json

import pytest

from geodiloco.predictor.specs import lookup_gpu

from geodiloco.predictor import detect, kernels
from geodiloco.predictor.base import StepTimeModel
from geodiloco.predictor.model import GPU_RESERVED_GB, ALLOCATOR_HEADROOM, node_step_model
from geodiloco.common.schema import ConfigError
from geodiloco.predictor.workload import PRESETS, gradient_bytes, training_memory_bytes

LLAMA = PRESETS["llama-150m"]


def test_satisfies_protocol_and_grows_with_batch():
    model = node_step_model(["A30"], LLAMA, 1024, "bf16")
    assert isinstance(model, StepTimeModel)
    times = [model.predict(batch) for batch in (1, 2, 4, 8)]
    assert times == sorted(times) and times[-1] > 1.5 * times[1]


def test_explain_reports_the_estimate_and_its_parts():
    from geodiloco.predictor.workload import training_flops
    info = node_step_model(["A30"], LLAMA, 1024, "bf16").explain(4)
    assert info["step_time_s"] == pytest.approx(node_step_model(["A30"], LLAMA, 1024, "bf16").predict(4))
    # the A30 datasheet: 165 dense BF16 TFLOPS, 933 GB/s
    assert info["pacing_gpu"] == "A30" and info["rate_tflops"] == 165 and info["memory_bandwidth_gbps"] == 933
    flops = training_flops(LLAMA, 4, 1024)  # 6 x parameters x tokens plus attention
    assert flops / 165e12 < info["compute_s"] < flops / (0.5 * 165e12), "GEMMs at most at peak, at least at half"
    assert info["step_time_s"] >= max(info["compute_s"], info["memory_s"])
    slowest = max(("compute", info["compute_s"]), ("memory", info["memory_s"]), key=lambda item: item[1])[0]
    assert info["bound"] == slowest


def test_a_gpu_step_whose_host_work_outlasts_its_kernels_is_host_bound():
    from geodiloco.predictor.workload import preset_dims
    tiny = preset_dims("tiny")
    model = node_step_model(["H100 SXM5 80GB"], tiny, 128, "bf16")
    info = model.explain(1)
    step = model.device_step(0, 1)
    kernels_s = step.matmul_compute_s + step.matmul_memory_s + step.attention_s + step.elementwise_s + step.optimizer_s
    # a tiny model on an H100: the kernels take far less than the Python and launch work that issues them
    assert step.host_s > 0 and step.step_s == pytest.approx(kernels_s + step.host_s)
    assert info["bound"] == "host"
    assert node_step_model(["A30"], LLAMA, 1024, "bf16").explain(16)["bound"] != "host"


@pytest.mark.parametrize("share, architectures, geforce_tflops", [
    (0.5, ("turing",), 56.9),    # the datasheet: FP32 accumulate at half the 113.8 headline
    (1.0, (), 56.9),             # a fitted share applies only to the architectures it was fitted on
    (1.0, ("turing",), 113.8),   # mixed precision at the FP16-accumulate headline
])
def test_compute_bound_ratio_follows_the_rate_mixed_precision_gets(share, architectures, geforce_tflops):
    # Large batch, fp16 mixed: TITAN RTX (full-rate 130.5 TFLOPS FP32-acc) vs RTX 2080 Ti.
    eff = dataclasses.replace(kernels.GPU_EFFICIENCY, half_rate_fp16_share=share,
                              half_rate_fp16_architectures=architectures)
    with kernels.gpu_efficiency(eff):
        titan = node_step_model(["TITAN RTX"], LLAMA, 1024, "fp16").explain(8)
        geforce = node_step_model(["RTX 2080 Ti"], LLAMA, 1024, "fp16").explain(8)
    assert geforce["compute_s"] / titan["compute_s"] == pytest.approx(130.5 / geforce_tflops, rel=0.15)


def test_mixed_node_is_paced_by_its_slowest_gpu_under_equal_split():
    mixed = node_step_model(["RTX 2080 Ti"] * 3 + ["TITAN RTX"], LLAMA, 1024, "fp16")
    uniform = node_step_model(["RTX 2080 Ti"] * 4, LLAMA, 1024, "fp16")
    info = mixed.explain(8)
    assert info["pacing_gpu"] == "RTX 2080 Ti" and info["samples_per_gpu"] == [2, 2, 2, 2]
    assert mixed.predict(8) == pytest.approx(uniform.predict(8))


def test_split_by_speed_gives_the_fast_gpu_more_and_is_not_slower():
    gpus = ["RTX 2080 Ti", "A100-SXM4-40GB"]
    equal = node_step_model(gpus, LLAMA, 512, "bf16")
    by_speed = node_step_model(gpus, LLAMA, 512, "bf16", split="by_speed")
    shares = by_speed.split_batch(16)
    assert sum(shares) == 16 and shares[1] > shares[0]
    assert by_speed.predict(16) < equal.predict(16)


def test_every_gpu_trains_at_least_one_sample_as_the_runtimes_ranks_do():
    eight = node_step_model(["A30"] * 8, LLAMA, 1024, "bf16")
    assert eight.split_batch(4) == [1] * 8
    assert eight.predict(4) == eight.predict(8)
    info = eight.explain(4)
    assert info["trained_batch_size"] == 8
    assert info["tokens_per_s"] == pytest.approx(8 * 1024 / info["step_time_s"])
    assert any("batch 4 < 8 GPUs: every GPU trains at least one sample, so the node trains 8" in note
               for note in info["notes"])
    assert eight.explain(8)["trained_batch_size"] == 8
    # by speed: a GPU far slower than its peer still gets its one sample
    by_speed = node_step_model(["T4", "H100-SXM5-80GB"], LLAMA, 512, "bf16", split="by_speed")
    shares = by_speed.split_batch(3)
    assert shares[0] >= 1 and sum(shares) == 3


def test_max_batch_size_fits_and_one_more_does_not():
    model = node_step_model(["RTX 2080 Ti"], LLAMA, 1024, "bf16")
    usable = (11 - GPU_RESERVED_GB) * 2**30 * ALLOCATOR_HEADROOM
    largest = model.max_batch_size()
    assert largest >= 1
    assert training_memory_bytes(LLAMA, largest, 1024, "bf16").total <= usable
    assert training_memory_bytes(LLAMA, largest + 1, 1024, "bf16").total > usable
    assert node_step_model(["A30"] * 4, LLAMA, 1024, "bf16").max_batch_size() > 4 * largest


def test_batch_above_memory_runs_as_gradient_accumulation():
    model = node_step_model(["RTX 2080 Ti"], LLAMA, 1024, "bf16")
    largest = model.max_batch_size()
    info = model.explain(2 * largest + 1)
    assert info["grad_accum_steps"] == 3 and info["micro_batch_size"] == largest
    assert model.predict(2 * largest + 1) > 2 * model.predict(largest)


def test_explicit_micro_batch_size_is_used():
    info = node_step_model(["A30"], LLAMA, 1024, "bf16", micro_batch_size=2).explain(8)
    assert (info["micro_batch_size"], info["grad_accum_steps"]) == (2, 4)


def test_allreduce_is_a_ring_over_the_slowest_link():
    model = node_step_model(["RTX 3090", "V100-SXM2-32GB"], LLAMA, 1024, "fp16")
    # Mixed node: PCIe gen 3 (the V100's) at 15.75 GB/s one way, 70 % efficiency, ring of 2: 1 x gradient bytes.
    assert model.allreduce_s() == pytest.approx(gradient_bytes(LLAMA) / (15.75e9 * 0.7))
    nvlink = node_step_model(["A100-SXM4-40GB"] * 4, LLAMA, 1024, "bf16")
    assert nvlink.allreduce_s() == pytest.approx(1.5 * gradient_bytes(LLAMA) / (300e9 * 0.7))
    assert node_step_model(["A30"], LLAMA, 1024, "bf16").allreduce_s() == 0.0


def test_model_too_large_for_the_gpu_is_a_config_error(tmp_path):
    huge = PRESETS["llama-150m"].__class__(hidden_size=8192, intermediate_size=28672, num_layers=80,
                                           num_heads=64, vocab_size=32000, max_seq_len=4096)
    model = node_step_model(["T4"], huge, 1024, "bf16")
    assert model.max_batch_size() == 0
    with pytest.raises(ConfigError, match="does not fit"):
        model.predict(1)


def test_empty_gpu_list_means_this_cpu(tmp_path, monkeypatch):
    monkeypatch.setenv("GEODILOCO_CACHE_DIR", str(tmp_path))
    key = detect._cache_key(detect.compute_threads())
    (tmp_path / detect.CACHE_FILE_NAME).write_text(json.dumps({key: {
        "matmul_tflops": 0.1, "memory_bandwidth_gbps": 10.0, "host_op_us": 5.0, "library": "test",
        "matmul_size": 1024, "measured_at": "now", "threads": detect.compute_threads()}}))
    model = node_step_model([], PRESETS["tiny"], 64, "fp32")
    assert model.devices[0].is_cpu and model.devices[0].fp32_tflops == 0.1
    info = model.explain(4)
    # The compute-bound matmuls run at 0.1 TFLOPS: their time is at least their FLOPs / rate.
    assert info["compute_s"] > 0 and info["host_overhead_s"] > 0
    assert info["step_time_s"] == pytest.approx(info["compute_s"] + info["memory_s"] + info["host_overhead_s"])


def test_bad_inputs_are_config_errors():
    with pytest.raises(ConfigError, match="precision"):
        node_step_model(["A30"], LLAMA, 1024, "int8")
    with pytest.raises(ConfigError, match="batch_size"):
        node_step_model(["A30"], LLAMA, 1024).predict(0)
    stood_in = node_step_model(["A31"], LLAMA, 1024).devices[0]  # unknown: planned like an L4, not refused
    assert stood_in.name == "A31" and stood_in.bf16_tflops == lookup_gpu("L4").bf16_tflops
    assert stood_in.source.startswith("stand-in: planned like L4")


def test_forward_backward_only_leaves_out_the_optimizer_step():
    full = node_step_model(["A30"], LLAMA, 1024, "bf16").explain(4)
    bare = node_step_model(["A30"], LLAMA, 1024, "bf16", optimizer_step=False).explain(4)
    assert full["optimizer_s"] > 0 and bare["optimizer_s"] == 0
    assert bare["step_time_s"] < full["step_time_s"]


def test_training_code_changes_attention_head_and_elementwise_costs():
    from geodiloco.predictor.workload import TrainingCode
    flash = node_step_model(["A100-SXM4-40GB"], LLAMA, 1024, "fp16").explain(8)
    eager = node_step_model(["A100-SXM4-40GB"], LLAMA, 1024, "fp16",
                            code=TrainingCode(attention="eager")).explain(8)
    assert eager["attention_s"] > flash["attention_s"]  # full square of scores, through memory
    relative = node_step_model(["A100-SXM4-40GB"], LLAMA, 1024, "fp16",
                               code=TrainingCode(attention="eager", memory_len=1024, relative_positions=True))
    assert relative.explain(8)["attention_s"] > 2 * eager["attention_s"]
    no_head = node_step_model(["A100-SXM4-40GB"], LLAMA, 1024, "fp16", code=TrainingCode(lm_head_fraction=0.0))
    assert no_head.explain(8)["matmul_s"] < flash["matmul_s"]
    gpt = node_step_model(["A100-SXM4-40GB"], LLAMA, 1024, "fp16", code=TrainingCode(block="gpt")).explain(8)
    assert gpt["elementwise_s"] < flash["elementwise_s"]  # no fp32 norms, rotary or autocast casts
    with pytest.raises(ConfigError):
        TrainingCode(attention="sparse")
    with pytest.raises(ConfigError):
        TrainingCode(lm_head_fraction=1.5)
