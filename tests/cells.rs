//! Cells against the real node: durable objects, mailboxes, batches, the wake queue, restores
//! and eviction, sessions and broadcasts across shards, and the million app's page (its protocol
//! is in `tests/million.rs`).

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use support::*;

fn sum(stats: &serde_json::Value, key: &str) -> u64 {
    stats[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} in {stats}"))
}

#[test]
fn counter_is_durable_and_answers_only_committed_values() {
    let node = TestNode::start(&[]);
    for i in 1..=5 {
        assert_eq!(post(&node, "/o/counter/a", "").json()["value"], i);
    }
    assert_eq!(post(&node, "/o/counter/a", "10").json()["value"], 15);
    let bad = post(&node, "/o/counter/a", "ten");
    assert_eq!(bad.status, 400);
    assert_eq!(bad.json()["error"], "the body must be a whole number");
    assert_eq!(get(&node, "/o/counter/a").json()["value"], 15);
    assert_eq!(get(&node, "/o/counter/other").json()["value"], 0);
    assert!(node.data_dir.join("objects/counter/a.sqlite").exists());
}

#[test]
fn acknowledged_increments_survive_kill_9() {
    let node = TestNode::start(&[]);
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addr = node.public();
    let writers: Vec<_> = (0..8)
        .map(|_| {
            let acked = acked.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(addr) else {
                        return;
                    };
                    s.set_read_timeout(Some(WAIT)).unwrap();
                    if s.write_all(
                        b"POST /o/counter/durable HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                    )
                    .is_err()
                    {
                        return;
                    }
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    if std::io::BufRead::read_line(&mut r, &mut line).is_err()
                        || !line.contains(" 200 ")
                    {
                        return;
                    }
                    // Read the rest of the response: an answer is an acknowledgement.
                    let mut rest = String::new();
                    while std::io::BufRead::read_line(&mut r, &mut rest).is_ok_and(|n| n > 2) {
                        rest.clear();
                    }
                    let mut body = vec![0u8; 64];
                    let n = std::io::Read::read(&mut r, &mut body).unwrap_or(0);
                    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body[..n]) {
                        acked.lock().unwrap().push(v["value"].as_i64().unwrap());
                    }
                }
            })
        })
        .collect();
    // Let some writes be acknowledged, then kill the node in the middle of them.
    let deadline = std::time::Instant::now() + WAIT;
    while acked.lock().unwrap().len() < 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for acknowledged writes"
        );
        std::thread::yield_now();
    }
    let data = node.kill9();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    let max_acked = *acked.iter().max().unwrap();

    let db = rusqlite::Connection::open(data.join("objects/counter/durable.sqlite")).unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
    drop(db);
    let node = TestNode::start_in(data, &[]);
    let v = get(&node, "/o/counter/durable").json()["value"]
        .as_i64()
        .unwrap();
    assert!(
        v >= max_acked,
        "value {v} after restart lost acknowledged value {max_acked}"
    );
    assert!(
        v as usize >= acked.len(),
        "{} acknowledged increments, value {v}",
        acked.len()
    );
}

#[test]
fn mailbox_overflow_refuses_exactly_the_excess() {
    // hold's mailbox is 8. One request holds the object; 12 more arrive meanwhile.
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "1")]);
    let first = std::thread::spawn({
        let addr = node.public();
        move || {
            request(
                addr,
                b"POST /o/hold/m?ms=1500 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            )
        }
    });
    wait_stats(&node, "the first request to hold the object", |s| {
        s["cells_awake"] == 1
    });
    let addr = node.public();
    let rest: Vec<_> = (0..12)
        .map(|_| {
            std::thread::spawn(move || {
                request(
                    addr,
                    b"POST /o/hold/m HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                )
            })
        })
        .collect();
    let mut ok_seqs = Vec::new();
    let mut refused = 0;
    for t in rest {
        let r = t.join().unwrap();
        match r.status {
            200 => ok_seqs.push(r.json()["seq"].as_i64().unwrap()),
            503 => {
                assert_eq!(r.json()["error"], "overloaded");
                assert_eq!(r.header("retry-after"), Some("1"));
                refused += 1;
            }
            s => panic!("unexpected status {s}"),
        }
    }
    assert_eq!(first.join().unwrap().json()["seq"], 1);
    ok_seqs.sort();
    assert_eq!(
        ok_seqs,
        (2..=9).collect::<Vec<_>>(),
        "the 8 in the mailbox, answered in order"
    );
    assert_eq!(refused, 4);
    let s = node.stats();
    assert_eq!(sum(&s, "mailbox_refused"), 4);
    assert!(sum(&s, "mailbox_oldest_age_ms") > 0);
}

#[test]
fn a_failing_request_in_a_batch_leaves_no_partial_write() {
    let node = TestNode::start(&[]);
    let addr = node.public();
    let threads: Vec<_> = (0..24)
        .map(|t| {
            std::thread::spawn(move || {
                let mut results = Vec::new();
                for i in 0..15 {
                    let bad = (t + i) % 5 == 0;
                    let body = if bad { "nope" } else { "1" };
                    let r = request(
                        addr,
                        format!(
                            "POST /o/counter/batch HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    );
                    results.push((bad, r.status, r.json()["value"].as_i64()));
                }
                results
            })
        })
        .collect();
    let results: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let good: Vec<i64> = results
        .iter()
        .filter(|r| !r.0)
        .map(|r| r.2.unwrap())
        .collect();
    assert!(results.iter().all(|(bad, status, _)| if *bad {
        *status == 400
    } else {
        *status == 200
    }));
    let mut sorted = good.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        good.len(),
        "every good increment got its own value"
    );
    assert_eq!(
        get(&node, "/o/counter/batch").json()["value"],
        good.len() as i64
    );
    let s = node.stats();
    assert!(
        sum(&s, "batch_max") >= 2,
        "requests waiting together formed batches: {s}"
    );
    assert!(
        sum(&s, "batch_max") <= 100,
        "no batch past the app's batch size"
    );
}

#[test]
fn wake_queue_caps_cells_at_work() {
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "1"), ("COMBD_MAX_AWAKE", "2")]);
    let addr = node.public();
    let threads: Vec<_> = (0..6)
        .map(|i| {
            std::thread::spawn(move || {
                request(
                    addr,
                    format!(
                        "POST /o/hold/w{i}?ms=300 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
                    )
                    .as_bytes(),
                )
            })
        })
        .collect();
    for t in threads {
        assert_eq!(
            t.join().unwrap().status,
            200,
            "every cell is served in the end"
        );
    }
    let s = node.stats();
    assert_eq!(sum(&s, "cells_awake_max"), 2, "{s}");
    assert!(sum(&s, "sessions_waited") >= 1, "{s}");
    assert_eq!(sum(&s, "sessions_ready"), 0);
}

#[test]
fn restores_one_at_a_time_and_idle_objects_are_let_go() {
    let node = TestNode::start(&[("COMBD_RESTORES_AT_ONCE", "1"), ("COMBD_SHARDS", "1")]);
    let addr = node.public();
    let threads: Vec<_> = (0..10)
        .map(|i| {
            std::thread::spawn(move || {
                request(
                    addr,
                    format!(
                        "POST /o/counter/r{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
                    )
                    .as_bytes(),
                )
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap().status, 200);
    }
    let s = node.stats();
    assert_eq!(sum(&s, "restores_active_max"), 1);
    assert!(sum(&s, "restores") >= 10);
    // Idle for a second: every object is closed.
    wait_stats(&node, "idle objects to be let go", |s| {
        s["objects_live"] == 0
    });
    // And opened again on the next request, with its data.
    assert_eq!(post(&node, "/o/counter/r3", "").json()["value"], 2);
}

#[test]
fn object_names_cannot_escape_the_data_dir() {
    let node = TestNode::start(&[]);
    for path in [
        "/o/counter/..",
        "/o/counter/.x",
        "/o/counter/a%2f..%2fb",
        "/o/counter/a\\b",
        "/o/counter/",
    ] {
        let r = post(&node, path, "");
        assert_eq!(r.status, 400, "{path}");
    }
    // A path under an object reaches the object (its app is told the rest): `a`, not `a/b`.
    let r = post(&node, "/o/counter/a/../../b", "");
    assert_eq!(r.status, 200);
    // Nothing was created but the data directory's own tree: its objects, its lock and its
    // alarm index, and in it the one database of `a`.
    let made: Vec<_> = std::fs::read_dir(&node.data_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        made.iter().all(|n| n == "objects"
            || n == "combd.lock"
            || n.to_str().is_some_and(|n| n.starts_with("alarms-"))),
        "{made:?}"
    );
    let objects: Vec<_> = std::fs::read_dir(node.data_dir.join("objects/counter"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".sqlite"))
        .collect();
    assert_eq!(objects, ["a.sqlite"]);
}

#[test]
fn million_page_is_served() {
    let node = TestNode::start(&[]);
    let r = get(&node, "/million/");
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    // It connects with the node's JavaScript client, which the node serves beside it.
    assert!(
        r.text().contains(r#"from "/combd-client.js""#),
        "{}",
        r.text()
    );
    assert_eq!(get(&node, "/combd-client.js").status, 200);
}

#[test]
fn new_object_on_a_low_disk_gets_507_and_existing_ones_keep_working() {
    let Some(disk) = SmallDisk::mount("8m") else {
        return;
    };
    let data = disk.data_dir();
    let node = TestNode::start(&[("COMBD_DATA", data.to_str().unwrap())]);
    assert_eq!(post(&node, "/o/counter/existing", "").json()["value"], 1);
    let filler = disk.fill();
    wait_stats(&node, "disk_low", |s| s["disk_low"] == 1);
    let r = post(&node, "/o/counter/brand-new", "");
    assert_eq!(r.status, 507);
    assert_eq!(r.json()["error"], "disk_low");
    assert!(!data.join("objects/counter/brand-new.sqlite").exists());
    assert_eq!(get(&node, "/o/counter/existing").json()["value"], 1);
    std::fs::remove_file(filler).unwrap();
    wait_stats(&node, "disk_low to clear", |s| s["disk_low"] == 0);
    assert_eq!(post(&node, "/o/counter/brand-new", "").json()["value"], 1);
}
