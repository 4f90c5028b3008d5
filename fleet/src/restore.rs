//! An object's database back from the bucket: the snapshot and segments the head's chain
//! names, written to a file SQLite opens as it is.
//!
//! The walk goes backward from the head (`seq`, `token`): if the snapshot the coordinator
//! records is of exactly that (`seq`, `token`), it is the start; else segment (`seq`, `token`) is read, and the walk
//! goes on from (`seq - 1`, its `prev_token`); segment 0 does not exist (an object's first
//! segment is 1 and names token 0 before it), so reaching it means starting from an empty
//! database. Then the snapshot is streamed to the file and [`segment::restore_onto`] applies the
//! chain forward on it. Every segment and snapshot
//! is read sealed ([`Bucket::get_sealed`]): what the fleet key did not seal for its key is
//! never applied.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use combd_kernel::limits::{
    FLEET_LIST_KEYS_MAX, FLEET_RESTORE_PARALLEL_GETS, FLEET_RESTORE_SEGMENTS_MAX_BYTES,
    FLEET_SEGMENT_MAX_BYTES, FLEET_SNAPSHOT_MAX_BYTES,
};

use crate::bucket::{Bucket, BucketError};
use crate::coordinator::{Head, Snapshot};
use crate::keys;
use crate::segment::{self, Segment, SegmentError};

/// Why an object could not be restored.
#[derive(Debug)]
pub enum RestoreError {
    /// The bucket failed.
    Bucket(BucketError),
    /// A segment is malformed, or the chain does not hold together.
    Segment(SegmentError),
    /// A segment the chain needs is not in the bucket.
    Missing {
        /// Its number.
        seq: u64,
        /// The token of the owner that should have written it.
        token: i64,
    },
    /// The segments since the last snapshot take more than a restore may hold.
    TooLarge {
        /// The bound ([`FLEET_RESTORE_SEGMENTS_MAX_BYTES`] in a node).
        limit: u64,
    },
    /// The database written is not a sound SQLite database (`PRAGMA quick_check`'s first
    /// complaint, or why it could not be checked).
    Corrupt(String),
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::Bucket(e) => write!(f, "{e}"),
            RestoreError::Segment(e) => write!(f, "{e}"),
            RestoreError::Missing { seq, token } => {
                write!(
                    f,
                    "segment {seq} of owner token {token} is not in the bucket"
                )
            }
            RestoreError::TooLarge { limit } => write!(
                f,
                "the segments since the last snapshot take more than {limit} bytes"
            ),
            RestoreError::Corrupt(why) => {
                write!(f, "the restored database fails its check: {why}")
            }
        }
    }
}

impl std::error::Error for RestoreError {}

impl From<BucketError> for RestoreError {
    fn from(e: BucketError) -> Self {
        RestoreError::Bucket(e)
    }
}

impl From<SegmentError> for RestoreError {
    fn from(e: SegmentError) -> Self {
        RestoreError::Segment(e)
    }
}

/// What a restore did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// The snapshot it started from, (seq, token), if any.
    pub snapshot: Option<(u64, i64)>,
    /// Segments applied after it.
    pub segments: usize,
    /// The segment number the database is at (0 for an object never shipped).
    pub seq: u64,
}

/// Writes `object`'s database as of `head` (from the coordinator; `None` for an object never
/// shipped, which restores as no file at all) to `out`, starting from `snapshot` (the one the
/// coordinator records) if the chain from the head reaches it, holding at most
/// [`FLEET_RESTORE_SEGMENTS_MAX_BYTES`] of segments.
pub fn restore_object(
    bucket: &Bucket,
    object: &str,
    head: Option<Head>,
    snapshot: Option<Snapshot>,
    out: &Path,
) -> Result<Restored, RestoreError> {
    restore_object_within(
        bucket,
        object,
        head,
        snapshot,
        out,
        FLEET_RESTORE_SEGMENTS_MAX_BYTES,
    )
}

/// The snapshots a restore may start from, by the (seq, token) they stand for: the one the
/// coordinator records, and the bucket's [`keys::legacy_snapshot`]s (written by nodes from
/// before snapshots were recorded: in a fleet being upgraded node by node, an older node's
/// snapshot may be newer than the recorded one, and its pruning may have deleted the segments
/// between them). A snapshot with a writer that the coordinator does not record (its writer was
/// fenced) is never among them. The walk back from the head starts from the first it reaches.
fn starts(
    bucket: &Bucket,
    object: &str,
    recorded: Option<Snapshot>,
) -> Result<HashMap<(u64, i64), String>, RestoreError> {
    let mut starts: HashMap<(u64, i64), String> = bucket
        .list(&keys::snapshot_prefix(object), FLEET_LIST_KEYS_MAX)?
        .into_iter()
        .filter_map(|k| match keys::parse_snapshot(&k) {
            Some((seq, token, None)) => Some(((seq, token), k)),
            _ => None,
        })
        .collect();
    if let Some(s) = recorded {
        starts.insert((s.seq, s.token), keys::snapshot(object, &s));
    }
    Ok(starts)
}

/// [`restore_object`], holding at most `held_max` bytes of segments: past it the restore fails
/// ([`RestoreError::TooLarge`]) before writing anything. (The node restores within
/// [`FLEET_RESTORE_SEGMENTS_MAX_BYTES`]; the tests cross a smaller bound.)
pub fn restore_object_within(
    bucket: &Bucket,
    object: &str,
    head: Option<Head>,
    snapshot: Option<Snapshot>,
    out: &Path,
    held_max: u64,
) -> Result<Restored, RestoreError> {
    let Some(head) = head else {
        return Ok(Restored {
            snapshot: None,
            segments: 0,
            seq: 0,
        });
    };
    let snapshots = starts(bucket, object, snapshot)?;
    let mut fetched = prefetch(bucket, object, head, &snapshots, held_max)?;
    let mut chain: Vec<Segment> = Vec::new();
    let mut held = 0u64;
    let (mut seq, mut token) = (head.seq, head.token);
    let start = loop {
        if seq == 0 {
            break None;
        }
        if snapshots.contains_key(&(seq, token)) {
            break Some((seq, token));
        }
        let key = keys::segment(object, seq, token);
        let bytes = match fetched.remove(&(seq, token)) {
            Some(bytes) => bytes,
            None => bucket
                .get_sealed(&key, FLEET_SEGMENT_MAX_BYTES as u64)?
                .ok_or(RestoreError::Missing { seq, token })?,
        };
        held += bytes.len() as u64;
        if held > held_max {
            return Err(RestoreError::TooLarge { limit: held_max });
        }
        let seg = Segment::decode(&bytes)?;
        if seg.seq != seq || seg.token != token || seg.object != object {
            return Err(SegmentError::Malformed(format!(
                "{key} holds segment {} of {:?} by token {}",
                seg.seq, seg.object, seg.token
            ))
            .into());
        }
        (seq, token) = (seq - 1, seg.prev_token);
        chain.push(seg);
    };
    chain.reverse();
    if let Some((s, t)) = start {
        // Streamed to the file, checked as it comes: never held whole.
        bucket
            .get_sealed_to_file(&snapshots[&(s, t)], out, FLEET_SNAPSHOT_MAX_BYTES)?
            .ok_or(RestoreError::Missing { seq: s, token: t })?;
    }
    let at = segment::restore_onto(out, start.is_some(), start.map_or(0, |(s, _)| s), &chain)?;
    check(out)?;
    Ok(Restored {
        snapshot: start,
        segments: chain.len(),
        seq: at,
    })
}

/// Reads, [`FLEET_RESTORE_PARALLEL_GETS`] at a time, every segment the walk back from `head`
/// may need: those listed with a number after the newest snapshot at or before the head (the
/// walk stops there at the latest), up to `held_max` bytes in all. A GET
/// costs a round trip to the bucket (~44 ms each from a Garage node here, measured), and the
/// walk learns each segment's predecessor only from the segment itself: one by one, a chain of
/// 300 took 15 s. What this does not fetch (past the byte bound, listed late) the walk reads
/// itself; orphans a stale owner left are read and not used.
fn prefetch(
    bucket: &Bucket,
    object: &str,
    head: Head,
    snapshots: &HashMap<(u64, i64), String>,
    held_max: u64,
) -> Result<HashMap<(u64, i64), Vec<u8>>, RestoreError> {
    let after = snapshots
        .keys()
        .map(|&(s, _)| s)
        .filter(|&s| s <= head.seq)
        .max()
        .unwrap_or(0);
    let mut wanted: Vec<(u64, i64)> = bucket
        .list(&keys::segment_prefix(object), FLEET_LIST_KEYS_MAX)?
        .iter()
        .filter_map(|k| keys::parse_segment(k))
        .filter(|&(s, _)| s > after && s <= head.seq)
        .collect();
    // Newest first: the walk starts at the head.
    wanted.sort_unstable_by(|a, b| b.cmp(a));
    let next = AtomicUsize::new(0);
    let held = AtomicU64::new(0);
    let found = Mutex::new(HashMap::new());
    let failed = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..FLEET_RESTORE_PARALLEL_GETS.min(wanted.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(seq, token)) = wanted.get(i) else {
                    return;
                };
                if held.load(Ordering::Relaxed) > held_max {
                    return;
                }
                let key = keys::segment(object, seq, token);
                match bucket.get_sealed(&key, FLEET_SEGMENT_MAX_BYTES as u64) {
                    Ok(Some(bytes)) => {
                        held.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                        lock(&found).insert((seq, token), bytes);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        lock(&failed).get_or_insert(e);
                        return;
                    }
                }
            });
        }
    });
    if let Some(e) = lock(&failed).take() {
        return Err(e.into());
    }
    Ok(found.into_inner().unwrap_or_else(|p| p.into_inner()))
}

/// `PRAGMA quick_check` of the database restored at `out` (the page structure, the records'
/// shape, the indexes' order: everything `integrity_check` looks at but that indexes match
/// their tables, in time linear in the file): a restore that wrote what is not a sound
/// database fails, and the object is not served from it.
fn check(out: &Path) -> Result<(), RestoreError> {
    let corrupt = |e: rusqlite::Error| RestoreError::Corrupt(e.to_string());
    // Read-write as the node opens it: a read-only open of a database in WAL mode would need
    // its -shm file to exist already.
    let db = rusqlite::Connection::open(out).map_err(corrupt)?;
    let first: String = db
        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
        .map_err(corrupt)?;
    if first == "ok" {
        Ok(())
    } else {
        Err(RestoreError::Corrupt(first))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
