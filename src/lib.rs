//! # combd
//!
//! The node's binary and what it is built from here. The library's two public modules:
//!
//! - [`apps`]: the built-in apps, each an implementation of `combd_shards::app::App`,
//!   registered by name at start-up: `echo`, `counter`, `million`, `chat` and `reminder`. These
//!   are all the `combd` binary serves besides the modules deployed in `COMBD_APPS_DIR`.
//! - [`serve`]: everything the binary does. [`serve::main`] parses the settings
//!   (`combd_kernel::settings`), finds the memory budget, starts a `combd_shards::Node` with
//!   these apps, those its caller adds, and the modules, and maps every failure to one exit
//!   status (78 for a setting, 70 for anything else; `failure`). Beside the shards it runs the
//!   `coordinator`, which measures memory, disk and connections, decides with
//!   `combd_kernel::admission` whether the node is full, and publishes that to the shards, and
//!   a thread for signals (drain on SIGTERM and SIGINT; on SIGHUP reload TLS, the token key and
//!   the modules, and reopen the access log). `notify` speaks systemd's notify protocol
//!   (ready, stopping, watchdog); `top` is the `combd top` subcommand, a live view of the
//!   localhost `/stats`; `objects` the `combd objects` subcommand over the localhost
//!   `/objects`; `token` the `combd token` subcommand; `check` is `--check-config`.
//!
//! The package has two binaries, each a few lines calling [`serve::main`]: `combd`
//! (`src/main.rs`) adds nothing, and `combd-test-node` (`src/bin/combd-test-node.rs`) adds the
//! test apps of `combd-testkit` (`testkit/`), which also holds the fuzz harness and the
//! launcher the tests start nodes with. Only `combd-test-node` links the test kit; the
//! library never uses it. Dependencies run one way: `combd-kernel` ← `combd-fleet` ←
//! `combd-shards` ← `combd-wasm` ← this crate (`docs/ARCHITECTURE.md`).
//!
//! No `unsafe` code here; the system calls go through `nix`.

#![forbid(unsafe_code)]

pub mod apps;
mod check;
mod coordinator;
mod failure;
mod new;
mod notify;
mod objects;
mod restore;
pub mod serve;
mod token;
mod top;
