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

/// The header fields a request from the fleet carries that the fleet key's signature does not
/// cover as fields: its framing (`host`, `content-length`, `connection`), and the fleet's own
/// (the signature itself, the forwarded mark, the client's address, which the MAC covers on its
/// own). Every other field (the client's token, its `Origin`, what the app declared, a
/// WebSocket's upgrade fields) is covered ([`covered`]).
pub const UNCOVERED_FIELDS: &[&str] = &[
    "host",
    "content-length",
    "connection",
    FORWARDED_HEADER,
    crate::auth::AUTH_HEADER,
    CLIENT_HEADER,
];

/// What the fleet key's MAC covers of a request's client and header fields: `client` (its
/// [`CLIENT_HEADER`] value, or empty) and, sorted, each field not in [`UNCOVERED_FIELDS`] as
/// `name: value` (the name in lower case, the value trimmed). The signer hands it what it sends, the receiver
/// what it received: a field added, changed or dropped on the way fails the MAC. With no such
/// field it is `client` itself, as before fields were covered.
pub fn covered<'a>(client: &str, fields: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> String {
    let mut lines: Vec<String> = fields
        .into_iter()
        .filter(|(name, _)| {
            !UNCOVERED_FIELDS
                .iter()
                .any(|u| name.eq_ignore_ascii_case(u))
        })
        .map(|(name, value)| {
            format!(
                "{}: {}",
                name.to_ascii_lowercase(),
                String::from_utf8_lossy(value).trim()
            )
        })
        .collect();
    if lines.is_empty() {
        return client.to_string();
    }
    lines.sort_unstable();
    format!("{client}\n{}", lines.join("\n"))
}

/// What the fleet key's MAC of an owner's answer covers of its fields: its `content-type`, and,
/// sorted, each field `keep` says the node passing it on keeps (`retry-after`, `allow`, the
/// fields an app's answer may carry), as `name: value` lines (the name in lower case, the value
/// trimmed). The owner hands it what it sends, the node passing it on what it read.
pub fn answer_fields<'a>(
    content_type: Option<&str>,
    fields: impl IntoIterator<Item = (&'a str, &'a str)>,
    keep: impl Fn(&str) -> bool,
) -> String {
    let mut lines: Vec<String> = fields
        .into_iter()
        .filter(|(name, _)| keep(name))
        .map(|(name, value)| format!("{}: {}", name.to_ascii_lowercase(), value.trim()))
        .collect();
    lines.sort_unstable();
    let content_type = content_type.map_or("", str::trim);
    format!("content-type: {content_type}\n{}", lines.join("\n"))
}

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
    /// Its [`crate::auth::ANSWER_HEADER`], if any.
    pub signature: Option<String>,
    /// What the MAC of it covers of its fields ([`answer_fields`]).
    pub signed_fields: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_mac_covers_is_every_field_but_framing_and_the_fleets_own() {
        let sent: Vec<(&str, &[u8])> = vec![
            ("Origin", b"https://a.example"),
            ("host", b"10.0.0.2:7946"),
            ("authorization", b"Bearer t"),
            (CLIENT_HEADER, b"192.0.2.7"),
            ("content-length", b"2"),
        ];
        let c = covered("192.0.2.7", sent.clone());
        assert_eq!(
            c,
            "192.0.2.7\nauthorization: Bearer t\norigin: https://a.example"
        );
        // The same fields in another order cover the same; a field more or changed does not.
        let mut reordered = sent.clone();
        reordered.reverse();
        assert_eq!(covered("192.0.2.7", reordered), c);
        let mut added = sent.clone();
        added.push(("x-role", b"admin"));
        assert_ne!(covered("192.0.2.7", added), c);
        // With none, the client alone, as the MAC was before.
        assert_eq!(covered("192.0.2.7", [("host", &b"x"[..])]), "192.0.2.7");
    }
}
