//! Crash safety: `kill -9` while clients write (counter increments and million clicks), then
//! a restart: every acknowledged write is there, and every database passes
//! `PRAGMA integrity_check`. `tools/crash-loop.sh` runs this test many times over.
//! Also: a disk that fills up during writes.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use support::*;
use tungstenite::Message;

fn integrity_of_every_database(data: &std::path::Path) -> usize {
    let mut n = 0;
    for app in std::fs::read_dir(data.join("objects")).unwrap() {
        for f in std::fs::read_dir(app.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().and_then(|e| e.to_str()) == Some("sqlite") {
                let db = rusqlite::Connection::open(&p).unwrap();
                let check: String = db
                    .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                    .unwrap();
                assert_eq!(check, "ok", "{}", p.display());
                n += 1;
            }
        }
    }
    n
}

fn post_counter(
    addr: std::net::SocketAddr,
    name: &str,
    body: &str,
) -> Option<(u16, serde_json::Value)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(WAIT)).ok()?;
    write!(
        s,
        "POST /o/counter/{name} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.get(9..12)?.parse().ok()?;
    let json = serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()?;
    Some((status, json))
}

#[test]
fn acknowledged_writes_survive_kill_9() {
    let node = TestNode::start(&[]);
    let addr = node.public();
    let stop = Arc::new(AtomicBool::new(false));
    let counter_acked = Arc::new(Mutex::new(Vec::new()));
    let clicks_acked = Arc::new(Mutex::new(Vec::new()));

    let writers: Vec<_> = (0..4)
        .map(|_| {
            let (stop, acked) = (stop.clone(), counter_acked.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match post_counter(addr, "crash", "") {
                        Some((200, v)) => acked.lock().unwrap().push(v["value"].as_i64().unwrap()),
                        _ => return,
                    }
                }
            })
        })
        .collect();
    let clicker = {
        let (stop, acked) = (stop.clone(), clicks_acked.clone());
        let port = node.port;
        std::thread::spawn(move || {
            let stream = TcpStream::connect(addr).unwrap();
            stream.set_read_timeout(Some(WAIT)).unwrap();
            let url = format!("ws://127.0.0.2:{port}/o/million/crash?page=0");
            let (mut ws, _) = tungstenite::client(url.as_str(), stream).unwrap();
            let Ok(Message::Text(first)) = ws.read() else {
                return;
            };
            let me = serde_json::from_str::<serde_json::Value>(first.as_str()).unwrap()["s"]
                .as_u64()
                .unwrap();
            // Each box is clicked once: an acknowledged click leaves its box checked.
            for i in 0..4096u64 {
                if stop.load(Ordering::Relaxed)
                    || ws
                        .send(Message::text(format!(r#"{{"t":"click","i":{i},"c":{i}}}"#)))
                        .is_err()
                {
                    return;
                }
                loop {
                    match ws.read() {
                        Ok(Message::Text(t)) => {
                            let m: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
                            let mine = m["u"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|u| u[2] == me && u[3] == i);
                            if mine {
                                acked.lock().unwrap().push(i);
                                break;
                            }
                        }
                        Ok(_) => {}
                        Err(_) => return,
                    }
                }
            }
        })
    };
    let deadline = std::time::Instant::now() + WAIT;
    while counter_acked.lock().unwrap().len() < 100 || clicks_acked.lock().unwrap().len() < 100 {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for acknowledged writes"
        );
        std::thread::yield_now();
    }
    let data = node.kill9();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.join().unwrap();
    }
    clicker.join().unwrap();
    let counter_acked = counter_acked.lock().unwrap().clone();
    let clicks_acked = clicks_acked.lock().unwrap().clone();

    assert_eq!(integrity_of_every_database(&data), 2);
    let node = TestNode::start_in(data, &[]);
    let (status, v) = post_counter(node.public(), "crash", "0").unwrap();
    assert_eq!(status, 200);
    let value = v["value"].as_i64().unwrap();
    assert!(
        value >= *counter_acked.iter().max().unwrap(),
        "lost an acknowledged increment: {value}"
    );
    assert!(value as usize >= counter_acked.len());

    let stream = connect(node.public());
    let url = format!("ws://127.0.0.2:{}/o/million/crash?page=0", node.port);
    let (mut ws, _) = tungstenite::client(url.as_str(), stream).unwrap();
    let Message::Text(first) = ws.read().unwrap() else {
        panic!("no page state")
    };
    let page: serde_json::Value = serde_json::from_str(first.as_str()).unwrap();
    let hex = page["bits"].as_str().unwrap();
    let bit = |i: u64| {
        let byte =
            u8::from_str_radix(&hex[(i / 8 * 2) as usize..(i / 8 * 2 + 2) as usize], 16).unwrap();
        (byte >> (i % 8)) & 1
    };
    for i in &clicks_acked {
        assert_eq!(bit(*i), 1, "acknowledged click {i} lost");
    }
}

#[test]
fn a_full_disk_fails_writes_clearly_and_keeps_reads() {
    let Some(disk) = SmallDisk::mount("8m") else {
        return;
    };
    let data = disk.data_dir();
    let node = TestNode::start(&[("COMBD_DATA", data.to_str().unwrap())]);
    let (status, v) = post_counter(node.public(), "full", "").unwrap();
    assert_eq!((status, v["value"].as_i64()), (200, Some(1)));
    let filler = disk.fill();
    // Writes until the disk refuses one: a clear error, never a hang or a crash.
    let mut last_ok = 1;
    let mut refused = None;
    for _ in 0..10_000 {
        match post_counter(node.public(), "full", "") {
            Some((200, v)) => last_ok = v["value"].as_i64().unwrap(),
            Some((status, v)) => {
                refused = Some((status, v));
                break;
            }
            None => panic!("no answer from the node"),
        }
    }
    let (status, v) = refused.expect("a write was refused once the disk filled up");
    assert_eq!((status, v["error"].as_str()), (507, Some("db_full")), "{v}");
    // Reads still work and show the last acknowledged value.
    let mut s = connect(node.public());
    s.write_all(b"GET /o/counter/full HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s);
    let resp = read_response(&mut r);
    assert_eq!(
        (resp.status, resp.json()["value"].as_i64()),
        (200, Some(last_ok))
    );
    // Space back: writes work again, nothing was corrupted.
    std::fs::remove_file(filler).unwrap();
    let (status, v) = post_counter(node.public(), "full", "").unwrap();
    assert_eq!((status, v["value"].as_i64()), (200, Some(last_ok + 1)));
    let _ = r.fill_buf();
    drop(node);
    assert_eq!(integrity_of_every_database(&data), 1);
}
