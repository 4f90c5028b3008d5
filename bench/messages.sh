#!/usr/bin/env bash
# Messages between objects a second (issue 29): CONNS clients (threads of bench/messages.py on
# CPU 1) post transfers between ACCOUNTS accounts of the `bank` test app for SECONDS; each
# transfer is a message from one object to another (`send_to_object`), taken exactly once by
# its receiver. The node on the emulated droplet (CPU 0, 1 GiB, one shard).
# Usage: bench/messages.sh [SECONDS] [OUT_NAME]   (writes bench/out/OUT_NAME.json)
# The node is target/release/combd-test-node (the node and the test apps); NODE_BIN=path runs
# that binary instead (a combd-test-node of another commit).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
name=${2:-messages}
port=${PORT:-18091}
cargo build --release -p combd >&2  # both of its binaries: combd and combd-test-node
mkdir -p bench/out
data=$(mktemp -d)
env COMBD_LISTEN=127.0.0.2:$port COMBD_DATA=$data COMBD_LOG=warn COMBD_SHARDS=1 \
  tools/droplet --cpu 0 --memory 1G -- "${NODE_BIN:-target/release/combd-test-node}" > "$data/stdout" &
node=$!
trap 'kill -TERM $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q "combd ready" "$data/stdout" 2>/dev/null && break; sleep 0.1; done
grep -q "combd ready" "$data/stdout" || { echo "node did not start" >&2; exit 1; }
taskset -c 1 python3 bench/messages.py --port "$port" --seconds "$seconds" \
  --conns "${CONNS:-16}" --accounts "${ACCOUNTS:-64}" --out "bench/out/$name.json"
