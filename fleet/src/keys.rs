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

/// The key of `object`'s snapshot as of segment `seq`, written by the owner whose token is
/// `token` (that of segment `seq`'s writer: the snapshot stands for the same state).
pub fn snapshot(object: &str, seq: u64, token: i64) -> String {
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

/// The (seq, token) a segment key names, if it is one.
pub fn parse_segment(key: &str) -> Option<(u64, i64)> {
    parse(key, "/seg/")
}

/// The (seq, token) a snapshot key names, if it is one.
pub fn parse_snapshot(key: &str) -> Option<(u64, i64)> {
    parse(key, "/snap/")
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
        assert_eq!(parse_snapshot(&snapshot("room", 42, 7)), Some((42, 7)));
        assert_eq!(parse_segment(&snapshot("room", 42, 7)), None);
        assert_eq!(parse_snapshot("room/snap/x-1"), None);
        assert!(snapshot("room", 1, 1).starts_with(&object_prefix("room")));
    }
}
