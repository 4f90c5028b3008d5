//! The fleet's id, kept in etcd and in the bucket, checked at every start: a node pointed at
//! an etcd that lost its keys (a member re-initialised, the wrong endpoints) while the bucket
//! holds a fleet's objects would otherwise find no head for any object and start each empty.
//!
//! - Neither holds an id: a new fleet. One is made (random), recorded in etcd unless another
//!   node recorded one first (a transaction), and stored sealed in the bucket.
//! - etcd holds one and the bucket none: the first node's start was cut before it stored it,
//!   or the bucket is new; it is stored (every head etcd has still names segments, and a
//!   restore that misses one fails, so nothing starts empty).
//! - The bucket holds one and etcd none, or the two differ: start-up fails, naming
//!   `COMBD_FLEET_ETCD`.
//! - The bucket's is not sealed with this fleet key: start-up fails, naming
//!   `COMBD_FLEET_KEY_FILE`.

use combd_fleet::bucket::Bucket;
use combd_fleet::coordinator::Coordinator;
use combd_fleet::Failure;

/// The fleet id's key in the bucket (object keys all hold a `/`).
const BUCKET_KEY: &str = "fleet-id";
/// Most bytes of a fleet id read from the bucket.
const ID_MAX_BYTES: u64 = 64;

/// Checks (or, for a new fleet, records) the fleet's id; the id, or the setting to look at
/// and why.
pub(super) fn check(
    coordinator: &Coordinator,
    bucket: &Bucket,
) -> Result<String, (&'static str, String)> {
    let in_etcd = coordinator.fleet_id().map_err(|e| {
        (
            "COMBD_FLEET_ETCD",
            format!("cannot read the fleet's id: {e}"),
        )
    })?;
    let in_bucket =
        match bucket.get_sealed(BUCKET_KEY, ID_MAX_BYTES) {
            Ok(id) => id.map(|b| String::from_utf8_lossy(&b).into_owned()),
            Err(e) if e.failure == Failure::NotSealed => return Err((
                "COMBD_FLEET_KEY_FILE",
                "the bucket's fleet id is not sealed with this fleet key: the bucket is another \
                 fleet's, or this key is not the fleet's"
                    .into(),
            )),
            Err(e) => {
                return Err((
                    "COMBD_FLEET_BUCKET_URL",
                    format!("cannot read the fleet's id: {e}"),
                ))
            }
        };
    let store = |id: String| {
        bucket
            .put_sealed(BUCKET_KEY, id.clone().into_bytes())
            .map(|()| id)
            .map_err(|e| {
                (
                    "COMBD_FLEET_BUCKET_URL",
                    format!("cannot store the fleet's id: {e}"),
                )
            })
    };
    match (in_etcd, in_bucket) {
        (Some(a), Some(b)) if a == b => Ok(a),
        (Some(a), Some(b)) => Err((
            "COMBD_FLEET_ETCD",
            format!("etcd is fleet {a}'s and the bucket fleet {b}'s: they are not one fleet's"),
        )),
        (None, Some(b)) => Err((
            "COMBD_FLEET_ETCD",
            format!(
                "etcd records no fleet, but the bucket is fleet {b}'s: etcd lost its keys (a \
                 member re-initialised?) or is not this fleet's; starting would answer its \
                 objects as empty"
            ),
        )),
        (Some(a), None) => {
            tracing::warn!("the bucket held no fleet id: storing etcd's ({a})");
            store(a)
        }
        (None, None) => {
            let id = combd_fleet::auth::random_id().map_err(|e| ("COMBD_FLEET_ETCD", e))?;
            let id = coordinator.create_fleet_id(&id).map_err(|e| {
                (
                    "COMBD_FLEET_ETCD",
                    format!("cannot record the fleet's id: {e}"),
                )
            })?;
            store(id)
        }
    }
}
