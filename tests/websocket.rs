//! WebSocket against the real node with a real client (tungstenite): echo, fragments, ping,

#![allow(clippy::unwrap_used)]
//! close, limits, and the 1001 close of a drain.

mod support;

use std::io::Write;
use std::net::TcpStream;

use support::*;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::{Message, WebSocket};

fn open(node: &TestNode, name: &str) -> WebSocket<TcpStream> {
    let stream = connect(node.public());
    let url = format!("ws://127.0.0.2:{}/o/echo/{name}", node.port);
    let (ws, resp) = tungstenite::client(url.as_str(), stream).expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    ws
}

/// A masked client frame, written by hand for the cases a correct client would never send.
fn raw_frame(fin: bool, opcode: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mut out = vec![(if fin { 0x80 } else { 0 }) | opcode];
    let m = if masked { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    if masked {
        let key = [9u8, 8, 7, 6];
        out.extend_from_slice(&key);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

/// Reads until a close frame arrives and returns its code.
fn read_close_code(ws: &mut WebSocket<TcpStream>) -> u16 {
    loop {
        match ws.read() {
            Ok(Message::Close(Some(f))) => return u16::from(f.code),
            Ok(Message::Close(None)) => panic!("close without a code"),
            Ok(_) => continue,
            Err(e) => panic!("timed out waiting for a close frame: {e}"),
        }
    }
}

#[test]
fn text_and_binary_echo() {
    let node = TestNode::start(&[]);
    let mut ws = open(&node, "room");
    ws.send(Message::text("hello")).unwrap();
    assert_eq!(ws.read().unwrap(), Message::text("hello"));
    ws.send(Message::binary(vec![0u8, 1, 2, 255])).unwrap();
    assert_eq!(ws.read().unwrap(), Message::binary(vec![0u8, 1, 2, 255]));
    let big = "x".repeat(200_000);
    ws.send(Message::text(big.clone())).unwrap();
    assert_eq!(ws.read().unwrap(), Message::text(big));
    let stats = node.stats();
    assert_eq!(stats["ws_open"], 1);
    assert!(stats["ws_messages_in"].as_u64().unwrap() >= 3);
    assert!(stats["ws_messages_out"].as_u64().unwrap() >= 3);
}

#[test]
fn fragmented_message_is_reassembled_around_a_ping() {
    let node = TestNode::start(&[]);
    let mut ws = open(&node, "frag");
    let mut bytes = raw_frame(false, 1, b"hel", true);
    bytes.extend(raw_frame(true, 9, b"ping!", true));
    bytes.extend(raw_frame(false, 0, "lo ".as_bytes(), true));
    bytes.extend(raw_frame(true, 0, "wörld".as_bytes(), true));
    ws.get_mut().write_all(&bytes).unwrap();
    assert_eq!(ws.read().unwrap(), Message::Pong("ping!".into()));
    assert_eq!(ws.read().unwrap(), Message::text("hello wörld"));
}

#[test]
fn ping_gets_pong_and_close_is_answered() {
    let node = TestNode::start(&[]);
    let mut ws = open(&node, "p");
    ws.send(Message::Ping("abc".into())).unwrap();
    assert_eq!(ws.read().unwrap(), Message::Pong("abc".into()));
    ws.close(None).unwrap();
    loop {
        match ws.read() {
            Ok(Message::Close(_)) => continue,
            Ok(m) => panic!("unexpected {m:?}"),
            Err(tungstenite::Error::ConnectionClosed) => break,
            Err(e) => panic!("timed out waiting for the close handshake: {e}"),
        }
    }
}

#[test]
fn message_size_limit_at_max_and_past_it() {
    let node = TestNode::start(&[("COMBD_WS_MAX_MESSAGE", "1K")]);
    let mut ws = open(&node, "big");
    ws.send(Message::binary(vec![7u8; 1024])).unwrap();
    assert_eq!(ws.read().unwrap(), Message::binary(vec![7u8; 1024]));
    ws.send(Message::binary(vec![7u8; 1025])).unwrap();
    assert_eq!(read_close_code(&mut ws), 1009);

    // Fragments that add up past the limit close the same way.
    let mut ws = open(&node, "big2");
    let mut bytes = raw_frame(false, 2, &[1; 600], true);
    bytes.extend(raw_frame(true, 0, &[1; 600], true));
    ws.get_mut().write_all(&bytes).unwrap();
    assert_eq!(read_close_code(&mut ws), 1009);
    assert!(node.stats()["ws_protocol_closed"].as_u64().unwrap() >= 2);
}

#[test]
fn invalid_utf8_closes_1007_and_bad_frames_close_1002() {
    let node = TestNode::start(&[]);
    let mut ws = open(&node, "u");
    ws.get_mut()
        .write_all(&raw_frame(true, 1, &[0xC3, 0x28], true))
        .unwrap();
    assert_eq!(read_close_code(&mut ws), 1007);

    for bad in [
        raw_frame(true, 1, b"unmasked", false),
        raw_frame(true, 3, b"", true),
        raw_frame(true, 0, b"orphan continuation", true),
        raw_frame(false, 9, b"", true),
    ] {
        let mut ws = open(&node, "bad");
        ws.get_mut().write_all(&bad).unwrap();
        assert_eq!(read_close_code(&mut ws), 1002, "frame {bad:?}");
    }
}

#[test]
fn upgrade_without_version_13_gets_426() {
    let node = TestNode::start(&[]);
    let resp = request(
        node.public(),
        b"GET /o/echo/a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 8\r\n\r\n",
    );
    assert_eq!(resp.status, 426);
    assert_eq!(resp.header("sec-websocket-version"), Some("13"));
    let resp = request(
        node.public(),
        b"GET /o/echo/a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n",
    );
    assert_eq!(resp.status, 400);
}

#[test]
fn sigterm_closes_websockets_with_1001_and_exits_0() {
    let mut node = TestNode::start(&[]);
    let mut a = open(&node, "s1");
    let mut b = open(&node, "s2");
    a.send(Message::text("before")).unwrap();
    assert_eq!(a.read().unwrap(), Message::text("before"));
    node.sigterm();
    for ws in [&mut a, &mut b] {
        match ws.read() {
            Ok(Message::Close(Some(f))) => assert_eq!(f.code, CloseCode::Away),
            other => panic!("expected close 1001, got {other:?}"),
        }
    }
    drop((a, b));
    let status = node.wait_exit();
    assert_eq!(status.code(), Some(0));
}
