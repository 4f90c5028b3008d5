//! What an app sees of who called beyond the method, the query and the body ([`Caller`]), and
//! what it may answer beyond a status and a body: its content type, a bounded set of header
//! fields ([`APP_RESPONSE_HEADERS`]), and a CORS policy ([`Cors`]) the node answers preflights
//! and cross-origin requests by.

use std::net::IpAddr;

use combd_kernel::limits::{APP_HEADERS_MAX, APP_HEADER_VALUE_MAX_BYTES};

use crate::http::Response;

use super::AppError;

/// What the node saw of a request, or of a session's upgrade (a session keeps it for its
/// whole life), beyond its method, query and body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The client's address: the peer of its connection (for a request another node of the
    /// fleet passed on, the address the client connected to that node from, which the fleet
    /// key's signature covers). Behind a proxy of your own, the proxy's: declare
    /// `x-forwarded-for` in [`super::App::wants_header`] and trust it as far as you trust the
    /// proxy.
    pub addr: Option<IpAddr>,
    /// The request's `Origin` (a browser's page's origin), as sent, if any. The node's Origin
    /// policy (`COMBD_ALLOWED_ORIGINS`, and the app's CORS policy) already let it through.
    pub origin: Option<String>,
    /// The rest of the path under the object: `a/b` of `/o/<app>/<name>/a/b`, as sent (still
    /// percent-encoded); `None` for `/o/<app>/<name>` itself.
    pub rest: Option<String>,
    /// The request's header fields the app declared ([`super::App::wants_header`]), names in
    /// lower case, in the order sent: at most [`APP_HEADERS_MAX`], each value at most
    /// [`APP_HEADER_VALUE_MAX_BYTES`] (a longer one is left out).
    pub headers: Vec<(String, String)>,
}

impl Caller {
    /// The first value of header field `name` (any case), if the app declared it and it came.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The bytes it holds beyond its own size (counted with the input that carries it).
    pub fn bytes(&self) -> u64 {
        let s = |o: &Option<String>| o.as_ref().map_or(0, |s| s.len() as u64);
        s(&self.origin)
            + s(&self.rest)
            + self
                .headers
                .iter()
                .map(|(n, v)| (n.len() + v.len()) as u64)
                .sum::<u64>()
    }
}

/// The header fields an app's answer may carry beside its status, content type and body: what
/// a web app needs to serve its own pages and API (a cookie, a redirect, caching, a download's
/// name). The node writes framing (`content-length`, `transfer-encoding`, `connection`),
/// `date`, and the CORS fields (from [`super::App::cors`]) itself; an answer with any other
/// field fails (500) rather than lose it silently.
pub const APP_RESPONSE_HEADERS: &[&str] = &[
    "cache-control",
    "content-disposition",
    "content-language",
    "etag",
    "expires",
    "last-modified",
    "location",
    "set-cookie",
    "vary",
    "x-content-type-options",
];

/// The node's own spelling of `name` if an app's answer may carry it.
pub fn app_response_header(name: &str) -> Option<&'static str> {
    APP_RESPONSE_HEADERS
        .iter()
        .find(|h| h.eq_ignore_ascii_case(name))
        .copied()
}

/// Whether `value` may be written as a header field's value as it is: at most
/// [`APP_HEADER_VALUE_MAX_BYTES`] of visible ASCII, spaces and tabs (RFC 9110, 5.5), no CR, LF or
/// NUL (a field that could split the response), not starting or ending with a space.
pub fn valid_header_value(value: &str) -> bool {
    value.len() <= APP_HEADER_VALUE_MAX_BYTES
        && value
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
        && !value.starts_with([' ', '\t'])
        && !value.ends_with([' ', '\t'])
}

/// Whether `ct` may be an answer's content type: a `type/subtype` with optional parameters,
/// as a valid header value.
pub fn valid_content_type(ct: &str) -> bool {
    let essence = ct.split(';').next().unwrap_or("").trim();
    let token = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$&-^_.+".contains(&b))
    };
    valid_header_value(ct)
        && essence
            .split_once('/')
            .is_some_and(|(t, s)| token(t) && token(s))
}

/// Checks an app's answer before it is written: its content type and each header field one an
/// app may set, at most [`APP_HEADERS_MAX`] of them. An answer that breaks this is replaced by
/// a 500 (with why, for the node's log).
pub fn check_app_response(resp: &Response) -> Result<(), AppError> {
    let fail =
        |why: String| Err(AppError::new(500, "the app's answer was invalid").with_detail(why));
    if !valid_content_type(&resp.content_type) {
        return fail(format!("content type {:?} is not valid", resp.content_type));
    }
    if resp.headers.len() > APP_HEADERS_MAX {
        return fail(format!(
            "{} header fields, past app_headers_max ({APP_HEADERS_MAX})",
            resp.headers.len()
        ));
    }
    for (name, value) in &resp.headers {
        // retry-after and allow: the node's own (an AppError's), kept.
        if app_response_header(name).is_none() && !matches!(*name, "retry-after" | "allow") {
            return fail(format!("header field {name:?} is not one an app may set"));
        }
        if !valid_header_value(value) {
            return fail(format!("header field {name:?} has an invalid value"));
        }
    }
    Ok(())
}

/// An app's CORS answer to one origin ([`super::App::cors`]): a page of that origin may call
/// the app's HTTP API, which the node answers preflights (`OPTIONS` with
/// `access-control-request-method`) and requests from that origin by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cors {
    /// Whether the page may send the user's cookies and read the answer
    /// (`access-control-allow-credentials: true`).
    pub credentials: bool,
    /// How long a browser may keep the preflight's answer, in seconds
    /// (`access-control-max-age`).
    pub max_age_seconds: u32,
}

/// The methods a preflight may be answered for: those an object takes.
pub const CORS_METHODS: &str = "GET, HEAD, POST, PUT, PATCH, DELETE";

/// The request header fields never handed to an app, whatever it declares: they carry the
/// client's credentials (its token in `authorization`, in the `combd_token` cookie, or in a
/// WebSocket's `combd.bearer.<jwt>` subprotocol; a proxy's own), which the node verifies
/// itself and of which an app sees only the verified client. An app holding the token could
/// act as its user on every other app of the node. A module declaring one is refused at load.
pub const APP_HEADERS_WITHHELD: &[&str] = &[
    "authorization",
    "cookie",
    "proxy-authorization",
    "sec-websocket-protocol",
];

/// Whether request header field `name` (any case) is one the node never hands an app
/// ([`APP_HEADERS_WITHHELD`]).
pub fn withheld_header(name: &str) -> bool {
    APP_HEADERS_WITHHELD
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name))
}

/// The request header fields every app may take from another origin (the token and a JSON
/// body's type), besides those it declares.
pub const CORS_HEADERS: &[&str] = &["authorization", "content-type"];

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn header_values_that_could_split_a_response_are_refused() {
        assert!(valid_header_value("sid=1; Path=/; HttpOnly; SameSite=Lax"));
        assert!(!valid_header_value("a\r\nset-cookie: evil=1"));
        assert!(!valid_header_value("a\nb"));
        assert!(!valid_header_value("a\0b"));
        assert!(!valid_header_value(" padded"));
        assert!(!valid_header_value("é"));
        assert!(!valid_header_value(
            &"x".repeat(APP_HEADER_VALUE_MAX_BYTES + 1)
        ));
        assert!(valid_header_value(&"x".repeat(APP_HEADER_VALUE_MAX_BYTES)));
    }

    #[test]
    fn content_types() {
        assert!(valid_content_type("text/html; charset=utf-8"));
        assert!(valid_content_type("image/svg+xml"));
        assert!(!valid_content_type("text"));
        assert!(!valid_content_type("text/html\r\nx: y"));
        assert!(!valid_content_type("/html"));
    }

    #[test]
    fn answers_are_checked() {
        let ok = Response::json(200, &serde_json::json!({}))
            .with_header("set-cookie", "a=b")
            .with_header("location", "/x");
        assert!(check_app_response(&ok).is_ok());
        let framing =
            Response::json(200, &serde_json::json!({})).with_header("content-length", "0");
        assert_eq!(check_app_response(&framing).unwrap_err().status, 500);
        let split =
            Response::json(200, &serde_json::json!({})).with_header("location", "/\r\nx: y");
        assert!(check_app_response(&split).is_err());
        let mut many = Response::json(200, &serde_json::json!({}));
        for _ in 0..=APP_HEADERS_MAX {
            many = many.with_header("set-cookie", "a=b");
        }
        assert!(check_app_response(&many).is_err());
        assert_eq!(app_response_header("Set-Cookie"), Some("set-cookie"));
        assert_eq!(app_response_header("transfer-encoding"), None);
    }

    #[test]
    fn the_clients_credentials_are_withheld_from_apps() {
        for h in [
            "authorization",
            "Cookie",
            "PROXY-AUTHORIZATION",
            "sec-websocket-protocol",
        ] {
            assert!(withheld_header(h), "{h}");
        }
        for h in [
            "x-request-id",
            "accept-language",
            "cookie2",
            "x-authorization",
        ] {
            assert!(!withheld_header(h), "{h}");
        }
    }
}
