//! Opening an object in a fleet ([`Opening`]), and giving back the claim of one never
//! written: the claim, then the database written from the bucket up to the head etcd records,
//! or left as it is when a clean close left it at that head.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

use combd_fleet::coordinator::{Claim, Head, Snapshot};
use combd_fleet::restore::{self, Restored};
use combd_kernel::limits::FLEET_SNAPSHOT_AFTER_SEGMENTS;
use combd_kernel::settings::parse_fleet_address;

use super::{at_head, sidecar, Fleet, OpenError, Shipping};

/// An object this node claimed and is opening: its files, and the claim.
pub(super) struct Opening<'f> {
    fleet: &'f Fleet,
    key: &'f str,
    /// The database.
    path: &'f Path,
    /// Its WAL.
    wal: PathBuf,
    /// This node's fencing token for the object.
    token: i64,
    /// The lease it was claimed under.
    lease: i64,
}

/// The coordinator or the bucket failed with `e`.
fn unavailable(e: &dyn std::fmt::Display) -> OpenError {
    OpenError::Unavailable(e.to_string())
}

/// Removes `file` if it is there.
fn remove(file: &Path) -> Result<(), OpenError> {
    match std::fs::remove_file(file) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(unavailable(&format!("{}: {e}", file.display()))),
    }
}

impl<'f> Opening<'f> {
    /// Claims object `key` (its database at `path`) under this node's lease, asking for a new
    /// lease first if it was lost. Another node's claim is [`OpenError::Elsewhere`]. Blocking.
    pub(super) fn claim(
        fleet: &'f Fleet,
        key: &'f str,
        path: &'f Path,
    ) -> Result<Opening<'f>, OpenError> {
        fleet.lease.regrant_if_lost();
        let lease = fleet.lease.lease();
        if !fleet.lease.holds_lease(lease.id) {
            return Err(OpenError::Unavailable("this node's lease is gone".into()));
        }
        let owner = match fleet
            .coordinator
            .claim(key, &fleet.node, &lease)
            .map_err(|e| unavailable(&e))?
        {
            Claim::Won(owner) => owner,
            Claim::Held(owner) => return Err(Self::held(fleet, key, owner.node)),
        };
        fleet.stats.claims_won.fetch_add(1, Ordering::Relaxed);
        Ok(Opening {
            fleet,
            key,
            path,
            wal: sidecar(path, "-wal"),
            token: owner.token,
            lease: lease.id,
        })
    }

    /// The object is held by `owner`: served there, if the coordinator names a fleet address.
    fn held(fleet: &Fleet, key: &str, owner: String) -> OpenError {
        fleet.stats.claims_lost.fetch_add(1, Ordering::Relaxed);
        // Whoever can write the coordinator names the owner: an address that is not a fleet
        // address is never dialled.
        if let Err(e) = parse_fleet_address(&owner, fleet.node_public) {
            fleet.stats.owner_invalid.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(object = %key, "the owner the coordinator records is refused: {e}");
            return OpenError::Unavailable(
                "the owner recorded for it is not a fleet address".into(),
            );
        }
        OpenError::Elsewhere(owner)
    }

    /// Writes the database from the bucket (the local files are replaced: the bucket holds
    /// every acknowledged write), or keeps the file a clean close left at the head etcd
    /// records; then what the object ships from. Blocking.
    pub(super) fn open(self) -> Result<Shipping, OpenError> {
        let started = Instant::now();
        let (head, recorded, due) = self
            .fleet
            .coordinator
            .state_and_due(self.key)
            .map_err(|e| unavailable(&e))?;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| unavailable(&e))?;
        }
        if head.is_none() {
            self.finish_forget_if_gone()?;
        }
        self.refuse_if_head_lost(head)?;
        // The head the local file was left at by a clean close, if it was: read, and its mark
        // gone durably before anything here can change the file.
        let left_at = at_head::take(self.path).map_err(|e| unavailable(&e))?;
        if let Some(head) = head.filter(|h| left_at == Some(*h) && self.path.is_file()) {
            // Nothing moved since: the file is the head's database (what the WAL may hold
            // after it was never shipped, so never acknowledged: it goes).
            remove(&self.wal)?;
            remove(&sidecar(self.path, "-shm"))?;
            self.fleet
                .stats
                .restores_skipped
                .fetch_add(1, Ordering::Relaxed);
            return Ok(self.owned(head, Some(head), due));
        }
        let restored = self.restore(head, recorded)?;
        let snapshot_at = self.snapshot_if_long(head, &restored);
        let stats = &self.fleet.stats;
        stats.restores.fetch_add(1, Ordering::Relaxed);
        stats
            .restore_max_ms
            .fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        let head = head.unwrap_or(Head {
            seq: 0,
            token: self.token,
        });
        Ok(self.owned(head, snapshot_at, due))
    }

    /// Finishes the delete of an object whose tombstone is in etcd (its owner died after
    /// forgetting it, before the bucket was cleared): cleared now, so it starts as new and
    /// nothing of it comes back.
    fn finish_forget_if_gone(&self) -> Result<(), OpenError> {
        let coordinator = &self.fleet.coordinator;
        if !coordinator.gone(self.key).map_err(|e| unavailable(&e))? {
            return Ok(());
        }
        self.fleet
            .finish_forget(self.key, self.token, false)
            .map_err(|e| unavailable(&e))?;
        let stats = &self.fleet.stats;
        stats.forgets_finished.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Refuses an object etcd records no head for while the bucket holds some of it: etcd
    /// lost what it knew (a member re-initialised, the wrong endpoints), and starting empty
    /// would answer as if nothing was ever written, and the first snapshot would prune the
    /// bucket's history of it.
    fn refuse_if_head_lost(&self, head: Option<Head>) -> Result<(), OpenError> {
        if head.is_some()
            || !self
                .fleet
                .bucket
                .any(&combd_fleet::keys::object_prefix(self.key))
                .map_err(|e| unavailable(&e))?
        {
            return Ok(());
        }
        self.fleet
            .stats
            .head_missing
            .fetch_add(1, Ordering::Relaxed);
        tracing::error!(
            object = %self.key,
            "etcd records no head for it but the bucket holds its segments or snapshots: \
             refused, not started empty (is COMBD_FLEET_ETCD the fleet's etcd?)"
        );
        Err(OpenError::Unavailable(
            "no head in etcd for an object the bucket holds".into(),
        ))
    }

    /// Writes the database at `head` from the bucket (from snapshot `recorded` if any), beside
    /// the database, then renames it over it: a node killed while restoring leaves the old
    /// files or the new one, never a database half written (or none). Never shipped, the
    /// object starts empty.
    fn restore(
        &self,
        head: Option<Head>,
        recorded: Option<Snapshot>,
    ) -> Result<Restored, OpenError> {
        let fresh = sidecar(self.path, "-restore");
        remove(&fresh)?;
        let bucket = &self.fleet.bucket;
        let restored = match restore::restore_object(bucket, self.key, head, recorded, &fresh) {
            Ok(r) => r,
            Err(e) => {
                if matches!(e, restore::RestoreError::Corrupt(_)) {
                    // What the bucket holds (sealed by this fleet) does not make a sound
                    // database: refused until someone looks (nothing is served from it).
                    self.fleet
                        .stats
                        .restore_corrupt
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::error!(object = %self.key, "{e}: refused");
                }
                let _ = std::fs::remove_file(&fresh);
                return Err(unavailable(&e));
            }
        };
        remove(&self.wal)?;
        remove(&sidecar(self.path, "-shm"))?;
        if head.is_some() {
            std::fs::rename(&fresh, self.path).map_err(|e| unavailable(&e))?;
        } else {
            remove(self.path)?;
        }
        Ok(restored)
    }

    /// The newest snapshot at `head` after `restored`: the one it started from if at the head,
    /// or one taken now after a long chain, so the next restore does not walk it again (an
    /// owner that dies before its WAL grows or it idles would never snapshot).
    fn snapshot_if_long(&self, head: Option<Head>, restored: &Restored) -> Option<Head> {
        let snapshot_at = restored
            .snapshot
            .map(|(seq, token)| Head { seq, token })
            .filter(|&at| Some(at) == head);
        let Some(head) = head.filter(|_| restored.segments >= FLEET_SNAPSHOT_AFTER_SEGMENTS) else {
            return snapshot_at;
        };
        match self
            .fleet
            .snapshots
            .ship(self.key, self.token, head, self.path)
        {
            Ok(()) => Some(head),
            Err(e) => {
                tracing::warn!(object = %self.key, "cannot upload a snapshot after a restore: {e}");
                snapshot_at
            }
        }
    }

    /// The object, owned from now on, at `head`, its newest snapshot known at `snapshot_at`,
    /// next due at `due`.
    fn owned(self, head: Head, snapshot_at: Option<Head>, due: Option<u64>) -> Shipping {
        self.fleet
            .stats
            .objects_owned
            .fetch_add(1, Ordering::Relaxed);
        let mut s = Shipping::from(
            self.key,
            self.wal,
            self.token,
            self.lease,
            head,
            snapshot_at,
        );
        s.due = due;
        s
    }
}
