//! Fair by construction: every pool the node shares between clients (live objects, TLS
//! handshakes in progress, object answers not yet written, object creations) holds each client
//! to its share, and a client on another address is served while one fills its share. The
//! attacker and the honest client come from two loopback addresses of their own
//! (127.0.4.1 and 127.0.4.2) to the public listener.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, Write};
use std::net::TcpStream;

use support::tls::*;
use support::*;

const ATTACKER: [u8; 4] = [127, 0, 4, 1];
const HONEST: [u8; 4] = [127, 0, 4, 2];

/// Sends `raw` (pipelined requests) on a new connection from `from` and reads `n` responses.
fn pipelined(node: &TestNode, from: [u8; 4], raw: &[u8], n: usize) -> Vec<Resp> {
    let mut s = connect_from(from, node.public());
    s.write_all(raw).unwrap();
    let mut r = BufReader::new(s);
    (0..n).map(|_| read_response(&mut r)).collect()
}

fn figure(s: &serde_json::Value, name: &str) -> u64 {
    s[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in /stats: {s}"))
}

/// 1,100 counters read in a loop from one address filled `COMBD_MAX_OPEN_OBJECTS`, and another
/// address's requests for idle counters were refused 503. Now the address holds its tenth of
/// the live objects and no more, and the other is served.
#[test]
fn one_address_holds_its_share_of_live_objects_and_another_is_served() {
    let node = TestNode::start(&[("COMBD_MAX_OPEN_OBJECTS", "50")]);
    // 60 counters written, pipelined 6 to a connection (each object stays live for
    // `object_idle_ms` after its write).
    let mut refused = 0;
    for batch in 0..10 {
        let raw: String = (0..6)
            .map(|i| {
                format!("POST /o/counter/a{batch}-{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1")
            })
            .collect();
        for r in pipelined(&node, ATTACKER, raw.as_bytes(), 6) {
            match r.status {
                200 => {}
                503 => {
                    assert_eq!(r.json()["error"], "overloaded");
                    assert_eq!(r.header("retry-after"), Some("1"));
                    refused += 1;
                }
                other => panic!("unexpected {other}: {}", r.text()),
            }
        }
    }
    let s = node.stats();
    // A tenth of 50: the attacker never held more than 5 live objects at once.
    assert!(figure(&s, "fair_objects_client_max") <= 5, "{s}");
    assert_eq!(figure(&s, "fair_objects_capacity"), 50);
    assert!(
        refused >= 10 && figure(&s, "fair_objects_refused_share") >= 10,
        "refused {refused}: {s}"
    );
    // The honest address makes five objects live (its share) while the attacker holds its own.
    let raw: String = (0..5)
        .map(|i| format!("POST /o/counter/h{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1"))
        .collect();
    for r in pipelined(&node, HONEST, raw.as_bytes(), 5) {
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

/// Sets `n` reminders of 1 KiB on `reminder/<name>` from the node's own machine, pipelined.
fn reminders(node: &TestNode, name: &str, n: usize) {
    let text = "x".repeat(1000);
    let body = format!("{{\"in_ms\":3600000,\"text\":\"{text}\"}}");
    let one = format!(
        "POST /o/reminder/{name} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    for _ in 0..n / 50 {
        let mut s = connect(node.local());
        s.write_all(one.repeat(50).as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        for _ in 0..50 {
            assert_eq!(read_response(&mut r).status, 200);
        }
    }
}

/// One 40-byte GET of a reminder list answered 12.4 MB, and a client that pipelined eight of
/// them on connections it never read made the node hold every answer (`out` was outside every
/// budget). Now each answer is reserved for its client before it is held: past the client's
/// share of the answer pool, 503; another address is served.
#[test]
fn a_client_that_reads_nothing_holds_its_share_of_answers() {
    // An answer pool of 8 MiB: a client's share is 819 KiB, a list of 400 reminders ~430 KB.
    let node = TestNode::start(&[("COMBD_OUTBOUND_BUDGET", "8M")]);
    reminders(&node, "big", 400);
    let get = b"GET /o/reminder/big HTTP/1.1\r\nHost: x\r\n\r\n".repeat(8);
    // Four connections that ask eight lists each and read nothing (a small receive buffer, so
    // the kernel takes little of what the node writes).
    let attackers: Vec<TcpStream> = (0..4)
        .map(|_| {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.set_recv_buffer_size(4096).unwrap();
            sock.bind(&std::net::SocketAddr::from((ATTACKER, 0)).into())
                .unwrap();
            sock.connect(&node.public().into()).unwrap();
            let mut s: TcpStream = sock.into();
            s.write_all(&get).unwrap();
            s
        })
        .collect();
    let s = wait_stats(&node, "the attacker's answers refused", |s| {
        s["fair_answer_bytes_refused_share"].as_u64().unwrap_or(0) >= 8
    });
    let share = 8 * 1024 * 1024 / 10;
    assert!(figure(&s, "fair_answer_bytes_client_max") <= share, "{s}");
    assert!(figure(&s, "fair_answer_bytes_held") <= share, "{s}");
    // Another address reads the same list whole.
    let r = pipelined(
        &node,
        HONEST,
        b"GET /o/reminder/big HTTP/1.1\r\nHost: x\r\n\r\n",
        1,
    );
    assert_eq!(r[0].status, 200, "{}", r[0].text());
    assert_eq!(r[0].json()["pending"].as_array().unwrap().len(), 400);
    drop(attackers);
    // Once its connections are gone, nothing is held for the attacker.
    wait_stats(&node, "the answers given back", |s| {
        s["fair_answer_bytes_held"].as_u64() == Some(0)
    });
}

/// One address replaying a canned ClientHello and going silent kept a shard's 256 handshake
/// slots full; real handshakes from elsewhere were refused. Now it holds its share of them.
#[test]
fn canned_client_hellos_from_one_address_hold_its_share_of_handshakes() {
    let dir = std::env::temp_dir().join(format!("combd-fair-tls-{}", std::process::id()));
    let pair = make_pair();
    let (c, k) = write_pair(&dir, &pair);
    let node = TestNode::start(&[
        ("COMBD_SHARDS", "1"),
        ("COMBD_TLS_LISTEN", "127.0.0.2:0"),
        ("COMBD_TLS_CERT", c.to_str().unwrap()),
        ("COMBD_TLS_KEY", k.to_str().unwrap()),
        ("COMBD_TLS_HANDSHAKE_TIMEOUT", "30s"),
    ]);
    let hello = client_hello(&pair.der);
    let to: std::net::SocketAddr = ([127, 0, 0, 2], node.tls_port.unwrap()).into();
    let silent: Vec<TcpStream> = (0..300)
        .map(|_| {
            let mut s = connect_from(ATTACKER, to);
            s.write_all(&hello).unwrap();
            s
        })
        .collect();
    let s = wait_stats(&node, "300 ClientHellos in", |s| {
        s["tls_handshakes_in_progress"].as_u64().unwrap_or(0)
            + s["tls_handshakes_refused"].as_u64().unwrap_or(0)
            >= 300
    });
    // A tenth of the 256 slots.
    assert_eq!(figure(&s, "tls_handshakes_in_progress"), 25, "{s}");
    assert_eq!(figure(&s, "fair_tls_handshakes_refused_share"), 275, "{s}");
    // A real client from another address completes its handshake and is answered.
    let tcp = connect_from(HONEST, to);
    let mut tls = tls_over(tcp, &pair.der).unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut BufReader::new(tls)).status, 200);
    drop(silent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client spraying POSTs to new names spent a shard's whole creation burst, and another
/// address's first writes were refused 429. Now it spends its share of the burst.
#[test]
fn new_names_from_one_address_spend_its_share_of_creations() {
    // A burst of 10 s × 10 a second = 100 creations a shard; a client's share is 10.
    let node = TestNode::start(&[("COMBD_SHARDS", "1"), ("COMBD_OBJECT_CREATE_RATE", "10")]);
    let mut created = 0;
    let mut rate_refused = 0;
    for batch in 0..8 {
        let raw: String = (0..5)
            .map(|i| {
                format!("POST /o/counter/s{batch}-{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1")
            })
            .collect();
        for r in pipelined(&node, ATTACKER, raw.as_bytes(), 5) {
            match r.status {
                200 => created += 1,
                429 => {
                    assert_eq!(r.json()["error"], "object creation rate");
                    rate_refused += 1;
                }
                other => panic!("unexpected {other}: {}", r.text()),
            }
        }
    }
    assert_eq!(created, 10, "the attacker's share of the burst");
    assert_eq!(rate_refused, 30);
    let s = node.stats();
    assert_eq!(figure(&s, "fair_object_creations_refused_share"), 30, "{s}");
    // Another address's first writes go through.
    let raw: String = (0..5)
        .map(|i| format!("POST /o/counter/h{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1"))
        .collect();
    for r in pipelined(&node, HONEST, raw.as_bytes(), 5) {
        assert_eq!(r.status, 200, "{}", r.text());
    }
}

/// 1,024 trickled `Content-Length: 1048576` bodies from one address took a shard's inbound
/// budget, and another address's bodies were refused 503. Now what is held past each
/// connection's floor comes from the client's share of the budget.
#[test]
fn trickled_bodies_from_one_address_hold_its_share_of_the_inbound_budget() {
    let node = TestNode::start(&[
        ("COMBD_SHARDS", "1"),
        TEST_APPS,
        ("COMBD_INBOUND_BUDGET", "4M"),
    ]);
    // 50 bodies of 100,000 bytes declared, 10 sent: 5 MB asked of a 4 MiB budget.
    let head = "POST /o/hold/a HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n";
    let mut trickling = Vec::new();
    for _ in 0..50 {
        let mut s = connect_from(ATTACKER, node.public());
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(&[b'x'; 10]).unwrap();
        trickling.push(s);
    }
    let s = wait_stats(&node, "every body held or refused", |s| {
        s["fair_inbound_bytes_held"].as_u64().unwrap_or(0) / 100_000
            + s["inbound_refused"].as_u64().unwrap_or(0)
            >= 50
    });
    let share = 4 * 1024 * 1024 / 10;
    assert!(figure(&s, "fair_inbound_bytes_client_max") <= share, "{s}");
    assert_eq!(figure(&s, "fair_inbound_bytes_held"), 4 * 100_000, "{s}");
    assert_eq!(figure(&s, "fair_inbound_bytes_refused_share"), 46, "{s}");
    // The last of them (its client's share long taken) was told so.
    let last = trickling.last().unwrap().try_clone().unwrap();
    let resp = read_response(&mut BufReader::new(last));
    assert_eq!(resp.status, 503);
    assert_eq!(resp.json()["error"], "overloaded");
    // Another address's body of the same size is read and answered.
    let body = "x".repeat(100_000);
    let raw = format!(
        "POST /o/hold/b HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let r = pipelined(&node, HONEST, raw.as_bytes(), 1);
    assert_eq!(r[0].status, 200, "{}", r[0].text());
    drop(trickling);
}

/// WebSockets of one address that never read, on a busy topic, filled the shard's outbound
/// budget, and the node closed whichever session's frame came next past it — an honest viewer's
/// too. Now the address's sessions hold its share of the budget (past it they resync), and the
/// honest viewer beside them gets every message.
#[test]
fn non_reading_websockets_of_one_address_hold_its_share_of_the_outbound_budget() {
    let node = TestNode::start(&[
        ("COMBD_SHARDS", "1"),
        TEST_APPS,
        ("COMBD_OUTBOUND_BUDGET", "4M"),
        ("COMBD_SQLITE_SYNC", "normal"),
    ]);
    let host = format!("127.0.0.2:{}", node.port);
    // 20 viewers of `limits/busy` that read nothing (a 4 KiB receive buffer).
    let _never: Vec<TcpStream> = (0..20)
        .map(|_| {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            sock.set_recv_buffer_size(4096).unwrap();
            sock.bind(&std::net::SocketAddr::from((ATTACKER, 0)).into())
                .unwrap();
            sock.connect(&node.public().into()).unwrap();
            let mut s: TcpStream = sock.into();
            s.set_read_timeout(Some(WAIT)).unwrap();
            upgrade_raw(&mut s, "/o/limits/busy", &host);
            s
        })
        .collect();
    let url = format!("ws://{host}/o/limits/busy");
    let (mut honest, _) = tungstenite::client(url.as_str(), connect_from(HONEST, node.public()))
        .expect("the honest viewer's handshake");
    wait_stats(&node, "every viewer attached", |s| s["sessions"] == 21);
    // Ten broadcasts of four 100 kB messages: 4 MB to each viewer, 84 MB in all.
    const ROUNDS: usize = 10;
    const EACH: usize = 4;
    let send = "POST /o/limits/busy?do=sends&n=4&size=100000 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    let mut got = 0;
    for _ in 0..ROUNDS {
        assert_eq!(request(node.local(), send.as_bytes()).status, 200);
        while got < ROUNDS * EACH {
            match honest.read().expect("the honest viewer was closed") {
                tungstenite::Message::Text(t) => {
                    assert_eq!(t.len(), 100_000);
                    got += 1;
                }
                tungstenite::Message::Close(c) => panic!("the honest viewer was closed: {c:?}"),
                _ => continue,
            }
            if got % EACH == 0 {
                break;
            }
        }
    }
    assert_eq!(
        got,
        ROUNDS * EACH,
        "every message reached the honest viewer"
    );
    let s = node.stats();
    assert_eq!(figure(&s, "outbound_budget_closed"), 0, "{s}");
    assert!(figure(&s, "session_share_resyncs") >= 1, "{s}");
    assert!(
        figure(&s, "outbound_bytes_max") <= 4 * 1024 * 1024 / 10 + 2 * 100_000 + 200_000,
        "the attacker's sessions held about their share and the honest viewer's frames: {s}"
    );
}

/// A client sending a new forged token with every request made the shard check a signature
/// for each (a verified token is cached, a new one is not). Now its full checks are held to
/// `auth_verify_rate_per_client` a second: past it an identified app answers 503 unchecked,
/// and another address's valid token is checked and served.
#[test]
fn new_tokens_from_one_address_are_checked_at_its_rate() {
    const SECRET: &str = "a-secret-of-more-than-thirty-two-bytes-for-hs256";
    let file = support::auth::key_file("fair", SECRET);
    let node = TestNode::start(&[
        ("COMBD_SHARDS", "1"),
        TEST_APPS,
        ("COMBD_AUTH_JWT_KEY_FILE", file.to_str().unwrap()),
    ]);
    let rate = combd_kernel::limits::AUTH_VERIFY_RATE_PER_CLIENT as usize;
    // Twice the burst of forged tokens (signed with another secret), on one connection.
    let forged = "another-secret-of-more-than-thirty-two-bytes-long!";
    let raw: String = (0..2 * rate)
        .map(|i| {
            let t = support::auth::token(forged, &format!("mallory{i}"), None);
            format!("GET /o/whoami/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t}\r\n\r\n")
        })
        .collect();
    let answers = pipelined(&node, ATTACKER, raw.as_bytes(), 2 * rate);
    let unauthorized = answers.iter().filter(|r| r.status == 401).count();
    let busy = answers.iter().filter(|r| r.status == 503).count();
    assert_eq!(unauthorized + busy, 2 * rate);
    // Checked a burst, and what refilled while they came (64 a second): not all of them.
    assert!(unauthorized >= rate, "{unauthorized} checked");
    assert!(
        busy > 0
            && answers
                .iter()
                .all(|r| r.status != 503 || r.header("retry-after") == Some("1"))
    );
    let s = node.stats();
    assert_eq!(figure(&s, "auth_verify_busy"), busy as u64, "{s}");
    // Another address's valid token is checked and served.
    let good = support::auth::token(SECRET, "alice", None);
    let raw =
        format!("GET /o/whoami/x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {good}\r\n\r\n");
    let r = pipelined(&node, HONEST, raw.as_bytes(), 1);
    assert_eq!(r[0].status, 200, "{}", r[0].text());
}

/// A verified identity is one client whatever address it comes from, and two users behind one
/// address are two: POSTs to new `whoami` objects (each live `object_idle_ms` after it) with a
/// tenth of 20 live objects a client.
#[test]
fn a_verified_identity_is_one_client_from_every_address() {
    const SECRET: &str = "a-secret-of-more-than-thirty-two-bytes-for-hs256";
    let file = support::auth::key_file("fair-identity", SECRET);
    let node = TestNode::start(&[
        TEST_APPS,
        ("COMBD_MAX_OPEN_OBJECTS", "20"),
        ("COMBD_AUTH_JWT_KEY_FILE", file.to_str().unwrap()),
    ]);
    let post = |from: [u8; 4], who: &str, object: &str| {
        let t = support::auth::token(SECRET, who, None);
        let raw = format!(
            "POST /o/whoami/{object} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t}\r\n\
             Content-Length: 0\r\n\r\n"
        );
        pipelined(&node, from, raw.as_bytes(), 1).remove(0).status
    };
    // Alice holds her two from one address; from another she is the same client.
    assert_eq!(post(ATTACKER, "alice", "a1"), 200);
    assert_eq!(post(ATTACKER, "alice", "a2"), 200);
    assert_eq!(post(HONEST, "alice", "a3"), 503);
    // Bob, behind Alice's address, is a client of his own.
    assert_eq!(post(ATTACKER, "bob", "b1"), 200);
    assert_eq!(post(ATTACKER, "bob", "b2"), 200);
    let s = node.stats();
    assert_eq!(figure(&s, "fair_objects_client_max"), 2, "{s}");
    assert_eq!(figure(&s, "fair_objects_refused_share"), 1, "{s}");
}

/// A spray of absent names from one address queued a hundred restores (each a scratch
/// database opened on a blocking thread), and another address's first read of an object
/// waited behind every one of them: the restore line was first in, first out. Now each client
/// has a line of its own there and the clients take turns, so the other address waits for one
/// restore of the spray's, not for the spray.
#[test]
fn a_spray_of_names_waits_behind_itself_for_restores() {
    let node = TestNode::start(&[
        ("COMBD_SHARDS", "1"),
        ("COMBD_RESTORES_AT_ONCE", "1"),
        // The spray may hold every live object: this is about the restore line only.
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "100"),
    ]);
    const CONNS: usize = 16;
    const EACH: usize = 64;
    let sprays: Vec<TcpStream> = (0..CONNS)
        .map(|c| {
            let raw: String = (0..EACH)
                .map(|i| format!("GET /o/counter/spray{c}-{i} HTTP/1.1\r\nHost: x\r\n\r\n"))
                .collect();
            let mut s = connect_from(ATTACKER, node.public());
            s.write_all(raw.as_bytes()).unwrap();
            s
        })
        .collect();
    // Eight requests of each connection at their objects at once: up to 128 restores waiting.
    let before = wait_stats(&node, "the spray's restores to queue", |s| {
        figure(s, "restores_waiting") >= 64
    });
    let r = request_from(
        HONEST,
        node.public(),
        b"GET /o/counter/honest HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    let after = node.stats();
    assert_eq!(r.status, 200, "{}", r.text());
    let waiting = figure(&before, "restores_waiting");
    let restored = figure(&after, "restores") - figure(&before, "restores");
    assert!(
        restored < waiting / 4,
        "the honest read waited for {restored} restores, {waiting} of the spray's waiting when it came"
    );
    // And the spray is served, all of it.
    for s in sprays {
        let mut r = BufReader::new(s);
        for _ in 0..EACH {
            let resp = read_response(&mut r);
            assert_eq!(resp.status, 200, "{}", resp.text());
        }
    }
}

/// Requests of one address that each hold a blocking thread for seconds (the `hold` app's
/// sleep: a slow batch, as a slow disk's sync or a heavy scratch restore would be) took all four
/// of the shard's blocking threads, and another address's read of a counter waited until one of
/// them ended: glommio's pool took jobs first in, first out. Now one client holds at most all
/// but one of them (`blocking_threads_per_client`), one computing while another client is
/// active (`blocking_compute_shared_per_client`), and a freed thread goes to the waiting client
/// that holds the fewest.
#[test]
fn one_client_holds_all_but_one_of_the_blocking_threads() {
    let node = TestNode::start(&[("COMBD_SHARDS", "1"), TEST_APPS]);
    const HOLDS: usize = 6;
    // The objects made first, so what holds the threads below is the holds' batches alone.
    let made: String = (0..HOLDS)
        .map(|i| format!("POST /o/hold/h{i} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"))
        .collect();
    for r in pipelined(&node, ATTACKER, made.as_bytes(), HOLDS) {
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let holds: Vec<TcpStream> = (0..HOLDS)
        .map(|i| {
            let mut s = connect_from(ATTACKER, node.public());
            write!(
                s,
                "POST /o/hold/h{i}?ms=3000 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
            )
            .unwrap();
            s
        })
        .collect();
    wait_stats(&node, "the holds to take the threads and queue", |s| {
        figure(s, "blocking_busy") >= 3 && figure(s, "blocking_waiting") >= 1
    });
    let r = request_from(
        HONEST,
        node.public(),
        b"GET /o/counter/honest HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Answered while every hold still holds: it did not wait for one of them to end.
    for s in &holds {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let e = s
            .peek(&mut b)
            .expect_err("a hold answered before the honest read");
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        s.set_nonblocking(false).unwrap();
    }
    let s = node.stats();
    assert_eq!(figure(&s, "blocking_busy_max"), 4, "{s}");
    assert!(figure(&s, "blocking_waited_share") >= 1, "{s}");
    // Two clients active: each computes on one thread at a time now.
    assert_eq!(figure(&s, "blocking_client_share"), 1, "{s}");
    // And every hold is served, in turn.
    for s in holds {
        let resp = read_response(&mut BufReader::new(s));
        assert_eq!(resp.status, 200, "{}", resp.text());
    }
}
