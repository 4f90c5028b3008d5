//! Power cuts, simulated: a node runs in this process with every SQLite file going through a
//! VFS that remembers each write not yet covered by a completed sync (`support/powercut.rs`).
//! While clients pipeline `POST /o/counter/c` and a viewer of million board `b` clicks boxes
//! 0, 1, 2, ... of page 0 (each once, the next after the echo of the last), the test takes the
//! durable image of both objects' files at random instants (a cut: everything unsynced
//! dropped) and opens each image as SQLite would after the power came back: it must pass
//! `PRAGMA integrity_check`, hold at least the highest counter value any client had been
//! answered before the cut, and have every box checked whose click had been echoed.
//!
//! Shown able to fail: with `COMBD_SQLITE_SYNC=normal` (answers before any sync) and with the
//! test-only switch that answers a batch before its sync, cuts find answered writes missing.
//! `tools/powercut.sh` runs the cuts many more times (`POWERCUT_CUTS`).

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use combd_kernel::settings::Settings;
use combd_shards::{Node, NodeConfig};
use support::powercut;
use support::{connect, read_response};

/// The tests share the test-only switch and the process's CPUs: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());
/// Clients, and requests each keeps in flight.
const CLIENTS: usize = 4;
const DEPTH: usize = 8;

/// What a series of cuts found.
#[derive(Debug, Default)]
struct Found {
    cuts: usize,
    /// Cuts whose image held less than a client had been answered.
    lost: usize,
    /// The most answered increments missing from one image.
    most_missing: i64,
    /// The highest value answered by the end.
    answered: i64,
    /// Clicks echoed by the end.
    clicks: i64,
}

fn start_node(data: &Path, sync: &str) -> Node {
    let data_s = data.to_string_lossy().into_owned();
    let env: HashMap<&str, String> = [
        ("COMBD_LISTEN", "127.0.0.2:0".to_string()),
        ("COMBD_DATA", data_s),
        ("COMBD_SHARDS", "1".to_string()),
        ("COMBD_SQLITE_SYNC", sync.to_string()),
        // The clicker clicks as fast as echoes come back.
        ("COMBD_WS_RATE", "1000000".to_string()),
        ("COMBD_WS_BURST", "1000000".to_string()),
    ]
    .into_iter()
    .collect();
    let cpus = combd_kernel::sys::allowed_cpus().unwrap();
    let (_, settings) = Settings::load(|k| env.get(k).cloned(), &[], cpus.len()).unwrap();
    std::fs::create_dir_all(data.join("objects")).unwrap();
    // Nothing reads the coordinator's wakes: this node has no coordinator, and admission
    // stays open.
    let (coordinator, wakes) = std::sync::mpsc::sync_channel(1);
    std::mem::forget(wakes);
    let config = NodeConfig {
        settings,
        apps: combd::apps::builtin(),
        max_conns_effective: 1000,
        memory_budget_source: "env",
        memory_budget_bytes: 1 << 30,
        outbound_budget_bytes: 64 << 20,
        inbound_budget_bytes: 64 << 20,
        coordinator,
        tls: None,
        auth: None,
        access_log: None,
    };
    Node::start(config, &cpus[..1]).unwrap()
}

/// One client: `DEPTH` increments written at once, their answers read, again until `stop`.
fn client(addr: SocketAddr, answered: Arc<AtomicI64>, stop: Arc<AtomicBool>) {
    let mut s = connect(addr);
    let mut r = BufReader::new(s.try_clone().unwrap());
    let one = "POST /o/counter/c HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    let burst = one.repeat(DEPTH);
    while !stop.load(Ordering::Relaxed) {
        s.write_all(burst.as_bytes()).unwrap();
        for _ in 0..DEPTH {
            let resp = read_response(&mut r);
            assert_eq!(resp.status, 200, "{}", resp.text());
            let v: serde_json::Value = serde_json::from_slice(&resp.body).unwrap();
            answered.fetch_max(v["value"].as_i64().unwrap(), Ordering::SeqCst);
        }
    }
}

/// The viewer of page 0 of board `b`: clicks box 0, 1, 2, ... once each, the next after the
/// echo of the last; `clicked` is the last box whose click was echoed.
fn clicker(addr: SocketAddr, clicked: Arc<AtomicI64>, stop: Arc<AtomicBool>) {
    use tungstenite::Message;
    let stream = connect(addr);
    let url = format!("ws://{addr}/o/million/b?page=0");
    let (mut ws, _) = tungstenite::client(url.as_str(), stream).unwrap();
    // A benchmark elsewhere on the machine may stop and continue this process: a blocking
    // call then fails with EINTR, which is no error of the node's.
    let interrupted = |e: &tungstenite::Error| matches!(e, tungstenite::Error::Io(io) if io.kind() == std::io::ErrorKind::Interrupted);
    let read = |ws: &mut tungstenite::WebSocket<std::net::TcpStream>| loop {
        match ws.read() {
            Err(e) if interrupted(&e) => continue,
            r => return r.unwrap(),
        }
    };
    let Message::Text(first) = read(&mut ws) else {
        panic!("no page state")
    };
    let me = serde_json::from_str::<serde_json::Value>(first.as_str()).unwrap()["s"].clone();
    for i in 0..4096i64 {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let click = format!(r#"{{"t":"click","i":{i},"c":{i}}}"#);
        let mut sent = ws.send(Message::text(click));
        while let Err(e) = &sent {
            assert!(interrupted(e), "{e}");
            sent = ws.flush();
        }
        loop {
            let Message::Text(t) = read(&mut ws) else {
                continue;
            };
            let m: serde_json::Value = serde_json::from_str(t.as_str()).unwrap();
            assert!(m.get("error").is_none(), "{m}");
            let echoed = m["u"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|u| u[2] == me && u[3] == i);
            if echoed {
                clicked.store(i, Ordering::SeqCst);
                break;
            }
        }
    }
}

/// Writes a cut's images to `scratch` and opens `file` as SQLite would after the power came
/// back (`None` if the cut had no image of it); it must pass `integrity_check`.
fn recover(
    images: &[(PathBuf, Vec<u8>)],
    scratch: &Path,
    file: &str,
) -> Option<rusqlite::Connection> {
    let _ = std::fs::remove_dir_all(scratch);
    std::fs::create_dir_all(scratch).unwrap();
    for (path, bytes) in images {
        std::fs::write(scratch.join(path.file_name().unwrap()), bytes).unwrap();
    }
    if !scratch.join(file).exists() {
        return None;
    }
    let db = rusqlite::Connection::open_with_flags_and_vfs(
        scratch.join(file),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE,
        "unix",
    )
    .unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok", "the image of {file} after a cut is corrupt");
    Some(db)
}

/// What a cut's images hold: the counter's value, and how many of boxes 0, 1, ... of the
/// board's page 0 are checked in a row.
fn recovered(images: &[(PathBuf, Vec<u8>)], scratch: &Path) -> (i64, i64) {
    let value = recover(images, scratch, "c.sqlite").map_or(0, |db| {
        db.query_row("SELECT value FROM counter WHERE id = 1", [], |r| r.get(0))
            .unwrap_or(0)
    });
    let bits: Vec<u8> = recover(images, scratch, "b.sqlite")
        .and_then(|db| {
            db.query_row("SELECT bits FROM pages WHERE page = 0", [], |r| r.get(0))
                .ok()
        })
        .unwrap_or_default();
    let checked = (0..4096usize)
        .take_while(|i| bits.get(i / 8).is_some_and(|b| (b >> (i % 8)) & 1 == 1))
        .count();
    (value, checked as i64)
}

/// Runs clients against a fresh node and takes up to `cuts` cuts (fewer if `stop_at_loss`
/// and one lost an answered write).
fn cuts(name: &str, sync: &str, cuts: usize, stop_at_loss: bool) -> Found {
    powercut::register();
    let base = std::env::temp_dir().join(format!("combd-powercut-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let data = base.join("data");
    let node = start_node(&data, sync);
    let addr = node.public_addr();
    let answered = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clicked = Arc::new(AtomicI64::new(-1));
    let mut clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let (a, s) = (answered.clone(), stop.clone());
            std::thread::spawn(move || client(addr, a, s))
        })
        .collect();
    let (c, s) = (clicked.clone(), stop.clone());
    clients.push(std::thread::spawn(move || clicker(addr, c, s)));
    let objects = [data.join("objects/counter"), data.join("objects/million")];
    let dirs = [objects[0].as_path(), objects[1].as_path()];
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut found = Found::default();
    let mut seed = std::process::id() as u64 | 1;
    while found.cuts < cuts && Instant::now() < deadline {
        // A random instant: up to 2 ms after the last cut was checked.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_micros(seed % 2000));
        let ((seen, seen_clicked), images) =
            powercut::cut(&dirs, &[".sqlite", ".sqlite-wal"], || {
                (
                    answered.load(Ordering::SeqCst),
                    clicked.load(Ordering::SeqCst),
                )
            });
        if images.is_empty() {
            continue;
        }
        let (value, checked) = recovered(&images, &base.join("image"));
        found.cuts += 1;
        // Boxes 0..=seen_clicked were echoed: all must be checked.
        let clicks_missing = (seen_clicked + 1 - checked).max(0);
        if value < seen || clicks_missing > 0 {
            found.lost += 1;
            found.most_missing = found.most_missing.max(seen - value).max(clicks_missing);
            if stop_at_loss {
                break;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    found.answered = answered.load(Ordering::SeqCst);
    found.clicks = clicked.load(Ordering::SeqCst) + 1;
    node.drain_handle().drain();
    node.wait().unwrap();
    let _ = std::fs::remove_dir_all(&base);
    eprintln!("{name}: {found:?}");
    found
}

/// The broken orders stop at their first loss, unless `POWERCUT_ALL` asks for every cut (to
/// count how often a cut catches them).
fn stop_at_loss() -> bool {
    std::env::var_os("POWERCUT_ALL").is_none()
}

fn cut_count(default: usize) -> usize {
    std::env::var("POWERCUT_CUTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn answered_writes_survive_power_cuts() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let n = cut_count(200);
    let found = cuts("full", "full", n, false);
    assert_eq!(
        found.cuts, n,
        "every cut was taken within the time: {found:?}"
    );
    assert!(
        found.answered > 0 && found.clicks > 0,
        "the clients were answered: {found:?}"
    );
    assert_eq!(found.lost, 0, "a cut lost answered writes: {found:?}");
}

#[test]
fn answering_before_the_sync_is_caught() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    combd_shards::testing::ACK_BEFORE_SYNC.store(true, Ordering::SeqCst);
    let found = cuts("answer-first", "full", cut_count(2000), stop_at_loss());
    combd_shards::testing::ACK_BEFORE_SYNC.store(false, Ordering::SeqCst);
    assert!(
        found.lost > 0,
        "no cut caught an answer before its sync: {found:?}"
    );
}

#[test]
fn synchronous_normal_loses_answered_writes_at_a_cut() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let found = cuts("normal", "normal", cut_count(200), stop_at_loss());
    assert!(
        found.lost > 0,
        "no cut lost a write answered without a sync: {found:?}"
    );
}

#[test]
fn the_simulated_disk_drops_only_what_was_not_synced() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    powercut::register();
    let dir = std::env::temp_dir().join(format!("combd-powercut-{}-direct", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let db = rusqlite::Connection::open(dir.join("t.sqlite")).unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; CREATE TABLE t (v INTEGER);
         INSERT INTO t VALUES (1); PRAGMA synchronous=OFF; INSERT INTO t VALUES (2);",
    )
    .unwrap();
    let ((), images) = powercut::cut(&[dir.as_path()], &[".sqlite", ".sqlite-wal"], || ());
    let scratch = dir.join("image");
    std::fs::create_dir_all(&scratch).unwrap();
    for (path, bytes) in images {
        std::fs::write(scratch.join(path.file_name().unwrap()), bytes).unwrap();
    }
    let img = rusqlite::Connection::open_with_flags_and_vfs(
        scratch.join("t.sqlite"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE,
        "unix",
    )
    .unwrap();
    let rows: Vec<i64> = img
        .prepare("SELECT v FROM t")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        rows,
        [1],
        "the synced commit survives, the unsynced one does not"
    );
    drop(db);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `/stats` of an in-process node, from its localhost listener.
fn stats(node: &Node) -> serde_json::Value {
    let r = support::request(
        node.local_addr(),
        b"GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    serde_json::from_slice(&r.body).unwrap()
}

/// Polls `/stats` until `batches` reaches `n` (nothing else to wait on but the node's figures).
fn wait_batches(node: &Node, n: u64) {
    let deadline = Instant::now() + support::WAIT;
    while stats(node)["batches"].as_u64().unwrap() < n {
        assert!(Instant::now() < deadline, "timed out waiting for batch {n}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn nothing_is_answered_before_its_sync_and_an_object_stops_past_its_unsynced_batches() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    powercut::register();
    let base = std::env::temp_dir().join(format!("combd-powercut-{}-held", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let data = base.join("data");
    let node = start_node(&data, "full");
    let post = b"POST /o/counter/h HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(support::request(node.public_addr(), post).status, 200);
    let cap = stats(&node)["limits"]["object_unsynced_batches"]
        .as_u64()
        .unwrap();
    let before = stats(&node)["batches"].as_u64().unwrap();
    // The disk stops answering syncs. One request at a time, so each is a batch of its own:
    // the first waits for its sync, `cap - 1` more commit behind it, one more commits and
    // waits to be handed over; past that the object runs nothing.
    powercut::hold_syncs(&data);
    let mut conns = Vec::new();
    for i in 0..cap + 3 {
        let mut c = connect(node.public_addr());
        c.write_all(post).unwrap();
        conns.push(c);
        if i <= cap {
            wait_batches(&node, before + i + 1);
        }
    }
    // An absence has no event to wait on: short read timeouts stand for "nothing came".
    for c in &conns {
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut b = [0u8; 1];
        assert!(
            std::io::Read::read(&mut &*c, &mut b).is_err(),
            "an answer left before its sync returned"
        );
    }
    let s = stats(&node);
    assert_eq!(
        s["batches"].as_u64().unwrap(),
        before + cap + 1,
        "the object stopped past {cap} unsynced batches: {s}"
    );
    powercut::release_syncs();
    let mut values = Vec::new();
    for c in conns {
        c.set_read_timeout(Some(support::WAIT)).unwrap();
        let r = read_response(&mut BufReader::new(c));
        assert_eq!(r.status, 200, "{}", r.text());
        values.push(r.json()["value"].as_i64().unwrap());
    }
    values.sort();
    assert_eq!(values, (2..=cap as i64 + 4).collect::<Vec<_>>());
    let s = stats(&node);
    let group = s["sync_group_max"].as_u64().unwrap();
    assert!(
        (2..=cap).contains(&group),
        "batches that committed during a sync shared the next one, at most {cap}: {s}"
    );
    node.drain_handle().drain();
    node.wait().unwrap();
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn a_failed_sync_is_answered_500_and_the_object_reloads() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    powercut::register();
    let base = std::env::temp_dir().join(format!("combd-powercut-{}-fail", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let data = base.join("data");
    let node = start_node(&data, "full");
    let post = b"POST /o/counter/f HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    assert_eq!(support::request(node.public_addr(), post).status, 200);
    powercut::fail_syncs(Some(&data));
    let r = support::request(node.public_addr(), post);
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (500, Some("object storage unavailable")),
        "a write whose sync failed is not acknowledged"
    );
    powercut::fail_syncs(None);
    // The object reloads its database and serves again.
    let r = support::request(node.public_addr(), post);
    assert_eq!(r.status, 200, "{}", r.text());
    let s = stats(&node);
    assert_eq!(s["wal_sync_failed_inputs"], 1, "{s}");
    assert!(s["reloads"].as_u64().unwrap() >= 1, "{s}");
    node.drain_handle().drain();
    node.wait().unwrap();
    let _ = std::fs::remove_dir_all(&base);
}
