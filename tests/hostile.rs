//! Slow and broken clients against the real node: each is closed at its limit while the node
//! keeps serving everyone else.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::*;
use tungstenite::Message;

fn healthy(node: &TestNode) {
    assert_eq!(
        request(node.public(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status,
        200,
        "the node serves others"
    );
}

#[test]
fn slowloris_trickling_bytes_does_not_extend_the_header_deadline() {
    let node = TestNode::start(&[("COMBD_HEADER_TIMEOUT", "1s")]);
    let mut s = connect(node.public());
    let started = Instant::now();
    // One byte every 100 ms: the head never completes; the deadline counts from its start.
    let mut closed_after = None;
    for b in
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".iter()
    {
        if s.write_all(&[*b]).is_err() {
            closed_after = Some(started.elapsed());
            break;
        }
        healthy(&node);
        std::thread::sleep(Duration::from_millis(100)); // the client's own slowness
    }
    let mut r = std::io::BufReader::new(s);
    if closed_after.is_none() {
        let resp = read_response(&mut r);
        assert_eq!(resp.status, 408);
    }
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "closed at its deadline, not after the trickle"
    );
    assert!(node.stats()["request_timeouts"].as_u64().unwrap() >= 1);
}

#[test]
fn a_flood_of_silent_connections_is_closed_at_the_header_timeout() {
    let node = TestNode::start(&[("COMBD_HEADER_TIMEOUT", "500ms")]);
    let mut silent: Vec<TcpStream> = (0..300).map(|_| connect(node.public())).collect();
    healthy(&node);
    for s in silent.iter_mut() {
        // Each gets its 408 and is closed.
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        assert!(
            buf.starts_with(b"HTTP/1.1 408"),
            "{:?}",
            String::from_utf8_lossy(&buf)
        );
    }
    let s = wait_stats(&node, "the silent connections closed", |s| s["conns"] == 1);
    assert!(s["request_timeouts"].as_u64().unwrap() >= 300);
    healthy(&node);
}

#[test]
fn a_client_that_resets_mid_response_costs_only_itself() {
    let node = TestNode::start(&[]);
    for _ in 0..20 {
        let mut s = connect(node.public());
        let body = vec![b'x'; 1 << 20];
        write!(
            s,
            "POST /o/echo/r HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .unwrap();
        s.write_all(&body).unwrap();
        let mut first = [0u8; 100];
        s.read_exact(&mut first).unwrap();
        // Reset: close with unread data and SO_LINGER 0.
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    }
    wait_stats(&node, "the reset connections gone", |s| s["conns"] == 1);
    healthy(&node);
}

#[test]
fn a_websocket_that_never_answers_pings_is_closed() {
    let node = TestNode::start(&[("COMBD_WS_PING_INTERVAL", "200ms")]);
    // A client that upgrades, then never reads or writes again.
    let mut mute = connect(node.public());
    mute.write_all(
        b"GET /o/echo/mute HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .unwrap();
    // A well-behaved client (tungstenite answers pings as it reads) stays: it reads
    // through five pings, then still gets its echo.
    let stream = connect(node.public());
    let url = format!("ws://127.0.0.2:{}/o/echo/alive", node.port);
    let (mut alive, _) = tungstenite::client(url.as_str(), stream).unwrap();
    let reader = std::thread::spawn(move || {
        let mut pings = 0;
        while pings < 5 {
            if let Message::Ping(_) = alive.read().expect("pings keep coming") {
                pings += 1;
            }
        }
        alive.send(Message::text("still here")).unwrap();
        loop {
            match alive.read().unwrap() {
                Message::Text(t) => return t.as_str().to_string(),
                Message::Ping(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    });
    wait_stats(&node, "the mute client closed", |s| {
        s["ws_ping_timeouts"].as_u64().unwrap_or(0) >= 1
    });
    // The mute client got pings, then a close frame with 1001.
    let mut buf = Vec::new();
    let _ = mute.read_to_end(&mut buf);
    let close = buf
        .windows(2)
        .position(|w| w == [0x88, 0x0e])
        .expect("a close frame");
    assert_eq!(&buf[close + 2..close + 4], &1001u16.to_be_bytes());
    assert_eq!(reader.join().unwrap(), "still here");
    let s = node.stats();
    assert_eq!(s["ws_ping_timeouts"], 1, "only the mute client: {s}");
}
