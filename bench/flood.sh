#!/usr/bin/env bash
# A flood of new connections past the cap on the emulated droplet (bench/scenario.sh: the node
# under tools/droplet on CPU 0 with a 1 GiB memory cgroup, the load generator on CPU 1).
# Usage: bench/flood.sh [ATTEMPTS] [MAX_CONNS] [PORT]   (writes bench/out/flood-ATTEMPTS.json)
set -euo pipefail
cd "$(dirname "$0")/.."
attempts=${1:-15000}
cap=${2:-5000}
NODE_ENV="COMBD_MAX_CONNS=$cap COMBD_HEADER_TIMEOUT=5m" PORT=${3:-18081} \
  exec bench/scenario.sh flood "flood-$attempts" --conns "$attempts"
