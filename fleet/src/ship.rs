//! Shipping: what an owner's commit task does with each committed batch before its replies
//! leave, and with a snapshot now and then.
//!
//! [`ship_segment`] uploads the segment under its (seq, token) key, then advances the head in
//! the coordinator, fenced by the owner's token. Only when that answers [`Advance::Done`] is
//! the batch in the fleet: its replies and broadcasts may leave. [`Advance::Fenced`] means
//! another node owns the object now; the uploaded segment is an orphan no restore reads (the
//! chain goes through the head), and the batch must not be acknowledged.

use std::path::Path;

use combd_kernel::limits::{FLEET_LIST_KEYS_MAX, FLEET_SNAPSHOT_MAX_BYTES};

use crate::bucket::{Bucket, BucketError};
use crate::coordinator::{Advance, Coordinator, CoordinatorError, Head, Snapshot};
use crate::keys;
use crate::segment::Segment;

/// Why a segment or snapshot could not be shipped (the batch must not be acknowledged).
#[derive(Debug)]
pub enum ShipError {
    /// The upload failed.
    Bucket(BucketError),
    /// The head advance could not be made (the coordinator unreachable, slow or failing).
    Coordinator(CoordinatorError),
}

impl std::fmt::Display for ShipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShipError::Bucket(e) => write!(f, "{e}"),
            ShipError::Coordinator(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ShipError {}

/// Uploads `segment` under its (seq, token) key, sealed. It is not part of the object until a head
/// advance names it (or a later segment of its chain).
pub fn upload_segment(bucket: &Bucket, segment: &Segment) -> Result<(), ShipError> {
    let key = keys::segment(&segment.object, segment.seq, segment.token);
    bucket
        .put_sealed(&key, segment.encode())
        .map_err(ShipError::Bucket)
}

/// Uploads `segment`, then makes it the object's head if `segment.token` still owns the
/// object.
pub fn ship_segment(
    bucket: &Bucket,
    coordinator: &Coordinator,
    segment: &Segment,
) -> Result<Advance, ShipError> {
    upload_segment(bucket, segment)?;
    coordinator
        .advance_head(
            &segment.object,
            segment.token,
            Head {
                seq: segment.seq,
                token: segment.token,
            },
        )
        .map_err(ShipError::Coordinator)
}

/// Uploads the checkpointed database file at `database` (streamed, at most
/// [`FLEET_SNAPSHOT_MAX_BYTES`]: a larger one could never be restored) as `object`'s snapshot
/// `snapshot`, sealed, then records it in the coordinator if its writer still owns the object:
/// restores start from it instead of walking the segments before it, which may then be deleted
/// ([`prune`], only after [`Advance::Done`]). Fenced, the upload is an orphan no restore reads.
pub fn ship_snapshot(
    bucket: &Bucket,
    coordinator: &Coordinator,
    object: &str,
    snapshot: Snapshot,
    database: &Path,
) -> Result<Advance, ShipError> {
    bucket
        .put_sealed_file(
            &keys::snapshot(object, &snapshot),
            database,
            FLEET_SNAPSHOT_MAX_BYTES,
        )
        .map_err(ShipError::Bucket)?;
    coordinator
        .record_snapshot(object, snapshot)
        .map_err(ShipError::Coordinator)
}

/// Deletes what no restore reads once `object`'s snapshot `kept` is recorded: every segment
/// numbered at or before it, and every other snapshot at or before it. Returns how many keys
/// it deleted. (A restore that read the state before `kept` was recorded may then miss a
/// segment it wanted: it fails, and the next request restores from `kept`.)
pub fn prune(bucket: &Bucket, object: &str, kept: Snapshot) -> Result<usize, ShipError> {
    let keep = keys::snapshot(object, &kept);
    let mut old: Vec<String> = bucket
        .list(&keys::segment_prefix(object), FLEET_LIST_KEYS_MAX)
        .map_err(ShipError::Bucket)?
        .into_iter()
        .filter(|k| keys::parse_segment(k).is_some_and(|(seq, _)| seq <= kept.seq))
        .collect();
    old.extend(
        bucket
            .list(&keys::snapshot_prefix(object), FLEET_LIST_KEYS_MAX)
            .map_err(ShipError::Bucket)?
            .into_iter()
            .filter(|k| {
                *k != keep && keys::parse_snapshot(k).is_some_and(|(seq, _, _)| seq <= kept.seq)
            }),
    );
    bucket.delete_many(&old).map_err(ShipError::Bucket)?;
    Ok(old.len())
}

/// Deletes every segment and snapshot of `object` from the bucket (a deleted object's, after
/// its tombstone is written: `Coordinator::forget`), a page at a time. Returns how many keys it
/// deleted.
pub fn clear(bucket: &Bucket, object: &str) -> Result<usize, ShipError> {
    let prefix = keys::object_prefix(object);
    let mut deleted = 0;
    loop {
        let mut page = Vec::new();
        bucket
            .for_each_key(&prefix, |k| {
                page.push(k);
                page.len() < FLEET_LIST_KEYS_MAX
            })
            .map_err(ShipError::Bucket)?;
        if page.is_empty() {
            return Ok(deleted);
        }
        bucket.delete_many(&page).map_err(ShipError::Bucket)?;
        deleted += page.len();
    }
}
