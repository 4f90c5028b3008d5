//! Alarms and messages between objects in a fleet (issue 29): a dead owner's alarms fire on the
//! node that takes the object up, found through the fleet's wake index (etcd) with no request
//! for the object; a message to an object another node owns is passed on to that node and
//! taken there once; a sender whose owner died with a message in its outbox is taken up by
//! another node, which sends it, and the sum over the accounts is conserved. And the path a
//! node passes messages on is the fleet's only: a client cannot post to it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use combd_fleet::auth::{parse_fleet_key, AUTH_HEADER};

use super::support::{self, request, Resp, TestNode, TEST_APPS};
use super::{fleet_support, retried, stat, Fleet, FLEET_KEY, LEASE_TTL};

/// Waits for `done()` within `within`, polling what the nodes' figures show: the wake comes
/// from the nodes' own ticks, with nothing to wait on but what they report.
fn until(what: &str, within: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn remind(node: &TestNode, name: &str, in_ms: u64, text: &str) -> Resp {
    let body = format!(r#"{{"in_ms":{in_ms},"text":"{text}"}}"#);
    retried(|| support::post(node, &format!("/o/reminder/{name}"), &body))
}

#[test]
fn a_dead_owners_alarms_fire_on_another_node_with_no_request_for_them() {
    let Some(fleet) = Fleet::start("a_dead_owners_alarms_fire_on_another_node") else {
        return;
    };
    let a = fleet.node();
    let b = fleet.node();
    const OBJECTS: usize = 8;
    // Due after A is gone and its lease has lapsed (2 s): only another node can fire them.
    for i in 0..OBJECTS {
        let r = remind(&a, &format!("r{i}"), 3000, &format!("t{i}"));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(stat(&a, "alarms_pending"), OBJECTS as u64);
    drop(a.kill9());
    until(
        "B to fire the dead owner's alarms",
        Duration::from_secs(30),
        || stat(&b, "alarms_fired") >= OBJECTS as u64,
    );
    assert!(stat(&b, "fleet_wakes_taken") >= OBJECTS as u64);
    assert!(stat(&b, "fleet_restores") >= OBJECTS as u64);
    for i in 0..OBJECTS {
        let r = support::get(&b, &format!("/o/reminder/r{i}"));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["pending"], serde_json::json!([]), "r{i}: {v}");
        let fired = v["fired"].as_array().unwrap();
        assert_eq!(fired.len(), 1, "r{i}: {v}");
        assert_eq!(fired[0]["text"], format!("t{i}"));
        assert_eq!(fired[0]["fires"], 1, "r{i} fired once: {v}");
    }
    // Fired, the objects have nothing due: the fleet's index no longer lists them.
    until(
        "the wake index to be empty",
        Duration::from_secs(10),
        || b.stats()["alarm_objects"] == 0,
    );
    let wakes = fleet.etcd_call(
        "/v3/kv/range",
        serde_json::json!({
            "key": super::b64(b"combd/wake/"), "range_end": super::b64(b"combd/wake0"),
            "count_only": true,
        }),
    );
    assert!(
        wakes["count"].is_null() || wakes["count"] == "0",
        "wake keys left: {wakes}"
    );
}

fn balance(node: &TestNode, account: &str) -> i64 {
    let r = super::until_200(&format!("{account}'s balance"), || {
        support::get(node, &format!("/o/bank/{account}"))
    });
    r.json()["balance"].as_i64().unwrap()
}

fn transfer(node: &TestNode, from: &str, to: &str, amount: i64) {
    let r = retried(|| support::post(node, &format!("/o/bank/{from}?to={to}&amount={amount}"), ""));
    assert_eq!(r.status, 200, "{from} -> {to}: {}", r.text());
}

#[test]
fn messages_reach_an_object_another_node_owns_once_and_outlive_their_senders_owner() {
    let Some(fleet) = Fleet::start("messages_reach_an_object_another_node_owns") else {
        return;
    };
    let (a, _) = {
        let address = format!("127.0.0.1:{}", fleet_support::free_port());
        let node = fleet.node_at(&address, LEASE_TTL, &fleet.s3.bucket.endpoint, &[TEST_APPS]);
        (node, address)
    };
    let b_at = format!("127.0.0.1:{}", fleet_support::free_port());
    let b = fleet.node_at(&b_at, LEASE_TTL, &fleet.s3.bucket.endpoint, &[TEST_APPS]);
    // B owns bob (and carol, whom bob pays); A owns alice.
    transfer(&b, "bob", "carol", 1);
    transfer(&a, "alice", "bob", 100);
    until(
        "alice's message to reach bob on B",
        Duration::from_secs(20),
        || balance(&b, "bob") == 1099,
    );
    assert!(stat(&a, "fleet_messages_passed") >= 1);
    assert_eq!(balance(&a, "alice"), 900);
    assert_eq!(balance(&b, "carol"), 1001);

    // A message waits in alice's outbox on A (dave's recorded owner never answers) when A
    // dies: the node that takes alice up sends it once dave can be reached.
    fleet.claim_for(
        "bank/dave",
        &format!("127.0.0.1:{}", fleet_support::free_port()),
        6,
    );
    for _ in 0..5 {
        transfer(&a, "alice", "dave", 10);
    }
    assert_eq!(stat(&a, "alarm_objects"), 1, "alice's messages wait");
    drop(a.kill9());
    until(
        "dave to be paid by alice's next owner",
        Duration::from_secs(40),
        || balance(&b, "dave") == 1050,
    );
    assert!(stat(&b, "fleet_wakes_taken") >= 1);
    until("nothing on its way", Duration::from_secs(20), || {
        b.stats()["alarm_objects"] == 0
    });
    let sum: i64 = ["alice", "bob", "carol", "dave"]
        .iter()
        .map(|x| balance(&b, x))
        .sum();
    assert_eq!(sum, 4000, "the sum is conserved");
    assert_eq!(balance(&b, "alice"), 850);

    // The fleet's path for messages: not a client's, on either listener; signed by the fleet
    // key, taken once by its id (past every id alice's outbox gave: they count from the time in
    // nanoseconds, README "Deleting an object").
    let target = "/_fleet/message/bank/bob?from=bank/alice&id=9223372036854775000";
    let body = br#"{"credit":5}"#;
    let raw = |auth: &str| {
        format!(
            "POST {target} HTTP/1.1\r\nHost: x\r\ncombd-forwarded: 1\r\n{auth}\
             Content-Length: {}\r\n\r\n{}",
            body.len(),
            std::str::from_utf8(body).unwrap()
        )
    };
    let plain = format!(
        "POST {target} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{}",
        body.len(),
        std::str::from_utf8(body).unwrap()
    );
    assert_eq!(request(b.public(), plain.as_bytes()).status, 404);
    let b_fleet: SocketAddr = b_at.parse().unwrap();
    assert_eq!(request(b_fleet, raw("").as_bytes()).status, 401);
    let key = parse_fleet_key(FLEET_KEY).unwrap();
    for taken in [true, false] {
        let signed = key.sign(&b_at, "POST", target, body);
        let r = request(
            b_fleet,
            raw(&format!("{AUTH_HEADER}: {signed}\r\n")).as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["taken"], taken, "{}", r.text());
    }
    assert_eq!(balance(&b, "bob"), 1104, "the credit applied once");
}
