//! Objects whose database does not exist, against the real node: a request that writes
//! nothing (a read, a WebSocket attach) is answered from a scratch database and creates no
//! file; the first write creates the database, within the objects an app may have
//! (`COMBD_MAX_OBJECTS_PER_APP`) and the shard's creation rate (`COMBD_OBJECT_CREATE_RATE`).

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, Write};

use support::*;
use tungstenite::Message;

/// The files in the app's objects directory (none if it does not exist).
fn files(node: &TestNode, app: &str) -> Vec<String> {
    match std::fs::read_dir(node.data_dir.join("objects").join(app)) {
        Ok(dir) => dir
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn database(node: &TestNode, app: &str, name: &str) -> std::path::PathBuf {
    node.data_dir
        .join("objects")
        .join(app)
        .join(format!("{name}.sqlite"))
}

/// Sends `names.len()` pipelined GETs on one keep-alive connection, `per_write` to a write,
/// reading each write's answers before the next; returns each answer.
fn pipelined_gets(addr: std::net::SocketAddr, names: &[String], per_write: usize) -> Vec<Resp> {
    let s = connect(addr);
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let mut answers = Vec::with_capacity(names.len());
    for chunk in names.chunks(per_write) {
        let mut burst = String::new();
        for name in chunk {
            burst.push_str(&format!(
                "GET /o/counter/{name} HTTP/1.1\r\nHost: x\r\n\r\n"
            ));
        }
        w.write_all(burst.as_bytes()).unwrap();
        for _ in chunk {
            answers.push(read_response(&mut r));
        }
    }
    answers
}

#[test]
fn ten_thousand_reads_of_new_counters_answer_zero_and_create_no_file() {
    let node = TestNode::start(&[]);
    const CONNS: usize = 4;
    const GETS: usize = 10_000;
    let threads: Vec<_> = (0..CONNS)
        .map(|c| {
            let names: Vec<String> = (0..GETS / CONNS).map(|i| format!("n{c}-{i}")).collect();
            let addr = node.public();
            std::thread::spawn(move || pipelined_gets(addr, &names, 50))
        })
        .collect();
    let mut answered = 0;
    for t in threads {
        for a in t.join().unwrap() {
            assert_eq!(a.status, 200, "{}", a.text());
            assert_eq!(a.json(), serde_json::json!({ "value": 0 }));
            answered += 1;
        }
    }
    assert_eq!(answered, GETS);
    assert_eq!(files(&node, "counter"), Vec::<String>::new());
    let s = node.stats();
    assert_eq!(s["objects_created"], 0, "{s}");
    assert_eq!(s["apps"]["counter"]["objects"], 0, "{s}");
    assert_eq!(
        s["wal_syncs"], 0,
        "nothing was written, so nothing was synced: {s}"
    );
}

#[test]
fn a_write_creates_the_object_and_it_survives_a_restart() {
    let node = TestNode::start(&[]);
    assert_eq!(get(&node, "/o/counter/kept").json()["value"], 0);
    assert!(!database(&node, "counter", "kept").exists());
    assert_eq!(post(&node, "/o/counter/kept", "").json()["value"], 1);
    assert!(database(&node, "counter", "kept").exists());
    let s = node.stats();
    assert_eq!(s["objects_created"], 1, "{s}");
    assert_eq!(s["apps"]["counter"]["objects"], 1, "{s}");
    assert_eq!(
        s["batches"], 2,
        "the write's run on the scratch database is not a batch: {s}"
    );
    let data = node.kill9();
    let node = TestNode::start_in(data, &[]);
    assert_eq!(get(&node, "/o/counter/kept").json()["value"], 1);
    assert_eq!(post(&node, "/o/counter/kept", "").json()["value"], 2);
    let s = node.stats();
    assert_eq!(
        s["apps"]["counter"]["objects"], 1,
        "counted at start-up: {s}"
    );
    assert_eq!(s["objects_created"], 0, "{s}");
}

#[test]
fn past_the_objects_an_app_may_have_a_new_object_is_refused_and_reads_still_answer() {
    let env = [("COMBD_MAX_OBJECTS_PER_APP", "3")];
    let node = TestNode::start(&env);
    for name in ["c1", "c2", "c3"] {
        assert_eq!(
            post(&node, &format!("/o/counter/{name}"), "").json()["value"],
            1
        );
    }
    let r = post(&node, "/o/counter/c4", "5");
    assert_eq!(r.status, 507, "{}", r.text());
    assert_eq!(r.json(), serde_json::json!({ "error": "too many objects" }));
    assert!(!database(&node, "counter", "c4").exists());
    // Nothing of the refused write was applied; reads of objects that do not exist answer.
    assert_eq!(get(&node, "/o/counter/c4").json()["value"], 0);
    assert_eq!(get(&node, "/o/counter/c5").json()["value"], 0);
    // Existing objects take writes.
    assert_eq!(post(&node, "/o/counter/c1", "").json()["value"], 2);
    // Pipelined to a new object together (often one batch): the write is refused, the reads
    // before and after it answered.
    let mut s = connect(node.public());
    s.write_all(
        b"GET /o/counter/c6 HTTP/1.1\r\nHost: x\r\n\r\n\
          POST /o/counter/c6 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n\
          GET /o/counter/c6 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .unwrap();
    let mut r = BufReader::new(s);
    let answers: Vec<(u16, serde_json::Value)> = (0..3)
        .map(|_| {
            let a = read_response(&mut r);
            (a.status, a.json())
        })
        .collect();
    assert_eq!(
        answers,
        [
            (200, serde_json::json!({ "value": 0 })),
            (507, serde_json::json!({ "error": "too many objects" })),
            (200, serde_json::json!({ "value": 0 })),
        ]
    );
    let mut made = files(&node, "counter");
    made.retain(|f| f.ends_with(".sqlite"));
    made.sort();
    assert_eq!(made, ["c1.sqlite", "c2.sqlite", "c3.sqlite"]);
    let st = node.stats();
    assert_eq!(st["objects_refused_count"], 2, "{st}");
    assert_eq!(st["objects_created"], 3, "{st}");
    assert_eq!(st["limits"]["max_objects_per_app"], 3, "{st}");
    // After a restart the databases on disk are counted: still full.
    let data = node.kill9();
    let node = TestNode::start_in(data, &env);
    assert_eq!(post(&node, "/o/counter/c4", "").status, 507);
    assert_eq!(post(&node, "/o/counter/c2", "").json()["value"], 2);
}

#[test]
fn past_the_creation_rate_a_new_object_is_refused_with_retry_after() {
    // One shard, so every object takes from the same bucket: 1 a second, 10 at once. One
    // client may take all of it: this crosses the shard's rate, not a client's share of it
    // (tests/fair.rs crosses that).
    let node = TestNode::start(&[
        ("COMBD_OBJECT_CREATE_RATE", "1"),
        ("COMBD_SHARDS", "1"),
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "100"),
    ]);
    let s = node.stats();
    assert_eq!(s["limits"]["object_create_burst"], 10, "{s}");
    // Eleven new objects written at once: the bucket holds ten.
    let addr = node.public();
    let at_once: Vec<_> = (0..11)
        .map(|i| {
            std::thread::spawn(move || {
                let raw = format!(
                    "POST /o/counter/r{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                );
                (i, request(addr, raw.as_bytes()))
            })
        })
        .collect();
    let mut answers: Vec<(usize, Resp)> = at_once.into_iter().map(|t| t.join().unwrap()).collect();
    let created = answers.iter().filter(|(_, r)| r.status == 200).count();
    assert!(created >= 10, "the burst of ten passes at once");
    // The bucket refills at one a second: if the eleven took longer than that on this
    // machine, the next ones written cross it (each a few milliseconds).
    let mut next = 11;
    while !answers.iter().any(|(_, r)| r.status == 429) {
        assert!(next < 40, "timed out waiting for a creation to be refused");
        answers.push((next, post(&node, &format!("/o/counter/r{next}"), "")));
        next += 1;
    }
    let (i, refused) = answers.iter().find(|(_, r)| r.status == 429).unwrap();
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(
        refused.json(),
        serde_json::json!({ "error": "object creation rate" })
    );
    assert!(!database(&node, "counter", &format!("r{i}")).exists());
    assert_eq!(get(&node, &format!("/o/counter/r{i}")).json()["value"], 0);
    // Reads of new objects and writes to existing ones are not creations.
    assert_eq!(get(&node, "/o/counter/never").json()["value"], 0);
    let (ok, _) = answers.iter().find(|(_, r)| r.status == 200).unwrap();
    assert_eq!(
        post(&node, &format!("/o/counter/r{ok}"), "").json()["value"],
        2
    );
    let s = node.stats();
    assert_eq!(
        s["objects_refused_rate"].as_u64().unwrap(),
        answers.iter().filter(|(_, r)| r.status == 429).count() as u64,
        "{s}"
    );
    assert_eq!(
        s["objects_created"].as_u64().unwrap(),
        answers.iter().filter(|(_, r)| r.status == 200).count() as u64,
        "{s}"
    );
}

#[test]
fn viewing_a_new_million_board_creates_no_file_and_the_first_click_does() {
    let node = TestNode::start(&[]);
    // million's attach only reads the page (and sends it): it writes nothing.
    let mut viewer = open_ws(&node, "/o/million/fresh?page=3");
    let page = read_json(&mut viewer);
    assert_eq!(page["t"], "page");
    assert_eq!(page["bits"], "0".repeat(1024));
    let mut other = open_ws(&node, "/o/million/fresh?page=3");
    assert_eq!(read_json(&mut other)["t"], "page");
    assert_eq!(files(&node, "million"), Vec::<String>::new());
    assert_eq!(node.stats()["objects_created"], 0);
    // A click writes: it creates the board, and its update reaches each viewer once (the run
    // on the scratch database sent nothing).
    let box_ = 3 * 4096 + 5;
    viewer
        .send(Message::text(format!(
            r#"{{"t":"click","i":{box_},"c":1}}"#
        )))
        .unwrap();
    for ws in [&mut viewer, &mut other] {
        let m = read_json(ws);
        assert_eq!(m["t"], "set", "{m}");
        assert_eq!(
            (m["u"][0][0].as_u64(), m["u"][0][1].as_u64()),
            (Some(box_), Some(1))
        );
    }
    viewer
        .send(Message::text(format!(
            r#"{{"t":"click","i":{box_},"c":2}}"#
        )))
        .unwrap();
    for ws in [&mut viewer, &mut other] {
        let m = read_json(ws);
        assert_eq!(
            (m["u"][0][1].as_u64(), m["u"][0][3].as_u64()),
            (Some(0), Some(2)),
            "{m}"
        );
    }
    assert!(database(&node, "million", "fresh").exists());
    assert_eq!(node.stats()["objects_created"], 1);
}

#[test]
fn a_click_on_a_new_board_past_the_cap_is_refused_to_its_session_only() {
    let node = TestNode::start(&[("COMBD_MAX_OBJECTS_PER_APP", "1")]);
    let mut a = open_ws(&node, "/o/million/a?page=0");
    read_json(&mut a);
    a.send(Message::text(r#"{"t":"click","i":1,"c":1}"#))
        .unwrap();
    assert_eq!(read_json(&mut a)["t"], "set");
    // Board b may not be created: viewing it still works, clicking on it is refused.
    let mut b = open_ws(&node, "/o/million/b?page=0");
    assert_eq!(read_json(&mut b)["t"], "page");
    b.send(Message::text(r#"{"t":"click","i":1,"c":1}"#))
        .unwrap();
    assert_eq!(
        read_json(&mut b),
        serde_json::json!({ "error": "too many objects" })
    );
    assert!(!database(&node, "million", "b").exists());
    // The session stays attached and board a carries on.
    a.send(Message::text(r#"{"t":"click","i":2,"c":2}"#))
        .unwrap();
    assert_eq!(read_json(&mut a)["u"][0][0], 2);
    let mut late = open_ws(&node, "/o/million/b?page=0");
    assert_eq!(read_json(&mut late)["bits"], "0".repeat(1024));
    assert_eq!(node.stats()["objects_refused_count"], 1);
}

/// A module whose attach writes (a row counted per attach); its HTTP requests only read.
const TOUCH: &str = r#"(module
  (import "combd" "kind" (func $kind (result i32)))
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "CREATE TABLE IF NOT EXISTS n (v INTEGER); INSERT INTO n SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM n);\00")
  (data (i32.const 200) "UPDATE n SET v = v + 1")
  (data (i32.const 300) "{\"ok\":1}")
  (func (export "schema") (result i32) (i32.const 0))
  (func (export "handle") (result i32)
    (if (i32.eq (call $kind) (i32.const 3))
      (then (drop (call $sql (i32.const 200) (i32.const 22)))))
    (if (i32.eq (call $kind) (i32.const 0))
      (then (call $respond (i32.const 200) (i32.const 300) (i32.const 8))))
    (i32.const 0)))
"#;

#[test]
fn an_attach_that_writes_creates_the_object_and_is_refused_past_the_cap() {
    let apps = std::env::temp_dir().join(format!("combd-objects-apps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&apps);
    std::fs::create_dir_all(&apps).unwrap();
    std::fs::write(apps.join("touch.wat"), TOUCH).unwrap();
    let node = TestNode::start(&[
        ("COMBD_APPS_DIR", apps.to_str().unwrap()),
        ("COMBD_MAX_OBJECTS_PER_APP", "1"),
    ]);
    // Its requests only read: they create nothing.
    let r = get(&node, "/o/touch/a");
    assert_eq!((r.status, r.json()), (200, serde_json::json!({ "ok": 1 })));
    assert_eq!(files(&node, "touch"), Vec::<String>::new());
    // Its attach writes: the first creates the object.
    let _a = open_ws(&node, "/o/touch/a");
    assert!(database(&node, "touch", "a").exists());
    // Past the cap the upgrade itself is refused, and nothing of it exists.
    let r = request(
        node.public(),
        b"GET /o/touch/b HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    );
    assert_eq!(r.status, 507, "{}", r.text());
    assert_eq!(r.json(), serde_json::json!({ "error": "too many objects" }));
    assert!(!database(&node, "touch", "b").exists());
    let s = node.stats();
    assert_eq!(s["objects_refused_count"], 1, "{s}");
    assert_eq!(s["apps"]["touch"]["objects"], 1, "{s}");
    drop(node);
    let _ = std::fs::remove_dir_all(&apps);
}

#[test]
fn each_stage_of_a_writes_path_is_timed_in_stats_and_metrics() {
    let node = TestNode::start(&[]);
    const WRITES: u64 = 20;
    for i in 1..=WRITES {
        assert_eq!(post(&node, "/o/counter/timed", "").json()["value"], i);
    }
    let s = node.stats();
    let st = &s["stages"];
    let count = |stage: &str| st[stage]["count"].as_u64().unwrap();
    let us = |stage: &str, q: &str| st[stage][q].as_u64().unwrap();
    // Every input waited in the mailbox once; every batch was answered once; every sync was
    // timed, on the way there and back too.
    assert_eq!(count("mailbox"), WRITES, "{st}");
    assert_eq!(
        count("input_to_answer"),
        s["batches"].as_u64().unwrap(),
        "{s}"
    );
    assert_eq!(count("commit_wait"), s["batches"].as_u64().unwrap(), "{s}");
    for stage in ["sync_to_thread", "sync", "sync_back"] {
        assert_eq!(
            count(stage),
            s["wal_syncs"].as_u64().unwrap(),
            "{stage}: {s}"
        );
    }
    // The first write ran twice (on the scratch database, then on the one it created).
    assert_eq!(count("batch_run"), WRITES + 1, "{st}");
    for stage in ["batch_to_thread", "batch_back", "fanout"] {
        assert!(count(stage) >= WRITES, "{stage}: {st}");
    }
    for stage in ["mailbox", "batch_run", "sync", "input_to_answer"] {
        assert!(us(stage, "p50_us") <= us(stage, "p90_us"), "{stage}: {st}");
        assert!(us(stage, "p90_us") <= us(stage, "p99_us"), "{stage}: {st}");
    }
    // One client writing one request at a time: each batch had a sync of its own and was
    // answered after it, so its time to the answer holds its sync's.
    assert_eq!(s["wal_syncs"], s["batches"], "{s}");
    assert!(
        us("input_to_answer", "mean_us") >= us("sync", "mean_us"),
        "{st}"
    );
    assert!(us("batch_run", "mean_us") > 0, "a batch takes time: {st}");
    let per_shard: u64 = s["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|sh| sh["stages"]["sync"]["count"].as_u64().unwrap())
        .sum();
    assert_eq!(per_shard, count("sync"), "the shards' add up: {s}");
    let shard = s["shards"]
        .as_array()
        .unwrap()
        .iter()
        .position(|sh| sh["stages"]["sync"]["count"].as_u64() == Some(count("sync")))
        .expect("the counter's shard");
    let m = request(node.local(), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").text();
    let line = format!(
        "combd_stage_microseconds_count{{shard=\"{shard}\",stage=\"sync\"}} {}\n",
        count("sync")
    );
    assert!(m.contains(&line), "{line} in {m}");
    assert!(
        m.contains("# TYPE combd_stage_microseconds summary\n"),
        "{m}"
    );
}
