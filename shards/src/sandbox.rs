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
//!
//! The node's tables (`_combd_…`) are out of an app's reach, and so is anything the node's own
//! writes would run: `ALTER TABLE … RENAME` works on an app's tables (what SQLite's rename
//! reads and writes of the temp schema are let through, [`temp_schema`], its write of
//! `sqlite_sequence` ignored, [`renames_sequence`]), but an app's `CREATE`
//! or `ALTER` naming a node table anywhere in its text (a rename's new name, which the
//! authorizer is never told; a trigger's body; a foreign key) is denied as it starts
//! ([`statement_starts`]), a trigger on a node table is denied, and a database whose node
//! tables carry triggers is refused at open ([`check_node_tables`]).

mod text;

use std::cell::Cell;

use rusqlite::hooks::{AuthAction, AuthContext, Authorization};

thread_local! {
    /// Whether the SQL being prepared on this thread is an app's.
    static APP: Cell<bool> = const { Cell::new(false) };
    /// Whether an app statement was denied since the last [`take_denied`].
    static DENIED: Cell<bool> = const { Cell::new(false) };
    /// Whether an app's `ALTER TABLE` was authorized and has not started or ended yet: what
    /// SQLite's rename writes of `sqlite_sequence` is ignored until then ([`renames_sequence`]).
    static RENAMING: Cell<bool> = const { Cell::new(false) };
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
        RENAMING.with(|r| r.set(false));
        AppSql(())
    }
}

impl Drop for AppSql {
    fn drop(&mut self) {
        APP.with(|a| a.set(false));
        RENAMING.with(|r| r.set(false));
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

/// A statement starts on an object's connection (the watch's trace hook, `store::watch`, tells
/// it with the statement's text): whether to stop it. An app's `CREATE` or `ALTER` that names
/// a node table anywhere ([`text::names_a_node_table`]: a rename's new name, which the
/// authorizer is never told, a trigger's body, a foreign key) is denied here, before it
/// writes: the caller interrupts it, and the call fails with `sql_denied`. What SQLite's
/// rename writes itself was authorized while it was prepared, which this ends.
pub(crate) fn statement_starts<'a>(sql: impl FnOnce() -> &'a std::ffi::CStr) -> bool {
    RENAMING.with(|r| r.set(false));
    if !APP.with(|a| a.get()) {
        return false;
    }
    // A statement started while another runs is reported as `-- <its text>`.
    let sql = sql().to_string_lossy();
    let nested = sql.strip_prefix("-- ").unwrap_or_default();
    if !text::names_a_node_table(&sql) && !text::names_a_node_table(nested) {
        return false;
    }
    DENIED.with(|d| d.set(true));
    true
}

/// A statement ended on an object's connection (the watch's trace hook): a rename's window
/// ([`renames_sequence`]) closes with it, whether or not it was ever reported starting (a
/// statement prepared again after a schema change is not reported twice).
pub(crate) fn statement_ends() {
    RENAMING.with(|r| r.set(false));
}

/// Checks, as an object's database opens, that no trigger is on one of the node's tables:
/// the node's own writes would run it with the node's rights. An app cannot make one (the
/// authorizer denies a trigger on a node table, and a rename or trigger naming one), but a
/// database made otherwise, or before the node checked renames, is refused, naming it.
pub(crate) fn check_node_tables(db: &rusqlite::Connection) -> Result<(), String> {
    use rusqlite::OptionalExtension;
    let found: Option<(String, String)> = db
        .query_row(
            r"SELECT name, tbl_name FROM sqlite_master WHERE type = 'trigger'
                AND tbl_name LIKE '\_combd\_%' ESCAPE '\' LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(|e| e.to_string())?;
    match found {
        Some((trigger, table)) => Err(format!(
            "trigger {trigger:?} is on the node's table {table:?}, which apps may not have"
        )),
        None => Ok(()),
    }
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
    harden(db)?;
    db.authorizer(Some(authorize));
    Ok(())
}

/// Locks down the operator's read-only connection to an object (`crate::inspect`): as an
/// app's, and an authorizer that allows reading (the node's tables too) and nothing else.
pub(crate) fn read_only(db: &rusqlite::Connection) -> rusqlite::Result<()> {
    harden(db)?;
    db.authorizer(Some(authorize_read));
    Ok(())
}

/// What the operator's read-only query may do: select and read the main database, call
/// functions (not `load_extension`), and run the pragmas that read.
fn authorize_read(cx: AuthContext<'_>) -> Authorization {
    let main = matches!(cx.database_name, None | Some("main"));
    let allowed = match cx.action {
        AuthAction::Select | AuthAction::Recursive => true,
        AuthAction::Read { .. } => main,
        AuthAction::Function { function_name } => function_allowed(function_name),
        // Those that read (`user_version` set is refused: the connection is read-only).
        AuthAction::Pragma { pragma_name, .. } => main && pragma_allowed(pragma_name),
        _ => false,
    };
    match allowed {
        true => Authorization::Allow,
        false => Authorization::Deny,
    }
}

/// No attached databases, SQLite's defensive mode, an untrusted schema, no FTS3 tokenizer
/// function, no extension loading.
fn harden(db: &rusqlite::Connection) -> rusqlite::Result<()> {
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
    Ok(())
}

/// The authorizer: everything for the node's own SQL; for an app's, [`allowed`], and a
/// denial recorded for [`take_denied`]. What a rename of an app's table would write of
/// `sqlite_sequence` is ignored ([`renames_sequence`]).
fn authorize(cx: AuthContext<'_>) -> Authorization {
    if !APP.with(|a| a.get()) {
        return Authorization::Allow;
    }
    if renames_sequence(&cx) {
        return Authorization::Ignore;
    }
    if allowed(&cx) {
        return Authorization::Allow;
    }
    DENIED.with(|d| d.set(true));
    Authorization::Deny
}

/// The node's own tables in an object's database (its alarms, outbox and inbox:
/// `crate::alarms`), and anything an app could name like them (a view or an index that would
/// stand in for the node's).
fn node_table(t: &str) -> bool {
    t.get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("_combd_"))
}

/// `sqlite_sequence`, whose numbers the node's outbox relies on (a reset would make a
/// receiver take new messages for old ones).
fn sequence(t: &str) -> bool {
    t.eq_ignore_ascii_case("sqlite_sequence")
}

/// Whether an action names one of the node's tables (or `sqlite_sequence`, for a write).
fn touches_node_table(action: &AuthAction<'_>) -> bool {
    match *action {
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
    }
}

/// SQLite's own `ALTER TABLE … RENAME TO` renames the table's row of `sqlite_sequence` (a
/// statement of its own, authorized while the `ALTER` is prepared): that write is ignored, not
/// denied, so the rename works, and the row keeps its old name (a renamed `AUTOINCREMENT`
/// table goes on from its largest rowid). Allowing it instead would let an app's own statement
/// prepared in the same window (an `ALTER` that never runs, then an `UPDATE sqlite_sequence`)
/// rename the node's outbox's row; ignored, such a statement changes nothing either.
fn renames_sequence(cx: &AuthContext<'_>) -> bool {
    RENAMING.with(|r| r.get())
        && matches!(cx.action, AuthAction::Update { table_name, column_name }
            if sequence(table_name) && column_name == "name")
}

/// The temp schema, as SQLite's own rename reads and rewrites it (its triggers and views: an
/// app has none, it cannot make temporary objects). An app's own statement reading it reads
/// nothing; writing it is refused by SQLite (the schema tables are read-only without
/// `writable_schema`, which is denied).
fn temp_schema(cx: &AuthContext<'_>) -> bool {
    let schema = |t: &str| t.eq_ignore_ascii_case("sqlite_temp_master");
    cx.database_name == Some("temp")
        && match cx.action {
            AuthAction::Read { table_name, .. } | AuthAction::Update { table_name, .. } => {
                schema(table_name)
            }
            _ => false,
        }
}

/// Every SQL function but `load_extension` (off besides: [`lock_down`]).
fn function_allowed(name: &str) -> bool {
    !name.eq_ignore_ascii_case("load_extension")
}

/// A pragma of [`PRAGMAS_ALLOWED`].
fn pragma_allowed(name: &str) -> bool {
    PRAGMAS_ALLOWED.iter().any(|p| p.eq_ignore_ascii_case(name))
}

/// What an app's SQL may do.
fn allowed(cx: &AuthContext<'_>) -> bool {
    if temp_schema(cx) {
        return true;
    }
    if touches_node_table(&cx.action) {
        return false;
    }
    let main = matches!(cx.database_name, None | Some("main"));
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
        | AuthAction::Reindex { .. }
        | AuthAction::Analyze { .. } => main,
        AuthAction::AlterTable { database_name, .. } => {
            let main = database_name.eq_ignore_ascii_case("main");
            // What SQLite's rename then writes of `sqlite_sequence` is ignored until the
            // statement starts or ends.
            RENAMING.with(|r| r.set(main));
            main
        }
        AuthAction::Function { function_name } => function_allowed(function_name),
        AuthAction::Pragma { pragma_name, .. } => main && pragma_allowed(pragma_name),
        _ => false,
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
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
        crate::cells::watch::install(&db);
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
            "UPDATE sqlite_sequence SET name = 'x' WHERE name = '_combd_outbox'",
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

    /// The rows of `sql` as the node reads them, as text.
    fn rows(db: &rusqlite::Connection, sql: &str) -> Vec<String> {
        let mut st = db.prepare(sql).unwrap();
        let r = st
            .query_map([], |r| r.get::<_, rusqlite::types::Value>(0))
            .unwrap()
            .map(|v| format!("{:?}", v.unwrap()))
            .collect();
        r
    }

    #[test]
    fn an_apps_tables_are_renamed_with_their_data() {
        let (db, dir) = object_db("rename");
        // The node's outbox counts in `sqlite_sequence`, which a rename of an app's
        // AUTOINCREMENT table updates.
        db.execute_batch(crate::alarms::OUTBOX).unwrap();
        for sql in [
            "CREATE TABLE a (id INTEGER PRIMARY KEY AUTOINCREMENT, v)",
            "CREATE TABLE log (v)",
            "CREATE TRIGGER a_log AFTER INSERT ON a BEGIN INSERT INTO log VALUES (new.v); END",
            "INSERT INTO a (v) VALUES ('one')",
            "ALTER TABLE a RENAME TO b",
            "ALTER TABLE b RENAME COLUMN v TO w",
            "INSERT INTO b (w) VALUES ('two')",
            "ALTER TABLE b ADD COLUMN x DEFAULT 0",
            "ALTER TABLE b DROP COLUMN x",
        ] {
            assert_eq!(as_app(&db, sql), (true, false), "{sql}");
        }
        assert_eq!(
            rows(&db, "SELECT id || ':' || w FROM b ORDER BY id"),
            ["Text(\"1:one\")", "Text(\"2:two\")"],
            "the rows survive, the trigger follows"
        );
        assert_eq!(rows(&db, "SELECT v FROM log").len(), 2);
        // SQLite's own write of the sequence's name is ignored: the old row stays, and the
        // renamed table goes on from its largest rowid (the outbox has counted nothing yet).
        assert_eq!(
            rows(
                &db,
                "SELECT name || ':' || seq FROM sqlite_sequence ORDER BY name"
            ),
            ["Text(\"a:1\")", "Text(\"b:2\")"],
        );
        // The window of a rename closes with it: the sequence is the node's again.
        assert_eq!(
            as_app(
                &db,
                "UPDATE sqlite_sequence SET name = 'c' WHERE name = 'b'"
            ),
            (false, true)
        );
        // An ALTER prepared and never run leaves its window open until a statement starts or
        // ends: a write of the sequence prepared in it changes nothing.
        db.execute_batch(
            "INSERT INTO _combd_outbox (app, name, body, next_ms) VALUES ('x', 'y', x'', 0)",
        )
        .unwrap();
        {
            let _app = AppSql::enter();
            let never_run = db.prepare("ALTER TABLE b RENAME COLUMN w TO v").unwrap();
            let forged = db.execute(
                "UPDATE sqlite_sequence SET name = 'gone' WHERE name = '_combd_outbox'",
                [],
            );
            assert!(forged.is_ok(), "ignored, not denied: {forged:?}");
            drop(never_run);
        }
        assert!(!take_denied());
        assert_eq!(
            rows(
                &db,
                "SELECT seq FROM sqlite_sequence WHERE name = '_combd_outbox'"
            ),
            ["Integer(1)"]
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_rename_into_the_nodes_names_and_triggers_reaching_them_are_denied() {
        let (db, dir) = object_db("rename-node");
        db.execute_batch(crate::alarms::OUTBOX).unwrap();
        for sql in [
            "CREATE TABLE x (app TEXT, name TEXT, last_id INTEGER)",
            "CREATE TABLE log (v)",
            "CREATE TRIGGER x_t AFTER INSERT ON x BEGIN INSERT INTO log VALUES (new.app); END",
            "INSERT INTO x VALUES ('forged', 'sender', 99)",
        ] {
            assert_eq!(as_app(&db, sql), (true, false), "{sql}");
        }
        for sql in [
            "ALTER TABLE x RENAME TO _combd_inbox",
            "ALTER TABLE main.x RENAME TO \"_COMBD_inbox\"",
            "ALTER TABLE x RENAME TO [_combd_alarms]",
            "ALTER TABLE x RENAME TO '_combd_future'",
            "ALTER TABLE x ADD COLUMN r REFERENCES _combd_outbox(id)",
            "CREATE TRIGGER w AFTER INSERT ON log BEGIN DELETE FROM _combd_outbox; END",
            "CREATE TRIGGER w AFTER INSERT ON log BEGIN UPDATE \"_combd_outbox\" SET tries = 0; END",
            "CREATE TRIGGER w AFTER INSERT ON _combd_outbox BEGIN SELECT 1; END",
            "CREATE TABLE y (r INTEGER REFERENCES _combd_outbox(id) ON DELETE CASCADE)",
        ] {
            assert_eq!(as_app(&db, sql), (false, true), "{sql}");
        }
        // SQLite keeps `sqlite_` names for itself (an error, before the authorizer is asked).
        assert!(!as_app(&db, "ALTER TABLE x RENAME TO sqlite_x").0);
        assert_eq!(
            rows(&db, "SELECT name FROM sqlite_master ORDER BY name"),
            [
                "Text(\"_combd_outbox\")",
                "Text(\"_combd_outbox_to\")",
                "Text(\"log\")",
                "Text(\"sqlite_sequence\")",
                "Text(\"t\")",
                "Text(\"x\")",
                "Text(\"x_t\")",
            ],
            "nothing renamed, nothing made"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_database_whose_node_tables_carry_triggers_is_refused() {
        let (db, dir) = object_db("node-trigger");
        db.execute_batch(crate::alarms::OUTBOX).unwrap();
        db.execute_batch(
            "CREATE TABLE log (v); \
             CREATE TRIGGER app_t AFTER INSERT ON log BEGIN SELECT 1; END",
        )
        .unwrap();
        assert_eq!(check_node_tables(&db), Ok(()));
        // As a rename the node did not check would leave it.
        db.execute_batch(
            "CREATE TRIGGER planted AFTER DELETE ON _combd_outbox \
             BEGIN INSERT INTO log VALUES (old.id); END",
        )
        .unwrap();
        let e = check_node_tables(&db).unwrap_err();
        assert!(
            e.contains("\"planted\"") && e.contains("_combd_outbox"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
