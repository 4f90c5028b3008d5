#!/bin/sh
# Builds the Rust example modules with the guest crate (guest/, combd-guest):
# examples/wasm/<app>.rs -> examples/wasm/apps/<app>.wasm, for wasm32-unknown-unknown; the
# sources named (default: all of them). With Debian's rustc (1.63) and its wasm32 standard
# library:
#   apt-get install rustc libstd-rust-dev-wasm32 lld-14
# or with rustup's (`rustup target add wasm32-unknown-unknown`, which links by itself):
#   RUSTC=rustc examples/wasm/build-rust.sh lobby-rs.rs
# million-rs.wasm was built with Debian's, lobby-rs.wasm with rustup's 1.95.
set -eu
cd "$(dirname "$0")"
RUSTC=${RUSTC:-/usr/bin/rustc}
# Debian's rustc links with wasm-ld; rustup's brings its own linker.
LD=${LD:-$(command -v wasm-ld-14 || command -v wasm-ld || true)}
link() {
    if [ -n "$LD" ]; then echo "-C linker=$LD -C linker-flavor=wasm-ld"; fi
}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$RUSTC" --edition 2021 --crate-type rlib --crate-name combd_guest -C opt-level=2 \
    --target wasm32-unknown-unknown ../../guest/src/lib.rs -o "$out/libcombd_guest.rlib"
mkdir -p apps
[ $# -gt 0 ] || set -- million-rs.rs lobby-rs.rs
for src in "$@"; do
    app=${src%.rs}
    "$RUSTC" --edition 2021 --crate-type cdylib --crate-name "$(echo "$app" | tr - _)" \
        -C opt-level=2 -C panic=abort -C link-arg=--strip-all --target wasm32-unknown-unknown \
        $(link) \
        --extern combd_guest="$out/libcombd_guest.rlib" -L "$out" "$src" -o "apps/$app.wasm"
    echo "apps/$app.wasm: $(wc -c < "apps/$app.wasm") bytes"
done
