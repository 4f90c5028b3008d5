//! The fleet's bounds (off unless `COMBD_FLEET_*` are set; see the `combd-fleet` crate and
//! README, "The fleet"), with the relations between them checked at compile time.

use std::time::Duration;

use super::DB_MAX_BYTES;

/// Default of `COMBD_FLEET_LEASE_TTL`: how long an owner's lease outlives its last keepalive.
/// It is the failover time: a dead owner's objects answer from another node after at most this
/// long. 10 s rides out a stop-the-world pause or an etcd leader election (about 1 s) without a
/// live node losing its objects.
pub const FLEET_LEASE_TTL_DEFAULT: Duration = Duration::from_secs(10);

/// Default of `COMBD_FLEET_OBJECT_IDLE`: how long a fleet object waits for mail before it is
/// let go. An object alone is let go after `OBJECT_IDLE` (1 s): reopening it costs a file open.
/// In a fleet a reopen also claims the object in etcd and reads its head (two round trips, and
/// a restore when the file was not left at the head), and a close snapshots it: 30 s keeps an
/// object asked for every few seconds open, and still gives back an idle one's memory.
pub const FLEET_OBJECT_IDLE_DEFAULT: Duration = Duration::from_secs(30);

/// Shortest `COMBD_FLEET_OBJECT_IDLE`: the node alone's own idle time.
pub const FLEET_OBJECT_IDLE_MIN: Duration = Duration::from_secs(1);

/// Longest `COMBD_FLEET_OBJECT_IDLE`: an object kept open holds its database's cache and its
/// place in `COMBD_MAX_AWAKE`; past an hour it is not idle, it is resident.
pub const FLEET_OBJECT_IDLE_MAX: Duration = Duration::from_secs(3600);

/// Default of `COMBD_FLEET_BUCKET_REGION`: the region Garage, the bucket server the fleet is
/// tested with, names in its S3 signatures unless configured otherwise.
pub const FLEET_BUCKET_REGION_DEFAULT: &str = "garage";

/// Shortest `COMBD_FLEET_LEASE_TTL`: etcd raises a shorter TTL to its own minimum (1.5 election
/// timeouts, 2 s with its default 100 ms heartbeat), so a shorter setting would not mean what it
/// says.
pub const FLEET_LEASE_TTL_MIN: Duration = Duration::from_secs(2);

/// Longest `COMBD_FLEET_LEASE_TTL`: a dead owner's objects are unreachable for up to the TTL; past
/// a minute that is an outage, not a failover.
pub const FLEET_LEASE_TTL_MAX: Duration = Duration::from_secs(60);

/// A node renews its lease every TTL / this: two renewals in a row may fail (a slow etcd, a
/// lost packet) before the lease lapses.
pub const FLEET_KEEPALIVE_DIVISOR: u32 = 3;

/// A node whose lease is gone asks etcd for a new one at most this often (it asks when an
/// object is next opened): a node cut off from etcd does not send a grant per request.
pub const FLEET_LEASE_REGRANT_INTERVAL: Duration = Duration::from_secs(1);

/// Longest wait for one call to the coordinator (etcd), connect to last byte. Shorter than a
/// renewal interval at the shortest TTL, so a hung call is over before the next renewal is due.
/// etcd answers a claim in about 3 ms on loopback and a few ms on a LAN; 500 ms is a partition.
pub const FLEET_COORDINATOR_TIMEOUT: Duration = Duration::from_millis(500);

/// Longest wait for etcd to authenticate the node's user (`COMBD_FLEET_ETCD_USER`): etcd checks
/// a password with bcrypt (cost 10: ~70 ms on a quiet core here, several times that on a loaded
/// one), and the first call to a member over TLS has a handshake too. Asked at start-up, and
/// again only when the member a call goes to changes or its token lapsed (the renewals, every
/// third of the lease, keep it in use).
pub const FLEET_AUTHENTICATE_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest wait for one call to the bucket (S3), connect to last byte, including the body of
/// the largest segment. An object waits for its segment's upload before it answers, so this is
/// also the longest a write waits for a bucket that stopped answering before it fails (503).
pub const FLEET_BUCKET_TIMEOUT: Duration = Duration::from_secs(10);

/// Times a bucket call that got a server error (500, 502, 503, 504: S3's "try again") is tried
/// again before it fails. Garage answers 503 when its metadata database is locked by
/// concurrent writes (seen in 2 of ~27 runs of one object's pipelined uploads); each try stores,
/// reads or deletes the same thing, so trying again is safe.
pub const FLEET_BUCKET_RETRIES: u32 = 3;

/// The wait before the first try again of a bucket call; doubled for each next one (20, 40,
/// 80 ms: 140 ms at most in all, against a shipment's ~1–65 ms).
pub const FLEET_BUCKET_RETRY_WAIT: Duration = Duration::from_millis(20);

/// Largest segment (one committed batch's WAL frames and their header), in bytes. A segment is
/// held in memory while it uploads and while it is restored (`COMBD_RESTORES_AT_ONCE` objects at
/// once per shard), so this bounds that memory: 64 MiB a restore or an upload. A transaction
/// whose frames do not fit is refused by the segment writer.
pub const FLEET_SEGMENT_MAX_BYTES: usize = 64 << 20;

/// Most bytes of segments one restore holds in memory before it writes the database: it walks
/// the chain back from the head to a snapshot, then applies it forward. The owner snapshots
/// before its segments since the last snapshot reach this (the issue's "snapshots bound restore
/// work"); a chain longer than this fails the restore rather than exhaust memory. 256 MiB, at
/// most `COMBD_RESTORES_AT_ONCE` (4) at once per shard.
pub const FLEET_RESTORE_SEGMENTS_MAX_BYTES: u64 = 256 << 20;

/// Largest `COMBD_DB_MAX` a fleet node starts with (a larger one fails start-up naming it): a
/// snapshot is streamed up in one call and down in one call (never held in memory), each within
/// [`FLEET_BUCKET_TIMEOUT`] (1 GiB in 10 s is ~100 MB/s), and a database past what a restore
/// reads could be snapshotted (its segments then pruned) and never restored.
/// `COMBD_DB_MAX`'s default.
pub const FLEET_DB_MAX_BYTES: u64 = DB_MAX_BYTES;

/// Largest snapshot a restore reads, and a node uploads: the largest fleet database
/// ([`FLEET_DB_MAX_BYTES`]) and a margin for its last pages. A restore also refuses a segment
/// that writes a page past it (a forged page number would make a sparse file at a huge
/// offset).
pub const FLEET_SNAPSHOT_MAX_BYTES: u64 = FLEET_DB_MAX_BYTES + (FLEET_DB_MAX_BYTES >> 4);

/// Most keys a listing of one object's segments or snapshots may return before the restore
/// gives up (a sign that old segments are not being deleted).
pub const FLEET_LIST_KEYS_MAX: usize = 100_000;

/// Largest answer read from the coordinator (a range of one key, a transaction's result). Its
/// answers are a few hundred bytes; 1 MiB refuses a misbehaving server's endless body.
pub const FLEET_COORDINATOR_ANSWER_MAX_BYTES: u64 = 1 << 20;

/// Largest listing page read from the bucket: 1000 keys (the S3 maximum) of at most 1 KiB each
/// with their XML.
pub const FLEET_LIST_ANSWER_MAX_BYTES: u64 = 2 << 20;

/// Keys asked for in one listing page (the S3 maximum per page).
pub const FLEET_LIST_PAGE_KEYS: usize = 1000;

/// Bytes of an error answer's body kept for the error message (S3's XML error, etcd's JSON).
pub const FLEET_ERROR_BODY_MAX_BYTES: u64 = 4 * 1024;

/// Longest wait for a connection to another node, the coordinator or the bucket (each call's
/// own timeout bounds the rest): on the fleet's network a connect takes well under a
/// millisecond, so one that takes a second is to a node that is gone or cut off (its packets
/// dropped, not refused). A request passed on to such an owner is answered 503 after this,
/// not after [`FLEET_FORWARD_TIMEOUT`], and so is a WebSocket passed through.
pub const FLEET_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest wait for a connection to an owner that made a request wait in vain a moment ago, by
/// the one request that tries it again ([`FLEET_OWNER_RETRY_INTERVAL`]): that try only asks
/// whether the owner is back, and a connect on the fleet's network takes well under a
/// millisecond. Shorter than [`FLEET_CONNECT_TIMEOUT`] because while it waits the owner's lease
/// may lapse, and only the next request claims the object here: a partition's failover took
/// the lease's lapse plus up to this (2.71 s against a 2 s lease with a second here, measured
/// in `tools/fleet-netns/run --fleet`).
pub const FLEET_PROBE_CONNECT_TIMEOUT: Duration = Duration::from_millis(250);

/// A request passed through to an object's owner gets its answer within this, or 503: the
/// owner is another node on the fleet's network, and a request waits no longer than a client
/// would for a node that holds the object itself under load. An owner answers once the batch
/// is in the bucket (an upload ~65 ms on a 3-node Garage, its retries 140 ms at most, the
/// head advance ≤ 500 ms), so 2 s leaves room; it is also how long the first request waits
/// for an owner cut off with a connection kept open to it (5 s made a partition's failover
/// 5.1 s against a 2 s lease, measured in `tools/fleet-netns/run --fleet`).
pub const FLEET_FORWARD_TIMEOUT: Duration = Duration::from_secs(2);

/// After a connect to another node or its answer timed out ([`FLEET_CONNECT_TIMEOUT`],
/// [`FLEET_FORWARD_TIMEOUT`]) with nothing else answered by it since the request was sent,
/// requests and WebSockets for objects it owns are answered 503 at once for this long instead
/// of each waiting out those timeouts again; after it, one of them tries the node again (the
/// others are still answered at once until that one is through), and an answer ends it. A
/// failure that comes at once (refused, reset) marks nothing: it costs the next request no
/// wait.
/// A cut-off owner's objects are claimed by another node as soon as its lease lapses: without
/// this, a request asked in that moment waited the connect timeout first (the partition's
/// failover took 3.3 s against a 2 s lease, measured in `tools/fleet-netns/run --fleet`).
/// Short against the shortest lease, so an owner that was only slow a moment is tried again
/// well before any failover.
pub const FLEET_OWNER_RETRY_INTERVAL: Duration = Duration::from_millis(500);

/// Nodes remembered as unreachable or lately heard from (see [`FLEET_OWNER_RETRY_INTERVAL`]):
/// a fleet has a few nodes; past this many, those neither marked nor heard from lately are
/// forgotten (each is a node's address and three times).
pub const FLEET_UNREACHABLE_MAX: usize = 1024;

/// Objects whose owner (another node) a shard remembers, so a request for one is passed on
/// without an object cell or a claim (`combd_shards::cells::route`): each entry is an object's
/// name and its owner's address (under 200 bytes), so 65,536 hold under 13 MiB per shard at
/// worst; past it the oldest half is forgotten (those objects go through a cell again, once).
pub const FLEET_ROUTES_MAX: usize = 65_536;

/// Reads of an object's owner a shard has on their way at once (`combd_shards::cells::route`),
/// each a blocking etcd read for an object with no cell here: past this many, a request goes
/// to an object cell as before the read existed (bounded by `COMBD_MAX_OPEN_OBJECTS`), so a
/// spray of names cannot queue unbounded etcd reads. 256 reads of a few milliseconds each keep
/// the blocking threads' queue short.
pub const FLEET_LOOKUPS_MAX: usize = 256;

/// How often a node reads the fleet's wake index (`combd_fleet::coordinator`'s `wakes`) for
/// objects with something due and no owner (their owner died): one etcd range read a second
/// (and one read of the found objects' owners) costs etcd little, and a dead owner's alarms
/// wait its lease's TTL anyway.
pub const FLEET_WAKE_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Objects one read of the fleet's wake index takes at most (earliest first): each one found
/// without an owner is claimed and restored here within `COMBD_RESTORES_AT_ONCE`, like any
/// object; the rest wait for the next sweep, so a dead owner's thousands of objects come back
/// a few hundred a second instead of all at once.
pub const FLEET_WAKE_SWEEP_MAX: usize = 256;

/// The most bytes of an owner's answer a node passes back (a longer one is answered 503): an
/// object's answer is JSON built by its app, far below this.
pub const FLEET_FORWARD_ANSWER_MAX_BYTES: u64 = 16 << 20;

/// In a fleet an object's WAL past this many bytes is checkpointed (once everything committed
/// is shipped) and the database uploaded as a snapshot: SQLite's own checkpoints are off so no
/// unshipped frame is overwritten, and a restore then reads the snapshot and the segments
/// after it instead of every segment since the object began. An object let go is snapshotted
/// too.
pub const FLEET_CHECKPOINT_WAL_BYTES: u64 = 4 << 20;

/// A restore that applied this many segments uploads the restored database as a snapshot at
/// once: owners that die before their WAL reaches [`FLEET_CHECKPOINT_WAL_BYTES`] (or before they
/// idle) never snapshot, and the chain would grow with every failover (measured: 30 to 335
/// segments in 10 kills, restores 1.4 to 14.8 s).
pub const FLEET_SNAPSHOT_AFTER_SEGMENTS: usize = 16;

/// Segments a restore reads from the bucket at once (threads of the restore, each with a
/// connection): one GET is a round trip (~44 ms from a Garage node here), and a chain since the
/// last snapshot can be hundreds long.
pub const FLEET_RESTORE_PARALLEL_GETS: usize = 16;

/// In a fleet, batches of one object that committed but wait for their shipment to be answered
/// (instead of [`OBJECT_UNSYNCED_BATCHES`](super::OBJECT_UNSYNCED_BATCHES)): a shipment (upload + head advance) takes ~65 ms on
/// a 3-node Garage against a WAL sync's 0.2 ms, and everything committed meanwhile ships in the
/// next one, so more may wait. Each holds its inputs' answers and effects (up to a batch, 100
/// by default, of requests).
pub const FLEET_UNSHIPPED_BATCHES: usize = 64;

/// In a fleet, shipments of one object whose uploads may be on their way at once: a group's
/// segments upload while the groups before them still upload, and the head still advances in
/// commit order (a group's answers leave only once its head advance and every one before it
/// are done). Eight ~65 ms uploads on a 3-node Garage let one object ship a group every ~8 ms.
pub const FLEET_UPLOADS_IN_FLIGHT: usize = 8;

/// Threads of a node that upload segments to the bucket (every object's shipments queue for
/// them), so uploads in flight do not hold the shards' blocking threads, which run batches and
/// syncs. As many as the idle connections kept to the bucket.
pub const FLEET_UPLOAD_THREADS: usize = FLEET_IDLE_CONNECTIONS;

/// Most endpoints in `COMBD_FLEET_ETCD`: etcd clusters have at most 7 members (more slows every
/// write for no gain in safety).
pub const FLEET_ETCD_ENDPOINTS_MAX: usize = 7;

/// Idle connections each fleet client keeps open to its server, for reuse by the next call (a
/// few KiB each). One per blocking thread that may call at once is enough.
pub const FLEET_IDLE_CONNECTIONS: usize = 8;

// A renewal must be due before the lease lapses, and a hung call to the coordinator must be over
// before the next renewal is due, at the shortest TTL.
const _: () = assert!(FLEET_KEEPALIVE_DIVISOR >= 2);
const _: () = assert!(
    FLEET_COORDINATOR_TIMEOUT.as_nanos()
        < FLEET_LEASE_TTL_MIN.as_nanos() / FLEET_KEEPALIVE_DIVISOR as u128
);
// One segment must fit what a restore may hold.
const _: () = assert!(FLEET_SEGMENT_MAX_BYTES as u64 <= FLEET_RESTORE_SEGMENTS_MAX_BYTES);
// The default TTL must be one the setting accepts.
const _: () = assert!(
    FLEET_LEASE_TTL_MIN.as_nanos() <= FLEET_LEASE_TTL_DEFAULT.as_nanos()
        && FLEET_LEASE_TTL_DEFAULT.as_nanos() <= FLEET_LEASE_TTL_MAX.as_nanos()
);
// An owner found unreachable is tried again well before the shortest lease lapses.
const _: () = assert!(FLEET_OWNER_RETRY_INTERVAL.as_nanos() < FLEET_LEASE_TTL_MIN.as_nanos() / 2);

/// Fewest bytes of the fleet key (`COMBD_FLEET_KEY_FILE`): HMAC-SHA-256 keys shorter than its
/// 32-byte output weaken it (RFC 2104, 3), and `openssl rand -hex 32`, the command README gives,
/// makes 64.
pub const FLEET_KEY_MIN_BYTES: usize = 32;

/// How far a signed fleet request's time may be from the receiver's clock, either way: a
/// request older than this is refused, so one captured on the network can be replayed only
/// within it, and within it the receiver remembers what it took ([`FLEET_AUTH_REPLAYS_MAX`]).
/// Fleet nodes run NTP (milliseconds apart); 30 s also rides out a clock stepped by a few
/// seconds at boot.
pub const FLEET_AUTH_SKEW: Duration = Duration::from_secs(30);

/// Signed fleet requests a node remembers (their time and nonce, 24 bytes each plus the
/// B-tree's) to refuse one seen again within [`FLEET_AUTH_SKEW`]: about 5 MB at most, and
/// 4,369 requests a second from the other nodes sustained (a request is remembered until its
/// time is [`FLEET_AUTH_SKEW`] past; 2,184 a second if every sender's clock ran the whole skew
/// ahead). The node's own forwards run on its SQLite threads, a few thousand a second at most. Past it a
/// signed request is answered 503 (retry-after 1) and counted in `fleet_auth_busy`, never
/// taken unremembered. Only requests whose MAC is good are remembered, so a client without the
/// key cannot fill it.
pub const FLEET_AUTH_REPLAYS_MAX: usize = 131_072;
