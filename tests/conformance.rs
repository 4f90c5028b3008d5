//! What conformance suites found, as raw bytes over loopback: RFC 9110/9112 framing and
//! fields, and the WebSocket handshake and frames of RFC 6455.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, Read, Write};

use support::*;

const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

fn upgrade(version: &str, extra: &str) -> Vec<u8> {
    format!(
        "GET /o/echo/a HTTP/{version}\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\n{extra}\r\n"
    )
    .into_bytes()
}

/// Sends `raw` on a new connection; the response, and whether the node closed after it.
fn exchange(node: &TestNode, raw: &[u8]) -> (Resp, bool) {
    let mut s = connect(node.public());
    s.write_all(raw).unwrap();
    let mut r = BufReader::new(s);
    let resp = read_response(&mut r);
    let closed = resp
        .header("connection")
        .is_some_and(|c| c.eq_ignore_ascii_case("close"));
    if closed {
        assert_closed(&mut r);
    }
    (resp, closed)
}

#[test]
fn content_length_is_only_digits() {
    let node = TestNode::start(&[]);
    for value in ["+5", "-5", " 5 5", "5,5", "0x5"] {
        let raw =
            format!("POST /o/echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: {value}\r\n\r\nhello");
        let (r, closed) = exchange(&node, raw.as_bytes());
        assert_eq!(r.status, 400, "{value:?}");
        assert!(
            closed,
            "{value:?}: the connection closes after a bad length"
        );
    }
    // Two lengths that read the same to a lax parser are a conflict.
    let raw = b"POST /o/echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: +5\r\n\r\nhello";
    assert_eq!(exchange(&node, raw).0.status, 400);
    let raw = b"POST /o/echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello";
    assert_eq!(exchange(&node, raw).0.text(), "hello");
}

#[test]
fn an_http_1_1_request_needs_one_valid_host() {
    let node = TestNode::start(&[]);
    let cases: [&[u8]; 5] = [
        b"GET /healthz HTTP/1.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a b\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: a/b\r\n\r\n",
        b"GET /o/echo/a HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    ];
    for raw in cases {
        let (r, closed) = exchange(&node, raw);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(raw));
        assert!(closed);
    }
    // HTTP/1.0 may leave it out; an empty Host and a port are valid.
    assert_eq!(
        exchange(&node, b"GET /healthz HTTP/1.0\r\n\r\n").0.status,
        200
    );
    for host in ["", "127.0.0.2:8080", "[::1]:80", "example.com"] {
        let raw = format!("GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n");
        assert_eq!(exchange(&node, raw.as_bytes()).0.status, 200, "{host:?}");
    }
}

#[test]
fn expect_100_continue_is_ignored_on_http_1_0() {
    let node = TestNode::start(&[]);
    let mut s = connect(node.public());
    s.write_all(b"POST /o/echo/a HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n")
        .unwrap();
    // No interim answer: the node waits for the body. (An absence has no event to wait on: a
    // short read timeout stands for "nothing came".)
    s.set_read_timeout(Some(std::time::Duration::from_millis(300)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(
        s.read(&mut b).is_err(),
        "the node answered before the body: {:?}",
        b[0] as char
    );
    s.set_read_timeout(Some(WAIT)).unwrap();
    // Send it; the first thing back is the 200.
    s.write_all(b"hi").unwrap();
    let r = read_response(&mut BufReader::new(s));
    assert_eq!((r.status, r.text().as_str()), (200, "hi"));
}

#[test]
fn an_absolute_form_target_is_served() {
    let node = TestNode::start(&[]);
    let raw = format!(
        "GET http://127.0.0.2:{}/healthz HTTP/1.1\r\nHost: 127.0.0.2\r\n\r\n",
        node.port
    );
    let (r, _) = exchange(&node, raw.as_bytes());
    assert_eq!(r.status, 200);
    let raw = b"POST HTTP://x/o/echo/a?q=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok";
    assert_eq!(exchange(&node, raw).0.text(), "ok");
}

#[test]
fn every_response_has_a_date_and_426_names_the_upgrade() {
    let node = TestNode::start(&[]);
    let (r, _) = exchange(&node, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    let date = r.header("date").expect("a date header");
    // IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
    assert_eq!(date.len(), 29, "{date:?}");
    assert!(
        date.ends_with(" GMT") && date.as_bytes()[3] == b',',
        "{date:?}"
    );
    let (r, _) = exchange(&node, b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(r.header("date").is_some());
    let raw = b"GET /o/echo/a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 8\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let (r, _) = exchange(&node, raw);
    assert_eq!(r.status, 426);
    assert_eq!(r.header("upgrade"), Some("websocket"));
    assert_eq!(r.header("sec-websocket-version"), Some("13"));
    // RFC 9110, 7.8: a server that sends Upgrade sends Connection: upgrade with it.
    let connection = r
        .header("connection")
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(
        connection.split(',').any(|o| o.trim() == "upgrade"),
        "{connection:?}"
    );
}

/// An absolute-form target is served only with the http(s) scheme and no userinfo (RFC 9110,
/// 4.2.4); another scheme, userinfo, or a target of no form is a 400.
#[test]
fn a_target_with_userinfo_or_another_scheme_is_a_400() {
    let node = TestNode::start(&[]);
    for target in [
        "http://user@x/o/echo/a",
        "http://u:p@x/healthz",
        "ftp://x/healthz",
        "ws://x/o/echo/a",
        "x:80",
        "healthz",
    ] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
        let (r, _) = exchange(&node, raw.as_bytes());
        assert_eq!(r.status, 400, "{target}: {}", r.text());
        assert_eq!(r.json()["error"], "invalid request target", "{target}");
    }
}

#[test]
fn the_websocket_handshake_is_strict() {
    let node = TestNode::start(&[]);
    let key = format!("Sec-WebSocket-Key: {KEY}\r\n");
    let cases = [
        upgrade("1.0", &key),
        upgrade("1.1", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZR==\r\n"),
        upgrade("1.1", "Sec-WebSocket-Key: not-base64-at-all-but-24\r\n"),
        upgrade("1.1", "Sec-WebSocket-Key: c2hvcnQ=\r\n"),
        upgrade("1.1", &format!("{key}{key}")),
        upgrade("1.1", &format!("{key}Sec-WebSocket-Version: 13\r\n")),
    ];
    for raw in &cases {
        let (r, _) = exchange(&node, raw);
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(raw));
    }
    let (r, _) = exchange(&node, &upgrade("1.1", &key));
    assert_eq!(r.status, 101);
    assert!(r.header("date").is_some());
}

/// Upgrades to the echo app and returns the socket past the 101.
fn echo_socket(node: &TestNode) -> std::net::TcpStream {
    let mut s = connect(node.public());
    s.write_all(&upgrade("1.1", &format!("Sec-WebSocket-Key: {KEY}\r\n")))
        .unwrap();
    let head = read_head(&mut s);
    assert!(head.starts_with(b"HTTP/1.1 101"));
    s
}

/// Reads frames until a close; its code.
fn close_code(s: &mut std::net::TcpStream) -> u16 {
    loop {
        let mut h = [0u8; 2];
        s.read_exact(&mut h).unwrap();
        let len = (h[1] & 0x7f) as usize;
        assert!(len < 126);
        let mut p = vec![0; len];
        s.read_exact(&mut p).unwrap();
        if h[0] & 0x0f == 8 {
            return u16::from_be_bytes([p[0], p[1]]);
        }
    }
}

#[test]
fn invalid_text_closes_1007_before_the_frame_is_complete() {
    let node = TestNode::start(&[]);
    let mut s = echo_socket(&node);
    // A 1,000-byte text frame (mask of zeros) whose 6th byte is invalid UTF-8: only its first
    // 10 bytes are sent, the rest never is.
    let mut frame = vec![0x81, 0x80 | 126];
    frame.extend_from_slice(&1000u16.to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend_from_slice(b"hello\xffabcd");
    s.write_all(&frame).unwrap();
    assert_eq!(close_code(&mut s), 1007);
}

#[test]
fn a_64_bit_length_with_its_top_bit_set_closes_1002() {
    let node = TestNode::start(&[]);
    let mut s = echo_socket(&node);
    let mut frame = vec![0x82, 0x80 | 127];
    frame.extend_from_slice(&(1u64 << 63).to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    s.write_all(&frame).unwrap();
    assert_eq!(close_code(&mut s), 1002);
}

#[test]
fn an_apps_own_405_names_the_methods_it_takes() {
    let node = TestNode::start(&[]);
    let cases = [
        ("GET /o/echo/a", "POST"),
        ("DELETE /o/counter/a", "GET, HEAD, POST"),
        ("POST /o/million/a", "GET, HEAD"),
    ];
    for (line, allow) in cases {
        let raw = format!("{line} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
        let (r, _) = exchange(&node, raw.as_bytes());
        assert_eq!(r.status, 405, "{line}");
        assert_eq!(r.header("allow"), Some(allow), "{line}");
    }
}
