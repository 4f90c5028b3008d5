//! Defaults of the settings (the settings are parsed in [`crate::settings`]): each the value a
//! setting has when it is not given, with the reason for it.

use std::time::Duration;

/// Default of `COMBD_LISTEN`.
pub const LISTEN_DEFAULT: &str = "0.0.0.0:8080";
/// Default of `COMBD_DATA`.
pub const DATA_DEFAULT: &str = "./data";

/// Default of `COMBD_APPS_DIR`: where the WebAssembly apps are deployed.
pub const APPS_DIR_DEFAULT: &str = "./apps";
/// Default of `COMBD_LOG`.
pub const LOG_DEFAULT: &str = "info";
/// Default of `COMBD_MAX_BODY`: 1 MiB. A request body is buffered whole before its handler runs,
/// so this is what one request can make the node hold.
pub const MAX_BODY_DEFAULT_BYTES: u64 = 1024 * 1024;
/// Default of `COMBD_HEADER_TIMEOUT`: a request head must be complete this long after its first
/// byte (for a new connection: after accept). Slowloris protection.
pub const HEADER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default of `COMBD_BODY_TIMEOUT`: a body must be complete this long after its head (1 MiB in
/// 30 s is a slow mobile upload).
pub const BODY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default of `COMBD_IDLE_TIMEOUT`: an HTTP keep-alive connection with no request in progress is
/// closed after this long. WebSockets are not subject to it.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// Default of `COMBD_WS_MAX_MESSAGE`: 1 MiB, a reassembled WebSocket message, held whole while it
/// is reassembled; past it, close 1009.
pub const WS_MAX_MESSAGE_DEFAULT_BYTES: u64 = 1024 * 1024;
/// Default of `COMBD_SHUTDOWN_TIMEOUT`: how long a drain waits for in-flight work.
pub const SHUTDOWN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default of `COMBD_MAX_CONNS`, from the seed: 200,000 open connections.
pub const MAX_CONNS_DEFAULT: u64 = 200_000;
/// Default of `COMBD_MAX_CONNS_PER_ADDRESS`: the connections one client address (IPv4 /32,
/// IPv6 /64) may hold. A thousand is many browsers behind one NAT (each holds a WebSocket or
/// two), and a fifth of a 1 GB node's ~5,000-connection share per address would still leave it
/// to the others: one address at its cap never makes the node full for everyone.
pub const MAX_CONNS_PER_ADDRESS_DEFAULT: u64 = 1024;
/// Default of `COMBD_ACCEPT_RATE_PER_ADDRESS`: new connections a second one address may open
/// once it has spent its burst (`COMBD_MAX_CONNS_PER_ADDRESS` at once). A page load opens one or
/// two; 256 a second lets a NAT full of reloading browsers in, while a client that connects and
/// closes in a loop (each accept is a task, a socket and a syscall or three) is held to it.
pub const ACCEPT_RATE_PER_ADDRESS_DEFAULT: u64 = 256;
/// Addresses kept with no connection open while their accept-rate bucket refills (so closing
/// at once does not reset an address's rate): at most this many, about 64 bytes each (4 MiB);
/// past it an address's last connection takes its entry with it.
pub const ADDRESS_IDLE_ENTRIES_MAX: usize = 64 * 1024;
/// Default of `COMBD_CLIENT_SHARE_MAX_PERCENT`: the most of a shared pool (open objects, TLS
/// handshakes in progress, object answers waiting to be written, object creations) one client
/// may hold, even alone (`combd_kernel::fair`). A tenth: nine attackers' addresses at their cap
/// still leave a tenth of every pool to the next client.
pub const CLIENT_SHARE_MAX_PERCENT_DEFAULT: u64 = 10;
/// Default of `COMBD_CLIENT_SHARE_MIN_PERCENT`: the least share of a pool a client is held to
/// however many clients hold some of it (a hundred clients each get a hundredth).
pub const CLIENT_SHARE_MIN_PERCENT_DEFAULT: u64 = 1;
/// The shares of a pool an IPv6 /56 may hold together (its /64s each hold their own share
/// within it): a /56 is one subscriber's delegated prefix, 256 /64s that are not 256 clients.
pub const PREFIX_56_SHARES: u64 = 4;
/// The shares of a pool an IPv6 /48 may hold together: one site's prefix.
pub const PREFIX_48_SHARES: u64 = 16;
/// Default of `COMBD_MAX_AWAKE`, from the seed: cells at work at once per shard.
pub const MAX_AWAKE_DEFAULT: usize = 1000;
/// Default of `COMBD_RESTORES_AT_ONCE`, from the seed: objects opened at once per shard.
pub const RESTORES_AT_ONCE_DEFAULT: usize = 4;
/// Default of `COMBD_CPU_LIMIT_TICKS`, from the seed: one call of a cell is killed after this
/// many ticks (`cx.tick()` in an app's loops; every host call counts [`HOST_CALL_TICKS`]).
pub const CPU_LIMIT_TICKS_DEFAULT: u64 = 100_000_000;
/// Default of `COMBD_DB_MAX`, from the seed: the largest object database; past it writes fail
/// with `db_full`.
pub const DB_MAX_BYTES: u64 = 1 << 30;
/// Default of `COMBD_MAX_OBJECTS_PER_APP`: databases one app may have on the node (those found
/// in `<data>/objects/<app>/` at start-up, and those created since). Nothing removes an
/// object's database, so without a bound, clients naming new objects would fill the data disk,
/// and `disk_low` would then refuse every new object of every app. 100,000 is far more objects
/// than one app of a node serves, and small enough for the disk: a new counter's database is
/// 8 KiB once closed (its WAL checkpointed away; 52 KiB with its WAL and shared memory while
/// open, measured), so 100,000 of them are under a gigabyte, and a directory of 100,000
/// entries is still quick to open files in.
pub const MAX_OBJECTS_PER_APP_DEFAULT: u64 = 100_000;
/// Default of `COMBD_OBJECT_CREATE_RATE`: databases one shard creates per second, the refill of
/// a token bucket holding [`OBJECT_CREATE_BURST_SECONDS`] seconds of it. Creating one costs a
/// file, its WAL, a sync of the WAL and of its directory, and the schema's transaction, on a
/// blocking thread and a restore slot that restores of existing objects wait for; 100 a second
/// is far more than people opening new boards create, and a flood of new names then takes
/// 1,000 s (over a quarter of an hour) divided by the shards to reach the default
/// `COMBD_MAX_OBJECTS_PER_APP`: time for the operator to see `objects_created` climb.
pub const OBJECT_CREATE_RATE_DEFAULT: u64 = 100;
/// Default of `COMBD_PRESENCE_MAX`: members listed in presence on the node, every topic
/// together. A member costs its entry in its topic (its name, up to a token's subject, and
/// the share it holds: about 200 bytes), and each of its joins and leaves a few dozen bytes
/// to every numbered viewer of its topic; 100,000 is 10,000 users in 10 rooms each, 20 MB.
pub const PRESENCE_MAX_DEFAULT: u64 = 100_000;
/// Default of `COMBD_PRESENCE_TOPIC_MAX`: members listed in one topic's presence. The snapshot a
/// viewer gets as it attaches lists them all (1,000 are about 60 KB of JSON), and a room of more
/// is an audience, shown as a count (`unlisted`), not a list.
pub const PRESENCE_TOPIC_MAX_DEFAULT: u64 = 1_000;
/// Default of `COMBD_WS_SUBSCRIPTIONS`: subscriptions one multiplexed WebSocket (`/ws`) carries
/// at once. A page that shows a hundred objects (a dashboard, a list of rooms) needs one
/// socket, not a hundred; each subscription is a session (about 400 bytes, measured in
/// RESULTS.md) and an attach at its object.
pub const WS_SUBSCRIPTIONS_DEFAULT: u64 = 100;
/// Default of `COMBD_SUBSCRIPTIONS_MAX`: subscriptions of every multiplexed WebSocket on the
/// node together, a shared pool (each client held to its share). Without it the node's
/// sessions would be `COMBD_MAX_CONNS` × `COMBD_WS_SUBSCRIPTIONS`: a million, some 400 MB.
/// 100,000 is 1,000 full sockets, about 40 MB.
pub const SUBSCRIPTIONS_MAX_DEFAULT: u64 = 100_000;
/// The creation bucket's capacity, in seconds of `COMBD_OBJECT_CREATE_RATE` (1,000 objects by
/// default): a page or a test that makes many new objects at once is not refused for it, while
/// a steady flood is held to the rate.
pub const OBJECT_CREATE_BURST_SECONDS: u64 = 10;
/// Default of `COMBD_WS_RATE`: WebSocket messages per second per connection (token refill),
/// from the ULDA seed's per-decoder bucket.
pub const WS_RATE_DEFAULT: u64 = 1000;
/// Default of `COMBD_WS_BURST`: the token bucket's capacity. Past it: close 1008.
pub const WS_BURST_DEFAULT: u64 = 2000;
/// Default of `COMBD_WS_INFLATE_RATE`: bytes a second the compressed messages of one WebSocket
/// may decompress to (a token bucket holding a second of it or the largest message, whichever
/// is more); past it: close 1008. Decompressing, handling and answering a megabyte costs the
/// shard about half a millisecond: at most that a second a connection. Messages that are not
/// compressed are not counted (reading them costs the client as much as the node).
pub const WS_INFLATE_RATE_DEFAULT_BYTES: u64 = 1024 * 1024;
/// Default of `COMBD_TLS_HANDSHAKE_TIMEOUT`: as long as the header timeout, the same slowloris
/// guard for the step before the head. It runs from the accept, like the hello timeout; the
/// handshake slot is held only from the ClientHello's arrival to the handshake's end.
pub const TLS_HANDSHAKE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default of `COMBD_TLS_HELLO_TIMEOUT`: a TLS client's complete ClientHello must have arrived
/// this long after the accept, else the connection is closed (`tls_hello_timeouts`). A real
/// client sends its ClientHello in its first flight, one round trip after the accept; 2 s
/// covers a slow mobile link. Until the hello is in, a connection holds no handshake slot
/// ([`TLS_HANDSHAKES_MAX`]) and no rustls state, so sockets that connect and send nothing cannot
/// crowd real clients out of the slots; such a silent socket is dropped after this long.
pub const TLS_HELLO_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);
/// The kernel send buffer of a WebSocket (`SO_SNDBUF`, which Linux doubles): what the kernel
/// holds for a client beyond the session's mailbox. Fixed, so a client that stops reading is
/// seen as stuck within `COMBD_WS_SLOW_TIMEOUT` instead of after the kernel has grown its
/// buffer to `tcp_wmem`'s maximum (4 MiB by default), and so each WebSocket's kernel memory is
/// bounded: 128 KiB at most. Realtime messages are small; 128 KiB in flight is hundreds of them.
pub const WS_SEND_BUFFER_BYTES: usize = 64 * 1024;
/// Default of `COMBD_WS_SLOW_TIMEOUT`: a WebSocket with messages waiting that takes none of them
/// for this long is closed as slow (1008), whatever the bytes waiting: a reader that stopped is
/// not kept until [`WS_SLOW_CLOSE_BYTES`] pile up. As long as the ping interval: a client that is
/// alive but busy gets as long to read as to answer a ping.
pub const WS_SLOW_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default of `COMBD_WS_PING_INTERVAL`: often enough that a vanished WebSocket client is found
/// within a minute, and that idle NAT mappings (often 60 s or more) stay open.
pub const WS_PING_INTERVAL_DEFAULT: Duration = Duration::from_secs(30);
