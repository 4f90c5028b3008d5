//! The node's settings: one table, one parser, one validator.
//!
//! Every setting is an environment variable `COMBD_*` with a matching command-line flag; a flag
//! wins over the environment, which wins over the default. [`SETTINGS`] is the table that
//! `--help` and the README are written from. [`Settings::load`] parses and validates all of
//! them at once; the first invalid one fails start-up with a [`ConfigError`] naming it. Zero
//! never means "unlimited": a zero size, count or timeout is an error.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::limits;

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
        meaning: "most open connections; clamped to RLIMIT_NOFILE less a reserve of 256",
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
        env: "COMBD_DB_MAX",
        flag: "--db-max",
        default: "1G",
        meaning: "largest database of one object; a write past it fails with db_full (507)",
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
        meaning: "a TLS handshake must complete this long after the accept; else the connection closes",
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
        env: "COMBD_TEST_APPS",
        flag: "--test-apps",
        default: "off",
        meaning:
            "on: also serve the test apps (hold: a request that takes ?ms=N); never in production",
    },
];

/// A setting that failed validation. Its `Display` is the one line printed at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The environment variable name of the setting (or the flag, for an unknown flag).
    pub setting: String,
    /// What is wrong with it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.setting, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Where a setting's effective value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The built-in default.
    Default,
    /// The environment variable.
    Env,
    /// The command-line flag.
    Flag,
}

/// What the command line asked for besides settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run the node.
    Run,
    /// Print the help text and exit.
    Help,
    /// Print the version and exit.
    Version,
    /// Validate the settings, print every effective limit with its source, and exit.
    CheckConfig,
}

/// The validated settings of a node.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `COMBD_LISTEN`.
    pub listen: SocketAddr,
    /// `COMBD_DATA`.
    pub data_dir: PathBuf,
    /// `COMBD_SHARDS`, resolved against the allowed CPUs.
    pub shards: usize,
    /// `COMBD_LOG`: directives that are a level or `target=level` (see [`parse_log`]).
    pub log: String,
    /// `COMBD_MAX_BODY`.
    pub max_body_bytes: u64,
    /// `COMBD_HEADER_TIMEOUT`.
    pub header_timeout: Duration,
    /// `COMBD_BODY_TIMEOUT`.
    pub body_timeout: Duration,
    /// `COMBD_IDLE_TIMEOUT`.
    pub idle_timeout: Duration,
    /// `COMBD_WS_MAX_MESSAGE`.
    pub ws_max_message_bytes: u64,
    /// `COMBD_SHUTDOWN_TIMEOUT`.
    pub shutdown_timeout: Duration,
    /// `COMBD_MAX_CONNS` as configured (before clamping to the fd limit).
    pub max_conns: u64,
    /// `COMBD_MEMORY_BUDGET`, if set (else the budget comes from the cgroup or RAM).
    pub memory_budget_bytes: Option<u64>,
    /// `COMBD_MAX_AWAKE`.
    pub max_awake: usize,
    /// `COMBD_RESTORES_AT_ONCE`.
    pub restores_at_once: usize,
    /// `COMBD_SQLITE_SYNC`: true for `full`.
    pub sqlite_sync_full: bool,
    /// `COMBD_TEST_APPS`.
    pub test_apps: bool,
    /// `COMBD_CPU_LIMIT_TICKS`.
    pub cpu_limit_ticks: u64,
    /// `COMBD_DB_MAX`.
    pub db_max_bytes: u64,
    /// `COMBD_TLS_LISTEN`, `COMBD_TLS_CERT`, `COMBD_TLS_KEY`, when TLS is on.
    pub tls: Option<TlsSettings>,
    /// `COMBD_TLS_HANDSHAKE_TIMEOUT`.
    pub tls_handshake_timeout: Duration,
    /// `COMBD_WS_PING_INTERVAL`.
    pub ws_ping_interval: Duration,
    /// `COMBD_WS_SLOW_TIMEOUT`.
    pub ws_slow_timeout: Duration,
    /// `COMBD_WS_RATE`.
    pub ws_rate: u64,
    /// `COMBD_WS_BURST`.
    pub ws_burst: u64,
    /// `COMBD_OUTBOUND_BUDGET`, if set (else derived from the memory budget at start-up).
    pub outbound_budget_bytes: Option<u64>,
    /// Where each setting came from, by environment variable name.
    pub sources: BTreeMap<&'static str, Source>,
}

fn err(setting: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        setting: setting.to_string(),
        message: message.into(),
    }
}

/// Parses a byte size: a whole number, optionally followed by `K`, `M`, `G` or `T` (binary
/// units, case-insensitive, an optional trailing `B` or `iB`). Zero is refused.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "{text:?} is not a size: expected bytes, or a number with K, M, G or T (e.g. 512M)"
        ));
    }
    let shift = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?}: use K, M, G or T"
            ))
        }
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is too large"))?;
    let bytes = n
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes == 0 {
        return Err("must be at least 1 byte (zero does not mean unlimited)".to_string());
    }
    Ok(bytes)
}

/// Parses a duration: `500ms`, `10s`, `2m`, `1h`, or a bare whole number of seconds.
/// Zero is refused.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "{text:?} is not a duration: expected e.g. 500ms, 10s, 2m"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is too large"))?;
    let ms_per = match unit {
        "ms" => 1,
        "" | "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?}: use ms, s, m or h"
            ))
        }
    };
    let ms = n
        .checked_mul(ms_per)
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if ms == 0 {
        return Err("must be longer than zero (zero does not mean unlimited)".to_string());
    }
    Ok(Duration::from_millis(ms))
}

/// Parses a positive whole count. Zero is refused.
pub fn parse_count(text: &str) -> Result<u64, String> {
    let t = text.trim().replace('_', "");
    let n: u64 = t
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    if n == 0 {
        return Err("must be at least 1 (zero does not mean unlimited)".to_string());
    }
    Ok(n)
}

/// The TLS listener and its certificate files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// `COMBD_TLS_LISTEN`.
    pub listen: SocketAddr,
    /// `COMBD_TLS_CERT`.
    pub cert: PathBuf,
    /// `COMBD_TLS_KEY`.
    pub key: PathBuf,
}

fn tls_settings(
    listen: Option<&str>,
    cert: Option<&str>,
    key: Option<&str>,
) -> Result<Option<TlsSettings>, ConfigError> {
    let Some(listen) = listen else {
        if cert.is_some() {
            return Err(err("COMBD_TLS_CERT", "is set but COMBD_TLS_LISTEN is not"));
        }
        if key.is_some() {
            return Err(err("COMBD_TLS_KEY", "is set but COMBD_TLS_LISTEN is not"));
        }
        return Ok(None);
    };
    let listen = parse_listen(listen).map_err(|m| err("COMBD_TLS_LISTEN", m))?;
    let cert = cert
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| err("COMBD_TLS_CERT", "required with COMBD_TLS_LISTEN"))?;
    let key = key
        .filter(|k| !k.trim().is_empty())
        .ok_or_else(|| err("COMBD_TLS_KEY", "required with COMBD_TLS_LISTEN"))?;
    Ok(Some(TlsSettings {
        listen,
        cert: PathBuf::from(cert),
        key: PathBuf::from(key),
    }))
}

/// Parses an on/off switch: `on`, `off`, `true`, `false`, `1`, `0`.
pub fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        other => Err(format!("{other:?}: use on or off")),
    }
}

/// Parses a listen address `ip:port`. The localhost listener owns `127.0.0.1`, so the public
/// address may not be it.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not an address:port (e.g. 0.0.0.0:8080)"))?;
    if addr.ip() == std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST) {
        return Err(
            "127.0.0.1 is the localhost listener's address, which is always served on \
                    the same port; listen on 0.0.0.0 or another address (e.g. 127.0.0.2)"
                .to_string(),
        );
    }
    Ok(addr)
}

fn spec_by_flag(flag: &str) -> Option<&'static SettingSpec> {
    SETTINGS.iter().find(|s| s.flag == flag)
}

/// The levels `COMBD_LOG` takes, alone or after `target=`.
pub const LOG_LEVELS: &[&str] = &["error", "warn", "info", "debug", "trace", "off"];

/// Parses `COMBD_LOG`: comma-separated directives, each a level ([`LOG_LEVELS`]) or
/// `target=level` with a module path as target (`combd_shards=debug`). Returns the filter with
/// blanks around directives removed. Anything else is refused: a bare word that is not a level
/// (`verbose`) would otherwise be read by the logger as a target name and turn logging off.
pub fn parse_log(text: &str) -> Result<String, String> {
    const USE: &str =
        "use error, warn, info, debug, trace or off, or target=level directives separated by commas";
    let t = text.trim();
    if t.is_empty() {
        return Err("must not be empty (e.g. info)".to_string());
    }
    let mut out = Vec::new();
    for d in t.split(',').map(str::trim) {
        if d.is_empty() {
            return Err(format!("{text:?} has an empty directive: {USE}"));
        }
        let level = match d.split_once('=') {
            None => d,
            Some((target, level)) => {
                let path =
                    |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | ':' | '-' | '.');
                if target.is_empty() || !target.chars().all(path) {
                    return Err(format!(
                        "{d:?}: the target of a target=level directive is a module path \
                         (e.g. combd_shards=debug)"
                    ));
                }
                level
            }
        };
        if !LOG_LEVELS.iter().any(|l| l.eq_ignore_ascii_case(level)) {
            return Err(format!("{level:?} is not a log level: {USE}"));
        }
        out.push(lower_level(d));
    }
    Ok(out.join(","))
}

/// A directive with its level lower-cased and its target kept as written.
fn lower_level(directive: &str) -> String {
    match directive.split_once('=') {
        Some((target, level)) => format!("{target}={}", level.to_ascii_lowercase()),
        None => directive.to_ascii_lowercase(),
    }
}

/// Edit distance (Levenshtein) between two ASCII-case-folded strings.
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<u8> = a.bytes().map(|c| c.to_ascii_uppercase()).collect();
    let b: Vec<u8> = b.bytes().map(|c| c.to_ascii_uppercase()).collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The candidate closest to `name` by edit distance (ignoring case), if it is close enough to
/// be a typo of it: at most a third of the candidate's length apart, and at least one edit is
/// always allowed. Ties go to the first candidate.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| *d <= (c.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// Refuses an environment variable named like a setting (`COMBD_*`) that is not one, naming
/// the closest setting: a typo (`COMBD_MAX_AWAK=5`) would otherwise be ignored silently and
/// the default used. `names` are the environment's variable names; the first unknown one in
/// sorted order is reported.
pub fn check_env_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ConfigError> {
    let mut unknown: Vec<&str> = names
        .into_iter()
        .filter(|n| n.starts_with("COMBD_") && !SETTINGS.iter().any(|s| s.env == *n))
        .collect();
    unknown.sort_unstable();
    match unknown.first() {
        None => Ok(()),
        Some(name) => {
            let hint = match closest(name, SETTINGS.iter().map(|s| s.env)) {
                Some(known) => format!("did you mean {known}?"),
                None => "see combd --help for the settings".to_string(),
            };
            Err(err(name, format!("is not a setting; {hint}")))
        }
    }
}

impl Settings {
    /// Reads the settings from an environment lookup and the command-line arguments (without
    /// the program name), validating every one. `allowed_cpus` is how many CPUs this process
    /// may run on: the default and the upper bound of `COMBD_SHARDS`.
    pub fn load(
        env: impl Fn(&str) -> Option<String>,
        args: &[String],
        allowed_cpus: usize,
    ) -> Result<(Command, Settings), ConfigError> {
        let mut raw: BTreeMap<&'static str, (String, Source)> = BTreeMap::new();
        for spec in SETTINGS {
            if let Some(v) = env(spec.env) {
                raw.insert(spec.env, (v, Source::Env));
            }
        }
        let mut command = Command::Run;
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            i += 1;
            match arg.as_str() {
                "-h" | "--help" => {
                    command = Command::Help;
                    continue;
                }
                "-V" | "--version" => {
                    command = Command::Version;
                    continue;
                }
                "--check-config" => {
                    command = Command::CheckConfig;
                    continue;
                }
                _ => {}
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) => (f, Some(v.to_string())),
                None => (arg.as_str(), None),
            };
            let spec = spec_by_flag(flag).ok_or_else(|| {
                let hint = closest(flag, SETTINGS.iter().map(|s| s.flag))
                    .map(|f| format!("did you mean {f}? "))
                    .unwrap_or_default();
                err(arg, format!("unknown argument ({hint}see --help)"))
            })?;
            let value = match inline {
                Some(v) => v,
                None => {
                    let v = args
                        .get(i)
                        .ok_or_else(|| err(spec.env, format!("{flag} needs a value")))?;
                    i += 1;
                    v.clone()
                }
            };
            raw.insert(spec.env, (value, Source::Flag));
        }

        let mut sources = BTreeMap::new();
        for spec in SETTINGS {
            let src = raw
                .get(spec.env)
                .map(|(_, s)| *s)
                .unwrap_or(Source::Default);
            sources.insert(spec.env, src);
        }
        let get = |name: &str| raw.get(name).map(|(v, _)| v.as_str());
        // The table's default is the text parsed when a setting is not given, so the two
        // cannot drift apart (the unit tests check the parsed defaults against `limits`).
        fn parse<T>(
            raw: &BTreeMap<&'static str, (String, Source)>,
            name: &str,
            f: fn(&str) -> Result<T, String>,
        ) -> Result<T, ConfigError> {
            let default = SETTINGS
                .iter()
                .find(|s| s.env == name)
                .map_or("", |s| s.default);
            f(raw.get(name).map_or(default, |(v, _)| v.as_str())).map_err(|m| err(name, m))
        }

        let listen = get("COMBD_LISTEN")
            .map(|v| parse_listen(v).map_err(|m| err("COMBD_LISTEN", m)))
            .unwrap_or_else(|| {
                parse_listen(limits::LISTEN_DEFAULT).map_err(|m| err("COMBD_LISTEN", m))
            })?;
        let data_dir = PathBuf::from(get("COMBD_DATA").unwrap_or(limits::DATA_DEFAULT));
        if data_dir.as_os_str().is_empty() {
            return Err(err("COMBD_DATA", "must not be empty"));
        }
        let shards = match get("COMBD_SHARDS") {
            None => allowed_cpus.max(1),
            Some(v) => {
                let n = parse_count(v).map_err(|m| err("COMBD_SHARDS", m))?;
                if n as usize > allowed_cpus {
                    return Err(err(
                        "COMBD_SHARDS",
                        format!("{n} shards, but this process may run on only {allowed_cpus} CPU(s); each shard needs its own"),
                    ));
                }
                n as usize
            }
        };
        let log = parse(&raw, "COMBD_LOG", parse_log)?;
        let tls = tls_settings(
            get("COMBD_TLS_LISTEN"),
            get("COMBD_TLS_CERT"),
            get("COMBD_TLS_KEY"),
        )?;
        if let Some(t) = tls.as_ref().filter(|t| t.listen.port() != 0) {
            if t.listen.port() == listen.port() {
                return Err(err(
                    "COMBD_TLS_LISTEN",
                    format!(
                        "{} has the port of COMBD_LISTEN ({listen}); TLS needs a port of its own \
                         (127.0.0.1:{} serves the localhost side of each)",
                        t.listen,
                        listen.port()
                    ),
                ));
            }
        }
        let settings = Settings {
            listen,
            data_dir,
            shards,
            log,
            max_body_bytes: parse(&raw, "COMBD_MAX_BODY", parse_bytes)?,
            header_timeout: parse(&raw, "COMBD_HEADER_TIMEOUT", parse_duration)?,
            body_timeout: parse(&raw, "COMBD_BODY_TIMEOUT", parse_duration)?,
            idle_timeout: parse(&raw, "COMBD_IDLE_TIMEOUT", parse_duration)?,
            ws_max_message_bytes: parse(&raw, "COMBD_WS_MAX_MESSAGE", parse_bytes)?,
            shutdown_timeout: parse(&raw, "COMBD_SHUTDOWN_TIMEOUT", parse_duration)?,
            max_conns: parse(&raw, "COMBD_MAX_CONNS", parse_count)?,
            max_awake: parse(&raw, "COMBD_MAX_AWAKE", parse_count)? as usize,
            restores_at_once: parse(&raw, "COMBD_RESTORES_AT_ONCE", parse_count)? as usize,
            sqlite_sync_full: parse(&raw, "COMBD_SQLITE_SYNC", |v| match v.trim() {
                "full" => Ok(true),
                "normal" => Ok(false),
                other => Err(format!("{other:?}: use full or normal")),
            })?,
            test_apps: parse(&raw, "COMBD_TEST_APPS", parse_switch)?,
            cpu_limit_ticks: parse(&raw, "COMBD_CPU_LIMIT_TICKS", parse_count)?,
            db_max_bytes: parse(&raw, "COMBD_DB_MAX", parse_bytes)?,
            tls,
            tls_handshake_timeout: parse(&raw, "COMBD_TLS_HANDSHAKE_TIMEOUT", parse_duration)?,
            ws_ping_interval: parse(&raw, "COMBD_WS_PING_INTERVAL", parse_duration)?,
            ws_slow_timeout: parse(&raw, "COMBD_WS_SLOW_TIMEOUT", parse_duration)?,
            ws_rate: parse(&raw, "COMBD_WS_RATE", parse_count)?,
            ws_burst: parse(&raw, "COMBD_WS_BURST", parse_count)?,
            outbound_budget_bytes: match get("COMBD_OUTBOUND_BUDGET") {
                None => None,
                Some(v) => Some(parse_bytes(v).map_err(|m| err("COMBD_OUTBOUND_BUDGET", m))?),
            },
            memory_budget_bytes: match get("COMBD_MEMORY_BUDGET") {
                None => None,
                Some(v) => Some(parse_bytes(v).map_err(|m| err("COMBD_MEMORY_BUDGET", m))?),
            },
            sources,
        };
        Ok((command, settings))
    }

    /// Every setting's effective value as text, with where it came from, in table order.
    pub fn describe(&self) -> Vec<(&'static str, String, Source)> {
        let secs = |d: Duration| format!("{}ms", d.as_millis());
        let opt = |v: Option<u64>, none: &str| v.map_or(none.to_string(), |b| b.to_string());
        SETTINGS
            .iter()
            .map(|spec| {
                let v = match spec.env {
                    "COMBD_LISTEN" => self.listen.to_string(),
                    "COMBD_DATA" => self.data_dir.display().to_string(),
                    "COMBD_SHARDS" => self.shards.to_string(),
                    "COMBD_LOG" => self.log.clone(),
                    "COMBD_MAX_BODY" => self.max_body_bytes.to_string(),
                    "COMBD_HEADER_TIMEOUT" => secs(self.header_timeout),
                    "COMBD_BODY_TIMEOUT" => secs(self.body_timeout),
                    "COMBD_IDLE_TIMEOUT" => secs(self.idle_timeout),
                    "COMBD_WS_MAX_MESSAGE" => self.ws_max_message_bytes.to_string(),
                    "COMBD_SHUTDOWN_TIMEOUT" => secs(self.shutdown_timeout),
                    "COMBD_MAX_CONNS" => self.max_conns.to_string(),
                    "COMBD_MEMORY_BUDGET" => {
                        opt(self.memory_budget_bytes, "(from the cgroup or RAM)")
                    }
                    "COMBD_MAX_AWAKE" => self.max_awake.to_string(),
                    "COMBD_RESTORES_AT_ONCE" => self.restores_at_once.to_string(),
                    "COMBD_SQLITE_SYNC" => (if self.sqlite_sync_full {
                        "full"
                    } else {
                        "normal"
                    })
                    .to_string(),
                    "COMBD_CPU_LIMIT_TICKS" => self.cpu_limit_ticks.to_string(),
                    "COMBD_WS_RATE" => self.ws_rate.to_string(),
                    "COMBD_WS_BURST" => self.ws_burst.to_string(),
                    "COMBD_OUTBOUND_BUDGET" => {
                        opt(self.outbound_budget_bytes, "(from the memory budget)")
                    }
                    "COMBD_DB_MAX" => self.db_max_bytes.to_string(),
                    "COMBD_TLS_LISTEN" => self
                        .tls
                        .as_ref()
                        .map_or("off".into(), |t| t.listen.to_string()),
                    "COMBD_TLS_CERT" => self
                        .tls
                        .as_ref()
                        .map_or("none".into(), |t| t.cert.display().to_string()),
                    "COMBD_TLS_KEY" => self
                        .tls
                        .as_ref()
                        .map_or("none".into(), |t| t.key.display().to_string()),
                    "COMBD_TLS_HANDSHAKE_TIMEOUT" => secs(self.tls_handshake_timeout),
                    "COMBD_WS_PING_INTERVAL" => secs(self.ws_ping_interval),
                    "COMBD_WS_SLOW_TIMEOUT" => secs(self.ws_slow_timeout),
                    "COMBD_TEST_APPS" => (if self.test_apps { "on" } else { "off" }).to_string(),
                    _ => String::from("?"),
                };
                (
                    spec.env,
                    v,
                    self.sources
                        .get(spec.env)
                        .copied()
                        .unwrap_or(Source::Default),
                )
            })
            .collect()
    }

    /// The connection cap in force: `COMBD_MAX_CONNS`, clamped to the file-descriptor limit
    /// less [`limits::FD_RESERVE`].
    pub fn max_conns_effective(&self, nofile_soft: u64) -> u64 {
        self.max_conns
            .min(nofile_soft.saturating_sub(limits::FD_RESERVE))
            .max(1)
    }
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn load(env: &[(&str, &str)], args: &[&str]) -> Result<Settings, ConfigError> {
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        Settings::load(|k| env.get(k).cloned(), &args, 2).map(|(_, s)| s)
    }

    #[test]
    fn defaults_match_the_limits_file() {
        let s = load(&[], &[]).expect("defaults are valid");
        assert_eq!(s.listen.to_string(), limits::LISTEN_DEFAULT);
        assert_eq!(s.max_body_bytes, limits::MAX_BODY_DEFAULT_BYTES);
        assert_eq!(s.header_timeout, limits::HEADER_TIMEOUT_DEFAULT);
        assert_eq!(s.body_timeout, limits::BODY_TIMEOUT_DEFAULT);
        assert_eq!(s.idle_timeout, limits::IDLE_TIMEOUT_DEFAULT);
        assert_eq!(s.ws_max_message_bytes, limits::WS_MAX_MESSAGE_DEFAULT_BYTES);
        assert_eq!(s.shutdown_timeout, limits::SHUTDOWN_TIMEOUT_DEFAULT);
        assert_eq!(s.max_conns, limits::MAX_CONNS_DEFAULT);
        assert_eq!(s.max_awake, limits::MAX_AWAKE_DEFAULT);
        assert_eq!(s.restores_at_once, limits::RESTORES_AT_ONCE_DEFAULT);
        assert!(s.sqlite_sync_full);
        assert!(!s.test_apps);
        assert_eq!(s.cpu_limit_ticks, limits::CPU_LIMIT_TICKS_DEFAULT);
        assert_eq!(s.db_max_bytes, limits::DB_MAX_BYTES);
        assert_eq!(s.ws_rate, limits::WS_RATE_DEFAULT);
        assert_eq!(s.ws_burst, limits::WS_BURST_DEFAULT);
        assert_eq!(
            s.tls_handshake_timeout,
            limits::TLS_HANDSHAKE_TIMEOUT_DEFAULT
        );
        assert_eq!(s.ws_ping_interval, limits::WS_PING_INTERVAL_DEFAULT);
        assert_eq!(s.ws_slow_timeout, limits::WS_SLOW_TIMEOUT_DEFAULT);
        assert_eq!(s.shards, 2);
        assert_eq!(s.log, limits::LOG_DEFAULT);
        assert!(s.sources.values().all(|s| *s == Source::Default));
    }

    #[test]
    fn the_table_text_matches_the_limits_file() {
        // The table's meanings quote fixed limits as text; they must say what the limits are.
        let meaning = |env: &str| SETTINGS.iter().find(|s| s.env == env).unwrap().meaning;
        assert!(meaning("COMBD_MEMORY_BUDGET").contains(&format!(
            "pressure 1 at {} %, 2 (refusing at TCP) at {} %",
            limits::PRESSURE_1_PERCENT,
            limits::PRESSURE_2_PERCENT
        )));
        assert!(meaning("COMBD_MAX_CONNS")
            .contains(&format!("less a reserve of {}", limits::FD_RESERVE)));
        assert!(meaning("COMBD_CPU_LIMIT_TICKS").contains(&format!(
            "each host call counts {}",
            limits::HOST_CALL_TICKS
        )));
    }

    #[test]
    fn flag_wins_over_env() {
        let s = load(&[("COMBD_MAX_BODY", "2M")], &["--max-body", "3M"]).unwrap();
        assert_eq!(s.max_body_bytes, 3 << 20);
        assert_eq!(s.sources["COMBD_MAX_BODY"], Source::Flag);
        let s = load(&[("COMBD_MAX_BODY", "2M")], &["--listen=127.0.0.2:0"]).unwrap();
        assert_eq!(s.max_body_bytes, 2 << 20);
        assert_eq!(s.sources["COMBD_MAX_BODY"], Source::Env);
        assert_eq!(s.listen.to_string(), "127.0.0.2:0");
    }

    #[test]
    fn zero_and_garbage_fail_naming_the_setting() {
        for (name, bad) in [
            ("COMBD_MAX_BODY", "0"),
            ("COMBD_MAX_BODY", "12Q"),
            ("COMBD_MAX_BODY", "-1"),
            ("COMBD_HEADER_TIMEOUT", "0s"),
            ("COMBD_HEADER_TIMEOUT", "soon"),
            ("COMBD_IDLE_TIMEOUT", "5 parsecs"),
            ("COMBD_WS_MAX_MESSAGE", "0K"),
            ("COMBD_SHUTDOWN_TIMEOUT", "0"),
            ("COMBD_MAX_CONNS", "0"),
            ("COMBD_MAX_CONNS", "many"),
            ("COMBD_MEMORY_BUDGET", "0"),
            ("COMBD_MEMORY_BUDGET", "lots"),
            ("COMBD_MEMORY_BUDGET", "1.5G"),
            ("COMBD_MAX_AWAKE", "0"),
            ("COMBD_RESTORES_AT_ONCE", "0"),
            ("COMBD_SQLITE_SYNC", "off"),
            ("COMBD_TEST_APPS", "maybe"),
            ("COMBD_CPU_LIMIT_TICKS", "0"),
            ("COMBD_DB_MAX", "0"),
            ("COMBD_TLS_HANDSHAKE_TIMEOUT", "0"),
            ("COMBD_WS_PING_INTERVAL", "0s"),
            ("COMBD_WS_SLOW_TIMEOUT", "0"),
            ("COMBD_TLS_LISTEN", "nowhere"),
            ("COMBD_TLS_CERT", "/x.pem"),
            ("COMBD_TLS_KEY", "/x.pem"),
            ("COMBD_WS_RATE", "0"),
            ("COMBD_WS_BURST", "-5"),
            ("COMBD_OUTBOUND_BUDGET", "0"),
            ("COMBD_SHARDS", "0"),
            ("COMBD_SHARDS", "3"),
            ("COMBD_LISTEN", "8080"),
            ("COMBD_LISTEN", "127.0.0.1:8080"),
            ("COMBD_LOG", " "),
            ("COMBD_DATA", ""),
        ] {
            let e = load(&[(name, bad)], &[]).expect_err(&format!("{name}={bad:?} must fail"));
            assert_eq!(e.setting, name, "{name}={bad:?}: {e}");
            assert!(e.to_string().starts_with(name));
        }
    }

    #[test]
    fn unknown_flag_and_missing_value_fail() {
        assert_eq!(load(&[], &["--nope"]).unwrap_err().setting, "--nope");
        assert_eq!(
            load(&[], &["--max-body"]).unwrap_err().setting,
            "COMBD_MAX_BODY"
        );
    }

    #[test]
    fn memory_budget_takes_units() {
        assert_eq!(load(&[], &[]).unwrap().memory_budget_bytes, None);
        let s = load(&[("COMBD_MEMORY_BUDGET", "512M")], &[]).unwrap();
        assert_eq!(s.memory_budget_bytes, Some(512 << 20));
        let s = load(&[], &["--memory-budget", "4G"]).unwrap();
        assert_eq!(s.memory_budget_bytes, Some(4 << 30));
    }

    #[test]
    fn tls_needs_its_listener_cert_and_key() {
        assert_eq!(load(&[], &[]).unwrap().tls, None);
        let e = load(&[("COMBD_TLS_LISTEN", "0.0.0.0:8443")], &[]).unwrap_err();
        assert_eq!(e.setting, "COMBD_TLS_CERT");
        let e = load(
            &[
                ("COMBD_TLS_LISTEN", "0.0.0.0:8443"),
                ("COMBD_TLS_CERT", "/c.pem"),
            ],
            &[],
        )
        .unwrap_err();
        assert_eq!(e.setting, "COMBD_TLS_KEY");
        let s = load(
            &[
                ("COMBD_TLS_LISTEN", "0.0.0.0:8443"),
                ("COMBD_TLS_CERT", "/c.pem"),
                ("COMBD_TLS_KEY", "/k.pem"),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(s.tls.unwrap().listen.port(), 8443);
    }

    #[test]
    fn tls_may_not_share_the_listen_port() {
        let tls = |listen: &str, tls: &str| {
            load(
                &[
                    ("COMBD_LISTEN", listen),
                    ("COMBD_TLS_LISTEN", tls),
                    ("COMBD_TLS_CERT", "/c.pem"),
                    ("COMBD_TLS_KEY", "/k.pem"),
                ],
                &[],
            )
        };
        let e = tls("0.0.0.0:8080", "0.0.0.0:8080").unwrap_err();
        assert_eq!(e.setting, "COMBD_TLS_LISTEN");
        assert!(e.message.contains("port of COMBD_LISTEN"), "{e}");
        // Another address on the same port still shares the localhost listener 127.0.0.1:port.
        let e = tls("127.0.0.2:8080", "127.0.0.3:8080").unwrap_err();
        assert_eq!(e.setting, "COMBD_TLS_LISTEN");
        tls("0.0.0.0:8080", "0.0.0.0:8443").expect("distinct ports");
        tls("127.0.0.2:0", "127.0.0.2:0").expect("port 0 picks two free ports");
    }

    #[test]
    fn log_takes_levels_and_target_level_directives_only() {
        for good in [
            "info",
            "WARN",
            "off",
            "warn,combd_shards=debug",
            "combd_shards::conn=trace, info",
        ] {
            parse_log(good).unwrap_or_else(|e| panic!("{good:?}: {e}"));
        }
        assert_eq!(
            parse_log(" Warn , combd_shards::conn=DEBUG ").unwrap(),
            "warn,combd_shards::conn=debug"
        );
        for bad in [
            "verbose",
            "",
            "info,",
            "combd_shards",
            "combd_shards=loud",
            "=debug",
            "a b=info",
            "[span]=info",
            "3",
        ] {
            assert!(parse_log(bad).is_err(), "{bad:?} must be refused");
        }
        assert!(parse_log("verbose")
            .unwrap_err()
            .contains("\"verbose\" is not a log level"));
        assert_eq!(
            load(&[("COMBD_LOG", "verbose")], &[]).unwrap_err().setting,
            "COMBD_LOG"
        );
    }

    #[test]
    fn an_unknown_setting_names_the_closest_known_one() {
        let known = ["PATH", "HOME", "COMBD_MAX_AWAKE", "COMBD_LISTEN", "COMBDX"];
        check_env_names(known).expect("settings and other variables pass");
        for (typo, meant) in [
            ("COMBD_MAX_AWAK", "COMBD_MAX_AWAKE"),
            ("COMBD_LISTN", "COMBD_LISTEN"),
            ("COMBD_max_awake", "COMBD_MAX_AWAKE"),
            ("COMBD_TLS_CRT", "COMBD_TLS_CERT"),
            ("COMBD_SHARD", "COMBD_SHARDS"),
            ("COMBD_MAXBODY", "COMBD_MAX_BODY"),
            ("COMBD_WS_RATES", "COMBD_WS_RATE"),
        ] {
            let e = check_env_names(["PATH", typo]).unwrap_err();
            assert_eq!(e.setting, typo);
            assert_eq!(
                e.message,
                format!("is not a setting; did you mean {meant}?")
            );
        }
        let e = check_env_names(["COMBD_FROBNICATE"]).unwrap_err();
        assert_eq!(e.setting, "COMBD_FROBNICATE");
        assert_eq!(
            e.message,
            "is not a setting; see combd --help for the settings"
        );
        // Several: the first in sorted order, whatever the environment's order.
        let e = check_env_names(["COMBD_ZZ", "COMBD_LISTN"]).unwrap_err();
        assert_eq!(e.setting, "COMBD_LISTN");
    }

    #[test]
    fn an_unknown_flag_names_the_closest_known_one() {
        let e = load(&[], &["--max-awak", "5"]).unwrap_err();
        assert_eq!(e.setting, "--max-awak");
        assert!(e.message.contains("did you mean --max-awake?"), "{e}");
        let e = load(&[], &["--frobnicate"]).unwrap_err();
        assert_eq!(e.message, "unknown argument (see --help)");
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(parse_bytes("1"), Ok(1));
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("4G"), Ok(4 << 30));
        assert_eq!(parse_bytes("4g"), Ok(4 << 30));
        assert_eq!(parse_bytes("16KiB"), Ok(16 << 10));
        assert_eq!(parse_bytes("1T"), Ok(1 << 40));
        assert!(parse_bytes("99999999999T").is_err());
        assert!(parse_bytes("M").is_err());
        assert!(parse_bytes("1.5G").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0ms").is_err());
        assert!(parse_duration("1d").is_err());
    }

    #[test]
    fn max_conns_is_clamped_to_the_fd_limit() {
        let s = load(&[], &[]).unwrap();
        assert_eq!(s.max_conns_effective(20_000), 20_000 - limits::FD_RESERVE);
        assert_eq!(s.max_conns_effective(1_048_576), limits::MAX_CONNS_DEFAULT);
        let s = load(&[("COMBD_MAX_CONNS", "50")], &[]).unwrap();
        assert_eq!(s.max_conns_effective(20_000), 50);
    }

    #[test]
    fn describe_covers_every_setting() {
        let s = load(&[("COMBD_MAX_BODY", "2K")], &["--check-config"]).unwrap();
        let d = s.describe();
        assert_eq!(d.len(), SETTINGS.len());
        assert!(d.iter().all(|(_, v, _)| v != "?"));
        assert!(d.contains(&("COMBD_MAX_BODY", "2048".to_string(), Source::Env)));
    }

    #[test]
    fn help_lists_every_setting() {
        let h = help_text();
        for s in SETTINGS {
            assert!(
                h.contains(s.env) && h.contains(s.flag),
                "{} missing from --help",
                s.env
            );
        }
    }
}
