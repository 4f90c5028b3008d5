//! An object's files on a node: its database `<data>/objects/<app>/<name>.sqlite` with SQLite's
//! `-wal` and `-shm` beside it ([`crate::app::object_path`]), what the operator's listing reads
//! of them ([`FileFacts`], [`names`]), and how they go when the object is deleted.
//!
//! ## Deleting, crash-safely
//!
//! A delete is decided in the object's own database first: the node writes a row of
//! [`MARK_TABLE`] in a transaction (the call's that asked `cx.delete()`, or the node's own for
//! the operator's), durable before anything of it is answered. From then on the object is
//! deleted whatever crashes: its task removes the files once every batch before is answered,
//! and an object opened with the mark (its task died first) is removed then, before anything
//! runs on it. Removing ([`remove`]):
//!
//! 1. the database is renamed `<name>.sqlite-deleted` (a tombstone; the directory synced): from
//!    here the object is absent, and a new one of the name starts empty;
//! 2. its `-wal` and `-shm` are removed (the directory synced): a WAL left beside a database
//!    of the same name would be read into it, bringing rows of the old object back;
//! 3. the tombstone is removed.
//!
//! A crash within these steps leaves a tombstone, which the next start finishes
//! ([`finish_removals`]) before any shard runs. A tombstone's name never clashes with a
//! database's: databases end in `.sqlite`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// The node's table in an object's database that says the object is deleted (one row: when).
pub(crate) const MARK_TABLE: &str = "_combd_deleted";

/// Marks the object deleted, in the transaction open on `db` (the node's SQL: the caller
/// holds [`crate::sandbox::NodeSql`] inside an app's call).
pub(crate) fn mark(db: &rusqlite::Connection) -> rusqlite::Result<()> {
    db.execute_batch("CREATE TABLE IF NOT EXISTS _combd_deleted (at_ms INTEGER NOT NULL);")?;
    db.execute(
        "INSERT INTO _combd_deleted (at_ms) VALUES (?1)",
        [crate::alarms::now_ms() as i64],
    )
    .map(|_| ())
}

/// Whether the object's database says it is deleted.
pub(crate) fn marked(db: &rusqlite::Connection) -> rusqlite::Result<bool> {
    crate::alarms::has(db, MARK_TABLE)
}

/// What a database renamed for its removal ends with.
const TOMBSTONE: &str = "-deleted";

/// `path` with `suffix` appended (`x.sqlite` → `x.sqlite-wal`).
pub(crate) fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Removes a file; one that is not there is fine.
fn remove_if_there(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Makes the directory's entries durable (renames and removals in it).
fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Removes the database at `path` and its sidecars, as the module's notes say; its connection
/// must be closed. True if there was a database (or a tombstone of it) to remove. Blocks.
pub(crate) fn remove(path: &Path) -> io::Result<bool> {
    let tomb = sidecar(path, TOMBSTONE);
    let dir = path.parent().unwrap_or(Path::new("."));
    let found = match std::fs::rename(path, &tomb) {
        Ok(()) => {
            sync_dir(dir)?;
            true
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => tomb.try_exists()?,
        Err(e) => return Err(e),
    };
    finish(path, &tomb)?;
    Ok(found)
}

/// Steps 2 and 3 of a removal: the sidecars, then the tombstone.
fn finish(path: &Path, tomb: &Path) -> io::Result<()> {
    remove_if_there(&sidecar(path, "-wal"))?;
    remove_if_there(&sidecar(path, "-shm"))?;
    sync_dir(path.parent().unwrap_or(Path::new(".")))?;
    remove_if_there(tomb)
}

/// Finishes every removal a crash interrupted under `<data>/objects/<app>/`: each tombstone's
/// sidecars and the tombstone go. Returns the objects (`app`, `name`) it finished, for the
/// alarm index to forget. Blocks; run at start, before any shard.
pub(crate) fn finish_removals(data_dir: &Path) -> io::Result<Vec<(String, String)>> {
    let mut done = Vec::new();
    let Ok(apps) = std::fs::read_dir(data_dir.join("objects")) else {
        return Ok(done);
    };
    for app in apps.filter_map(Result::ok) {
        let Ok(files) = std::fs::read_dir(app.path()) else {
            continue;
        };
        for file in files.filter_map(Result::ok) {
            let tomb = file.path();
            let Some(name) = file
                .file_name()
                .to_str()
                .and_then(|f| f.strip_suffix(".sqlite-deleted"))
                .map(str::to_string)
            else {
                continue;
            };
            let path = tomb.with_file_name(format!("{name}.sqlite"));
            if path.try_exists()? {
                // A database of the name was made after the tombstone (not by this node's
                // removals, which finish before the name is used again): only the tombstone
                // goes, never the new database's WAL.
                remove_if_there(&tomb)?;
            } else {
                finish(&path, &tomb)?;
            }
            done.push((app.file_name().to_string_lossy().into_owned(), name));
        }
    }
    Ok(done)
}

/// What the files of an object's database say of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileFacts {
    /// The database's bytes.
    pub db_bytes: u64,
    /// Its WAL's bytes (0 without one).
    pub wal_bytes: u64,
    /// When it was last written (milliseconds since the Unix epoch): the later of the
    /// database's change and its WAL's, if the WAL holds anything (SQLite makes an empty one
    /// when it opens the database; a checkpoint changes the database, so a write's time may
    /// read as up to its object's idle close later).
    pub written_ms: u64,
}

impl FileFacts {
    /// The facts of the database at `path`; `None` when it is not there.
    pub fn of(path: &Path) -> Option<FileFacts> {
        let db = std::fs::metadata(path).ok()?;
        let wal = std::fs::metadata(sidecar(path, "-wal")).ok();
        let ms = |m: &std::fs::Metadata| {
            m.modified()
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_millis() as u64)
        };
        Some(FileFacts {
            db_bytes: db.len(),
            wal_bytes: wal.as_ref().map_or(0, |w| w.len()),
            written_ms: ms(&db).max(wal.as_ref().filter(|w| w.len() > 0).map_or(0, ms)),
        })
    }
}

/// The names of the objects of `app` that have a database under `data_dir`, in byte order,
/// after `after` (paging), at most `limit`; and whether more follow. Blocks.
pub(crate) fn names(
    data_dir: &Path,
    app: &str,
    after: Option<&str>,
    limit: usize,
) -> io::Result<(Vec<String>, bool)> {
    let dir = data_dir.join("objects").join(app);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), false)),
        Err(e) => return Err(e),
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let f = e.file_name();
            let name = f.to_str()?.strip_suffix(".sqlite")?;
            (crate::app::valid_object_name(name) && after.is_none_or(|a| name > a))
                .then(|| name.to_string())
        })
        .collect();
    names.sort_unstable();
    let more = names.len() > limit;
    names.truncate(limit);
    Ok((names, more))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("combd-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("objects").join("a")).unwrap();
        d
    }

    #[test]
    fn a_removal_takes_the_database_and_its_sidecars() {
        let d = dir("remove");
        let path = d.join("objects/a/x.sqlite");
        for f in ["x.sqlite", "x.sqlite-wal", "x.sqlite-shm", "y.sqlite"] {
            std::fs::write(d.join("objects/a").join(f), b"1").unwrap();
        }
        assert!(remove(&path).unwrap());
        let left: Vec<_> = std::fs::read_dir(d.join("objects/a"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec!["y.sqlite".to_string()]);
        assert!(!remove(&path).unwrap(), "nothing left to remove");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A crash after the rename leaves a tombstone and the old WAL: the start removes both,
    /// so a new database of the name never reads the old WAL.
    #[test]
    fn a_start_finishes_a_removal_a_crash_interrupted() {
        let d = dir("finish");
        let a = d.join("objects/a");
        std::fs::write(a.join("x.sqlite-deleted"), b"old").unwrap();
        std::fs::write(a.join("x.sqlite-wal"), b"old wal").unwrap();
        std::fs::write(a.join("y.sqlite-deleted"), b"old").unwrap();
        std::fs::write(a.join("y.sqlite"), b"new").unwrap();
        std::fs::write(a.join("y.sqlite-wal"), b"new wal").unwrap();
        let mut done = finish_removals(&d).unwrap();
        done.sort();
        assert_eq!(
            done,
            vec![("a".into(), "x".into()), ("a".into(), "y".into())]
        );
        let mut left: Vec<_> = std::fs::read_dir(&a)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, vec!["y.sqlite", "y.sqlite-wal"], "the new y is kept");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn names_are_paged_in_order() {
        let d = dir("names");
        for f in [
            "b.sqlite",
            "a.sqlite",
            "c.sqlite",
            "c.sqlite-wal",
            "d.sqlite-deleted",
        ] {
            std::fs::write(d.join("objects/a").join(f), b"").unwrap();
        }
        assert_eq!(
            names(&d, "a", None, 2).unwrap(),
            (vec!["a".to_string(), "b".to_string()], true)
        );
        assert_eq!(
            names(&d, "a", Some("b"), 2).unwrap(),
            (vec!["c".to_string()], false)
        );
        assert_eq!(names(&d, "none", None, 2).unwrap(), (vec![], false));
        let _ = std::fs::remove_dir_all(&d);
    }
}
