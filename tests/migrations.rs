//! Migrations (README "Migrations"), against the real node with modules: an object is brought
//! to its app's version as it opens, every step and its new version in one transaction; a
//! version 2 that adds a column migrates 1,000 objects as they open, a module reload migrates a
//! hot object, and a failing step refuses the object (503 `migration failed`) and changes
//! nothing.

#![allow(clippy::unwrap_used)]

mod support;

use nix::sys::signal::Signal;
use support::*;

/// SQL as WAT data at `at`, and its length.
struct Sql {
    at: u32,
    text: &'static str,
}

impl Sql {
    fn data(&self) -> String {
        format!("(data (i32.const {}) \"{}\")", self.at, self.text)
    }

    /// `(call $sql …)`, leaving its result on the stack.
    fn call(&self) -> String {
        format!(
            "(call $sql (i32.const {}) (i32.const {}))",
            self.at,
            self.text.len()
        )
    }
}

const ADD_TAG: Sql = Sql {
    at: 1024,
    text: "ALTER TABLE n ADD COLUMN tag TEXT NOT NULL DEFAULT 'old'",
};
const ADD_TWO: Sql = Sql {
    at: 1280,
    text: "ALTER TABLE n ADD COLUMN two INTEGER NOT NULL DEFAULT 2",
};
const BROKEN: Sql = Sql {
    at: 1536,
    text: "UPDATE n SET nosuch = 1",
};
const INSERT_V1: Sql = Sql {
    at: 1792,
    text: "INSERT INTO n (x) VALUES (1)",
};
const INSERT_V2: Sql = Sql {
    at: 2048,
    text: "INSERT INTO n (x, tag) VALUES (1, 'new')",
};

/// The `notes` module at `version`: its schema makes version 1 (`n (x)`); step 1 adds `tag`,
/// step 2 adds `two` (or, `broken`, fails after adding `tag`'s step). From version 2 a request
/// writes `tag` (failing, 500, on an object not migrated); it answers `{"v":<version>}`.
fn notes(version: u32, broken: bool) -> String {
    let step2 = if broken { &BROKEN } else { &ADD_TWO };
    let insert = if version >= 2 { &INSERT_V2 } else { &INSERT_V1 };
    let declared = match version {
        1 => String::new(),
        v => format!(
            r#"(func (export "version") (result i32) (i32.const {v}))
  (func (export "migrate") (param $from i32) (result i32)
    (if (i32.eq (local.get $from) (i32.const 1))
      (then (return (i32.lt_s {add_tag} (i32.const 0)))))
    (i32.lt_s {step2} (i32.const 0)))"#,
            add_tag = ADD_TAG.call(),
            step2 = step2.call(),
        ),
    };
    let answer = format!("{{\\\"v\\\":{version}}}");
    format!(
        r#"(module
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{answer}")
  (data (i32.const 64) "CREATE TABLE IF NOT EXISTS n (x INTEGER);\00")
  {d1} {d2} {d3} {d4} {d5}
  (func (export "schema") (result i32) (i32.const 64))
  {declared}
  (func (export "handle") (result i32)
    (if (i32.lt_s {insert} (i32.const 0)) (then (return (i32.const 1))))
    (call $respond (i32.const 200) (i32.const 0) (i32.const {len}))
    (i32.const 0)))"#,
        d1 = ADD_TAG.data(),
        d2 = ADD_TWO.data(),
        d3 = BROKEN.data(),
        d4 = INSERT_V1.data(),
        d5 = INSERT_V2.data(),
        insert = insert.call(),
        len = format!("{{\"v\":{version}}}").len(),
    )
}

/// The rows of a read-only query on `notes/<name>`.
fn query(node: &TestNode, name: &str, sql: &str) -> serde_json::Value {
    let r = local(node, "POST", &format!("/objects/notes/{name}/sql"), sql);
    assert_eq!(r.status, 200, "{sql}: {}", r.text());
    r.json()["rows"].clone()
}

/// `POST /o/notes/<name>` from one of many client addresses: a thousand objects live at once are
/// more than one client's share of the node's.
fn write(node: &TestNode, i: usize, name: &str) -> Resp {
    let raw = format!("POST /o/notes/{name} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    request_from(client_address(i), node.public(), raw.as_bytes())
}

fn reload(node: &TestNode, dir: &std::path::Path, module: &str, reloads: u64) {
    std::fs::write(dir.join("notes.wat"), module).unwrap();
    node.signal(Signal::SIGHUP);
    wait_stats(node, "the reload", |s| {
        s["apps"]["notes"]["reloads"] == reloads
    });
}

#[test]
fn a_thousand_objects_migrate_as_they_open_and_a_failing_step_changes_nothing() {
    let dir = apps_dir(&[("notes.wat", &notes(1, false))]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    const N: usize = 1000;
    for i in 0..N {
        let r = write(&node, i, &format!("o{i}"));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(
        node.stats()["objects_migrated"],
        0,
        "version 1: nothing to do"
    );
    reload(&node, &dir, &notes(2, false), 1);
    // Live objects finish at most a batch on the old version; every object then opens on
    // version 2 and migrates once.
    for i in 0..N {
        let r = write(&node, i, &format!("o{i}"));
        let r = match r.status {
            200 if r.json()["v"] == 1 => write(&node, i, &format!("o{i}")),
            _ => r,
        };
        assert_eq!(
            (r.status, r.json()["v"].clone()),
            (200, 2.into()),
            "o{i}: {}",
            r.text()
        );
    }
    let s = node.stats();
    assert_eq!(s["objects_migrated"], N as u64, "{s}");
    assert_eq!(s["objects_migration_failed"], 0);
    let rows = query(&node, "o7", "SELECT tag FROM n ORDER BY rowid");
    assert_eq!(
        rows[0][0], "old",
        "a row from before, given the column's default"
    );
    assert_eq!(rows.as_array().unwrap().last().unwrap()[0], "new");
    assert_eq!(
        query(&node, "o7", "SELECT version FROM _combd_version"),
        serde_json::json!([[2]])
    );
    // Version 3 whose step 2 fails: the object is refused and stays at version 2, as it was.
    let before = query(&node, "o7", "SELECT count(*) FROM n");
    reload(&node, &dir, &notes(3, true), 2);
    let refused = loop {
        let r = post(&node, "/o/notes/o7", "");
        if r.status != 200 {
            break r;
        }
    };
    assert_eq!(
        (refused.status, error(&refused).1.as_str()),
        (503, "migration failed")
    );
    assert_eq!(
        query(&node, "o7", "SELECT version FROM _combd_version"),
        serde_json::json!([[2]])
    );
    assert_eq!(
        query(&node, "o7", "SELECT count(*) FROM n"),
        before,
        "nothing written"
    );
    let columns = query(
        &node,
        "o7",
        "SELECT count(*) FROM pragma_table_info('n') WHERE name = 'two'",
    );
    assert_eq!(columns, serde_json::json!([[0]]));
    assert!(node.stats()["objects_migration_failed"].as_u64().unwrap() >= 1);
    // A new object cannot be made either: it would need the same steps.
    assert_eq!(post(&node, "/o/notes/fresh", "").status, 503);
    // Deployed again with a step that works, it migrates from where it stayed.
    reload(&node, &dir, &notes(3, false), 3);
    let r = post(&node, "/o/notes/o7", "");
    assert_eq!(
        (r.status, r.json()["v"].clone()),
        (200, 3.into()),
        "{}",
        r.text()
    );
    assert_eq!(
        query(&node, "o7", "SELECT version FROM _combd_version"),
        serde_json::json!([[3]])
    );
}

/// A hot object (requests keep coming while the module is replaced) runs on the new version,
/// migrated, without a request lost.
#[test]
fn a_reload_migrates_a_hot_object() {
    let dir = apps_dir(&[("notes.wat", &notes(1, false))]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (addr, stop) = (node.public(), stop.clone());
        std::thread::spawn(move || {
            let mut answers = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let raw = "POST /o/notes/hot HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                let r = request_from(client_address(1), addr, raw.as_bytes());
                answers.push((r.status, r.json()["v"].as_u64()));
            }
            answers
        })
    };
    wait_stats(&node, "the object hot", |s| s["objects_created"] == 1);
    reload(&node, &dir, &notes(2, false), 1);
    let mut v2 = 0;
    while v2 < 20 {
        let r = post(&node, "/o/notes/hot", "");
        assert_eq!(r.status, 200, "{}", r.text());
        v2 += u32::from(r.json()["v"] == 2);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers = writer.join().unwrap();
    assert!(
        answers.iter().all(|(s, _)| *s == 200),
        "none lost: {answers:?}"
    );
    let written = answers.len() + 20;
    let rows = query(&node, "hot", "SELECT count(*), sum(tag = 'new') FROM n");
    assert!(rows[0][0].as_u64().unwrap() as usize >= written, "{rows}");
    assert!(rows[0][1].as_u64().unwrap() >= 20, "{rows}");
    assert_eq!(node.stats()["objects_migrated"], 1);
}

#[test]
fn a_module_declaring_a_version_without_migrate_is_refused_at_start() {
    let bad = notes(2, false).replace(
        r#"(func (export "migrate")"#,
        r#"(func (export "nomigrate")"#,
    );
    let (stderr, _) = refused_with(&[("notes.wat", &bad)]);
    assert!(stderr.contains("exports no migrate(from)"), "{stderr}");
    let zero = notes(1, false).replace(
        r#"(func (export "schema")"#,
        r#"(func (export "version") (result i32) (i32.const 0)) (func (export "schema")"#,
    );
    let (stderr, _) = refused_with(&[("notes.wat", &zero)]);
    assert!(stderr.contains("version() answered 0"), "{stderr}");
}
