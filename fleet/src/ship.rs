//! Shipping: what an owner's commit task does with each committed batch before its replies
//! leave, and with a snapshot now and then.
//!
//! [`ship_segment`] uploads the segment under its (seq, token) key, then advances the head in
//! the coordinator, fenced by the owner's token. Only when that answers [`Advance::Done`] is
//! the batch in the fleet: its replies and broadcasts may leave. [`Advance::Fenced`] means
//! another node owns the object now; the uploaded segment is an orphan no restore reads (the
//! chain goes through the head), and the batch must not be acknowledged.

use crate::bucket::{Bucket, BucketError};
use crate::coordinator::{Advance, Coordinator, CoordinatorError, Head};
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

/// Uploads `segment`, then makes it the object's head if `segment.token` still owns the
/// object.
pub fn ship_segment(
    bucket: &Bucket,
    coordinator: &Coordinator,
    segment: &Segment,
) -> Result<Advance, ShipError> {
    let key = keys::segment(&segment.object, segment.seq, segment.token);
    bucket
        .put(&key, &segment.encode())
        .map_err(ShipError::Bucket)?;
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

/// Uploads `database` (a checkpointed database file) as `object`'s snapshot as of `head`:
/// restores start from it instead of walking the segments before it, which may then be
/// deleted.
pub fn ship_snapshot(
    bucket: &Bucket,
    object: &str,
    head: Head,
    database: &[u8],
) -> Result<(), ShipError> {
    bucket
        .put(&keys::snapshot(object, head.seq, head.token), database)
        .map_err(ShipError::Bucket)
}
