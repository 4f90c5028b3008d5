//! Passing an HTTP request for an object through to the node that owns it: a node asked for an
//! object another node owns sends the request on to the owner's fleet address
//! (`COMBD_FLEET_NODE`, a listener that is never refused) and answers with the owner's answer.
//! The request carries [`FORWARDED_HEADER`], and a node never forwards such a request again:
//! two nodes that each believe the other owns an object answer 503 instead of bouncing it.
//! It is signed with the fleet key ([`crate::auth`]): the owner takes it only so.

use std::sync::Arc;

use combd_kernel::limits::FLEET_FORWARD_TIMEOUT;

use crate::auth::{FleetKey, AUTH_HEADER};

use crate::tls::FleetTls;
use crate::http::{self, Failure};

/// The header a forwarded request carries.
pub const FORWARDED_HEADER: &str = "combd-forwarded";

/// The owner's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwarded {
    /// Its status.
    pub status: u16,
    /// Its `content-type`, if any.
    pub content_type: Option<String>,
    /// Its `retry-after`, if any.
    pub retry_after: Option<String>,
    /// Its `allow`, if any (a 405).
    pub allow: Option<String>,
    /// Its body.
    pub body: Vec<u8>,
}

/// Sends requests on to owners; one per node (its connections are reused).
#[derive(Debug)]
pub struct Forwarder {
    agent: ureq::Agent,
    key: Arc<FleetKey>,
}

impl Forwarder {
    /// A forwarder signing with `key`, whose every call is over within
    /// [`FLEET_FORWARD_TIMEOUT`].
    pub fn new(key: Arc<FleetKey>) -> Forwarder {
        Forwarder {
            agent: http::agent(FLEET_FORWARD_TIMEOUT, &FleetTls::default()),
            key,
        }
    }

    /// Sends `method target` with `body` to the node at `owner` (`ip:port`); its answer, with
    /// at most `max_body` bytes of body.
    pub fn forward(
        &self,
        owner: &str,
        method: &str,
        target: &str,
        body: &[u8],
        max_body: u64,
    ) -> Result<Forwarded, Failure> {
        let request = ureq::http::Request::builder()
            .method(method)
            .uri(format!("http://{owner}{target}"))
            .header(FORWARDED_HEADER, "1")
            .header(AUTH_HEADER, self.key.sign(owner, method, target, body))
            .body(body.to_vec())
            .map_err(|e| Failure::BadAnswer(format!("request: {e}")))?;
        let mut resp = self.agent.run(request).map_err(http::failure)?;
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (content_type, retry_after, allow) = (
            header("content-type"),
            header("retry-after"),
            header("allow"),
        );
        let status = resp.status().as_u16();
        let body = http::body(&mut resp, max_body)?;
        Ok(Forwarded {
            status,
            content_type,
            retry_after,
            allow,
            body,
        })
    }
}
