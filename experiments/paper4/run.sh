#!/usr/bin/env bash
# Regenerate experiments/paper4/results/ (all policies + the slowdown scenario), or
# `run.sh --quick` for a 3-policy check. Needs root for network namespaces; without it
# the sites run on loopback. Options: see `run.sh --help`.
set -euo pipefail
# --results and --runs-dir name paths from where you are, not from the checkout this script moves to
args=() expect_path=false
for arg in "$@"; do
    if $expect_path && [[ "$arg" != /* ]]; then arg="$PWD/$arg"; fi
    expect_path=false
    case "$arg" in
        --results|--runs-dir) expect_path=true ;;
        --results=*|--runs-dir=*) value="${arg#*=}"; [[ "$value" == /* ]] || arg="${arg%%=*}=$PWD/$value" ;;
    esac
    args+=("$arg")
done
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-.venv/bin/python}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$PYTHON" experiments/paper4/reproduce.py "${args[@]}"
