//! Slow requests are read less often: a head or a body that trickles in is read at most once a
//! `slow_read_interval_ms` once it is slow (`slow_request_after_ms`), loses nothing, and still
//! ends at its timeout; requests that arrive whole are never paused.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::*;

fn stat(node: &TestNode, name: &str) -> u64 {
    node.stats()[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no {name} in /stats"))
}

fn limit_ms(node: &TestNode, name: &str) -> u64 {
    node.stats()["limits"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no limits.{name} in /stats"))
}

/// Writes `bytes` one at a time, `gap` apart: a client on a link (or with intent) that sends a
/// byte per segment.
fn trickle(s: &mut TcpStream, bytes: &[u8], gap: Duration) {
    for b in bytes {
        s.write_all(std::slice::from_ref(b)).unwrap();
        std::thread::sleep(gap);
    }
}

/// The most pauses a connection can have taken in `elapsed`: one per interval (each pause is at
/// least one), and one more begun at its end.
fn pauses_bound(elapsed: Duration, interval_ms: u64) -> u64 {
    elapsed.as_millis() as u64 / interval_ms + 1
}

#[test]
fn a_head_sent_a_byte_at_a_time_is_paused_not_read_per_byte_and_is_answered() {
    let node = TestNode::start(&[]);
    let interval = limit_ms(&node, "slow_read_interval_ms");
    // Honest requests, each head in one write, are never paused.
    for _ in 0..20 {
        let r = get(&node, "/healthz");
        assert_eq!(r.status, 200);
    }
    assert_eq!(stat(&node, "slow_reads_paced"), 0);

    let mut s = connect_from(client_address(1), node.public());
    let start = Instant::now();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    // 250 bytes, one every 10 ms (2.5 s): without pacing, 250 reads.
    trickle(&mut s, &[b'a'; 250], Duration::from_millis(10));
    s.write_all(b"\r\n\r\n").unwrap();
    let r = read_response(&mut BufReader::new(s.try_clone().unwrap()));
    let elapsed = start.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    let paced = stat(&node, "slow_reads_paced");
    assert!(
        (1..=pauses_bound(elapsed, interval)).contains(&paced),
        "{paced} pauses in {elapsed:?}"
    );
}

#[test]
fn a_body_sent_a_byte_at_a_time_is_paused_and_arrives_whole() {
    let node = TestNode::start(&[]);
    let interval = limit_ms(&node, "slow_read_interval_ms");
    // An upload in one write is never paused.
    let big = "u".repeat(100_000);
    let r = post(&node, "/o/echo/fast", &big);
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), big.len());
    assert_eq!(stat(&node, "slow_reads_paced"), 0);

    let body: Vec<u8> = (0..200u8).map(|i| b'a' + i % 26).collect();
    let mut s = connect_from(client_address(2), node.public());
    let start = Instant::now();
    write!(
        s,
        "POST /o/echo/slow HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    trickle(&mut s, &body, Duration::from_millis(10));
    let r = read_response(&mut BufReader::new(s.try_clone().unwrap()));
    let elapsed = start.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.body, body, "every byte of the body, in order");
    let paced = stat(&node, "slow_reads_paced");
    assert!(
        (1..=pauses_bound(elapsed, interval)).contains(&paced),
        "{paced} pauses in {elapsed:?}"
    );
}

/// A pause never outlasts the request's deadline: a head that never completes is answered 408
/// at its timeout, as without pacing.
#[test]
fn a_paused_head_still_times_out_at_the_header_timeout() {
    let node = TestNode::start(&[("COMBD_HEADER_TIMEOUT", "2s")]);
    let mut s = connect_from(client_address(3), node.public());
    s.write_all(b"GET /healthz HTTP/1.1\r\nX-Slow: ").unwrap();
    let start = Instant::now();
    // Keeps sending until the node answers; the bytes it sends past the 408 are discarded.
    let sender = {
        let mut s = s.try_clone().unwrap();
        std::thread::spawn(move || {
            while s.write_all(b"a").is_ok() && start.elapsed() < Duration::from_secs(8) {
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let r = read_response(&mut BufReader::new(s.try_clone().unwrap()));
    let elapsed = start.elapsed();
    assert_eq!(r.status, 408, "{}", r.text());
    // The timeout is 2 s; the sweep that fires it runs every 100 ms. A pause not clamped to
    // the deadline would answer at up to 2 s + 2 intervals.
    assert!(
        elapsed < Duration::from_millis(3_000),
        "408 after {elapsed:?}"
    );
    assert!(stat(&node, "slow_reads_paced") >= 1);
    let _ = s.shutdown(std::net::Shutdown::Both);
    sender.join().unwrap();
}
