#!/usr/bin/env bash
# The outer sync over nccl on a machine with one GPU:
#   experiments/gpu/nccl_one_rank.sh OUT_DIR [cuda|cpu]
# nccl refuses two ranks on one GPU, so this is a world of one node with one rank whose outer
# all-reduce runs on CUDA tensors (comm.outer_device: cuda, process group cpu:gloo,cuda:nccl), once
# per sync variant: blocking fp32, delayed fp16, streaming int8, and async. It checks what a world of
# one can show: the nccl group forms, every variant's collectives take CUDA tensors, the run ends
# with exit 0 and its final checksum line, and the loss falls. In a world of one the pseudo-gradient
# sum itself is local (runtime/sync/wire.py), so nccl between nodes still needs several GPUs
# (validate.py splits them between the nodes). Last, on CUDA, two ranks on this one GPU try one nccl
# all-reduce, to record what nccl says (it refuses: "Duplicate GPU detected").
# The second argument "cpu" runs the same runs on gloo (no GPU).
# Writes OUT_DIR/<variant>.log, OUT_DIR/two_ranks_one_gpu.log and OUT_DIR/summary.txt.
# Exit code: the number of variants that failed.
set -u
case "${1:-}" in
    -h|--help|"") awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; [[ -n "${1:-}" ]]; exit $? ;;
esac
out_dir=$1
device=${2:-cuda}
mkdir -p "$out_dir"
config=$out_dir/config.yaml
cat > "$config" <<EOF
run: {name: nccl-one-rank, out_dir: $out_dir/runs, seed: 0}
model: {preset: small, seq_len: 256, precision: bf16}
data: {source: stdlib, max_bytes: 2000000, eval_batches: 2, eval_batch_size: 4}
optim: {inner: {lr: 1.0e-3, warmup_steps: 2}}
diloco: {rounds: 4, local_steps: 5, batch_size: 8}
balancing: {policy: uniform}
comm: {backend: torch, outer_device: $device, timeout_s: 120}
checkpoint: {every_rounds: 2, keep: 1}
nodes:
  - {name: a, gpus: []}
EOF
failed=0
: > "$out_dir/summary.txt"
for variant in "none none sync" "delayed fp16 sync" "streaming int8 sync" "none none async"; do
    read -r overlap compression mode <<< "$variant"
    name=$overlap-$compression-$mode
    GEODILOCO_DEVICE=$device PYTHONUNBUFFERED=1 timeout 240 python3 -m torch.distributed.run --standalone \
        --nnodes=1 --nproc-per-node=1 -m geodiloco.runtime.train --config "$config" --node-name a \
        --run-dir "$out_dir/runs/$name" --set "diloco.overlap=$overlap" --set "diloco.compression=$compression" \
        --set "diloco.mode=$mode" > "$out_dir/$name.log" 2>&1
    rc=$?
    checksum=$(grep -c "final parameter checksum .* on every rank" "$out_dir/$name.log")
    losses=$(grep -o "round [0-9]*/[0-9]* loss [0-9.]*" "$out_dir/$name.log" | awk '{print $4}' | paste -sd' ')
    first=${losses%% *}; last=${losses##* }
    falling=$(awk -v a="$first" -v b="$last" 'BEGIN {print (b < a) ? 1 : 0}')
    verdict=passed
    [[ $rc -eq 0 && $checksum -eq 1 && $falling -eq 1 ]] || { verdict=FAILED; failed=$((failed + 1)); }
    echo "$name on $device: exit $rc, checksum line $checksum, round losses $losses: $verdict" | tee -a "$out_dir/summary.txt"
done
if [[ $device == cuda ]]; then
    script=$out_dir/two_ranks_one_gpu.py
    printf '%s\n' 'import torch, torch.distributed as dist' 'dist.init_process_group("nccl")' \
        't = torch.ones(4, device="cuda:0") * (dist.get_rank() + 1)' 'dist.all_reduce(t)' \
        'print("rank", dist.get_rank(), "sum", t.tolist(), flush=True)' 'dist.destroy_process_group()' > "$script"
    timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node=2 "$script" \
        > "$out_dir/two_ranks_one_gpu.log" 2>&1
    rc=$?
    said=$(grep -o -m1 "Duplicate GPU detected[^,]*" "$out_dir/two_ranks_one_gpu.log")
    echo "two ranks on one GPU over nccl: exit $rc${said:+ ($said)}" | tee -a "$out_dir/summary.txt"
fi
echo "== $failed variant(s) failed" | tee -a "$out_dir/summary.txt"
exit "$failed"
