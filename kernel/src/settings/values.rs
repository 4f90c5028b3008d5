//! The parsers of each kind of setting value. Each takes the text and returns the value or
//! what is wrong with it; zero, where it would mean "unlimited", is refused.

use super::*;

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
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "{text:?} has an unknown unit {unit:?}: use ms, s, m, h or d"
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

/// Parses a positive whole count that fits 32 bits (a per-address count or rate). Zero is
/// refused.
pub fn parse_count_u32(text: &str) -> Result<u32, String> {
    let n = parse_count(text)?;
    u32::try_from(n).map_err(|_| format!("{text:?} is too large (at most {})", u32::MAX))
}

/// Parses a percentage: a whole number from 1 to 100 (a trailing `%` is allowed).
pub fn parse_percent(text: &str) -> Result<u64, String> {
    let n = parse_count(text.trim().trim_end_matches('%'))?;
    if n > 100 {
        return Err(format!("{text:?} is more than 100 percent"));
    }
    Ok(n)
}

/// Parses an on/off switch: `on`, `off`, `true`, `false`, `1`, `0`.
pub fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim() {
        "on" | "true" | "1" => Ok(true),
        "off" | "false" | "0" => Ok(false),
        other => Err(format!("{other:?}: use on or off")),
    }
}

/// Where the access log goes (`COMBD_ACCESS_LOG`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogSink {
    /// No access log (the default): the hot path pays one branch.
    Off,
    /// Standard error, beside the node's own log lines.
    Stderr,
    /// A file, opened for append at start-up and again on SIGHUP.
    File(PathBuf),
}

impl Show for AccessLogSink {
    fn show(&self) -> String {
        match self {
            AccessLogSink::Off => "off".to_string(),
            AccessLogSink::Stderr => "stderr".to_string(),
            AccessLogSink::File(path) => path.display().to_string(),
        }
    }
}

/// Parses `COMBD_ACCESS_LOG`: `off`, `stderr`, or the path of a file (absolute, or relative
/// to the node's working directory). Whether the file can be opened is checked at start-up,
/// where it is opened.
pub fn parse_access_log(text: &str) -> Result<AccessLogSink, String> {
    match text {
        "off" => Ok(AccessLogSink::Off),
        "stderr" => Ok(AccessLogSink::Stderr),
        "" => Err("must not be empty: use off, stderr or a file's path".to_string()),
        path if path.trim() != path => Err(format!(
            "{path:?} begins or ends with a blank: use off, stderr or a file's path"
        )),
        path => Ok(AccessLogSink::File(PathBuf::from(path))),
    }
}

/// Parses a listen address `ip:port`, or `:port` / `port` for `0.0.0.0:port` (as Caddy and
/// nginx take them). The localhost listener owns `127.0.0.1`, so the public address may not be
/// it.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    let t = text.trim();
    // `:8080` and `8080` (as Caddy and nginx take them): every IPv4 address.
    let port = t.strip_prefix(':').unwrap_or(t);
    let addr: SocketAddr = match port.parse::<u16>() {
        Ok(port) => SocketAddr::from(([0, 0, 0, 0], port)),
        Err(_) => t.parse().map_err(|_| {
            format!(
                "{text:?} is not an address:port (e.g. 0.0.0.0:8080, or :8080 for every address)"
            )
        })?,
    };
    if addr.ip() == std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST) {
        return Err(
            "127.0.0.1 is the localhost listener's address, which is always served on \
                    the same port; listen on 0.0.0.0 or another address (e.g. 127.0.0.2)"
                .to_string(),
        );
    }
    Ok(addr)
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

/// Parses a positive whole count held in a `usize` (a per-shard count). Zero is refused.
pub(super) fn parse_count_usize(text: &str) -> Result<usize, String> {
    let n = parse_count(text)?;
    usize::try_from(n).map_err(|_| format!("{text:?} is too large"))
}

/// Parses a directory: any path but the empty one.
pub(super) fn parse_dir(text: &str) -> Result<PathBuf, String> {
    if text.is_empty() {
        return Err("must not be empty".to_string());
    }
    Ok(PathBuf::from(text))
}

/// Parses `COMBD_SQLITE_SYNC`: true for `full`, false for `normal`.
pub(super) fn parse_sqlite_sync(text: &str) -> Result<bool, String> {
    match text.trim() {
        "full" => Ok(true),
        "normal" => Ok(false),
        other => Err(format!("{other:?}: use full or normal")),
    }
}

/// A byte size that, not given, the node derives at start-up (a budget): `None` then.
pub(super) fn optional_bytes(text: Option<&str>, _: &Context) -> Result<Option<u64>, String> {
    text.map(parse_bytes).transpose()
}

/// `COMBD_SHARDS`: one per CPU this process may run on, else the count given, at most that.
pub(super) fn resolve_shards(text: Option<&str>, cx: &Context) -> Result<usize, String> {
    let Some(text) = text else {
        return Ok(cx.allowed_cpus.max(1));
    };
    let n = parse_count_usize(text)?;
    if n > cx.allowed_cpus {
        return Err(format!(
            "{n} shards, but this process may run on only {} CPU(s); each shard needs its own",
            cx.allowed_cpus
        ));
    }
    Ok(n)
}

/// `COMBD_ALLOWED_ORIGINS`: unset, only the request's own host; else `*` or a list of origins
/// ([`crate::origins::parse_allowed_origins`]).
pub(super) fn resolve_allowed_origins(
    text: Option<&str>,
    _: &Context,
) -> Result<crate::origins::AllowedOrigins, String> {
    match text {
        None => Ok(crate::origins::AllowedOrigins::SameHost),
        Some(t) => crate::origins::parse_allowed_origins(t),
    }
}
