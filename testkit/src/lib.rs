//! # combd-testkit
//!
//! What combd's tests, fuzz targets and benchmarks run against a node, and a user never does.
//! The `combd` binary does not link this crate; the root package's second binary,
//! `combd-test-node` (`src/bin/combd-test-node.rs`), is the same node with [`apps::register`]
//! adding the test apps. Three modules:
//!
//! - [`apps`]: the test apps, each an implementation of `combd_shards::app::App` that crosses
//!   one of the node's limits or paths on purpose: `fanout` (N frames to K topics in one
//!   broadcast: the fan-out benchmark's app), `hold` (a request that holds its object),
//!   `limits` (a call past its memory, SQL or time limits), `stall` (a stateless app that
//!   holds the shard's loop), `whoami` (an identified app), `caller` (what an app is told of
//!   its caller), `alarmer` (alarms) and `bank` (messages between objects).
//! - [`launch`]: the one way a node under test is started, spawned and waited for: the
//!   integration tests' `TestNode` (`tests/support/`) and the fuzz harness's node both start
//!   theirs here.
//! - [`fuzz`]: one entry point per input format the node parses from outside (HTTP heads,
//!   WebSocket frames, settings, `/proc` files, object names, a module's host imports, scripts
//!   of clients), shared by the fuzz targets (`fuzz/`) and the corpus tests that replay them
//!   (`tests/fuzz_corpus.rs`, `tests/http_conn_fuzz.rs`, `tests/host_imports_fuzz.rs`); the
//!   two that play scripts against a real node do it through [`fuzz::node`].
//!
//! It uses `combd-kernel` and `combd-shards` and never `combd` (which depends on it, for
//! `combd-test-node` alone). No `unsafe` code here but one `pre_exec` hook in [`launch`]
//! (allowed where it stands, with its invariant); the system calls go through `nix`.

#![deny(unsafe_code)]

pub mod apps;
pub mod fuzz;
pub mod launch;
