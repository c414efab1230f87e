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
if ! source "$(dirname "${BASH_SOURCE[0]}")/geodiloco_python.sh"; then
    echo "wan_emulate.sh: error: $PYTHON cannot import geodiloco and its dependencies: activate the environment it is installed in, or set PYTHON=/path/to/that/venv/bin/python" >&2
    exit 2
fi
exec "$PYTHON" -m geodiloco.lab.sites "$@"
