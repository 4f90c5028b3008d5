//! An owner that stops answering (paused: its sockets still accept, nothing answers, as a node
//! frozen): the node in front waits for it once, answers at once after that while its lease
//! holds, serves the object itself once the lease lapsed, and the owner, woken, does not
//! acknowledge a write with the lease it lost. An owner that cannot be connected to (its
//! packets dropped, as a node cut off) is given up after the connect timeout.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::websocket::open_ws;
use super::{get, limit_ms, post, stat, until_200, value, Fleet};

/// Longer than the forward timeout (2 s), so the owner's lease still holds when the first
/// request's wait ends, and the answers given at once can be seen.
const PAUSED_TTL: &str = "5s";

#[test]
fn an_owner_that_stops_answering_is_waited_for_once_and_its_objects_move_when_its_lease_lapses() {
    let Some(fleet) = Fleet::start("an_owner_that_stops_answering") else {
        return;
    };
    let a = fleet.node_with_ttl(PAUSED_TTL);
    let b = fleet.node_with_ttl(PAUSED_TTL);
    for i in 1..=3 {
        assert_eq!(super::post_acked(&a, "p"), i);
    }
    assert_eq!(value(&get(&b, "p")), 3, "B passes it on to A");
    assert!(stat(&b, "fleet_forwarded") >= 1);

    let forward_timeout = limit_ms(&b, "fleet_forward_timeout_ms");
    a.signal(Signal::SIGSTOP);
    let paused = Instant::now();
    // The first request waits for A (its connection kept from the last one, or a new one the
    // paused node's kernel still accepts) until the forward timeout, then 503.
    let first = get(&b, "p");
    assert!(
        paused.elapsed() >= forward_timeout,
        "given up after {:?}, before the forward timeout",
        paused.elapsed()
    );
    assert_eq!(first.status, 503, "{}", first.text());
    assert_eq!(first.json()["error"], "object owner unreachable");
    assert_eq!(first.header("retry-after"), Some("1"));
    assert_eq!(stat(&b, "fleet_forward_failed"), 1);
    // A's lease holds at least TTL - TTL/3 after the pause (its last renewal came at most
    // TTL/3 before it): what follows needs it to.
    assert!(
        paused.elapsed() < Duration::from_secs(5) - Duration::from_secs(5) / 3,
        "A's lease (5 s) may have lapsed already"
    );
    // Asked again at once: answered 503 without trying A (fleet_owner_retry_interval_ms).
    let skipped = get(&b, "p");
    assert_eq!(skipped.status, 503, "{}", skipped.text());
    assert_eq!(skipped.json()["error"], "object owner unreachable");
    assert!(stat(&b, "fleet_owner_skipped") >= 1);
    assert_eq!(stat(&b, "fleet_forward_failed"), 1, "A was not tried again");

    // Once A's lease lapsed, B claims the object and serves every write A acknowledged.
    let moved = until_200("B to serve the paused owner's object", || get(&b, "p"));
    assert_eq!(value(&moved), 3);
    assert_eq!(super::post_acked(&b, "p"), 4);

    // A wakes: its lease is gone, so what it is asked goes to B (or is refused while it takes
    // a new lease); it never acknowledges a write of its own on the old lease (that would
    // answer 4, from its own copy).
    a.signal(Signal::SIGCONT);
    let woke = until_200("A to pass the object's requests on", || post(&a, "p"));
    assert_eq!(value(&woke), 5, "A's write went to B, the owner");
    assert_eq!(value(&get(&b, "p")), 5);
}

/// A listener on 127.0.0.1 whose accept queue is full and never taken from: the kernel drops
/// every further SYN (as for a node cut off), so a connect to it neither succeeds nor is
/// refused until the client gives up. Its address, and what keeps it so.
fn black_hole() -> (String, socket2::Socket, Vec<std::net::TcpStream>) {
    use socket2::{Domain, Socket, Type};
    let listener = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    let any: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    listener.bind(&any.into()).unwrap();
    listener.listen(0).unwrap();
    let addr = listener.local_addr().unwrap().as_socket().unwrap();
    // Connections until one is not taken: the queue is full from then on.
    let mut queued = Vec::new();
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
            Ok(s) => queued.push(s),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => break,
            Err(e) => panic!("filling the accept queue: {e}"),
        }
        assert!(queued.len() < 16, "the accept queue does not fill");
    }
    (addr.to_string(), listener, queued)
}

#[test]
fn an_owner_that_cannot_be_connected_to_is_given_up_after_the_connect_timeout() {
    let Some(fleet) = Fleet::start("an_owner_that_cannot_be_connected_to") else {
        return;
    };
    let b = fleet.node();
    let connect_timeout = limit_ms(&b, "fleet_connect_timeout_ms");
    let forward_timeout = limit_ms(&b, "fleet_forward_timeout_ms");
    // counter/h is owned, says etcd, by a node whose packets are dropped.
    let (owner, _listener, _queued) = black_hole();
    fleet.claim_for("counter/h", &owner, 60);

    let t0 = Instant::now();
    let r = get(&b, "h");
    let waited = t0.elapsed();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"], "object owner unreachable");
    assert_eq!(stat(&b, "fleet_forward_failed"), 1);
    // Given up by the connect timeout, not the longer forward timeout: bounds on a wait, not a
    // speed (it cannot end before the timeout, and the forward timeout would end it later).
    assert!(waited >= connect_timeout, "gave up after {waited:?}");
    assert!(
        waited < forward_timeout,
        "waited {waited:?}: the forward timeout, not the connect's"
    );

    // Asked again at once, for the object and for a WebSocket of it: answered without trying.
    let r = get(&b, "h");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (503, Some("object owner unreachable"))
    );
    let Err(e) = open_ws(&b, "h") else {
        panic!("the upgrade is refused");
    };
    assert!(e.starts_with("503 "), "{e}");
    assert!(e.contains("object owner unreachable"), "{e}");
    assert_eq!(stat(&b, "fleet_forward_failed"), 1);
    assert_eq!(stat(&b, "fleet_ws_pass_failed"), 0);
    assert!(stat(&b, "fleet_owner_skipped") >= 2);

    // Once the retry interval is over, one request tries the owner again: that try (it only
    // asks whether the owner is back) gives up after the shorter probe connect timeout, so a
    // lease that lapses meanwhile is not waited past by long.
    let probe_timeout = limit_ms(&b, "fleet_probe_connect_timeout_ms");
    assert!(probe_timeout < connect_timeout);
    std::thread::sleep(limit_ms(&b, "fleet_owner_retry_interval_ms") + Duration::from_millis(50));
    let t0 = Instant::now();
    let r = get(&b, "h");
    let waited = t0.elapsed();
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (503, Some("object owner unreachable"))
    );
    assert_eq!(stat(&b, "fleet_forward_failed"), 2, "the probe tried it");
    assert!(waited >= probe_timeout, "gave up after {waited:?}");
    assert!(
        waited < connect_timeout,
        "waited {waited:?}: the connect timeout, not the probe's"
    );
}

#[test]
fn a_websocket_whose_owner_never_answers_the_upgrade_is_answered_after_the_forward_timeout() {
    let Some(fleet) = Fleet::start("a_websocket_whose_owner_never_answers") else {
        return;
    };
    let b = fleet.node();
    let forward_timeout = limit_ms(&b, "fleet_forward_timeout_ms");
    // counter/s is owned, says etcd, by a node that accepts connections and never answers
    // (frozen: its kernel still completes the handshake).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    fleet.claim_for("counter/s", &silent.local_addr().unwrap().to_string(), 60);

    let t0 = Instant::now();
    let Err(e) = open_ws(&b, "s") else {
        panic!("the upgrade is refused");
    };
    let waited = t0.elapsed();
    assert!(e.starts_with("503 "), "{e}");
    assert!(e.contains("object owner unreachable"), "{e}");
    // The node's deadlines run on its shard clock, read once a tick.
    let tick = combd_kernel::limits::SHARD_TICK;
    assert!(
        waited + tick >= forward_timeout,
        "answered after {waited:?}"
    );
    assert_eq!(stat(&b, "fleet_ws_pass_failed"), 1);
    // A connection the owner's kernel accepted is not an answer: the owner stays marked, and
    // the object's next request is answered at once.
    let r = get(&b, "s");
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (503, Some("object owner unreachable"))
    );
    assert_eq!(stat(&b, "fleet_forward_failed"), 0);
    assert!(stat(&b, "fleet_owner_skipped") >= 1);
}
