#!/usr/bin/env bash
# Fan-out beside uWebSockets.js: frames a second delivered to 5,000 viewers of one object (combd,
# its `fanout` test app) or one topic (uWS, bench/peers/uws-million), a publisher posting a call
# of F frames of 40 bytes every 20 ms (one call in flight), each target on the emulated droplet
# (CPU 0, 1 GiB; bench/targets.sh) with `combd-bench fanout` on CPU 1; targets alternate within a
# round.
# Usage: bench/fanout.sh [FRAMES...]   (default 1 8 16)
# ROUNDS (default 3), DURATION seconds (10), CONNS (5000), TARGETS ("combd uws"; "base" is
# combd-test-node built from another commit, BASE_BIN), NODE_BIN, NO_BUILD=1.
# The `combd` target is target/release/combd-test-node (the node and the test apps: `fanout` is
# one), or NODE_BIN.
# Writes bench/out/fanout/<target>-<frames>-<round>.json and prints the medians of the rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
frames=${*:-1 8 16}
dir=bench/out/fanout
(cd bench/peers/uws-million && npm install --no-audit --no-fund --silent >/dev/null)
# -p combd builds both of the package's binaries: combd and combd-test-node.
[ -n "${NO_BUILD:-}" ] || cargo build --release -p combd -p combd-bench >&2
rm -rf "$dir" && mkdir -p "$dir"
NODE_BIN=${NODE_BIN:-target/release/combd-test-node}
. bench/targets.sh

for round in $(seq "${ROUNDS:-3}"); do
  for f in $frames; do
    for who in ${TARGETS:-combd uws}; do
      echo "== round $round, $f frames a call on $who" >&2
      measure "$who" "$dir/$who-$f-$round.json" "$dir/generator.log" fanout \
        --conns "${CONNS:-5000}" --frames "$f" --interval-ms 20 --duration-s "${DURATION:-10}" --board fan
    done
  done
done

python3 - "$dir" $frames <<'PY'
import json, glob, statistics, sys
dir, frames = sys.argv[1], [int(f) for f in sys.argv[2:]]
med = statistics.median
print("| target | frames a call | frames/s received (runs) | calls answered | frames missing | frames a send (combd) | node CPU % | generator CPU % |")
print("|---|---|---|---|---|---|---|---|")
for who in sorted({f.split("/")[-1].split("-")[0] for f in glob.glob(f"{dir}/*.json")}):
    for f in frames:
        runs = [json.load(open(p)) for p in sorted(glob.glob(f"{dir}/{who}-{f}-*.json"))]
        if not runs:
            continue
        fps = [r["frames_per_second"] for r in runs]
        gen = med(r["generator_cpu_percent"] for r in runs)
        per_send = med(r["node_frames_per_send"] for r in runs) if who in ("combd", "base") else None
        print(f"| {who} | {f} | {med(fps):,.0f} ({', '.join(f'{x:,.0f}' for x in fps)}) "
              f"| {med(r['calls_ok'] for r in runs):.0f} | {med(r['frames_missing'] for r in runs):,.0f} "
              f"| {'–' if per_send is None else f'{per_send:.1f}'} | {med(r['node_cpu_percent'] for r in runs):.1f} "
              f"| {gen:.1f}{' ⚠' if gen > 90 else ''} |")
PY
