//! An object's store: its SQLite database, opened with the node's pragmas and SQL limits,
//! its write-ahead log ([`Wal`]), which the object makes durable itself, and the watch that
//! interrupts SQL past its time limits.
//!
//! ## Durability
//!
//! Every connection runs WAL with `synchronous=NORMAL`: a commit writes its frames to the WAL
//! but does not wait for them to reach the disk; a checkpoint syncs the WAL before it copies
//! frames into the database and syncs the database before the WAL may be reused (so NORMAL
//! never corrupts). With `COMBD_SQLITE_SYNC=full` the object then syncs the WAL itself
//! ([`Wal::sync`], the `fdatasync` SQLite makes at a FULL commit) before anything of a
//! committed batch is answered or sent: several batches that committed while one sync ran share
//! the next one (group commit), and the next batch runs while a sync is in flight.

use std::fmt;
use std::path::{Path, PathBuf};

use combd_kernel::limits::{SQLITE_BUSY_TIMEOUT, SQL_PROGRESS_STEPS, SQL_VALUE_MAX_BYTES};

use crate::sandbox;

/// Why an object's database could not be opened.
#[derive(Debug)]
pub(crate) struct StoreError {
    /// What was being done: `create`, `open`, `configure`, `schema of`.
    step: &'static str,
    path: PathBuf,
    error: String,
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.step, self.path.display(), self.error)
    }
}

/// The write-ahead log of an object's connection, on a descriptor of the node's own, to sync
/// from another thread while the connection goes on committing.
///
/// Opened (`O_NOFOLLOW`) after a batch committed, from the database's path: `fdatasync` on
/// any descriptor of a file covers every write to it that completed before the call began,
/// so a commit running beside the sync is merely not covered. Owning the descriptor means no
/// pointer into SQLite's pager is held across threads: if the WAL were closed or replaced
/// under a sync in flight (apps cannot leave WAL mode, `cells/sandbox.rs`, but the node must
/// not depend on it for memory safety), the sync would reach the old file, never freed memory.
/// While a sync waits the object holds this fourth descriptor
/// ([`OBJECT_FDS`](combd_kernel::limits::OBJECT_FDS)).
#[derive(Debug, Clone)]
pub(crate) struct Wal {
    file: std::sync::Arc<std::fs::File>,
    path: std::sync::Arc<Path>,
}

impl Wal {
    /// The WAL of a connection's database, if it has one (after its first transaction that
    /// wrote).
    pub fn of(db: &rusqlite::Connection) -> Option<Wal> {
        use std::os::unix::fs::OpenOptionsExt;
        let db_path = db.path().filter(|p| !p.is_empty())?;
        let path = PathBuf::from(format!("{db_path}-wal"));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
            .ok()?;
        Some(Wal {
            file: std::sync::Arc::new(file),
            path: path.into(),
        })
    }

    /// Makes every write to the WAL that completed before this call durable (`fdatasync`).
    /// Blocks: call it on a blocking thread.
    pub fn sync(&self) -> std::io::Result<()> {
        crate::testing::sync_wal(&self.path, &|| self.file.sync_data())
    }
}

/// An object's database, as its task holds it: the one value that says whether the object
/// exists.
pub(crate) enum Store {
    /// Its database file does not exist (on a node alone): its batches run on a scratch
    /// database in memory with the app's schema ([`open_scratch`]). A batch that leaves it as
    /// it was is answered from there and creates nothing; one that writes is dropped and run
    /// again on the object's database, created for it, and the object is `Present` from then
    /// on.
    Absent(rusqlite::Connection),
    /// Its database, open.
    Present(rusqlite::Connection),
}

impl Store {
    /// The connection, whichever database it is.
    pub fn into_conn(self) -> rusqlite::Connection {
        match self {
            Store::Absent(db) | Store::Present(db) => db,
        }
    }

    /// Closes the connection and opens the same database again (a scratch one anew). Blocks:
    /// call it on a blocking thread.
    pub fn reopen(self, path: &Path, config: StoreConfig) -> Result<Store, StoreError> {
        match self {
            Store::Absent(db) => {
                drop(db);
                open_scratch(path, config).map(Store::Absent)
            }
            Store::Present(db) => {
                drop(db);
                open(path, config).map(Store::Present)
            }
        }
    }
}

/// How an object's database is opened: the node's size setting and the app's schema. (The
/// durability setting is the object's: see the module's notes.)
#[derive(Clone)]
pub(crate) struct StoreConfig {
    /// `COMBD_DB_MAX`.
    pub db_max_bytes: u64,
    /// The app's schema, run at every open.
    pub schema: &'static str,
    /// In a fleet: SQLite never checkpoints by itself (`wal_autocheckpoint=0`), so no WAL
    /// frame is overwritten before it is shipped; the object checkpoints after shipping.
    pub fleet: bool,
    /// With backup on (`crate::backup`): SQLite checkpoints neither by itself nor at close; the
    /// object truncates its WAL once the backup holds it.
    pub backup: bool,
    /// After the schema, what brings the object to its app's version (`super::migrate`).
    pub migrate: Option<Migrate>,
}

/// What brings an object's database to its app's version after its schema
/// (`super::migrate`); a step that fails is the open's error ([`StoreError::migration`]).
pub(crate) type Migrate = std::sync::Arc<
    dyn Fn(&mut rusqlite::Connection, &Path) -> Result<(), StoreError> + Send + Sync,
>;

/// The step of a [`StoreError`] that is a failed migration.
const MIGRATE: &str = "migrate";

impl StoreError {
    /// A migration of the database at `path` that failed with `e`.
    pub fn migration(path: &Path, e: &dyn fmt::Display) -> StoreError {
        store_error(MIGRATE, path, e)
    }

    /// Whether the object could not be brought to its app's version (`super::migrate`).
    pub fn is_migration(&self) -> bool {
        self.step == MIGRATE
    }

    /// `step` failed on `path` with `e`.
    pub fn new(step: &'static str, path: &Path, e: &dyn fmt::Display) -> StoreError {
        store_error(step, path, e)
    }
}

fn store_error(step: &'static str, path: &Path, e: &dyn fmt::Display) -> StoreError {
    StoreError {
        step,
        path: path.to_path_buf(),
        error: e.to_string(),
    }
}

/// Opens an object's database, creating it (and its app's directory) if it does not exist:
/// WAL with `synchronous=NORMAL`, the SQL limits (value size, database size, the statement and
/// host-time watch), the app's schema.
pub(crate) fn open(path: &Path, config: StoreConfig) -> Result<rusqlite::Connection, StoreError> {
    let err = store_error;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| err("create", dir, &e))?;
    }
    let db = rusqlite::Connection::open_with_flags(path, sandbox::open_flags())
        .map_err(|e| err("open", path, &e))?;
    configure(db, path, config)
}

/// Opens the scratch database of an object whose database does not exist: in memory (no file,
/// nothing to sync), with the same limits and the app's schema, so the app runs on it as on a
/// new database. `path` only names the object in errors.
pub(crate) fn open_scratch(
    path: &Path,
    config: StoreConfig,
) -> Result<rusqlite::Connection, StoreError> {
    let db = rusqlite::Connection::open_in_memory_with_flags(sandbox::open_flags())
        .map_err(|e| store_error("open", path, &e))?;
    // `journal_mode=WAL` leaves an in-memory database in its own `memory` mode; the rest
    // applies as to a file.
    configure(db, path, config)
}

/// Applies the node's pragmas, the SQL limits, the watch and the app's schema.
fn configure(
    mut db: rusqlite::Connection,
    path: &Path,
    config: StoreConfig,
) -> Result<rusqlite::Connection, StoreError> {
    let err = store_error;
    let configure = |sql: &str| {
        db.execute_batch(sql)
            .map_err(|e| err("configure", path, &e))
    };
    configure(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON; \
         PRAGMA busy_timeout={};",
        SQLITE_BUSY_TIMEOUT.as_millis()
    ))?;
    db.set_limit(
        rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH,
        SQL_VALUE_MAX_BYTES,
    );
    let page: u64 = db
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .map_err(|e| err("configure", path, &e))?;
    configure(&format!(
        "PRAGMA max_page_count = {};",
        (config.db_max_bytes / page.max(512)).max(1)
    ))?;
    if config.fleet || config.backup {
        configure("PRAGMA wal_autocheckpoint=0;")?;
    }
    if config.backup {
        db.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .map_err(|e| err("configure", path, &e))?;
    }
    watch::install(&db);
    db.progress_handler(SQL_PROGRESS_STEPS, Some(watch::check));
    sandbox::lock_down(&db).map_err(|e| err("configure", path, &e))?;
    sandbox::check_node_tables(&db).map_err(|e| err("open", path, &e))?;
    run_schema(&db, path, config.schema)?;
    if let Some(migrate) = &config.migrate {
        migrate(&mut db, path)?;
    }
    Ok(db)
}

/// Runs the app's schema. It is app SQL: it runs under the same authorizer as its calls, and
/// the same watch (a statement at most `SQL_STATEMENT_LIMIT`, all of it at most
/// `HOST_TIME_LIMIT`). Unwatched, a module's schema whose statement never ends held the open,
/// a blocking thread and a restore slot for ever, and four such objects every object's open on
/// the shard (found by the `host_imports` fuzz target).
fn run_schema(db: &rusqlite::Connection, path: &Path, schema: &str) -> Result<(), StoreError> {
    if schema.is_empty() {
        return Ok(());
    }
    let err = store_error;
    let _app = sandbox::AppSql::enter();
    watch::begin();
    let r = db.execute_batch(schema);
    let interrupted = watch::end();
    if sandbox::take_denied() {
        return Err(err(
            "schema of",
            path,
            &"a statement the node does not allow apps",
        ));
    }
    if let Some(limit) = interrupted {
        return Err(err(
            "schema of",
            path,
            &format_args!("a statement stopped by {}", limit.as_str()),
        ));
    }
    r.map_err(|e| err("schema of", path, &e))
}

/// The statement and host-time watch. SQLite calls [`watch::check`] every few thousand VM
/// steps; it interrupts a statement that has run longer than
/// [`SQL_STATEMENT_LIMIT`](combd_kernel::limits::SQL_STATEMENT_LIMIT), or any statement once
/// the call's SQL has taken [`HOST_TIME_LIMIT`](combd_kernel::limits::HOST_TIME_LIMIT) in all.
/// Statement starts and durations come from `sqlite3_trace_v2`; time the app spends outside
/// host calls is bounded by its ticks instead. The state is per thread: a blocking thread runs
/// one call at a time.
pub(crate) mod watch {
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    use combd_kernel::limits::{HOST_TIME_LIMIT, SQL_STATEMENT_LIMIT};
    use rusqlite::ffi;

    use crate::limit::Limit;

    thread_local! {
        static CALL_START: Cell<Option<Instant>> = const { Cell::new(None) };
        static STMT_START: Cell<Option<Instant>> = const { Cell::new(None) };
        static TRIPPED: Cell<Option<Limit>> = const { Cell::new(None) };
        static SQL_SPENT: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    unsafe extern "C" fn on_trace(
        kind: u32,
        _ctx: *mut std::ffi::c_void,
        p: *mut std::ffi::c_void,
        x: *mut std::ffi::c_void,
    ) -> i32 {
        if kind == ffi::SQLITE_TRACE_PROFILE as u32 {
            // SAFETY: for SQLITE_TRACE_PROFILE, X points to the statement's run time in ns.
            let ns = unsafe { *(x as *const i64) };
            SQL_SPENT.with(|s| s.set(s.get() + Duration::from_nanos(ns.max(0) as u64)));
            STMT_START.with(|s| s.set(None));
            crate::sandbox::statement_ends();
        } else {
            STMT_START.with(|s| s.set(Some(Instant::now())));
            // SAFETY: for SQLITE_TRACE_STMT, P is the statement and X its text (NUL-ended,
            // alive while the callback runs, which is when the closure is called).
            let sql = || unsafe { std::ffi::CStr::from_ptr(x as *const std::ffi::c_char) };
            if crate::sandbox::statement_starts(sql) {
                // SAFETY: P is a live statement of this connection, running on this thread.
                unsafe {
                    ffi::sqlite3_interrupt(ffi::sqlite3_db_handle(p as *mut ffi::sqlite3_stmt))
                };
            }
        }
        0
    }

    /// Hooks statement starts on a connection.
    pub fn install(db: &rusqlite::Connection) {
        // SAFETY: the callback touches only thread-local state; the handle outlives the hook
        // (it is removed when the connection closes).
        unsafe {
            ffi::sqlite3_trace_v2(
                db.handle(),
                (ffi::SQLITE_TRACE_STMT | ffi::SQLITE_TRACE_PROFILE) as u32,
                Some(on_trace),
                std::ptr::null_mut(),
            );
        }
    }

    /// Starts watching a call on this thread.
    pub fn begin() {
        CALL_START.with(|c| c.set(Some(Instant::now())));
        STMT_START.with(|s| s.set(None));
        TRIPPED.with(|t| t.set(None));
        SQL_SPENT.with(|s| s.set(Duration::ZERO));
    }

    /// Which limit interrupted SQL during the call, if any; and stops watching.
    pub fn end() -> Option<Limit> {
        CALL_START.with(|c| c.set(None));
        TRIPPED.with(|t| t.take())
    }

    /// The progress handler: true interrupts the statement.
    pub fn check() -> bool {
        if CALL_START.with(|c| c.get()).is_none() {
            return false;
        }
        let running = STMT_START
            .with(|s| s.get())
            .map_or(Duration::ZERO, |t| t.elapsed());
        if SQL_SPENT.with(|s| s.get()) + running > HOST_TIME_LIMIT {
            TRIPPED.with(|t| t.set(Some(Limit::HostTime)));
            return true;
        }
        if running > SQL_STATEMENT_LIMIT {
            TRIPPED.with(|t| t.set(Some(Limit::SqlTimeout)));
            return true;
        }
        false
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// The WAL leaving under a sync (what `COMMIT; PRAGMA journal_mode=DELETE` did while a
    /// sync was in flight) cannot reach freed memory: the sync holds its own descriptor.
    #[test]
    fn a_wal_synced_after_sqlite_closed_it_is_still_a_valid_file() {
        let dir = std::env::temp_dir().join(format!("combd-wal-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = rusqlite::Connection::open(dir.join("o.sqlite")).unwrap();
        db.pragma_update(None, "journal_mode", "WAL").unwrap();
        assert!(Wal::of(&db).is_none(), "no WAL before a write");
        db.execute_batch("CREATE TABLE t(v); INSERT INTO t VALUES (1);")
            .unwrap();
        let wal = Wal::of(&db).unwrap();
        wal.sync().unwrap();
        let syncing = std::thread::spawn({
            let wal = wal.clone();
            move || (0..200).try_for_each(|_| wal.sync())
        });
        db.pragma_update(None, "journal_mode", "DELETE").unwrap();
        assert!(!dir.join("o.sqlite-wal").exists(), "SQLite removed its WAL");
        drop(db);
        syncing.join().unwrap().unwrap();
        wal.sync().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
