#!/usr/bin/env bash
# TLS figures: memory per idle WSS connection (beside bench/idle.sh's plain WS) and
# handshakes per second, the node on CPU 0 (one shard), the generator on CPU 1.
# Usage: bench/tls.sh [CONNS] [HANDSHAKES]   (writes bench/out/idle-tls-CONNS.json and
# bench/out/handshakes-HANDSHAKES.json)
# NODE_BIN=path runs that node binary instead of target/release/combd (an A/B against an older build).
set -euo pipefail
cd "$(dirname "$0")/.."
conns=${1:-10000}
hs=${2:-3000}
port=18083; tls_port=18443
cargo build --release -p combd -p combd-bench >&2
mkdir -p bench/out
data=$(mktemp -d)
target/release/combd-bench gen-cert "$data"
run() {
  COMBD_LISTEN=0.0.0.0:$port COMBD_TLS_LISTEN=0.0.0.0:$tls_port COMBD_TLS_CERT=$data/cert.pem \
    COMBD_TLS_KEY=$data/key.pem COMBD_DATA=$data COMBD_LOG=warn taskset -c 0 "${NODE_BIN:-target/release/combd}" > "$data/stdout" &
  node=$!
  for _ in $(seq 100); do grep -q "combd ready" "$data/stdout" 2>/dev/null && break; sleep 0.1; done
  sleep 1
  taskset -c 1 target/release/combd-bench "$1" --port "$port" --tls-port "$tls_port" --tls-cert "$data/cert.pem" --conns "$2" --out "bench/out/$3.json"
  kill -TERM $node; wait $node || true
}
trap 'kill -TERM ${node:-0} 2>/dev/null; rm -rf "$data"' EXIT
run idle-tls "$conns" "idle-tls-$conns"
run handshakes "$hs" "handshakes-$hs"
