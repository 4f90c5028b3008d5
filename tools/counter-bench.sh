#!/usr/bin/env bash
# Acknowledged durable writes per second on one counter object: wrk (on CPU 1) keeps CONNS
# connections (default 64) each pipelining DEPTH (default 16) `POST /o/counter/x`, against a
# fresh node on the emulated droplet (CPU 0, 1 GiB). Afterwards it reads the counter, which must
# equal the 200s wrk saw (nothing refused applied, nothing acknowledged lost), and the node's
# batch and sync counters from /stats.
# NODE_BIN=path runs that node binary instead of target/release/combd (an A/B against an older build).
# Usage: [NODE_ENV="COMBD_X=1 ..."] [NODE_BIN=path] [CONNS=64] [DEPTH=16] [SECS=10] [PERF=out.data] tools/counter-bench.sh
# (PERF records a perf profile of the node for the run, of target/profiling/combd unless NODE_BIN
# names another: `cargo build --profile profiling` keeps the line tables the release build strips.)
# Run it through tools/quiet. Needs `wrk` and a release build (target/release/combd).
set -euo pipefail
cd "$(dirname "$0")/.."
port=${PORT:-18083}
conns=${CONNS:-64}; secs=${SECS:-10}
export DEPTH=${DEPTH:-16}
# A profile needs the line tables the release build strips: PERF defaults to the profiling build.
bin=${NODE_BIN:-target/release/combd}
if [ -n "${PERF:-}" ] && [ -z "${NODE_BIN:-}" ]; then bin=target/profiling/combd; fi
data=$(mktemp -d)
env COMBD_LISTEN=0.0.0.0:$port COMBD_DATA=$data COMBD_LOG=warn ${NODE_ENV:-} \
  tools/droplet --cpu 0 --memory 1G -- "$bin" > "$data/stdout" 2> "$data/stderr" &
node=$!
trap 'kill -TERM $node 2>/dev/null; wait $node 2>/dev/null; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q "combd ready" "$data/stdout" 2>/dev/null && break; sleep 0.1; done
grep -q "combd ready" "$data/stdout" || { echo "node did not start" >&2; exit 1; }
pid=$(curl -s "http://127.0.0.1:$port/stats" | python3 -c 'import json, sys; print(json.load(sys.stdin)["pid"])')
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
t0=$(ticks)
if [ -n "${PERF:-}" ]; then
  perf record -g -p "$pid" -o "$PERF" -- sleep "$secs" >/dev/null 2>&1 &
fi
out=$(taskset -c 1 wrk -t1 -c"$conns" -d"${secs}s" -s tools/counter-wrk.lua "http://127.0.0.1:$port")
t1=$(ticks)
[ -z "${PERF:-}" ] || wait $!
echo "$out"
echo "node CPU $(( (t1 - t0) * 100 / $(getconf CLK_TCK) / secs )) % of one core"
answers=$(echo "$out" | awk '/^answers/ {print $2}')
non2xx=$(echo "$out" | awk '/^answers/ {print $4}')
value=$(curl -s "http://127.0.0.1:$port/o/counter/x" | tr -dc '0-9-')
echo "acknowledged $((answers - non2xx)) in ${secs}s = $(( (answers - non2xx) / secs ))/s; refused $non2xx; counter $value"
curl -s "http://127.0.0.1:$port/stats" | python3 -c 'import json, sys
s = json.load(sys.stdin)
keys = ("batches", "batch_max", "wal_syncs", "sync_group_max", "mailbox_refused",
        "fleet_segments_uploaded", "fleet_upload_max_us", "fleet_ship_failed", "fleet_bucket_retried",
        "fleet_restores", "fleet_snapshots")
print(" ".join(f"{k}={s[k]}" for k in keys if k in s and (s[k] or not k.startswith("fleet"))))' 
# The node's warnings (a failed shipment, a slow sync...), the first five, so a refused answer
# has its cause beside it.
warnings=$(grep -cE " (WARN|ERROR) " "$data/stderr" || true)
echo "node warnings: $warnings"
grep -m5 -E " (WARN|ERROR) " "$data/stderr" || true
