//! Snapshots: the database uploaded at the head, so a restore reads one file and the segments
//! after it; skipped when the bucket has one at the head already; and the mark a clean close
//! leaves (`at_head`).

use std::path::Path;
use std::sync::atomic::Ordering;

use combd_fleet::coordinator::Head;
use combd_fleet::segment::WalCursor;
use combd_fleet::ship;

use super::upload::Upload;
use super::{at_head, Fleet, Shipping};

impl Fleet {
    /// Checkpoints the database (everything committed must be shipped already) and uploads it
    /// as the snapshot at the head, so a restore starts from it. Blocking.
    pub fn snapshot(
        &self,
        s: &mut Shipping,
        db: &rusqlite::Connection,
        path: &Path,
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
        if !self.holds_lease(s.lease) {
            return Err("this node's lease is gone".into());
        }
        db.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .map_err(|e| format!("checkpoint: {e}"))?;
        // The WAL starts over: the cursor starts over with it.
        s.cursor = WalCursor::new();
        if s.snapshot_at == Some(s.head) {
            // Nothing shipped since the snapshot the bucket has: the same bytes again.
            self.stats.snapshots_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let bytes = read_snapshot(path)?;
        ship::ship_snapshot(&self.bucket, &s.key, s.head, bytes).map_err(|e| e.to_string())?;
        s.snapshot_at = Some(s.head);
        self.stats.snapshots.fetch_add(1, Ordering::Relaxed);
        self.prune(&s.key, s.head);
        Ok(())
    }

    /// After a clean close (everything committed shipped, snapshotted at the head, the
    /// database closed): marks the local file as the head's database, so the next open here
    /// at the same head restores nothing. Blocking; a mark that cannot be written only costs
    /// that open a restore.
    pub fn left_at_head(&self, s: &Shipping, path: &Path) {
        if s.head.seq == 0 || s.snapshot_at != Some(s.head) {
            return;
        }
        if let Err(e) = at_head::mark(path, s.head) {
            tracing::warn!(object = %s.key, "cannot mark the closed database at its head: {e}");
        }
    }

    /// Has the upload threads delete what `object`'s snapshot at `head` replaced.
    pub(super) fn prune(&self, object: &str, head: Head) {
        let _ = self.uploads.try_send(Upload::Prune {
            object: object.to_string(),
            head,
        });
    }
}

/// The database at `path`, to upload as a snapshot: at most `fleet_snapshot_max_bytes` (a
/// larger one could never be restored, so it is not uploaded, and nothing is pruned for it).
pub(super) fn read_snapshot(path: &Path) -> Result<Vec<u8>, String> {
    let limit = combd_kernel::limits::FLEET_SNAPSHOT_MAX_BYTES;
    let len = std::fs::metadata(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .len();
    if len > limit {
        return Err(format!(
            "{}: {len} bytes, past the {limit} a restore reads: not uploaded",
            path.display()
        ));
    }
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}
