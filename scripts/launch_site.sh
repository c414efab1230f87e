#!/usr/bin/env bash
# Launch one site's share of a GeoDiLoCo run under torchrun (c10d rendezvous).
#
#   scripts/launch_site.sh --config run.yaml --node-name NAME --nnodes N --nproc-per-node G \
#       --rdzv-endpoint HOST:PORT [--is-host] [--min-nodes M] [--max-restarts R] [--fixed] \
#       [--local-addr ADDR] [--ifname IFACE] [--run-id ID] [--secret-file FILE] [--entry MODULE]
#       [--dry-run] [-- entry args]
#
# Every site needs the run's shared secret: GEODILOCO_SECRET, GEODILOCO_SECRET_FILE or --secret-file
# (the same value everywhere; docs/security.md). The torchrun rendezvous id is derived from it and
# --run-id, so an agent without the secret never meets the run's agents.
# Runs on every site with the same --rdzv-endpoint and --run-id. The rendezvous store runs
# either in `geodiloco rendezvous` on a reliable machine (recommended: then any site may fail)
# or in the one site that passes --is-host (HOST is its address; if it fails, the run stops).
# Elastic by default (docs/elastic.md): --nnodes M:N with M = --min-nodes, --max-restarts and the
# rendezvous timeouts taken from the config (comm.min_nodes, comm.elastic.max_restarts, last_call_s,
# keep_alive_s, join_timeout_s; the options override the first two); a site that fails is left out
# and may come back with the same command.
# --fixed (or comm.elastic.enabled: false): --nnodes N:N and no restarts (one failed site stops every site;
# continue with every site's command plus --resume and a new --run-id). Give each run its own --run-id:
# a rendezvous store does not let a run id that ended be joined again.
# It avoids the ways a cross-site torchrun job hangs:
#   * --rdzv-conf=is_host=true|false: HOST often resolves to 127.0.0.1 locally,
#     so the store host must be told it is the host;
#   * GLOO_SOCKET_IFNAME: gloo binds to 127.0.0.1 unless given the WAN interface;
#   * --local-addr: the address other sites reach this one on (missing = silent hang);
#   * no --node-rank: c10d assigns ranks itself;
#   * the node name travels in GEODILOCO_NODE, not as an option: torchrun's own
#     parser rejects --node after -m MODULE (ambiguous with --node-rank).
# Without --local-addr/--ifname both come from the route to HOST (or, on the host,
# from the interface that holds HOST). --entry replaces the module torchrun runs
# (default geodiloco.runtime.train). --dry-run prints the command and exits.
set -euo pipefail

usage() { awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit "${1:-0}"; }
die() { echo "launch_site.sh: error: $*" >&2; exit 2; }

config="" node="" nnodes="" nproc="" endpoint="" is_host=false local_addr="" ifname=""
run_id="geodiloco" secret_file="" entry="geodiloco.runtime.train" dry_run=false extra=() min_nodes="" max_restarts="" fixed=false
while [[ $# -gt 0 ]]; do
    case "$1" in
        --config|--node-name|--node|--nnodes|--nproc-per-node|--rdzv-endpoint|--min-nodes|--max-restarts|\
        --local-addr|--ifname|--run-id|--secret-file|--entry)
            [[ $# -ge 2 && -n "$2" && "$2" != --* ]] || die "$1 needs a value (see --help)" ;;
    esac
    case "$1" in
        --config) config="${2:-}"; shift 2 ;;
        --node-name|--node) node="${2:-}"; shift 2 ;;
        --nnodes) nnodes="${2:-}"; shift 2 ;;
        --nproc-per-node) nproc="${2:-}"; shift 2 ;;
        --rdzv-endpoint) endpoint="${2:-}"; shift 2 ;;
        --is-host) is_host=true; shift ;;
        --min-nodes) min_nodes="${2:-}"; shift 2 ;;
        --max-restarts) max_restarts="${2:-}"; shift 2 ;;
        --fixed) fixed=true; shift ;;
        --local-addr) local_addr="${2:-}"; shift 2 ;;
        --ifname) ifname="${2:-}"; shift 2 ;;
        --run-id) run_id="${2:-}"; shift 2 ;;
        --secret-file) secret_file="${2:-}"; shift 2 ;;
        --entry) entry="${2:-}"; shift 2 ;;
        --dry-run) dry_run=true; shift ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) usage ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

[[ -n "$config" ]] || die "--config is required: the run's YAML file (the same file on every site)"
[[ -n "$node" ]] || die "--node-name is required: this site's node name from the config's nodes: list"
[[ "$nnodes" =~ ^[1-9][0-9]*$ ]] || die "--nnodes must be a positive integer: the number of sites (got '$nnodes')"
[[ -z "$min_nodes" || ( "$min_nodes" =~ ^[1-9][0-9]*$ && "$min_nodes" -le "$nnodes" ) ]] || die "--min-nodes must be an integer from 1 to --nnodes (got '$min_nodes')"
[[ -z "$max_restarts" || "$max_restarts" =~ ^[0-9]+$ ]] || die "--max-restarts must be a non-negative integer (got '$max_restarts')"
[[ "$nproc" =~ ^[1-9][0-9]*$ ]] || die "--nproc-per-node must be a positive integer: GPUs (or processes) at this site (got '$nproc')"
[[ "$endpoint" =~ ^[^:]+:[0-9]+$ ]] || die "--rdzv-endpoint must be HOST:PORT of the rendezvous store: where \`geodiloco rendezvous\` runs, or the site passing --is-host (got '$endpoint')"
[[ "$ifname" =~ ^[^/[:space:]]{0,15}$ ]] || die "--ifname must be an interface name of at most 15 characters (got '$ifname')"
[[ "$entry" =~ ^[A-Za-z_][A-Za-z0-9_.]*$ ]] || die "--entry must be a Python module name (got '$entry')"
rdzv_host="${endpoint%:*}"

resolve_ipv4() {
    if [[ "$1" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then echo "$1"; return; fi
    getent ahostsv4 "$1" 2>/dev/null | awk 'NR==1 {print $1}'
}
ifname_of_addr() { ip -o -4 addr show to "$1" 2>/dev/null | awk 'NR==1 {print $2}'; }
addr_of_ifname() { ip -o -4 addr show dev "$1" 2>/dev/null | awk 'NR==1 {split($4, a, "/"); print a[1]}'; }

if [[ -z "$local_addr" && -z "$ifname" ]]; then
    host_ip="$(resolve_ipv4 "$rdzv_host")"
    [[ -n "$host_ip" ]] || die "cannot resolve '$rdzv_host'; pass --local-addr and --ifname"
    route="$(ip -o route get "$host_ip" 2>/dev/null || true)"
    route_dev="$(awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i + 1); exit}}' <<<"$route")"
    if [[ "$route_dev" == "lo" || -z "$route_dev" ]]; then
        ifname="$(ifname_of_addr "$host_ip")"
        local_addr="$host_ip"
    else
        ifname="$route_dev"
        local_addr="$(awk '{for (i = 1; i < NF; i++) if ($i == "src") {print $(i + 1); exit}}' <<<"$route")"
    fi
elif [[ -z "$ifname" ]]; then
    ifname="$(ifname_of_addr "$local_addr")"
elif [[ -z "$local_addr" ]]; then
    local_addr="$(addr_of_ifname "$ifname")"
fi
[[ -n "$local_addr" ]] || die "cannot find this site's address; pass --local-addr ADDR (the address other sites reach)"
[[ "$ifname" != "lo" ]] || die "--ifname lo: the loopback interface cannot reach other sites; pass the interface that carries $local_addr to them (--ifname IFACE, see: ip -brief addr)"
[[ -n "$ifname" ]] || die "cannot find the WAN interface for $local_addr; pass --ifname IFACE"

source "$(dirname "${BASH_SOURCE[0]}")/geodiloco_python.sh" \
    || die "$PYTHON cannot import geodiloco and its dependencies: activate the environment it is installed in, or set PYTHON=/path/to/that/venv/bin/python"
# torchrun's agent, wrapped so that its failures read as one line and a worker that stops on bad input
# is not restarted (runtime/agent.py); TORCHRUN replaces it (e.g. TORCHRUN=torchrun for the bare agent)
if [[ -n "${TORCHRUN:-}" ]]; then
    read -r -a launcher <<<"$TORCHRUN"
else
    launcher=("${PYTHON:-python3}" -m geodiloco.runtime.agent)
fi

# Without the config's values (another --entry): comm's defaults (tests/test_sites_unit.py keeps them equal).
cfg_min_nodes=1 cfg_max_restarts=10 cfg_elastic=true
cfg_timeouts="join_timeout=600,last_call_timeout=8,close_timeout=30,keep_alive_interval=2,keep_alive_max_attempt=3"
if [[ "$entry" == "geodiloco.runtime.train" ]]; then
    [[ -r "$config" ]] || die "--config $config is not a readable file (the run's YAML, the same file on every site)"
    settings="$("${PYTHON:-python3}" - "$config" "$node" <<'PY'
import sys
from geodiloco.common.schema import ConfigError
from geodiloco.runtime.config import load_config
from geodiloco.runtime.elastic_launch import rendezvous_conf
try:
    config = load_config(sys.argv[1])
except ConfigError as err:
    sys.exit(f"launch_site.sh: error: {err}")
names = [node.name for node in config.nodes]
if sys.argv[2] not in names:
    sys.exit(f"launch_site.sh: error: --node-name {sys.argv[2]!r} is not one of the config's nodes ({', '.join(names)})")
elastic = config.comm.elastic
print(config.comm.min_nodes, elastic.max_restarts, str(elastic.enabled).lower(),
      rendezvous_conf(config).removeprefix("is_host=false,"))
PY
)" || exit 2
    read -r cfg_min_nodes cfg_max_restarts cfg_elastic cfg_timeouts <<<"$settings"
fi
min_nodes="${min_nodes:-$cfg_min_nodes}" max_restarts="${max_restarts:-$cfg_max_restarts}"
[[ "$cfg_elastic" == true ]] || fixed=true
[[ "$min_nodes" -le "$nnodes" ]] || die "comm.min_nodes ($min_nodes) is above --nnodes ($nnodes): pass --nnodes with every site of the run, or --min-nodes"
if [[ -n "$secret_file" ]]; then
    [[ -r "$secret_file" ]] || die "--secret-file $secret_file is not a readable file"
    export GEODILOCO_SECRET_FILE="$secret_file"
fi
if [[ -n "${GEODILOCO_SECRET:-}${GEODILOCO_SECRET_FILE:-}" ]]; then
    run_id="$("${PYTHON:-python3}" -m geodiloco.runtime.auth rendezvous-id "$run_id")" \
        || die "cannot derive the rendezvous id from the run's secret (see the error above)"
elif [[ "$entry" == "geodiloco.runtime.train" ]]; then
    die "no shared secret: set GEODILOCO_SECRET (the same value at every site) or pass --secret-file FILE"
fi

rdzv_conf="is_host=$is_host,$cfg_timeouts"
nnodes_range="$min_nodes:$nnodes"
if $fixed; then
    nnodes_range="$nnodes" max_restarts=0
fi
join_timeout_s="$(sed -n 's/.*join_timeout=\([0-9]*\).*/\1/p' <<<"$cfg_timeouts")"
command=("${launcher[@]}"
    "--nnodes=$nnodes_range" "--nproc-per-node=$nproc"
    "--rdzv-backend=c10d" "--rdzv-endpoint=$endpoint" "--rdzv-id=$run_id"
    "--rdzv-conf=$rdzv_conf" "--local-addr=$local_addr" "--max-restarts=$max_restarts"
    "--monitor-interval=0.5"
    -m "$entry" --config "$config" "${extra[@]}")

# torchrun's shared store keeps one world's keys into the next (see runtime/elastic_launch.py)
if $dry_run; then
    printf 'GEODILOCO_NODE=%q GLOO_SOCKET_IFNAME=%q TP_SOCKET_IFNAME=%q TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1' \
        "$node" "$ifname" "$ifname"
    printf ' %q' "${command[@]}"
    printf '\n'
    exit 0
fi
export GEODILOCO_NODE="$node" GLOO_SOCKET_IFNAME="$ifname" TP_SOCKET_IFNAME="$ifname" TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
# torchrun prints nothing while it waits for the other sites: say what this site waits for, and how long
if $fixed; then
    echo "[geodiloco] site $node: joining the rendezvous at $endpoint; training starts when all $nnodes sites have joined" >&2
else
    echo "[geodiloco] site $node: joining the rendezvous at $endpoint; training starts once at least $min_nodes of $nnodes sites have joined (waits up to $join_timeout_s s: comm.elastic.join_timeout_s)" >&2
fi
exec "${command[@]}"
