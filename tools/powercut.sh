#!/usr/bin/env bash
# Simulated power cuts under counter load (tests/powercut.rs), many times over: N cuts
# (default 1000) with COMBD_SQLITE_SYNC=full, where every answered write must survive and every
# image pass `PRAGMA integrity_check`; then the two broken orders the test must catch
# (answering before the sync; `normal`, which never syncs before answering), N cuts each,
# counting the cuts that caught them.
# Usage: tools/powercut.sh [N]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000}
POWERCUT_ALL=1 POWERCUT_CUTS=$n cargo test --release --locked --test powercut -- --nocapture --test-threads 1 2>&1 \
  | grep -E '^(full|answer-first|normal): |^test |test result'
