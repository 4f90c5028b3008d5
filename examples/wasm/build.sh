#!/bin/sh
# Builds the example modules: examples/wasm/<app>.c -> examples/wasm/apps/<app>-wasm.wasm,
# with Debian's clang and wasi-libc:
#   apt-get install clang-14 lld-14 wasi-libc libclang-rt-14-dev-wasm32
# Each is a WASI "reactor" (no main; exports called by the node) and is named <app>-wasm so it
# does not clash with the native app of the same name.
set -eu
cd "$(dirname "$0")"
CC=${CC:-clang-14}
LD=${LD:-$(command -v wasm-ld-14 || command -v wasm-ld)}
mkdir -p apps
for src in counter.c million.c; do
    app=${src%.c}
    "$CC" --target=wasm32-wasi -O2 -Wall -Werror -mexec-model=reactor -fuse-ld="$LD" \
        -Wl,--strip-all -o "apps/$app-wasm.wasm" "$src"
    echo "apps/$app-wasm.wasm: $(wc -c < "apps/$app-wasm.wasm") bytes"
done
