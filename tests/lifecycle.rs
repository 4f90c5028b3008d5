//! An object's life after its creation, against the real node: deleted by one of its calls
//! (`cx.delete()`) or by the operator (`DELETE /objects/<app>/<name>` on the localhost
//! listener), across kill -9, under load, and what deleting frees (its files, its place under
//! `COMBD_MAX_OBJECTS_PER_APP`, its alarms, its sessions); and the operator's listing,
//! inspection and read-only query (`/objects`, `combd objects`).

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use support::*;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::Message;

fn database(node: &TestNode, app: &str, name: &str) -> std::path::PathBuf {
    node.data_dir
        .join("objects")
        .join(app)
        .join(format!("{name}.sqlite"))
}

/// What is left of an object's files (its database, WAL, shared memory, a tombstone).
fn files_of(node: &TestNode, app: &str, name: &str) -> Vec<String> {
    let dir = node.data_dir.join("objects").join(app);
    let prefix = format!("{name}.sqlite");
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|f| f.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

fn counter(node: &TestNode, name: &str) -> i64 {
    let r = get(node, &format!("/o/counter/{name}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["value"].as_i64().unwrap()
}

fn delete(node: &TestNode, path: &str) -> Resp {
    request(
        node.public(),
        format!("DELETE {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

/// The next message of `ws` that is not a ping or pong.
fn next(ws: &mut tungstenite::WebSocket<std::net::TcpStream>) -> Message {
    loop {
        match ws.read() {
            Ok(Message::Ping(_) | Message::Pong(_)) => continue,
            Ok(m) => return m,
            Err(e) => panic!("the socket failed before its close frame: {e}"),
        }
    }
}

#[test]
fn an_object_deletes_itself_its_sessions_hear_its_last_word_then_4404() {
    let node = TestNode::start(&[TEST_APPS]);
    for text in ["one", "two"] {
        assert_eq!(post(&node, "/o/brief/doomed", text).status, 200);
    }
    let mut viewers: Vec<_> = (0..3).map(|_| open_ws(&node, "/o/brief/doomed")).collect();
    for ws in &mut viewers {
        assert_eq!(read_json(ws)["n"], 2);
    }
    let r = delete(&node, "/o/brief/doomed");
    assert_eq!((r.status, r.json()["deleted"].clone()), (200, true.into()));
    for ws in &mut viewers {
        assert_eq!(next(ws), Message::text("bye"), "the call's broadcast first");
        match next(ws) {
            Message::Close(Some(f)) => {
                assert_eq!(f.code, CloseCode::from(4404));
                assert_eq!(f.reason.as_str(), "object deleted");
            }
            other => panic!("expected a 4404 close, got {other:?}"),
        }
    }
    let s = wait_stats(&node, "the deleted object's files gone", |s| {
        s["objects_deleted"] == 1
    });
    assert_eq!(s["ws_object_deleted_closed"], 3, "{s}");
    assert_eq!(files_of(&node, "brief", "doomed"), Vec::<String>::new());
    // The name is a new, empty object: a viewer sees no rows, a write creates it again.
    let mut ws = open_ws(&node, "/o/brief/doomed");
    assert_eq!(read_json(&mut ws)["n"], 0);
    assert_eq!(post(&node, "/o/brief/doomed", "again").status, 200);
    assert_eq!(next(&mut ws), Message::text("again"));
    assert!(database(&node, "brief", "doomed").exists());
    assert_eq!(node.stats()["objects_created"], 2);
}

/// A receiver takes each sender's messages once, by their ids: a new account of a deleted
/// one's name numbers its messages past the old one's, so its credits are taken, not dropped
/// as ones already taken.
#[test]
fn a_new_object_of_a_deleted_ones_name_is_heard_by_the_objects_it_writes_to() {
    let node = TestNode::start(&[TEST_APPS]);
    let balance = |name: &str| get(&node, &format!("/o/bank/{name}")).json()["balance"].clone();
    let settled = |s: &serde_json::Value| s["alarm_objects"] == 0;
    assert_eq!(
        post(&node, "/o/bank/alice?to=bob&amount=10", "").status,
        200
    );
    wait_stats(&node, "the first credit taken", settled);
    assert_eq!(balance("bob"), 1010);
    assert_eq!(delete(&node, "/o/bank/alice").json()["closed"], true);
    wait_stats(&node, "alice deleted", |s| s["objects_deleted"] == 1);
    assert_eq!(balance("alice"), 1000, "a new account");
    assert_eq!(
        post(&node, "/o/bank/alice?to=bob&amount=20", "").status,
        200
    );
    wait_stats(&node, "the second credit taken", |s| {
        settled(s) && s["object_messages_taken"] == 2
    });
    assert_eq!(balance("bob"), 1030);
    assert_eq!(balance("alice"), 980);
}

/// An object's alarms go with it: the node's index forgets them, and nothing fires for the
/// new object of the name.
#[test]
fn a_deleted_objects_alarms_are_forgotten() {
    let node = TestNode::start(&[TEST_APPS]);
    let r = post(&node, "/o/alarmer/late?n=3&in_ms=600000", "");
    assert_eq!(r.status, 200, "{}", r.text());
    wait_stats(&node, "the alarms indexed", |s| s["alarms_pending"] == 3);
    let listed = local(&node, "GET", "/objects/alarmer", "").json();
    assert_eq!(listed["objects"][0]["alarms"], 3, "{listed}");
    let r = local(&node, "DELETE", "/objects/alarmer/late", "");
    assert_eq!((r.status, r.json()["deleted"].clone()), (200, true.into()));
    let s = node.stats();
    assert_eq!(
        (s["alarms_pending"].clone(), s["alarm_objects"].clone()),
        (0.into(), 0.into())
    );
    assert_eq!(get(&node, "/o/alarmer/late").json()["fired"], 0);
}

/// The operator's delete is answered once the files are gone; a second finds nothing; what
/// was asked of the object after the delete finds a new one.
#[test]
fn the_operator_deletes_an_object_and_frees_its_place() {
    let node = TestNode::start(&[("COMBD_MAX_OBJECTS_PER_APP", "2")]);
    for name in ["a", "b"] {
        assert_eq!(post(&node, &format!("/o/counter/{name}"), "").status, 200);
    }
    let r = post(&node, "/o/counter/c", "");
    assert_eq!(
        r.status,
        507,
        "past COMBD_MAX_OBJECTS_PER_APP: {}",
        r.text()
    );
    let r = local(&node, "DELETE", "/objects/counter/a", "");
    assert_eq!((r.status, r.json()["deleted"].clone()), (200, true.into()));
    assert_eq!(files_of(&node, "counter", "a"), Vec::<String>::new());
    let r = local(&node, "DELETE", "/objects/counter/a", "");
    assert_eq!(r.status, 404, "{}", r.text());
    assert_eq!(
        post(&node, "/o/counter/c", "").json()["value"],
        1,
        "a place is free"
    );
    assert_eq!(counter(&node, "a"), 0, "a new, empty a");
    let r = local(&node, "DELETE", "/objects/nope/a", "");
    assert_eq!(r.status, 404);
    let r = local(&node, "DELETE", "/objects/counter/..", "");
    assert_eq!(r.status, 400);
    let s = node.stats();
    assert_eq!(s["objects_deleted"], 1, "{s}");
}

/// Deletes while clients write: every request is answered (no error but the object's own),
/// and once the last delete is answered the name starts from nothing.
#[test]
fn deletes_under_load_leave_nothing_half_there() {
    let node = TestNode::start(&[]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..4)
        .map(|i| {
            let (addr, stop) = (node.public(), stop.clone());
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let raw = "POST /o/counter/hot HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                    statuses.push(request_from(client_address(i), addr, raw.as_bytes()).status);
                }
                statuses
            })
        })
        .collect();
    let mut deleted = 0;
    for _ in 0..20 {
        let r = local(&node, "DELETE", "/objects/counter/hot", "");
        assert!(matches!(r.status, 200 | 404), "{}", r.text());
        deleted += u64::from(r.status == 200);
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        let statuses = w.join().unwrap();
        assert!(!statuses.is_empty());
        assert!(
            statuses.iter().all(|s| matches!(s, 200 | 429)),
            "{statuses:?}"
        );
    }
    assert!(deleted > 0);
    let r = local(&node, "DELETE", "/objects/counter/hot", "");
    assert_eq!(r.status, 200);
    assert_eq!(counter(&node, "hot"), 0);
    assert_eq!(files_of(&node, "counter", "hot"), Vec::<String>::new());
    let data = node.kill9();
    let node = TestNode::start_in(data, &[]);
    assert_eq!(
        counter(&node, "hot"),
        0,
        "nothing of it comes back after a restart"
    );
}

/// A delete is decided by its mark in the object's database; a crash after it (before the
/// files went) or within the removal (a tombstone and the old WAL left) is finished by the
/// next start, and nothing of the old object comes back.
#[test]
fn a_delete_a_crash_interrupted_is_finished_after_a_restart() {
    let node = TestNode::start(&[]);
    for name in ["marked", "torn", "kept"] {
        for _ in 0..3 {
            assert_eq!(post(&node, &format!("/o/counter/{name}"), "").status, 200);
        }
    }
    let data = node.kill9();
    let dir = data.join("objects").join("counter");
    // Killed after `marked`'s mark committed: the mark, as the node writes it.
    let db = rusqlite::Connection::open(dir.join("marked.sqlite")).unwrap();
    db.execute_batch(
        "CREATE TABLE _combd_deleted (at_ms INTEGER NOT NULL); INSERT INTO _combd_deleted VALUES (1);",
    )
    .unwrap();
    drop(db);
    // Killed within `torn`'s removal: renamed, its WAL not yet removed.
    std::fs::rename(dir.join("torn.sqlite"), dir.join("torn.sqlite-deleted")).unwrap();
    std::fs::write(dir.join("torn.sqlite-wal"), b"an old WAL").unwrap();
    let node = TestNode::start_in(data, &[]);
    assert_eq!(files_of(&node, "counter", "torn"), Vec::<String>::new());
    assert_eq!(counter(&node, "torn"), 0);
    assert_eq!(
        counter(&node, "marked"),
        0,
        "opened, the marked object is removed"
    );
    assert_eq!(files_of(&node, "counter", "marked"), Vec::<String>::new());
    assert_eq!(counter(&node, "kept"), 3);
    assert_eq!(post(&node, "/o/counter/torn", "").json()["value"], 1);
    assert_eq!(
        node.stats()["objects_deleted"],
        1,
        "the marked one, as it opened"
    );
}

#[test]
fn the_operator_lists_and_inspects_objects_by_page() {
    let node = TestNode::start(&[]);
    for name in ["c", "a", "b", "d"] {
        assert_eq!(post(&node, &format!("/o/counter/{name}"), "").status, 200);
    }
    let apps = local(&node, "GET", "/objects", "").json();
    let counter_app = apps["apps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["app"] == "counter")
        .unwrap();
    assert_eq!(counter_app["objects"], 4);
    let page = local(&node, "GET", "/objects/counter?limit=3", "").json();
    let names: Vec<&str> = page["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        (names, page["next"].clone()),
        (vec!["a", "b", "c"], "c".into())
    );
    let a = &page["objects"][0];
    assert!(a["bytes"].as_u64().unwrap() > 0 && a["written_ms"].as_u64().unwrap() > 0);
    assert_eq!(a["live"], true, "{a}");
    let rest = local(&node, "GET", "/objects/counter?after=c", "").json();
    assert_eq!(rest["objects"][0]["name"], "d");
    assert_eq!(rest["next"], serde_json::Value::Null);
    let shown = local(&node, "GET", "/objects/counter/b", "").json();
    let tables = shown["tables"]["list"].as_array().unwrap();
    assert!(
        tables
            .iter()
            .any(|t| t["name"] == "counter" && t["rows"] == 1),
        "{shown}"
    );
    for (path, status) in [
        ("/objects/counter/zz", 404),
        ("/objects/nope", 404),
        ("/objects/counter?limit=0", 400),
        ("/objects/counter?limit=1001", 400),
        ("/objects/counter/.x", 400),
        ("/objects/counter/a/b/c", 404),
    ] {
        assert_eq!(local(&node, "GET", path, "").status, status, "{path}");
    }
    assert_eq!(local(&node, "POST", "/objects/counter/a", "").status, 405);
    // Not on a public address, as /stats.
    assert_eq!(get(&node, "/objects").status, 404);
    assert_eq!(get(&node, "/objects/counter").status, 404);
    assert_eq!(delete(&node, "/objects/counter/a").status, 404);
    assert_eq!(
        counter(&node, "a"),
        1,
        "nothing deleted from a public address"
    );
}

#[test]
fn the_read_only_query_reads_and_cannot_write_attach_or_run_long() {
    let node = TestNode::start(&[]);
    for _ in 0..5 {
        assert_eq!(post(&node, "/o/counter/q", "").status, 200);
    }
    let sql = |q: &str| local(&node, "POST", "/objects/counter/q/sql", q);
    let r = sql("SELECT value, 'x' AS t, x'00ff' AS b, NULL AS n FROM counter");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["columns"], serde_json::json!(["value", "t", "b", "n"]));
    assert_eq!(
        v["rows"],
        serde_json::json!([[5, "x", {"hex": "00ff"}, null]])
    );
    assert_eq!(v["truncated"], false);
    for q in [
        "UPDATE counter SET value = 0",
        "DELETE FROM counter",
        "CREATE TABLE t (x)",
        "ATTACH DATABASE '/tmp/x.sqlite' AS x",
        "PRAGMA user_version = 7",
        "PRAGMA writable_schema = 1",
        "BEGIN",
        "SELECT load_extension('x')",
    ] {
        let r = sql(q);
        assert!(
            matches!(r.status, 400 | 403),
            "{q}: {} {}",
            r.status,
            r.text()
        );
    }
    assert_eq!(sql("UPDATE counter SET value = 0").status, 403);
    assert_eq!(sql("SELECT 1; SELECT 2").status, 400, "one statement");
    assert_eq!(sql("").status, 400);
    assert_eq!(counter(&node, "q"), 5, "nothing written");
    let long = sql(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n",
    );
    assert_eq!(long.status, 408, "{}", long.text());
    // Past object_sql_answer_max_bytes (1 MiB) before object_sql_rows_max: 100 KB rows.
    let wide = sql("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 50) SELECT printf('%.100000c', 'x') FROM n").json();
    let rows = wide["rows"].as_array().unwrap().len();
    assert!(
        (10..=12).contains(&rows) && wide["truncated"] == true,
        "{rows}"
    );
    let many = sql("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n LIMIT 5000) SELECT i FROM n");
    let v = many.json();
    assert_eq!(
        (v["rows"].as_array().unwrap().len(), v["truncated"].clone()),
        (1000, true.into())
    );
    // The operator may read the node's tables; the object is still served meanwhile.
    assert_eq!(sql("SELECT count(*) FROM sqlite_master").status, 200);
    assert_eq!(post(&node, "/o/counter/q", "").json()["value"], 6);
    // Not from a public address.
    let r = post(&node, "/objects/counter/q/sql", "SELECT 1");
    assert_eq!(r.status, 404);
}

/// `combd objects` over the same requests: what it prints, and its exit status.
#[test]
fn combd_objects_lists_shows_queries_and_deletes() {
    let node = TestNode::start(&[]);
    assert_eq!(post(&node, "/o/counter/cli", "").status, 200);
    let run = |args: &[&str]| {
        let port = node.port.to_string();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_combd"))
            .arg("objects")
            .args(args)
            .args(["--port", &port])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (
            out.status.code(),
            text,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, text, _) = run(&["ls", "counter"]);
    assert_eq!(code, Some(0));
    assert!(text.lines().any(|l| l.starts_with("cli ")), "{text}");
    let (code, text, _) = run(&["ls", "counter", "--json"]);
    assert_eq!(code, Some(0));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["objects"][0]["name"], "cli");
    let (_, text, _) = run(&["show", "counter/cli"]);
    assert!(text.contains("counter ") && text.contains(" 1\n"), "{text}");
    let (_, text, _) = run(&["sql", "counter/cli", "SELECT value FROM counter"]);
    assert_eq!(text, "value\n1\n");
    let (code, _, err) = run(&["sql", "counter/cli", "DELETE FROM counter"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("403"), "{err}");
    let (code, text, _) = run(&["rm", "counter/cli"]);
    assert_eq!((code, text.as_str()), (Some(0), "deleted counter/cli\n"));
    let (code, _, err) = run(&["rm", "counter/cli"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("404"), "{err}");
    let (code, _, err) = run(&["frob"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("use: combd objects"), "{err}");
}

/// A module whose objects expire after a second unwritten (`expiry()`); a request with a query
/// also sets an alarm in 2100, which keeps its object whatever its age.
const FLEETING: &str = r#"(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (import "combd" "set_alarm" (func $set_alarm (param i64 i32 i32) (result i64)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 256) "CREATE TABLE IF NOT EXISTS t (x INTEGER);\00")
  (data (i32.const 512) "INSERT INTO t VALUES (1)")
  (data (i32.const 600) "{}")
  (func (export "expiry") (result i32) (i32.const 1))
  (func (export "schema") (result i32) (i32.const 256))
  (func (export "handle") (result i32)
    (drop (call $sql (i32.const 512) (i32.const 24)))
    (if (i32.gt_s (call $input (i32.const 1) (i32.const 4096) (i32.const 64)) (i32.const 0))
      (then (drop (call $set_alarm (i64.const 4102444800000) (i32.const 600) (i32.const 2)))))
    (call $respond (i32.const 200) (i32.const 600) (i32.const 2))
    (i32.const 0)))"#;

/// Objects unwritten past their app's expiry are deleted; one written since, or with an alarm
/// pending, is kept.
#[test]
fn objects_unwritten_past_their_apps_expiry_are_deleted() {
    let dir = apps_dir(&[("fleeting.wat", FLEETING)]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    for path in [
        "/o/fleeting/idle",
        "/o/fleeting/waiting?alarm=1",
        "/o/fleeting/busy",
    ] {
        assert_eq!(post(&node, path, "").status, 200, "{path}");
    }
    // `busy` is written all along; `idle` expires.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let swept = |s: &serde_json::Value| s["objects_expired"] == 1 && s["objects_expiry_kept"] != 0;
    while !swept(&node.stats()) {
        assert!(std::time::Instant::now() < deadline, "nothing expired");
        assert_eq!(post(&node, "/o/fleeting/busy", "").status, 200);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(files_of(&node, "fleeting", "idle"), Vec::<String>::new());
    assert!(database(&node, "fleeting", "busy").exists());
    assert!(
        database(&node, "fleeting", "waiting").exists(),
        "its alarm keeps it"
    );
    let s = node.stats();
    assert_eq!(
        (s["objects_expired"].clone(), s["objects_deleted"].clone()),
        (1.into(), 1.into())
    );
}
