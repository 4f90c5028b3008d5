//! The request fields and targets the head parser checks: `Content-Length` (digits only),
//! `Host` (RFC 9110, 7.2), and the request target in origin or absolute form (RFC 9112, 3.2).

use super::{bad, HeadError};

/// A `Content-Length` value: `1*DIGIT` and nothing else (RFC 9110, 8.6). A sign, a space
/// inside or a list is refused, so no proxy in front can read the length differently.
pub(super) fn content_length(value: &[u8]) -> Result<u64, HeadError> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(bad("invalid content-length"));
    }
    // Digits only, so the text is ASCII; a value past u64 is refused too.
    std::str::from_utf8(value)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or(bad("invalid content-length"))
}

/// Whether a `Host` value is `uri-host [ ":" port ]` (RFC 9110, 7.2; RFC 3986, 3.2.2): an
/// IP literal in brackets, or a name of unreserved characters, percent-encodings and
/// sub-delimiters; then an optional port of digits. Empty is valid (a target without an
/// authority).
pub fn valid_host(value: &[u8]) -> bool {
    let sub_delim = |b: u8| b"!$&'()*+,;=".contains(&b);
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
    let (host, port) = if value.first() == Some(&b'[') {
        let Some(end) = value.iter().position(|&b| b == b']') else {
            return false;
        };
        let inside = &value[1..end];
        if inside.is_empty()
            || !inside
                .iter()
                .all(|&b| unreserved(b) || sub_delim(b) || b == b':')
        {
            return false;
        }
        match &value[end + 1..] {
            [] => (&value[..0], None),
            [b':', port @ ..] => (&value[..0], Some(port)),
            _ => return false,
        }
    } else {
        match value.iter().position(|&b| b == b':') {
            Some(i) => (&value[..i], Some(&value[i + 1..])),
            None => (value, None),
        }
    };
    let name_ok = {
        let mut i = 0;
        let mut ok = true;
        while i < host.len() {
            let b = host[i];
            if b == b'%' {
                ok &= host.len() > i + 2
                    && host[i + 1].is_ascii_hexdigit()
                    && host[i + 2].is_ascii_hexdigit();
                i += 3;
            } else {
                ok &= unreserved(b) || sub_delim(b);
                i += 1;
            }
        }
        ok
    };
    name_ok && port.is_none_or(|p| p.iter().all(u8::is_ascii_digit))
}

/// Whether a request target has a form the node serves (RFC 9112, 3.2): origin-form (`/p?q`),
/// asterisk-form (`*`), or absolute-form with the `http` or `https` scheme, a host, and no
/// userinfo (RFC 9110, 4.2.4: a recipient treats `user@` as an error). Anything else (another
/// scheme, authority-form, a bare word) is a 400.
pub(super) fn target_ok(target: &str) -> bool {
    if target.starts_with('/') || target == "*" {
        return true;
    }
    let Some((scheme, rest)) = target.split_once("://") else {
        return false;
    };
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return false;
    }
    let authority = rest.find(['/', '?', '#']).map_or(rest, |i| &rest[..i]);
    !authority.is_empty() && !authority.contains('@')
}

/// The path and query of a request target: origin-form (`/p?q`) as it is, absolute-form
/// (`http://host/p?q`, RFC 9112, 3.2.2) with its scheme and authority removed (an empty path
/// is `/`).
pub(super) fn split_target(target: &str) -> (&str, Option<&str>) {
    let scheme = |s: &str| {
        target
            .get(..s.len())
            .is_some_and(|t| t.eq_ignore_ascii_case(s))
    };
    let t = if scheme("http://") || scheme("https://") {
        let rest = &target[target.find("://").map_or(0, |i| i + 3)..];
        rest.find(['/', '?']).map_or("", |i| &rest[i..])
    } else {
        target
    };
    let (path, query) = match t.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (t, None),
    };
    (if path.is_empty() { "/" } else { path }, query)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_of_another_scheme_or_with_userinfo_are_refused() {
        for ok in ["/", "/a?b", "*", "http://h/x", "HTTPS://h:1", "http://h?q"] {
            assert!(target_ok(ok), "{ok}");
        }
        for bad in [
            "http://user@h/x",
            "http://u:p@h",
            "ftp://h/x",
            "ws://h/o/echo/a",
            "h:80",
            "x",
            "http:///x",
            "",
        ] {
            assert!(!target_ok(bad), "{bad}");
        }
    }

    #[test]
    fn absolute_form_targets_are_served_by_their_path() {
        assert_eq!(split_target("/a?b"), ("/a", Some("b")));
        assert_eq!(split_target("http://h/healthz"), ("/healthz", None));
        assert_eq!(
            split_target("HTTPS://h:1/o/x/y?q=1"),
            ("/o/x/y", Some("q=1"))
        );
        assert_eq!(split_target("http://h"), ("/", None));
        assert_eq!(split_target("http://h?q"), ("/", Some("q")));
    }
}
