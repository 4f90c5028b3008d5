#!/usr/bin/env bash
# Memory per idle WebSocket: the node on CPU 0 (one shard), the load generator on CPU 1.
# Usage: bench/idle.sh [CONNS] [PORT]   (writes bench/out/idle-CONNS.json)
# NODE_BIN=path runs that node binary instead of target/release/combd (an A/B against an older build).
set -euo pipefail
cd "$(dirname "$0")/.."
conns=${1:-10000}
port=${2:-18080}
cargo build --release -p combd -p combd-bench >&2
mkdir -p bench/out
data=$(mktemp -d)
COMBD_LISTEN=0.0.0.0:$port COMBD_DATA=$data COMBD_LOG=warn taskset -c 0 "${NODE_BIN:-target/release/combd}" > "$data/stdout" &
node=$!
trap 'kill -TERM $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q "combd ready" "$data/stdout" 2>/dev/null && break; sleep 0.1; done
grep -q "combd ready" "$data/stdout" || { echo "node did not start" >&2; exit 1; }
taskset -c 1 target/release/combd-bench idle --port "$port" --conns "$conns" --out "bench/out/idle-$conns.json"
