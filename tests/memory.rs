//! A guard on memory per idle WebSocket: 2,000 idle echo WebSockets must not cost the node more
//! than a stated bound each (RSS delta / connections). The figure is steady with the count here
//! (the same bytes at 2,000 and 12,000 sockets), so a bounded count can catch a regression like
//! the one that tripled it unnoticed (a connection's task sized for TLS). The bound is for this
//! test's debug build, whose tasks are larger than a release build's; RESULTS.md has the
//! release figure (`bench/idle.sh`).

#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;
use std::net::TcpStream;

use support::*;

const CONNS: usize = 2_000;
/// Bytes per idle WebSocket this debug build may cost: 1,148 measured once the upgrade's box
/// was freed at the WebSocket's start and glommio's poll source shrank (vendor/glommio) — 1,361
/// once the connection task stopped keeping its socket, its upgrade and its future twice,
/// 2,740 before that — with half again as margin.
const BOUND_BYTES: u64 = 1_728;

fn rss_bytes(pid: i32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn upgrade(node: &TestNode, i: usize) -> TcpStream {
    let mut s = connect_from(client_address(i), node.public());
    write!(
        s,
        "GET /o/echo/m{i} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    let head = read_head(&mut s);
    assert!(head.starts_with(b"HTTP/1.1 101"));
    s
}

#[test]
fn an_idle_websocket_costs_the_node_less_than_its_bound() {
    let node = TestNode::start(&[("COMBD_SHARDS", "1")]);
    // Warm up: the allocator's and the shard's first structures are not per connection.
    let warm: Vec<TcpStream> = (0..200).map(|i| upgrade(&node, i)).collect();
    drop(warm);
    wait_stats(&node, "the warm-up connections to close", |s| {
        s["ws_open"] == 0
    });
    let before = rss_bytes(node.pid());
    let conns: Vec<TcpStream> = (0..CONNS).map(|i| upgrade(&node, i)).collect();
    wait_stats(&node, "every WebSocket open", |s| {
        s["ws_open"] == CONNS as u64
    });
    let per_conn = rss_bytes(node.pid()).saturating_sub(before) / CONNS as u64;
    println!("{per_conn} bytes per idle WebSocket (debug build)");
    assert!(
        per_conn <= BOUND_BYTES,
        "{per_conn} bytes per idle WebSocket, past the bound of {BOUND_BYTES}"
    );
    drop(conns);
}
