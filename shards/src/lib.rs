//! # combd-shards
//!
//! The serving half of combd: one **shard** per core, each a glommio executor (io_uring)
//! pinned to its CPU, sharing nothing on the hot path.
//!
//! - [`node`] binds every shard's listeners (the public address with `SO_REUSEPORT`, so the
//!   kernel spreads connections over the shards, and `127.0.0.1` on the same port: the
//!   localhost listener, which serves `/stats` and `/metrics`), starts the shards, and drains
//!   them on shutdown.
//! - `shard` runs the accept loops and a housekeeping tick; `conn` serves one connection: the
//!   HTTP/1.1 loop (keep-alive, pipelining, the limits of [`combd_kernel::limits`] and the
//!   timeouts of the settings), then the WebSocket loop after an upgrade.
//! - [`http`] and [`ws`] are the framing, as pure functions over byte slices.
//! - [`app`] is the interface to the node's built-in apps, reached at `/o/<app>/<name>`.
//! - [`stats`] holds each shard's counters and renders `/stats` and `/metrics`.
//!
//! An idle connection costs a task, a readiness poll and no buffers: reads go into one scratch
//! buffer per shard, and a connection keeps only the bytes of an incomplete request or frame.

pub mod admission;
pub mod alloc;
pub mod app;
pub mod cells;
mod conn;
mod fifo;
pub mod http;
pub mod node;
mod shard;
pub mod stats;
pub mod tls;
pub mod ws;

pub use node::{DrainHandle, Node, NodeConfig, NodeShared};
