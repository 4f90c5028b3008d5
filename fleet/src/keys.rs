//! Where an object's snapshots and segments live in the bucket.
//!
//! Numbers are written with 20 digits so that the bucket's listing (in byte order) is in
//! numeric order.

/// The prefix of every key of `object`.
pub fn object_prefix(object: &str) -> String {
    format!("{object}/")
}

/// The key of segment `seq` of `object` written by the owner whose token is `token`.
pub fn segment(object: &str, seq: u64, token: i64) -> String {
    format!("{object}/seg/{seq:020}-{token:020}")
}

/// The prefix of every segment key of `object`.
pub fn segment_prefix(object: &str) -> String {
    format!("{object}/seg/")
}

/// The key of `object`'s snapshot `s`: as of segment `s.seq` (written by token `s.token`),
/// taken by the owner whose token is `s.writer`, so two owners never write the same key.
pub fn snapshot(object: &str, s: &Snapshot) -> String {
    format!(
        "{object}/snap/{:020}-{:020}-{:020}",
        s.seq, s.token, s.writer
    )
}

/// The key of a snapshot as nodes before the snapshot's writer was recorded named it: as of
/// segment `seq` of token `token`, with no writer. Restores still read one when etcd records
/// no snapshot for the object.
pub fn legacy_snapshot(object: &str, seq: u64, token: i64) -> String {
    format!("{object}/snap/{seq:020}-{token:020}")
}

/// The prefix of every snapshot key of `object`.
pub fn snapshot_prefix(object: &str) -> String {
    format!("{object}/snap/")
}

fn parse(key: &str, kind: &str) -> Option<(u64, i64)> {
    let tail = key.rsplit_once(kind)?.1;
    let (seq, token) = tail.split_once('-')?;
    Some((seq.parse().ok()?, token.parse().ok()?))
}

use crate::coordinator::Snapshot;

/// The (seq, token) a segment key names, if it is one.
pub fn parse_segment(key: &str) -> Option<(u64, i64)> {
    parse(key, "/seg/")
}

/// The snapshot a key names, if it is one: its (seq, token), and its writer unless it is a
/// [`legacy_snapshot`] key.
pub fn parse_snapshot(key: &str) -> Option<(u64, i64, Option<i64>)> {
    let tail = key.rsplit_once("/snap/")?.1;
    let mut parts = tail.split('-');
    let seq = parts.next()?.parse().ok()?;
    let token = parts.next()?.parse().ok()?;
    let writer = match parts.next() {
        None => None,
        Some(w) => Some(w.parse().ok()?),
    };
    parts.next().is_none().then_some((seq, token, writer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_list_in_numeric_order_and_parse_back() {
        let a = segment("room", 9, 5);
        let b = segment("room", 10, 3);
        assert!(a < b, "{a} sorts before {b}");
        assert_eq!(parse_segment(&b), Some((10, 3)));
        assert!(a.starts_with(&segment_prefix("room")));
        let s = Snapshot {
            seq: 42,
            token: 7,
            writer: 9,
        };
        assert_eq!(
            parse_snapshot(&snapshot("room", &s)),
            Some((42, 7, Some(9)))
        );
        assert_eq!(
            parse_snapshot(&legacy_snapshot("room", 42, 7)),
            Some((42, 7, None))
        );
        assert_eq!(parse_segment(&snapshot("room", &s)), None);
        assert_eq!(parse_snapshot("room/snap/x-1"), None);
        assert_eq!(parse_snapshot("room/snap/1-2-3-4"), None);
        assert!(snapshot("room", &s).starts_with(&snapshot_prefix("room")));
        assert!(snapshot("room", &s).starts_with(&object_prefix("room")));
    }
}
