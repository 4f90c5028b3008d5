//! Every fixed bound of the node, declared once.
//!
//! Each constant says what it bounds, why it has its value, and what it costs. Bounds that an
//! operator may want to move are settings instead (see [`crate::settings`]); their defaults
//! live here too, so the two never drift apart.

use std::time::Duration;

/// Largest request head (request line and headers) the node reads, in bytes. Past it the
/// request gets `431` and the connection closes. 16 KiB holds any browser's cookies and
/// headers; it is also the most a connection can make the node buffer before a body starts.
pub const HEADER_SECTION_MAX_BYTES: usize = 16 * 1024;

/// Most header fields in one request. httparse parses into a fixed array of this many
/// entries (16 bytes each on the stack). Past it: `431`.
pub const HEADER_COUNT_MAX: usize = 64;

/// Read scratch buffer, one per shard. Connections read into it and keep only the bytes of a
/// partial request or frame, so an idle connection holds no read buffer at all.
pub const READ_SCRATCH_BYTES: usize = 64 * 1024;

/// Listen backlog of every listener socket (the kernel caps it at `net.core.somaxconn`).
/// Connections the kernel completed wait here until a shard accepts them.
pub const LISTEN_BACKLOG: i32 = 4096;

/// File descriptors held back from `COMBD_MAX_CONNS`: listeners, io_uring rings, eventfds,
/// log and database files. The connection cap is clamped to `RLIMIT_NOFILE` less this, so
/// accept never fails with `EMFILE`.
pub const FD_RESERVE: u64 = 256;

/// How long a close the node starts (a WebSocket close, or an HTTP `connection: close`) reads and
/// discards what the client still sends, waiting for its close frame or EOF,
/// before the socket is dropped. Closing with unread bytes makes the kernel send a reset, which
/// can destroy the response or close frame still unread on the client's side.
pub const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// A write that makes no progress for this long fails and the connection closes: a client
/// that stops reading cannot pin a task and its buffers forever.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest payload of a WebSocket control frame (RFC 6455, 5.5).
pub const WS_CONTROL_PAYLOAD_MAX_BYTES: u64 = 125;

/// Longest object name in `/o/<app>/<name>`, in bytes. Names are also restricted to
/// `[A-Za-z0-9_.-]` and may not start with a dot, so a name is always one safe path component.
pub const OBJECT_NAME_MAX_BYTES: usize = 64;

/// How often each shard's housekeeping tick runs: it notices a node-wide drain and, in later
/// issues, measures the shard's lag.
pub const SHARD_TICK: Duration = Duration::from_millis(100);

/// Default of `COMBD_LISTEN`.
pub const LISTEN_DEFAULT: &str = "0.0.0.0:8080";
/// Default of `COMBD_DATA`.
pub const DATA_DEFAULT: &str = "./data";
/// Default of `COMBD_LOG`.
pub const LOG_DEFAULT: &str = "info";
/// Default of `COMBD_MAX_BODY`: 1 MiB. A request body is buffered whole before its handler runs.
pub const MAX_BODY_DEFAULT_BYTES: u64 = 1024 * 1024;
/// Default of `COMBD_HEADER_TIMEOUT`: a request head must be complete this long after its first
/// byte (for a new connection: after accept). Slowloris protection.
pub const HEADER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default of `COMBD_BODY_TIMEOUT`: a body must be complete this long after its head.
pub const BODY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default of `COMBD_IDLE_TIMEOUT`: an HTTP keep-alive connection with no request in progress is
/// closed after this long. WebSockets are not subject to it.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// Default of `COMBD_WS_MAX_MESSAGE`: 1 MiB, a reassembled WebSocket message; past it, close 1009.
pub const WS_MAX_MESSAGE_DEFAULT_BYTES: u64 = 1024 * 1024;
/// Default of `COMBD_SHUTDOWN_TIMEOUT`: how long a drain waits for in-flight work.
pub const SHUTDOWN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default of `COMBD_MAX_CONNS`, from the seed: 200,000 open connections.
pub const MAX_CONNS_DEFAULT: u64 = 200_000;

/// Memory each shard's io_uring reserves for registered (DMA) buffers. combd does network I/O
/// through readiness and its own scratch buffer, so it needs little; glommio's default (10 MiB)
/// would exceed a default `RLIMIT_MEMLOCK` with two shards.
pub const SHARD_IO_MEMORY_BYTES: usize = 1 << 20;

/// Bytes of responses a connection accumulates from pipelined requests before writing them.
pub const PIPELINE_FLUSH_BYTES: usize = 64 * 1024;

/// Default mailbox of an object (an app may set its own): inputs waiting behind the one being
/// handled. Past it an input is refused at once with 503 `overloaded`.
pub const MAILBOX_DEFAULT: usize = 1000;
/// Default batch of an app that handles batches: inputs taken at once into one transaction.
pub const BATCH_DEFAULT: usize = 100;
/// A session's mailbox: messages waiting to be written to its WebSocket.
pub const SESSION_MAILBOX: usize = 1000;
/// A session's mailbox while its shard is behind: what does not fit is dropped and counted.
pub const SESSION_MAILBOX_BEHIND: usize = 8;
/// An idle object is closed after this long...
pub const OBJECT_IDLE: Duration = Duration::from_secs(1);
/// ...or after this long while memory pressure is 1 or more, so it is not let go while its
/// neighbours are still coming back.
pub const OBJECT_IDLE_UNDER_PRESSURE: Duration = Duration::from_secs(10);
/// Messages waiting in a shard's inbox from the other shards. Past it a cross-shard request
/// is refused (503 `overloaded`) and a delivery dropped and counted.
pub const CROSS_SHARD_QUEUE: usize = 16 * 1024;
/// Default of `COMBD_MAX_AWAKE`, from the seed: cells at work at once per shard.
pub const MAX_AWAKE_DEFAULT: usize = 1000;
/// Default of `COMBD_RESTORES_AT_ONCE`, from the seed: objects opened at once per shard.
pub const RESTORES_AT_ONCE_DEFAULT: usize = 4;
/// Threads per shard that run SQLite (opening databases, transactions, fsync) off the event
/// loop. More than one, so a slow transaction of one object does not hold up the restores and
/// transactions of the others; the awake cap bounds how many cells use them at once.
pub const BLOCKING_THREADS_PER_SHARD: usize = 4;

/// Default of `COMBD_CPU_LIMIT_TICKS`, from the seed: one call of a cell is killed after this
/// many ticks (`cx.tick()` in an app's loops; every host call counts [`HOST_CALL_TICKS`]).
pub const CPU_LIMIT_TICKS_DEFAULT: u64 = 100_000_000;
/// Ticks a host call (SQL handle, send, broadcast, log) counts.
pub const HOST_CALL_TICKS: u64 = 1_000;
/// A request's host calls (SQL, sends) may take this long in all; past it the call is killed
/// with `host_time`.
pub const HOST_TIME_LIMIT: Duration = Duration::from_secs(1);
/// One SQL statement may run this long; past it SQLite is interrupted (`sql_timeout`).
pub const SQL_STATEMENT_LIMIT: Duration = Duration::from_millis(100);
/// SQLite VM steps between checks of the two time limits above.
pub const SQL_PROGRESS_STEPS: i32 = 1_000;
/// Largest SQL value (string or blob), `SQLITE_LIMIT_LENGTH`: past it `too_big`.
pub const SQL_VALUE_MAX_BYTES: i32 = 2 * 1024 * 1024;
/// Default of `COMBD_DB_MAX`, from the seed: the largest object database; past it writes fail
/// with `db_full`.
pub const DB_MAX_BYTES: u64 = 1 << 30;
/// A request's log output kept; past it lines are dropped and one marker says so.
pub const LOG_MAX_BYTES: usize = 64 * 1024;
/// WebSocket messages and sends one request may queue in all; past it a send fails with
/// `send_limit`.
pub const SENDS_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// A call that takes longer than this is counted in `slow_calls`.
pub const SLOW_CALL: Duration = Duration::from_millis(10);
/// A WebSocket client with this many bytes waiting for it (queued in its session mailbox and
/// not yet taken by the kernel) is closed: it reads too slowly (`ws_slow_closed`).
pub const WS_SLOW_CLOSE_BYTES: u64 = 8 * 1024 * 1024;
/// Default of `COMBD_WS_RATE`: WebSocket messages per second per connection (token refill),
/// from the ULDA seed's per-decoder bucket.
pub const WS_RATE_DEFAULT: u64 = 1000;
/// Default of `COMBD_WS_BURST`: the token bucket's capacity. Past it: close 1008.
pub const WS_BURST_DEFAULT: u64 = 2000;
/// Longest request target (path and query); past it `414`.
pub const URL_MAX_BYTES: usize = 8 * 1024;

/// Default of `COMBD_TLS_HANDSHAKE_TIMEOUT`.
pub const TLS_HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// TLS handshakes in progress per shard. A handshake is CPU work done on the shard's loop; past
/// this many at once a new TLS connection is closed at once (`tls_handshakes_refused`).
pub const TLS_HANDSHAKES_MAX: usize = 256;

/// Default of `COMBD_WS_PING_INTERVAL`.
pub const WS_PING_INTERVAL_DEFAULT: Duration = Duration::from_secs(30);
/// TCP keepalive on every accepted connection, so the kernel finds half-open connections (a
/// peer that vanished without a FIN) on its own: first probe after this much silence...
pub const TCP_KEEPIDLE_SECS: i32 = 60;
/// ...then a probe this often...
pub const TCP_KEEPINTVL_SECS: i32 = 10;
/// ...and the connection is reset after this many unanswered probes.
pub const TCP_KEEPCNT: i32 = 3;
