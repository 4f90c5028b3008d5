//! Hostile modules against the real node: a module's SQL reaches its own object's database
//! and nothing else, its sends reach its own object's sessions only, and its statuses cannot
//! desynchronise a client. Each escape fails with a clear error and changes nothing outside
//! the object.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::PathBuf;

use support::*;
use tungstenite::Message;

const SQLRUN: &str = include_str!("wasm/sqlrun.wat");

/// A module that, on `POST`, sends "pwned" to sessions 0 to 63 of shard 0, whatever they are
/// attached to, then answers `{}`; and on a respond status given as the body's decimal digits,
/// answers with that status.
const SPRAY: &str = r#"(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (import "combd" "send" (func $send (param i32 i64 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "pwned")
  (data (i32.const 32) "{}")
  (func (export "handle") (result i32)
    (local $i i64) (local $n i32) (local $status i32) (local $k i32) (local $end i64)
    (local.set $n (call $input (i32.const 0) (i32.const 256) (i32.const 16)))
    (if (i32.gt_s (local.get $n) (i32.const 0))
      (then
        (loop $digits
          (local.set $status (i32.add (i32.mul (local.get $status) (i32.const 10))
            (i32.sub (i32.load8_u (i32.add (i32.const 256) (local.get $k))) (i32.const 48))))
          (local.set $k (i32.add (local.get $k) (i32.const 1)))
          (br_if $digits (i32.lt_s (local.get $k) (local.get $n))))
        (call $respond (local.get $status) (i32.const 32) (i32.const 2))
        (return (i32.const 0))))
    ;; The first session id to spray: the query's digits (0 without).
    (local.set $n (call $input (i32.const 1) (i32.const 512) (i32.const 20)))
    (if (i32.gt_s (local.get $n) (i32.const 0))
      (then
        (loop $q
          (local.set $i (i64.add (i64.mul (local.get $i) (i64.const 10))
            (i64.extend_i32_u (i32.sub (i32.load8_u (i32.add (i32.const 512) (local.get $k))) (i32.const 48)))))
          (local.set $k (i32.add (local.get $k) (i32.const 1)))
          (br_if $q (i32.lt_s (local.get $k) (local.get $n))))))
    (local.set $end (i64.add (local.get $i) (i64.const 64)))
    (loop $each
      (drop (call $send (i32.const 0) (local.get $i) (i32.const 16) (i32.const 5)))
      (local.set $i (i64.add (local.get $i) (i64.const 1)))
      (br_if $each (i64.lt_u (local.get $i) (local.get $end))))
    (call $respond (i32.const 200) (i32.const 32) (i32.const 2))
    (i32.const 0))
)"#;

/// A module of 1 MiB that binds a 64 KiB parameter 4,096 times (256 MiB) and runs no
/// statement, then answers `{}`.
const BINDER: &str = r#"(module
  (import "combd" "sql_bind_blob" (func $blob (param i32 i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 2)
  (data (i32.const 0) "{}")
  (func (export "memory_kb") (result i32) (i32.const 1024))
  (func (export "handle") (result i32)
    (local $i i32)
    (local.set $i (i32.const 4096))
    (loop $bind
      (call $blob (i32.const 0) (i32.const 65536))
      (br_if $bind (local.tee $i (i32.sub (local.get $i) (i32.const 1)))))
    (call $respond (i32.const 200) (i32.const 0) (i32.const 2))
    (i32.const 0))
)"#;

/// A module whose schema is a statement that never ends (a count of endless rows).
const FOREVER: &str = r#"(module
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "SELECT count(*) FROM (WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT i FROM c);\00")
  (data (i32.const 200) "{}")
  (func (export "schema") (result i32) (i32.const 0))
  (func (export "handle") (result i32)
    (call $respond (i32.const 200) (i32.const 200) (i32.const 2))
    (i32.const 0))
)"#;

fn apps_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("combd-sandbox-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("sqlrun.wat"), SQLRUN).unwrap();
    std::fs::write(dir.join("spray.wat"), SPRAY).unwrap();
    std::fs::write(dir.join("binder.wat"), BINDER).unwrap();
    std::fs::write(dir.join("forever.wat"), FOREVER).unwrap();
    dir
}

fn node(tag: &str) -> TestNode {
    let dir = apps_dir(tag);
    TestNode::start(&[
        ("COMBD_APPS_DIR", dir.to_str().unwrap()),
        ("COMBD_SHARDS", "1"),
    ])
}

/// Runs `sql` in object `o` of the sqlrun module.
fn run(node: &TestNode, o: &str, sql: &str) -> Resp {
    post(node, &format!("/o/sqlrun/{o}"), sql)
}

fn count(node: &TestNode, o: &str) -> i64 {
    let r = run(node, o, "SELECT * FROM t");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["n"].as_i64().unwrap()
}

#[test]
fn a_modules_sql_reaches_its_own_database_and_nothing_else() {
    let node = node("sql");
    // What an app needs works.
    for sql in [
        "INSERT INTO t VALUES ('a')",
        "CREATE TABLE IF NOT EXISTS u (x)",
        "PRAGMA table_info(t)",
        "PRAGMA user_version = 2",
    ] {
        let r = run(&node, "a", sql);
        assert_eq!(r.status, 200, "{sql}: {}", r.text());
        assert!(r.json()["n"].as_i64().unwrap() >= 0, "{sql}");
    }
    assert_eq!(count(&node, "a"), 1);
    // Another app's database, and one of the same app's other objects.
    assert_eq!(post(&node, "/o/counter/victim", "").status, 200);
    assert_eq!(run(&node, "b", "INSERT INTO t VALUES ('b')").status, 200);
    let outside = std::env::temp_dir().join(format!("combd-pwn-{}.sqlite", std::process::id()));
    let _ = std::fs::remove_file(&outside);
    let victim = node.data_dir.join("objects/counter/victim.sqlite");
    let sibling = node.data_dir.join("objects/sqlrun/b.sqlite");
    let escapes = [
        format!("ATTACH DATABASE '{}' AS x", outside.display()),
        format!("ATTACH DATABASE '{}' AS x", victim.display()),
        format!("ATTACH DATABASE '{}' AS x", sibling.display()),
        "COMMIT".to_string(),
        "BEGIN".to_string(),
        "SAVEPOINT s".to_string(),
        "ROLLBACK".to_string(),
        "PRAGMA journal_mode = DELETE".to_string(),
        "PRAGMA max_page_count = 2147483647".to_string(),
        "PRAGMA cache_size = -1000000".to_string(),
        "PRAGMA mmap_size = 1073741824".to_string(),
        "PRAGMA writable_schema = ON".to_string(),
        "CREATE TEMP TABLE tt (x)".to_string(),
        "SELECT load_extension('/nonexistent')".to_string(),
    ];
    // VACUUM INTO writes a copy anywhere: inside the call's transaction SQLite refuses it
    // before the authorizer sees it (the module sees -1), and outside one it would attach its
    // target, which is denied (`cells/sandbox.rs`'s tests).
    let vacuum = run(&node, "a", &format!("VACUUM INTO '{}'", outside.display()));
    assert_eq!(
        (vacuum.status, vacuum.json()["n"].as_i64()),
        (200, Some(-1))
    );
    for sql in &escapes {
        let r = run(&node, "a", sql);
        assert_eq!(
            (r.status, r.json()["error"].as_str().unwrap_or("")),
            (500, "sql_denied"),
            "{sql}: {}",
            r.text()
        );
    }
    assert!(!outside.exists(), "a file outside the data directory");
    assert_eq!(count(&node, "a"), 1, "nothing of the denied calls applied");
    assert_eq!(count(&node, "b"), 1);
    assert_eq!(
        get(&node, "/o/counter/victim").json()["value"],
        1,
        "the other app's object as it was"
    );
    let s = node.stats();
    assert_eq!(s["sql_denied"].as_u64().unwrap(), escapes.len() as u64);
    // The object's database is still in WAL mode: its next write commits and is kept.
    assert_eq!(run(&node, "a", "INSERT INTO t VALUES ('c')").status, 200);
    assert_eq!(count(&node, "a"), 2);
    let db = rusqlite::Connection::open(node.data_dir.join("objects/sqlrun/a.sqlite")).unwrap();
    let mode: String = db
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    let _ = std::fs::remove_file(&outside);
}

#[test]
fn a_modules_sends_reach_only_its_own_objects_sessions() {
    let dir = apps_dir("sends");
    let node = TestNode::start(&[
        ("COMBD_APPS_DIR", dir.to_str().unwrap()),
        ("COMBD_SHARDS", "1"),
        TEST_APPS,
    ]);
    // A session of the test app `caller` says which ids the shard is at (its hello), and the
    // next session is the one after it.
    let mut marker = open_ws(&node, "/o/caller/m");
    let first: u64 = read_json(&mut marker)["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    // A viewer of another app's board: the session after the marker's.
    let mut ws = open_ws(&node, "/o/million/victim?page=0");
    let page = read_json(&mut ws);
    assert_eq!(page["t"], "page", "{page}");
    // The module sprays sends at 64 ids from a little before the marker's.
    let r = post(
        &node,
        &format!("/o/spray/x?{}", first.saturating_sub(8)),
        "",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        node.stats()["sends_foreign_dropped"].as_u64().unwrap(),
        2,
        "the marker's and the viewer's"
    );
    // The viewer hears its own board next (its click's update), never the spray.
    ws.send(Message::text(r#"{"t":"click","i":7,"c":1}"#))
        .unwrap();
    loop {
        match ws.read().unwrap() {
            Message::Text(t) => {
                assert!(
                    !t.contains("pwned"),
                    "another app wrote into this WebSocket"
                );
                let m: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                if m["t"] == "set" {
                    break;
                }
            }
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[test]
fn a_module_cannot_answer_a_status_without_a_body() {
    let node = node("status");
    for status in ["101", "204", "304", "99", "600"] {
        let mut s = connect(node.public());
        use std::io::Write;
        // The answer, then a pipelined request: its response must come next, whole.
        write!(
            s,
            "POST /o/spray/s HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{status}\
             GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
            status.len()
        )
        .unwrap();
        let mut r = std::io::BufReader::new(s);
        let first = read_response(&mut r);
        assert_eq!(first.status, 500, "status {status}: {}", first.text());
        assert!(
            first.text().contains("respond takes 200 to 599"),
            "{}",
            first.text()
        );
        assert_eq!(read_response(&mut r).status, 200, "status {status}");
    }
    let r = post(&node, "/o/spray/s", "201");
    assert_eq!(r.status, 201);
}

/// A module file that is not a regular file (here a link to `/dev/zero`, which would read for
/// ever) stops the start naming it, and an apps directory set explicitly that does not exist
/// stops it too: exit 78, nothing deployed without a word.
#[test]
fn module_files_must_be_regular_and_an_explicit_apps_directory_must_exist() {
    let dir = std::env::temp_dir().join(format!("combd-sandbox-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.wasm")).unwrap();
    let data = std::env::temp_dir().join(format!("combd-sandbox-data-{}", std::process::id()));
    let stderr = refused(&mut combd_command(
        &data,
        &[("COMBD_APPS_DIR", dir.to_str().unwrap())],
    ));
    assert!(stderr.contains("zero.wasm"), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");

    let missing = dir.join("no-such-directory");
    let stderr = refused(&mut combd_command(
        &data,
        &[("COMBD_APPS_DIR", missing.to_str().unwrap())],
    ));
    assert!(stderr.contains("COMBD_APPS_DIR"), "{stderr}");
    assert!(stderr.contains("is not a directory"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&data);
}

/// A statement whose rows would not fit the module's memory is stopped while its rows are
/// read (each row a tick, its memory checked as it is held), not after all are buffered:
/// 500 `memory_limit` (the module may hold 2 MiB), and the node's memory grows by about that,
/// not by the rows SQLite could produce in the statement's time.
#[test]
fn a_statement_returning_endless_rows_is_stopped_at_the_modules_memory() {
    let node = node("rows");
    let base = rss(node.pid());
    let r = run(
        &node,
        "a",
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) \
         SELECT i, zeroblob(1000) FROM c",
    );
    assert_eq!(
        (r.status, r.json()["error"].as_str().unwrap_or("")),
        (500, "memory_limit"),
        "{}",
        r.text()
    );
    let grew = rss(node.pid()).saturating_sub(base);
    assert!(grew < 256 << 20, "the node grew by {grew} bytes");
    assert_eq!(count(&node, "a"), 0, "the object still answers");
}

/// A module may ask for at most `COMBD_MODULE_MEMORY_MAX` with `memory_kb()`: sqlrun asks for
/// 2 MiB, and with the ceiling at 1 MiB the start stops naming the setting and the file; with
/// the default it loads (`a_modules_sql_reaches_its_own_database_and_nothing_else`).
#[test]
fn a_module_asking_more_memory_than_the_node_allows_is_refused() {
    let dir = apps_dir("memory-max");
    let data = std::env::temp_dir().join(format!("combd-sandbox-mem-{}", std::process::id()));
    let stderr = refused(&mut combd_command(
        &data,
        &[
            ("COMBD_APPS_DIR", dir.to_str().unwrap()),
            ("COMBD_MODULE_MEMORY_MAX", "1M"),
        ],
    ));
    assert!(stderr.contains("COMBD_MODULE_MEMORY_MAX"), "{stderr}");
    assert!(stderr.contains("sqlrun.wat"), "{stderr}");
    let stderr = refused(&mut combd_command(
        &data,
        &[("COMBD_MODULE_MEMORY_MAX", "0")],
    ));
    assert!(stderr.contains("COMBD_MODULE_MEMORY_MAX"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&data);
}

/// Parameters a module binds are held for it like its rows: binding past its memory limit
/// stops the call with 500 `memory_limit` while it binds, and the node's peak memory grows by
/// about the module's limit, not by the 256 MiB it asked to hold (found by the
/// `host_imports` fuzz target: a 1 MiB module held 1.6 GB until its fuel ran out).
#[test]
fn parameters_bound_past_the_modules_memory_stop_the_call() {
    let node = node("binds");
    let peak = |pid: i32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kb * 1024
    };
    // Warm: the module compiled and an object of it opened once.
    assert_eq!(post(&node, "/o/binder/warm", "").status, 500);
    // The peak starts again from what the node holds now.
    std::fs::write(format!("/proc/{}/clear_refs", node.pid()), "5").unwrap();
    let base = rss(node.pid());
    let r = post(&node, "/o/binder/a", "");
    assert_eq!(
        (r.status, r.json()["error"].as_str().unwrap_or("")),
        (500, "memory_limit"),
        "{}",
        r.text()
    );
    let grew = peak(node.pid()).saturating_sub(base);
    assert!(grew < 32 << 20, "the node's peak grew by {grew} bytes");
    assert!(node.stats()["memory_limit_killed"].as_u64().unwrap() >= 2);
}

/// A schema is app SQL under the calls' watch: a statement of it that never ends is stopped
/// (`sql_timeout`), the object's open fails, and the node goes on opening objects (found by
/// the `host_imports` fuzz target: unwatched, such a schema held each open for ever, and with
/// the four restores a shard runs at once taken, no object of any app opened again).
#[test]
fn a_schema_that_never_ends_is_stopped_and_objects_still_open() {
    let node = node("forever");
    let opens: Vec<_> = (0..6)
        .map(|i| {
            let addr = node.public();
            std::thread::spawn(move || {
                let r = request_from(
                    client_address(i),
                    addr,
                    format!(
                        "POST /o/forever/o{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\
                         Connection: close\r\n\r\n"
                    )
                    .as_bytes(),
                );
                r.status
            })
        })
        .collect();
    for o in opens {
        assert_eq!(o.join().unwrap(), 500, "an open of the endless schema");
    }
    assert_eq!(post(&node, "/o/counter/after", "").status, 200);
    assert_eq!(node.stats()["restores_active"], 0);
}

/// A module renames its own tables and their columns (issue 40: every app rename was refused,
/// by accident: SQLite's rename writes the temp schema, which the authorizer refused), its rows
/// kept; a rename into the node's names (`_combd_…`, which the node would then write as its
/// own, running the table's triggers with the node's rights), a trigger whose body writes one
/// and a foreign key to one are denied on purpose: `sql_denied`, nothing applied (a trigger
/// on a node table too: `cells/sandbox.rs`'s tests, where one exists).
#[test]
fn a_module_renames_its_tables_but_never_into_the_nodes() {
    let node = node("rename");
    for sql in [
        "INSERT INTO t VALUES ('kept')",
        "ALTER TABLE t RENAME TO t2",
        "ALTER TABLE t2 RENAME COLUMN v TO w",
        "CREATE TABLE x (app TEXT, name TEXT, last_id INTEGER)",
        "CREATE TABLE log (v)",
        "CREATE TRIGGER x_t AFTER INSERT ON x BEGIN INSERT INTO log VALUES (new.app); END",
    ] {
        let r = run(&node, "a", sql);
        assert_eq!(
            (r.status, r.json()["n"].as_i64()),
            (200, Some(0)),
            "{sql}: {}",
            r.text()
        );
    }
    assert_eq!(
        run(&node, "a", "SELECT w FROM t2 WHERE w = 'kept'").json()["n"],
        1
    );
    let denied = [
        "ALTER TABLE x RENAME TO _combd_inbox",
        "ALTER TABLE x RENAME TO \"_COMBD_alarms\"",
        "CREATE TRIGGER w AFTER INSERT ON log BEGIN DELETE FROM _combd_inbox; END",
        "CREATE TABLE w (r INTEGER REFERENCES _combd_alarms(id) ON DELETE CASCADE)",
    ];
    for sql in denied {
        let r = run(&node, "a", sql);
        assert_eq!(
            (r.status, r.json()["error"].as_str().unwrap_or("")),
            (500, "sql_denied"),
            "{sql}: {}",
            r.text()
        );
    }
    assert_eq!(node.stats()["sql_denied"], denied.len() as u64);
    let names = run(
        &node,
        "a",
        "SELECT name FROM sqlite_master WHERE name LIKE '\\_combd\\_%' ESCAPE '\\' OR name = 'w'",
    );
    assert_eq!(names.json()["n"], 0, "no node name and no trigger made");
    assert_eq!(run(&node, "a", "SELECT * FROM x").json()["n"], 0);
}

/// An object whose database has a trigger on one of the node's tables (which the node's own
/// writes would run with the node's rights; an app cannot make one, but a database can be made
/// otherwise) is not opened: its requests fail, the reason in the node's log, and the node and
/// its other objects go on.
#[test]
fn an_object_whose_node_tables_carry_triggers_is_not_opened() {
    let node = node("planted");
    assert_eq!(run(&node, "a", "INSERT INTO t VALUES ('x')").status, 200);
    assert_eq!(run(&node, "b", "INSERT INTO t VALUES ('y')").status, 200);
    let dir = node.kill9();
    let db = rusqlite::Connection::open(dir.join("objects/sqlrun/a.sqlite")).unwrap();
    db.execute_batch(
        "CREATE TABLE _combd_inbox (app TEXT, name TEXT, last_id INTEGER); \
         CREATE TRIGGER planted AFTER INSERT ON _combd_inbox BEGIN DELETE FROM t; END",
    )
    .unwrap();
    drop(db);
    let apps = apps_dir("planted");
    let node = TestNode::start_in(
        dir,
        &[
            ("COMBD_APPS_DIR", apps.to_str().unwrap()),
            ("COMBD_SHARDS", "1"),
        ],
    );
    let r = run(&node, "a", "SELECT * FROM t");
    assert!(r.status >= 500, "{}: {}", r.status, r.text());
    assert_eq!(count(&node, "b"), 1, "another object of the app opens");
}
