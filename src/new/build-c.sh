#!/bin/sh
# Builds the module __NAME__ with clang and wasi-libc (Debian: apt-get install clang-14 lld-14
# wasi-libc libclang-rt-14-dev-wasm32) into apps/__NAME__.wasm, where the node reads it
# (COMBD_APPS_DIR=apps).
set -eu
cd "$(dirname "$0")"
CC=${CC:-$(command -v clang-14 || command -v clang)}
LD=${LD:-$(command -v wasm-ld-14 || command -v wasm-ld)}
mkdir -p apps
"$CC" --target=wasm32-wasi -O2 -Wall -Werror -mexec-model=reactor -fuse-ld="$LD" \
    -Wl,--strip-all -o apps/__NAME__.wasm __NAME__.c
echo "apps/__NAME__.wasm: $(wc -c < apps/__NAME__.wasm) bytes"
