//! Fan-out writes a session's waiting frames together: a call that broadcasts several frames
//! to many viewers gives each viewer its frames in one send, not one send per frame (the
//! kernel's cost per send is the fan-out's ceiling; `bench/scenario.sh fanout` measures it).

#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;

use support::*;
use tungstenite::{Message, WebSocket};

/// More viewers than one turn's fan-out budget (256 deliveries) covers with one frame each,
/// so the fan-out yields while it runs and connections write in between.
const VIEWERS: usize = 300;
const FRAMES: usize = 8;

fn open_viewer(node: &TestNode) -> WebSocket<TcpStream> {
    open_viewer_of(node, 0)
}

fn open_viewer_of(node: &TestNode, topic: usize) -> WebSocket<TcpStream> {
    let url = format!("ws://127.0.0.2:{}/o/fanout/f?topic={topic}", node.port);
    tungstenite::client(url.as_str(), connect(node.public()))
        .expect("websocket handshake")
        .0
}

fn counter(stats: &serde_json::Value, name: &str) -> u64 {
    stats[name].as_u64().unwrap()
}

#[test]
fn a_viewers_frames_of_one_broadcast_go_out_in_one_send() {
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "1")]);
    let mut viewers: Vec<_> = (0..VIEWERS).map(|_| open_viewer(&node)).collect();
    let before = node.stats();
    let resp = request(
        node.public(),
        format!("POST /o/fanout/f?n={FRAMES} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            .as_bytes(),
    );
    assert_eq!(
        (resp.status, resp.json()["sent"].as_u64()),
        (200, Some(FRAMES as u64))
    );
    for ws in &mut viewers {
        for i in 0..FRAMES {
            let Message::Text(t) = ws.read().expect("a frame of the broadcast") else {
                panic!("expected a text frame");
            };
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            assert_eq!(v["f"].as_u64(), Some(i as u64), "frames in order");
        }
    }
    let after = node.stats();
    let frames = counter(&after, "ws_messages_out") - counter(&before, "ws_messages_out");
    let sends = counter(&after, "ws_sends") - counter(&before, "ws_sends");
    assert_eq!(frames, (VIEWERS * FRAMES) as u64);
    // One send a viewer, give or take the few viewers whose frames a turn's budget split.
    // Delivered frame by frame (every viewer's first frame, then every viewer's second...),
    // the connections woken between turns write one frame each: 2,400 sends (checked).
    assert!(
        sends <= VIEWERS as u64 + 16,
        "{sends} sends for {frames} frames to {VIEWERS} viewers"
    );
}

/// A call's broadcasts to many small topics share one budget of deliveries a turn: 600
/// viewers, 2 on each of 300 topics, one frame each, is more than a turn's 256 deliveries, so
/// the fan-out yields. (With a budget per topic, as before, 2 deliveries never spent it: a
/// board's 245 pages of 41 viewers each held the shard for a whole 10,000-viewer fan-out.)
#[test]
fn a_broadcast_to_many_small_topics_yields_within_one_budget() {
    const TOPICS: usize = 300;
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "1")]);
    let mut viewers: Vec<_> = (0..2 * TOPICS)
        .map(|i| open_viewer_of(&node, i % TOPICS))
        .collect();
    let budget = node.stats()["limits"]["fanout_per_turn"].as_u64().unwrap();
    assert!(
        (2 * TOPICS as u64) > 2 * budget,
        "the test must cross the budget twice"
    );
    let before = counter(&node.stats(), "turn_yields");
    let resp = request(
        node.public(),
        format!(
            "POST /o/fanout/f?n=1&topics={TOPICS} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(resp.status, 200, "{}", resp.text());
    for ws in &mut viewers {
        let Message::Text(t) = ws.read().expect("the broadcast's frame") else {
            panic!("expected a text frame");
        };
        let v: serde_json::Value = serde_json::from_str(&t).unwrap();
        assert_eq!(v["f"].as_u64(), Some(0));
    }
    let yields = counter(&node.stats(), "turn_yields") - before;
    assert!(
        yields >= 2,
        "{yields} forced yields for {} deliveries, {budget} a turn",
        2 * TOPICS
    );
}

#[test]
fn fanout_refuses_a_frame_count_out_of_range() {
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "1")]);
    for q in ["n=0", "n=65", "n=x", "topics=0", "topics=1001"] {
        let resp = request(
            node.public(),
            format!("POST /o/fanout/f?{q} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(resp.status, 400, "{q}: {}", resp.text());
        assert!(resp.json()["error"].is_string());
    }
}

/// The fan-out writes a waiting viewer's frames itself; when the kernel takes only part of
/// them (a viewer with a small receive buffer that is not reading), the rest of the frame cut
/// short is written by the viewer's connection before anything else, and every frame arrives
/// whole and in order, counted once.
#[test]
fn a_fan_out_write_cut_short_is_finished_by_the_connection() {
    const BIG: usize = 16;
    const SIZE: usize = 16_384;
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "1")]);
    let mut ws = stuck_viewer(&node);
    let before = node.stats();
    for call in 0..2 {
        let resp = request(
            node.public(),
            format!(
                "POST /o/fanout/f?n={BIG}&size={SIZE} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            )
            .as_bytes(),
        );
        assert_eq!(resp.status, 200, "call {call}");
        for i in 0..BIG {
            let Message::Text(t) = ws.read().expect("a frame of the broadcast") else {
                panic!("expected a text frame");
            };
            assert_eq!(t.len(), SIZE, "call {call}, frame {i} whole");
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            assert_eq!(
                v["f"].as_u64(),
                Some(i as u64),
                "call {call}: frames in order"
            );
        }
    }
    let after = node.stats();
    let delta = |k: &str| counter(&after, k) - counter(&before, k);
    assert!(
        delta("ws_direct_cut") >= 1,
        "the fan-out's write was cut short at least once: {after}"
    );
    assert_eq!(
        delta("ws_messages_out"),
        2 * BIG as u64,
        "each frame counted once"
    );
    assert_eq!(counter(&after, "ws_open"), 1, "the viewer is still open");
}

/// Viewers waiting to read get their frames from the fan-out itself, without their
/// connections being woken: counted in `ws_direct_sends`.
#[test]
fn waiting_viewers_are_written_by_the_fan_out() {
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "1")]);
    let mut viewers: Vec<_> = (0..20).map(|_| open_viewer(&node)).collect();
    let before = node.stats();
    let resp = request(
        node.public(),
        b"POST /o/fanout/f?n=2 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(resp.status, 200);
    for ws in &mut viewers {
        for i in 0..2 {
            let Message::Text(t) = ws.read().unwrap() else {
                panic!("expected a text frame");
            };
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            assert_eq!(v["f"].as_u64(), Some(i));
        }
    }
    let after = node.stats();
    let direct = counter(&after, "ws_direct_sends") - counter(&before, "ws_direct_sends");
    assert!(
        direct >= 1 && direct <= 20,
        "{direct} of 20 viewers written by the fan-out"
    );
}

/// A viewer with a 4 KiB receive buffer: while it does not read, the fan-out's writes to it
/// are cut short and the rest waits in its mail.
fn stuck_viewer(node: &TestNode) -> WebSocket<TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(4096).unwrap();
    sock.connect_timeout(&node.public().into(), WAIT).unwrap();
    let stream: TcpStream = sock.into();
    stream.set_read_timeout(Some(WAIT)).unwrap();
    let url = format!("ws://127.0.0.2:{}/o/fanout/f", node.port);
    tungstenite::client(url.as_str(), stream).unwrap().0
}

/// Viewers that go while their frames are being written (the fan-out's writes cut short, their
/// connections writing the rest) leave nothing held: every session
/// ends, the shard's outbound bytes come back to 0, and the viewers that stay get every frame
/// whole and in order, then the next broadcast too.
#[test]
fn viewers_gone_while_their_frames_are_written_hold_nothing() {
    const GONE: usize = 300;
    const STAY: usize = 10;
    const SIZE: usize = 16_384;
    let node = TestNode::start(&[TEST_APPS, ("COMBD_SHARDS", "1")]);
    let gone: Vec<_> = (0..GONE).map(|_| stuck_viewer(&node)).collect();
    // The viewers that stay are another client (the node's own machine), whose share the
    // gone viewers' waiting bytes do not take.
    let url = format!("ws://127.0.0.1:{}/o/fanout/f?topic=0", node.port);
    let mut stay: Vec<_> = (0..STAY)
        .map(|_| {
            tungstenite::client(url.as_str(), connect(node.local()))
                .unwrap()
                .0
        })
        .collect();
    let post = format!(
        "POST /o/fanout/f?n={FRAMES}&size={SIZE} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
    );
    let resp = request(node.public(), post.as_bytes());
    assert_eq!(resp.status, 200);
    // Gone with a reset while their connections write the rest of what the fan-out cut short.
    let s = wait_stats(&node, "the fan-out's writes cut short", |s| {
        counter(s, "ws_direct_cut") >= GONE as u64
    });
    assert!(
        counter(&s, "outbound_bytes") > 0,
        "bytes wait for the viewers: {s}"
    );
    for ws in gone {
        let s = ws.into_inner();
        socket2::SockRef::from(&s)
            .set_linger(Some(std::time::Duration::ZERO))
            .unwrap();
    }
    let read_all = |stay: &mut Vec<WebSocket<TcpStream>>| {
        for ws in stay.iter_mut() {
            for i in 0..FRAMES {
                let Message::Text(t) = ws.read().expect("a frame of the broadcast") else {
                    panic!("expected a text frame");
                };
                assert_eq!(t.len(), SIZE, "frame {i} whole");
                let v: serde_json::Value = serde_json::from_str(&t).unwrap();
                assert_eq!(v["f"].as_u64(), Some(i as u64), "frames in order");
            }
        }
    };
    read_all(&mut stay);
    wait_stats(
        &node,
        "the gone viewers' sessions ended, their bytes given back",
        |s| {
            counter(s, "sessions") == STAY as u64
                && counter(s, "ws_open") == STAY as u64
                && counter(s, "outbound_bytes") == 0
        },
    );
    let resp = request(node.public(), post.as_bytes());
    assert_eq!(resp.status, 200);
    read_all(&mut stay);
    wait_stats(&node, "nothing held after the next broadcast", |s| {
        counter(s, "outbound_bytes") == 0
    });
}
