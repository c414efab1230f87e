#!/usr/bin/env bash
# Sourced by launch_site.sh and wan_emulate.sh: sets PYTHON to the Python that has geodiloco (PYTHON as given,
# a checkout's .venv, the environment these scripts were installed into, else python3), repo_root, and in a
# checkout PYTHONPATH to it; returns 1 when that Python cannot import geodiloco and what it needs.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    echo "geodiloco_python.sh is sourced by launch_site.sh and wan_emulate.sh; run those instead" >&2
    exit 2
fi
script_dir="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
repo_root="$(cd "$script_dir/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo_root/.venv/bin/python" ]]; then PYTHON="$repo_root/.venv/bin/python"
    elif [[ -x "$script_dir/python" ]]; then PYTHON="$script_dir/python"
    else PYTHON=python3; fi
fi
if [[ -f "$repo_root/pyproject.toml" ]]; then export PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}"; fi
(cd / && "$PYTHON" -c "import geodiloco, numpy, pydantic, rich, yaml") 2>/dev/null
