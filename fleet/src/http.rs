//! The blocking HTTP client both fleet clients use: one `ureq` agent each, every option that
//! bounds something set here from the limits file rather than left to the library's defaults.

use std::time::Duration;

use crate::tls::FleetTls;
use combd_kernel::limits::{
    FLEET_CONNECT_TIMEOUT, FLEET_ERROR_BODY_MAX_BYTES, FLEET_IDLE_CONNECTIONS,
};

/// Why a call did not get an answer, or got one that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No connection to the server (refused, unreachable, reset): a node should try another
    /// endpoint or report the server down.
    Unreachable(String),
    /// The call took longer than its timeout.
    Timeout,
    /// The server answered with an error status; `body` is the start of its answer.
    Status {
        /// The HTTP status.
        code: u16,
        /// Up to [`FLEET_ERROR_BODY_MAX_BYTES`] of the answer.
        body: String,
    },
    /// The answer's body was longer than the caller accepts.
    TooLarge {
        /// The most bytes accepted.
        limit: u64,
    },
    /// The answer could not be understood (the message says why).
    BadAnswer(String),
    /// What the bucket holds under a key is not sealed with the fleet key for that key:
    /// stored by something other than this fleet's nodes, or changed since.
    NotSealed,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unreachable(m) => write!(f, "unreachable: {m}"),
            Failure::Timeout => write!(f, "timed out"),
            Failure::Status { code, body } => write!(f, "status {code}: {body}"),
            Failure::TooLarge { limit } => write!(f, "answer over its limit of {limit}"),
            Failure::BadAnswer(m) => write!(f, "bad answer: {m}"),
            Failure::NotSealed => write!(
                f,
                "not sealed with the fleet key for its key (stored by another, or changed)"
            ),
        }
    }
}

/// An agent whose every call is over within `timeout` (connect to last byte) and connected
/// within [`FLEET_CONNECT_TIMEOUT`] (or `timeout` if shorter), with no proxy (the fleet's
/// servers are on its own network), no redirects, errors statuses returned as answers (so their
/// bodies can be read), Nagle off, at most [`FLEET_IDLE_CONNECTIONS`] kept for reuse, and
/// `tls` for an `https://` endpoint.
pub(crate) fn agent(timeout: Duration, tls: &FleetTls) -> ureq::Agent {
    ureq::Agent::config_builder()
        .tls_config(tls.config.clone())
        .timeout_global(Some(timeout))
        .timeout_connect(Some(timeout.min(FLEET_CONNECT_TIMEOUT)))
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(None)
        .no_delay(true)
        .max_idle_connections(FLEET_IDLE_CONNECTIONS)
        .max_idle_connections_per_host(FLEET_IDLE_CONNECTIONS)
        .build()
        .into()
}

/// What a `ureq` error means for the caller.
pub(crate) fn failure(e: ureq::Error) -> Failure {
    match e {
        ureq::Error::Timeout(_) => Failure::Timeout,
        ureq::Error::BodyExceedsLimit(limit) => Failure::TooLarge { limit },
        ureq::Error::Io(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) =>
        {
            Failure::Timeout
        }
        e @ (ureq::Error::Io(_) | ureq::Error::ConnectionFailed | ureq::Error::HostNotFound) => {
            Failure::Unreachable(e.to_string())
        }
        e => Failure::BadAnswer(e.to_string()),
    }
}

/// Reads an answer's body, at most `limit` bytes.
pub(crate) fn body(
    resp: &mut ureq::http::Response<ureq::Body>,
    limit: u64,
) -> Result<Vec<u8>, Failure> {
    resp.body_mut()
        .with_config()
        .limit(limit)
        .read_to_vec()
        .map_err(failure)
}

/// An error status's [`Failure`], with the start of its body.
pub(crate) fn status(resp: &mut ureq::http::Response<ureq::Body>) -> Failure {
    let code = resp.status().as_u16();
    let text = resp
        .body_mut()
        .with_config()
        .limit(FLEET_ERROR_BODY_MAX_BYTES)
        .read_to_vec()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    Failure::Status { code, body: text }
}
