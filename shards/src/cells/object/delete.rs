//! Deleting an object (`crate::object_files` has the protocol on one node): by one of its
//! calls (`cx.delete()`, marked in the call's transaction) once that batch is answered, or by
//! the operator (`DELETE /objects/<app>/<name>` on the localhost listener: a [`Job::delete`]
//! at the head of its mailbox, marked in a transaction of the node's, answered once the files
//! are gone). Either way its task lets it go first, so what waits and what comes next goes to
//! a fresh cell, which restores (a new, empty object) only once the files are gone; its
//! sessions, on every shard, close with 4404 `object deleted`. In a fleet the fleet forgets it
//! first (`Fleet::forget`: its etcd keys, then its segments and snapshots in the bucket), once
//! the batch that marked it is shipped; an owner that restores a marked database (its last
//! owner died before it forgot it) forgets it then.
//!
//! [`Job::delete`]: crate::job::Job::delete

use std::path::Path;
use std::rc::Rc;

use tracing::warn;

use crate::alarms::AlarmIndex;
use crate::http::Response;
use crate::object_key::ObjectKey;
use crate::state::ShardState;
use crate::stats::ShardStats;

use super::super::commit::Pipeline;
use super::super::store::{Store, Wal};
use super::super::Cells;
use super::ObjectCell;

/// Where the operator's answer goes.
pub(super) type Asked = async_channel::Sender<Response>;

/// Removes a closed object's files and forgets its alarm index entry: true if there was a
/// database. Blocks.
pub(super) fn remove_files(
    path: &Path,
    (alarms, backup): (&AlarmIndex, Option<&std::sync::Arc<crate::backup::Backup>>),
    key: &ObjectKey,
    shard: usize,
) -> std::io::Result<bool> {
    let found = crate::object_files::remove(path)?;
    if let (true, Some(b)) = (found, backup) {
        // Restored to now, the object does not exist.
        crate::backup::object::deleted(b, key);
    }
    if let Err(e) = alarms.forget(key.app(), key.name(), shard) {
        // Only early: a wake of the new object finds nothing due and settles the entry.
        warn!(object = %key, "cannot take a deleted object out of the alarm index: {e}");
    }
    Ok(found)
}

/// Marks the object deleted for the operator (or its expiry: only if it was not written since
/// `idle_since` and has no alarm or message pending), in a transaction of the node's, durable
/// before it is let go. `Err`: nothing was marked, with the answer (404 for an object that has
/// no database, 409 for an expiry the object outlived, 500 if the write failed) and the store
/// to go on with. In a fleet the mark is not shipped: the fleet forgetting the object is what
/// decides ([`run`]).
pub(super) async fn mark(
    state: &ShardState,
    cell: &ObjectCell,
    store: Store,
    idle_since: Option<u64>,
) -> Result<Store, (Store, Response)> {
    let Store::Present(mut db) = store else {
        return Err((store, Response::error(404, "no such object")));
    };
    let sync = crate::cells::commit::syncs_wal(state);
    let (path, _) = cell.store_config(state);
    let (db, marked) = state
        .on_thread(cell.opened_by(), move || {
            if let Some(since) = idle_since {
                if let Some(why) = outlived(&db, &path, since) {
                    return (db, Err(Outcome::Kept(why)));
                }
            }
            let marked = (|| {
                let tx = db.transaction()?;
                crate::object_files::mark(&tx)?;
                tx.commit()
            })()
            .map_err(|e| e.to_string())
            .and_then(|()| match (sync, Wal::of(&db)) {
                (true, Some(wal)) => wal.sync().map_err(|e| e.to_string()),
                _ => Ok(()),
            })
            .map_err(Outcome::Failed);
            (db, marked)
        })
        .await;
    match marked {
        Ok(()) => Ok(Store::Present(db)),
        Err(Outcome::Kept(why)) => Err((Store::Present(db), Response::error(409, why))),
        Err(Outcome::Failed(e)) => {
            warn!(object = %cell.key, "cannot mark the object deleted: {e}");
            let resp = Response::json(
                500,
                &serde_json::json!({ "error": "cannot delete the object", "detail": e }),
            );
            Err((Store::Present(db), resp))
        }
    }
}

/// Why a delete was not marked.
enum Outcome {
    /// An expiry the object outlived: why.
    Kept(&'static str),
    /// The mark could not be written (or synced).
    Failed(String),
}

/// Why an expiring object is kept: written since `since`, or something pending. Blocks.
fn outlived(db: &rusqlite::Connection, path: &Path, since: u64) -> Option<&'static str> {
    let facts = crate::object_files::FileFacts::of(path)?;
    if facts.written_ms > since {
        return Some("written since it expired");
    }
    let _node = crate::sandbox::NodeSql::enter();
    match crate::alarms::remaining(db) {
        Ok((_, 0)) => None,
        Ok(_) => Some("it has alarms or messages pending"),
        Err(_) => Some("cannot read what it has pending"),
    }
}

/// Deletes the object whose deletion is marked (or, absent, which has no database): lets it
/// go, answers every batch before, removes its files, frees its place under
/// `COMBD_MAX_OBJECTS_PER_APP`, closes its sessions; then answers the operator, if it asked.
pub(super) async fn run(
    cells: &Rc<Cells>,
    cell: &ObjectCell,
    pipeline: Pipeline,
    store: Store,
    asked: Option<Asked>,
) {
    let state = &cells.state;
    let closing = cells.let_go_closing(&cell.key);
    cells.hand_over(&cell.app, &cell.name, cell.take_mail());
    let (shipping, failed) = pipeline.finish().await;
    let fleet = state.node().fleet.clone();
    let removed = match store {
        Store::Present(db) => {
            let (path, _) = cell.store_config(state);
            let alarms = state.node().alarms.clone();
            let backup = state.node().backup.clone();
            let (key, shard) = (cell.key.clone(), state.id());
            // Its backup's cursor goes with it: the object's next database starts a new chain.
            drop(cell.backup.take());
            state
                .on_thread(cell.opened_by(), move || {
                    drop(db);
                    if let Some(fleet) = &fleet {
                        forget(fleet, shipping, failed)?;
                    }
                    remove_files(&path, (&alarms, backup.as_ref()), &key, shard)
                })
                .await
        }
        Store::Absent(_) => {
            if let (Some(fleet), Some(s)) = (fleet, shipping) {
                // Never written: its claim is given back, as when it is let go.
                let (path, _) = cell.store_config(state);
                state
                    .on_thread(cell.opened_by(), move || {
                        fleet.release_if_unwritten(&s, &path);
                        fleet.closed();
                    })
                    .await;
            }
            Ok(false)
        }
    };
    let answer = match removed {
        Ok(found) => {
            if found {
                deleted(state, cell.app_name());
            }
            Response::json(200, &serde_json::json!({ "deleted": found }))
        }
        Err(e) => {
            // Marked: its next open finishes the delete (in a fleet, if the mark was shipped).
            warn!(object = %cell.key, "cannot delete the object: {e}");
            Response::json(
                500,
                &serde_json::json!({
                    "error": "cannot delete the object", "detail": e.to_string(),
                }),
            )
        }
    };
    cells.close_object_sessions(cell.key.as_str(), crate::job::ObjectGone::Deleted);
    drop(closing);
    if let Some(asked) = asked {
        let _ = asked.try_send(answer);
    }
}

/// In a fleet, the deleted object forgotten by the fleet, and this node's claim given back
/// (`shipping` is what it shipped from; `failed`: a shipment failed since the last batch, so
/// the batch that deleted it may not be in the fleet: nothing is forgotten). Blocks.
fn forget(
    fleet: &crate::fleet::Fleet,
    shipping: Option<crate::fleet::Shipping>,
    failed: bool,
) -> std::io::Result<()> {
    let forgotten = match (shipping, failed) {
        (Some(_), true) => Err("a shipment failed: the fleet does not hold the delete".into()),
        (Some(mut s), false) => fleet.forget(&mut s, true),
        (None, _) => Err("the object was not opened from the fleet".into()),
    };
    fleet.closed();
    forgotten.map_err(std::io::Error::other)
}

/// Counts a deleted object's database gone: its place under `COMBD_MAX_OBJECTS_PER_APP` is free.
pub(super) fn deleted(state: &ShardState, app: &str) {
    state.node().objects.release(app);
    ShardStats::add(&state.stats().objects_deleted, 1);
}
