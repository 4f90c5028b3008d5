#!/usr/bin/env bash
# Runs every fuzz target for a set time, two at a time, and prints each one's executions and
# findings. New corpus entries go to fuzz/work/<target> (not committed); a crash is saved
# under fuzz/artifacts/<target> and fails the script.
# Usage: tools/fuzz.sh [SECONDS_PER_TARGET]   (default 600)
# Needs cargo-fuzz (cargo install cargo-fuzz); RUSTC_BOOTSTRAP=1 lets the stable toolchain
# build with the sanitizer flags cargo-fuzz passes. http_conn and host_imports play their scripts
# against a real node: the release combd-test-node (the node and the test apps, which http_conn
# uses), built first (COMBD_BIN names it).
set -uo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
targets=(http_head ws_frames settings_text proc_files object_name million_messages http_conn host_imports)
export RUSTC_BOOTSTRAP=1
cargo fuzz build -O >&2 || exit 1
cargo build --release --bin combd-test-node >&2 || exit 1
export COMBD_BIN="${CARGO_TARGET_DIR:-$PWD/target}/release/combd-test-node"
mkdir -p fuzz/work
run() {
  local t=$1
  mkdir -p "fuzz/work/$t"
  cargo fuzz run -O "$t" "fuzz/work/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$secs" -print_final_stats=1 -rss_limit_mb=2048 > "fuzz/work/$t.log" 2>&1
  echo $? > "fuzz/work/$t.rc"
}
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  run "${targets[i]}" &
  [ $((i + 1)) -lt ${#targets[@]} ] && run "${targets[i + 1]}" &
  wait
done
status=0
printf '%-18s %12s %10s %s\n' target executions exec/s result
for t in "${targets[@]}"; do
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "fuzz/work/$t.log" | grep -o '[0-9]*$' | tail -1)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "fuzz/work/$t.log" | grep -o '[0-9]*$' | tail -1)
  rc=$(cat "fuzz/work/$t.rc")
  if [ "$rc" = 0 ]; then result="no crash in ${secs}s"; else result="FAILED (see fuzz/work/$t.log)"; status=1; fi
  printf '%-18s %12s %10s %s\n' "$t" "${execs:-?}" "${rate:-?}" "$result"
done
exit $status
