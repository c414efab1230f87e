"""experiments/gpu/kernel_classes.py: kernel names as CUDA profiles print them sorted into the predictor's
classes, the per-class sums, the predicted split it compares with, and the script without CUDA."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "experiments" / "gpu"
sys.path.insert(0, str(KIT))

import kernel_classes  # noqa: E402
from geodiloco.predictor.specs import lookup_gpu  # noqa: E402
from geodiloco.predictor.workload import resolve_dims  # noqa: E402

# Kernel names as torch.profiler records them on Ampere and Hopper GPUs (cuBLAS, cuBLASLt, CUTLASS, PyTorch).
KERNEL_NAMES = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_"
     "kernel__5x_cublas", "matmul"),
    ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>(cutlass_80_tensorop_s1688gemm_"
     "64x64_16x6_tn_align4::Params)", "matmul"),
    ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams<float>"
     ", float const*, float const*, float*, float const*, float const*, float const*, float const*, float*, void*, "
     "long, float*, int*)", "matmul"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, "
     "Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, false, "
     "false>(FLASH_NAMESPACE::Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, "
     "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0", "attention"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous "
     "namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)", "vocab_loss"),
    ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, "
     "float*, float const*, long const*, float const*, bool, long, long, long, long)", "vocab_loss"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<4>, at::native::(anonymous namespace)::PointwiseOpScalarFunctor<float, 4, 3, 0>, "
     "std::multiplies<float>, float>(...)", "optimizer"),
    ("void at::native::lpnorm_cleanup<float, (at::native::NormType)1, float, float>(float const*, "
     "at::native::TensorListAddresses, int)", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
     "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
     "float>, unsigned int, float, 4, 4> >(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
     "float>, unsigned int, float, 4, 4>)", "elementwise"),
    # a softmax over short rows (eager attention scores) is an elementwise kernel, not the vocabulary's
    ("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false, false>"
     "(c10::BFloat16*, c10::BFloat16 const*, int, int, int, bool const*, int, bool)", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "elementwise"),
]


@pytest.mark.parametrize("name,expected", KERNEL_NAMES, ids=[expected + ":" + name[:40] for name, expected in
                                                               KERNEL_NAMES])
def test_each_kernel_name_lands_in_its_class(name, expected):
    assert kernel_classes.classify_kernel(name) == expected


def test_class_sums_count_the_loss_in_elementwise_and_apart():
    kernels = [("ampere_sgemm_128x64_tn", 1500.0), ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 500.0),
               ("void pytorch_flash::flash_fwd_kernel<...>", 300.0),
               ("void at::native::vectorized_elementwise_kernel<4, ...>", 250.0),
               ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, ...>", 120.0),
               ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>", 80.0)]
    times = kernel_classes.class_times_ms(kernels)
    assert times == pytest.approx({"matmul": 2.0, "attention": 0.3, "elementwise": 0.37, "optimizer": 0.08,
                                   "vocab_loss": 0.12})
    assert sum(times[name] for name in kernel_classes.CLASSES) == pytest.approx(2.75)  # every kernel once


def test_the_predicted_split_adds_up_to_the_kernel_time_of_a_gpu_bound_step():
    dims = resolve_dims("llama-150m")
    spec = lookup_gpu("H100-SXM")
    split = kernel_classes.predicted_classes_ms(spec, dims, 1024, "bf16", 32)
    assert set(split) == set(kernel_classes.CLASSES)
    assert all(value > 0 for value in split.values())
    from geodiloco.predictor.model import NodeStepModel
    step_ms = NodeStepModel([spec], dims, 1024, precision="bf16").predict(32) * 1e3
    # at batch 32 the GPU's kernels, not the host, set the step: the four classes are the whole step
    assert sum(split.values()) == pytest.approx(step_ms, rel=1e-6)


def test_the_markdown_table_has_a_row_per_class_and_the_ratio():
    row = {"preset": "llama-150m", "precision": "bf16", "batch_size": 32,
           "measured_ms": {"matmul": 50.0, "attention": 5.0, "elementwise": 100.0, "optimizer": 10.0,
                           "vocab_loss": 40.0},
           "predicted_ms": {"matmul": 55.0, "attention": 6.5, "elementwise": 212.0, "optimizer": 10.7}}
    table = kernel_classes.markdown([row], "NVIDIA H100 80GB HBM3", "2.11.0")
    assert "| llama-150m | bf16 | 32 | elementwise | 100.00 | 212.00 | 2.12 |" in table
    assert "| llama-150m | bf16 | 32 | matmul | 50.00 | 55.00 | 1.10 |" in table
    assert "(loss kernels, measured) | 40.00 |" in table


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the script would really run")
def test_without_cuda_the_script_prints_one_line_writes_nothing_and_exits_0(tmp_path):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(KIT / "kernel_classes.py"), "--presets", "small",
                             "--batch-sizes", "16", "--out", str(out)], capture_output=True, text=True, timeout=120,
                            cwd=ROOT, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"no CUDA device (torch {torch.__version__}): nothing was run; with one this would profile small at batch "
        "16 in bf16,fp32, kernel class by class."]
    assert not out.exists()


def test_help_names_every_option():
    result = subprocess.run([sys.executable, str(KIT / "kernel_classes.py"), "--help"], capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0
    for option in ("--presets", "--batch-sizes", "--precisions", "--out"):
        assert option in result.stdout


def test_preset_runners_build_one_runner_per_preset_and_precision_and_close_each():
    import gpu_sweep

    seen = []
    for preset, dims, precision, runner in gpu_sweep.preset_runners(["tiny"], ["fp32", "bf16"], torch.device("cpu")):
        assert dims.max_seq_len == resolve_dims("tiny").max_seq_len and runner.seq_len == dims.max_seq_len
        runner.step(2)  # a real training step on the CPU
        seen.append((preset, precision, runner))
    assert [(preset, precision) for preset, precision, _ in seen] == [("tiny", "fp32"), ("tiny", "bf16")]
    assert all(runner.model is None and runner.optimizer is None for _, _, runner in seen)


@pytest.mark.filterwarnings("ignore:CUDA is not available, disabling CUDA profiling")
def test_a_profiled_cpu_step_has_no_cuda_kernels_but_counts_its_aten_ops():
    import gpu_sweep

    runner = gpu_sweep.StepRunner(resolve_dims("tiny"), 64, "fp32", torch.device("cpu"))
    kernels, aten_ops = gpu_sweep.profiled_step(runner, 2)
    assert kernels == []
    assert aten_ops > 100  # forward, backward, clipping and AdamW of a 2-layer model dispatch hundreds of ops


def test_the_gemm_flops_of_a_step_count_every_linear_layer_forward_and_backward():
    from geodiloco.predictor.workload import resolve_dims
    # llama-150m by hand: 12 x (q,k,v 1024x3072 + out 1024x1024 + gate, up 2 x 1024x4096 + down 4096x1024)
    # + the vocabulary projection 1024 x 32,000 = 234,094,592 weights; 6 FLOPs per weight and token
    assert kernel_classes.gemm_flops(resolve_dims("llama-150m"), 1024, 32) == 6 * 32 * 1024 * 234_094_592


def test_render_adds_the_rate_the_gemm_kernels_reached(tmp_path):
    # 46.02 TFLOP of GEMMs (6 x 32,768 tokens x 234,094,592 weights) in 62.0 ms on an H200 (bf16 989.5 TFLOPS) is 742 TFLOPS, 0.75 of the datasheet
    row = {"preset": "llama-150m", "precision": "bf16", "batch_size": 32, "seq_len": 1024,
           "measured_ms": {"matmul": 62.0, "attention": 5.0, "elementwise": 100.0, "optimizer": 10.0,
                           "vocab_loss": 4.0},
           "predicted_ms": {"matmul": 55.0, "attention": 6.5, "elementwise": 150.0, "optimizer": 8.0}}
    (tmp_path / "kernel_classes.json").write_text(json.dumps(
        {"gpu": "NVIDIA H200", "row": "H200", "torch": "2.x", "rows": [row]}), encoding="utf-8")
    assert kernel_classes.main(["--render", str(tmp_path)]) == 0
    text = (tmp_path / "kernel_classes.md").read_text(encoding="utf-8")
    assert "| llama-150m | bf16 | 32 | 46.02 | 62.00 | 742 | 0.75 |" in text
    assert "| llama-150m | bf16 | 32 | matmul | 62.00 | 55.00 | 0.89 |" in text
