#!/usr/bin/env bash
# A resume storm after a restart (issue 42): N numbered viewers of a board on the emulated
# droplet (tools/droplet: CPU 0, a 1 GiB memory cgroup) with the load generator on CPU 1; once
# they are live, the node is killed with SIGKILL and started again on its data, and every
# viewer reconnects with its place. combd-bench `storm` (bench/src/storm.rs) measures the time
# until every viewer resumed, and whether each ended with its page's log, frame for frame.
# Usage: [NODE_BIN=path] bench/storm.sh OUT_NAME [combd-bench flags: --conns 10000 --pages 100 --rate 1000]
# Writes bench/out/OUT_NAME.json.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1; shift
port=${PORT:-18083}
cargo build --release -p combd -p combd-bench >&2
mkdir -p bench/out
data=$(mktemp -d)
ready=$data/ready
start_node() {
  env COMBD_LISTEN=0.0.0.0:$port COMBD_DATA=$data/node COMBD_LOG=warn ${NODE_ENV:-} \
    tools/droplet --cpu 0 --memory "${DROPLET_MEMORY:-1G}" -- "${NODE_BIN:-target/release/combd}" >> "$data/stdout" &
  node=$!
  for _ in $(seq 200); do curl -sf "http://127.0.0.1:$port/healthz" >/dev/null && return 0; sleep 0.05; done
  echo "node did not start" >&2; exit 1
}
mkdir -p "$data/node"
start_node
trap 'kill -TERM $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$data"' EXIT
taskset -c 1 target/release/combd-bench storm --port "$port" --out "bench/out/$name.json" \
  --ready "$ready" --board storm "$@" &
bench=$!
while [ ! -e "$ready" ]; do
  kill -0 $bench 2>/dev/null || { wait $bench; exit 1; }
  sleep 0.05
done
pid=$(curl -sf "http://127.0.0.1:$port/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
kill -9 "$pid"
wait $node 2>/dev/null || true
start_node
wait $bench
