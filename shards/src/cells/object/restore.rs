//! Restoring an object from the backup (`crate::backup::restore`), by the operator
//! (`POST /objects/<app>/<name>/restore?at=…[&as=…]` on the localhost listener, `combd restore`):
//! a [`Job::restore`] at the head of the mailbox of the object restored into (the object itself,
//! in place; or a new name, a fork, which must have no database). Its database is rebuilt beside
//! it and checked first (`prepare`); then the object is let go (what waits goes to its next
//! cell, which opens the restored database), its files are replaced, its backup goes on from a
//! base of the restored database, and its sessions close with 1012 `object restored` (`run`).
//!
//! [`Job::restore`]: crate::job::Job::restore

use std::path::PathBuf;
use std::rc::Rc;

use tracing::warn;

use crate::backup::restore::{build, At, Built, RestoreError};
use crate::http::Response;
use crate::object_key::ObjectKey;
use crate::state::ShardState;
use crate::stats::ShardStats;

use super::super::commit::Pipeline;
use super::super::store::Store;
use super::super::Cells;
use super::delete::Asked;
use super::durability::Durability;
use super::ObjectCell;

/// A rebuilt database, checked, beside the object's: what it is, and where.
pub(in crate::cells) struct Rebuilt {
    built: Built,
    from: ObjectKey,
    file: PathBuf,
}

fn refused(status: u16, error: &str, detail: String) -> Response {
    Response::json(
        status,
        &serde_json::json!({ "error": error, "detail": detail }),
    )
}

/// Rebuilds object `from` as of `at` from the backup beside this object's database, checked.
/// `Err`: the answer (501 in a fleet, 409 with backup off or into a name that has a database,
/// 404 for a batch the backup does not have or when the object had no database then, 500).
pub(super) async fn prepare(
    state: &ShardState,
    cell: &ObjectCell,
    durability: &Durability,
    store: &Store,
    (from, at): (ObjectKey, At),
) -> Result<Rebuilt, Response> {
    if durability.fleet().is_some() {
        return Err(Response::error(
            501,
            "restoring an object in a fleet is not built yet",
        ));
    }
    let Some(backup) = state.node().backup.clone() else {
        return Err(Response::error(
            409,
            "COMBD_BACKUP is off: there is nothing to restore from",
        ));
    };
    if from != cell.key && matches!(store, Store::Present(_)) {
        let e = format!(
            "{} has a database: restore into a new name, or in place",
            cell.key
        );
        return Err(refused(409, "the object exists", e));
    }
    let (path, _) = cell.store_config(state);
    let file = crate::object_files::sidecar(&path, "-restoring");
    let (source, out) = (from.clone(), file.clone());
    let built = state
        .on_thread(cell.opened_by(), move || {
            build(backup.target(), &source, at, &out)
        })
        .await;
    match built {
        // A fork (or an undelete) adds a database: its place under COMBD_MAX_OBJECTS_PER_APP.
        Ok(_)
            if !matches!(store, Store::Present(_))
                && !state.node().objects.reserve(cell.app_name()) =>
        {
            let _ = std::fs::remove_file(&file);
            Err(super::super::Refusal::TooManyObjects.response())
        }
        Ok(built) => Ok(Rebuilt { built, from, file }),
        Err(e) => {
            let _ = std::fs::remove_file(&file);
            Err(match e {
                RestoreError::NotFound(m) => refused(404, "no such batch in the backup", m),
                RestoreError::NoObject { .. } => {
                    refused(404, "the object had no database then", e.to_string())
                }
                RestoreError::Failed(m) => {
                    warn!(object = %cell.key, "cannot restore from the backup: {m}");
                    refused(500, "cannot restore", m)
                }
            })
        }
    }
}

/// Replaces the object's database at `path` by the rebuilt one at `file`, never leaving half
/// of either: the old one's WAL is checkpointed into it first (refused while a reader holds
/// it), so the rename that replaces it leaves no frame of it behind to be read into the new
/// one; then the sidecars go. Blocks.
fn place(store: Store, file: &std::path::Path, path: &std::path::Path) -> std::io::Result<()> {
    if let Store::Present(db) = &store {
        let _node = crate::sandbox::NodeSql::enter();
        let busy: i64 = db
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .map_err(std::io::Error::other)?;
        if busy != 0 {
            return Err(std::io::Error::other(
                "a reader holds the object's WAL: try again",
            ));
        }
    }
    drop(store);
    std::fs::rename(file, path)?;
    for sidecar in ["-wal", "-shm"] {
        match std::fs::remove_file(crate::object_files::sidecar(path, sidecar)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    std::fs::File::open(path.parent().unwrap_or(path))?.sync_all()
}

/// Puts the rebuilt database in place of the object's (see the module's notes) and answers.
pub(super) async fn run(
    cells: &Rc<Cells>,
    cell: &ObjectCell,
    pipeline: Pipeline,
    store: Store,
    rebuilt: Rebuilt,
    asked: Asked,
) {
    let state = &cells.state;
    let app = cell.app_name();
    // Its place was reserved by `prepare` if it had no database.
    let existed = matches!(store, Store::Present(_));
    let closing = cells.let_go_closing(&cell.key);
    cells.hand_over(&cell.app, &cell.name, cell.take_mail());
    let _ = pipeline.finish().await;
    drop(cell.backup.take());
    let (path, _) = cell.store_config(state);
    let backup = state.node().backup.clone();
    let (key, file) = (cell.key.clone(), rebuilt.file.clone());
    let placed = state
        .on_thread(cell.opened_by(), move || {
            place(store, &file, &path)?;
            match &backup {
                Some(b) => crate::backup::object::rebased(b, &key, &path).map(Some),
                None => Ok(None),
            }
        })
        .await;
    let answer = match placed {
        Ok(base) => {
            ShardStats::add(&state.stats().objects_restored, 1);
            Response::json(
                200,
                &serde_json::json!({
                    "restored": rebuilt.from.as_str(), "into": cell.key.as_str(),
                    "seq": rebuilt.built.seq, "at_ms": rebuilt.built.at_ms, "base": base,
                }),
            )
        }
        Err(e) => {
            warn!(object = %cell.key, "cannot put a restored database in place: {e}");
            let _ = std::fs::remove_file(&rebuilt.file);
            if !existed {
                state.node().objects.release(app);
            }
            refused(
                503,
                "cannot put the restored database in place",
                e.to_string(),
            )
        }
    };
    cells.close_object_sessions(cell.key.as_str(), crate::job::ObjectGone::Restored);
    drop(closing);
    let _ = asked.try_send(answer);
}
