//! Clients written to hurt the node, against the real node: each attack is held to the bytes
//! and connections the node states, refused explicitly, and counted, while an honest client
//! beside it is served.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::*;

/// One 64 KiB write of pipelined requests, an object's first and then ~1,900 page GETs, from
/// clients that never read: each costs the node at most 256 KiB. (It cost 34 MB: once an
/// object's answer was owed, every response after it was kept, whole, with no byte cap.)
#[test]
fn pipelined_requests_from_clients_that_never_read_cost_at_most_256_kib_each() {
    const CONNS: u64 = 20;
    let node = TestNode::start(&[]);
    // Warm what the attack touches (the page, the counter object and its database), so the
    // baseline holds them.
    let get = b"GET /million/ HTTP/1.1\r\nHost: x\r\n\r\n";
    assert_eq!(request(node.public(), get).status, 200);
    let post = b"POST /o/counter/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1";
    assert_eq!(request(node.public(), post).status, 200);
    let base = rss_peak(node.pid(), Duration::from_millis(200));

    let mut burst = post.to_vec();
    let mut gets = 0u64;
    while burst.len() + get.len() <= 64 * 1024 {
        burst.extend_from_slice(get);
        gets += 1;
    }
    let attackers: Vec<TcpStream> = (0..CONNS)
        .map(|_| {
            let mut s = connect(node.public());
            s.write_all(&burst).unwrap();
            s
        })
        .collect();
    let peak = rss_peak(node.pid(), Duration::from_secs(2));
    let per_conn = peak.saturating_sub(base) / CONNS;
    assert!(
        per_conn <= 256 * 1024,
        "{per_conn} bytes a connection (baseline {base}, peak {peak})"
    );
    // The node stopped answering them (back-pressure), kept them open, and serves others.
    let s = node.stats();
    assert!(
        s["requests"].as_u64().unwrap() < CONNS * gets,
        "every pipelined request was answered to clients that read nothing: {s}"
    );
    assert_eq!(
        s["conns"].as_u64().unwrap(),
        CONNS + 1,
        "the attackers and /stats's: {s}"
    );
    assert!(s["pipeline_held_waits"].as_u64().unwrap() >= CONNS, "{s}");
    // Each held the cap's worth and at most one page past it.
    let cap = s["limits"]["pipeline_held_max_bytes"].as_u64().unwrap();
    let page = request(node.public(), get).body.len() as u64 + 512;
    let held = s["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|sh| sh["pipeline_held_bytes_max"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(
        held >= cap && held < cap + page,
        "{held} held, cap {cap}: {s}"
    );
    assert_eq!(request(node.public(), get).status, 200, "an honest client");
    drop(attackers);
}

/// 3,000 connections from one address to a node capped at 2,500: the address gets its share
/// (1,024), the rest are closed at once and counted, and the node is not full: a client from
/// another address connects and is served.
#[test]
fn one_address_gets_its_share_and_never_fills_the_node() {
    let node = TestNode::start(&[("COMBD_MAX_CONNS", "2500"), ("COMBD_HEADER_TIMEOUT", "1m")]);
    let flood: Vec<TcpStream> = (0..3000)
        .map(|_| connect_from([127, 0, 0, 10], node.public()))
        .collect();
    let s = wait_stats(
        &node,
        "the connections past the address's share closed",
        |s| s["address_conns_refused"].as_u64().unwrap() >= 3000 - 1024,
    );
    assert_eq!(s["address_conns_refused"], 3000 - 1024, "{s}");
    assert_eq!(s["address_conns_most"], 1024, "{s}");
    assert_eq!(
        s["tcp_refusing"], 0,
        "one address never makes the node full: {s}"
    );
    let mut other = connect_from([127, 0, 0, 11], node.public());
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let r = read_response(&mut std::io::BufReader::new(&mut other));
    assert_eq!(r.status, 200, "another address is served");
    // The ones past the share were closed without an answer; the first 1,024 are still open.
    let mut closed = 0;
    for mut s in flood {
        // A close is seen at once; a connection still open times out (WouldBlock).
        s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        let mut b = [0u8; 1];
        match std::io::Read::read(&mut s, &mut b) {
            Ok(0) => closed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => closed += 1,
            Ok(_) => panic!("an answer to a connection that sent nothing"),
            Err(_) => {}
        }
    }
    assert_eq!(closed, 3000 - 1024);
}

/// An address that connects and closes in a loop is held to its accept rate once its burst
/// (`COMBD_MAX_CONNS_PER_ADDRESS`) is spent; another address is not.
#[test]
fn an_address_past_its_accept_rate_is_closed_at_once() {
    let node = TestNode::start(&[
        ("COMBD_MAX_CONNS_PER_ADDRESS", "10"),
        ("COMBD_ACCEPT_RATE_PER_ADDRESS", "1"),
    ]);
    let started = Instant::now();
    let mut answered = 0u64;
    for _ in 0..30 {
        let mut s = connect_from([127, 0, 0, 12], node.public());
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut buf = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut buf);
        if buf.starts_with(b"HTTP/1.1 200") {
            answered += 1;
        }
    }
    // At most the burst and one a second since.
    let allowed = 10 + started.elapsed().as_secs() + 1;
    assert!(
        answered <= allowed,
        "{answered} answered, {allowed} allowed"
    );
    let s = node.stats();
    assert_eq!(
        s["address_rate_refused"].as_u64().unwrap(),
        30 - answered,
        "{s}"
    );
    let mut other = connect_from([127, 0, 0, 13], node.public());
    other
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(
        read_response(&mut std::io::BufReader::new(&mut other)).status,
        200
    );
}

/// The localhost listener is never stopped, but it has a cap of its own that does not take
/// from the public one: past it a local connection is closed at once, and public clients are
/// still served.
#[test]
fn the_localhost_listener_has_a_cap_of_its_own() {
    let node = TestNode::start(&[("COMBD_HEADER_TIMEOUT", "1m")]);
    // The cap from the limits file, not from /stats: a /stats connection still closing would
    // take one of the places.
    let cap = combd_kernel::limits::LOCAL_CONNS_MAX as usize;
    let mut conns: Vec<Option<TcpStream>> =
        (0..=cap).map(|_| Some(connect(node.local()))).collect();
    // Shards accept in parallel, so which one of them is past the cap is theirs to say:
    // exactly one is closed (bounded by the wait).
    let deadline = Instant::now() + WAIT;
    let mut closed = 0;
    while closed == 0 {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for one to be closed"
        );
        for c in conns.iter_mut() {
            let Some(s) = c else { continue };
            s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
            let mut b = [0u8; 1];
            match std::io::Read::read(s, &mut b) {
                Ok(0) => {
                    closed += 1;
                    *c = None;
                }
                Ok(_) => panic!("an answer to a connection that sent nothing"),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                    closed += 1;
                    *c = None;
                }
                Err(_) => {}
            }
        }
    }
    assert_eq!(closed, 1);
    assert_eq!(
        request(node.public(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status,
        200,
        "public clients do not share the localhost listener's cap"
    );
    // One of the held ones asks for /stats.
    let mut stats = std::io::BufReader::new(conns.iter_mut().flatten().next().unwrap());
    stats.get_mut().set_read_timeout(Some(WAIT)).unwrap();
    stats
        .get_mut()
        .write_all(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let s = read_response(&mut stats).json();
    assert_eq!(s["local_conns_refused"], 1, "{s}");
    assert_eq!(s["conns_local"].as_u64().unwrap(), cap as u64, "{s}");
    assert_eq!(s["limits"]["local_conns_max"].as_u64().unwrap(), cap as u64);
}

fn open_ws(node: &TestNode, from: [u8; 4], path: &str) -> tungstenite::WebSocket<TcpStream> {
    let stream = connect_from(from, node.public());
    let url = format!("ws://127.0.0.2:{}{path}", node.port);
    tungstenite::client(url.as_str(), stream)
        .expect("websocket handshake")
        .0
}

/// The close code a WebSocket ends with (reading past any frames before it).
fn close_code(ws: &mut tungstenite::WebSocket<TcpStream>) -> Option<u16> {
    loop {
        match ws.read() {
            Ok(tungstenite::Message::Close(f)) => return f.map(|f| u16::from(f.code)),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
}

/// 8 WebSockets each sending a 1 MB message to a board (within the node's message limit): the
/// board's app takes clicks of a few dozen bytes and says so, so each is closed with 1009 at
/// the frame's header, before any of it is held (8 clients at 300 such messages took the node
/// from 12 MB to 1,023 MB: the mailbox bounded them by count only).
#[test]
fn messages_larger_than_the_app_takes_are_refused_before_they_are_held() {
    let node = TestNode::start(&[]);
    let base = rss(node.pid());
    let big = "x".repeat(1 << 20);
    let mut viewers: Vec<_> = (0..8)
        .map(|i| open_ws(&node, [127, 0, 0, 20 + i], "/o/million/b?page=0"))
        .collect();
    for v in viewers.iter_mut() {
        assert!(matches!(v.read().unwrap(), tungstenite::Message::Text(_)));
        let _ = v.send(tungstenite::Message::text(big.clone()));
    }
    for v in viewers.iter_mut() {
        assert_eq!(close_code(v), Some(1009), "closed as too big");
    }
    let s = node.stats();
    assert_eq!(s["ws_protocol_closed"], 8, "{s}");
    assert_eq!(s["mailbox_refused"], 0, "nothing reached the mailbox: {s}");
    let grown = rss(node.pid()).saturating_sub(base);
    assert!(grown < 8 << 20, "the node grew by {grown} bytes");
}

/// An object that is busy while a WebSocket sends it large messages: the connection's input
/// waiting is bounded (`inbound_conn_queued_max_bytes` and the one message that crossed it),
/// the connection is not read meanwhile, and nothing is lost or refused: every message runs
/// once the object is free.
#[test]
fn a_connection_past_its_input_waiting_is_not_read_until_it_ran() {
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "1")]);
    let mut ws = open_ws(&node, [127, 0, 0, 30], "/o/hold/busy");
    // The object busy for a while (its call holds an awake slot): the messages wait for it.
    let mut held = connect(node.public());
    held.write_all(b"GET /o/hold/busy?ms=1500 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    wait_stats(&node, "the object busy", |s| s["cells_awake"] == 1);
    const N: u64 = 20;
    const SIZE: usize = 200 * 1024;
    let sender = std::thread::spawn(move || {
        for _ in 0..N {
            ws.send(tungstenite::Message::text("y".repeat(SIZE)))
                .unwrap();
        }
        ws
    });
    let s = wait_stats(&node, "the connection to stop being read", |s| {
        s["inbound_waits"].as_u64().unwrap() >= 1
    });
    let cap = s["limits"]["inbound_conn_queued_max_bytes"]
        .as_u64()
        .unwrap();
    let _ws = sender.join().unwrap();
    let s = wait_stats(&node, "every message run", |s| {
        s["ws_messages_in"] == N && s["inbound_bytes"] == 0 && s["cells_awake"] == 0
    });
    // Its messages waiting (the bound, and the one that crossed it), and the one arriving.
    let max = s["inbound_bytes_max"].as_u64().unwrap();
    assert!(
        max <= cap + 2 * SIZE as u64,
        "{max} held at most, bound {cap}"
    );
    assert_eq!(s["mailbox_refused"], 0, "{s}");
    assert_eq!(s["inbound_refused"], 0, "{s}");
    let r = read_response(&mut std::io::BufReader::new(held));
    assert_eq!(r.status, 200);
}

/// Past the shard's inbound budget large input is refused explicitly and counted, while a
/// small one from a connection with little waiting (within its floor) still goes in.
#[test]
fn past_the_shards_inbound_budget_large_input_is_refused_and_small_input_is_not() {
    let node = TestNode::start(&[
        TEST_APPS,
        ("COMBD_SHARDS", "1"),
        // One client may hold all of it: this crosses the node's bound, not a client's share
        // of it (tests/fair.rs crosses those).
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "100"),
        ("COMBD_INBOUND_BUDGET", "300K"),
    ]);
    let mut a = open_ws(&node, [127, 0, 0, 40], "/o/hold/full");
    let mut b = open_ws(&node, [127, 0, 0, 41], "/o/hold/full");
    let mut c = open_ws(&node, [127, 0, 0, 42], "/o/hold/full");
    // The object busy (its call holds an awake slot): what the sessions send waits for it.
    let mut held = connect(node.public());
    held.write_all(b"GET /o/hold/full?ms=2000 HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    wait_stats(&node, "the object busy", |s| s["cells_awake"] == 1);
    // 296 KiB of the 300 KiB held by one connection's message.
    a.send(tungstenite::Message::text("a".repeat(296 * 1024)))
        .unwrap();
    wait_stats(&node, "the first large message held", |s| {
        s["inbound_bytes"].as_u64().unwrap() >= 296 * 1024
    });
    // Another's first 3 KiB goes in within its floor (the shard past its budget then), its
    // second, past the floor and the budget, is refused.
    b.send(tungstenite::Message::text("b".repeat(3 * 1024)))
        .unwrap();
    b.send(tungstenite::Message::text("b".repeat(3 * 1024)))
        .unwrap();
    match b.read().unwrap() {
        tungstenite::Message::Text(t) => assert_eq!(t.as_str(), r#"{"error":"overloaded"}"#),
        m => panic!("expected the refusal, got {m:?}"),
    }
    // A click from a connection with nothing waiting still goes in.
    c.send(tungstenite::Message::text("small")).unwrap();
    let s = wait_stats(&node, "the held and the small messages run", |s| {
        s["ws_messages_in"] == 4 && s["inbound_bytes"] == 0
    });
    assert_eq!(s["inbound_refused"], 1, "{s}");
    assert_eq!(s["limits"]["inbound_budget_bytes"], 300 * 1024, "{s}");
    drop(held);
}

/// Bodies that arrive slowly (or never) hold what they declared against the shard's inbound
/// budget while they arrive: past it a new large body is refused at its head (503, nothing
/// read of it), a small one still gets in, and the slow one finishes.
#[test]
fn slow_bodies_cannot_hold_more_than_the_inbound_budget() {
    let node = TestNode::start(&[
        ("COMBD_SHARDS", "1"),
        ("COMBD_INBOUND_BUDGET", "300K"),
        // One client may hold all of it: this crosses the node's bound, not a client's share
        // of it (tests/fair.rs crosses those).
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "100"),
    ]);
    let head = |len: usize| {
        format!("POST /o/echo/slow HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n")
    };
    let mut slow = connect_from([127, 0, 0, 50], node.public());
    slow.write_all(head(200 * 1024).as_bytes()).unwrap();
    slow.write_all(&[b's'; 1000]).unwrap();
    wait_stats(&node, "the slow body held", |s| {
        s["inbound_bytes"].as_u64().unwrap() >= 200 * 1024
    });
    let mut second = connect_from([127, 0, 0, 51], node.public());
    second.write_all(head(200 * 1024).as_bytes()).unwrap();
    let r = read_response(&mut std::io::BufReader::new(&mut second));
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (503, Some("overloaded"))
    );
    assert_closed(&mut second);
    let mut small = connect_from([127, 0, 0, 52], node.public());
    small.write_all(head(1000).as_bytes()).unwrap();
    small.write_all(&[b'm'; 1000]).unwrap();
    let r = read_response(&mut std::io::BufReader::new(&mut small));
    assert_eq!(
        (r.status, r.body.len()),
        (200, 1000),
        "a small body within the floor"
    );
    slow.write_all(&vec![b's'; 200 * 1024 - 1000]).unwrap();
    let r = read_response(&mut std::io::BufReader::new(&mut slow));
    assert_eq!(
        (r.status, r.body.len()),
        (200, 200 * 1024),
        "the slow one finishes"
    );
    let s = wait_stats(&node, "the bodies given back", |s| s["inbound_bytes"] == 0);
    assert_eq!(s["inbound_refused"], 1, "{s}");
}

/// A client that keeps sending after the node closed it (frames past a 1009) is read and
/// discarded only up to `close_linger_discard_max_bytes`, then read no more and dropped when
/// the linger ends: its writes fail before it has sent 32 MiB (what the kernels' buffers take
/// is a few MiB), where the linger would have read all it sent for 2 s.
#[test]
fn a_client_that_keeps_sending_after_its_close_is_dropped() {
    let node = TestNode::start(&[]);
    let mut s = connect_from([127, 0, 0, 80], node.public());
    write!(
        s,
        "GET /o/million/linger?page=0 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    let head = read_head(&mut s);
    assert!(head.starts_with(b"HTTP/1.1 101"));
    // A text frame header announcing 1 MiB (past million's 1 KiB): closed with 1009 at once.
    let mut frame = vec![0x81, 0xff];
    frame.extend_from_slice(&(1u64 << 20).to_be_bytes());
    frame.extend_from_slice(&[1, 2, 3, 4]);
    s.write_all(&frame).unwrap();
    wait_stats(&node, "the viewer closed as too big", |s| {
        s["ws_protocol_closed"] == 1
    });
    let chunk = vec![b'z'; 64 * 1024];
    let mut sent = 0usize;
    let failed = loop {
        if sent >= 32 << 20 {
            break false;
        }
        match s.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(_) => break true,
        }
    };
    assert!(failed, "the node read {sent} bytes after the close");
}

/// 10,000 GETs of distinct counter names: each is answered (`{"value":0}`) from a scratch
/// database let go as soon as it is answered, so the node holds only the ones being answered
/// at once (kept for their idle second, 10,000 scratch databases took a 1 GB node to 588 MB),
/// and no file is created.
#[test]
fn a_spray_of_object_names_costs_neither_files_nor_memory() {
    let node = TestNode::start(&[("COMBD_SHARDS", "1")]);
    assert_eq!(
        request(
            node.public(),
            b"GET /o/counter/warm HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        .status,
        200
    );
    let base = rss(node.pid());
    let mut peak = base;
    let mut s = connect(node.public());
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    for burst in 0..100 {
        let mut reqs = Vec::new();
        for n in 0..100 {
            write!(
                reqs,
                "GET /o/counter/spray{} HTTP/1.1\r\nHost: x\r\n\r\n",
                burst * 100 + n
            )
            .unwrap();
        }
        s.write_all(&reqs).unwrap();
        for _ in 0..100 {
            let resp = read_response(&mut r);
            assert_eq!((resp.status, resp.json()["value"].as_i64()), (200, Some(0)));
        }
        peak = peak.max(rss(node.pid()));
    }
    let grown = peak.saturating_sub(base);
    assert!(grown < 64 << 20, "the node grew by {grown} bytes");
    let files = std::fs::read_dir(node.data_dir.join("objects/counter"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(files, 0, "no database for a name only read");
}

/// A raw WebSocket to `path` from `from`, upgraded (its 101 read).
fn raw_ws(node: &TestNode, from: [u8; 4], path: &str) -> TcpStream {
    let mut s = connect_from(from, node.public());
    upgrade_raw(&mut s, path, "x");
    s
}

/// The header of a masked client binary frame of `len` bytes (mask 0: the payload goes as is).
fn frame_header(len: u64) -> Vec<u8> {
    let mut f = vec![0x82, 0xff];
    f.extend_from_slice(&len.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 0]);
    f
}

/// Reads server frames until a close; its code.
fn read_close(s: &mut TcpStream) -> u16 {
    loop {
        let (op, payload) = read_frame(s).unwrap();
        if op == 0x8 {
            return u16::from_be_bytes([payload[0], payload[1]]);
        }
    }
}

/// A message sent slowly (or never finished) holds what has arrived against the shard's
/// inbound budget: past it another such connection is closed with 1013, a small message still
/// goes through, and the slow one, once finished, is answered whole.
#[test]
fn messages_under_reassembly_cannot_hold_more_than_the_inbound_budget() {
    // Room for one whole message (1 MiB) and a little more.
    let node = TestNode::start(&[
        ("COMBD_SHARDS", "1"),
        ("COMBD_INBOUND_BUDGET", "1200K"),
        // One client may hold all of it: this crosses the node's bound, not a client's share
        // of it (tests/fair.rs crosses those).
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "100"),
    ]);
    let mut slow = raw_ws(&node, [127, 0, 0, 90], "/o/echo/big");
    slow.write_all(&frame_header(1 << 20)).unwrap();
    slow.write_all(&vec![b'a'; 700 * 1024]).unwrap();
    wait_stats(&node, "the slow message held", |s| {
        s["inbound_bytes"].as_u64().unwrap() >= 700 * 1024
    });
    let mut second = raw_ws(&node, [127, 0, 0, 91], "/o/echo/big");
    second.write_all(&frame_header(1 << 20)).unwrap();
    let _ = second.write_all(&vec![b'b'; 600 * 1024]);
    assert_eq!(
        read_close(&mut second),
        1013,
        "past the budget: try again later"
    );
    let mut small = open_ws(&node, [127, 0, 0, 92], "/o/echo/big");
    small.send(tungstenite::Message::text("small")).unwrap();
    assert_eq!(small.read().unwrap(), tungstenite::Message::text("small"));
    slow.write_all(&vec![b'a'; (1 << 20) - 700 * 1024]).unwrap();
    let (op, payload) = read_frame(&mut slow).unwrap();
    assert_eq!((op, payload.len()), (0x2, 1 << 20), "echoed whole");
    let s = wait_stats(&node, "the bytes given back", |s| s["inbound_bytes"] == 0);
    assert!(s["inbound_refused"].as_u64().unwrap() >= 1, "{s}");
}

/// Live objects are bounded (their descriptors are held back from the connection cap, so
/// SQLite never fails with EMFILE under a connection flood): past `COMBD_MAX_OPEN_OBJECTS` a
/// new object is refused with 503 and counted, live ones keep working, and once one is let go
/// the new one is served.
#[test]
fn past_the_open_objects_a_new_object_is_refused() {
    let node = TestNode::start(&[
        TEST_APPS,
        ("COMBD_SHARDS", "1"),
        // One client may hold all of it: this crosses the node's bound, not a client's share
        // of it (tests/fair.rs crosses those).
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "100"),
        ("COMBD_MAX_OPEN_OBJECTS", "2"),
    ]);
    // Two objects busy for a while: both live.
    let mut busy: Vec<TcpStream> = ["a", "b"]
        .iter()
        .map(|name| {
            let mut s = connect(node.public());
            write!(s, "GET /o/hold/{name}?ms=3000 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            s
        })
        .collect();
    wait_stats(&node, "two objects live", |s| s["objects_open"] == 2);
    let post = b"POST /o/counter/c HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1";
    let r = request(node.public(), post);
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (503, Some("overloaded"))
    );
    assert!(r
        .headers
        .iter()
        .any(|(n, v)| n == "retry-after" && v == "1"));
    let s = node.stats();
    assert_eq!(s["objects_open_refused"], 1, "{s}");
    assert_eq!(s["limits"]["max_open_objects"], 2, "{s}");
    assert_eq!(s["objects_open_max"], 2, "never past the cap: {s}");
    for s in busy.iter_mut() {
        let r = read_response(&mut std::io::BufReader::new(s));
        assert_eq!(r.status, 200, "the live objects kept working");
    }
    wait_stats(&node, "the objects let go", |s| s["objects_open"] == 0);
    assert_eq!(request(node.public(), post).status, 200);
}
