#!/usr/bin/env bash
# The million app deployed as a module against the native million, on the emulated droplet
# (bench/scenario.sh), and a neighbour's click echo while a module spins to its CPU limit.
# Usage: tools/quiet bench/wasm.sh click|heavy|spin
#   click: 5,000 viewers, a click every 10 s each, 30 s, native then module
#   heavy: 2,000 viewers, a click every 1 s each, 30 s, native then module
#   spin:  the click profile on the native million while tests/wasm/probe.wat spins on the same
#          shard, call after call, each killed at COMBD_CPU_LIMIT_TICKS (default 100,000,000)
# Writes bench/out/wasm-*.json.
set -euo pipefail
cd "$(dirname "$0")/.."
apps=$(mktemp -d)
spinner=
trap 'rm -rf "$apps"; [ -n "$spinner" ] && kill "$spinner" 2>/dev/null || true' EXIT
cp examples/wasm/apps/million-wasm.wasm tests/wasm/probe.wat "$apps/"
export NODE_ENV="COMBD_APPS_DIR=$apps ${NODE_ENV:-}"
port=${PORT:-18082}
case ${1:-} in
click)
    bench/scenario.sh click wasm-native-click --conns 5000 --interval-ms 10000 --duration-s 30 --board click --app million
    bench/scenario.sh click wasm-module-click --conns 5000 --interval-ms 10000 --duration-s 30 --board click --app million-wasm
    ;;
heavy)
    bench/scenario.sh click wasm-native-heavy --conns 2000 --interval-ms 1000 --duration-s 30 --board heavy --app million
    bench/scenario.sh click wasm-module-heavy --conns 2000 --interval-ms 1000 --duration-s 30 --board heavy --app million-wasm
    ;;
spin)
    count=$apps/spins
    # The spinner: one call at a time, on the generator's CPU; refused until the node is up.
    taskset -c 1 bash -c "n=0; while :; do
        if curl -s -o /dev/null -X POST --data s http://127.0.0.1:$port/o/probe/spin; then
            n=\$((n+1)); echo \$n > $count; else sleep 0.05; fi; done" &
    spinner=$!
    bench/scenario.sh click wasm-neighbour-spin --conns 5000 --interval-ms 10000 --duration-s 30 --board click --app million
    echo "spinning calls answered: $(cat "$count" 2>/dev/null || echo 0)"
    ;;
*)
    echo "usage: bench/wasm.sh click|heavy|spin" >&2
    exit 2
    ;;
esac
