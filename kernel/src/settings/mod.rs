//! The node's settings: one table, one parser, one validator.
//!
//! - `table`: every setting's variable, flag, default and meaning, and the
//!   `--help` text written from it;
//! - `values`: the parsers of each kind of value (sizes, durations, counts, switches,
//!   addresses, the log filter);
//! - `fleet`: the fleet's settings (coordinator, bucket, this node's fleet address and lease),
//!   all or none;
//! - `names`: refusing an unknown `COMBD_*` variable or flag, naming the closest setting;
//! - this file: [`Settings`] itself, loaded and validated at once.
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

mod fleet;
mod names;
mod table;
mod values;

pub use fleet::{
    parse_bucket_name, parse_etcd_endpoints, parse_fleet_node, parse_http_endpoint,
    parse_lease_ttl, parse_region, FleetSettings,
};
pub use names::{check_env_names, closest};
use table::spec_by_flag;
pub use table::{help_text, SettingSpec, SETTINGS};
pub use values::{
    parse_bytes, parse_count, parse_count_u32, parse_duration, parse_listen, parse_log,
    parse_switch, LOG_LEVELS,
};

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
    /// `COMBD_APPS_DIR`.
    pub apps_dir: PathBuf,
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
    /// `COMBD_MAX_OPEN_OBJECTS`.
    pub max_open_objects: u64,
    /// `COMBD_MAX_CONNS_PER_ADDRESS`.
    pub max_conns_per_address: u32,
    /// `COMBD_ACCEPT_RATE_PER_ADDRESS`.
    pub accept_rate_per_address: u32,
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
    /// `COMBD_MAX_OBJECTS_PER_APP`.
    pub max_objects_per_app: u64,
    /// `COMBD_OBJECT_CREATE_RATE`: objects created per second per shard.
    pub object_create_rate: u64,
    /// `COMBD_TLS_LISTEN`, `COMBD_TLS_CERT`, `COMBD_TLS_KEY`, when TLS is on.
    pub tls: Option<TlsSettings>,
    /// `COMBD_TLS_HANDSHAKE_TIMEOUT`: from the accept to the handshake's end.
    pub tls_handshake_timeout: Duration,
    /// `COMBD_TLS_HELLO_TIMEOUT`: from the accept to the complete ClientHello; at most
    /// [`Settings::tls_handshake_timeout`].
    pub tls_hello_timeout: Duration,
    /// `COMBD_WS_PING_INTERVAL`.
    pub ws_ping_interval: Duration,
    /// `COMBD_WS_SLOW_TIMEOUT`.
    pub ws_slow_timeout: Duration,
    /// `COMBD_WS_RATE`.
    pub ws_rate: u64,
    /// `COMBD_WS_BURST`.
    pub ws_burst: u64,
    /// `COMBD_INBOUND_BUDGET`, if set (else derived from the memory budget at start-up).
    pub inbound_budget_bytes: Option<u64>,
    /// `COMBD_OUTBOUND_BUDGET`, if set (else derived from the memory budget at start-up).
    pub outbound_budget_bytes: Option<u64>,
    /// The `COMBD_FLEET_*` settings when the fleet is on (`COMBD_FLEET_ETCD` set); none for a
    /// node alone, which works exactly as without them.
    pub fleet: Option<FleetSettings>,
    /// Where each setting came from, by environment variable name.
    pub sources: BTreeMap<&'static str, Source>,
}

fn err(setting: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        setting: setting.to_string(),
        message: message.into(),
    }
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
        let apps_dir = PathBuf::from(get("COMBD_APPS_DIR").unwrap_or(limits::APPS_DIR_DEFAULT));
        if apps_dir.as_os_str().is_empty() {
            return Err(err("COMBD_APPS_DIR", "must not be empty"));
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
        let fleet = fleet::fleet_settings(|name| get(name).map(str::to_string))?;
        if let Some(f) = fleet.as_ref().filter(|f| f.node.port() == listen.port()) {
            return Err(err(
                "COMBD_FLEET_NODE",
                format!(
                    "{} has the port of COMBD_LISTEN ({listen}); the fleet listener needs a port \
                     of its own (on the same port, that address's public connections would be \
                     served past admission)",
                    f.node
                ),
            ));
        }
        let tls_handshake_timeout = parse(&raw, "COMBD_TLS_HANDSHAKE_TIMEOUT", parse_duration)?;
        let tls_hello_timeout = parse(&raw, "COMBD_TLS_HELLO_TIMEOUT", parse_duration)?;
        if tls_hello_timeout > tls_handshake_timeout {
            let default = if get("COMBD_TLS_HELLO_TIMEOUT").is_none() {
                " (the default)"
            } else {
                ""
            };
            return Err(err(
                "COMBD_TLS_HELLO_TIMEOUT",
                format!(
                    "{}ms{default} is longer than COMBD_TLS_HANDSHAKE_TIMEOUT ({}ms): both run \
                     from the accept, and the ClientHello is part of the handshake; set it to \
                     at most {}ms",
                    tls_hello_timeout.as_millis(),
                    tls_handshake_timeout.as_millis(),
                    tls_handshake_timeout.as_millis()
                ),
            ));
        }
        let settings = Settings {
            listen,
            data_dir,
            apps_dir,
            shards,
            log,
            max_body_bytes: parse(&raw, "COMBD_MAX_BODY", parse_bytes)?,
            header_timeout: parse(&raw, "COMBD_HEADER_TIMEOUT", parse_duration)?,
            body_timeout: parse(&raw, "COMBD_BODY_TIMEOUT", parse_duration)?,
            idle_timeout: parse(&raw, "COMBD_IDLE_TIMEOUT", parse_duration)?,
            ws_max_message_bytes: parse(&raw, "COMBD_WS_MAX_MESSAGE", parse_bytes)?,
            shutdown_timeout: parse(&raw, "COMBD_SHUTDOWN_TIMEOUT", parse_duration)?,
            max_conns: parse(&raw, "COMBD_MAX_CONNS", parse_count)?,
            max_open_objects: parse(&raw, "COMBD_MAX_OPEN_OBJECTS", parse_count)?,
            max_conns_per_address: parse(&raw, "COMBD_MAX_CONNS_PER_ADDRESS", parse_count_u32)?,
            accept_rate_per_address: parse(&raw, "COMBD_ACCEPT_RATE_PER_ADDRESS", parse_count_u32)?,
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
            max_objects_per_app: parse(&raw, "COMBD_MAX_OBJECTS_PER_APP", parse_count)?,
            object_create_rate: parse(&raw, "COMBD_OBJECT_CREATE_RATE", parse_count)?,
            tls,
            tls_handshake_timeout,
            tls_hello_timeout,
            ws_ping_interval: parse(&raw, "COMBD_WS_PING_INTERVAL", parse_duration)?,
            ws_slow_timeout: parse(&raw, "COMBD_WS_SLOW_TIMEOUT", parse_duration)?,
            ws_rate: parse(&raw, "COMBD_WS_RATE", parse_count)?,
            ws_burst: parse(&raw, "COMBD_WS_BURST", parse_count)?,
            inbound_budget_bytes: match get("COMBD_INBOUND_BUDGET") {
                None => None,
                Some(v) => Some(parse_bytes(v).map_err(|m| err("COMBD_INBOUND_BUDGET", m))?),
            },
            outbound_budget_bytes: match get("COMBD_OUTBOUND_BUDGET") {
                None => None,
                Some(v) => Some(parse_bytes(v).map_err(|m| err("COMBD_OUTBOUND_BUDGET", m))?),
            },
            memory_budget_bytes: match get("COMBD_MEMORY_BUDGET") {
                None => None,
                Some(v) => Some(parse_bytes(v).map_err(|m| err("COMBD_MEMORY_BUDGET", m))?),
            },
            fleet,
            sources,
        };
        Ok((command, settings))
    }

    /// Every setting's effective value as text, with where it came from, in table order.
    pub fn describe(&self) -> Vec<(&'static str, String, Source)> {
        let secs = |d: Duration| format!("{}ms", d.as_millis());
        let opt = |v: Option<u64>, none: &str| v.map_or(none.to_string(), |b| b.to_string());
        let fleet = self.fleet.as_ref();
        SETTINGS
            .iter()
            .map(|spec| {
                let v = match spec.env {
                    "COMBD_LISTEN" => self.listen.to_string(),
                    "COMBD_DATA" => self.data_dir.display().to_string(),
                    "COMBD_APPS_DIR" => self.apps_dir.display().to_string(),
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
                    "COMBD_MAX_OPEN_OBJECTS" => self.max_open_objects.to_string(),
                    "COMBD_MAX_CONNS_PER_ADDRESS" => self.max_conns_per_address.to_string(),
                    "COMBD_ACCEPT_RATE_PER_ADDRESS" => self.accept_rate_per_address.to_string(),
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
                    "COMBD_INBOUND_BUDGET" => {
                        opt(self.inbound_budget_bytes, "(from the memory budget)")
                    }
                    "COMBD_OUTBOUND_BUDGET" => {
                        opt(self.outbound_budget_bytes, "(from the memory budget)")
                    }
                    "COMBD_DB_MAX" => self.db_max_bytes.to_string(),
                    "COMBD_MAX_OBJECTS_PER_APP" => self.max_objects_per_app.to_string(),
                    "COMBD_OBJECT_CREATE_RATE" => self.object_create_rate.to_string(),
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
                    "COMBD_TLS_HELLO_TIMEOUT" => secs(self.tls_hello_timeout),
                    "COMBD_WS_PING_INTERVAL" => secs(self.ws_ping_interval),
                    "COMBD_WS_SLOW_TIMEOUT" => secs(self.ws_slow_timeout),
                    "COMBD_TEST_APPS" => (if self.test_apps { "on" } else { "off" }).to_string(),
                    "COMBD_FLEET_ETCD" => fleet.map_or("off".into(), |f| f.etcd.join(",")),
                    "COMBD_FLEET_BUCKET_URL" => {
                        fleet.map_or("none".into(), |f| f.bucket_url.clone())
                    }
                    "COMBD_FLEET_BUCKET" => fleet.map_or("none".into(), |f| f.bucket.clone()),
                    "COMBD_FLEET_BUCKET_REGION" => {
                        fleet.map_or("none".into(), |f| f.bucket_region.clone())
                    }
                    "COMBD_FLEET_ACCESS_KEY" => {
                        fleet.map_or("none".into(), |f| f.access_key.clone())
                    }
                    "COMBD_FLEET_SECRET_KEY_FILE" => {
                        fleet.map_or("none".into(), |f| f.secret_key_file.display().to_string())
                    }
                    "COMBD_FLEET_NODE" => fleet.map_or("none".into(), |f| f.node.to_string()),
                    "COMBD_FLEET_LEASE_TTL" => fleet.map_or(
                        format!("{}ms", limits::FLEET_LEASE_TTL_DEFAULT.as_millis()),
                        |f| secs(f.lease_ttl),
                    ),
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

    /// The public connection cap in force: `COMBD_MAX_CONNS`, clamped to the file-descriptor
    /// limit less [`limits::FD_RESERVE`], the localhost listener's own cap
    /// ([`limits::LOCAL_CONNS_MAX`]) and the live objects' descriptors
    /// (`COMBD_MAX_OPEN_OBJECTS` × [`limits::OBJECT_FDS`]); in a fleet the fleet listener has a
    /// cap of its own as large as the public one, so the descriptors left are split between
    /// the two.
    pub fn max_conns_effective(&self, nofile_soft: u64) -> u64 {
        let objects = self.max_open_objects.saturating_mul(limits::OBJECT_FDS);
        let fds = nofile_soft
            .saturating_sub(limits::FD_RESERVE + limits::LOCAL_CONNS_MAX)
            .saturating_sub(objects);
        let fds = if self.fleet.is_some() { fds / 2 } else { fds };
        self.max_conns.min(fds).max(1)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
