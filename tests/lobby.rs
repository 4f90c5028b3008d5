//! The Rust example module that keeps presence (`examples/wasm/lobby-rs.rs`, built with the
//! guest crate to `examples/wasm/apps/lobby-rs.wasm`), served from the examples' apps
//! directory with real clients: the node keeps its rooms' presence and tells it to numbered
//! sessions; the module reads it (`presence`), finds a user across its rooms (`user`), knows a
//! session that resumes (`resumed`: no second hello) and who sent a message.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;

use support::*;
use tungstenite::{Message, WebSocket};

const APPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/wasm/apps");
const SECRET: &str = "combd-lobby-test-secret-0123456789abcdefgh";

/// The next text message of `ws`, split at its first `|` (pings skipped).
fn next(ws: &mut WebSocket<TcpStream>) -> (String, String) {
    loop {
        if let Message::Text(t) = ws.read().expect("a message") {
            let (h, p) = t.as_str().split_once('|').expect("a header");
            return (h.to_string(), p.to_string());
        }
    }
}

/// Reads until a message whose header is `header` and whose payload `f` takes.
fn until(ws: &mut WebSocket<TcpStream>, header: &str, f: impl Fn(&str) -> bool) -> String {
    loop {
        let (h, p) = next(ws);
        if h == header && f(&p) {
            return p;
        }
    }
}

fn get(node: &TestNode, target: &str) -> Resp {
    request(
        node.public(),
        format!("GET /o/lobby-rs/{target} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
}

#[test]
fn a_rust_module_keeps_presence_knows_a_resume_and_finds_a_user() {
    let key = auth::key_file("lobby", SECRET);
    let node = TestNode::start(&[
        ("COMBD_APPS_DIR", APPS),
        ("COMBD_AUTH_JWT_KEY_FILE", key.to_str().unwrap()),
    ]);
    let open = |sub: &str, after: &str| {
        auth::open_ws_with(
            &node,
            &format!("/o/lobby-rs/r?combd_after={after}"),
            &auth::token(SECRET, sub, None),
        )
    };
    let mut alice = open("alice", "new");
    // Its hello, the log's position (a new log: epoch, 0) and the room's members, in any order.
    let (mut hello, mut placed, mut members) = (None, false, false);
    while hello.is_none() || !placed || !members {
        let (h, p) = next(&mut alice);
        match h.as_str() {
            "" => hello = Some(p),
            "!presence" => members |= p.contains("\"members\""),
            h => placed |= h.starts_with('!'),
        }
    }
    assert_eq!(hello.unwrap(), r#"{"t":"hello","said":[]}"#);
    let mut bob = open("bob", "new");
    until(&mut alice, "!presence", |p| {
        p.contains("\"join\":[{") && p.contains("bob")
    });
    // What alice says is broadcast with who said it, numbered in the room's log.
    alice.send(Message::text("hi")).unwrap();
    let said = until(&mut bob, "1", |_| true);
    assert_eq!(said, r#"{"t":"said","who":"alice","text":"hi"}"#);
    // The log begins with it: its epoch comes in the position before frame 1.
    let mut epoch = String::new();
    let alice_got = loop {
        let (h, p) = next(&mut alice);
        if h == "1" {
            break p;
        }
        if h.starts_with('!') && h != "!presence" {
            epoch = h[1..].split('.').next().unwrap().to_string();
        }
    };
    assert_eq!(alice_got, said);
    assert!(epoch != "0" && !epoch.is_empty(), "{epoch}");
    // The module reads the room's members, and where a user is.
    let members = get(&node, "r").json();
    let mut who: Vec<&str> = members["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["who"].as_str().unwrap())
        .collect();
    who.sort();
    assert_eq!(who, ["alice", "bob"], "{members}");
    let bob_at = get(&node, "r?user=bob");
    assert_eq!(bob_at.status, 200, "{}", bob_at.text());
    assert!(bob_at.text().contains("\"r\""), "{}", bob_at.text());
    assert_eq!(get(&node, "r?user=nobody").status, 404);
    // Alice comes back with her place: resumed, and no second hello.
    drop(alice);
    bob.send(Message::text("while away")).unwrap();
    until(&mut bob, "2", |_| true);
    let mut back = open("alice", &format!("{epoch}.1"));
    // Her old socket's leave may reach the new one first: the change is the topic's, and the
    // new session is the topic's from its upgrade on (seen once under a full suite's load).
    let (h, p) = loop {
        let (h, p) = next(&mut back);
        if h != "!presence" {
            break (h, p);
        }
    };
    assert!(h.starts_with('!') && p == "resumed", "{h}|{p}");
    let (h, p) = next(&mut back);
    assert_eq!(
        (h.as_str(), p.as_str()),
        ("2", r#"{"t":"said","who":"bob","text":"while away"}"#)
    );
    // An anonymous session is listed, and its messages say no one.
    let mut anon = open_ws(&node, "/o/lobby-rs/r?combd_after=new");
    until(&mut anon, "", |p| p.contains("hello"));
    anon.send(Message::text("psst")).unwrap();
    let p = until(&mut back, "3", |_| true);
    assert_eq!(p, r#"{"t":"said","who":null,"text":"psst"}"#);
    // A bad message fails its call, answered to its session.
    anon.send(Message::binary(vec![1u8])).unwrap();
    let err = until(&mut anon, "", |p| p.contains("error"));
    assert!(err.contains("messages are text"), "{err}");
}
