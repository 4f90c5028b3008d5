#!/usr/bin/env bash
# A flood of new connections past the cap on the emulated droplet (tools/droplet: CPU 0, a
# 1 GiB memory cgroup), the load generator on CPU 1.
# Usage: bench/flood.sh [ATTEMPTS] [MAX_CONNS] [PORT]   (writes bench/out/flood-ATTEMPTS.json)
set -euo pipefail
cd "$(dirname "$0")/.."
attempts=${1:-15000}
cap=${2:-5000}
port=${3:-18081}
cargo build --release -p combd -p combd-bench >&2
mkdir -p bench/out
data=$(mktemp -d)
COMBD_LISTEN=0.0.0.0:$port COMBD_DATA=$data COMBD_LOG=warn COMBD_MAX_CONNS=$cap COMBD_HEADER_TIMEOUT=5m \
  tools/droplet --cpu 0 --memory 1G -- target/release/combd > "$data/stdout" &
node=$!
trap 'kill -TERM $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q "combd ready" "$data/stdout" 2>/dev/null && break; sleep 0.1; done
grep -q "combd ready" "$data/stdout" || { echo "node did not start" >&2; exit 1; }
sleep 2  # a node in its steady state, past its first measurements
taskset -c 1 target/release/combd-bench flood --port "$port" --conns "$attempts" --out "bench/out/flood-$attempts.json"
