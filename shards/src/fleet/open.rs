//! Opening an object in a fleet, and giving back the claim of one never written: the claim,
//! then the database written from the bucket up to the head etcd records, or left as it is
//! when a clean close left it at that head.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use combd_fleet::coordinator::{Advance, Claim, Head};
use combd_fleet::restore;
use combd_kernel::limits::FLEET_SNAPSHOT_AFTER_SEGMENTS;
use combd_kernel::settings::parse_fleet_address;

use super::{at_head, sidecar, Fleet, OpenError, Shipping};

impl Fleet {
    /// Claims object `key` and, if this node owns it, writes its database at `path` from the
    /// bucket (the local files are replaced: the bucket holds every acknowledged write).
    /// Blocking.
    pub fn open(&self, key: &str, path: &Path) -> Result<Shipping, OpenError> {
        let unavailable = |e: &dyn std::fmt::Display| OpenError::Unavailable(e.to_string());
        self.regrant_if_lost();
        let lease = self.lease();
        if !self.holds_lease(lease.id) {
            return Err(OpenError::Unavailable("this node's lease is gone".into()));
        }
        let owner = match self
            .coordinator
            .claim(key, &self.node, &lease)
            .map_err(|e| unavailable(&e))?
        {
            Claim::Won(owner) => owner,
            Claim::Held(owner) => {
                self.stats.claims_lost.fetch_add(1, Ordering::Relaxed);
                // Whoever can write the coordinator names the owner: an address that is not a
                // fleet address is never dialled.
                if let Err(e) = parse_fleet_address(&owner.node, self.node_public) {
                    self.stats.owner_invalid.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(object = %key, "the owner the coordinator records is refused: {e}");
                    return Err(OpenError::Unavailable(
                        "the owner recorded for it is not a fleet address".into(),
                    ));
                }
                return Err(OpenError::Elsewhere(owner.node));
            }
        };
        self.stats.claims_won.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let (head, recorded, due) = self
            .coordinator
            .state_and_due(key)
            .map_err(|e| unavailable(&e))?;
        let wal = sidecar(path, "-wal");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| unavailable(&e))?;
        }
        if head.is_none()
            && self
                .bucket
                .any(&combd_fleet::keys::object_prefix(key))
                .map_err(|e| unavailable(&e))?
        {
            // etcd lost what it knew (a member re-initialised, the wrong endpoints): starting
            // empty would answer as if nothing was ever written, and the first snapshot would
            // prune the bucket's history of it.
            self.stats.head_missing.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                object = %key,
                "etcd records no head for it but the bucket holds its segments or snapshots: \
                 refused, not started empty (is COMBD_FLEET_ETCD the fleet's etcd?)"
            );
            return Err(OpenError::Unavailable(
                "no head in etcd for an object the bucket holds".into(),
            ));
        }
        let remove = |file: &Path| match std::fs::remove_file(file) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(unavailable(&format!("{}: {e}", file.display()))),
        };
        // The head the local file was left at by a clean close, if it was: read, and its mark
        // gone durably before anything here can change the file.
        let left_at = at_head::take(path).map_err(|e| unavailable(&e))?;
        if let Some(head) = head.filter(|h| left_at == Some(*h) && path.is_file()) {
            // Nothing moved since: the file is the head's database (what the WAL may hold
            // after it was never shipped, so never acknowledged: it goes).
            remove(&wal)?;
            remove(&sidecar(path, "-shm"))?;
            self.stats.restores_skipped.fetch_add(1, Ordering::Relaxed);
            self.stats.objects_owned.fetch_add(1, Ordering::Relaxed);
            let mut s = Shipping::from(key, wal, owner.token, lease.id, head, Some(head));
            s.due = due;
            return Ok(s);
        }
        // Written beside the database, then renamed over it: a node killed while restoring
        // leaves the old files or the new one, never a database half written (or none).
        let fresh = sidecar(path, "-restore");
        remove(&fresh)?;
        let restored = match restore::restore_object(&self.bucket, key, head, recorded, &fresh) {
            Ok(r) => r,
            Err(e) => {
                if matches!(e, restore::RestoreError::Corrupt(_)) {
                    // What the bucket holds (sealed by this fleet) does not make a sound
                    // database: refused until someone looks (nothing is served from it).
                    self.stats.restore_corrupt.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(object = %key, "{e}: refused");
                }
                let _ = std::fs::remove_file(&fresh);
                return Err(unavailable(&e));
            }
        };
        remove(&wal)?;
        remove(&sidecar(path, "-shm"))?;
        if head.is_some() {
            std::fs::rename(&fresh, path).map_err(|e| unavailable(&e))?;
        } else {
            // Never shipped: the object starts empty.
            remove(path)?;
        }
        let mut snapshot_at = restored
            .snapshot
            .map(|(seq, token)| Head { seq, token })
            .filter(|&at| Some(at) == head);
        if let Some(head) = head.filter(|_| restored.segments >= FLEET_SNAPSHOT_AFTER_SEGMENTS) {
            // A long chain: snapshot it now, so the next restore does not walk it again (an
            // owner that dies before its WAL grows or it idles would never snapshot).
            match self.ship_snapshot(key, owner.token, head, path) {
                Ok(()) => snapshot_at = Some(head),
                Err(e) => {
                    tracing::warn!(object = %key, "cannot upload a snapshot after a restore: {e}")
                }
            }
        }
        self.stats.restores.fetch_add(1, Ordering::Relaxed);
        self.stats
            .restore_max_ms
            .fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        self.stats.objects_owned.fetch_add(1, Ordering::Relaxed);
        let head = head.unwrap_or(Head {
            seq: 0,
            token: owner.token,
        });
        let mut s = Shipping::from(key, wal, owner.token, lease.id, head, snapshot_at);
        s.due = due;
        Ok(s)
    }

    /// Gives back the claim of `s`'s object if it was never written: nothing shipped (no
    /// head, nothing cut) and no database file made at `path` (its reads ran on a scratch
    /// database). Then nothing of it stays in etcd (its owner key deleted, fenced on this
    /// node's token), so a spray of names leaves nothing behind. Returns whether the object was
    /// unwritten. Blocking.
    pub fn release_if_unwritten(&self, s: &Shipping, path: &Path) -> bool {
        if s.head.seq != 0 || s.cut.seq != 0 || path.exists() {
            return false;
        }
        match self.coordinator.release(&s.key, s.token) {
            Ok(Advance::Done) => {
                self.stats.claims_released.fetch_add(1, Ordering::Relaxed);
            }
            // Another node owns it already: nothing of this node's is left.
            Ok(Advance::Fenced) => {}
            // The claim lapses with this node's lease instead.
            Err(e) => tracing::warn!(object = %s.key, "cannot give the claim back: {e}"),
        }
        true
    }
}
