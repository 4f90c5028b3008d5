//! How an object keeps what it commits, decided once when its task starts: on this node alone
//! ([`Durability::Local`]) or shipped to the fleet ([`Durability::Fleet`]). The object's life
//! (`object::run`) asks it at each fork instead of asking whether there is a fleet:
//!
//! | fork | `Local` | `Fleet` |
//! |---|---|---|
//! | restore | the database opened (a scratch one if it has none) | claimed in etcd, then written from the bucket unless the file is at the head already |
//! | after each commit | nothing more | the WAL's length read: what the next shipment reads up to |
//! | a failed sync (or shipment) | the database reloaded here; the object goes on | the object let go: the next mail claims and restores it, or finds its new owner |
//! | let go | out of the map at once (unless its version was replaced) | a fresh cell of it waits until this one has closed |
//! | the WAL past [`FLEET_CHECKPOINT_WAL_BYTES`] | nothing (SQLite checkpoints itself) | once everything committed is shipped: a checkpoint and a snapshot |
//! | close | the connection dropped | the claim given back if never written; else a snapshot unless a shipment failed, and the file marked at its head |
//! | idle | [`OBJECT_IDLE`] | at least `COMBD_FLEET_OBJECT_IDLE` (a reopen costs a claim, a close a snapshot) |
//!
//! The commit task (`cells::commit`) makes the matching forks between a commit and its answers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use combd_kernel::limits::FLEET_CHECKPOINT_WAL_BYTES;
#[cfg(doc)]
use combd_kernel::limits::OBJECT_IDLE;
use tracing::warn;

use crate::fleet::{Fleet, Shipping};
use crate::state::ShardState;

use super::super::commit::Pipeline;
use super::super::store::Store;
use super::ObjectCell;

/// Where an object's commits are kept.
pub(super) enum Durability {
    /// On this node alone: its WAL, synced as `COMBD_SQLITE_SYNC` says.
    Local,
    /// In a fleet: every batch shipped to the bucket and made the head before it is answered.
    Fleet {
        fleet: Arc<Fleet>,
        /// The object's WAL, read after each commit.
        wal: PathBuf,
        /// `COMBD_FLEET_OBJECT_IDLE`.
        idle: Duration,
    },
}

impl Durability {
    /// What the node's settings make of `cell`.
    pub fn of(state: &ShardState, cell: &ObjectCell) -> Durability {
        match (&state.node().fleet, &state.settings().fleet) {
            (Some(fleet), Some(settings)) => Durability::Fleet {
                fleet: fleet.clone(),
                wal: crate::fleet::sidecar(&cell.store_config(state).0, "-wal"),
                idle: settings.object_idle,
            },
            _ => Durability::Local,
        }
    }

    /// The fleet, in a fleet (the object is claimed and restored through it).
    pub fn fleet(&self) -> Option<Arc<Fleet>> {
        match self {
            Durability::Local => None,
            Durability::Fleet { fleet, .. } => Some(fleet.clone()),
        }
    }

    /// The WAL whose length is read after each commit (in a fleet).
    pub fn wal(&self) -> Option<PathBuf> {
        match self {
            Durability::Local => None,
            Durability::Fleet { wal, .. } => Some(wal.clone()),
        }
    }

    /// Whether a failed sync or shipment lets the object go (in a fleet: its database may hold
    /// writes answered 503, and the bucket has everything acknowledged) rather than reloading
    /// its database here.
    pub fn lets_go_on_failure(&self) -> bool {
        matches!(self, Durability::Fleet { .. })
    }

    /// Whether a fresh cell of a let-go object waits until this one has closed: in a fleet
    /// (its restore replaces the database files, and its shipments would number segments from
    /// a head this one has not finished advancing), or when its module version was replaced.
    pub fn closes_before_reopen(&self, retired: bool) -> bool {
        retired || matches!(self, Durability::Fleet { .. })
    }

    /// Whether a WAL of `wal_len` bytes calls for a checkpoint and a snapshot (in a fleet, past
    /// [`FLEET_CHECKPOINT_WAL_BYTES`]: SQLite's own checkpoints are off there).
    pub fn wants_checkpoint(&self, wal_len: u64) -> bool {
        matches!(self, Durability::Fleet { .. }) && wal_len >= FLEET_CHECKPOINT_WAL_BYTES
    }

    /// How long the object waits for mail before it is let go, `base` on a node alone.
    pub fn idle(&self, base: Duration) -> Duration {
        match self {
            Durability::Local => base,
            Durability::Fleet { idle, .. } => base.max(*idle),
        }
    }

    /// Closes a let-go object's database on a blocking thread; in a fleet, first checkpoints
    /// it and uploads it as its snapshot (unless its shipments `failed`, or the bucket has a
    /// snapshot at its head already), marks the closed file as the head's, and stops counting
    /// it owned.
    pub async fn close(
        &self,
        state: &ShardState,
        cell: &ObjectCell,
        db: Option<rusqlite::Connection>,
        shipping: Option<Shipping>,
        failed: bool,
    ) {
        let (Durability::Fleet { fleet, .. }, Some(mut shipping)) = (self, shipping) else {
            drop(db);
            return;
        };
        let fleet = fleet.clone();
        let (path, _) = cell.store_config(state);
        let key = cell.key.clone();
        state
            .on_thread(cell.opened_by(), move || {
                if fleet.release_if_unwritten(&shipping, &path) {
                    // Never written (its reads ran on a scratch database): nothing to snapshot,
                    // and its claim is given back.
                    drop(db);
                    fleet.closed();
                    return;
                }
                let mut clean = false;
                if let (Some(conn), false) = (&db, failed) {
                    match fleet.snapshot(&mut shipping, conn, &path) {
                        Ok(()) => clean = true,
                        Err(e) => warn!(object = %key, "cannot upload a snapshot: {e}"),
                    }
                }
                drop(db);
                if clean {
                    fleet.left_at_head(&shipping, &path);
                }
                fleet.closed();
            })
            .await;
    }

    /// In a fleet, once [`Durability::wants_checkpoint`]: waits until everything committed is
    /// shipped, then checkpoints and uploads a snapshot (SQLite's own checkpoints are off, so
    /// the WAL is never rewritten under an unshipped frame).
    pub async fn checkpoint(
        &self,
        state: &ShardState,
        cell: &ObjectCell,
        pipeline: &Pipeline,
        store: Store,
    ) -> Store {
        match store {
            Store::Present(conn) => {
                Store::Present(self.checkpoint_conn(state, cell, pipeline, conn).await)
            }
            absent => absent,
        }
    }

    /// [`Durability::checkpoint`] of an open database.
    async fn checkpoint_conn(
        &self,
        state: &ShardState,
        cell: &ObjectCell,
        pipeline: &Pipeline,
        conn: rusqlite::Connection,
    ) -> rusqlite::Connection {
        let Durability::Fleet { fleet, .. } = self else {
            return conn;
        };
        let (path, _) = cell.store_config(state);
        pipeline.idle().await;
        if pipeline.failed() {
            // A shipment failed while it waited: the WAL holds writes answered 503, which the
            // checkpoint would put in a snapshot. The object is let go after this batch instead.
            return conn;
        }
        let Some(mut shipping) = pipeline.shipping().take() else {
            return conn;
        };
        let (fleet, key) = (fleet.clone(), cell.key.clone());
        let (conn, shipping) = state
            .on_thread(cell.opened_by(), move || {
                if let Err(e) = fleet.snapshot(&mut shipping, &conn, &path) {
                    warn!(object = %key, "cannot checkpoint and upload a snapshot: {e}");
                }
                (conn, shipping)
            })
            .await;
        *pipeline.shipping() = Some(shipping);
        conn
    }
}
