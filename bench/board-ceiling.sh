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
      echo "== round $round, $rate clicks/s on $who" >&2
      measure "$who" "$dir/$who-$rate-$round.json" "$dir/generator.log" click --conns $conns \
        --interval-ms $(( conns * 1000 / rate )) --duration-s "${DURATION:-20}" --board heavy4k
    done
  done
done

bench/board_ceiling.py "$dir" $rates
