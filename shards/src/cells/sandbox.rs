//! What an app's SQL may do on its object's database, native and module alike: its own main
//! database's rows and schema, and nothing else.
//!
//! Every object connection is locked down before any app SQL runs ([`lock_down`]): no
//! database can be attached (`SQLITE_LIMIT_ATTACHED` 0: this also stops `VACUUM INTO`, which
//! attaches its target), SQLite's defensive mode (no writing the schema table, no
//! corrupting pragmas), an untrusted schema (no SQL functions with side effects from views or
//! triggers), no extension loading, and no URI filenames or symbolic links at open.
//!
//! While an app's code runs ([`AppSql`]), an authorizer allows what an app needs: reading and
//! writing its tables, DDL on its main database, and a named list of pragmas that only read
//! (or set `user_version`, the app's own schema number). It denies attaching and detaching,
//! transaction and savepoint control (each call is one transaction the node commits or rolls
//! back), temporary and virtual tables, and every other pragma. A denied statement fails like
//! any SQL error (a module sees `-1` and the message through `sql_error`); the call then fails
//! with `sql_denied` and is rolled back ([`take_denied`]), counted in `/stats`. The node's own
//! SQL (its pragmas, the call's transaction) runs outside [`AppSql`] and is not restricted.

use std::cell::Cell;

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};

thread_local! {
    /// Whether the SQL being prepared on this thread is an app's.
    static APP: Cell<bool> = const { Cell::new(false) };
    /// Whether an app statement was denied since the last [`take_denied`].
    static DENIED: Cell<bool> = const { Cell::new(false) };
}

/// Pragmas an app may run: they read the schema or the database's state, or set the app's
/// own schema number (`user_version`).
const PRAGMAS_ALLOWED: &[&str] = &[
    "table_info",
    "table_xinfo",
    "table_list",
    "index_list",
    "index_info",
    "index_xinfo",
    "foreign_key_list",
    "foreign_key_check",
    "integrity_check",
    "quick_check",
    "page_count",
    "page_size",
    "freelist_count",
    "data_version",
    "user_version",
];

/// Marks the SQL prepared on this thread as an app's while it lives.
pub(crate) struct AppSql(());

impl AppSql {
    pub fn enter() -> AppSql {
        APP.with(|a| a.set(true));
        AppSql(())
    }
}

impl Drop for AppSql {
    fn drop(&mut self) {
        APP.with(|a| a.set(false));
    }
}

/// Marks the SQL prepared on this thread as the node's while it lives, inside an app's call
/// (a host call the node serves with SQL of its own, on the node's tables: the alarms).
pub(crate) struct NodeSql(bool);

impl NodeSql {
    pub fn enter() -> NodeSql {
        NodeSql(APP.with(|a| a.replace(false)))
    }
}

impl Drop for NodeSql {
    fn drop(&mut self) {
        APP.with(|a| a.set(self.0));
    }
}

/// Whether an app statement was denied on this thread since the last call; clears it.
pub(crate) fn take_denied() -> bool {
    DENIED.with(|d| d.replace(false))
}

/// The open flags of an object's database: read-write, created if missing, no URI filename,
/// no symbolic link as the database file.
pub(crate) fn open_flags() -> rusqlite::OpenFlags {
    use rusqlite::OpenFlags;
    OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_CREATE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW
}

/// Locks a connection down before any app SQL runs on it (see the module's notes).
pub(crate) fn lock_down(db: &rusqlite::Connection) -> rusqlite::Result<()> {
    use rusqlite::config::DbConfig;
    use rusqlite::limits::Limit;
    db.set_limit(Limit::SQLITE_LIMIT_ATTACHED, 0);
    db.set_db_config(DbConfig::SQLITE_DBCONFIG_DEFENSIVE, true)?;
    db.set_db_config(DbConfig::SQLITE_DBCONFIG_TRUSTED_SCHEMA, false)?;
    db.set_db_config(DbConfig::SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER, false)?;
    // Extension loading is off unless enabled; it is turned off here all the same, for the C
    // API and the SQL function (rusqlite has no wrapper for this option).
    let mut was = 0;
    // SAFETY: the handle is open; ENABLE_LOAD_EXTENSION takes an int and an int* to write.
    let rc = unsafe {
        rusqlite::ffi::sqlite3_db_config(
            db.handle(),
            rusqlite::ffi::SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION,
            0,
            &mut was as *mut std::ffi::c_int,
        )
    };
    if rc != rusqlite::ffi::SQLITE_OK {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rc),
            Some("cannot turn extension loading off".into()),
        ));
    }
    db.authorizer(Some(authorize));
    Ok(())
}

/// The authorizer: everything for the node's own SQL; for an app's, [`allowed`], and a
/// denial recorded for [`take_denied`].
fn authorize(cx: AuthContext<'_>) -> Authorization {
    if !APP.with(|a| a.get()) || allowed(&cx) {
        return Authorization::Allow;
    }
    DENIED.with(|d| d.set(true));
    Authorization::Deny
}

/// What an app's SQL may do.
fn allowed(cx: &AuthContext<'_>) -> bool {
    let main = matches!(cx.database_name, None | Some("main"));
    // The node's own tables in an object's database (its alarms, outbox and inbox:
    // `crate::alarms`), and anything an app could name like them (a view or an index that
    // would stand in for the node's), and `sqlite_sequence`, whose numbers the node's outbox
    // relies on (a reset would make a receiver take new messages for old ones).
    let node_table = |t: &str| {
        t.get(..7)
            .is_some_and(|p| p.eq_ignore_ascii_case("_combd_"))
    };
    let sequence = |t: &str| t.eq_ignore_ascii_case("sqlite_sequence");
    let touches_node_table = match cx.action {
        AuthAction::Read { table_name, .. } => node_table(table_name),
        AuthAction::Insert { table_name }
        | AuthAction::Update { table_name, .. }
        | AuthAction::Delete { table_name } => node_table(table_name) || sequence(table_name),
        AuthAction::CreateTable { table_name }
        | AuthAction::DropTable { table_name }
        | AuthAction::AlterTable { table_name, .. } => node_table(table_name),
        AuthAction::CreateIndex {
            index_name,
            table_name,
        }
        | AuthAction::DropIndex {
            index_name,
            table_name,
        } => node_table(index_name) || node_table(table_name),
        AuthAction::CreateTrigger {
            trigger_name,
            table_name,
        }
        | AuthAction::DropTrigger {
            trigger_name,
            table_name,
        } => node_table(trigger_name) || node_table(table_name),
        AuthAction::CreateView { view_name } | AuthAction::DropView { view_name } => {
            node_table(view_name)
        }
        _ => false,
    };
    if touches_node_table {
        return false;
    }
    match cx.action {
        AuthAction::Select | AuthAction::Recursive => true,
        AuthAction::Read { .. }
        | AuthAction::Insert { .. }
        | AuthAction::Update { .. }
        | AuthAction::Delete { .. } => main,
        AuthAction::CreateTable { .. }
        | AuthAction::CreateIndex { .. }
        | AuthAction::CreateTrigger { .. }
        | AuthAction::CreateView { .. }
        | AuthAction::DropTable { .. }
        | AuthAction::DropIndex { .. }
        | AuthAction::DropTrigger { .. }
        | AuthAction::DropView { .. }
        | AuthAction::AlterTable { .. }
        | AuthAction::Reindex { .. }
        | AuthAction::Analyze { .. } => main,
        AuthAction::Function { function_name } => {
            !function_name.eq_ignore_ascii_case("load_extension")
        }
        AuthAction::Pragma { pragma_name, .. } => {
            main && PRAGMAS_ALLOWED
                .iter()
                .any(|p| p.eq_ignore_ascii_case(pragma_name))
        }
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A locked-down connection on a real file, as an object's is opened.
    fn object_db(tag: &str) -> (rusqlite::Connection, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("combd-sandbox-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = rusqlite::Connection::open_with_flags(dir.join("o.sqlite"), open_flags()).unwrap();
        db.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (v);")
            .unwrap();
        lock_down(&db).unwrap();
        (db, dir)
    }

    /// Runs `sql` as an app's: whether it ran, and whether a denial was recorded.
    fn as_app(db: &rusqlite::Connection, sql: &str) -> (bool, bool) {
        let _app = AppSql::enter();
        let ran = db.execute_batch(sql).is_ok();
        (ran, take_denied())
    }

    #[test]
    fn the_nodes_tables_and_names_and_the_sequence_are_not_the_apps() {
        let (db, dir) = object_db("node-tables");
        db.execute_batch(crate::alarms::OUTBOX).unwrap();
        // AUTOINCREMENT in an app's own table still counts (SQLite's own write of the sequence).
        assert_eq!(
            as_app(
                &db,
                "CREATE TABLE a (id INTEGER PRIMARY KEY AUTOINCREMENT, v); INSERT INTO a (v) VALUES (1)"
            ),
            (true, false)
        );
        for sql in [
            "DELETE FROM sqlite_sequence",
            "UPDATE sqlite_sequence SET seq = 0",
            "INSERT INTO _combd_outbox (app, name, body, next_ms) VALUES ('a', 'b', x'', 0)",
            "SELECT * FROM _combd_outbox",
            "DROP TABLE _combd_outbox",
            "CREATE VIEW _combd_inbox AS SELECT 1 AS app",
            "CREATE TABLE _combd_alarms (x)",
            "CREATE INDEX _combd_alarms_at ON a (v)",
            "CREATE TRIGGER _combd_t AFTER INSERT ON a BEGIN SELECT 1; END",
        ] {
            assert_eq!(as_app(&db, sql), (false, true), "{sql}");
        }
        // The node's own SQL, outside an app's call, is not restricted.
        db.execute_batch("SELECT * FROM _combd_outbox").unwrap();
        drop(db);
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn an_apps_sql_reaches_its_tables_and_schema() {
        let (db, dir) = object_db("allowed");
        for sql in [
            "INSERT INTO t VALUES (1)",
            "SELECT * FROM t",
            "UPDATE t SET v = 2",
            "CREATE TABLE u (x); CREATE INDEX ui ON u (x); CREATE VIEW w AS SELECT * FROM u",
            "CREATE TRIGGER tr AFTER INSERT ON u BEGIN INSERT INTO t VALUES (new.x); END",
            "INSERT INTO u VALUES (5)",
            "ALTER TABLE u ADD COLUMN y",
            "DELETE FROM t WHERE v = 5",
            "PRAGMA table_info(t)",
            "PRAGMA user_version = 3",
            "PRAGMA user_version",
            "SELECT * FROM pragma_table_info('t')",
            "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 9) \
             SELECT * FROM c",
            "DROP VIEW w; DROP TABLE u",
        ] {
            assert_eq!(as_app(&db, sql), (true, false), "{sql}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_apps_sql_reaches_nothing_else() {
        let (db, dir) = object_db("denied");
        let outside = dir.join("outside.sqlite");
        let other = dir.join("o2.sqlite");
        rusqlite::Connection::open(&other)
            .unwrap()
            .execute_batch("CREATE TABLE secret (v); INSERT INTO secret VALUES ('s')")
            .unwrap();
        let escapes = [
            format!("ATTACH DATABASE '{}' AS x", outside.display()),
            format!("ATTACH DATABASE '{}' AS x", other.display()),
            format!("ATTACH 'file:{}?mode=rwc' AS x", outside.display()),
            format!("VACUUM INTO '{}'", outside.display()),
            "DETACH main".to_string(),
            "BEGIN".to_string(),
            "COMMIT".to_string(),
            "ROLLBACK".to_string(),
            "SAVEPOINT s".to_string(),
            "RELEASE s".to_string(),
            "PRAGMA journal_mode = DELETE".to_string(),
            "PRAGMA journal_mode".to_string(),
            "PRAGMA max_page_count = 2147483647".to_string(),
            "PRAGMA cache_size = -1000000".to_string(),
            "PRAGMA mmap_size = 1073741824".to_string(),
            "PRAGMA writable_schema = ON".to_string(),
            "PRAGMA synchronous = OFF".to_string(),
            "PRAGMA temp_store_directory = '/tmp'".to_string(),
            "PRAGMA main.user_version = 1; PRAGMA temp.user_version = 1".to_string(),
            "CREATE TEMP TABLE tt (x)".to_string(),
            "CREATE VIRTUAL TABLE v USING fts5(x)".to_string(),
            "SELECT load_extension('/nonexistent')".to_string(),
        ];
        for sql in &escapes {
            let (ran, denied) = as_app(&db, sql);
            assert!(!ran && denied, "{sql}: ran {ran}, denied {denied}");
        }
        assert!(!outside.exists(), "no file outside the object's database");
        // The node's own SQL is not restricted, and the database is as the node set it.
        db.execute_batch("BEGIN; INSERT INTO t VALUES (1); COMMIT;")
            .unwrap();
        let mode: String = db
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let attached: i64 = db
            .query_row(
                "SELECT COUNT(*) FROM pragma_database_list WHERE name NOT IN ('main', 'temp')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(attached, 0, "nothing attached");
        let temp: i64 = db
            .query_row("SELECT COUNT(*) FROM temp.sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert_eq!(temp, 0, "no temp table");
        let _ = std::fs::remove_dir_all(dir);
    }
}
