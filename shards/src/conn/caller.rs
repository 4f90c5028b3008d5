//! What an app is told of a request beyond its method, query and body ([`Caller`]: the client's
//! address, its `Origin`, the path under the object, the header fields the app declared), and
//! the app's CORS policy applied: preflights answered, and answers to another origin's page
//! marked as readable by it.

use std::net::IpAddr;
use std::sync::Arc;

use combd_fleet::forward::CLIENT_HEADER;
use combd_kernel::limits::{APP_HEADERS_MAX, APP_HEADERS_MAX_BYTES, APP_HEADER_VALUE_MAX_BYTES};

use crate::app::{
    valid_header_value, withheld_header, App, Caller, Cors, CORS_HEADERS, CORS_METHODS,
};
use crate::http::{Request, Response};

use crate::tls::Stream;

/// An answer to a page of another origin that the app's CORS policy lets read it.
pub(super) struct AllowOrigin {
    origin: String,
    credentials: bool,
}

impl AllowOrigin {
    /// `resp` with the fields that let the page read it (and `vary: origin`: another origin's
    /// request gets another answer, which a cache must not mix up).
    pub fn apply(&self, resp: &mut Response) {
        resp.headers
            .push(("access-control-allow-origin", self.origin.clone()));
        if self.credentials {
            resp.headers
                .push(("access-control-allow-credentials", "true".into()));
        }
        resp.headers.push(("vary", "origin".into()));
    }
}

/// The request's `Origin`, normalised, if it sent one other than `null`.
fn origin_of(req: &Request<'_>) -> Option<String> {
    let origin = std::str::from_utf8(req.header("origin")?).ok()?;
    combd_kernel::origins::normalize(origin)
}

/// What makes the app's answer readable by the request's page, if it came from an origin
/// the app's CORS policy takes.
pub(super) fn allow_origin(req: &Request<'_>, app: &dyn App) -> Option<AllowOrigin> {
    cors_of(req, app).map(|(origin, cors)| AllowOrigin {
        origin,
        credentials: cors.credentials,
    })
}

/// The app's CORS answer to the request's `Origin`, if it sent one the app's policy takes.
pub(super) fn cors_of(req: &Request<'_>, app: &dyn App) -> Option<(String, Cors)> {
    let origin = origin_of(req)?;
    let cors = app.cors(&origin)?;
    Some((origin, cors))
}

/// Whether `req` is a CORS preflight (RFC 9110's `OPTIONS` a browser sends before a
/// cross-origin request it may not send as is: with `Origin` and
/// `access-control-request-method`).
pub(super) fn is_preflight(req: &Request<'_>) -> bool {
    req.method == "OPTIONS"
        && req.header("origin").is_some()
        && req.header("access-control-request-method").is_some()
}

/// The node's answer to a preflight for `app`, by its CORS policy (Fetch, "CORS protocol"):
/// 204 with the methods an object takes, the request header fields the app takes from
/// another origin (the token, a body's type, those it declares) and how long to keep it; or
/// 403 `origin not allowed`. A preflight carries no credentials, so it is answered before the
/// app's identity check.
pub(super) fn preflight(req: &Request<'_>, app: &dyn App) -> Response {
    let Some((origin, cors)) = cors_of(req, app) else {
        return Response::error(403, "origin not allowed");
    };
    let method = req
        .header("access-control-request-method")
        .and_then(|m| std::str::from_utf8(m).ok())
        .unwrap_or("");
    if !CORS_METHODS.split(", ").any(|m| m == method) {
        return Response::error(405, "method not allowed").with_header("allow", CORS_METHODS);
    }
    // The fields asked for that the app takes; a browser refuses the request if one it needs
    // is missing here.
    let asked = req
        .header("access-control-request-headers")
        .and_then(|h| std::str::from_utf8(h).ok())
        .unwrap_or("");
    let allowed: Vec<&str> = asked
        .split(',')
        .map(str::trim)
        .filter(|h| {
            !h.is_empty()
                && (CORS_HEADERS.iter().any(|c| c.eq_ignore_ascii_case(h)) || app.wants_header(h))
        })
        .take(APP_HEADERS_MAX + CORS_HEADERS.len())
        .collect();
    let mut resp = Response::bytes(204, "application/json", Vec::new())
        .with_header("access-control-allow-methods", CORS_METHODS)
        .with_header("access-control-max-age", cors.max_age_seconds.to_string());
    if !allowed.is_empty() {
        resp = resp.with_header("access-control-allow-headers", allowed.join(", "));
    }
    AllowOrigin {
        origin,
        credentials: cors.credentials,
    }
    .apply(&mut resp);
    resp
}

/// What `app` is told of `req`, which came on `stream`: `rest` is the path under the object.
/// `from_fleet`: another node passed it on (signed), so the client's address is the one it
/// vouches for.
pub(super) fn of(
    req: &Request<'_>,
    app: &dyn App,
    from_fleet: bool,
    rest: Option<&str>,
    stream: &Stream,
) -> Arc<Caller> {
    let text = |v: &[u8]| {
        std::str::from_utf8(v)
            .ok()
            .filter(|v| valid_header_value(v))
            .map(str::to_string)
    };
    let addr = addr_of(req, from_fleet, stream);
    let mut headers = Vec::new();
    let mut bytes = 0;
    for h in req.headers.iter() {
        if headers.len() == APP_HEADERS_MAX {
            break;
        }
        // The fleet's own fields never reach an app, nor the client's credentials.
        if withheld_header(h.name)
            || h.name
                .get(..6)
                .is_some_and(|p| p.eq_ignore_ascii_case("combd-"))
        {
            continue;
        }
        if h.value.len() <= APP_HEADER_VALUE_MAX_BYTES && app.wants_header(h.name) {
            if let Some(v) = text(h.value) {
                if bytes + h.name.len() + v.len() > APP_HEADERS_MAX_BYTES {
                    continue;
                }
                bytes += h.name.len() + v.len();
                headers.push((h.name.to_ascii_lowercase(), v));
            }
        }
    }
    Arc::new(Caller {
        addr,
        origin: req.header("origin").and_then(text),
        rest: rest.map(str::to_string),
        headers,
    })
}

/// What every subscription of a multiplexed WebSocket (`/ws`, for any app) is told of its
/// upgrade `req`, which came on `stream`: the client's address and `Origin`, no path under an
/// object, no header fields (no one app declared them).
pub(super) fn of_socket(req: &Request<'_>, from_fleet: bool, stream: &Stream) -> Arc<Caller> {
    Arc::new(Caller {
        addr: addr_of(req, from_fleet, stream),
        origin: req
            .header("origin")
            .and_then(|v| std::str::from_utf8(v).ok())
            .filter(|v| valid_header_value(v))
            .map(str::to_string),
        rest: None,
        headers: Vec::new(),
    })
}

/// The client's address: the peer of `stream`, or for a request another node of the fleet
/// passed on (`from_fleet`), the address it vouches for.
fn addr_of(req: &Request<'_>, from_fleet: bool, stream: &Stream) -> Option<IpAddr> {
    if from_fleet {
        req.header(CLIENT_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse::<IpAddr>().ok())
    } else {
        peer_ip(stream)
    }
}

/// The address of the peer of `stream` (for a client behind the node's own TLS, the
/// client's), as an IPv4 address when it is one mapped into IPv6.
pub(super) fn peer_ip(stream: &Stream) -> Option<IpAddr> {
    let ip = stream.tcp().peer_addr().ok()?.ip();
    Some(match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    })
}
