//! An object's store: its SQLite database, opened with the node's pragmas and SQL limits,
//! and the watch that interrupts SQL past its time limits.

use std::fmt;
use std::path::{Path, PathBuf};

use combd_kernel::limits::{SQLITE_BUSY_TIMEOUT, SQL_PROGRESS_STEPS, SQL_VALUE_MAX_BYTES};

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

/// How an object's database is opened: the node's durability and size settings and the
/// app's schema.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreConfig {
    /// `synchronous=FULL` (else `NORMAL`): `COMBD_SQLITE_SYNC`.
    pub sync_full: bool,
    /// `COMBD_DB_MAX`.
    pub db_max_bytes: u64,
    /// The app's schema, run at every open.
    pub schema: &'static str,
}

/// Opens an object's database: WAL, the durability setting, the SQL limits (value size,
/// database size, the statement and host-time watch), the app's schema.
pub(crate) fn open(path: &Path, config: StoreConfig) -> Result<rusqlite::Connection, StoreError> {
    let err = |step: &'static str, path: &Path, e: &dyn fmt::Display| StoreError {
        step,
        path: path.to_path_buf(),
        error: e.to_string(),
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| err("create", dir, &e))?;
    }
    let db = rusqlite::Connection::open(path).map_err(|e| err("open", path, &e))?;
    let configure = |sql: &str| {
        db.execute_batch(sql)
            .map_err(|e| err("configure", path, &e))
    };
    let sync = if config.sync_full { "FULL" } else { "NORMAL" };
    configure(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync}; PRAGMA foreign_keys=ON; \
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
    watch::install(&db);
    db.progress_handler(SQL_PROGRESS_STEPS, Some(watch::check));
    if !config.schema.is_empty() {
        db.execute_batch(config.schema)
            .map_err(|e| err("schema of", path, &e))?;
    }
    Ok(db)
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
        _p: *mut std::ffi::c_void,
        x: *mut std::ffi::c_void,
    ) -> i32 {
        if kind == ffi::SQLITE_TRACE_PROFILE as u32 {
            // SAFETY: for SQLITE_TRACE_PROFILE, X points to the statement's run time in ns.
            let ns = unsafe { *(x as *const i64) };
            SQL_SPENT.with(|s| s.set(s.get() + Duration::from_nanos(ns.max(0) as u64)));
            STMT_START.with(|s| s.set(None));
        } else {
            STMT_START.with(|s| s.set(Some(Instant::now())));
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
