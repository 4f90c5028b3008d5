//! The node's settings: one table, one parser, one validator.
//!
//! - `table`: every setting, declared once (its field and type, variable, flag, default,
//!   parser, unit, `/stats` limit and meaning), and the `--help` text written from it;
//! - `declare`: the macro that writes [`Settings`], [`SETTINGS`] and the loading from the
//!   table, and [`Settings`]' methods (so they are in the module that defines it);
//! - `spec`: what the table says of one setting ([`SettingSpec`]), and how a value is printed
//!   ([`Show`]) and shown as a limit ([`AsLimit`]);
//! - `values`: the parsers of each kind of value (sizes, durations, counts, switches,
//!   addresses, the log filter, the access log's sink);
//! - `fleet`: the fleet's settings (coordinator, bucket, this node's fleet address and lease),
//!   all or none;
//! - `names`: refusing an unknown `COMBD_*` variable or flag, naming the closest setting;
//! - `help`: a flag's setting, and the `--help` text, read off the table;
//! - this file: reading the environment and the flags, the TLS, auth and fleet groups, and
//!   the checks between settings (functions over the settings, which `Settings::load` calls).
//!
//! Every setting is an environment variable `COMBD_*` with a matching command-line flag; a flag
//! wins over the environment, which wins over the default. [`SETTINGS`] is the table that
//! `--help`, `--check-config` and `/stats` `limits` are written from and README.md's table is
//! checked against. [`Settings::load`] parses and validates all of them at once; the first
//! invalid one fails start-up with a [`ConfigError`] naming it. Zero never means "unlimited":
//! a zero size, count or timeout is an error.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::limits;
use crate::origins::AllowedOrigins;

mod backup;
#[macro_use]
mod declare;
mod fleet;
mod help;
mod names;
mod shown;
mod spec;
mod table;
mod values;

use backup::{backup_bucket_group, parse_backup, parse_retention};
pub use backup::{BackupBucketSettings, BackupTarget};
pub use fleet::{
    is_private, parse_bucket_name, parse_etcd_endpoints, parse_fleet_address, parse_fleet_node,
    parse_http_endpoint, parse_lease_ttl, parse_object_idle, parse_region, FleetSettings,
};
pub use help::help_text;
use help::spec_by_flag;
pub use names::{check_env_names, closest};
pub use shown::DERIVED_LIMITS;
pub use spec::{AsLimit, Context, DefaultValue, InForce, Limit, SettingSpec, Show, Unit};
pub use table::{Settings, SETTINGS};
use values::{
    optional_bytes, parse_count_usize, parse_dir, parse_sqlite_sync, resolve_allowed_origins,
    resolve_shards,
};
pub use values::{
    parse_access_log, parse_bytes, parse_count, parse_count_u32, parse_duration, parse_listen,
    parse_log, parse_percent, parse_switch, AccessLogSink, LOG_LEVELS,
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

/// Verified identity: where the token key is, and what a token must say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSettings {
    /// `COMBD_AUTH_JWT_KEY_FILE`: an HS256 secret on one line, or a PEM public key.
    pub key_file: PathBuf,
    /// `COMBD_AUTH_ISSUER`: the `iss` a token must carry, if set.
    pub issuer: Option<String>,
    /// `COMBD_AUTH_AUDIENCE`: an `aud` a token must carry, if set.
    pub audience: Option<String>,
}

/// Each text given for a setting, by variable name, and where it came from.
type Texts = BTreeMap<&'static str, (String, Source)>;

/// The texts given for the settings, by variable name (a flag's value having replaced the
/// environment's).
struct Given<'a> {
    raw: &'a Texts,
}

impl<'a> Given<'a> {
    /// The text given for a setting, if any.
    fn get(&self, env: &str) -> Option<&'a str> {
        self.raw.get(env).map(|(text, _)| text.as_str())
    }
}

/// The TLS group: off without `COMBD_TLS_LISTEN` (and then neither file may be set); with it,
/// both files are required.
fn tls_group(given: &Given<'_>) -> Result<Option<TlsSettings>, ConfigError> {
    let (cert, key) = (given.get("COMBD_TLS_CERT"), given.get("COMBD_TLS_KEY"));
    let Some(listen) = given.get("COMBD_TLS_LISTEN") else {
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

/// The auth group: `COMBD_AUTH_JWT_KEY_FILE` turns verified identity on; the issuer and
/// audience only mean something with it.
fn auth_group(given: &Given<'_>) -> Result<Option<AuthSettings>, ConfigError> {
    let claim = |name: &'static str| -> Result<Option<String>, ConfigError> {
        match given.get(name) {
            None => Ok(None),
            Some(v) if v.trim().is_empty() || v.len() > limits::AUTH_CLAIM_MAX_BYTES => Err(err(
                name,
                format!(
                    "must be 1 to {} bytes (or left unset)",
                    limits::AUTH_CLAIM_MAX_BYTES
                ),
            )),
            Some(v) => Ok(Some(v.trim().to_string())),
        }
    };
    let (issuer, audience) = (claim("COMBD_AUTH_ISSUER")?, claim("COMBD_AUTH_AUDIENCE")?);
    let Some(file) = given.get("COMBD_AUTH_JWT_KEY_FILE") else {
        for (name, v) in [
            ("COMBD_AUTH_ISSUER", &issuer),
            ("COMBD_AUTH_AUDIENCE", &audience),
        ] {
            if v.is_some() {
                return Err(err(name, "is set but COMBD_AUTH_JWT_KEY_FILE is not"));
            }
        }
        return Ok(None);
    };
    if file.trim().is_empty() {
        return Err(err("COMBD_AUTH_JWT_KEY_FILE", "must name a file"));
    }
    Ok(Some(AuthSettings {
        key_file: PathBuf::from(file),
        issuer,
        audience,
    }))
}

/// The fleet group: see [`fleet`].
fn fleet_group(given: &Given<'_>) -> Result<Option<FleetSettings>, ConfigError> {
    fleet::fleet_settings(|name| given.get(name).map(str::to_string))
}

/// The texts given for the settings, by variable (a flag's value replacing the environment's,
/// each with where it came from), read from an environment lookup and the command-line
/// arguments (without the program name), and what the command line asked for besides.
fn read_given(
    env: impl Fn(&str) -> Option<String>,
    args: &[String],
) -> Result<(Command, Texts), ConfigError> {
    let mut raw: Texts = BTreeMap::new();
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
    Ok((command, raw))
}

/// Where each setting came from, by variable, as `raw` gives them.
fn sources_of(raw: &Texts) -> BTreeMap<&'static str, Source> {
    let mut sources = BTreeMap::new();
    for spec in SETTINGS {
        let src = raw
            .get(spec.env)
            .map(|(_, s)| *s)
            .unwrap_or(Source::Default);
        sources.insert(spec.env, src);
    }
    sources
}

/// A client's share's floor (`COMBD_CLIENT_SHARE_MIN_PERCENT`) may not exceed its cap.
fn check_shares(s: &Settings) -> Result<(), ConfigError> {
    if s.client_share_min_percent <= s.client_share_max_percent {
        return Ok(());
    }
    Err(err(
        "COMBD_CLIENT_SHARE_MIN_PERCENT",
        format!(
            "is {} but COMBD_CLIENT_SHARE_MAX_PERCENT is {}: the floor of a share cannot be \
             over its cap",
            s.client_share_min_percent, s.client_share_max_percent
        ),
    ))
}

/// `COMBD_BACKUP`: not in a fleet (its bucket is the backup), not inside the data directory;
/// an `s3://` one with the `COMBD_BACKUP_S3_*` settings, and those only with it.
fn check_backup(s: &Settings) -> Result<(), ConfigError> {
    let to_bucket = matches!(s.backup, Some(BackupTarget::Bucket { .. }));
    if to_bucket && s.backup_s3.is_none() {
        return Err(err(
            "COMBD_BACKUP",
            "an s3:// backup needs COMBD_BACKUP_S3_URL, COMBD_BACKUP_S3_ACCESS_KEY, \
             COMBD_BACKUP_S3_SECRET_KEY_FILE and COMBD_BACKUP_KEY_FILE"
                .to_string(),
        ));
    }
    if !to_bucket && s.backup_s3.is_some() {
        return Err(err(
            "COMBD_BACKUP_S3_URL",
            "is set but COMBD_BACKUP is not an s3://<bucket>/<prefix>".to_string(),
        ));
    }
    if s.fleet.is_some() && s.backup.is_some() {
        return Err(err(
            "COMBD_BACKUP",
            "a fleet node keeps every object in the fleet's bucket already: backup is for a \
             node alone (unset COMBD_BACKUP, or COMBD_FLEET_*)"
                .to_string(),
        ));
    }
    let dir = match &s.backup {
        Some(BackupTarget::Dir(d)) => Some(d),
        _ => None,
    };
    if let Some(b) = dir.filter(|b| b.starts_with(&s.data_dir)) {
        return Err(err(
            "COMBD_BACKUP",
            format!(
                "{} is inside COMBD_DATA ({}): a backup must outlive the data directory; put \
                 it elsewhere (another disk, ideally)",
                b.display(),
                s.data_dir.display()
            ),
        ));
    }
    Ok(())
}

/// The checks between settings, once each parsed: the TLS listener and the fleet's
/// address each need a port other than `COMBD_LISTEN`'s, a fleet node's `COMBD_DB_MAX` is
/// at most what it restores, the ClientHello's timeout may not exceed the handshake's, and
/// a client's share's floor may not exceed its cap.
fn check_relations(s: &Settings) -> Result<(), ConfigError> {
    check_shares(s)?;
    let listen = s.listen;
    if let Some(t) = s.tls.as_ref().filter(|t| t.listen.port() != 0) {
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
    if let Some(f) = s.fleet.as_ref().filter(|f| f.node.port() == listen.port()) {
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
    check_backup(s)?;
    if s.fleet.is_some() && s.db_max_bytes > limits::FLEET_DB_MAX_BYTES {
        return Err(err(
            "COMBD_DB_MAX",
            format!(
                "{} bytes is more than a fleet node restores ({} bytes, \
                 fleet_db_max_bytes): an object's snapshot goes up and comes down in one \
                 call each within the bucket's timeout, and a database past it could be \
                 snapshotted but never restored",
                s.db_max_bytes,
                limits::FLEET_DB_MAX_BYTES
            ),
        ));
    }
    let (hello, handshake) = (s.tls_hello_timeout, s.tls_handshake_timeout);
    if hello > handshake {
        let default = if s.sources.get("COMBD_TLS_HELLO_TIMEOUT") == Some(&Source::Default) {
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
                hello.as_millis(),
                handshake.as_millis(),
                handshake.as_millis()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
