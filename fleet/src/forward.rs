//! Passing an HTTP request for an object through to the node that owns it: a node asked for an
//! object another node owns sends the request on to the owner's fleet address
//! (`COMBD_FLEET_NODE`, a listener that is never refused) and answers with the owner's answer.
//! The request carries [`FORWARDED_HEADER`], and a node never forwards such a request again:
//! two nodes that each believe the other owns an object answer 503 instead of bouncing it.
//! It is signed with the fleet key ([`crate::auth`]): the owner takes it only so. The node sends
//! it over its shards' own sockets (`combd_shards::fleet::client`); this module holds what both
//! sides agree on.

/// The header a forwarded request carries.
pub const FORWARDED_HEADER: &str = "combd-forwarded";

/// The header a request passed on carries with the client's address as the node it connected
/// to saw it (the fleet key's signature covers it); the owner believes it only so, and a
/// client's own is never passed on.
pub const CLIENT_HEADER: &str = "combd-client";

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
    /// The header fields an app's answer may carry, as it sent them (checked again by the
    /// node that passes them back): at most the node's `APP_HEADERS_MAX`.
    pub headers: Vec<(String, String)>,
    /// Its body.
    pub body: Vec<u8>,
}
