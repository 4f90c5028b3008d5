//! The operator's look into objects, on the localhost listener only (as `/stats`), and what
//! `combd objects` calls:
//!
//! | request | answer |
//! |---|---|
//! | `GET /objects` | each app and how many objects it has |
//! | `GET /objects/<app>[?after=<name>&limit=<n>]` | a page of the app's objects, by name: size, last write, pending alarms and messages, live or not; `next` names the page after |
//! | `GET /objects/<app>/<name>` | one object: the same, and its tables with their rows |
//! | `POST /objects/<app>/<name>/sql` | a read-only query (the body, one statement): its columns and rows |
//! | `DELETE /objects/<app>/<name>` | deletes the object (through its mailbox, as `cx.delete()` does) |
//! | `POST /objects/<app>/<name>/restore?at=<…>[&as=<name>]` | restores the object from the backup, in place or into a new name (through the mailbox of the one restored into) |
//! | `GET /objects/<app>/<name>/backup` | the object's bases and last batches in the backup |
//!
//! Everything but the delete reads the object's files on a blocking thread, on a connection of
//! its own opened read-only ([`open_read_only`]): in WAL mode a reader never blocks the
//! object's writer, and sees its last commit. The query runs under an authorizer that allows
//! reading and nothing else (no write, attach, transaction, or pragma but those that read), with
//! SQLite's defensive settings, within [`OBJECT_SQL_TIME_LIMIT`], [`OBJECT_SQL_ROWS_MAX`] rows
//! and [`OBJECT_SQL_ANSWER_MAX_BYTES`]. The node's own tables (`_combd_…`: alarms, outbox,
//! inbox, the topics' logs) may be read: it is the operator asking, not an app.
//!
//! In a fleet each node sees the files it holds: the objects it owns or owned last.

use std::path::Path;
use std::time::Instant;

use combd_kernel::limits::{
    OBJECT_LIST_PAGE, OBJECT_LIST_PAGE_MAX, OBJECT_SQL_ANSWER_MAX_BYTES, OBJECT_SQL_ROWS_MAX,
    OBJECT_SQL_TIME_LIMIT,
};
use rusqlite::types::ValueRef;
use serde_json::{json, Value};

use crate::app::{valid_object_name, Apps};
use crate::http::{Request, Response};
use crate::object_files::FileFacts;
use crate::shared::NodeShared;

/// The path under which the operator's requests are served.
pub const PATH: &str = "/objects";

/// What the operator asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ask {
    Apps,
    List {
        app: String,
        after: Option<String>,
        limit: usize,
    },
    Show {
        app: String,
        name: String,
    },
    Sql {
        app: String,
        name: String,
        sql: String,
    },
    Delete {
        app: String,
        name: String,
    },
    /// Restore `name` (from its backup) as of `at`, into `into` (itself, or a new name).
    Restore {
        app: String,
        name: String,
        at: crate::backup::restore::At,
        into: String,
    },
    /// The object's batches in the backup.
    History {
        app: String,
        name: String,
    },
}

fn not_allowed(allow: &'static str) -> Response {
    Response::error(405, "method not allowed").with_header("allow", allow)
}

impl Ask {
    /// What a request under [`PATH`] asks; the error to answer for one that is not a request
    /// of this surface (an unknown app: 404; a bad name, page or query: 400; a method the path
    /// does not take: 405).
    pub fn of(req: &Request<'_>, apps: &Apps) -> Result<Ask, Response> {
        let rest = req.path.strip_prefix(PATH).unwrap_or_default();
        let parts: Vec<&str> = rest.split('/').skip(1).collect();
        let read = matches!(req.method, "GET" | "HEAD");
        let app = |name: &str| match apps.get(name) {
            Some(app) => Ok(app.name().to_string()),
            None => Err(Response::error(404, "no such app")),
        };
        let object = |name: &str| match valid_object_name(name) {
            true => Ok(name.to_string()),
            false => Err(Response::error(400, "invalid object name")),
        };
        match (parts.as_slice(), req.method) {
            ([] | [""], _) if read => Ok(Ask::Apps),
            ([] | [""], _) => Err(not_allowed("GET, HEAD")),
            ([a], _) if read => {
                let (after, limit) = page(req.query)?;
                Ok(Ask::List {
                    app: app(a)?,
                    after,
                    limit,
                })
            }
            ([_], _) => Err(not_allowed("GET, HEAD")),
            ([a, n], _) if read => Ok(Ask::Show {
                app: app(a)?,
                name: object(n)?,
            }),
            ([a, n], "DELETE") => Ok(Ask::Delete {
                app: app(a)?,
                name: object(n)?,
            }),
            ([_, _], _) => Err(not_allowed("GET, HEAD, DELETE")),
            ([a, n, "sql"], "POST") => {
                let sql = std::str::from_utf8(req.body)
                    .map_err(|_| Response::error(400, "the query is not UTF-8"))?;
                let sql = sql.trim().to_string();
                if sql.is_empty() {
                    return Err(Response::error(
                        400,
                        "no query: send one statement as the body",
                    ));
                }
                Ok(Ask::Sql {
                    app: app(a)?,
                    name: object(n)?,
                    sql,
                })
            }
            ([_, _, "sql"], _) => Err(not_allowed("POST")),
            ([a, n, "restore"], "POST") => {
                let (at, into) = restore_query(req.query, n)?;
                Ok(Ask::Restore {
                    app: app(a)?,
                    name: object(n)?,
                    at,
                    into,
                })
            }
            ([_, _, "restore"], _) => Err(not_allowed("POST")),
            ([a, n, "backup"], _) if read => Ok(Ask::History {
                app: app(a)?,
                name: object(n)?,
            }),
            ([_, _, "backup"], _) => Err(not_allowed("GET, HEAD")),
            _ => Err(Response::error(404, "not found")),
        }
    }
}

/// A listing's `after` and `limit` ([`OBJECT_LIST_PAGE`] unless asked, at most
/// [`OBJECT_LIST_PAGE_MAX`]).
fn page(query: Option<&str>) -> Result<(Option<String>, usize), Response> {
    let (mut after, mut limit) = (None, OBJECT_LIST_PAGE);
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("after", v) if valid_object_name(v) => after = Some(v.to_string()),
            ("after", _) => return Err(Response::error(400, "after: not an object name")),
            ("limit", v) => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=OBJECT_LIST_PAGE_MAX).contains(n))
                    .ok_or_else(|| {
                        let e =
                            format!("limit: 1 to {OBJECT_LIST_PAGE_MAX} (object_list_page_max)");
                        Response::error(400, &e)
                    })?;
            }
            _ => {}
        }
    }
    Ok((after, limit))
}

/// The answer to what the operator asked, but a delete (which goes through the object's
/// mailbox). Blocks: run it on a blocking thread.
pub(crate) fn answer(node: &NodeShared, ask: Ask) -> Response {
    match ask {
        Ask::Apps => apps(node),
        Ask::List { app, after, limit } => list(node, &app, after.as_deref(), limit),
        Ask::Show { app, name } => show(node, &app, &name),
        Ask::Sql { app, name, sql } => query(node, &app, &name, &sql),
        Ask::History { app, name } => history(node, &app, &name),
        Ask::Delete { .. } | Ask::Restore { .. } => {
            Response::error(500, "a delete or restore goes through the object's mailbox")
        }
    }
}

/// A restore's `at` (required: `latest`, a batch's number or an RFC 3339 time) and `as` (the
/// name restored into: the object's own by default).
fn restore_query(
    query: Option<&str>,
    name: &str,
) -> Result<(crate::backup::restore::At, String), Response> {
    let (mut at, mut into) = (None, name.to_string());
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("at", v) => {
                let v = v
                    .replace("%3A", ":")
                    .replace("%3a", ":")
                    .replace("%2B", "+");
                at = Some(
                    crate::backup::restore::At::parse(&v)
                        .map_err(|e| Response::error(400, &format!("at: {e}")))?,
                );
            }
            ("as", v) if valid_object_name(v) => into = v.to_string(),
            ("as", _) => return Err(Response::error(400, "as: not an object name")),
            _ => {}
        }
    }
    let at = at.ok_or_else(|| {
        Response::error(400, "at=: latest, a batch's number, or an RFC 3339 time")
    })?;
    Ok((at, into))
}

/// `GET /objects/<app>/<name>/backup`: the object's bases and last batches in the backup. Blocks.
fn history(node: &NodeShared, app: &str, name: &str) -> Response {
    let Some(backup) = &node.backup else {
        return Response::error(409, "COMBD_BACKUP is off");
    };
    let key = crate::object_key::ObjectKey::new(app, name);
    match crate::backup::restore::history(backup.target(), &key, OBJECT_LIST_PAGE_MAX) {
        Ok(v) => Response::json(200, &v),
        Err(e) => unreadable(&e),
    }
}

/// `GET /objects`: each app and its objects (with the places reserved for ones being made).
pub(crate) fn apps(node: &NodeShared) -> Response {
    let apps: Vec<Value> = node
        .apps
        .names()
        .into_iter()
        .map(|app| json!({ "app": app, "objects": node.objects.get(app) }))
        .collect();
    Response::json(200, &json!({ "apps": apps }))
}

/// `GET /objects/<app>`: a page of the app's objects. Blocks.
pub(crate) fn list(node: &NodeShared, app: &str, after: Option<&str>, limit: usize) -> Response {
    let data = &node.settings.data_dir;
    let (names, more) = match crate::object_files::names(data, app, after, limit) {
        Ok(found) => found,
        Err(e) => return unreadable(&e),
    };
    let objects: Vec<Value> = names
        .iter()
        .filter_map(|name| facts(node, app, name))
        .collect();
    let next = more.then(|| names.last().cloned()).flatten();
    Response::json(
        200,
        &json!({ "app": app, "objects": objects, "next": next }),
    )
}

/// `GET /objects/<app>/<name>`: one object, with its tables. Blocks.
pub(crate) fn show(node: &NodeShared, app: &str, name: &str) -> Response {
    let Some(mut object) = facts(node, app, name) else {
        return Response::error(404, "no such object");
    };
    let path = crate::app::object_path(&node.settings.data_dir, app, name);
    match open_read_only(&path).and_then(|db| tables(&db)) {
        Ok(t) => object["tables"] = t,
        Err(e) => return unreadable(&e),
    }
    Response::json(200, &object)
}

/// What the operator's listing says of one object: its files, what it has pending, whether it
/// is live. `None` when it has no database (or it went while being read).
fn facts(node: &NodeShared, app: &str, name: &str) -> Option<Value> {
    let path = crate::app::object_path(&node.settings.data_dir, app, name);
    let files = FileFacts::of(&path)?;
    let pending = open_read_only(&path).and_then(|db| pending(&db));
    let (alarms, outbox, deleting) = match pending {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(object = %format!("{app}/{name}"), "cannot read: {e}");
            (None, None, false)
        }
    };
    Some(json!({
        "name": name,
        "bytes": files.db_bytes + files.wal_bytes,
        "db_bytes": files.db_bytes,
        "wal_bytes": files.wal_bytes,
        "written_ms": files.written_ms,
        "alarms": alarms,
        "outbox": outbox,
        "deleting": deleting,
        "live": node.live.is_live(&format!("{app}/{name}")),
    }))
}

/// An object's alarms and undelivered messages (`None`: it has no such table), and whether it
/// is marked deleted.
fn pending(db: &rusqlite::Connection) -> rusqlite::Result<(Option<u64>, Option<u64>, bool)> {
    let count = |table: &str| -> rusqlite::Result<Option<u64>> {
        if !crate::alarms::has(db, table)? {
            return Ok(None);
        }
        db.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .map(|n: i64| Some(n.max(0) as u64))
    };
    let deleting = crate::object_files::marked(db)?;
    Ok((count("_combd_alarms")?, count("_combd_outbox")?, deleting))
}

/// The database's tables with their rows (the node's marked `node`), its schema number
/// (`user_version`) and its page size and count.
fn tables(db: &rusqlite::Connection) -> rusqlite::Result<Value> {
    let names: Vec<String> = db
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' \
             ESCAPE '\\' ORDER BY name",
        )?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut list = Vec::with_capacity(names.len());
    for name in names {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        let rows: i64 =
            db.query_row(&format!("SELECT count(*) FROM {quoted}"), [], |r| r.get(0))?;
        let node = name.to_ascii_lowercase().starts_with("_combd_");
        list.push(json!({ "name": name, "rows": rows, "node": node }));
    }
    let pragma = |p: &str| db.query_row(&format!("PRAGMA {p}"), [], |r| r.get::<_, i64>(0));
    Ok(json!({
        "list": list,
        "user_version": pragma("user_version")?,
        "page_size": pragma("page_size")?,
        "page_count": pragma("page_count")?,
    }))
}

/// `POST /objects/<app>/<name>/sql`: the query's columns and rows, read-only. Blocks.
pub(crate) fn query(node: &NodeShared, app: &str, name: &str, sql: &str) -> Response {
    let path = crate::app::object_path(&node.settings.data_dir, app, name);
    if FileFacts::of(&path).is_none() {
        return Response::error(404, "no such object");
    }
    let db = match open_read_only(&path) {
        Ok(db) => db,
        Err(e) => return unreadable(&e),
    };
    let deadline = Instant::now() + OBJECT_SQL_TIME_LIMIT;
    db.progress_handler(1_000, Some(move || Instant::now() > deadline));
    match run_query(&db, sql) {
        Ok(answer) => Response::json(200, &answer),
        Err(e) => sql_refused(&e),
    }
}

/// Runs one statement, collecting its rows within the bounds.
fn run_query(db: &rusqlite::Connection, sql: &str) -> rusqlite::Result<Value> {
    let mut stmt = db.prepare(sql)?;
    // SQLite keeps the text of the one statement it prepared (with no parameter bound, as
    // written): anything past it is another.
    let tail = stmt
        .expanded_sql()
        .and_then(|first| sql.get(first.len()..).map(str::to_string))
        .unwrap_or_default();
    if !tail
        .trim_matches(|c: char| c == ';' || c.is_whitespace())
        .is_empty()
    {
        return Err(rusqlite::Error::MultipleStatement);
    }
    if !stmt.readonly() {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
            Some("the query would write".into()),
        ));
    }
    let columns: Vec<String> = stmt.column_names().into_iter().map(String::from).collect();
    let n = columns.len();
    let (mut rows, mut bytes, mut truncated) = (Vec::new(), 0usize, false);
    let mut found = stmt.query([])?;
    while let Some(row) = found.next()? {
        if rows.len() == OBJECT_SQL_ROWS_MAX || bytes > OBJECT_SQL_ANSWER_MAX_BYTES {
            truncated = true;
            break;
        }
        let mut values = Vec::with_capacity(n);
        for i in 0..n {
            let (v, size) = value(row.get_ref(i)?);
            bytes += size;
            values.push(v);
        }
        rows.push(Value::Array(values));
    }
    Ok(json!({ "columns": columns, "rows": rows, "truncated": truncated }))
}

/// A column's value as JSON (a blob as `{"hex": …}`), and its size for the answer's bound.
fn value(v: ValueRef<'_>) -> (Value, usize) {
    match v {
        ValueRef::Null => (Value::Null, 4),
        ValueRef::Integer(i) => (json!(i), 8),
        ValueRef::Real(f) => (json!(f), 8),
        ValueRef::Text(t) => (json!(String::from_utf8_lossy(t)), t.len()),
        ValueRef::Blob(b) => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            (json!({ "hex": hex }), hex.len())
        }
    }
}

/// The answer to a query SQLite refused or stopped.
fn sql_refused(e: &rusqlite::Error) -> Response {
    use rusqlite::ffi::ErrorCode;
    let (status, error) = match e.sqlite_error_code() {
        Some(ErrorCode::OperationInterrupted) => (408, "query time limit"),
        Some(ErrorCode::AuthorizationForStatementDenied | ErrorCode::ReadOnly) => {
            (403, "the query may only read")
        }
        _ if matches!(e, rusqlite::Error::MultipleStatement) => (400, "one statement at a time"),
        _ => (400, "sql error"),
    };
    let detail = match status {
        408 => format!(
            "stopped after {} ms (object_sql_time_limit_ms)",
            OBJECT_SQL_TIME_LIMIT.as_millis()
        ),
        _ => e.to_string(),
    };
    Response::json(status, &json!({ "error": error, "detail": detail }))
}

/// A 500 for an object's files that could not be read.
fn unreadable(e: &dyn std::fmt::Display) -> Response {
    Response::json(
        500,
        &json!({ "error": "cannot read the object", "detail": e.to_string() }),
    )
}

/// Opens an object's database read-only, on a connection of its own, locked down for reading
/// (`crate::sandbox::read_only`). It creates nothing: a database that is not there is an
/// error. Blocks.
pub(crate) fn open_read_only(path: &Path) -> rusqlite::Result<rusqlite::Connection> {
    use rusqlite::OpenFlags;
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let db = rusqlite::Connection::open_with_flags(path, flags)?;
    db.busy_timeout(std::time::Duration::from_millis(100))?;
    db.execute_batch("PRAGMA query_only = ON;")?;
    crate::sandbox::read_only(&db)?;
    Ok(db)
}
