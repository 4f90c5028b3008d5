//! An owner that stops answering (paused: its sockets still accept, nothing answers, as a node
//! cut off or frozen): the node in front waits for it once, answers at once after that while
//! its lease holds, serves the object itself once the lease lapsed, and the owner, woken, does
//! not acknowledge a write with the lease it lost.

use std::time::{Duration, Instant};

use super::{get, post, stat, value, Fleet, MOVE_WITHIN};

/// Longer than the forward timeout (2 s), so the owner's lease still holds when the first
/// request's wait ends, and the answers given at once can be seen.
const PAUSED_TTL: &str = "5s";

/// `ask()` until it answers 200 (503s are what a client retries), within `MOVE_WITHIN`.
fn until_200(what: &str, ask: impl Fn() -> super::support::Resp) -> super::support::Resp {
    let t0 = Instant::now();
    loop {
        let r = ask();
        if r.status == 200 {
            return r;
        }
        assert_eq!(r.status, 503, "{what}: {}", r.text());
        assert!(
            t0.elapsed() < MOVE_WITHIN,
            "{what}: not within {MOVE_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

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

    a.signal(libc::SIGSTOP);
    let paused = Instant::now();
    // The first request waits for A (its connection kept from the last one, or a new one the
    // paused node's kernel still accepts) until the forward timeout, then 503.
    let first = get(&b, "p");
    assert_eq!(first.status, 503, "{}", first.text());
    assert_eq!(first.json()["error"], "object owner unreachable");
    assert_eq!(first.header("retry-after"), Some("1"));
    assert_eq!(stat(&b, "fleet_forward_failed"), 1);
    assert!(
        paused.elapsed() < Duration::from_secs(4),
        "A's lease (5 s) must still hold for what follows"
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
    a.signal(libc::SIGCONT);
    let woke = until_200("A to pass the object's requests on", || post(&a, "p"));
    assert_eq!(value(&woke), 5, "A's write went to B, the owner");
    assert_eq!(value(&get(&b, "p")), 5);
}
