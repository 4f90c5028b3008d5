#!/usr/bin/env bash
# Runs the kill -9 crash test N times (default 20) and counts passes and failures.
# Usage: tools/crash-loop.sh [N]
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
cargo test --release --test crash --no-run >&2 || exit 1
pass=0; fail=0
for i in $(seq "$n"); do
  if cargo test --release --test crash -- --exact acknowledged_writes_survive_kill_9 >/dev/null 2>&1; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1)); echo "run $i failed" >&2
  fi
done
echo "crash loop: $pass passed, $fail failed"
[ "$fail" = 0 ]
