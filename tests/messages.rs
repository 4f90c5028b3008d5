//! Messages between objects (issue 29, item 3) against the real node, with the `bank` test app:
//! a transfer takes value from one account and, in the same transaction, sends it to another
//! (`Cx::send_to_object`); the receiver takes each message exactly once. The sum over the
//! accounts is conserved through transfers across shards and through a hundred `kill -9`s in
//! the middle of transfers.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, Write};
use std::time::{Duration, Instant};

use support::*;

const ACCOUNTS: [&str; 4] = ["alice", "bob", "carol", "dave"];

fn balance(node: &TestNode, account: &str) -> i64 {
    let r = get(node, &format!("/o/bank/{account}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["balance"].as_i64().unwrap()
}

/// Waits until nothing is on its way (no object has an undelivered message), then the sum.
fn settled_sum(node: &TestNode) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = node.stats();
        if s["alarm_objects"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "messages still on their way: {s}"
        );
        // Deliveries go out as their senders' commits are durable: nothing to wait on but the
        // node's figures.
        std::thread::sleep(Duration::from_millis(20));
    }
    ACCOUNTS.iter().map(|a| balance(node, a)).sum()
}

#[test]
fn a_transfer_moves_value_once_and_a_refused_one_moves_nothing() {
    let node = TestNode::start(&[TEST_APPS]);
    // The four accounts live on both shards: some transfers cross them.
    let homes: std::collections::HashSet<usize> = ACCOUNTS
        .iter()
        .map(|a| combd_shards::app::home_shard("bank", a, 2))
        .collect();
    assert_eq!(homes.len(), 2, "the accounts are on one shard: pick others");
    for (from, to) in [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)] {
        let r = post(
            &node,
            &format!("/o/bank/{}?to={}&amount=100", ACCOUNTS[from], ACCOUNTS[to]),
            "",
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(settled_sum(&node), 4000);
    assert_eq!(balance(&node, "alice"), 900);
    assert_eq!(balance(&node, "bob"), 1000);
    assert_eq!(balance(&node, "carol"), 1100);
    assert_eq!(balance(&node, "dave"), 1000);
    // Not enough, or a bad receiver name: refused, nothing moved or sent.
    assert_eq!(
        post(&node, "/o/bank/alice?to=bob&amount=5000", "").status,
        409
    );
    assert_eq!(post(&node, "/o/bank/alice?to=.x&amount=5", "").status, 400);
    let s = node.stats();
    assert_eq!(s["object_messages_taken"], 5);
    assert_eq!(settled_sum(&node), 4000);
    assert_eq!(balance(&node, "alice"), 900);
}

/// A small xorshift, for kill points and transfers that differ run to run.
struct Rng(u64);

impl Rng {
    fn new(salt: u64) -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Rng((t ^ salt) | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Transfers at random between the accounts on one keep-alive connection, until the node is
/// gone: how many were answered 200.
fn transfer_until_gone(addr: std::net::SocketAddr, seed: u64) -> u64 {
    let mut rng = Rng::new(seed);
    let Ok(mut conn) = std::net::TcpStream::connect(addr) else {
        return 0;
    };
    let _ = conn.set_nodelay(true);
    let _ = conn.set_read_timeout(Some(WAIT));
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut ok = 0;
    loop {
        let from = rng.below(4) as usize;
        let to = (from + 1 + rng.below(3) as usize) % 4;
        let amount = 1 + rng.below(50);
        let req = format!(
            "POST /o/bank/{}?to={}&amount={amount} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            ACCOUNTS[from], ACCOUNTS[to]
        );
        if conn.write_all(req.as_bytes()).is_err() {
            return ok;
        }
        match status_of(&mut reader) {
            Some(200) => ok += 1,
            Some(_) => {}
            None => return ok,
        }
    }
}

/// The status of the next response on `r` (its body read past), or `None` once the
/// connection is gone.
fn status_of(r: &mut impl std::io::BufRead) -> Option<u16> {
    let mut line = String::new();
    r.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let status = line.split(' ').nth(1)?.parse().ok()?;
    let mut length = 0;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok().filter(|n| *n > 0)?;
        if h == "\r\n" {
            break;
        }
        if let Some((n, v)) = h.split_once(':') {
            if n.eq_ignore_ascii_case("content-length") {
                length = v.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).ok()?;
    Some(status)
}

#[test]
fn the_sum_is_conserved_across_a_hundred_kills_in_the_middle_of_transfers() {
    let node = TestNode::start(&[TEST_APPS]);
    let mut dir = node.kill9();
    let mut rng = Rng::new(7);
    let mut answered = 0;
    for round in 0..100 {
        let node = TestNode::start_in(dir, &[TEST_APPS]);
        let addr = node.public();
        let client = std::thread::spawn(move || transfer_until_gone(addr, round));
        // Killed at a random point: transfers committed, messages on their way, taken.
        std::thread::sleep(Duration::from_millis(rng.below(150)));
        dir = node.kill9();
        answered += client.join().unwrap();
    }
    let node = TestNode::start_in(dir, &[TEST_APPS]);
    assert_eq!(settled_sum(&node), 4000, "value made or lost");
    assert!(answered > 0, "no transfer was answered in a hundred rounds");
    eprintln!("{answered} transfers answered across 100 kills");
}
