//! # combd-shards
//!
//! The serving half of combd: one **shard** per core, each a glommio executor (io_uring)
//! pinned to its CPU, sharing nothing on the hot path. Its public API is small: the app
//! interface ([`app`], with [`http::Response`]), starting and draining a node ([`Node`],
//! [`DrainHandle`], [`NodeShared`] for the coordinator), TLS ([`tls`]), the counting allocator
//! ([`alloc`]), and the pure codecs the fuzz targets drive ([`http`], [`ws`]).
//!
//! ## The modules, bottom to top
//!
//! Imports go one way, from each layer to the ones below it: `tests/modules.rs` fails on a
//! circle between two files and on one between two of these modules (each with every file
//! under it).
//!
//! 1. **Leaves**, each on its own: the connections of each client address ([`addresses`]), the
//!    published admission state ([`admission`]), the counting allocator ([`alloc`]), work done
//!    when a scope ends (`defer`), an object's home shard ([`home`]), an object's key
//!    ([`object_key`]), the fair line behind the slot caps (`line`), what an app's SQL may do
//!    (`sandbox`), the counters and their two renderings ([`stats`]), the test suite's
//!    switches, none in a release build (`testing`), TLS configuration and streams ([`tls`]),
//!    and the WebSocket frame codec with the numbered sessions' wire format ([`ws`]).
//! 2. The alarm index and the node's tables in an object's database ([`alarms`]), tokens and
//!    the verified client ([`auth`]), the pools with a share per client ([`fair`]), and the
//!    typed limits a call can trip ([`limit`]).
//! 3. The HTTP/1.1 head parser and response writer ([`http`]); a connection's input held
//!    against its shard's inbound budget (`inbound`).
//! 4. The app interface and the registry of apps ([`app`], which each shard reads from its own
//!    copy); the access log ([`access_log`]).
//! 5. What reaches a cell (`job`: a job, and the messages between shards), each app's count
//!    of object databases (`object_counts`), and the fleet's side in a node ([`fleet`]).
//! 6. **Node-wide state** (`shared`): settings, apps, every shard's stats, the admission state,
//!    the connection count, the pools, the shards' inboxes and wake sockets, the drain flag.
//! 7. **A shard's own state** (`state`): waker slots (each with the deadline of its wait, on
//!    the shard's clock read once a tick, so no request reads a clock or arms a timer), the
//!    scratch buffer, the task gate, the wake queue (awake and restore slots), the blocking
//!    threads' line, connection slots (reserve → open → release once), the per-turn budget,
//!    outbound bytes, the ping epoch.
//! 8. **Cells** (`cells`): sessions (each session's outbound side is its `SessionOut`),
//!    objects (their task, their calls under limits, their commit task, their SQLite store,
//!    each topic's log of its broadcasts),
//!    alarms and messages fired, and routing between shards and to other nodes.
//! 9. **Connections** (`conn`): an I/O core (`Conn`) and the protocols that borrow it in turn,
//!    the HTTP loop with its router and upgrade (`HttpConn`), then the WebSocket loop that owns
//!    its session (`WsConn`); the TLS hand-off, a WebSocket passed through to another node, the
//!    late refusal. A connection reaches cells only by submitting a job and through its
//!    session.
//! 10. **The run loop** (`shard`): listeners, the accept loop (the only place that spawns
//!     connection tasks), admission applied to the listeners, the inbox, the housekeeping
//!     tick.
//! 11. **Node start and drain** ([`node`]).
//!
//! `docs/ARCHITECTURE.md` has the same map for the whole workspace.
//!
//! ## A request, a message, a refusal
//!
//! - *A request*: the shard's accept loop reserves a connection slot, builds the connection
//!   and spawns `conn::serve` (or `conn::serve_tls`); the HTTP loop reads a head into the
//!   shard's scratch buffer, keeping only the bytes of an incomplete request, and parses it
//!   once; the route table answers it (written without `fmt`), calls a stateless app in
//!   place, or submits a job to the object's mailbox, on its home shard (through that shard's
//!   inbox if it is another). The object's task takes a batch under an awake slot, runs it in
//!   one transaction on a blocking thread and hands it to the object's commit task, which
//!   replies once a WAL sync that began after the commit returned (the next batch runs
//!   meanwhile).
//! - *A message*: a session's WebSocket frame becomes a job like a request. What the object
//!   sends or broadcasts after its commit goes to session mailboxes: a broadcast crosses to
//!   each other shard once and fans out there, a bounded number of deliveries a turn, a run
//!   of broadcasts viewer by viewer. Each session's outbound side is one
//!   `cells::session::SessionOut`, shared by its topic's list and its connection: the fan-out
//!   writes a waiting viewer's frames itself in one send, else queues them and wakes the
//!   connection, which waits for an awake slot, then writes all its mail in one send
//!   (`ws_sends` beside `ws_messages_out` in the stats).
//! - *A refusal*: the coordinator (in the `combd` crate) publishes "full"; each shard stops
//!   its public listeners (answering its accept queue first), so the kernel refuses at TCP.
//!   Inside a shard a full mailbox answers 503 at once, a slow reader or a spent outbound
//!   budget closes its session, and a tripped limit fails its call and rolls it back.
//!
//! ## Changes from the design
//!
//! - Each shard has one bounded inbox (MPMC) rather than a channel per pair of shards.
//! - An object's task is spawned by `cells` (through the shard's gate, so the drain waits for
//!   it) when its first mail arrives, not by the run loop: an object is born from a job, which
//!   only cells see. Connection tasks are spawned only by the run loop.
//! - The wake queue tells the run loop to re-apply admission through a signal in the shard's
//!   state, instead of calling up into the listeners.

pub mod access_log;
pub mod addresses;
pub mod admission;
pub mod alarms;
pub mod alloc;
pub mod app;
pub mod auth;
pub mod backup;
mod cells;
mod conn;
mod defer;
pub mod fair;
pub mod fleet;
pub mod home;
pub mod http;
mod inbound;
mod inspect;
mod job;
pub mod limit;
mod line;
mod live_objects;
pub mod node;
mod object_counts;
mod object_files;
pub mod object_key;
mod sandbox;
mod shard;
mod shared;
mod state;
pub mod stats;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(not(feature = "testing"))]
mod testing;
pub mod tls;
pub mod users;
pub mod ws;

pub use node::{DrainHandle, Node, NodeConfig, StartError};

pub use shared::NodeShared;
