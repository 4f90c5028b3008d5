#!/usr/bin/env bash
# The board's ceiling: the most clicks a second one board takes with an echo p99 at most
# 100 ms and no click refused or lost, for combd (durable, its defaults) and uWebSockets.js (the
# board in memory), each on the emulated droplet (CPU 0, 1 GiB; bench/targets.sh) with
# `combd-bench click` on CPU 1. 4,000 viewers of one board (`--board heavy4k`, as bench/run's
# heavy 4,000), the rate set by each viewer's interval (4,000 viewers every 400 ms: 10,000 a
# second); the rates and targets alternate within a round.
# Usage: bench/board-ceiling.sh [RATE...]   (default 4000 5000 ... 12000)
# ROUNDS (default 3), DURATION seconds (20), TARGETS ("combd uws"), NODE_BIN, NO_BUILD=1.
# Writes bench/out/board-ceiling/<target>-<rate>-<round>.json and prints, per target and rate,
# the medians of the rounds and the ceiling (the highest rate at which it and every rate below
# it met the bound, in the medians). ~40 s a run: the defaults take about 25 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
rates=${*:-4000 5000 6000 7000 8000 9000 10000 11000 12000}
conns=4000
dir=bench/out/board-ceiling
(cd bench/peers/uws-million && npm install --no-audit --no-fund --silent >/dev/null)
[ -n "${NO_BUILD:-}" ] || cargo build --release -p combd -p combd-bench >&2
rm -rf "$dir" && mkdir -p "$dir"
. bench/targets.sh

for round in $(seq "${ROUNDS:-3}"); do
  for rate in $rates; do
    for who in ${TARGETS:-combd uws}; do
      start_target "$who"
      echo "== round $round, $rate clicks/s on $who" >&2
      taskset -c 1 target/release/combd-bench click --port $port --pid "$target_pid" \
        --conns $conns --interval-ms $(( conns * 1000 / rate )) --duration-s "${DURATION:-20}" \
        --board heavy4k --out "$dir/$who-$rate-$round.json" > /dev/null 2>> "$dir/generator.log"
      stop_target
    done
  done
done

python3 - "$dir" $rates <<'PY'
import json, glob, statistics, sys
dir, rates = sys.argv[1], [int(r) for r in sys.argv[2:]]
med = statistics.median
print("| target | clicks/s | echo p50 / p99 (ms) | refused or lost | node CPU % | generator CPU % | runs |")
print("|---|---|---|---|---|---|---|")
ceiling = {}
for who in sorted({f.split("/")[-1].split("-")[0] for f in glob.glob(f"{dir}/*.json")}):
    ok = True
    for rate in rates:
        runs = [json.load(open(f)) for f in sorted(glob.glob(f"{dir}/{who}-{rate}-*.json"))]
        if not runs:
            continue
        p50 = med(r["echo_p50_ms"] for r in runs)
        p99 = med(r["echo_p99_ms"] for r in runs)
        bad = [r["clicks_lost"] + (r.get("node_mailbox_refused") or 0) for r in runs]
        cpu = med(r["node_cpu_percent"] for r in runs)
        gen = med(r["generator_cpu_percent"] for r in runs)
        sent = med(r["clicks_sent"] / r["duration_s"] for r in runs)
        ok = ok and p99 <= 100 and med(bad) == 0
        if ok:
            ceiling[who] = rate
        print(f"| {who} | {rate:,} ({sent:,.0f} sent) | {p50:.2f} / {p99:.1f} | {med(bad):,.0f} "
              f"({', '.join(str(b) for b in bad)}) | {cpu:.1f} | {gen:.1f}{' ⚠' if gen > 90 else ''} | {len(runs)} |")
print()
for who in sorted({f.split("/")[-1].split("-")[0] for f in glob.glob(f"{dir}/*.json")}):
    if who in ceiling:
        print(f"{who}: the board's ceiling is at least {ceiling[who]:,} clicks a second (p99 ≤ 100 ms, none refused or lost)")
    else:
        print(f"{who}: below {rates[0]:,} clicks a second, the lowest rate run")
PY
