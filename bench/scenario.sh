#!/usr/bin/env bash
# Runs one combd-bench scenario against a fresh node on the emulated droplet (tools/droplet:
# CPU 0 and a 1 GiB memory cgroup), the load generator on CPU 1.
# Usage: [NODE_ENV="COMBD_X=1 ..."] bench/scenario.sh SCENARIO OUT_NAME [combd-bench flags...]
# NODE_BIN=path runs that node binary instead of target/release/combd (an A/B against an older build;
# NODE_BIN=target/release/combd-test-node for a scenario that uses a test app, e.g. `fanout`).
# DROPLET_MEMORY=20G runs the node with a memory cgroup that never binds (default 1G).
# Writes bench/out/OUT_NAME.json.
set -euo pipefail
cd "$(dirname "$0")/.."
scenario=$1; name=$2; shift 2
port=${PORT:-18082}
cargo build --release -p combd -p combd-bench >&2  # combd: both combd and combd-test-node
mkdir -p bench/out
data=$(mktemp -d)
env COMBD_LISTEN=0.0.0.0:$port COMBD_DATA=$data COMBD_LOG=warn ${NODE_ENV:-} \
  tools/droplet --cpu 0 --memory "${DROPLET_MEMORY:-1G}" -- "${NODE_BIN:-target/release/combd}" > "$data/stdout" &
node=$!
trap 'kill -TERM $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q "combd ready" "$data/stdout" 2>/dev/null && break; sleep 0.1; done
grep -q "combd ready" "$data/stdout" || { echo "node did not start" >&2; exit 1; }
sleep 2  # a node in its steady state, past its first measurements
taskset -c 1 target/release/combd-bench "$scenario" --port "$port" --out "bench/out/$name.json" "$@"
