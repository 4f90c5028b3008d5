//! Snapshots ([`Snapshots`]): the database uploaded at the head, so a restore reads one file and the segments
//! after it; skipped when the bucket has one at the head already; and the mark a clean close
//! leaves (`at_head`).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use combd_fleet::bucket::Bucket;
use combd_fleet::coordinator::{Advance, Coordinator, Head, Snapshot};
use combd_fleet::segment::WalCursor;
use combd_fleet::ship;

use super::lease::NodeLease;
use super::upload::Upload;
use super::{at_head, FleetStats, Shipping};

/// What taking a snapshot needs: the bucket it goes to, the coordinator it is recorded in,
/// the upload threads that prune what it replaced, and the counters.
pub(super) struct Snapshots {
    bucket: Bucket,
    coordinator: Arc<Coordinator>,
    uploads: async_channel::Sender<Upload>,
    stats: Arc<FleetStats>,
}

impl Snapshots {
    /// Snapshots to `bucket`, recorded in `coordinator`, pruned by the upload threads.
    pub(super) fn new(
        bucket: Bucket,
        coordinator: Arc<Coordinator>,
        uploads: async_channel::Sender<Upload>,
        stats: Arc<FleetStats>,
    ) -> Snapshots {
        Snapshots {
            bucket,
            coordinator,
            uploads,
            stats,
        }
    }

    /// Checkpoints the database (everything committed must be shipped already) and uploads it
    /// as the snapshot at the head, so a restore starts from it, while `lease` holds the one
    /// the object was claimed under. Blocking.
    pub(super) fn take(
        &self,
        s: &mut Shipping,
        db: &rusqlite::Connection,
        path: &Path,
        lease: &NodeLease,
    ) -> Result<(), String> {
        if s.head.seq == 0 {
            return Ok(());
        }
        // Only shipped state: every segment cut from the WAL is the head or before it (one
        // cut and never advanced holds writes that were refused), and the lease still holds
        // (past it another node may own the object).
        if s.cut != s.head {
            return Err(format!(
                "segment {} was cut but the head is {}: not everything committed was shipped",
                s.cut.seq, s.head.seq
            ));
        }
        if !lease.holds_lease(s.lease) {
            return Err("this node's lease is gone".into());
        }
        // A reader (the operator's read-only query, `crate::inspect`) may hold the WAL: then the
        // checkpoint does not complete, and the file is not the head's.
        let busy: i64 = db
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .map_err(|e| format!("checkpoint: {e}"))?;
        if busy != 0 {
            return Err("checkpoint: a reader holds the WAL; tried again later".into());
        }
        // The WAL starts over: the cursor starts over with it.
        s.cursor = WalCursor::new();
        if s.snapshot_at == Some(s.head) {
            // Nothing shipped since the snapshot the bucket has: the same bytes again.
            self.stats.snapshots_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.ship(&s.key, s.token, s.head, path)?;
        s.snapshot_at = Some(s.head);
        Ok(())
    }

    /// Uploads the database at `path` (checkpointed) as `object`'s snapshot at `head`, taken by
    /// the owner with token `writer`, and records it in etcd if `writer` still owns the object
    /// (then deletes what it replaced). Blocking.
    pub(super) fn ship(
        &self,
        object: &str,
        writer: i64,
        head: Head,
        path: &Path,
    ) -> Result<(), String> {
        let kept = Snapshot {
            seq: head.seq,
            token: head.token,
            writer,
        };
        match ship::ship_snapshot(&self.bucket, &self.coordinator, object, kept, path) {
            Ok(Advance::Done) => {
                self.stats.snapshots.fetch_add(1, Ordering::Relaxed);
                self.prune(object, kept);
                Ok(())
            }
            Ok(Advance::Fenced) => {
                Err("another node owns it now: the snapshot is not recorded".into())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// After a clean close (everything committed shipped, snapshotted at the head, the
    /// database closed): marks the local file as the head's database, so the next open here
    /// at the same head restores nothing. Blocking; a mark that cannot be written only costs
    /// that open a restore.
    pub(super) fn left_at_head(&self, s: &Shipping, path: &Path) {
        if s.head.seq == 0 || s.snapshot_at != Some(s.head) {
            return;
        }
        if let Err(e) = at_head::mark(path, s.head) {
            tracing::warn!(object = %s.key, "cannot mark the closed database at its head: {e}");
        }
    }

    /// Has the upload threads delete what `object`'s snapshot `kept` replaced.
    fn prune(&self, object: &str, kept: Snapshot) {
        let _ = self.uploads.try_send(Upload::Prune {
            object: object.to_string(),
            kept,
        });
    }
}
