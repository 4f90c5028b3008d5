//! The `Origin` policy (`COMBD_ALLOWED_ORIGINS`): which web pages may open a WebSocket to the
//! node or send it a state-changing request.
//!
//! A browser sends `Origin` with every WebSocket handshake and with every request that is not
//! a plain `GET`/`HEAD`, and it sends the user's cookies with them whatever page started them.
//! Without a check any page the user visits could open a WebSocket to the node in the user's
//! name (cross-site WebSocket hijacking; the WebSocket handshake is not subject to CORS). The
//! policy, decided here on plain bytes:
//!
//! - no `Origin` (a client that is not a browser, or a same-origin `GET`): allowed;
//! - an `Origin` whose host and port are the request's `Host` (the page was served by this
//!   node under the name the request uses): allowed, compared ASCII-case-insensitively as
//!   written (browsers leave out a scheme's default port in both);
//! - an `Origin` in `COMBD_ALLOWED_ORIGINS` (origins `scheme://host[:port]`, compared without
//!   the scheme's default port and case-insensitively), or any at all if the list is `*`:
//!   allowed;
//! - any other, `null` included (a sandboxed frame, a `file:` page): refused (403
//!   `origin not allowed`).
//!
//! Only browsers are held to this: a client that sets no `Origin` (or any it likes) is not a
//! victim's browser, and identity is the token's job, not this check's.

/// The origins allowed beside the request's own host.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AllowedOrigins {
    /// Only the request's own host (`COMBD_ALLOWED_ORIGINS` not set).
    #[default]
    SameHost,
    /// The request's own host and these origins, normalised (lower case, no default port).
    List(Vec<String>),
    /// Any origin (`COMBD_ALLOWED_ORIGINS=*`): the check is off.
    Any,
}

use crate::limits::ALLOWED_ORIGINS_MAX;

/// An origin's scheme, host and port, lower case, the scheme's default port left out: the form
/// origins are compared in. `None` if `text` is not a serialized origin (RFC 6454, 6.1):
/// `scheme://host[:port]` with nothing after it.
pub fn normalize(text: &str) -> Option<String> {
    let (scheme, rest) = text.split_once("://")?;
    if scheme.is_empty()
        || !scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return None;
    }
    let scheme = scheme.to_ascii_lowercase();
    // host: a name or an IPv4 address, or an IPv6 address in brackets; then an optional port.
    let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
        let (addr, after) = v6.split_once(']')?;
        if addr.is_empty()
            || !addr
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return None;
        }
        (format!("[{}]", addr.to_ascii_lowercase()), after)
    } else {
        let end = rest.find(':').unwrap_or(rest.len());
        let host = &rest[..end];
        if host.is_empty()
            || !host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        {
            return None;
        }
        (host.to_ascii_lowercase(), &rest[end..])
    };
    let port = match port.strip_prefix(':') {
        None if port.is_empty() => None,
        None => return None, // a path, a query or anything else after the host
        Some(p) => {
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: u32 = p.parse().ok()?;
            if n == 0 || n > 65535 {
                return None;
            }
            let default = match scheme.as_str() {
                "http" | "ws" => Some(80),
                "https" | "wss" => Some(443),
                _ => None,
            };
            (default != Some(n)).then_some(n)
        }
    };
    Some(match port {
        Some(p) => format!("{scheme}://{host}:{p}"),
        None => format!("{scheme}://{host}"),
    })
}

/// Parses `COMBD_ALLOWED_ORIGINS`: `*`, or origins separated by commas.
pub fn parse_allowed_origins(text: &str) -> Result<AllowedOrigins, String> {
    const USE: &str =
        "use origins scheme://host[:port] separated by commas (https://app.example.com), or *";
    let t = text.trim();
    if t.is_empty() {
        return Err(format!(
            "must not be empty: {USE}; unset, only pages of the request's own host are allowed"
        ));
    }
    if t == "*" {
        return Ok(AllowedOrigins::Any);
    }
    let mut list = Vec::new();
    for entry in t.split(',').map(str::trim) {
        if entry.is_empty() {
            return Err(format!("{text:?} has an empty entry: {USE}"));
        }
        if entry == "*" {
            return Err(format!("* must stand alone, not in a list: {USE}"));
        }
        let origin = normalize(entry).ok_or_else(|| {
            format!("{entry:?} is not an origin (no path, no slash at the end): {USE}")
        })?;
        if !list.contains(&origin) {
            list.push(origin);
        }
    }
    if list.len() > ALLOWED_ORIGINS_MAX {
        return Err(format!(
            "{} origins, at most {ALLOWED_ORIGINS_MAX}: list fewer, or use *",
            list.len()
        ));
    }
    Ok(AllowedOrigins::List(list))
}

impl AllowedOrigins {
    /// Whether a request with this `Origin` (if any) and this `Host` (if any), on a TLS
    /// connection or not, may open a WebSocket or change state. On TLS the same-host rule
    /// takes only an `https` page: a plain-HTTP page of the same name (which anyone on the path
    /// can rewrite) is another origin.
    pub fn allows(&self, origin: Option<&[u8]>, host: Option<&[u8]>, tls: bool) -> bool {
        let Some(origin) = origin else {
            return true;
        };
        if matches!(self, AllowedOrigins::Any) {
            return true;
        }
        let Ok(origin) = std::str::from_utf8(origin) else {
            return false;
        };
        let origin = origin.trim();
        // Same host: the part after "scheme://" is the request's Host, as written.
        if let (Some((scheme, authority)), Some(host)) = (origin.split_once("://"), host) {
            if !authority.is_empty()
                && authority.as_bytes().eq_ignore_ascii_case(host.trim_ascii())
                && (!tls || scheme.eq_ignore_ascii_case("https"))
            {
                return true;
            }
        }
        match self {
            AllowedOrigins::List(list) => normalize(origin).is_some_and(|o| list.contains(&o)),
            _ => false,
        }
    }

    /// The value as `--check-config` prints it.
    pub fn show(&self) -> String {
        match self {
            AllowedOrigins::SameHost => "(the request's own host)".to_string(),
            AllowedOrigins::Any => "*".to_string(),
            AllowedOrigins::List(l) => l.join(","),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(text: &str) -> AllowedOrigins {
        parse_allowed_origins(text).unwrap()
    }

    #[test]
    fn origins_normalise_to_scheme_host_and_a_port_other_than_the_default() {
        assert_eq!(
            normalize("https://App.Example.com").as_deref(),
            Some("https://app.example.com")
        );
        assert_eq!(
            normalize("https://a.example:443").as_deref(),
            Some("https://a.example")
        );
        assert_eq!(
            normalize("http://a.example:80").as_deref(),
            Some("http://a.example")
        );
        assert_eq!(
            normalize("http://a.example:8080").as_deref(),
            Some("http://a.example:8080")
        );
        assert_eq!(
            normalize("http://[::1]:8080").as_deref(),
            Some("http://[::1]:8080")
        );
        assert_eq!(
            normalize("http://127.0.0.2:8080").as_deref(),
            Some("http://127.0.0.2:8080")
        );
        for bad in [
            "",
            "null",
            "a.example",
            "https://",
            "https://a.example/",
            "https://a.example/path",
            "https://a.example:",
            "https://a.example:0",
            "https://a.example:65536",
            "https://a.example:80x",
            "https://user@a.example",
            "https://a b",
            "1http://a.example",
            "http://[::1",
            "http://[]",
        ] {
            assert_eq!(normalize(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_setting_is_star_or_a_list_of_origins() {
        assert_eq!(list("*"), AllowedOrigins::Any);
        assert_eq!(
            list(" https://a.example , http://b.example:8080,https://A.example:443"),
            AllowedOrigins::List(vec![
                "https://a.example".to_string(),
                "http://b.example:8080".to_string()
            ])
        );
        for bad in [
            "",
            " ",
            "https://a.example,",
            "https://a.example,*",
            "a.example",
            "https://a.example/",
        ] {
            let e = parse_allowed_origins(bad).unwrap_err();
            assert!(e.contains("scheme://host"), "{bad:?}: {e}");
        }
        let many: Vec<String> = (0..=ALLOWED_ORIGINS_MAX)
            .map(|i| format!("https://h{i}.example"))
            .collect();
        assert!(parse_allowed_origins(&many.join(","))
            .unwrap_err()
            .contains("at most 64"));
        assert!(parse_allowed_origins(&many[..ALLOWED_ORIGINS_MAX].join(",")).is_ok());
    }

    #[test]
    fn no_origin_or_the_requests_own_host_is_allowed_and_any_other_refused() {
        let same = AllowedOrigins::SameHost;
        let host = Some(&b"chat.example:8080"[..]);
        assert!(same.allows(None, host, false));
        assert!(same.allows(None, None, false));
        assert!(same.allows(Some(b"http://chat.example:8080"), host, false));
        assert!(same.allows(Some(b"https://Chat.Example:8080"), host, false));
        assert!(same.allows(Some(b"https://chat.example"), Some(b"chat.example"), false));
        assert!(
            !same.allows(Some(b"http://chat.example"), host, false),
            "another port"
        );
        assert!(!same.allows(Some(b"http://evil.example:8080"), host, false));
        assert!(!same.allows(Some(b"http://chat.example.evil.example:8080"), host, false));
        assert!(!same.allows(Some(b"null"), host, false));
        assert!(
            !same.allows(Some(b"http://chat.example:8080"), None, false),
            "no Host to match"
        );
        assert!(!same.allows(Some(b"\xff"), host, false));
        assert!(!same.allows(Some(b"://"), Some(b""), false));
    }

    #[test]
    fn on_tls_the_own_host_counts_only_as_an_https_page() {
        let same = AllowedOrigins::SameHost;
        let host = Some(&b"chat.example"[..]);
        assert!(same.allows(Some(b"https://chat.example"), host, true));
        assert!(!same.allows(Some(b"http://chat.example"), host, true));
        assert!(
            same.allows(Some(b"http://chat.example"), host, false),
            "behind a TLS proxy"
        );
        let listed = list("http://chat.example");
        assert!(
            listed.allows(Some(b"http://chat.example"), host, true),
            "listed by the operator"
        );
    }

    #[test]
    fn listed_origins_are_allowed_beside_the_own_host_and_star_allows_all() {
        let l = list("https://app.example,http://localhost:3000");
        let host = Some(&b"api.example"[..]);
        assert!(l.allows(Some(b"https://app.example"), host, false));
        assert!(l.allows(Some(b"https://APP.example:443"), host, false));
        assert!(l.allows(Some(b"http://localhost:3000"), host, false));
        assert!(
            l.allows(Some(b"https://api.example"), host, false),
            "its own host still"
        );
        assert!(
            !l.allows(Some(b"http://app.example"), host, false),
            "another scheme"
        );
        assert!(!l.allows(Some(b"http://localhost:3001"), host, false));
        assert!(!l.allows(Some(b"null"), host, false));
        assert!(AllowedOrigins::Any.allows(Some(b"null"), host, false));
        assert!(AllowedOrigins::Any.allows(Some(b"https://evil.example"), None, false));
    }
}
