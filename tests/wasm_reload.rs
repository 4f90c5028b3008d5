//! Modules reloaded while the node runs (SIGHUP): a changed module serves new objects on its
//! new version and reaches live and hot objects; a module that appeared is deployed, one that
//! disappeared is removed, and nothing waiting for it is lost.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;

use nix::sys::signal::Signal;

use support::*;
use tungstenite::{Message, WebSocket};

fn reloads(node: &TestNode) -> (u64, u64) {
    let s = node.stats();
    let a = &s["apps"]["ver"];
    (
        a["reloads"].as_u64().unwrap(),
        a["reloads_refused"].as_u64().unwrap(),
    )
}

#[test]
fn sighup_serves_new_objects_on_a_new_version_and_keeps_the_old_for_a_broken_one() {
    let dir = apps_dir(&[("ver.wat", &versioned(1))]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    assert_eq!(post(&node, "/o/ver/a", "").json()["v"], 1);
    let first = node.stats()["apps"]["ver"]["hash"].clone();

    std::fs::write(dir.join("ver.wat"), versioned(2)).unwrap();
    node.signal(Signal::SIGHUP);
    wait_stats(&node, "the reload", |s| s["apps"]["ver"]["reloads"] == 1);
    assert_eq!(post(&node, "/o/ver/b", "").json()["v"], 2);
    // A live object finishes at most the batch it has on the old version, then is let go and
    // restored on the new one.
    let _ = post(&node, "/o/ver/a", "");
    assert_eq!(post(&node, "/o/ver/a", "").json()["v"], 2);
    assert_ne!(node.stats()["apps"]["ver"]["hash"], first);

    std::fs::write(dir.join("ver.wat"), "(module (func $broken").unwrap();
    node.signal(Signal::SIGHUP);
    wait_stats(&node, "the refused reload", |s| {
        s["wasm_reloads_refused"] == 1
    });
    assert_eq!(reloads(&node), (1, 1));
    assert_eq!(
        post(&node, "/o/ver/c", "").json()["v"],
        2,
        "the old version kept"
    );
}

/// A module answering `{"v": <version>}` that writes a row first, so its objects keep their
/// database and stay live between requests.
fn versioned_writing(v: u32) -> String {
    format!(
        r#"(module
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{{\"v\":{v}}}")
  (data (i32.const 64) "CREATE TABLE IF NOT EXISTS k (x);\00")
  (data (i32.const 128) "INSERT INTO k VALUES (1)")
  (func (export "schema") (result i32) (i32.const 64))
  (func (export "handle") (result i32)
    (drop (call $sql (i32.const 128) (i32.const 24)))
    (call $respond (i32.const 200) (i32.const 0) (i32.const {len}))
    (i32.const 0)))"#,
        len = format!("{{\"v\":{v}}}").len()
    )
}

/// A reload reaches a live object that waits for mail: the next input runs on the new
/// version (found by the `host_imports` fuzz target: a live object ran one more batch on the
/// version it was restored on, so a request sent after the reload was answered by the old).
#[test]
fn sighup_reaches_a_live_object_waiting_for_mail() {
    let dir = apps_dir(&[("ver.wat", &versioned_writing(1))]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    assert_eq!(post(&node, "/o/ver/a", "").json()["v"], 1);
    assert_eq!(node.stats()["objects_live"], 1, "the object waits for mail");
    for v in 2..=4 {
        std::fs::write(dir.join("ver.wat"), versioned_writing(v)).unwrap();
        node.signal(Signal::SIGHUP);
        wait_stats(&node, "the reload", |s| {
            s["apps"]["ver"]["reloads"] == u64::from(v - 1)
        });
        assert_eq!(post(&node, "/o/ver/a", "").json()["v"], v);
    }
    let db = rusqlite::Connection::open_with_flags(
        node.data_dir.join("objects/ver/a.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let n: i64 = db
        .query_row("SELECT count(*) FROM k", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 4, "every request's row kept");
}

/// A reload reaches a hot object: one whose mailbox never empties (clients pipelining at it)
/// finishes its batch on the old version and then runs on the new one, its waiting requests
/// handed over in order; nothing is lost, and once a connection has seen the new version it
/// never sees the old again.
#[test]
fn sighup_reaches_an_object_whose_mailbox_never_empties() {
    use std::io::{BufReader, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = apps_dir(&[("ver.wat", &versioned(1))]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    assert_eq!(post(&node, "/o/ver/hot", "").json()["v"], 1);
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..48)
        .map(|i| {
            let stop = stop.clone();
            let addr = node.public();
            std::thread::spawn(move || {
                let s = connect_from(client_address(i), addr);
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                let req = b"POST /o/ver/hot HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
                // 48 connections with eight in flight each: the object always has mail.
                for _ in 0..8 {
                    w.write_all(req).unwrap();
                }
                let started = std::time::Instant::now();
                let mut saw_new = false;
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) || !saw_new {
                    let resp = read_response(&mut r);
                    assert_eq!(resp.status, 200, "{}", resp.text());
                    let v = resp.json()["v"].as_i64().unwrap();
                    assert!(!(saw_new && v == 1), "the old version after the new one");
                    saw_new |= v == 2;
                    seen.push(v);
                    w.write_all(req).unwrap();
                    assert!(
                        started.elapsed() < std::time::Duration::from_secs(20),
                        "never saw the new version in 20 s"
                    );
                }
                for _ in 0..8 {
                    assert_eq!(read_response(&mut r).status, 200);
                }
                seen
            })
        })
        .collect();
    // The object is hot before the reload.
    wait_stats(&node, "the clients' load", |s| {
        s["requests"].as_u64().unwrap_or(0) > 2_000
    });
    std::fs::write(dir.join("ver.wat"), versioned(2)).unwrap();
    node.signal(Signal::SIGHUP);
    wait_stats(&node, "the reload", |s| s["apps"]["ver"]["reloads"] == 1);
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let seen = c.join().unwrap();
        assert_eq!(seen.last(), Some(&2));
    }
    assert_eq!(post(&node, "/o/ver/hot", "").json()["v"], 2);
}

/// The close code and reason a WebSocket ends with (messages before it skipped).
fn close_of(ws: &mut WebSocket<TcpStream>) -> (u16, String) {
    loop {
        match ws.read() {
            Ok(Message::Close(Some(f))) => return (u16::from(f.code), f.reason.to_string()),
            Ok(Message::Close(None)) => panic!("a close without a code"),
            Ok(_) => continue,
            Err(e) => panic!("the WebSocket ended without a close frame: {e}"),
        }
    }
}

/// SIGHUP deploys a module that appeared and removes one that disappeared, without a restart:
/// the new app serves at once; the removed one answers 404, its sessions close 1001 and its
/// `/stats` entry goes; a module taking a built-in app's name, or one that does not load, is
/// refused and counted; an app added back runs its new module, even on an object that was live.
#[test]
fn sighup_adds_and_removes_modules() {
    let dir = apps_dir(&[("ver.wat", &versioned(1))]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    assert_eq!(post(&node, "/o/ver/a", "").json()["v"], 1);
    let mut ws = open_ws(&node, "/o/ver/a");
    let mut other = open_ws(&node, "/o/counter/stays");

    std::fs::write(dir.join("fresh.wat"), versioned(7)).unwrap();
    node.signal(Signal::SIGHUP);
    wait_stats(&node, "the module added", |s| s["wasm_apps_added"] == 1);
    assert_eq!(post(&node, "/o/fresh/x", "").json()["v"], 7);
    assert_eq!(node.stats()["apps"]["fresh"]["kind"], "wasm");

    std::fs::remove_file(dir.join("ver.wat")).unwrap();
    node.signal(Signal::SIGHUP);
    wait_stats(&node, "the module removed", |s| s["wasm_apps_removed"] == 1);
    assert_eq!(close_of(&mut ws), (1001, "app removed".into()));
    let r = post(&node, "/o/ver/a", "");
    assert_eq!(error(&r), (404, "no such app".into()));
    let s = wait_stats(&node, "the sessions closed", |s| {
        s["ws_app_removed_closed"] == 1
    });
    assert!(s["apps"].get("ver").is_none(), "{}", s["apps"]);
    other.send(Message::text("+")).unwrap();
    assert!(
        matches!(other.read().unwrap(), Message::Text(_)),
        "another app's session is untouched"
    );

    std::fs::write(dir.join("counter.wat"), versioned(9)).unwrap();
    std::fs::write(dir.join("broken.wat"), "(module (func").unwrap();
    node.signal(Signal::SIGHUP);
    wait_stats(&node, "the refusals", |s| s["wasm_apps_add_refused"] == 2);
    assert_eq!(node.stats()["apps"]["counter"]["kind"], "native");
    assert!(node.stats()["apps"].get("broken").is_none());
    std::fs::remove_file(dir.join("counter.wat")).unwrap();
    std::fs::remove_file(dir.join("broken.wat")).unwrap();

    std::fs::write(dir.join("ver.wat"), versioned(3)).unwrap();
    node.signal(Signal::SIGHUP);
    wait_stats(&node, "the module added back", |s| {
        s["wasm_apps_added"] == 2
    });
    assert_eq!(post(&node, "/o/ver/a", "").json()["v"], 3);
    assert_eq!(
        node.stats()["wasm_apps_removed"],
        1,
        "counter was never removed"
    );
}

/// Removing the module of a hot object loses nothing: every request pipelined at it is
/// answered, on its version (200) until the removal and `no such app` (404) after, never one
/// after the other in reverse on a connection.
#[test]
fn a_removed_module_answers_what_waits_for_its_objects() {
    use std::io::{BufReader, Write};
    let dir = apps_dir(&[("ver.wat", &versioned(1))]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    let req = b"POST /o/ver/hot HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    let clients: Vec<_> = (0..16)
        .map(|i| {
            let addr = node.public();
            std::thread::spawn(move || {
                let s = connect_from(client_address(i), addr);
                let mut w = s.try_clone().unwrap();
                let mut r = BufReader::new(s);
                for _ in 0..8 {
                    w.write_all(req).unwrap();
                }
                let (mut ok, mut gone) = (0u64, 0u64);
                // Each answer sends one more request, until eight 404s have come back.
                while gone < 8 {
                    let resp = read_response(&mut r);
                    match resp.status {
                        200 => {
                            assert_eq!(gone, 0, "a 200 after a 404 on one connection");
                            ok += 1;
                        }
                        404 => gone += 1,
                        s => panic!("status {s}: {}", resp.text()),
                    }
                    assert!(ok < 1_000_000, "the removal never took effect");
                    if gone == 0 {
                        w.write_all(req).unwrap();
                    }
                }
                ok
            })
        })
        .collect();
    wait_stats(&node, "the clients' load", |s| {
        s["requests"].as_u64().unwrap_or(0) > 1_000
    });
    std::fs::remove_file(dir.join("ver.wat")).unwrap();
    node.signal(Signal::SIGHUP);
    let ok: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let s = node.stats();
    assert_eq!(s["wasm_apps_removed"], 1);
    // Each connection read its last eight answers as 404s, with nothing more in flight: no
    // request went unanswered (a lost one would leave its reader waiting).
    assert!(ok > 0);
    assert_eq!(s["responses_4xx"], 16 * 8);
    assert_eq!(s["responses_5xx"], 0);
}
