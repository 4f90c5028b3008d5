//! # combd
//!
//! The node's binary and what it is built from here. This library has two modules:
//!
//! - [`apps`]: the built-in apps, each an implementation of `combd_shards::app::App`,
//!   registered by name at start-up: `echo`, `counter`, `million`, `chat` and `reminder`, and
//!   the test apps (`fanout`, `hold`, `limits`, `stall`, `whoami`, `caller`, `alarmer`,
//!   `bank`) served only with `COMBD_TEST_APPS=on`.
//! - [`fuzz`]: one entry point per input format the node parses from outside (HTTP heads,
//!   WebSocket frames, settings, `/proc` files, object names, the million app's messages, a
//!   module's host imports), shared by the fuzz targets and the corpus tests that replay them.
//!
//! The binary (`src/main.rs`) sits on top of `combd-shards`, which does all the serving, and
//! `combd-wasm`, which loads the apps deployed as WebAssembly modules. `main` parses the
//! settings (`combd_kernel::settings`), finds the memory budget, starts a
//! `combd_shards::Node` with these apps and the modules, and maps every failure to one exit
//! status (78 for a setting, 70 for anything else). Beside the shards it runs the
//! `coordinator`, which measures memory, disk and connections, decides with
//! `combd_kernel::admission` whether the node is full, and publishes that to the shards, and a
//! thread for signals (drain on SIGTERM and SIGINT; on SIGHUP reload TLS, the token key and the
//! modules, and reopen the access log). `notify` speaks systemd's notify protocol (ready,
//! stopping, watchdog); `top` is the `combd top` subcommand, a live view of the localhost
//! `/stats`; `token` the `combd token` subcommand; `check` is `--check-config`. Dependencies run
//! one way: `combd-kernel` ← `combd-fleet` ← `combd-shards` ← `combd-wasm` ← this crate
//! (`docs/ARCHITECTURE.md`).
//!
//! No `unsafe` code here but one `pre_exec` hook in [`fuzz`] (allowed where it stands, with
//! its invariant); the system calls go through `nix`.

#![deny(unsafe_code)]

pub mod apps;
pub mod fuzz;
