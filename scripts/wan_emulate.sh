#!/usr/bin/env bash
# Emulated WAN sites on this machine (needs root): network namespaces on a shared
# bridge, each site's link shaped with tbf and optionally delayed.
#
#   scripts/wan_emulate.sh up N --rate 1gbit [--latency-ms 25] [--mtu 1500] [--names a,b] [--prefix gdl]
#   scripts/wan_emulate.sh status [--json] [--prefix gdl]
#   scripts/wan_emulate.sh down [--prefix gdl]
#
# Run a process in site i:  ip netns exec gdl-m-s<i> env GLOO_SOCKET_IFNAME=wan0 <command>
# Details: docs/sites.md.
set -euo pipefail
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$script_dir/.." && pwd)"
# the Python that has geodiloco: PYTHON, a checkout's .venv, the venv this script was installed into, python3
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$repo_root/.venv/bin/python" ]]; then PYTHON="$repo_root/.venv/bin/python"
    elif [[ -x "$script_dir/python" ]]; then PYTHON="$script_dir/python"
    else PYTHON=python3; fi
fi
if [[ -f "$repo_root/pyproject.toml" ]]; then export PYTHONPATH="$repo_root${PYTHONPATH:+:$PYTHONPATH}"; fi
if ! "$PYTHON" -c "import geodiloco" 2>/dev/null; then
    echo "wan_emulate.sh: error: $PYTHON cannot import geodiloco: activate the environment it is installed in, or set PYTHON=/path/to/that/venv/bin/python" >&2
    exit 2
fi
exec "$PYTHON" -m geodiloco.lab.sites "$@"
