#!/bin/sh
# Builds the Rust example modules with the guest crate (guest/, combd-guest): 
# examples/wasm/<app>.rs -> examples/wasm/apps/<app>.wasm, for wasm32-unknown-unknown, with
# Debian's rustc (1.63) and its wasm32 standard library (the rustup toolchain here cannot add
# the target offline):
#   apt-get install rustc libstd-rust-dev-wasm32 lld-14
set -eu
cd "$(dirname "$0")"
RUSTC=${RUSTC:-/usr/bin/rustc}
LD=${LD:-$(command -v wasm-ld-14 || command -v wasm-ld || command -v rust-lld)}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$RUSTC" --edition 2021 --crate-type rlib --crate-name combd_guest -C opt-level=2 \
    --target wasm32-unknown-unknown ../../guest/src/lib.rs -o "$out/libcombd_guest.rlib"
mkdir -p apps
for src in million-rs.rs; do
    app=${src%.rs}
    "$RUSTC" --edition 2021 --crate-type cdylib --crate-name "$(echo "$app" | tr - _)" \
        -C opt-level=2 -C panic=abort -C link-arg=--strip-all --target wasm32-unknown-unknown \
        -C linker="$LD" -C linker-flavor=wasm-ld \
        --extern combd_guest="$out/libcombd_guest.rlib" -L "$out" "$src" -o "apps/$app.wasm"
    echo "apps/$app.wasm: $(wc -c < "apps/$app.wasm") bytes"
done
