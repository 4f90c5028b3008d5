//! Limits per request and per cell against the real node: each test crosses one limit, checks
//! the exact error and counter, and that the node and its other clients carry on.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;

use support::*;
use tungstenite::{Message, WebSocket};

fn post(node: &TestNode, path: &str) -> Resp {
    request(
        node.public(),
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
}

fn rows(node: &TestNode, object: &str) -> i64 {
    post(node, &format!("/o/limits/{object}?do=count")).json()["rows"]
        .as_i64()
        .unwrap()
}

fn open_ws(node: &TestNode, path: &str) -> WebSocket<TcpStream> {
    let stream = connect(node.public());
    let url = format!("ws://127.0.0.2:{}{path}", node.port);
    tungstenite::client(url.as_str(), stream)
        .expect("websocket handshake")
        .0
}

fn test_node(extra: &[(&str, &str)]) -> TestNode {
    let mut env = vec![TEST_APPS];
    env.extend_from_slice(extra);
    TestNode::start(&env)
}

#[test]
fn an_endless_loop_is_killed_and_the_object_carries_on() {
    let node = test_node(&[("COMBD_CPU_LIMIT_TICKS", "1000000")]);
    let r = post(&node, "/o/limits/cpu?do=spin");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (500, Some("cpu_limit"))
    );
    // The row the call wrote before its loop was rolled back; the next request is served.
    assert_eq!(rows(&node, "cpu"), 0);
    let s = node.stats();
    assert_eq!(s["cpu_limit_killed"], 1);
    assert_eq!(s["reloads"], 1);
    assert_eq!(s["limits"]["cpu_limit_ticks"], 1_000_000);
}

#[test]
fn sql_value_limit_at_and_past_2_mb() {
    let node = test_node(&[]);
    let r = post(
        &node,
        &format!("/o/limits/v?do=value&n={}", 2 * 1024 * 1024 - 1024),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post(
        &node,
        &format!("/o/limits/v?do=value&n={}", 2 * 1024 * 1024 + 1),
    );
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (413, Some("too_big"))
    );
    assert_eq!(rows(&node, "v"), 1);
    assert_eq!(node.stats()["sql_too_big"], 1);
}

#[test]
fn a_slow_statement_is_interrupted() {
    let node = test_node(&[]);
    let r = post(&node, "/o/limits/s?do=slowsql");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (500, Some("sql_timeout"))
    );
    assert_eq!(rows(&node, "s"), 0);
    assert_eq!(node.stats()["sql_timeouts"], 1);
}

#[test]
fn host_calls_past_one_second_in_all_are_killed() {
    let node = test_node(&[]);
    let r = post(&node, "/o/limits/h?do=manysql");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (500, Some("host_time"))
    );
    assert_eq!(rows(&node, "h"), 0);
    assert_eq!(node.stats()["host_time_killed"], 1);
}

#[test]
fn a_database_past_its_cap_is_full_and_not_corrupt() {
    let node = test_node(&[("COMBD_DB_MAX", "1M")]);
    let r = post(&node, "/o/limits/f?do=value&n=1000");
    assert_eq!(r.status, 200);
    let r = post(&node, "/o/limits/f?do=fill");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (507, Some("db_full"))
    );
    assert_eq!(rows(&node, "f"), 1, "the failed fill left nothing behind");
    assert_eq!(node.stats()["db_full"], 1);
    let db = rusqlite::Connection::open(node.data_dir.join("objects/limits/f.sqlite")).unwrap();
    let check: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

#[test]
fn sends_past_16_mib_a_request_fail() {
    let node = test_node(&[]);
    assert_eq!(post(&node, "/o/limits/x?do=sends&n=16").status, 200);
    let r = post(&node, "/o/limits/x?do=sends&n=17");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (500, Some("send_limit"))
    );
    assert_eq!(node.stats()["send_limit_refused"], 1);
}

#[test]
fn a_slow_reader_is_closed_at_8_mib_while_a_fast_one_keeps_receiving() {
    let node = test_node(&[("COMBD_SHARDS", "1")]);
    let _slow = open_ws(&node, "/o/limits/room"); // never reads
    let mut fast = open_ws(&node, "/o/limits/room");
    let mut received = 0;
    for _ in 0..8 {
        // 4 messages of 1 MiB to every session of the object.
        assert_eq!(post(&node, "/o/limits/room?do=sends&n=4").status, 200);
        for _ in 0..4 {
            match fast.read().unwrap() {
                Message::Text(t) => assert_eq!(t.len(), 1 << 20),
                other => panic!("unexpected {other:?}"),
            }
            received += 1;
        }
    }
    assert_eq!(received, 32);
    let s = wait_stats(&node, "the slow reader to be closed", |s| {
        s["ws_slow_closed"] == 1
    });
    // At most 8 MiB for the slow reader, plus one round (4 MiB) waiting for the fast one.
    assert!(
        s["outbound_bytes_max"].as_u64().unwrap() <= (12 << 20) + 1024,
        "{s}"
    );
    assert_eq!(s["outbound_budget_closed"], 0);
    wait_stats(&node, "the slow reader's session to end", |s| {
        s["sessions"] == 1
    });
    // The fast client is still served.
    assert_eq!(post(&node, "/o/limits/room?do=sends&n=1").status, 200);
    assert!(matches!(fast.read().unwrap(), Message::Text(_)));
}

#[test]
fn the_outbound_budget_closes_the_receiving_connection_not_the_node() {
    // One client may hold all of it: this crosses the shard's budget, not a client's share of
    // it (tests/fair.rs crosses that: its sessions resync).
    let node = test_node(&[
        ("COMBD_SHARDS", "1"),
        ("COMBD_OUTBOUND_BUDGET", "3M"),
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "100"),
    ]);
    let _slow = open_ws(&node, "/o/limits/budget");
    for _ in 0..3 {
        assert_eq!(post(&node, "/o/limits/budget?do=sends&n=4").status, 200);
    }
    let s = wait_stats(&node, "the budget to close the slow reader", |s| {
        s["outbound_budget_closed"] == 1
    });
    assert_eq!(s["ws_slow_closed"], 0);
    assert_eq!(s["limits"]["outbound_budget_bytes"], 3 << 20);
    assert!(s["outbound_bytes_max"].as_u64().unwrap() <= 3 << 20);
    assert_eq!(
        request(node.public(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status,
        200
    );
}

#[test]
fn websocket_message_rate_past_the_burst_closes_1008() {
    let node = TestNode::start(&[("COMBD_WS_RATE", "1"), ("COMBD_WS_BURST", "20")]);
    let mut ws = open_ws(&node, "/o/echo/rate");
    for i in 0..20 {
        ws.send(Message::text(format!("m{i}"))).unwrap();
        assert_eq!(ws.read().unwrap(), Message::text(format!("m{i}")));
    }
    ws.send(Message::text("one too many")).unwrap();
    loop {
        match ws.read().unwrap() {
            Message::Close(Some(f)) => {
                assert_eq!(u16::from(f.code), 1008);
                break;
            }
            Message::Text(t) => panic!("echoed past the burst: {t}"),
            _ => {}
        }
    }
    assert_eq!(node.stats()["ws_rate_closed"], 1);
}

#[test]
fn memory_kb_kills_a_call_that_holds_too_much() {
    // hold's memory_kb is 4096.
    let node = test_node(&[]);
    let r = post(&node, "/o/hold/mem?alloc=1048576");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = post(&node, "/o/hold/mem?alloc=5000000");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (500, Some("memory_limit"))
    );
    assert_eq!(node.stats()["memory_limit_killed"], 1);
    // The sequence the killed call advanced was rolled back.
    assert_eq!(post(&node, "/o/hold/mem").json()["seq"], 2);
}

#[test]
fn request_target_past_8_kib_gets_414() {
    let node = TestNode::start(&[]);
    let ok = format!(
        "GET /healthz?{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(8 * 1024 - 20)
    );
    assert_eq!(request(node.public(), ok.as_bytes()).status, 200);
    let long = format!(
        "GET /healthz?{} HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(8 * 1024)
    );
    let r = request(node.public(), long.as_bytes());
    assert_eq!(r.status, 414);
    assert_eq!(r.json()["error"], "request target too long");
}

#[test]
fn batches_never_pass_the_app_batch_size() {
    // The limits app batches at most 3. One request holds the object; 7 queue behind it.
    let node = test_node(&[("COMBD_SHARDS", "1")]);
    let addr = node.public();
    let first = std::thread::spawn(move || {
        request(
            addr,
            b"POST /o/limits/b?do=sleep&ms=800 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        )
    });
    wait_stats(&node, "the object at work", |s| s["cells_awake"] == 1);
    let rest: Vec<_> = (0..7)
        .map(|_| {
            std::thread::spawn(move || {
                request(
                    addr,
                    b"POST /o/limits/b?do=value&n=10 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
                )
            })
        })
        .collect();
    for t in rest {
        assert_eq!(t.join().unwrap().status, 200);
    }
    assert_eq!(first.join().unwrap().status, 200);
    let s = node.stats();
    assert_eq!(s["batch_max"], 3, "{s}");
    assert_eq!(rows(&node, "b"), 7);
}

#[test]
fn a_session_mailbox_holds_1000_then_drops_what_waits_and_resyncs() {
    let node = test_node(&[("COMBD_SHARDS", "1")]);
    let mut stuck = open_ws(&node, "/o/limits/mbox"); // reads nothing for now
                                                      // 4 MiB first: the socket's buffers fill and the session's write blocks...
    assert_eq!(post(&node, "/o/limits/mbox?do=sends&n=4").status, 200);
    // ...then 1,200 small messages wait in its mailbox: 1,000 fit; the 1,001st is dropped
    // with the 1,000 waiting, and the session is marked for a resync.
    assert_eq!(
        post(&node, "/o/limits/mbox?do=sends&n=1200&size=10").status,
        200
    );
    // The answer leaves once the batch is durable; its sends are delivered beside it, a
    // budget of deliveries a turn: wait until they are all out.
    let s = wait_stats(&node, "the sends delivered", |s| {
        s["fanouts_in_progress"] == 0 && s["session_mailbox_dropped"] != 0
    });
    assert_eq!(s["session_mailbox_dropped"], 1001, "{s}");
    assert_eq!(s["ws_slow_closed"], 0);
    // Once it reads, it gets what was already being written, then the resync: the limits app
    // keeps the default, a close with 1013 so the client reconnects for fresh state.
    let code = loop {
        match stuck.read().expect("a message or the close") {
            tungstenite::Message::Close(Some(f)) => break u16::from(f.code),
            tungstenite::Message::Close(None) => panic!("a close without a code"),
            _ => {}
        }
    };
    assert_eq!(code, 1013);
    assert_eq!(node.stats()["session_resyncs"], 1);
}
