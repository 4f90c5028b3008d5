//! The budget per turn: a loop whose work grows with load yields the shard's loop, so other
//! connections are served while it runs (`turn_yields`), and a turn that holds the loop too
//! long is seen (`turn_overruns`).

#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;
use std::net::TcpStream;

use support::*;

const VIEWERS: usize = 5_000;

fn sum(stats: &serde_json::Value, key: &str) -> u64 {
    stats[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {stats}"))
}

/// A WebSocket upgrade to page 0 of `board`, written without waiting for the answer.
fn upgrade_request(port: u16, board: &str) -> Vec<u8> {
    format!(
        "GET /o/million/{board}?page=0 HTTP/1.1\r\nHost: 127.0.0.2:{port}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Version: 13\r\n\r\n"
    )
    .into_bytes()
}

/// A masked client text frame.
fn text_frame(text: &str) -> Vec<u8> {
    let payload = text.as_bytes();
    assert!(payload.len() < 126);
    let mask = [1u8, 2, 3, 4];
    let mut f = vec![0x81, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

/// `/stats` over a keep-alive connection to the localhost listener.
struct StatsConn(std::io::BufReader<TcpStream>);

impl StatsConn {
    fn get(&mut self) -> serde_json::Value {
        self.0
            .get_mut()
            .write_all(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let r = read_response(&mut self.0);
        assert_eq!(r.status, 200);
        r.json()
    }
}

#[test]
fn a_broadcast_to_5000_viewers_leaves_room_for_other_requests() {
    let node = TestNode::start(&[("COMBD_SHARDS", "1")]);
    // 5,000 viewers of one page, attached in waves smaller than the board's mailbox (each
    // attach is an input of the board object).
    let mut viewers: Vec<TcpStream> = Vec::with_capacity(VIEWERS);
    for wave in 1..=VIEWERS / 500 {
        for i in 0..500 {
            // 5,000 viewers come from many addresses, each within its share.
            let mut v = connect_from(client_address(i), node.public());
            v.write_all(&upgrade_request(node.port, "fan")).unwrap();
            viewers.push(v);
        }
        wait_stats(&node, "a wave of viewers attached", |s| {
            sum(s, "ws_open") == (wave * 500) as u64
        });
    }
    let mut clicker = connect(node.public());
    clicker
        .write_all(&upgrade_request(node.port, "fan"))
        .unwrap();
    wait_stats(&node, "the clicker attached", |s| {
        sum(s, "ws_open") == VIEWERS as u64 + 1
    });

    // Click, then ask for /stats on the same shard while the click fans out. Without a
    // budget per turn the whole fan-out runs in one turn, and no request is ever answered
    // in the middle of it.
    let mut stats = StatsConn(std::io::BufReader::new(connect(node.local())));
    let before = stats.get();
    let mut seen_in_progress = false;
    for i in 0..20 {
        clicker
            .write_all(&text_frame(&format!(r#"{{"t":"click","i":{i}}}"#)))
            .unwrap();
        for _ in 0..200 {
            if sum(&stats.get(), "fanouts_in_progress") > 0 {
                seen_in_progress = true;
                break;
            }
        }
        if seen_in_progress {
            break;
        }
    }
    let now = stats.get();
    let moved = |k: &str| sum(&now, k) - sum(&before, k);
    assert!(
        seen_in_progress,
        "no request on the shard was answered while a broadcast was fanning out \
         (since the first click: ws_messages_in {}, ws_messages_out {}, turn_yields {}, \
         broadcasts refused {}, ws_rate_closed {})",
        moved("ws_messages_in"),
        moved("ws_messages_out"),
        moved("turn_yields"),
        moved("mailbox_refused"),
        moved("ws_rate_closed"),
    );
    let after = wait_stats(&node, "the fan-outs to end", |s| {
        sum(s, "fanouts_in_progress") == 0
    });
    // Each fan-out to 5,001 sessions yields at least 5,001 / FANOUT_PER_TURN times.
    let yields = sum(&after, "turn_yields") - sum(&before, "turn_yields");
    let per_turn = after["limits"]["fanout_per_turn"].as_u64().unwrap();
    assert!(
        yields >= VIEWERS as u64 / per_turn,
        "{yields} forced yields for a fan-out to {VIEWERS} sessions, {per_turn} a turn"
    );
    // And the click reached every viewer.
    let out_before = sum(&before, "ws_messages_out");
    wait_stats(&node, "the click written to every viewer", |s| {
        sum(s, "ws_messages_out") - out_before >= VIEWERS as u64
    });
    drop(viewers);
}

#[test]
fn a_task_that_holds_the_loop_is_counted_as_an_overrun() {
    let node = TestNode::start(&[("COMBD_SHARDS", "1"), TEST_APPS]);
    let before = sum(&node.stats(), "turn_overruns");
    // The stall app spins 300 ms on the shard's loop: the housekeeping tick (every 100 ms)
    // fires at least 200 ms late.
    let r = request(
        node.public(),
        b"POST /o/stall/x?ms=300 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    wait_stats(&node, "an overrun", |s| sum(s, "turn_overruns") > before);
}
