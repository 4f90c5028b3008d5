//! Sessions never see a wrong board silently: a viewer that falls behind is resynced (its
//! page sent again) and ends equal to the database; a viewer that stops reading is closed as
//! slow within `COMBD_WS_SLOW_TIMEOUT`.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;
use tungstenite::{Message, WebSocket};

const PAGE_BOXES: usize = 4096;

/// A viewer on a raw socket with a small receive buffer, so that what it does not read stays
/// on the node's side.
fn raw_viewer(addr: SocketAddr, port: u16, board: &str) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect_timeout(&addr.into(), WAIT).unwrap();
    let mut s: TcpStream = sock.into();
    s.set_read_timeout(Some(WAIT)).unwrap();
    upgrade_raw(
        &mut s,
        &format!("/o/million/{board}?page=0"),
        &format!("127.0.0.2:{port}"),
    );
    s
}

/// A board page as a viewer sees it, built from the page and set messages.
#[derive(Default, Clone)]
struct Page {
    bits: Vec<u8>,
    pages_seen: usize,
}

impl Page {
    fn apply(&mut self, msg: &serde_json::Value) {
        match msg["t"].as_str() {
            Some("page") => {
                let hex = msg["bits"].as_str().unwrap();
                self.bits = (0..hex.len() / 2)
                    .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
                    .collect();
                self.pages_seen += 1;
            }
            Some("set") => {
                for u in msg["u"].as_array().unwrap() {
                    let i = u[0].as_u64().unwrap() as usize % PAGE_BOXES;
                    let v = u[1].as_u64().unwrap() as u8;
                    self.bits[i / 8] = (self.bits[i / 8] & !(1 << (i % 8))) | (v << (i % 8));
                }
            }
            _ => panic!("unexpected message {msg}"),
        }
    }
}

fn open_ws(node: &TestNode, board: &str) -> WebSocket<TcpStream> {
    let url = format!("ws://127.0.0.2:{}/o/million/{board}?page=0", node.port);
    tungstenite::client(url.as_str(), connect(node.public()))
        .expect("websocket handshake")
        .0
}

fn read_json(ws: &mut WebSocket<TcpStream>) -> serde_json::Value {
    loop {
        if let Message::Text(t) = ws.read().expect("timed out waiting for a message") {
            return serde_json::from_str(&t).unwrap();
        }
    }
}

/// The page as the database holds it: what a new viewer is sent.
fn database_page(node: &TestNode, board: &str) -> Vec<u8> {
    let mut ws = open_ws(node, board);
    let mut page = Page::default();
    page.apply(&read_json(&mut ws));
    page.bits
}

/// Clicks box `i` and waits for the update carrying this click (`c`), so every click is its
/// own batch and its own message to the viewers.
fn click_and_wait(ws: &mut WebSocket<TcpStream>, i: usize, c: u64) {
    ws.send(Message::text(format!(r#"{{"t":"click","i":{i},"c":{c}}}"#)))
        .unwrap();
    loop {
        let m = read_json(ws);
        if m["t"] == "set" && m["u"].as_array().unwrap().iter().any(|u| u[3] == c) {
            return;
        }
    }
}

#[test]
fn a_viewer_on_a_shard_behind_is_resynced_and_ends_equal_to_the_database() {
    use combd_shards::app::home_shard;
    let node = TestNode::start(&[("COMBD_SHARDS", "2"), ("COMBD_MAX_AWAKE", "1"), TEST_APPS]);
    // A board living on shard 1, a viewer on shard 0, a clicker on shard 1.
    let board = (0..)
        .map(|i| format!("b{i}"))
        .find(|b| home_shard("million", b, 2) == 1)
        .unwrap();
    let (mut viewer, mut clicker) = (None, None);
    for _ in 0..200 {
        let mut ws = open_ws(&node, &board);
        let first = read_json(&mut ws);
        match first["s"].as_u64().unwrap() >> 40 {
            0 if viewer.is_none() => viewer = Some((ws, first)),
            1 if clicker.is_none() => clicker = Some(ws),
            _ => {}
        }
        if viewer.is_some() && clicker.is_some() {
            break;
        }
    }
    let ((mut viewer, first), mut clicker) = (
        viewer.expect("a viewer on shard 0"),
        clicker.expect("a clicker on shard 1"),
    );
    let mut page = Page::default();
    page.apply(&first);
    // Make shard 0 behind: one held object at work (the cap is 1), one more in the line.
    let holds: Vec<String> = (0..)
        .map(|i| format!("h{i}"))
        .filter(|h| home_shard("hold", h, 2) == 0)
        .take(2)
        .collect();
    let addr = node.public();
    let hold = |h: String, ms: u32| {
        std::thread::spawn(move || {
            let raw = format!(
                "POST /o/hold/{h}?ms={ms} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            );
            request(addr, raw.as_bytes()).status
        })
    };
    let first_hold = hold(holds[0].clone(), 3000);
    wait_stats(&node, "shard 0 at its awake cap", |s| {
        s["shards"][0]["cells_awake"] == 1
    });
    let second_hold = hold(holds[1].clone(), 0);
    wait_stats(&node, "shard 0 behind", |s| s["shards"][0]["behind"] == 1);
    // 30 clicks, each echoed to the clicker (shard 1 is not behind); the viewer's mailbox
    // holds 8 while its shard is behind, so it misses some.
    for c in 1..=30u64 {
        click_and_wait(&mut clicker, c as usize, c);
    }
    let s = node.stats();
    let dropped = s["shards"][0]["session_mailbox_dropped"].as_u64().unwrap();
    assert!(dropped >= 22, "at most 8 of 30 kept: {s}");
    assert_eq!(first_hold.join().unwrap(), 200);
    assert_eq!(second_hold.join().unwrap(), 200);
    // Once the shard catches up, the viewer is sent its page again and ends equal to the
    // database, never silently wrong.
    let want = database_page(&node, &board);
    let deadline = Instant::now() + WAIT;
    while page.bits != want || page.pages_seen < 2 {
        assert!(Instant::now() < deadline, "the viewer never caught up");
        page.apply(&read_json(&mut viewer));
    }
    let s = node.stats();
    assert!(
        s["shards"][0]["session_resyncs"].as_u64().unwrap() >= 1,
        "{s}"
    );
    assert_eq!(s["ws_slow_closed"], 0);
}

#[test]
fn a_viewer_that_stops_reading_is_closed_within_the_slow_timeout() {
    let (node, mut never, mut clicker) = slow_viewer_and_clicker("stuck");
    let started = Instant::now();
    let mut c = 0;
    // Click until the node closes the viewer that reads nothing (bounded by the wait).
    while sum(&node.stats(), "ws_slow_closed") == 0 {
        assert!(
            started.elapsed() < WAIT,
            "the viewer was never closed as slow"
        );
        for _ in 0..50 {
            c += 1;
            click_and_wait(&mut clicker, c % PAGE_BOXES, c as u64);
        }
    }
    // The clicker, which reads, is kept.
    click_and_wait(&mut clicker, 1, 1_000_000);
    // The closed viewer's socket ends (after what was already in flight).
    read_until_closed(&mut never);
    let s = node.stats();
    assert_eq!(sum(&s, "ws_slow_closed"), 1, "{s}");
    assert_eq!(s["limits"]["ws_slow_timeout_ms"], 2000);
}

/// A viewer whose socket takes nothing more while its mail waits, and no new mail comes to
/// decide it slow: its pending write fails after `COMBD_WS_SLOW_TIMEOUT` and ends it as a slow
/// reader, 1008 and counted, like a delivery that finds it stuck (before, this path waited for
/// the 30 s write stall timeout and dropped the connection uncounted).
#[test]
fn a_viewer_whose_write_stalls_is_closed_as_slow_and_counted() {
    let (node, mut never, mut clicker) = slow_viewer_and_clicker("stall");
    // Click until frames pile up for the viewer (its 4 KiB receive buffer and the node's send
    // buffer are full), then stop: nothing new is delivered to it.
    let started = Instant::now();
    let mut c = 0;
    while sum(&node.stats(), "outbound_bytes") < 8 * 1024 {
        assert!(
            started.elapsed() < WAIT,
            "the viewer's frames never piled up"
        );
        for _ in 0..50 {
            c += 1;
            click_and_wait(&mut clicker, c % PAGE_BOXES, c as u64);
        }
    }
    wait_stats(&node, "the stalled viewer closed as slow", |s| {
        sum(s, "ws_slow_closed") == 1
    });
    // Its mail is given back at once; its close frame is counted while it is written (at most
    // twice `close_linger_ms` on a socket that takes nothing), then given back too.
    wait_stats(&node, "its bytes given back", |s| {
        sum(s, "outbound_bytes") == 0
    });
    // Its socket ends once what was in flight is read; the clicker is kept.
    read_until_closed(&mut never);
    click_and_wait(&mut clicker, 1, 1_000_000);
}

/// A node whose viewers are slow after 2 s, a raw viewer of `board` that will read nothing
/// (its receive buffer 4 KiB), and a clicker of the same board that reads.
fn slow_viewer_and_clicker(board: &str) -> (TestNode, TcpStream, WebSocket<TcpStream>) {
    let node = TestNode::start(&[
        ("COMBD_SHARDS", "1"),
        ("COMBD_SQLITE_SYNC", "normal"),
        ("COMBD_WS_SLOW_TIMEOUT", "2s"),
        ("COMBD_WS_RATE", "100000"),
        ("COMBD_WS_BURST", "100000"),
    ]);
    let never = raw_viewer(node.public(), node.port, board);
    let mut clicker = open_ws(&node, board);
    read_json(&mut clicker);
    (node, never, clicker)
}

fn sum(stats: &serde_json::Value, key: &str) -> u64 {
    stats[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {stats}"))
}

#[test]
fn a_viewer_that_reads_slowly_but_steadily_is_kept_and_ends_equal_to_the_database() {
    let node = TestNode::start(&[
        ("COMBD_SHARDS", "1"),
        ("COMBD_SQLITE_SYNC", "normal"),
        ("COMBD_WS_SLOW_TIMEOUT", "3s"),
        ("COMBD_WS_RATE", "100000"),
        ("COMBD_WS_BURST", "100000"),
    ]);
    let mut slow = raw_viewer(node.public(), node.port, "steady");
    let mut clicker = open_ws(&node, "steady");
    read_json(&mut clicker);
    // The viewer reads one message every 5 ms (the client's own slowness) until told to
    // catch up; everything it reads is applied in order.
    let page = Arc::new(Mutex::new(Page::default()));
    let catch_up = Arc::new(AtomicBool::new(false));
    let reader = {
        let (page, catch_up) = (page.clone(), catch_up.clone());
        std::thread::spawn(move || {
            while let Ok((op, payload)) = read_frame(&mut slow) {
                if op == 8 {
                    return Some(payload);
                }
                if op == 1 {
                    let msg = serde_json::from_slice(&payload).unwrap();
                    page.lock().unwrap().apply(&msg);
                }
                if !catch_up.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            None
        })
    };
    for c in 0..3_000u64 {
        click_and_wait(&mut clicker, (c as usize * 13) % PAGE_BOXES, c + 1);
    }
    catch_up.store(true, Ordering::Relaxed);
    let want = database_page(&node, "steady");
    let deadline = Instant::now() + WAIT;
    while page.lock().unwrap().bits != want {
        assert!(
            Instant::now() < deadline,
            "the steady viewer never caught up"
        );
        assert!(!reader.is_finished(), "the steady viewer was closed");
        std::thread::sleep(Duration::from_millis(10)); // polling the reader thread's copy
    }
    // It fell seconds behind (it reads 200 messages a second, the clicks came faster) but
    // kept taking what waited, so the slow timeout (3 s) did not close it.
    let s = node.stats();
    assert_eq!(sum(&s, "ws_slow_closed"), 0, "{s}");
}
