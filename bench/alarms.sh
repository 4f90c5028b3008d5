#!/usr/bin/env bash
# Alarm lateness (issue 29): RATE alarms a second fall due on one shard for SECONDS, set ahead
# on OBJECTS objects of the `alarmer` test app; the node on the emulated droplet (CPU 0, 1 GiB,
# one shard), the setter on CPU 1. How late each fired (late_ms, as the handler was told) is read
# from the objects' databases once the node has stopped; every alarm must have fired once.
# Usage: bench/alarms.sh [RATE] [SECONDS] [OUT_NAME]   (writes bench/out/OUT_NAME.json)
# The node is target/release/combd-test-node (the node and the test apps); NODE_BIN=path runs
# that binary instead (a combd-test-node of another commit).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-10000}
seconds=${2:-10}
name=${3:-alarms-$rate}
objects=${OBJECTS:-100}
port=${PORT:-18090}
cargo build --release -p combd >&2  # both of its binaries: combd and combd-test-node
mkdir -p bench/out
data=$(mktemp -d)
env COMBD_LISTEN=127.0.0.2:$port COMBD_DATA=$data COMBD_LOG=warn COMBD_SHARDS=1 \
  tools/droplet --cpu 0 --memory 1G -- "${NODE_BIN:-target/release/combd-test-node}" > "$data/stdout" &
node=$!
trap 'kill -TERM $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q "combd ready" "$data/stdout" 2>/dev/null && break; sleep 0.1; done
grep -q "combd ready" "$data/stdout" || { echo "node did not start" >&2; exit 1; }
taskset -c 1 python3 bench/alarms.py set --port "$port" --rate "$rate" --seconds "$seconds" \
  --objects "$objects" --out "bench/out/$name.json"
kill -TERM $node; wait $node 2>/dev/null || true
python3 bench/alarms.py read --data "$data" --out "bench/out/$name.json"
