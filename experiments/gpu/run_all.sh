#!/usr/bin/env bash
# Every GPU check in one go, for a GPU machine available for a short while:
#   experiments/gpu/run_all.sh OUT_DIR
# 1. what the predictor detects on this machine (NVML / torch.cuda), a measured probe row, and
#    probe_timing.py: the probe's matmul by size (4096^3-16384^3), timing, operands and interleaving;
# 2. validate.py at bf16: t(B) and largest batch of tiny, small, llama-150m beside the predictor,
#    then a short real DiLoCo run (2 nodes under torchrun, bf16 autocast);
# 3. kernel_classes.py: GPU-bound steps' kernel time by class, beside the predictor's split;
#    loss_rate.py: the softmax cross-entropy's rate by vocabulary size, beside the predictor's loss term;
# 4. validate.py at fp32 (no run): the same t(B) check without tensor-core autocast;
# 5. host_overhead.py: small-batch steps split into host and GPU time (profiler), beside the predictor;
# 6. a DiLoCo run at fp16: the runtime's loss-scaled path on the GPU;
# 7. nccl_one_rank.sh: the outer sync on CUDA tensors (cpu:gloo,cuda:nccl) in a world of one rank;
# 8. hivemind_cuda.sh: two hivemind nodes training on this GPU (skipped when hivemind is not installed);
# 9. the tests that behave differently with CUDA present (precision, GPU kit, NVML sampler, detection).
# Writes OUT_DIR/{detect.txt,probe_row.yaml,probe_timing.{json,md},host_overhead.json,kernel_classes.{json,md},
# loss_rate.{json,md},pytest.log}, OUT_DIR/{bf16,fp32,fp16-run}/<gpu-slug>.{txt,json}, OUT_DIR/nccl/ and
# OUT_DIR/hivemind/.
# Exit code: the number of steps that failed (0: all passed).
set -u
case "${1:-}" in
    -h|--help|"") awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; [[ -n "${1:-}" ]]; exit $? ;;
    -*) echo "run_all.sh: error: unknown option '$1' (see --help)" >&2; exit 2 ;;
esac
out_dir=$1
mkdir -p "$out_dir"
failed=0
export PYTHONUNBUFFERED=1
command -v geodiloco >/dev/null || geodiloco() { python3 -m geodiloco.runtime.cli "$@"; }

echo "== detection and probe"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  geodiloco predict --detect
  geodiloco predict --probe --write-row "$out_dir/probe_row.yaml"
  geodiloco predict --resolve "$(python3 -c 'import torch; print(torch.cuda.get_device_name(0))')"
} 2>&1 | tee "$out_dir/detect.txt" || failed=$((failed + 1))
python3 experiments/gpu/probe_timing.py --out "$out_dir" --data-check --interleave-check \
    && python3 experiments/gpu/probe_timing.py --render "$out_dir" || failed=$((failed + 1))

echo "== bf16 sweep and DiLoCo run"
python3 experiments/gpu/validate.py --batch-sizes 1,2,4,8,16,32,64 --out "$out_dir/bf16" || failed=$((failed + 1))

echo "== kernel time by class (GPU-bound steps)"
python3 experiments/gpu/kernel_classes.py --out "$out_dir" || failed=$((failed + 1))

echo "== the loss over the vocabulary by row length"
python3 experiments/gpu/loss_rate.py --out "$out_dir" || failed=$((failed + 1))

echo "== fp32 sweep"
python3 experiments/gpu/validate.py --precision fp32 --presets small,llama-150m --batch-sizes 1,4,16 \
    --no-max-batch-search --skip-run --out "$out_dir/fp32" || failed=$((failed + 1))

echo "== host and GPU time of small-batch steps"
python3 experiments/gpu/host_overhead.py --out "$out_dir" || failed=$((failed + 1))

echo "== DiLoCo run at fp16 (loss scale)"
python3 experiments/gpu/validate.py --skip-sweep --run-precision fp16 --out "$out_dir/fp16-run" || failed=$((failed + 1))

echo "== the outer sync on CUDA tensors (nccl group, one rank)"
experiments/gpu/nccl_one_rank.sh "$out_dir/nccl" cuda || failed=$((failed + 1))
rm -rf "$out_dir/nccl/runs"

echo "== the hivemind backend on this GPU"
if python3 -c "import hivemind" 2>/dev/null; then
    experiments/gpu/hivemind_cuda.sh "$out_dir/hivemind" cuda || failed=$((failed + 1))
else
    echo "skipped: hivemind is not installed (pip install 'geodiloco[hivemind]')"
fi

echo "== tests with CUDA present"
python3 -m pytest -q -p no:cacheprovider tests/test_runtime_precision.py tests/test_gpu_validate.py \
    tests/test_gpu_kernel_classes.py \
    tests/test_gpu_sampler.py tests/test_predictor_detect.py 2>&1 | tee "$out_dir/pytest.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || failed=$((failed + 1))

echo "== $failed step(s) failed"
exit "$failed"
