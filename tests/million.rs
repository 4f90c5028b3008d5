//! The million app's protocol, run against the native app and against the same app deployed
//! as WebAssembly modules (`examples/wasm/million.c`, built to
//! `examples/wasm/apps/million-wasm.wasm`, and `examples/wasm/million-rs.rs`, in Rust with the
//! guest crate, built to `examples/wasm/apps/million-rs.wasm`): one suite, three
//! implementations.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;

use support::*;
use tungstenite::{Message, WebSocket};

/// The example modules, built by `examples/wasm/build.sh`.
const APPS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/wasm/apps");

/// Opens million sessions until one lands on each of the two shards.
fn session_per_shard(node: &TestNode, app: &str, board: &str) -> Vec<(WebSocket<TcpStream>, u64)> {
    let mut by_shard: Vec<Option<(WebSocket<TcpStream>, u64)>> = vec![None, None];
    for _ in 0..200 {
        let mut ws = open_ws(node, &format!("/o/{app}/{board}?page=0"));
        let first = read_json(&mut ws);
        assert_eq!(first["t"], "page");
        assert_eq!(first["bits"].as_str().unwrap().len(), 1024);
        let s = first["s"].as_u64().unwrap();
        let shard = (s >> 40) as usize;
        if by_shard[shard].is_none() {
            by_shard[shard] = Some((ws, s));
        }
        if by_shard.iter().all(Option::is_some) {
            return by_shard.into_iter().map(Option::unwrap).collect();
        }
    }
    panic!("timed out waiting for sessions on both shards");
}

/// The protocol of `app`: a click is broadcast once to the viewers of its page on every shard,
/// a late viewer gets the page from the database, bad clicks and pages are refused.
fn click_is_broadcast_once_to_viewers_on_every_shard(app: &str) {
    let node = TestNode::start(&[("COMBD_SHARDS", "2"), ("COMBD_APPS_DIR", APPS)]);
    let mut sessions = session_per_shard(&node, app, "board1");
    let me = sessions[0].1;
    sessions[0]
        .0
        .send(Message::text(r#"{"t":"click","i":17,"c":1}"#))
        .unwrap();
    for (ws, _) in sessions.iter_mut() {
        let m = read_json(ws);
        assert_eq!(m["t"], "set");
        let u = &m["u"][0];
        assert_eq!(
            (u[0].as_u64(), u[1].as_u64(), u[2].as_u64(), u[3].as_u64()),
            (Some(17), Some(1), Some(me), Some(1))
        );
    }
    // Each viewer got it exactly once: the next message each sees is the next click's.
    sessions[1]
        .0
        .send(Message::text(r#"{"t":"click","i":17,"c":2}"#))
        .unwrap();
    for (ws, _) in sessions.iter_mut() {
        let m = read_json(ws);
        assert_eq!(m["u"][0][1], 0, "the second click unchecks the box: {m}");
        assert_eq!(m["u"][0][3], 2);
    }
    // A new viewer sees the state from the database.
    let mut late = open_ws(&node, &format!("/o/{app}/board1?page=0"));
    assert_eq!(
        read_json(&mut late)["bits"].as_str().unwrap()[..8].to_string(),
        "00000000"
    );
    // A bad click gets an error to its sender only.
    let (ws, _) = &mut sessions[0];
    ws.send(Message::text(r#"{"t":"click","i":1000000}"#))
        .unwrap();
    assert!(read_json(ws)["error"].as_str().unwrap().contains("below"));
    // A page that does not exist is refused before the upgrade.
    let r = request(
        node.public(),
        format!("GET /o/{app}/board1?page=999 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").as_bytes(),
    );
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().unwrap().contains("page"));
}

#[test]
fn native_million_speaks_the_protocol() {
    click_is_broadcast_once_to_viewers_on_every_shard("million");
}

#[test]
fn million_module_speaks_the_protocol() {
    click_is_broadcast_once_to_viewers_on_every_shard("million-wasm");
}

/// The same app written in Rust with the guest crate (`guest/`, built by
/// `examples/wasm/build-rust.sh`).
#[test]
fn million_rust_module_speaks_the_protocol() {
    click_is_broadcast_once_to_viewers_on_every_shard("million-rs");
}

#[test]
fn counter_module_counts_durably_in_batches() {
    let node = TestNode::start(&[("COMBD_APPS_DIR", APPS)]);
    let post = |method: &str| {
        request(
            node.public(),
            format!("{method} /o/counter-wasm/c HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
    };
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let addr = node.public();
            std::thread::spawn(move || {
                request(addr, b"POST /o/counter-wasm/c HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").json()["value"]
                    .as_i64()
                    .unwrap()
            })
        })
        .collect();
    let mut seen: Vec<i64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    seen.sort();
    assert_eq!(
        seen,
        (1..=8).collect::<Vec<_>>(),
        "each increment answered its own value"
    );
    assert_eq!(post("GET").json()["value"], 8);
    assert_eq!(post("PUT").status, 405);
    let with_body = |body: &str| {
        request(
            node.public(),
            format!("POST /o/counter-wasm/c HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
                .as_bytes(),
        )
    };
    assert_eq!(with_body("-3").json()["value"], 5);
    let r = with_body("x");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (400, Some("the body must be a whole number"))
    );
    assert_eq!(
        post("GET").json()["value"],
        5,
        "the refused request changed nothing"
    );
}
