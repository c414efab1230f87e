#!/usr/bin/env bash
# Regenerate experiments/paper4/results/ (all policies + the slowdown scenario), or
# `run.sh --quick` for a 3-policy check. Needs root for network namespaces; without it
# the sites run on loopback. Options: see `run.sh --help`.
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-.venv/bin/python}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
exec "$PYTHON" experiments/paper4/reproduce.py "$@"
