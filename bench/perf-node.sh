#!/usr/bin/env bash
# Profiles the node during one bench/run scenario: perf-node.sh BIN OUT [SCENARIO]
# (default click; e.g. click-heavy). Runs `bench/run` with that scenario alone on BIN, records
# the node's process with `perf record -F 1999 -g` for 15 s once it has run 12 s, and writes
# OUT.data, OUT.children (symbols with their children's share) and OUT.dso (by binary).
# Compare two builds' OUT.data with `perf report -i OUT.data --no-children --sort sym`.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$1; out=$2; scen=${3:-click}
command -v perf >/dev/null || { echo "perf-node.sh: perf is not installed (Debian: linux-perf)" >&2; exit 1; }
(NO_BUILD=1 PEERS=none ONLY="$scen" NODE_BIN=$bin bench/run > "$out.run" 2>&1) &
bg=$!
name=$(basename "$bin")
pid=""
for _ in $(seq 200); do pid=$(pgrep -x "$name" | head -1 || true); [ -n "$pid" ] && break; sleep 0.2; done
[ -n "$pid" ] || { echo "perf-node.sh: $name did not start" >&2; wait "$bg"; exit 1; }
sleep 12
perf record -F 1999 -g -p "$pid" -o "$out.data" -- sleep 15 2>/dev/null
wait "$bg"
perf report -i "$out.data" --children --sort sym --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" > "$out.children"
perf report -i "$out.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | head -12 > "$out.dso"
echo "perf-node.sh: $out.data, $out.children, $out.dso"
