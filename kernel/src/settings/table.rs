//! The settings table: every `COMBD_*` variable with its flag, default and meaning, and the
//! `--help` text written from it.

use super::*;

/// One setting: its variable, its flag, its default and what it means.
#[derive(Debug, Clone, Copy)]
pub struct SettingSpec {
    /// The environment variable, e.g. `COMBD_LISTEN`.
    pub env: &'static str,
    /// The command-line flag, e.g. `--listen`.
    pub flag: &'static str,
    /// The default as text, or a description of how it is computed.
    pub default: &'static str,
    /// One line on what it does.
    pub meaning: &'static str,
}

/// Every setting of the node. `--help` and README.md list exactly these.
pub const SETTINGS: &[SettingSpec] = &[
    SettingSpec {
        env: "COMBD_LISTEN",
        flag: "--listen",
        default: limits::LISTEN_DEFAULT,
        meaning: "public address:port of the HTTP/WebSocket listener (port 0 picks a free port); \
                  127.0.0.1 on the same port is always served too (the localhost listener)",
    },
    SettingSpec {
        env: "COMBD_DATA",
        flag: "--data",
        default: limits::DATA_DEFAULT,
        meaning: "data directory (created if missing; must be writable); objects' databases live \
                  under it; one node at a time (<data>/combd.lock)",
    },
    SettingSpec {
        env: "COMBD_APPS_DIR",
        flag: "--apps-dir",
        default: limits::APPS_DIR_DEFAULT,
        meaning: "directory of apps deployed as WebAssembly modules: each <app>.wasm or <app>.wat \
                  is app <app>; checked and compiled at start (a bad module stops it) and again on \
                  SIGHUP; a missing directory deploys none",
    },
    SettingSpec {
        env: "COMBD_SHARDS",
        flag: "--shards",
        default: "the CPUs this process may run on",
        meaning:
            "number of shards (event loops), one pinned to each allowed CPU; at most that many",
    },
    SettingSpec {
        env: "COMBD_LOG",
        flag: "--log",
        default: limits::LOG_DEFAULT,
        meaning: "log filter: comma-separated directives, each a level (error, warn, info, debug, \
                  trace, off) or target=level",
    },
    SettingSpec {
        env: "COMBD_MAX_BODY",
        flag: "--max-body",
        default: "1M",
        meaning: "largest request body in bytes (K, M, G suffixes are binary); larger gets 413",
    },
    SettingSpec {
        env: "COMBD_HEADER_TIMEOUT",
        flag: "--header-timeout",
        default: "10s",
        meaning: "a request head must be complete this long after its first byte (or the accept); \
                  else 408 and close",
    },
    SettingSpec {
        env: "COMBD_BODY_TIMEOUT",
        flag: "--body-timeout",
        default: "30s",
        meaning: "a request body must be complete this long after its head; else 408 and close",
    },
    SettingSpec {
        env: "COMBD_IDLE_TIMEOUT",
        flag: "--idle-timeout",
        default: "60s",
        meaning: "an HTTP keep-alive connection with no request in progress closes after this long",
    },
    SettingSpec {
        env: "COMBD_WS_MAX_MESSAGE",
        flag: "--ws-max-message",
        default: "1M",
        meaning:
            "largest WebSocket message (after reassembly of fragments); larger closes with 1009",
    },
    SettingSpec {
        env: "COMBD_SHUTDOWN_TIMEOUT",
        flag: "--shutdown-timeout",
        default: "10s",
        meaning: "on SIGTERM/SIGINT, how long in-flight requests may take before the node exits",
    },
    SettingSpec {
        env: "COMBD_MAX_CONNS",
        flag: "--max-conns",
        default: "200000",
        meaning: "most open public connections (plain and TLS); clamped to RLIMIT_NOFILE less a reserve \
                  of 256, 3 per object of COMBD_MAX_OPEN_OBJECTS and the localhost listener's own 1024 \
                  (the rest halved in a fleet, whose listener has a cap as large)",
    },
    SettingSpec {
        env: "COMBD_MAX_CONNS_PER_ADDRESS",
        flag: "--max-conns-per-address",
        default: "1024",
        meaning: "most open connections of one client address (IPv4 /32, IPv6 /64) on the public \
                  listeners; one more is closed at once after the accept (the localhost listener is exempt)",
    },
    SettingSpec {
        env: "COMBD_ACCEPT_RATE_PER_ADDRESS",
        flag: "--accept-rate-per-address",
        default: "256",
        meaning: "new connections a second one client address may open once it has spent its burst \
                  (COMBD_MAX_CONNS_PER_ADDRESS at once); one faster is closed at once after the accept",
    },
    SettingSpec {
        env: "COMBD_MAX_OPEN_OBJECTS",
        flag: "--max-open-objects",
        default: "1024",
        meaning: "live objects on the node at once (3 file descriptors each, held back from \
                  COMBD_MAX_CONNS); a new object past it is refused with 503 overloaded",
    },
    SettingSpec {
        env: "COMBD_MEMORY_BUDGET",
        flag: "--memory-budget",
        default: "the memory cgroup's limit, else the machine's RAM",
        meaning:
            "memory the node may use, in bytes or with K, M, G, T (512M, 4G); pressure 1 at 80 %, \
                  2 (refusing at TCP) at 90 %",
    },
    SettingSpec {
        env: "COMBD_MAX_AWAKE",
        flag: "--max-awake",
        default: "1000",
        meaning:
            "cells (sessions, objects) at work at once per shard; a shard whose ready line is \
                  this long is behind",
    },
    SettingSpec {
        env: "COMBD_RESTORES_AT_ONCE",
        flag: "--restores-at-once",
        default: "4",
        meaning: "objects opened (restored) at once per shard; the rest wait their turn in order",
    },
    SettingSpec {
        env: "COMBD_SQLITE_SYNC",
        flag: "--sqlite-sync",
        default: "full",
        meaning: "full: an answered write survives power loss; normal: it survives a process crash",
    },
    SettingSpec {
        env: "COMBD_CPU_LIMIT_TICKS",
        flag: "--cpu-limit-ticks",
        default: "100000000",
        meaning: "ticks one call of a cell may count (cx.tick(); each host call counts 1000); past it: cpu_limit",
    },
    SettingSpec {
        env: "COMBD_WS_RATE",
        flag: "--ws-rate",
        default: "1000",
        meaning: "WebSocket messages per second per connection (token refill); past the burst: close 1008",
    },
    SettingSpec {
        env: "COMBD_WS_BURST",
        flag: "--ws-burst",
        default: "2000",
        meaning: "WebSocket messages a connection may send at once (the token bucket's capacity)",
    },
    SettingSpec {
        env: "COMBD_OUTBOUND_BUDGET",
        flag: "--outbound-budget",
        default: "a quarter of the memory budget, split over the shards",
        meaning: "bytes waiting to be written per shard, all connections together; a send past it closes \
                  the connection it was for",
    },
    SettingSpec {
        env: "COMBD_INBOUND_BUDGET",
        flag: "--inbound-budget",
        default: "a quarter of the memory budget, split over the shards",
        meaning: "bytes of clients' input (request bodies, WebSocket messages) waiting in mailboxes and \
                  inboxes per shard, all connections together; past it new input is refused (503 overloaded), \
                  but a connection with less than 4 KiB waiting may always queue a small input",
    },
    SettingSpec {
        env: "COMBD_DB_MAX",
        flag: "--db-max",
        default: "1G",
        meaning: "largest database of one object; a write past it fails with db_full (507)",
    },
    SettingSpec {
        env: "COMBD_MAX_OBJECTS_PER_APP",
        flag: "--max-objects-per-app",
        default: "100000",
        meaning: "databases one app may have on the node (counted at start-up, then as they are \
                  created); past it a write to a new object gets 507 too many objects",
    },
    SettingSpec {
        env: "COMBD_OBJECT_CREATE_RATE",
        flag: "--object-create-rate",
        default: "100",
        meaning: "object databases a shard creates per second (a token bucket holding 10 s of it); \
                  past it a write to a new object gets 429 object creation rate",
    },
    SettingSpec {
        env: "COMBD_TLS_LISTEN",
        flag: "--tls-listen",
        default: "off",
        meaning: "public address:port of the HTTPS/WSS listener (127.0.0.1 on the same port is served too, \
                  so not COMBD_LISTEN's port); needs COMBD_TLS_CERT and COMBD_TLS_KEY",
    },
    SettingSpec {
        env: "COMBD_TLS_CERT",
        flag: "--tls-cert",
        default: "none",
        meaning: "PEM file with the certificate chain, end-entity first; reloaded on SIGHUP",
    },
    SettingSpec {
        env: "COMBD_TLS_KEY",
        flag: "--tls-key",
        default: "none",
        meaning: "PEM file with the private key (PKCS#8, RSA or EC) matching the certificate; reloaded on SIGHUP",
    },
    SettingSpec {
        env: "COMBD_TLS_HANDSHAKE_TIMEOUT",
        flag: "--tls-handshake-timeout",
        default: "10s",
        meaning: "a TLS handshake (its ClientHello included) must complete this long after the accept; \
                  else the connection closes; a handshake slot is held only once the ClientHello is in",
    },
    SettingSpec {
        env: "COMBD_TLS_HELLO_TIMEOUT",
        flag: "--tls-hello-timeout",
        default: "2s",
        meaning: "a TLS client's complete ClientHello must arrive this long after the accept; else the \
                  connection closes (tls_hello_timeouts); at most COMBD_TLS_HANDSHAKE_TIMEOUT",
    },
    SettingSpec {
        env: "COMBD_WS_PING_INTERVAL",
        flag: "--ws-ping-interval",
        default: "30s",
        meaning: "the node pings every WebSocket this often; one that has not answered (sent anything) \
                  by the next ping is closed",
    },
    SettingSpec {
        env: "COMBD_WS_SLOW_TIMEOUT",
        flag: "--ws-slow-timeout",
        default: "30s",
        meaning: "a WebSocket with messages waiting that takes none of them for this long is closed \
                  (1008 slow), as is one with 8 MiB waiting",
    },
    SettingSpec {
        env: "COMBD_FLEET_ETCD",
        flag: "--fleet-etcd",
        default: "off",
        meaning: "the fleet's coordinator: comma-separated etcd endpoints (http://host:port, at most 7); \
                  setting it turns the fleet on and requires the other COMBD_FLEET_* settings",
    },
    SettingSpec {
        env: "COMBD_FLEET_BUCKET_URL",
        flag: "--fleet-bucket-url",
        default: "none",
        meaning: "the fleet's bucket: an S3 endpoint, http://host:port (required with COMBD_FLEET_ETCD)",
    },
    SettingSpec {
        env: "COMBD_FLEET_BUCKET",
        flag: "--fleet-bucket",
        default: "none",
        meaning: "the bucket's name (S3 rules: 3 to 63 of a-z 0-9 . -); objects' segments and \
                  snapshots live in it",
    },
    SettingSpec {
        env: "COMBD_FLEET_BUCKET_REGION",
        flag: "--fleet-bucket-region",
        default: "garage",
        meaning: "the region the bucket's S3 signatures name: the server's own (Garage's s3_region)",
    },
    SettingSpec {
        env: "COMBD_FLEET_ACCESS_KEY",
        flag: "--fleet-access-key",
        default: "none",
        meaning: "the bucket's access key id",
    },
    SettingSpec {
        env: "COMBD_FLEET_SECRET_KEY_FILE",
        flag: "--fleet-secret-key-file",
        default: "none",
        meaning: "file holding the bucket's secret key (one line), read at start-up",
    },
    SettingSpec {
        env: "COMBD_FLEET_NODE",
        flag: "--fleet-node",
        default: "none",
        meaning: "ip:port other nodes reach this node at (its fleet address), recorded as the owner \
                  of the objects it claims",
    },
    SettingSpec {
        env: "COMBD_FLEET_LEASE_TTL",
        flag: "--fleet-lease-ttl",
        default: "10s",
        meaning: "how long the node's lease outlives its last renewal (renewed every third of it): \
                  a dead owner's objects move after this long; whole seconds, 2s to 60s",
    },
    SettingSpec {
        env: "COMBD_TEST_APPS",
        flag: "--test-apps",
        default: "off",
        meaning:
            "on: also serve the test apps (hold: a request that takes ?ms=N); never in production",
    },
];

pub(super) fn spec_by_flag(flag: &str) -> Option<&'static SettingSpec> {
    SETTINGS.iter().find(|s| s.flag == flag)
}

/// The `--help` text, written from [`SETTINGS`].
pub fn help_text() -> String {
    let mut out = String::from(
        "combd: a realtime application server (HTTP/1.1 and WebSocket on io_uring)\n\n\
         Usage: combd [--flag value]...\n\n\
         Every setting is an environment variable with a matching flag; a flag wins.\n\n",
    );
    for s in SETTINGS {
        out.push_str(&format!(
            "  {:<22} {:<22} default: {}\n      {}\n",
            s.flag, s.env, s.default, s.meaning
        ));
    }
    out.push_str(
        "\n  --check-config         validate the settings, print every effective limit and where it came from\n  \
         -h, --help             this text\n  -V, --version          the version\n\n\
         Subcommand: combd top [--port P] [--once] [--json]   a live per-shard view of /stats (q quits)\n",
    );
    out
}
