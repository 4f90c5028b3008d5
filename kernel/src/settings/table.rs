//! The settings table: every `COMBD_*` setting, declared once. From it come the [`Settings`]
//! struct, its loading, [`SETTINGS`] (which `--help`, `--check-config`, `/stats` `limits` and
//! README.md's table are written or checked from) and the `--help` text. See `declare.rs` for
//! the rows' form.

use super::shown::{fleet_object_idle, fleet_shown, given_or, lease_ttl};
use super::*;

settings_table! {
    fields {
        /// `COMBD_LISTEN`.
        listen: SocketAddr {
            env: "COMBD_LISTEN",
            flag: "--listen",
            text: limits::LISTEN_DEFAULT,
            parse: parse_listen,
            unit: Text,
            limit: none,
            meaning: "public address:port of the HTTP/WebSocket listener (:8080 or 8080 alone: \
                      0.0.0.0:8080; port 0 picks a free port); 127.0.0.1 on the same port is always \
                      served too (the localhost listener)",
        }
        /// `COMBD_DATA`.
        data_dir: PathBuf {
            env: "COMBD_DATA",
            flag: "--data",
            text: limits::DATA_DEFAULT,
            parse: parse_dir,
            unit: Text,
            limit: none,
            meaning: "data directory (created if missing; must be writable); objects' databases live \
                      under it; one node at a time (<data>/combd.lock)",
        }
        /// `COMBD_APPS_DIR`.
        apps_dir: PathBuf {
            env: "COMBD_APPS_DIR",
            flag: "--apps-dir",
            text: limits::APPS_DIR_DEFAULT,
            parse: parse_dir,
            unit: Text,
            limit: none,
            meaning: "directory of apps deployed as WebAssembly modules: each <app>.wasm or <app>.wat \
                      is app <app>; checked and compiled at start (a bad module stops it) and again on \
                      SIGHUP; the default directory may be missing (none deployed), one set \
                      explicitly must exist",
        }
        /// `COMBD_SHARDS`, resolved against the allowed CPUs.
        shards: usize {
            env: "COMBD_SHARDS",
            flag: "--shards",
            computed: "the CPUs this process may run on",
            parse: resolve_shards,
            unit: Count,
            limit: "shards",
            meaning: "number of shards (event loops), one pinned to each allowed CPU; at most that many",
        }
        /// `COMBD_LOG`: directives that are a level or `target=level` (see [`parse_log`]).
        log: String {
            env: "COMBD_LOG",
            flag: "--log",
            text: limits::LOG_DEFAULT,
            parse: parse_log,
            unit: Text,
            limit: none,
            meaning: "log filter: comma-separated directives, each a level (error, warn, info, debug, \
                      trace, off) or target=level",
        }
        /// `COMBD_ACCESS_LOG`.
        access_log: AccessLogSink {
            env: "COMBD_ACCESS_LOG",
            flag: "--access-log",
            text: "off",
            parse: parse_access_log,
            unit: Text,
            limit: none,
            meaning: "access log: off, stderr, or a file (opened for append at start, created 0640, \
                      reopened on SIGHUP); one JSON line per HTTP request and per WebSocket open and \
                      close, written off the event loop (lines past its queue are dropped and counted)",
        }
        /// `COMBD_BACKUP`: the backup's directory or bucket, or none.
        backup: Option<BackupTarget> {
            env: "COMBD_BACKUP",
            flag: "--backup",
            text: "off",
            parse: parse_backup,
            unit: Text,
            limit: none,
            meaning: "continuous backup of every object on a node alone: off, a directory (created \
                      if missing, outside the data directory) or s3://<bucket>/<prefix> (with the \
                      COMBD_BACKUP_S3_* settings) that every committed batch is written to, off the \
                      event loop, as bases and segments; combd restore rebuilds an object as of any \
                      moment or batch from it",
        }
        /// `COMBD_BACKUP_RETENTION`.
        backup_retention: Duration {
            env: "COMBD_BACKUP_RETENTION",
            flag: "--backup-retention",
            default: limits::BACKUP_RETENTION_DEFAULT,
            parse: parse_retention,
            unit: Duration,
            limit: "backup_retention_ms",
            meaning: "how far back a restore may go: the backup keeps every batch of this long (at \
                      least a minute; durations also take d, days)",
        }
        /// `COMBD_MAX_BODY`.
        max_body_bytes: u64 {
            env: "COMBD_MAX_BODY",
            flag: "--max-body",
            default: limits::MAX_BODY_DEFAULT_BYTES,
            parse: parse_bytes,
            unit: Bytes,
            limit: "max_body_bytes",
            meaning: "largest request body in bytes (K, M, G suffixes are binary); larger gets 413",
        }
        /// `COMBD_HEADER_TIMEOUT`.
        header_timeout: Duration {
            env: "COMBD_HEADER_TIMEOUT",
            flag: "--header-timeout",
            default: limits::HEADER_TIMEOUT_DEFAULT,
            parse: parse_duration,
            unit: Duration,
            limit: "header_timeout_ms",
            meaning: "a request head must be complete this long after its first byte (or the accept); \
                      else 408 and close",
        }
        /// `COMBD_BODY_TIMEOUT`.
        body_timeout: Duration {
            env: "COMBD_BODY_TIMEOUT",
            flag: "--body-timeout",
            default: limits::BODY_TIMEOUT_DEFAULT,
            parse: parse_duration,
            unit: Duration,
            limit: "body_timeout_ms",
            meaning: "a request body must be complete this long after its head; else 408 and close",
        }
        /// `COMBD_IDLE_TIMEOUT`.
        idle_timeout: Duration {
            env: "COMBD_IDLE_TIMEOUT",
            flag: "--idle-timeout",
            default: limits::IDLE_TIMEOUT_DEFAULT,
            parse: parse_duration,
            unit: Duration,
            limit: "idle_timeout_ms",
            meaning: "an HTTP keep-alive connection with no request in progress closes after this long",
        }
        /// `COMBD_WS_MAX_MESSAGE`.
        ws_max_message_bytes: u64 {
            env: "COMBD_WS_MAX_MESSAGE",
            flag: "--ws-max-message",
            default: limits::WS_MAX_MESSAGE_DEFAULT_BYTES,
            parse: parse_bytes,
            unit: Bytes,
            limit: "ws_max_message_bytes",
            meaning: "largest WebSocket message (after reassembly of fragments); larger closes with 1009",
        }
        /// `COMBD_WS_DEFLATE`.
        ws_deflate: bool {
            env: "COMBD_WS_DEFLATE",
            flag: "--ws-deflate",
            text: "on",
            parse: parse_switch,
            unit: Text,
            limit: none,
            show: |on: &bool| (if *on { "on" } else { "off" }).to_string(),
            meaning: "on: WebSockets negotiate permessage-deflate (RFC 7692) when the client offers it; \
                      off: never",
        }
        /// `COMBD_ALLOWED_ORIGINS`: the pages that may open a WebSocket or send a
        /// state-changing request besides the request's own host (`crate::origins`).
        allowed_origins: AllowedOrigins {
            env: "COMBD_ALLOWED_ORIGINS",
            flag: "--allowed-origins",
            computed: "none: only an Origin whose host is the request's Host",
            parse: resolve_allowed_origins,
            unit: Text,
            limit: none,
            show: |v: &AllowedOrigins| v.show(),
            meaning: "origins scheme://host[:port], comma-separated (at most 64), or *, whose pages may \
                      open a WebSocket or send a request other than GET, HEAD or OPTIONS; a request with \
                      no Origin (not a browser) or one whose host is the request's Host is always \
                      allowed; any other Origin, null included, gets 403 origin not allowed",
        }
        /// `COMBD_SHUTDOWN_TIMEOUT`.
        shutdown_timeout: Duration {
            env: "COMBD_SHUTDOWN_TIMEOUT",
            flag: "--shutdown-timeout",
            default: limits::SHUTDOWN_TIMEOUT_DEFAULT,
            parse: parse_duration,
            unit: Duration,
            limit: "shutdown_timeout_ms",
            meaning: "on SIGTERM/SIGINT, how long in-flight requests may take before the node exits",
        }
        /// `COMBD_MAX_CONNS` as configured; `/stats` shows it clamped to the fd limit
        /// ([`Settings::max_conns_effective`]).
        max_conns: u64 {
            env: "COMBD_MAX_CONNS",
            flag: "--max-conns",
            default: limits::MAX_CONNS_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "max_conns" = |_, in_force| in_force.max_conns,
            meaning: "most open public connections (plain and TLS); clamped to RLIMIT_NOFILE less a reserve \
                      of 256, 3 per object of COMBD_MAX_OPEN_OBJECTS and the localhost listener's own 1024 \
                      (the rest halved in a fleet, whose listener has a cap as large)",
        }
        /// `COMBD_MAX_CONNS_PER_ADDRESS`.
        max_conns_per_address: u32 {
            env: "COMBD_MAX_CONNS_PER_ADDRESS",
            flag: "--max-conns-per-address",
            default: limits::MAX_CONNS_PER_ADDRESS_DEFAULT as u32,
            parse: parse_count_u32,
            unit: Count,
            limit: "max_conns_per_address",
            meaning: "most open connections of one client address (IPv4 /32, IPv6 /64) on the public \
                      listeners; one more is closed at once after the accept (the localhost listener is exempt)",
        }
        /// `COMBD_CLIENT_SHARE_MAX_PERCENT`.
        client_share_max_percent: u64 {
            env: "COMBD_CLIENT_SHARE_MAX_PERCENT",
            flag: "--client-share-max-percent",
            default: limits::CLIENT_SHARE_MAX_PERCENT_DEFAULT,
            parse: parse_percent,
            unit: Count,
            limit: "client_share_max_percent",
            meaning: "the most of each shared pool (live objects, TLS handshakes in progress, object \
                      answers waiting to be written, object creations, input held, sessions' bytes waiting, \
                      the fleet's owner lookups) one client (a verified identity, else an IPv4 address or an \
                      IPv6 /64) may hold, in percent of the pool, even alone; 1 to 100 (the localhost listener \
                      is exempt)",
        }
        /// `COMBD_CLIENT_SHARE_MIN_PERCENT`.
        client_share_min_percent: u64 {
            env: "COMBD_CLIENT_SHARE_MIN_PERCENT",
            flag: "--client-share-min-percent",
            default: limits::CLIENT_SHARE_MIN_PERCENT_DEFAULT,
            parse: parse_percent,
            unit: Count,
            limit: "client_share_min_percent",
            meaning: "the least share of each shared pool a client is held to however many clients hold \
                      some of it, in percent of the pool; 1 to 100, at most COMBD_CLIENT_SHARE_MAX_PERCENT",
        }
        /// `COMBD_ACCEPT_RATE_PER_ADDRESS`.
        accept_rate_per_address: u32 {
            env: "COMBD_ACCEPT_RATE_PER_ADDRESS",
            flag: "--accept-rate-per-address",
            default: limits::ACCEPT_RATE_PER_ADDRESS_DEFAULT as u32,
            parse: parse_count_u32,
            unit: Count,
            limit: "accept_rate_per_address",
            meaning: "new connections a second one client address may open once it has spent its burst \
                      (COMBD_MAX_CONNS_PER_ADDRESS at once); one faster is closed at once after the accept",
        }
        /// `COMBD_MAX_OPEN_OBJECTS`.
        max_open_objects: u64 {
            env: "COMBD_MAX_OPEN_OBJECTS",
            flag: "--max-open-objects",
            default: limits::MAX_OPEN_OBJECTS_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "max_open_objects",
            meaning: "live objects on the node at once (3 file descriptors each, held back from \
                      COMBD_MAX_CONNS); a new object past it is refused with 503 overloaded",
        }
        /// `COMBD_MEMORY_BUDGET`, if set (else the budget comes from the cgroup or RAM).
        memory_budget_bytes: Option<u64> {
            env: "COMBD_MEMORY_BUDGET",
            flag: "--memory-budget",
            computed: "the memory cgroup's limit (v2 memory.max, else v1 memory.limit_in_bytes), \
                       else the machine's RAM",
            parse: optional_bytes,
            unit: Bytes,
            limit: "memory_budget_bytes" = |_, in_force| in_force.memory_budget_bytes,
            show: |v: &Option<u64>| given_or(v, "(from the cgroup or RAM)"),
            meaning: "memory the node may use, in bytes or with K, M, G, T (512M, 4G); pressure 1 at 80 %, \
                      2 (refusing at TCP) at 90 %",
        }
        /// `COMBD_MAX_AWAKE`.
        max_awake: usize {
            env: "COMBD_MAX_AWAKE",
            flag: "--max-awake",
            default: limits::MAX_AWAKE_DEFAULT,
            parse: parse_count_usize,
            unit: Count,
            limit: "max_awake",
            meaning: "cells (sessions, objects) at work at once per shard; a shard whose ready line is \
                      this long is behind",
        }
        /// `COMBD_RESTORES_AT_ONCE`.
        restores_at_once: usize {
            env: "COMBD_RESTORES_AT_ONCE",
            flag: "--restores-at-once",
            default: limits::RESTORES_AT_ONCE_DEFAULT,
            parse: parse_count_usize,
            unit: Count,
            limit: "restores_at_once",
            meaning: "objects opened (restored) at once per shard; the rest wait their turn in order",
        }
        /// `COMBD_SQLITE_SYNC`: true for `full`.
        sqlite_sync_full: bool {
            env: "COMBD_SQLITE_SYNC",
            flag: "--sqlite-sync",
            text: "full",
            parse: parse_sqlite_sync,
            unit: Text,
            limit: none,
            show: |full: &bool| (if *full { "full" } else { "normal" }).to_string(),
            meaning: "full: an answered write survives power loss; normal: it survives a process crash",
        }
        /// `COMBD_CPU_LIMIT_TICKS`.
        cpu_limit_ticks: u64 {
            env: "COMBD_CPU_LIMIT_TICKS",
            flag: "--cpu-limit-ticks",
            default: limits::CPU_LIMIT_TICKS_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "cpu_limit_ticks",
            meaning: "ticks one call of a cell may count (cx.tick(); each host call counts 1000); past it: cpu_limit",
        }
        /// `COMBD_MODULE_MEMORY_MAX`.
        module_memory_max_bytes: u64 {
            env: "COMBD_MODULE_MEMORY_MAX",
            flag: "--module-memory-max",
            default: limits::MODULE_MEMORY_MAX_DEFAULT_BYTES,
            parse: parse_bytes,
            unit: Bytes,
            limit: "module_memory_max_bytes",
            meaning: "most memory a WebAssembly module may ask for with memory_kb() (its instances' \
                      memory and what the node holds for a call); a module asking more is refused at load",
        }
        /// `COMBD_WS_RATE`.
        ws_rate: u64 {
            env: "COMBD_WS_RATE",
            flag: "--ws-rate",
            default: limits::WS_RATE_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "ws_rate",
            meaning: "WebSocket messages per second per connection (token refill); past the burst: close 1008",
        }
        /// `COMBD_WS_BURST`.
        ws_burst: u64 {
            env: "COMBD_WS_BURST",
            flag: "--ws-burst",
            default: limits::WS_BURST_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "ws_burst",
            meaning: "WebSocket messages a connection may send at once (the token bucket's capacity)",
        }
        /// `COMBD_WS_INFLATE_RATE`.
        ws_inflate_rate_bytes: u64 {
            env: "COMBD_WS_INFLATE_RATE",
            flag: "--ws-inflate-rate",
            default: limits::WS_INFLATE_RATE_DEFAULT_BYTES,
            parse: parse_bytes,
            unit: Bytes,
            limit: "ws_inflate_rate_bytes",
            meaning: "bytes a second a WebSocket's compressed messages may decompress to (a token bucket \
                      holding a second of it or the largest message, whichever is more); past it: close 1008",
        }
        /// `COMBD_OUTBOUND_BUDGET`, if set (else derived from the memory budget at start-up).
        outbound_budget_bytes: Option<u64> {
            env: "COMBD_OUTBOUND_BUDGET",
            flag: "--outbound-budget",
            computed: "a quarter of the memory budget, split over the shards",
            parse: optional_bytes,
            unit: Bytes,
            limit: "outbound_budget_bytes" = |_, in_force| in_force.outbound_budget_bytes,
            show: |v: &Option<u64>| given_or(v, "(from the memory budget)"),
            meaning: "bytes waiting to be written per shard, all connections together; a send past it closes \
                      the connection it was for",
        }
        /// `COMBD_INBOUND_BUDGET`, if set (else derived from the memory budget at start-up).
        inbound_budget_bytes: Option<u64> {
            env: "COMBD_INBOUND_BUDGET",
            flag: "--inbound-budget",
            computed: "a quarter of the memory budget, split over the shards",
            parse: optional_bytes,
            unit: Bytes,
            limit: "inbound_budget_bytes" = |_, in_force| in_force.inbound_budget_bytes,
            show: |v: &Option<u64>| given_or(v, "(from the memory budget)"),
            meaning: "bytes of clients' input (request bodies, WebSocket messages) waiting in mailboxes and \
                      inboxes per shard, all connections together; past it new input is refused (503 overloaded), \
                      but a connection with less than 4 KiB waiting may always queue a small input",
        }
        /// `COMBD_DB_MAX`.
        db_max_bytes: u64 {
            env: "COMBD_DB_MAX",
            flag: "--db-max",
            default: limits::DB_MAX_BYTES,
            parse: parse_bytes,
            unit: Bytes,
            limit: "db_max_bytes",
            meaning: "largest database of one object; a write past it fails with db_full (507)",
        }
        /// `COMBD_MAX_OBJECTS_PER_APP`.
        max_objects_per_app: u64 {
            env: "COMBD_MAX_OBJECTS_PER_APP",
            flag: "--max-objects-per-app",
            default: limits::MAX_OBJECTS_PER_APP_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "max_objects_per_app",
            meaning: "databases one app may have on the node (counted at start-up, then as they are \
                      created); past it a write to a new object gets 507 too many objects",
        }
        /// `COMBD_OBJECT_CREATE_RATE`: objects created per second per shard.
        object_create_rate: u64 {
            env: "COMBD_OBJECT_CREATE_RATE",
            flag: "--object-create-rate",
            default: limits::OBJECT_CREATE_RATE_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "object_create_rate",
            meaning: "object databases a shard creates per second (a token bucket holding 10 s of it); \
                      past it a write to a new object gets 429 object creation rate",
        }
        /// `COMBD_PRESENCE_MAX`: members listed in presence on the node.
        presence_max: u64 {
            env: "COMBD_PRESENCE_MAX",
            flag: "--presence-max",
            default: limits::PRESENCE_MAX_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "presence_max",
            meaning: "members listed in the presence of every topic on the node together, a shared pool \
                      (each client held to its share); a session attaching past it is attached but not \
                      listed",
        }
        /// `COMBD_PRESENCE_TOPIC_MAX`: members listed in one topic's presence.
        presence_topic_max: u64 {
            env: "COMBD_PRESENCE_TOPIC_MAX",
            flag: "--presence-topic-max",
            default: limits::PRESENCE_TOPIC_MAX_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "presence_topic_max",
            meaning: "members listed in one topic's presence; a session attaching past it is attached but \
                      not listed (counted in the topic's unlisted)",
        }
        /// `COMBD_WS_SUBSCRIPTIONS`: subscriptions on one multiplexed WebSocket.
        ws_subscriptions: u64 {
            env: "COMBD_WS_SUBSCRIPTIONS",
            flag: "--ws-subscriptions",
            default: limits::WS_SUBSCRIPTIONS_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "ws_subscriptions",
            meaning: "subscriptions one multiplexed WebSocket (/ws) carries at once; past it a subscribe is \
                      refused (429 too many subscriptions) and the socket's others go on",
        }
        /// `COMBD_SUBSCRIPTIONS_MAX`: subscriptions of every multiplexed WebSocket on the node.
        subscriptions_max: u64 {
            env: "COMBD_SUBSCRIPTIONS_MAX",
            flag: "--subscriptions-max",
            default: limits::SUBSCRIPTIONS_MAX_DEFAULT,
            parse: parse_count,
            unit: Count,
            limit: "subscriptions_max",
            meaning: "subscriptions of every multiplexed WebSocket on the node together, a shared pool \
                      (each client held to its share); past it or its share a subscribe is refused \
                      (503 overloaded)",
        }
        /// `COMBD_TLS_HANDSHAKE_TIMEOUT`: from the accept to the handshake's end.
        tls_handshake_timeout: Duration {
            env: "COMBD_TLS_HANDSHAKE_TIMEOUT",
            flag: "--tls-handshake-timeout",
            default: limits::TLS_HANDSHAKE_TIMEOUT_DEFAULT,
            parse: parse_duration,
            unit: Duration,
            limit: "tls_handshake_timeout_ms",
            meaning: "a TLS handshake (its ClientHello included) must complete this long after the accept; \
                      else the connection closes; a handshake slot is held only once the ClientHello is in",
        }
        /// `COMBD_TLS_HELLO_TIMEOUT`: from the accept to the complete ClientHello; at most
        /// [`Settings::tls_handshake_timeout`].
        tls_hello_timeout: Duration {
            env: "COMBD_TLS_HELLO_TIMEOUT",
            flag: "--tls-hello-timeout",
            default: limits::TLS_HELLO_TIMEOUT_DEFAULT,
            parse: parse_duration,
            unit: Duration,
            limit: "tls_hello_timeout_ms",
            meaning: "a TLS client's complete ClientHello must arrive this long after the accept; else the \
                      connection closes (tls_hello_timeouts); at most COMBD_TLS_HANDSHAKE_TIMEOUT",
        }
        /// `COMBD_WS_PING_INTERVAL`.
        ws_ping_interval: Duration {
            env: "COMBD_WS_PING_INTERVAL",
            flag: "--ws-ping-interval",
            default: limits::WS_PING_INTERVAL_DEFAULT,
            parse: parse_duration,
            unit: Duration,
            limit: "ws_ping_interval_ms",
            meaning: "the node pings every WebSocket this often; one that has not answered (sent anything) \
                      by the next ping is closed",
        }
        /// `COMBD_WS_SLOW_TIMEOUT`.
        ws_slow_timeout: Duration {
            env: "COMBD_WS_SLOW_TIMEOUT",
            flag: "--ws-slow-timeout",
            default: limits::WS_SLOW_TIMEOUT_DEFAULT,
            parse: parse_duration,
            unit: Duration,
            limit: "ws_slow_timeout_ms",
            meaning: "a WebSocket with messages waiting that takes none of them for this long is closed \
                      (1008 slow), as is one with 8 MiB waiting",
        }
    }
    groups {
        /// `COMBD_TLS_LISTEN`, `COMBD_TLS_CERT`, `COMBD_TLS_KEY`, when TLS is on.
        tls: Option<TlsSettings> = tls_group {
            {
                env: "COMBD_TLS_LISTEN",
                flag: "--tls-listen",
                default: DefaultValue::Described("off"),
                unit: Text,
                limit: none,
                value: |s| s.tls.as_ref().map_or("off".into(), |t| t.listen.to_string()),
                meaning: "public address:port of the HTTPS/WSS listener (127.0.0.1 on the same port is served too, \
                          so not COMBD_LISTEN's port); needs COMBD_TLS_CERT and COMBD_TLS_KEY",
            }
            {
                env: "COMBD_TLS_CERT",
                flag: "--tls-cert",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.tls.as_ref().map_or("none".into(), |t| t.cert.show()),
                meaning: "PEM file with the certificate chain, end-entity first; reloaded on SIGHUP",
            }
            {
                env: "COMBD_TLS_KEY",
                flag: "--tls-key",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.tls.as_ref().map_or("none".into(), |t| t.key.show()),
                meaning: "PEM file with the private key (PKCS#8, RSA or EC) matching the certificate; reloaded on SIGHUP",
            }
        }
        /// `COMBD_AUTH_JWT_KEY_FILE`, `COMBD_AUTH_ISSUER`, `COMBD_AUTH_AUDIENCE`, when verified
        /// identity is on.
        auth: Option<AuthSettings> = auth_group {
            {
                env: "COMBD_AUTH_JWT_KEY_FILE",
                flag: "--auth-jwt-key-file",
                default: DefaultValue::Described("off"),
                unit: Text,
                limit: none,
                value: |s| s.auth.as_ref().map_or("off".into(), |a| a.key_file.show()),
                meaning: "the key that signs clients' tokens (JWT): an HS256 secret on one line (at least 32 \
                          bytes), or a PEM public key (RSA: RS256, P-256: ES256, Ed25519: EdDSA); read at \
                          start-up (a bad file stops it) and again on SIGHUP (a bad one keeps the old key)",
            }
            {
                env: "COMBD_AUTH_ISSUER",
                flag: "--auth-issuer",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.auth.as_ref().and_then(|a| a.issuer.clone()).unwrap_or_else(|| "none".into()),
                meaning: "the iss a token must carry; needs COMBD_AUTH_JWT_KEY_FILE",
            }
            {
                env: "COMBD_AUTH_AUDIENCE",
                flag: "--auth-audience",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.auth.as_ref().and_then(|a| a.audience.clone()).unwrap_or_else(|| "none".into()),
                meaning: "an aud a token must carry (unset: any or none); needs COMBD_AUTH_JWT_KEY_FILE",
            }
        }
        /// The `COMBD_BACKUP_S3_*` settings and `COMBD_BACKUP_KEY_FILE`, with an `s3://` backup.
        backup_s3: Option<BackupBucketSettings> = backup_bucket_group {
            {
                env: "COMBD_BACKUP_S3_URL",
                flag: "--backup-s3-url",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.backup_s3.as_ref().map_or("none".into(), |b| b.url.clone()),
                meaning: "the S3 endpoint of an s3:// COMBD_BACKUP, http://host:port or https://host:port \
                          (the built-in Mozilla roots are trusted); required with one, and needs the \
                          other COMBD_BACKUP_S3_* settings and COMBD_BACKUP_KEY_FILE",
            }
            {
                env: "COMBD_BACKUP_S3_REGION",
                flag: "--backup-s3-region",
                default: DefaultValue::Value(|| limits::FLEET_BUCKET_REGION_DEFAULT.to_string()),
                unit: Text,
                limit: none,
                value: |s| s.backup_s3.as_ref().map_or_else(
                    || limits::FLEET_BUCKET_REGION_DEFAULT.to_string(),
                    |b| b.region.clone(),
                ),
                meaning: "the region the backup bucket's S3 signatures name (the server's own)",
            }
            {
                env: "COMBD_BACKUP_S3_ACCESS_KEY",
                flag: "--backup-s3-access-key",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.backup_s3.as_ref().map_or("none".into(), |b| b.access_key.clone()),
                meaning: "the backup bucket's access key id",
            }
            {
                env: "COMBD_BACKUP_S3_SECRET_KEY_FILE",
                flag: "--backup-s3-secret-key-file",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.backup_s3.as_ref().map_or("none".into(), |b| b.secret_key_file.show()),
                meaning: "file holding the backup bucket's secret key (one line), read at start-up",
            }
            {
                env: "COMBD_BACKUP_KEY_FILE",
                flag: "--backup-key-file",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.backup_s3.as_ref().map_or("none".into(), |b| b.key_file.show()),
                meaning: "file holding the key that seals what the backup stores in its bucket (one line, at \
                          least 32 bytes: openssl rand -hex 32), read at start-up; a restore takes back only \
                          what was sealed with it (keep a copy away from the node)",
            }
        }
        /// The `COMBD_FLEET_*` settings when the fleet is on (`COMBD_FLEET_ETCD` set); none for
        /// a node alone, which works exactly as without them.
        fleet: Option<FleetSettings> = fleet_group {
            {
                env: "COMBD_FLEET_ETCD",
                flag: "--fleet-etcd",
                default: DefaultValue::Described("off"),
                unit: Text,
                limit: none,
                value: |s| s.fleet.as_ref().map_or("off".into(), |f| f.etcd.join(",")),
                meaning: "the fleet's coordinator: comma-separated etcd endpoints (http://host:port, or all \
                          https://host:port; at most 7); setting it turns the fleet on and requires the other \
                          COMBD_FLEET_* settings",
            }
            {
                env: "COMBD_FLEET_ETCD_CERT_FILE",
                flag: "--fleet-etcd-cert-file",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| fleet_shown(s, |f| f.etcd_client_cert.as_ref().map(|(c, _)| c.show())),
                meaning: "PEM client certificate chain shown to etcd over https (its --client-cert-auth), \
                          read at start-up; needs COMBD_FLEET_ETCD_KEY_FILE",
            }
            {
                env: "COMBD_FLEET_ETCD_KEY_FILE",
                flag: "--fleet-etcd-key-file",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| fleet_shown(s, |f| f.etcd_client_cert.as_ref().map(|(_, k)| k.show())),
                meaning: "PEM private key of COMBD_FLEET_ETCD_CERT_FILE, read at start-up",
            }
            {
                env: "COMBD_FLEET_ETCD_USER",
                flag: "--fleet-etcd-user",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| fleet_shown(s, |f| f.etcd_user.as_ref().map(|(u, _)| u.clone())),
                meaning: "the etcd user (RBAC) the node authenticates as over https; needs \
                          COMBD_FLEET_ETCD_PASSWORD_FILE",
            }
            {
                env: "COMBD_FLEET_ETCD_PASSWORD_FILE",
                flag: "--fleet-etcd-password-file",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| fleet_shown(s, |f| f.etcd_user.as_ref().map(|(_, p)| p.show())),
                meaning: "file holding COMBD_FLEET_ETCD_USER's password (one line), read at start-up",
            }
            {
                env: "COMBD_FLEET_CA_FILE",
                flag: "--fleet-ca-file",
                default: DefaultValue::Described("the built-in Mozilla roots"),
                unit: Text,
                limit: none,
                value: |s| fleet_shown(s, |f| f.ca_file.as_ref().map(|p| p.show())),
                meaning: "PEM certificates of the authorities trusted for the https endpoints of etcd and the \
                          bucket (instead of the built-in Mozilla roots), read at start-up",
            }
            {
                env: "COMBD_FLEET_BUCKET_URL",
                flag: "--fleet-bucket-url",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.fleet.as_ref().map_or("none".into(), |f| f.bucket_url.clone()),
                meaning: "the fleet's bucket: an S3 endpoint, http://host:port or https://host:port (required \
                          with COMBD_FLEET_ETCD)",
            }
            {
                env: "COMBD_FLEET_BUCKET",
                flag: "--fleet-bucket",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.fleet.as_ref().map_or("none".into(), |f| f.bucket.clone()),
                meaning: "the bucket's name (S3 rules: 3 to 63 of a-z 0-9 . -); objects' segments and \
                          snapshots live in it",
            }
            {
                env: "COMBD_FLEET_BUCKET_REGION",
                flag: "--fleet-bucket-region",
                default: DefaultValue::Value(|| limits::FLEET_BUCKET_REGION_DEFAULT.to_string()),
                unit: Text,
                limit: none,
                value: |s| s.fleet.as_ref().map_or_else(
                    || limits::FLEET_BUCKET_REGION_DEFAULT.to_string(),
                    |f| f.bucket_region.clone(),
                ),
                meaning: "the region the bucket's S3 signatures name: the server's own (Garage's s3_region)",
            }
            {
                env: "COMBD_FLEET_ACCESS_KEY",
                flag: "--fleet-access-key",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.fleet.as_ref().map_or("none".into(), |f| f.access_key.clone()),
                meaning: "the bucket's access key id",
            }
            {
                env: "COMBD_FLEET_SECRET_KEY_FILE",
                flag: "--fleet-secret-key-file",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.fleet.as_ref().map_or("none".into(), |f| f.secret_key_file.show()),
                meaning: "file holding the bucket's secret key (one line), read at start-up",
            }
            {
                env: "COMBD_FLEET_KEY_FILE",
                flag: "--fleet-key-file",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.fleet.as_ref().map_or("none".into(), |f| f.key_file.show()),
                meaning: "file holding the fleet key (one line, at least 32 bytes: openssl rand -hex 32), the \
                          same on every node, read at start-up: it signs what one node passes on to another",
            }
            {
                env: "COMBD_FLEET_NODE_PUBLIC",
                flag: "--fleet-node-public",
                default: DefaultValue::Described("off"),
                unit: Text,
                limit: none,
                value: |s| (if s.fleet.as_ref().is_some_and(|f| f.node_public) { "on" } else { "off" }).to_string(),
                meaning: "on: the fleet address (this node's, and each owner's it dials) may be a public one; \
                          off: only loopback and private networks",
            }
            {
                env: "COMBD_FLEET_NODE",
                flag: "--fleet-node",
                default: DefaultValue::Described("none"),
                unit: Text,
                limit: none,
                value: |s| s.fleet.as_ref().map_or("none".into(), |f| f.node.to_string()),
                meaning: "ip:port other nodes reach this node at (its fleet address), recorded as the owner \
                          of the objects it claims",
            }
            {
                env: "COMBD_FLEET_LEASE_TTL",
                flag: "--fleet-lease-ttl",
                default: DefaultValue::Value(|| {
                    Unit::Duration.human(limits::FLEET_LEASE_TTL_DEFAULT.as_limit())
                }),
                unit: Duration,
                limit: "fleet_lease_ttl_ms" = |s, _| lease_ttl(s).as_limit(),
                value: |s| lease_ttl(s).show(),
                meaning: "how long the node's lease outlives its last renewal (renewed every third of it): \
                          a dead owner's objects move after this long; whole seconds, 2s to 60s",
            }
            {
                env: "COMBD_FLEET_OBJECT_IDLE",
                flag: "--fleet-object-idle",
                default: DefaultValue::Value(|| {
                    Unit::Duration.human(limits::FLEET_OBJECT_IDLE_DEFAULT.as_limit())
                }),
                unit: Duration,
                limit: "fleet_object_idle_ms" = |s, _| fleet_object_idle(s).as_limit(),
                value: |s| fleet_object_idle(s).show(),
                meaning: "how long a fleet object waits for mail before it is let go (a reopen claims it in \
                          etcd again); 1s to 1h",
            }
        }
    }
}
