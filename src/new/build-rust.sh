#!/bin/sh
# Builds the module __NAME__ with stable Rust (rustup target add wasm32-unknown-unknown) into
# apps/__NAME__.wasm, where the node reads it (COMBD_APPS_DIR=apps).
set -eu
cd "$(dirname "$0")"
cargo build --release --target wasm32-unknown-unknown "$@"
mkdir -p apps
cp target/wasm32-unknown-unknown/release/__CRATE__.wasm apps/__NAME__.wasm
echo "apps/__NAME__.wasm: $(wc -c < apps/__NAME__.wasm) bytes"
