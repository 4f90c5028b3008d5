#!/usr/bin/env bash
# permessage-deflate on and off, against combd alone: 10,000 idle million viewers (bytes the
# node sends each viewer from its connect on, and the node's CPU to open them all) and heavy
# click 2,000 (a click a second each, 30 s), each offering deflate or not (`combd-bench
# --deflate on|off`), ROUNDS rounds alternated (default 3); node on the emulated droplet
# (tools/droplet: CPU 0, 1 GiB), generator on CPU 1. Writes bench/out/deflate/<scenario>-<on|off>-<round>.json
# and prints the medians.
# Usage: [NODE_BIN=path] [ROUNDS=3] bench/deflate.sh   (about 8 minutes here; a release build)
set -euo pipefail
cd "$(dirname "$0")/.."
port=18200
bin=${NODE_BIN:-target/release/combd}
out=bench/out/deflate
rm -rf "$out" && mkdir -p "$out"
run() { # name on|off scenario args...
  local name=$1 d=$2 scenario=$3; shift 3
  local work; work=$(mktemp -d)
  env COMBD_LISTEN=0.0.0.0:$port COMBD_DATA="$work/data" COMBD_LOG=warn \
    tools/droplet --cpu 0 --memory 1G -- "$bin" > "$work/out" 2>&1 &
  local wrapper=$!
  for _ in $(seq 200); do grep -q "combd ready" "$work/out" && break; sleep 0.05; done
  local pid; pid=$("$bin" top --once --json --port $port | grep -o '"pid":[0-9]*' | cut -d: -f2)
  taskset -c 1 target/release/combd-bench "$scenario" --port $port --pid "$pid" \
    --out "$out/$name.json" --deflate "$d" "$@" > /dev/null
  kill -TERM "$wrapper"; wait "$wrapper" 2>/dev/null || true
  rm -rf "$work"
}
for r in $(seq "${ROUNDS:-3}"); do
  for d in off on; do
    run "idle-$d-$r" "$d" idle --conns 10000 --board idle
    run "heavy-$d-$r" "$d" click --conns 2000 --interval-ms 1000 --duration-s 30 --board heavy
  done
done
python3 - "$out" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
rows = {"idle": ["node_bytes_out_per_conn", "node_cpu_seconds_to_open", "node_user_bytes_per_conn", "ping_p99_ms", "node_ws_deflated_out"],
        "heavy": ["echo_p50_ms", "echo_p99_ms", "node_cpu_percent", "bytes_received_after_connect", "node_ws_deflated_out", "generator_cpu_percent"]}
print("| scenario | figure | deflate off | deflate on |\n|---|---|---|---|")
for sc, keys in rows.items():
    for k in keys:
        cells = []
        for d in ("off", "on"):
            vals = [json.load(open(f)).get(k) for f in sorted(glob.glob(f"{out}/{sc}-{d}-*.json"))]
            vals = [v for v in vals if isinstance(v, (int, float))]
            cells.append(f"{statistics.median(vals):,.3f} ({', '.join(f'{v:,.3f}' for v in vals)})" if vals else "–")
        print(f"| {sc} | {k} | {cells[0]} | {cells[1]} |")
PY
