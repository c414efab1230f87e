#!/usr/bin/env bash
# The hivemind backend training on a GPU:
#   experiments/gpu/hivemind_cuda.sh OUT_DIR [cuda|cpu] [--threads N|torch] [--outer-device cpu|cuda]
# Two hivemind nodes share this machine's one GPU (hivemind averages over its own p2p daemons, not nccl,
# so two processes on one GPU are allowed), each started as a site starts it (geodiloco.runtime.train with
# GEODILOCO_DEVICE; `geodiloco run` pins its emulated sites to the CPU), then `geodiloco report` of the run:
# small preset at model.precision bf16, 4 rounds, comm.min_nodes 2. It checks that both nodes end with
# exit 0 and the same final parameter checksum (up to float rounding: hivemind hands each peer the average
# as its own tensor plus a delta), that the loss falls, and on the GPU that every idle record carries NVML
# power (the nodes trained there and sampled it); its first line says whether this GPU computes bf16
# (runtime/precision.py trains fp16 where it does not). The second argument "cpu" runs the same on the CPU.
# --threads: each node's OMP_NUM_THREADS (default: this host's cores / 2, the nodes' fair share; "torch"
# leaves it unset, so each node takes one thread per core and the two oversubscribe the CPU when they take
# their outer steps at the same moment; docs/hivemind.md "Several nodes on one host").
# --outer-device: comm.outer_device, where the outer state lives (default cpu).
# --rounds N: outer rounds (default 4).
# Writes OUT_DIR/run.log (the idle report, then both nodes' output), OUT_DIR/{a,b}.log (each node's own),
# OUT_DIR/run/ (the run directory) and OUT_DIR/summary.txt, whose last line gives the exposed sync per
# round (median and range over both nodes' rounds) and the run's wall clock.
# Exit code: 0 when every check passed, 1 otherwise.
set -u
case "${1:-}" in
    -h|--help|"") awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; [[ -n "${1:-}" ]]; exit $? ;;
esac
out_dir=$1
device=cuda
[[ ${2:-} == cuda || ${2:-} == cpu ]] && { device=$2; shift; }
shift
threads=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 )) outer_device=cpu rounds=4
while [[ $# -gt 0 ]]; do
    case "$1" in
        --threads) threads=${2:?--threads needs a count or torch}; shift 2 ;;
        --outer-device) outer_device=${2:?--outer-device needs cpu or cuda}; shift 2 ;;
        --rounds) rounds=${2:?--rounds needs a count}; shift 2 ;;
        *) echo "hivemind_cuda.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ $threads == torch || $threads =~ ^[1-9][0-9]*$ ]] || { echo "hivemind_cuda.sh: --threads must be a count or torch" >&2; exit 2; }
[[ $outer_device == cpu || $outer_device == cuda ]] || { echo "hivemind_cuda.sh: --outer-device must be cpu or cuda" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "hivemind_cuda.sh: --rounds must be a positive count" >&2; exit 2; }
omp=()
[[ $threads == torch ]] || omp=(OMP_NUM_THREADS="$threads")
mkdir -p "$out_dir"
rm -rf "$out_dir/run"
config=$out_dir/config.yaml
cat > "$config" <<YAML
run: {name: hivemind-cuda, out_dir: $out_dir/runs, seed: 0}
model: {preset: small, seq_len: 256, precision: bf16}
data: {source: stdlib, max_bytes: 2000000, eval_batches: 2, eval_batch_size: 4}
optim: {inner: {lr: 1.0e-3, warmup_steps: 2}}
diloco: {rounds: $rounds, local_steps: 5, batch_size: 8}
balancing: {policy: uniform}
comm:
  backend: hivemind
  outer_device: $outer_device
  timeout_s: 120
  init_timeout_s: 120
  min_nodes: 2
  hivemind: {host_maddrs: ["/ip4/127.0.0.1/tcp/0"], start_wait_s: 120, round_timeout_s: 120, heartbeat_ttl_s: 15,
             matchmaking_time_s: 4.0, request_timeout_s: 2.0}
checkpoint: {every_rounds: 2, keep: 1}
nodes:
  - {name: a, gpus: []}
  - {name: b, gpus: []}
YAML
secret=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
start_node() {  # NAME: one site as it would start by hand (`geodiloco run` pins its emulated sites to the CPU)
    local peers=()
    if [[ $1 == a ]]; then peers=(GEODILOCO_MADDRS_FILE="$out_dir/peers.txt"); else
        for _ in $(seq 600); do [[ -s $out_dir/peers.txt ]] && break; sleep 0.1; done
        peers=(GEODILOCO_INITIAL_PEERS="$(paste -sd, "$out_dir/peers.txt")"); fi
    env "${peers[@]}" "${omp[@]}" GEODILOCO_NODE="$1" GEODILOCO_DEVICE="$device" GEODILOCO_SECRET="$secret" RANK=0 WORLD_SIZE=1 \
        PYTHONUNBUFFERED=1 timeout 300 python3 -m geodiloco.runtime.train --config "$config" --run-dir "$out_dir/run" \
        > "$out_dir/$1.log" 2>&1 &
}
rm -f "$out_dir/peers.txt"
{
    python3 -c 'import torch; from geodiloco.runtime.precision import cuda_has_bf16
if torch.cuda.is_available():
    print("GPU", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0),
          "cuda_has_bf16", cuda_has_bf16(), "torch is_bf16_supported(including_emulation=False)",
          torch.cuda.is_bf16_supported(including_emulation=False))
else:
    print("no CUDA device: torch", torch.__version__)'
    start_node a; pid_a=$!
    start_node b; pid_b=$!
    wait "$pid_a"; rc_a=$?; wait "$pid_b"; rc_b=$?
    python3 -m geodiloco.runtime.cli report "$out_dir/run" 2>&1
    echo "exit $((rc_a + rc_b))"
} > "$out_dir/run.log" 2>&1
cat "$out_dir/a.log" "$out_dir/b.log" >> "$out_dir/run.log"
rc=$(grep -m1 "^exit " "$out_dir/run.log" | awk '{print $2}')
checksums=$(grep -o "node [ab]: final parameter checksum [-0-9.e+]*" "$out_dir/run.log" | awk '{print $NF}' | paste -sd' ')
same=$(awk -v pair="$checksums" 'BEGIN {n = split(pair, c, " "); if (n != 2) {print 0; exit}
    d = c[1] - c[2]; if (d < 0) d = -d; m = (c[1] < 0 ? -c[1] : c[1]); print (d <= 1e-9 * m) ? 1 : 0}')
losses=$(grep -o "round [0-9]*/[0-9]* loss [0-9.]*" "$out_dir/run.log" | awk '{print $4}' | paste -sd' ')
first=${losses%% *}; last=${losses##* }
falling=$(awk -v a="$first" -v b="$last" 'BEGIN {print (a != "" && b < a) ? 1 : 0}')
sampled_rows=$(python3 -c "import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(sum(row.get('power_w') is not None for row in rows), 'of', len(rows))" "$out_dir/run/idle.jsonl" 2>/dev/null)
verdict=passed
[[ $rc == 0 && $same -eq 1 && $falling -eq 1 ]] || verdict=FAILED
# on the GPU every idle record carries NVML power: the nodes trained there and sampled it
[[ $device != cuda || ( -n $sampled_rows && ${sampled_rows%% *} -gt 0 && ${sampled_rows%% *} == "${sampled_rows##* }" ) ]] \
    || verdict=FAILED
sync_line=$(python3 -c "import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
syncs = sorted(row['comm_s'] for row in rows)
print(f'exposed sync per round {statistics.median(syncs):.2f} s (median; {syncs[0]:.2f}-{syncs[-1]:.2f} s over {len(rows)} node-rounds)')" \
    "$out_dir/run/idle.jsonl" 2>/dev/null)
sync_line="${sync_line:-no idle records}; $(grep -o 'wall clock [0-9.]* s' "$out_dir/run.log" | head -1)"
sampled=$(grep -h -o "GPU sampling off: .*" "$out_dir"/a.log "$out_dir"/b.log 2>/dev/null | sort -u | paste -sd';')
energy=$(grep -o "Energy not available\|idle energy measured" "$out_dir/run.log" | head -1)
{
    head -1 "$out_dir/run.log"
    echo "NVML sampling: ${sampled:-no node said it is off}; idle records with power: ${sampled_rows:-none}; report: ${energy:-no energy line}"
    echo "hivemind, 2 nodes on $device: exit $rc, final checksums $checksums (same: $same), round losses $losses: $verdict"
    echo "threads per node: $threads; comm.outer_device: $outer_device; $sync_line"
} | tee "$out_dir/summary.txt"
[[ $verdict == passed ]]
