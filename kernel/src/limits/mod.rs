//! Every fixed bound of the node, declared once.
//!
//! Each constant says what it bounds, why it has its value, and, where it holds memory, what it
//! costs. Bounds that an operator may want to move are settings instead (see
//! [`crate::settings`]); their defaults live here too, so the two never drift apart (the
//! settings' unit tests check every parsed default against this file). The one limit derived
//! from the machine at start-up, the outbound budget, is computed by
//! [`outbound_budget_per_shard`]. Relations between limits that must hold are checked at compile
//! time at the end of this file: a change that breaks one does not build.

use std::time::Duration;

mod apps;
mod backup;
mod defaults;
mod fleet;
mod inspect;
mod logs;
mod table;

pub use apps::*;
pub use backup::*;
pub use defaults::*;
pub use fleet::*;
pub use inspect::*;
pub use logs::*;
pub use table::{Fixed, FIXED, SETTING_DEFAULTS};

// ---------------------------------------------------------------------------------------------
// HTTP and connections
// ---------------------------------------------------------------------------------------------

/// Largest request head (request line and headers) the node reads, in bytes. Past it the
/// request gets `431` and the connection closes. 16 KiB holds any browser's cookies and
/// headers; it is also the most a connection can make the node buffer before a body starts
/// (16 KiB per connection with a partial head).
pub const HEADER_SECTION_MAX_BYTES: usize = 16 * 1024;

/// Most header fields in one request. httparse parses into a fixed array of this many
/// entries (32 bytes each on 64-bit: 2 KiB on the stack per parse). Browsers send about twenty; 64
/// leaves room for what proxies add. Past it: `431`.
pub const HEADER_COUNT_MAX: usize = 64;

/// Longest request target (path and query); past it `414`. Half the head section, so a
/// maximal target still leaves room for the headers; 8 KiB is what common proxies accept.
pub const URL_MAX_BYTES: usize = 8 * 1024;

/// Most origins `COMBD_ALLOWED_ORIGINS` may list. A request with a foreign `Origin` is
/// compared with each of them, so the list stays short enough to walk per request; a longer
/// one is a sign of wanting `*`.
pub const ALLOWED_ORIGINS_MAX: usize = 64;

/// Longest `COMBD_AUTH_ISSUER` or `COMBD_AUTH_AUDIENCE`, and longest `sub` or `name` claim a
/// token may carry: what a session keeps of its client is bounded by it (two of them).
pub const AUTH_CLAIM_MAX_BYTES: usize = 256;

/// Longest token the node verifies (a header, a cookie or a subprotocol): past it the token is
/// refused unread. Within the head's 16 KiB; 4 KiB holds an RS256 token with its claims.
pub const AUTH_TOKEN_MAX_BYTES: usize = 4 * 1024;

/// Shortest HS256 secret the node takes: 32 bytes, the hash's width (RFC 7518, 3.2: a key of
/// the same size as the hash output or larger). A shorter one stops start-up.
pub const AUTH_HS256_SECRET_MIN_BYTES: usize = 32;

/// Largest key file: a PEM public key is a few hundred bytes, an RSA-4096 one under 1 KiB.
pub const AUTH_KEY_FILE_MAX_BYTES: usize = 64 * 1024;

/// Clock skew allowed on a token's `exp` and `nbf`, in seconds: the node's clock and the
/// issuer's may disagree by this much.
pub const AUTH_LEEWAY_SECONDS: u64 = 30;

/// Tokens a shard remembers as verified, and as many as refused, by their SHA-256 (never the
/// token): one seen again costs a lookup, not a signature check, until its `exp` (a refused one
/// until a key reload); past the bound the oldest is forgotten (`auth_cache_hits`,
/// `auth_cache_misses`). At most about 4 MiB a shard: a verified entry keeps a `sub` and a
/// `name` of up to [`AUTH_CLAIM_MAX_BYTES`] each, a refused one 96 bytes of why; the refused
/// half is apart, so bad tokens cannot push the good ones out.
pub const AUTH_TOKEN_CACHE_ENTRIES: usize = 4096;
/// Full token checks (a signature verified: a token its shard's cache does not know) one client
/// (an IPv4 address, an IPv6 /64) may make a shard do a second, and at once: an honest client's
/// token is checked once and then cached, so this only holds back a client sending a new token
/// with every request. An RSA check costs about 0.1 ms: 64 a second is under 1 % of a core.
pub const AUTH_VERIFY_RATE_PER_CLIENT: u64 = 64;
/// Clients a shard keeps a bucket of full checks for ([`AUTH_VERIFY_RATE_PER_CLIENT`]), about
/// 48 bytes each: past it the refilled buckets are forgotten, and a new client waits for one.
pub const AUTH_VERIFY_CLIENTS_MAX: usize = 4096;

/// Read scratch buffer, one per shard (64 KiB per shard in all). Connections read into it and
/// keep only the bytes of a partial request or frame, so an idle connection holds no read
/// buffer at all. 64 KiB takes a whole pipelined burst or a large frame in one read.
pub const READ_SCRATCH_BYTES: usize = 64 * 1024;

/// Bytes of responses one connection may hold: those answered from a pipelined burst and not
/// yet written, and those kept behind an object's answer still owed. Past it the connection
/// waits for the answers owed, writes everything, and only then answers its next request, so a
/// client that pipelines and never reads stops being served instead of making the node keep
/// its responses (20 such clients, each one 64 KiB write of page requests behind an object's,
/// took the node from 12 MB to 702 MB before this bound: 34 MB a connection). One write per
/// this many bytes, not one per response; costs up to 64 KiB (and the response that crossed it)
/// per connection answering a burst, nothing otherwise.
pub const PIPELINE_HELD_MAX_BYTES: usize = 64 * 1024;

/// A request still incomplete this long after it started (its head, or its body arriving in
/// small reads) is slow, and its connection is then read at most once a
/// [`SLOW_READ_INTERVAL`]. An honest head arrives in one segment and an honest upload in large
/// reads; a quarter second is many round trips on any link.
pub const SLOW_REQUEST_AFTER: Duration = Duration::from_millis(250);

/// How often a slow request's connection is read at most (between one and two intervals, each
/// connection at a phase of its own so that slow clients sending together are not read
/// together); what it sends meanwhile waits in the kernel's socket buffer, and the header and
/// body timeouts still bound the whole. 2,000 clients sending a header a byte every 100 ms cost
/// the shard 20,000 reads a second, in bursts of 2,000: an honest client's p99 beside them went
/// from 1.7 to 23 ms on one core. Paced, they cost under 2,000 reads a second, spread out.
pub const SLOW_READ_INTERVAL: Duration = Duration::from_secs(1);

/// A read of a body bringing fewer bytes than this, once the request is slow, paces the
/// connection (a body arriving in large reads is an upload, not a trickle).
pub const SLOW_READ_MIN_BYTES: usize = 4 * 1024;

/// Pipelined requests for objects one connection has at its objects at once: a burst of them
/// goes to the mailboxes together (one batch, not one batch a request), and the connection
/// waits for these answers before it sends more. 64 connections × 8 fit the default mailbox
/// (1,000), so a well-behaved pipelining client is never refused for its own depth. Costs a
/// reply channel (~100 bytes) per request in flight.
pub const HTTP_OBJECT_PIPELINE: usize = 8;

/// Listen backlog of every listener socket (the kernel caps it at `net.core.somaxconn`, whose
/// default is 4096 since Linux 5.4). Connections the kernel completed wait here until a shard
/// accepts them; each holds a socket in the kernel's memory, not the node's.
pub const LISTEN_BACKLOG: i32 = 4096;

/// File descriptors held back from `COMBD_MAX_CONNS`: listeners, io_uring rings, eventfds,
/// log and database files. The connection cap is clamped to `RLIMIT_NOFILE` less this, so
/// accept never fails with `EMFILE`.
pub const FD_RESERVE: u64 = 256;

/// Connections the localhost listener (127.0.0.1) holds at most, apart from the public cap:
/// the operator's own checks (`/stats`, `/healthz`, `combd top`, a monitoring agent) need a few
/// at a time, and a thousand leaves them room; one past it is closed at once
/// (`local_conns_refused`). Its descriptors are held back from `COMBD_MAX_CONNS` with
/// [`FD_RESERVE`], so the localhost listener can never make accept fail with `EMFILE`.
pub const LOCAL_CONNS_MAX: u64 = 1024;

/// Default of `COMBD_MAX_OPEN_OBJECTS`: live objects on the node at once (each holds up to
/// [`OBJECT_FDS`] descriptors, held back from `COMBD_MAX_CONNS` so that SQLite never fails
/// with `EMFILE` under a connection flood). An object is live while it has work and a second
/// after; a thousand objects busy within the same second is past what one node's syncs carry
/// (each batch one `fdatasync`), and costs 4,096 descriptors of the process's limit.
pub const MAX_OPEN_OBJECTS_DEFAULT: u64 = 1024;
/// Descriptors one live object holds: SQLite's three (its database, its WAL, and their shared
/// memory) and the node's own descriptor of the WAL while a sync of it waits.
pub const OBJECT_FDS: u64 = 4;

/// The `RLIMIT_NOFILE` soft limit assumed when the node cannot read or raise it: Linux's
/// default soft limit. The connection cap is then clamped to it less [`FD_RESERVE`].
pub const NOFILE_FALLBACK: u64 = 1024;

/// How long a close the node starts (a WebSocket close, or an HTTP `connection: close`) reads and
/// discards what the client still sends, waiting for its close frame or EOF,
/// before the socket is dropped. Closing with unread bytes makes the kernel send a reset, which
/// can destroy the response or close frame still unread on the client's side. Two seconds is
/// many round trips even on a mobile link, and bounds how long a closing connection is held.
pub const CLOSE_LINGER: Duration = Duration::from_secs(2);

/// Bytes a closing connection's linger reads and discards at most: what a client still had in
/// flight when the node closed (a pipelined request, a last frame) fits many times over, while
/// a client that keeps sending after the close (1 MB frames past a 1009, again and again) is
/// then read no more for the rest of the linger instead of costing the shard a read loop (8
/// such clients held an honest client's p99 at 154 ms on one core, 9 ms without them). Not
/// read, its writes wait on the kernels' buffers, so it cannot start its next attack until the
/// linger ends, and what the node wrote last stays readable that long.
pub const CLOSE_LINGER_DISCARD_MAX_BYTES: usize = 256 * 1024;

/// A write that makes no progress for this long fails and the connection closes: a client
/// that stops reading cannot pin a task and its buffers forever. As long as the default body
/// timeout: a client gets as long to take a response as to send a request.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// TCP keepalive on every accepted connection, so the kernel finds half-open connections (a
/// peer that vanished without a FIN) on its own: first probe after this much silence...
pub const TCP_KEEPIDLE_SECS: u32 = 60;
/// ...then a probe this often...
pub const TCP_KEEPINTVL_SECS: u32 = 10;
/// ...and the connection is reset after this many unanswered probes: a vanished peer is found
/// within 90 s and its connection slot given back.
pub const TCP_KEEPCNT: u32 = 3;

/// Pause after an accept that failed (`EMFILE`, `ENFILE`, `ENOBUFS`): the failed connection
/// stays queued, so accepting again at once would fail again and spin the shard's loop. 10 ms
/// lets other work run and descriptors be closed, and adds little to a connection's wait.
pub const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(10);
/// Failed accepts are logged at most once per this interval (each is counted in
/// `accept_errors`), so a flood of them cannot flood the log.
pub const ACCEPT_ERROR_LOG_EVERY: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------------

/// TLS handshakes in progress per shard. A handshake is CPU work done on the shard's loop; a
/// connection takes a slot once its complete ClientHello is in (not at the accept: see
/// [`TLS_HELLO_TIMEOUT_DEFAULT`]), and past this many at once it is closed at once
/// (`tls_handshakes_refused`). Each holds a rustls connection and its buffers, so the cap also
/// bounds that memory per shard.
pub const TLS_HANDSHAKES_MAX: usize = 256;

/// Bytes of TLS records one connection's rustls session holds waiting to be written. Past it a
/// write takes only what fits (the connection waits for the socket, as a plain one does), so a
/// TLS client that stops reading holds no more than this in the session (rustls's own default,
/// set explicitly so the bound is the node's). What the session holds of the client's input is
/// bounded by rustls: one record being decrypted (at most 16 KiB and its overhead) and 16 KiB of
/// plaintext not yet read by the connection, which reads it at once into its inbound budget.
pub const TLS_SEND_BUFFER_MAX_BYTES: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------------
// WebSocket
// ---------------------------------------------------------------------------------------------

/// Largest payload of a WebSocket control frame (RFC 6455, 5.5).
pub const WS_CONTROL_PAYLOAD_MAX_BYTES: u64 = 125;

/// A message the node sends goes compressed to a WebSocket that negotiated permessage-deflate
/// only from this many payload bytes, and only if compressing made it smaller. Each message is
/// compressed on its own (no context carried between messages, so a broadcast is compressed
/// once for all), and below this a short JSON message saves a few bytes at best for a pass of
/// the compressor.
pub const WS_DEFLATE_MIN_BYTES: usize = 128;

/// A WebSocket client with this many bytes waiting for it (queued in its session mailbox and
/// not yet taken by the kernel) is closed: it reads too slowly (`ws_slow_closed`). This is the
/// most one slow reader can make the node hold: 8 MiB, eight default-sized messages.
pub const WS_SLOW_CLOSE_BYTES: u64 = 8 * 1024 * 1024;

/// A compressed WebSocket message may decompress to at most this many times its compressed
/// size (or [`WS_INFLATE_RATIO_FLOOR_BYTES`], whichever is more); one that would decompress to
/// more is closed with 1009 as soon as its output passes the bound (`ws_inflate_ratio_closed`).
/// Text people and pages write compresses 2 to 10 times, repetitive JSON some tens of times;
/// deflate's own ceiling, about 1,030 times, is what a bomb uses: a 1 KiB frame decompressing
/// to 1 MiB, 64 of them in one 64 KiB read. At 64 times a read is at most 4 MiB of work.
pub const WS_INFLATE_RATIO_MAX: u64 = 64;

/// A compressed message may always decompress to this many bytes, whatever its ratio: a short
/// message of one repeated character compresses to a dozen bytes, far past the ratio, and
/// costs nothing.
pub const WS_INFLATE_RATIO_FLOOR_BYTES: u64 = 4 * 1024;

/// Message bytes (decompressed, for a compressed message) a WebSocket hands on in one turn of
/// its shard's loop, or bytes of answers it builds, before it writes what it built and yields
/// the loop (`turn_yields`): the frames left of a read wait, undecoded, until then. A read of
/// small messages (64 KiB, [`READ_SCRATCH_BYTES`]) is handled in one turn as before; a read of
/// compressed ones yields between them, so other connections are served meanwhile, and a
/// client that does not read holds at most this and one message's answers.
pub const WS_DECODE_BYTES_PER_TURN: usize = 64 * 1024;

// ---------------------------------------------------------------------------------------------
// Shards and their loops
// ---------------------------------------------------------------------------------------------

/// How often each shard's housekeeping tick runs: it notices a node-wide drain, measures the
/// shard's lag (how late the tick woke) and beats the heartbeat the watchdog checks. A tenth of
/// a second notices lag quickly at ten wake-ups a second per shard.
pub const SHARD_TICK: Duration = Duration::from_millis(100);

/// A turn of the shard's loop longer than this is counted in `turn_overruns`: for that long
/// every other connection of the shard waited. It is the default threshold of glommio's own
/// stall detector.
pub const TURN_OVERRUN: Duration = Duration::from_millis(10);

/// Deliveries one broadcast makes on a shard before it yields the shard's loop, so fanning out
/// to a hundred thousand sessions cannot hold every other connection for the whole fan-out.
pub const FANOUT_PER_TURN: usize = 256;

/// How long a loop that spent its turn's budget sleeps before its next turn. A timer, not
/// glommio's `yield_task_queue_now`: with one task queue, a yielded queue runs again at once
/// and the reactor polls I/O only when the preemption timer fires (100 ms), so requests that
/// arrived during a long fan-out waited for its end (tests/turns.rs caught it). Sleeping on a
/// timer lets the queue run dry, so the reactor polls I/O before the next turn. Costs this much
/// per turn at most: 20 µs a fan-out to 5,000 viewers (20 turns).
pub const TURN_YIELD_PAUSE: Duration = Duration::from_micros(1);

/// Cross-shard messages the inbox loop handles per turn before yielding, so a full inbox
/// ([`CROSS_SHARD_QUEUE`]) cannot starve the shard's own connections.
pub const INBOX_PER_TURN: usize = 256;

/// Connections the WebSocket ping sweep wakes per turn before yielding. Waking is cheaper than
/// a delivery, so the budget is larger than [`FANOUT_PER_TURN`].
pub const PING_SWEEP_PER_TURN: usize = 1024;

/// Most connections a stopping listener answers (`503` or close) before it stops: the most its
/// backlog can hold. The drain is one turn, not yielded between parts (a listener that keeps
/// listening while it yields lets a flood keep completing connections, which then all get 503
/// instead of a refusal at TCP): an `accept4` and a task spawned per connection, at most this
/// many. The rest are refused by the kernel once the socket stops listening.
pub const ACCEPT_DRAIN_MAX: usize = LISTEN_BACKLOG as usize;

/// Memory each shard's io_uring reserves for registered (DMA) buffers: 1 MiB of locked memory
/// per shard. combd does network I/O through readiness and its own scratch buffer, so it needs
/// little; glommio's default (10 MiB) would exceed a default `RLIMIT_MEMLOCK` with two shards.
pub const SHARD_IO_MEMORY_BYTES: usize = 1 << 20;

/// Submission entries of each of a shard's three io_uring rings (glommio's default is 128).
/// The kernel sizes a ring's cancel table from its completion queue (2 × this): 8 buckets at
/// 128, 256 (its maximum) from 4,096. Every connection keeps a poll armed in the main ring,
/// and glommio cancels and re-arms a timer there each time the shard enters its reactor; each
/// cancel walks one bucket of armed polls. At 128 entries and 4,000 WebSockets that walk was 6 %
/// of the shard's time (`io_poll_find`, heavy click benchmark); at 4,096 it is 32 times
/// shorter. The rings' cost: about 1.1 MiB per shard.
pub const SHARD_RING_DEPTH: usize = 4096;

/// Messages waiting in a shard's inbox from the other shards. Past it a cross-shard request
/// is refused (503 `overloaded`) and a delivery dropped and counted. The channel's slots are
/// allocated up front: this many message slots per shard.
pub const CROSS_SHARD_QUEUE: usize = 16 * 1024;

/// Threads per shard that run SQLite (opening databases, transactions, fsync) off the event
/// loop. More than one, so a slow transaction of one object does not hold up the restores and
/// transactions of the others; the awake cap bounds how many cells use them at once. Each is an
/// OS thread with its own stack.
pub const BLOCKING_THREADS_PER_SHARD: usize = 4;

/// The most of a shard's blocking threads one client's work holds at once (the client whose
/// request made the object live; the node's own work, such as the alarm index, is not held to
/// it): all but one, so a batch, sync or restore of another client never waits for one of its
/// restores, batches or syncs to end. A free thread goes to the waiting client that holds the
/// fewest (`crate::line` in `shards`).
pub const BLOCKING_THREADS_PER_CLIENT: usize = BLOCKING_THREADS_PER_SHARD - 1;

/// While another client is active on a shard's blocking threads, the most jobs that compute
/// (a batch, a restore, a creation, a fleet lookup or shipment: every job but a WAL sync,
/// which waits on the disk) one client has on them at once. The threads share the shard's
/// CPU: a client's second job computing at once gives it more of that CPU and the others less,
/// and runs no sooner (beside `bench/hostile.py object-fill` on one CPU, the honest p99 was
/// 6.3–6.5 ms with three such jobs of the attacker's at once and 3.8–4.0 with one).
pub const BLOCKING_COMPUTE_SHARED_PER_CLIENT: usize = 1;

/// How recently a client must have handed a job to a shard's blocking threads to count as
/// active there, for [`BLOCKING_COMPUTE_SHARED_PER_CLIENT`].
pub const BLOCKING_CLIENT_ACTIVE_WINDOW: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------------
// Cells: objects and sessions
// ---------------------------------------------------------------------------------------------

/// Longest object name in `/o/<app>/<name>`, in bytes. Names are also restricted to
/// `[A-Za-z0-9_.-]` and may not start with a dot, so a name is always one safe path component;
/// 64 leaves its database's file names (`<name>.sqlite-wal`) far below the 255-byte limit.
pub const OBJECT_NAME_MAX_BYTES: usize = 64;

/// Default mailbox of an object (an app may set its own): inputs waiting behind the one being
/// handled. Past it an input is refused at once with 503 `overloaded`. Each waiting input holds
/// its request body, so a full mailbox may hold up to this many bodies.
pub const MAILBOX_DEFAULT: usize = 1000;
/// Default batch of an app that handles batches: inputs taken at once into one transaction, so
/// a hundred writes share one fsync.
pub const BATCH_DEFAULT: usize = 100;
/// Batches of one object that committed but wait for their WAL sync to be answered. While a
/// sync runs, the next batches commit (and share the next sync); past this many the object
/// waits for the sync, and its mailbox fills. Each holds its answers and effects.
pub const OBJECT_UNSYNCED_BATCHES: usize = 8;

/// A WAL sync longer than this is counted in `wal_syncs_slow`: on this disk a sync takes
/// 0.1–0.3 ms, so one past 10 ms is the disk or the kernel's writeback holding it, and every
/// answer of its group waited as long.
pub const WAL_SYNC_SLOW: std::time::Duration = std::time::Duration::from_millis(10);
/// A session's mailbox: messages waiting to be written to its WebSocket.
pub const SESSION_MAILBOX: usize = 1000;
/// A session's mailbox while its shard is behind: what does not fit is dropped and counted.
/// Small, so a behind shard stops queueing for clients that cannot keep up.
pub const SESSION_MAILBOX_BEHIND: usize = 8;
/// An idle object is closed after this long (its database closed, its memory given back)...
pub const OBJECT_IDLE: Duration = Duration::from_secs(1);
/// ...or after this long while memory pressure is 1 or more, so it is not let go while its
/// neighbours are still coming back.
pub const OBJECT_IDLE_UNDER_PRESSURE: Duration = Duration::from_secs(10);

/// Ticks a host call (SQL handle, send, broadcast, log) counts against the CPU limit, so a loop
/// of cheap host calls is bounded like a loop of computation.
pub const HOST_CALL_TICKS: u64 = 1_000;
/// A request's host calls (SQL, sends) may take this long in all; past it the call is killed
/// with `host_time`. A second of a cell's time is already far past an interactive answer.
pub const HOST_TIME_LIMIT: Duration = Duration::from_secs(1);
/// A call that takes longer than this is counted in `slow_calls`: as long as a turn overrun.
pub const SLOW_CALL: Duration = Duration::from_millis(10);
/// A request's log output kept (64 KiB per call at most); past it lines are dropped and one
/// marker says so.
pub const LOG_MAX_BYTES: usize = 64 * 1024;
/// WebSocket messages and sends one request may queue in all; past it a send fails with
/// `send_limit`. This is the most one call can make the node buffer for others: 16 MiB.
pub const SENDS_MAX_BYTES: u64 = 16 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Apps deployed as WebAssembly modules (their calls have the limits above too)
// ---------------------------------------------------------------------------------------------

/// A module's instances may hold this much linear memory and tables, in KiB, unless the module
/// exports `memory_kb()`: 64 MiB. Past it a call traps with `memory_limit`.
pub const WASM_MEMORY_KB_DEFAULT: u64 = 64 * 1024;

/// Default of `COMBD_MODULE_MEMORY_MAX`: the most a module may ask for with `memory_kb()` (a
/// module asking more is refused at load, naming the setting). A shard runs one call at a time
/// on its SQLite thread, so the node holds at most this much per shard for modules: 256 MiB
/// leaves a 1 GB droplet's single shard room for its connections and databases, and is four
/// times the default a module gets without asking.
pub const MODULE_MEMORY_MAX_DEFAULT_BYTES: u64 = 256 << 20;
/// What one table element counts against `memory_kb` (wasmtime holds a pointer per element).
pub const WASM_TABLE_ELEMENT_BYTES: usize = 8;
/// The largest module file loaded: 64 MiB.
pub const WASM_MODULE_MAX_BYTES: u64 = 64 * 1024 * 1024;
/// Fuel (ticks) of a module's `schema()` and `memory_kb()` at load: 10 million.
pub const WASM_LOAD_TICKS: u64 = 10_000_000;
/// Fuel (ticks) of a module's `topic()`, which runs on the session's shard at attach: a
/// million (about a millisecond), so a slow topic cannot hold a shard's loop.
pub const WASM_TOPIC_TICKS: u64 = 1_000_000;
/// Bytes a host call copies into or out of a module per tick of its fuel, so that copying
/// is bounded by `COMBD_CPU_LIMIT_TICKS` like computing (1 MiB costs 65,536 ticks).
pub const WASM_BYTES_PER_TICK: u64 = 16;
/// The longest string a module hands over (its schema, a topic): 1 MiB.
pub const WASM_TEXT_MAX_BYTES: usize = 1024 * 1024;
/// The wall time one call of a module may take, its host calls included (wasmtime's epoch
/// deadline), beside its fuel: fuel counts instructions, one a tick whatever they do, so a
/// bulk memory instruction (`memory.fill`, `memory.copy`) over the whole memory costs one
/// tick, and [`HOST_TIME_LIMIT`] counts only SQL. Twice [`HOST_TIME_LIMIT`]: a call may spend
/// all its SQL time and as long again in its own code. Past it the call traps with `cpu_limit`.
pub const WASM_CALL_DEADLINE: Duration =
    Duration::from_millis(2 * HOST_TIME_LIMIT.as_millis() as u64);
/// The wall time of a module's `topic()`, which runs on the session's shard at attach (not on
/// a blocking thread): five epoch ticks, so a topic cannot hold a shard's loop for long
/// whatever it loops on (its fuel, `WASM_TOPIC_TICKS`, is about a millisecond; the rest is
/// room for the thread being descheduled on a busy machine). Past it the attach is refused.
pub const WASM_TOPIC_DEADLINE: Duration =
    Duration::from_millis(5 * WASM_EPOCH_TICK.as_millis() as u64);
/// How often the epoch of the engine modules run on advances (one thread a node, a tick each
/// time): the resolution of [`WASM_CALL_DEADLINE`] and [`WASM_TOPIC_DEADLINE`].
pub const WASM_EPOCH_TICK: Duration = Duration::from_millis(10);
// A module's call may take all its SQL time; its deadline is a whole number of epoch ticks,
// at least two (a deadline of one could fall due at once).
const _: () = assert!(WASM_CALL_DEADLINE.as_nanos() > HOST_TIME_LIMIT.as_nanos());
const _: () = assert!(WASM_CALL_DEADLINE.as_nanos() % WASM_EPOCH_TICK.as_nanos() == 0);
const _: () = assert!(WASM_TOPIC_DEADLINE.as_nanos() >= 2 * WASM_EPOCH_TICK.as_nanos());

// ---------------------------------------------------------------------------------------------
// SQLite
// ---------------------------------------------------------------------------------------------

/// One SQL statement may run this long; past it SQLite is interrupted (`sql_timeout`). A tenth
/// of the host-time limit, so one statement cannot spend a whole call's time.
pub const SQL_STATEMENT_LIMIT: Duration = Duration::from_millis(100);
/// SQLite VM steps between checks of the two time limits above: a few microseconds of work, so
/// a limit is noticed promptly while checking costs nothing measurable.
pub const SQL_PROGRESS_STEPS: i32 = 1_000;
/// Largest SQL value (string or blob), `SQLITE_LIMIT_LENGTH`: past it `too_big`. A value is
/// held in memory whole, so this bounds what one value costs: 2 MiB.
pub const SQL_VALUE_MAX_BYTES: i32 = 2 * 1024 * 1024;
/// `PRAGMA busy_timeout` of every object database. An object's database has one writer (its
/// object), so another connection's lock is held only briefly (a WAL checkpoint, a restore); a
/// second covers that without letting a stuck lock hold a blocking thread for long.
pub const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_millis(1000);

// ---------------------------------------------------------------------------------------------
// Admission: the coordinator's measurements and decisions
// ---------------------------------------------------------------------------------------------

/// Pressure becomes 1 when the higher of the two memory measures reaches this percentage: idle
/// objects are then kept longer and the node starts to shed.
pub const PRESSURE_1_PERCENT: u64 = 80;
/// Pressure becomes 2 (the node is full and refuses at TCP) at this percentage: the last tenth
/// is kept for what is already admitted.
pub const PRESSURE_2_PERCENT: u64 = 90;
/// The machine's memory kept back: its percentages are of the machine less a tenth (total /
/// this), left to the kernel and the rest of the machine.
pub const MACHINE_RESERVE_DIVISOR: u64 = 10;
/// Each admission state (full, not full) holds at least this long, so it does not flap.
pub const STATE_HOLD: Duration = Duration::from_secs(1);
/// The coordinator measures at least this often...
pub const MEASURE_INTERVAL: Duration = Duration::from_secs(1);
/// ...and also every this many accepted connections, so a burst cannot outrun it.
pub const MEASURE_EVERY_ACCEPTS: u64 = 64;
/// The disk is low below the lesser of a tenth of its filesystem (total / this)...
pub const DISK_LOW_DIVISOR: u64 = 10;
/// ...and this: 2 GiB is room for many databases to grow while the operator reacts.
pub const DISK_LOW_MAX_BYTES: u64 = 2 << 30;
/// A failed measurement (memory, disk) is logged at most once per this interval: it usually
/// fails every second until someone fixes the machine.
pub const MEASURE_ERROR_LOG_EVERY: Duration = Duration::from_secs(60);
/// Refusals are summed up in the log at most once per this interval (never one line per refused
/// connection).
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);
/// A shard whose tick ([`SHARD_TICK`]) has not run for this long is stalled: the coordinator
/// stops pinging systemd's watchdog, which restarts the node. Twenty ticks, so a busy moment is
/// not taken for a stall; well under the unit's `WatchdogSec=10`.
pub const WATCHDOG_STALL: Duration = Duration::from_secs(2);
/// The coordinator's shortest wait between two rounds when a watchdog ping is due, so a ping
/// that is already late cannot make it spin.
pub const COORDINATOR_WAIT_MIN: Duration = Duration::from_millis(10);
/// The outbound budget's share of the memory budget when `COMBD_OUTBOUND_BUDGET` is not set: a
/// quarter (budget / this), split over the shards. See [`outbound_budget_per_shard`].
pub const OUTBOUND_BUDGET_DIVISOR: u64 = 4;
/// The inbound budget's share of the memory budget when `COMBD_INBOUND_BUDGET` is not set: a
/// quarter (budget / this), split over the shards, like the outbound budget: with both spent
/// the node holds half its budget for clients' bytes, and memory pressure (at 80 % and 90 %)
/// comes before either is all that is held. See [`inbound_budget_per_shard`].
pub const INBOUND_BUDGET_DIVISOR: u64 = 4;
/// Bytes of one connection's input (request bodies, WebSocket messages) that may wait in
/// mailboxes and inboxes; past it the connection stops being read until some of it ran. A
/// quarter of a mebibyte is thousands of clicks, or a few bodies: a client that floods a
/// mailbox with large messages holds this much (and the one message that crossed it, at most
/// `COMBD_WS_MAX_MESSAGE`), not a mailbox's worth (8 clients at 300 messages of 1 MB each took a
/// node from 12 MB to 1,023 MB before this bound).
pub const INBOUND_CONN_QUEUED_MAX_BYTES: u64 = 256 * 1024;
/// A connection with less than this of its input waiting may always queue a small input,
/// whatever the shard's inbound budget: clicks and small requests are never refused because
/// other clients hold the budget with large ones. At most this much per connection beyond the
/// budget: 4 KiB holds any click or small request with room to spare.
pub const INBOUND_CONN_FLOOR_BYTES: u64 = 4 * 1024;
/// The coordinator measures memory each time a shard's inbound bytes cross a step of its
/// budget / this upwards, besides once a second: a burst of large inputs is seen (and the node
/// refuses at TCP under pressure) as it is held, not up to a second later.
pub const INBOUND_MEASURE_STEPS: u64 = 16;

// ---------------------------------------------------------------------------------------------
// Derived limits
// ---------------------------------------------------------------------------------------------

/// Bytes waiting to be written that one shard's connections may hold together: `configured`
/// (`COMBD_OUTBOUND_BUDGET`) if set, else the memory budget over
/// [`OUTBOUND_BUDGET_DIVISOR`] split over the shards; at least 1. Zero shards count as one.
pub fn outbound_budget_per_shard(
    configured: Option<u64>,
    memory_budget_bytes: u64,
    shards: usize,
) -> u64 {
    configured
        .unwrap_or(memory_budget_bytes / OUTBOUND_BUDGET_DIVISOR / shards.max(1) as u64)
        .max(1)
}

/// Bytes of clients' input one shard may hold waiting in mailboxes and inboxes, every
/// connection together: `configured` (`COMBD_INBOUND_BUDGET`) if set, else the memory budget
/// over [`INBOUND_BUDGET_DIVISOR`] split over the shards; at least 1.
pub fn inbound_budget_per_shard(
    configured: Option<u64>,
    memory_budget_bytes: u64,
    shards: usize,
) -> u64 {
    configured
        .unwrap_or(memory_budget_bytes / INBOUND_BUDGET_DIVISOR / shards.max(1) as u64)
        .max(1)
}

// ---------------------------------------------------------------------------------------------
// Relations that must hold (checked when the crate builds)
// ---------------------------------------------------------------------------------------------

// Shrinking a session's mailbox when its shard is behind must shrink it, and leave room for one.
const _: () = assert!(0 < SESSION_MAILBOX_BEHIND && SESSION_MAILBOX_BEHIND < SESSION_MAILBOX);
// Pressure 1 must come before pressure 2, and both must be reachable percentages.
const _: () = assert!(PRESSURE_1_PERCENT < PRESSURE_2_PERCENT && PRESSURE_2_PERCENT <= 100);
// A batch is taken from the mailbox: a larger batch could never fill.
const _: () = assert!(BATCH_DEFAULT <= MAILBOX_DEFAULT);
const _: () = assert!(0 < HTTP_OBJECT_PIPELINE && HTTP_OBJECT_PIPELINE <= MAILBOX_DEFAULT);
// The request target is part of the head: a target limit past the head's could never apply.
const _: () = assert!(URL_MAX_BYTES <= HEADER_SECTION_MAX_BYTES);
// One statement must be interrupted before the call's whole SQL time is spent.
const _: () = assert!(SQL_STATEMENT_LIMIT.as_nanos() < HOST_TIME_LIMIT.as_nanos());
// A call is counted slow long before it is killed, or slow_calls would count only kills.
const _: () = assert!(SLOW_CALL.as_nanos() < HOST_TIME_LIMIT.as_nanos());
// Under pressure idle objects are kept longer, not shorter.
const _: () = assert!(OBJECT_IDLE.as_nanos() < OBJECT_IDLE_UNDER_PRESSURE.as_nanos());
// The hold must span at least one measurement, or it cannot hold a state against the next one.
const _: () = assert!(STATE_HOLD.as_nanos() >= MEASURE_INTERVAL.as_nanos());
// The summary is checked once per measurement: a shorter interval could not be kept.
const _: () = assert!(SUMMARY_EVERY.as_nanos() >= MEASURE_INTERVAL.as_nanos());
// The coordinator's shortest wait must not replace its measuring interval.
const _: () = assert!(COORDINATOR_WAIT_MIN.as_nanos() < MEASURE_INTERVAL.as_nanos());
// An overrun must be shorter than a tick, or a tick's lag would hide every overrun.
const _: () = assert!(TURN_OVERRUN.as_nanos() < SHARD_TICK.as_nanos());
// A stall must span several ticks, or a healthy shard between two ticks would look stalled.
const _: () = assert!(SHARD_TICK.as_nanos() < WATCHDOG_STALL.as_nanos());
// Every restore runs on a blocking thread: more at once than threads would only queue.
const _: () = assert!(RESTORES_AT_ONCE_DEFAULT <= BLOCKING_THREADS_PER_SHARD);
// A drain must leave time for a closing connection's linger.
const _: () = assert!(CLOSE_LINGER.as_nanos() < SHUTDOWN_TIMEOUT_DEFAULT.as_nanos());
// A per-turn budget of zero would make its loop yield forever without doing any work.
const _: () = assert!(FANOUT_PER_TURN > 0 && INBOX_PER_TURN > 0 && PING_SWEEP_PER_TURN > 0);
// ACCEPT_DRAIN_MAX is the backlog cast to usize: a negative backlog would wrap.
const _: () = assert!(LISTEN_BACKLOG > 0);
// `sys::bind_listener` and `sys::resume_listening` pass it through nix's `Backlog`, which refuses
// more than SOMAXCONN with EINVAL (the kernel itself caps it at `net.core.somaxconn`).
const _: () = assert!(LISTEN_BACKLOG <= nix::libc::SOMAXCONN);
// A message limit at or under a control frame's payload would refuse ordinary messages.
const _: () = assert!(WS_CONTROL_PAYLOAD_MAX_BYTES < WS_MAX_MESSAGE_DEFAULT_BYTES);
// A host call must cost less than a whole call's CPU limit, or no call could make one.
const _: () = assert!(HOST_CALL_TICKS < CPU_LIMIT_TICKS_DEFAULT);
// The bucket must hold a second of the rate, or a client at the allowed rate in bursts is closed.
const _: () = assert!(WS_RATE_DEFAULT <= WS_BURST_DEFAULT);
// A ratio or a turn's budget of zero would close every compressed message or hand on none.
const _: () = assert!(WS_INFLATE_RATIO_MAX > 0 && WS_DECODE_BYTES_PER_TURN > 0);
// A creation bucket of zero seconds would refuse every new object.
const _: () = assert!(OBJECT_CREATE_BURST_SECONDS > 0);
// With no batch allowed between commit and answer no object could run.
const _: () = assert!(OBJECT_UNSYNCED_BATCHES > 0);
// async_channel::bounded(0) panics, and a shard without an inbox could not be reached.
const _: () = assert!(CROSS_SHARD_QUEUE > 0);
// The hello is part of the handshake: its deadline (from the accept) cannot be the later one.
const _: () =
    assert!(TLS_HELLO_TIMEOUT_DEFAULT.as_nanos() <= TLS_HANDSHAKE_TIMEOUT_DEFAULT.as_nanos());
// A shard needs at least one thread for SQLite and must accept at least one TLS handshake.
const _: () = assert!(BLOCKING_THREADS_PER_SHARD > 0 && TLS_HANDSHAKES_MAX > 0);
// One client must be able to use a blocking thread, and leave one to the others.
const _: () = assert!(
    BLOCKING_THREADS_PER_CLIENT > 0 && BLOCKING_THREADS_PER_CLIENT < BLOCKING_THREADS_PER_SHARD
);
const _: () = assert!(
    BLOCKING_COMPUTE_SHARED_PER_CLIENT > 0
        && BLOCKING_COMPUTE_SHARED_PER_CLIENT <= BLOCKING_THREADS_PER_CLIENT
);
// The accept-triggered measurement uses `is_multiple_of`, and the divisors divide: none is zero.
const _: () = assert!(
    MEASURE_EVERY_ACCEPTS > 0
        && MACHINE_RESERVE_DIVISOR > 0
        && DISK_LOW_DIVISOR > 0
        && OUTBOUND_BUDGET_DIVISOR > 0
        && INBOUND_BUDGET_DIVISOR > 0
        && INBOUND_MEASURE_STEPS > 0
);
// An object's database files (`<name>.sqlite-wal`) must fit one path component (NAME_MAX).
const _: () = assert!(OBJECT_NAME_MAX_BYTES + ".sqlite-wal".len() <= 255);
// The reserve must leave connections under the fallback descriptor limit.
const _: () = assert!(FD_RESERVE < NOFILE_FALLBACK);
// The floor is for small inputs: a connection's floor past its own queue bound would let it
// hold more than the bound whatever the budget.
const _: () = assert!(
    0 < INBOUND_CONN_FLOOR_BYTES && INBOUND_CONN_FLOOR_BYTES < INBOUND_CONN_QUEUED_MAX_BYTES
);
// The localhost listener needs a connection at least, or the operator could not ask anything.
const _: () = assert!(LOCAL_CONNS_MAX > 0);
// A line is written into a chunk only with this much free in it: a longer bound could never
// be met, and a line past it would make the chunk grow.
const _: () = assert!(ACCESS_LOG_LINE_MAX_BYTES <= ACCESS_LOG_CHUNK_BYTES);
// Each line fits one write to stderr that a pipe takes whole.
const _: () = assert!(ACCESS_LOG_LINE_MAX_BYTES <= ACCESS_LOG_STDERR_WRITE_BYTES);
// The method and the path, each byte escaped as \u00XX at worst, and the other fields fit a line.
const _: () = assert!(
    6 * (ACCESS_LOG_METHOD_MAX_BYTES + ACCESS_LOG_PATH_MAX_BYTES) + ACCESS_LOG_FIELDS_MAX_BYTES
        <= ACCESS_LOG_LINE_MAX_BYTES
);
// One chunk in the shard's hand and one being written, at least.
const _: () = assert!(ACCESS_LOG_CHUNKS_PER_SHARD >= 2);
// A window that shows no warning would hide every failed call.
const _: () = assert!(APP_ERROR_LOGS_PER_WINDOW > 0 && APP_ERROR_DETAIL_MAX_BYTES > 0);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outbound_budget_is_the_setting_else_a_quarter_of_memory_split_over_shards() {
        // The setting wins, whatever the memory budget and shards.
        assert_eq!(
            outbound_budget_per_shard(Some(3 << 20), 8 << 30, 4),
            3 << 20
        );
        // Else a quarter of the memory budget over the shards: 8 GiB, 4 shards, 512 MiB each.
        assert_eq!(outbound_budget_per_shard(None, 8 << 30, 4), 512 << 20);
        assert_eq!(outbound_budget_per_shard(None, 8 << 30, 1), 2 << 30);
        // Never zero, and zero shards do not divide by zero.
        assert_eq!(outbound_budget_per_shard(None, 3, 2), 1);
        assert_eq!(outbound_budget_per_shard(None, 0, 0), 1);
        assert_eq!(outbound_budget_per_shard(None, 4096, 0), 1024);
    }
}
