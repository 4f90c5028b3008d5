//! The fleet's settings: the coordinator (etcd), the bucket (S3), this node's fleet address and
//! its lease. The fleet is off unless `COMBD_FLEET_ETCD` is set; then every other fleet setting
//! but the lease's TTL is required, and without it none may be set (a half-configured fleet must
//! not start as a lone node that believes its writes are shipped).

use super::*;

/// The fleet's settings, when the fleet is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetSettings {
    /// `COMBD_FLEET_ETCD`: the coordinator's endpoints, each `http://host:port` or all
    /// `https://host:port`, in the order given (a client tries them in turn).
    pub etcd: Vec<String>,
    /// `COMBD_FLEET_ETCD_CERT_FILE` and `COMBD_FLEET_ETCD_KEY_FILE`: the client certificate
    /// (PEM chain) and its key this node shows etcd over https (etcd's `--client-cert-auth`).
    pub etcd_client_cert: Option<(PathBuf, PathBuf)>,
    /// `COMBD_FLEET_ETCD_USER` and `COMBD_FLEET_ETCD_PASSWORD_FILE`: the etcd user (RBAC) this
    /// node authenticates as, and the file holding its password, read at start-up.
    pub etcd_user: Option<(String, PathBuf)>,
    /// `COMBD_FLEET_CA_FILE`: the PEM certificates of the authorities trusted for the https
    /// endpoints (etcd's and the bucket's); `None`: the built-in Mozilla roots.
    pub ca_file: Option<PathBuf>,
    /// `COMBD_FLEET_BUCKET_URL`: the S3 endpoint, `http://host:port` or `https://host:port`
    /// (no path).
    pub bucket_url: String,
    /// `COMBD_FLEET_BUCKET`: the bucket's name.
    pub bucket: String,
    /// `COMBD_FLEET_BUCKET_REGION`: the region S3 signatures name (the server's own, e.g.
    /// Garage's `s3_region`).
    pub bucket_region: String,
    /// `COMBD_FLEET_ACCESS_KEY`: the bucket's access key id (not a secret: it is printed by
    /// `--check-config`).
    pub access_key: String,
    /// `COMBD_FLEET_SECRET_KEY_FILE`: the file holding the bucket's secret key, read at start-up
    /// (a secret in the environment or on the command line is visible in `/proc`).
    pub secret_key_file: PathBuf,
    /// `COMBD_FLEET_KEY_FILE`: the file holding the fleet key, which signs every request one
    /// node passes on to another (`combd_fleet::auth`), read at start-up.
    pub key_file: PathBuf,
    /// `COMBD_FLEET_NODE`: the address other nodes reach this node at, recorded as the owner of
    /// the objects it claims.
    pub node: SocketAddr,
    /// `COMBD_FLEET_NODE_PUBLIC`: whether the fleet address (this node's, and every owner's it
    /// dials) may be a public one.
    pub node_public: bool,
    /// `COMBD_FLEET_LEASE_TTL`: how long this node's lease outlives its last renewal.
    pub lease_ttl: Duration,
    /// `COMBD_FLEET_OBJECT_IDLE`: how long an object waits for mail before it is let go.
    pub object_idle: Duration,
}

/// The fleet settings that need `COMBD_FLEET_ETCD`, and are required with it (the lease's TTL
/// has a default).
pub(super) const REQUIRED_WITH_ETCD: &[&str] = &[
    "COMBD_FLEET_BUCKET_URL",
    "COMBD_FLEET_BUCKET",
    "COMBD_FLEET_ACCESS_KEY",
    "COMBD_FLEET_SECRET_KEY_FILE",
    "COMBD_FLEET_KEY_FILE",
    "COMBD_FLEET_NODE",
];

/// The fleet settings that need `COMBD_FLEET_ETCD` but have a default.
pub(super) const OPTIONAL_WITH_ETCD: &[&str] = &[
    "COMBD_FLEET_LEASE_TTL",
    "COMBD_FLEET_BUCKET_REGION",
    "COMBD_FLEET_NODE_PUBLIC",
    "COMBD_FLEET_OBJECT_IDLE",
    "COMBD_FLEET_CA_FILE",
    "COMBD_FLEET_ETCD_CERT_FILE",
    "COMBD_FLEET_ETCD_KEY_FILE",
    "COMBD_FLEET_ETCD_USER",
    "COMBD_FLEET_ETCD_PASSWORD_FILE",
];

/// Reads the fleet's settings: `None` when `COMBD_FLEET_ETCD` is not set (and no other fleet
/// setting is either).
pub(super) fn fleet_settings(
    get: impl Fn(&str) -> Option<String>,
) -> Result<Option<FleetSettings>, ConfigError> {
    let Some(etcd) = get("COMBD_FLEET_ETCD") else {
        for name in REQUIRED_WITH_ETCD.iter().chain(OPTIONAL_WITH_ETCD) {
            if get(name).is_some() {
                return Err(err(
                    name,
                    "is set but COMBD_FLEET_ETCD is not (the fleet is off without a coordinator)",
                ));
            }
        }
        return Ok(None);
    };
    let etcd = parse_etcd_endpoints(&etcd).map_err(|m| err("COMBD_FLEET_ETCD", m))?;
    let required = |name: &str| {
        get(name)
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| err(name, "required with COMBD_FLEET_ETCD"))
    };
    let bucket_url = parse_http_endpoint(&required("COMBD_FLEET_BUCKET_URL")?)
        .map_err(|m| err("COMBD_FLEET_BUCKET_URL", m))?;
    let (etcd_client_cert, etcd_user, ca_file) = fleet_tls_settings(&get, &etcd, &bucket_url)?;
    let bucket = parse_bucket_name(&required("COMBD_FLEET_BUCKET")?)
        .map_err(|m| err("COMBD_FLEET_BUCKET", m))?;
    let access_key = required("COMBD_FLEET_ACCESS_KEY")?.trim().to_string();
    if !access_key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(err(
            "COMBD_FLEET_ACCESS_KEY",
            "must be printable ASCII without spaces",
        ));
    }
    let secret_key_file = PathBuf::from(required("COMBD_FLEET_SECRET_KEY_FILE")?.trim());
    let key_file = PathBuf::from(required("COMBD_FLEET_KEY_FILE")?.trim());
    let (node, node_public) = fleet_node(&get, &required("COMBD_FLEET_NODE")?)?;
    let (lease_ttl, object_idle) = fleet_times(&get)?;
    let region = get("COMBD_FLEET_BUCKET_REGION");
    let bucket_region = parse_region(
        region
            .as_deref()
            .unwrap_or(limits::FLEET_BUCKET_REGION_DEFAULT),
    )
    .map_err(|m| err("COMBD_FLEET_BUCKET_REGION", m))?;
    Ok(Some(FleetSettings {
        etcd,
        etcd_client_cert,
        etcd_user,
        ca_file,
        bucket_url,
        bucket,
        bucket_region,
        access_key,
        secret_key_file,
        key_file,
        node,
        node_public,
        lease_ttl,
        object_idle,
    }))
}

/// `COMBD_FLEET_NODE` (given as `text`), checked against `COMBD_FLEET_NODE_PUBLIC`: the
/// node's fleet address, and whether it may be a public one.
fn fleet_node(
    get: &impl Fn(&str) -> Option<String>,
    text: &str,
) -> Result<(SocketAddr, bool), ConfigError> {
    let public = match get("COMBD_FLEET_NODE_PUBLIC") {
        Some(text) => {
            super::values::parse_switch(&text).map_err(|m| err("COMBD_FLEET_NODE_PUBLIC", m))?
        }
        None => false,
    };
    let node = parse_fleet_address(text, public).map_err(|m| err("COMBD_FLEET_NODE", m))?;
    Ok((node, public))
}

/// `COMBD_FLEET_LEASE_TTL` and `COMBD_FLEET_OBJECT_IDLE`, or their defaults.
fn fleet_times(get: &impl Fn(&str) -> Option<String>) -> Result<(Duration, Duration), ConfigError> {
    let lease_ttl = match get("COMBD_FLEET_LEASE_TTL") {
        Some(text) => parse_lease_ttl(&text).map_err(|m| err("COMBD_FLEET_LEASE_TTL", m))?,
        None => limits::FLEET_LEASE_TTL_DEFAULT,
    };
    let object_idle = match get("COMBD_FLEET_OBJECT_IDLE") {
        Some(text) => parse_object_idle(&text).map_err(|m| err("COMBD_FLEET_OBJECT_IDLE", m))?,
        None => limits::FLEET_OBJECT_IDLE_DEFAULT,
    };
    Ok((lease_ttl, object_idle))
}

/// Parses `COMBD_FLEET_LEASE_TTL`: a duration in whole seconds (etcd's leases count seconds),
/// from [`limits::FLEET_LEASE_TTL_MIN`] to [`limits::FLEET_LEASE_TTL_MAX`].
pub fn parse_lease_ttl(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.subsec_nanos() != 0 {
        return Err(format!(
            "{text:?} is not a whole number of seconds (etcd's leases count seconds)"
        ));
    }
    let (min, max) = (limits::FLEET_LEASE_TTL_MIN, limits::FLEET_LEASE_TTL_MAX);
    if d < min || d > max {
        return Err(format!(
            "{text:?} is out of range: from {}s (etcd's shortest lease) to {}s (a dead owner's \
             objects are unreachable this long)",
            min.as_secs(),
            max.as_secs()
        ));
    }
    Ok(d)
}

/// Parses `COMBD_FLEET_OBJECT_IDLE`: a duration from [`limits::FLEET_OBJECT_IDLE_MIN`] to
/// [`limits::FLEET_OBJECT_IDLE_MAX`].
pub fn parse_object_idle(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    let (min, max) = (limits::FLEET_OBJECT_IDLE_MIN, limits::FLEET_OBJECT_IDLE_MAX);
    if d < min || d > max {
        return Err(format!(
            "{text:?} is out of range: from {}s (a node alone's own idle time) to {}s",
            min.as_secs(),
            max.as_secs()
        ));
    }
    Ok(d)
}

/// Parses an HTTP endpoint `http://host:port` or `https://host:port` (a trailing `/` is
/// dropped; no path).
pub fn parse_http_endpoint(text: &str) -> Result<String, String> {
    let t = text.trim();
    let (scheme, rest) = if let Some(rest) = t.strip_prefix("http://") {
        ("http", rest)
    } else if let Some(rest) = t.strip_prefix("https://") {
        ("https", rest)
    } else {
        return Err(format!(
            "{t:?} is not an endpoint: expected http://host:port or https://host:port"
        ));
    };
    let hostport = rest.strip_suffix('/').unwrap_or(rest);
    let Some((host, port)) = hostport.rsplit_once(':') else {
        return Err(format!("{t:?} has no port: expected {scheme}://host:port"));
    };
    let host_ok = !host.is_empty()
        && (host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
            || (host.starts_with('[') && host.ends_with(']')));
    if !host_ok {
        return Err(format!(
            "{t:?}: the host must be a name or an IP address (no path, no user)"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(format!("{scheme}://{host}:{p}")),
        _ => Err(format!("{t:?}: the port must be 1 to 65535")),
    }
}

/// Parses `COMBD_FLEET_ETCD`: comma-separated endpoints, each `http://host:port` or
/// `host:port`, or each `https://host:port` (one scheme for all: a cluster half over TLS would
/// be half open), at most [`limits::FLEET_ETCD_ENDPOINTS_MAX`], no repeats.
pub fn parse_etcd_endpoints(text: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for item in text.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(format!("{text:?} has an empty endpoint"));
        }
        let url = if item.contains("://") {
            item.to_string()
        } else {
            format!("http://{item}")
        };
        let e = parse_http_endpoint(&url)?;
        if out.contains(&e) {
            return Err(format!("{e} is listed twice"));
        }
        if out.first().is_some_and(|f| is_https(f) != is_https(&e)) {
            return Err(format!(
                "{text:?} mixes http and https endpoints: the members are reached all over TLS \
                 or none"
            ));
        }
        out.push(e);
    }
    if out.len() > limits::FLEET_ETCD_ENDPOINTS_MAX {
        return Err(format!(
            "{} endpoints; at most {} (an etcd cluster has at most 7 members)",
            out.len(),
            limits::FLEET_ETCD_ENDPOINTS_MAX
        ));
    }
    Ok(out)
}

/// Whether an endpoint [`parse_http_endpoint`] returned is reached over TLS.
pub fn is_https(endpoint: &str) -> bool {
    endpoint.starts_with("https://")
}

/// The settings of the fleet's TLS and of etcd's authentication: a client certificate for etcd
/// (both files or neither), an etcd user (with its password file, or neither) and the
/// authorities trusted; each needs an https endpoint to be of use (a password sent over plain
/// HTTP would be readable on the network), and is refused without one.
#[allow(clippy::type_complexity)]
fn fleet_tls_settings(
    get: &impl Fn(&str) -> Option<String>,
    etcd: &[String],
    bucket_url: &str,
) -> Result<
    (
        Option<(PathBuf, PathBuf)>,
        Option<(String, PathBuf)>,
        Option<PathBuf>,
    ),
    ConfigError,
> {
    let etcd_tls = etcd.first().is_some_and(|e| is_https(e));
    let text = |name: &str| get(name).map(|v| v.trim().to_string());
    let pair = |a: &'static str, b: &'static str| match (text(a), text(b)) {
        (Some(x), Some(y)) if !x.is_empty() && !y.is_empty() => {
            if etcd_tls {
                Ok(Some((x, y)))
            } else {
                Err(err(
                    a,
                    "needs COMBD_FLEET_ETCD's endpoints to be https:// (over plain HTTP it \
                     would be of no use, or readable on the network)",
                ))
            }
        }
        (None, None) => Ok(None),
        (Some(x), _) if x.is_empty() => Err(err(a, "is empty")),
        (_, Some(y)) if y.is_empty() => Err(err(b, "is empty")),
        (Some(_), None) => Err(err(b, format!("required with {a}"))),
        _ => Err(err(a, format!("required with {b}"))),
    };
    let cert = pair("COMBD_FLEET_ETCD_CERT_FILE", "COMBD_FLEET_ETCD_KEY_FILE")?
        .map(|(c, k)| (PathBuf::from(c), PathBuf::from(k)));
    let user = pair("COMBD_FLEET_ETCD_USER", "COMBD_FLEET_ETCD_PASSWORD_FILE")?;
    if let Some((name, _)) = &user {
        if name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(err(
                "COMBD_FLEET_ETCD_USER",
                "must be 1 to 128 printable ASCII characters without spaces",
            ));
        }
    }
    let user = user.map(|(u, p)| (u, PathBuf::from(p)));
    let ca = match text("COMBD_FLEET_CA_FILE") {
        None => None,
        Some(p) if p.is_empty() => return Err(err("COMBD_FLEET_CA_FILE", "is empty")),
        Some(_) if !etcd_tls && !is_https(bucket_url) => {
            return Err(err(
                "COMBD_FLEET_CA_FILE",
                "is set but neither COMBD_FLEET_ETCD nor COMBD_FLEET_BUCKET_URL is https://",
            ))
        }
        Some(p) => Some(PathBuf::from(p)),
    };
    Ok((cert, user, ca))
}

/// Parses a bucket name by S3's rules: 3 to 63 characters, lower-case letters, digits, `.` and
/// `-`, beginning and ending with a letter or digit.
pub fn parse_bucket_name(text: &str) -> Result<String, String> {
    let t = text.trim();
    let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !(3..=63).contains(&t.len())
        || !t
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        || !edge(t.bytes().next())
        || !edge(t.bytes().last())
    {
        return Err(format!(
            "{t:?} is not a bucket name: 3 to 63 lower-case letters, digits, '.' or '-', \
             beginning and ending with a letter or digit"
        ));
    }
    Ok(t.to_string())
}

/// Parses `COMBD_FLEET_NODE`: the `ip:port` other nodes reach this node at; neither the
/// unspecified address (`0.0.0.0` reaches nobody) nor port 0.
pub fn parse_fleet_node(text: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not an address:port (e.g. 10.0.0.2:7946)"))?;
    if addr.ip().is_unspecified() || addr.port() == 0 {
        return Err(format!(
            "{addr}: other nodes must be able to reach it: give a real address and port"
        ));
    }
    Ok(addr)
}

/// Parses a fleet address (`COMBD_FLEET_NODE`, or an owner's recorded in the coordinator) as
/// [`parse_fleet_node`] does, and refuses a public address unless `public` is allowed
/// (`COMBD_FLEET_NODE_PUBLIC`): the fleet port serves what other nodes pass on, past admission,
/// and belongs on a network of the fleet's own.
pub fn parse_fleet_address(text: &str, public: bool) -> Result<SocketAddr, String> {
    let addr = parse_fleet_node(text)?;
    if !public && !is_private(addr.ip()) {
        return Err(format!(
            "{addr} is a public address: the fleet port takes what other nodes pass on, past \
             admission, so it belongs on the fleet's own network (loopback, 10/8, 172.16/12, \
             192.168/16, 100.64/10, 169.254/16, 198.18/15, fc00::/7, fe80::/10); set \
             COMBD_FLEET_NODE_PUBLIC=on to use it anyway"
        ));
    }
    Ok(addr)
}

/// Whether `ip` is an address of a private network, never routed on the internet: loopback,
/// RFC 1918, shared (RFC 6598), link-local, the benchmarking range (RFC 2544, 198.18/15: what
/// `tools/fleet-netns` runs its fleet on), IPv6 unique local or link-local (an IPv4-mapped IPv6
/// address as its IPv4).
pub fn is_private(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    let v4 = |a: std::net::Ipv4Addr| {
        let o = a.octets();
        a.is_loopback()
            || a.is_private()
            || a.is_link_local()
            || (o[0] == 100 && (o[1] & 0xc0) == 64)
            || (o[0] == 198 && (o[1] & 0xfe) == 18)
    };
    match ip {
        IpAddr::V4(a) => v4(a),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(m) => v4(m),
            None => {
                let s = a.segments();
                a.is_loopback() || (s[0] & 0xfe00) == 0xfc00 || (s[0] & 0xffc0) == 0xfe80
            }
        },
    }
}

/// Parses an S3 region name: 1 to 64 of `a-z 0-9 -`.
pub fn parse_region(text: &str) -> Result<String, String> {
    let t = text.trim();
    if t.is_empty()
        || t.len() > 64
        || !t
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!(
            "{t:?} is not a region: 1 to 64 lower-case letters, digits or '-' (e.g. garage, us-east-1)"
        ));
    }
    Ok(t.to_string())
}
