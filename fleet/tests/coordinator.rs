//! The coordinator client against a real etcd (started by each test on loopback): one owner
//! per object, the lease's expiry, and the fenced head advance that a stale owner cannot make.

#![allow(clippy::unwrap_used)]

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use combd_fleet::coordinator::{
    Advance, Claim, Coordinator, DueChange, Head, Lease, LeaseKeeper, LEASE_GONE,
};
use combd_fleet::Failure;
use combd_kernel::limits::FLEET_LEASE_TTL_MIN;
use support::{wait_until, Etcd};

const NODE_A: &str = "127.0.0.2:8080";
const NODE_B: &str = "127.0.0.3:8080";

fn coordinator(etcd: &Etcd) -> Coordinator {
    Coordinator::new(std::slice::from_ref(&etcd.endpoint), "combd-test/")
}

fn won(c: Claim) -> i64 {
    match c {
        Claim::Won(o) => o.token,
        Claim::Held(o) => panic!("expected to win the claim, but {o:?} holds it"),
    }
}

#[test]
fn a_claimed_object_is_refused_to_another_node() {
    let Some(etcd) = Etcd::start("a_claimed_object_is_refused_to_another_node") else {
        return;
    };
    let c = coordinator(&etcd);
    let ttl = Duration::from_secs(30);
    let (a, b) = (c.grant_lease(ttl).unwrap(), c.grant_lease(ttl).unwrap());
    assert_ne!(a.id, b.id);
    assert_eq!(
        c.owner("room").unwrap(),
        None,
        "nobody owns it before the first claim"
    );

    let token = won(c.claim("room", NODE_A, &a).unwrap());
    match c.claim("room", NODE_B, &b).unwrap() {
        Claim::Held(o) => {
            assert_eq!(o.node, NODE_A);
            assert_eq!(o.token, token);
            assert_eq!(o.lease, a.id);
        }
        Claim::Won(o) => panic!("B won a claimed object: {o:?}"),
    }
    // The token is the owner key's create_revision, as the lookup reads it back.
    let owner = c.owner("room").unwrap().unwrap();
    assert_eq!((owner.node.as_str(), owner.token), (NODE_A, token));
    // A claiming again under the same lease keeps the object and its token.
    assert_eq!(won(c.claim("room", NODE_A, &a).unwrap()), token);
    // Another object is independent, and gets a later token.
    let other = won(c.claim("lobby", NODE_B, &b).unwrap());
    assert!(other > token, "tokens grow: {other} after {token}");
}

#[test]
fn a_lapsed_lease_lets_another_node_claim_and_fences_the_old_owner() {
    let Some(etcd) = Etcd::start("a_lapsed_lease_lets_another_node_claim_and_fences_the_old_owner")
    else {
        return;
    };
    let c = coordinator(&etcd);
    // A's lease is the shortest etcd grants, and nobody renews it.
    let a = c.grant_lease(FLEET_LEASE_TTL_MIN).unwrap();
    let granted = Instant::now();
    assert_eq!(a.ttl, FLEET_LEASE_TTL_MIN);
    let b = c.grant_lease(Duration::from_secs(30)).unwrap();
    let token_a = won(c.claim("room", NODE_A, &a).unwrap());
    let first = Head {
        seq: 1,
        token: token_a,
    };
    assert_eq!(
        c.advance_head("room", token_a, first).unwrap(),
        Advance::Done
    );
    assert!(matches!(
        c.claim("room", NODE_B, &b).unwrap(),
        Claim::Held(_)
    ));

    // etcd deletes the key when the lease lapses: poll it, bounded by the TTL and a second.
    wait_until("A's lease to lapse", a.ttl + Duration::from_secs(2), || {
        c.owner("room").unwrap().is_none()
    });
    assert!(
        granted.elapsed() >= a.ttl - Duration::from_millis(500),
        "the key vanished after {:?}, before the TTL of {:?}",
        granted.elapsed(),
        a.ttl
    );
    // Its head stays: it is the object's, not the owner's.
    assert_eq!(c.head("room").unwrap(), Some(first));

    let token_b = won(c.claim("room", NODE_B, &b).unwrap());
    assert!(token_b > token_a);
    // A, not knowing it lost the object, tries to ship its next batch: fenced.
    let stale = Head {
        seq: 2,
        token: token_a,
    };
    assert_eq!(
        c.advance_head("room", token_a, stale).unwrap(),
        Advance::Fenced
    );
    assert_eq!(
        c.head("room").unwrap(),
        Some(first),
        "a fenced advance changes nothing"
    );
    // B ships the same number: accepted.
    let next = Head {
        seq: 2,
        token: token_b,
    };
    assert_eq!(
        c.advance_head("room", token_b, next).unwrap(),
        Advance::Done
    );
    assert_eq!(c.head("room").unwrap(), Some(next));
    // A's renewal now fails: the lease is gone for good.
    let e = c.keep_alive(&a).unwrap_err();
    assert!(
        matches!(
            e.failure,
            Failure::Status {
                code: LEASE_GONE,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn a_revoked_lease_frees_its_objects_at_once_and_an_unowned_object_cannot_advance() {
    let Some(etcd) = Etcd::start("a_revoked_lease_frees_its_objects_at_once") else {
        return;
    };
    let c = coordinator(&etcd);
    let ttl = Duration::from_secs(30);
    let (a, b) = (c.grant_lease(ttl).unwrap(), c.grant_lease(ttl).unwrap());
    let token_a = won(c.claim("room", NODE_A, &a).unwrap());
    c.revoke(&a).unwrap();
    assert_eq!(c.owner("room").unwrap(), None);
    // Unowned: nobody's token advances it.
    let h = Head {
        seq: 1,
        token: token_a,
    };
    assert_eq!(c.advance_head("room", token_a, h).unwrap(), Advance::Fenced);
    assert_eq!(c.advance_head("room", 0, h).unwrap(), Advance::Fenced);
    assert_eq!(c.head("room").unwrap(), None);
    let token_b = won(c.claim("room", NODE_B, &b).unwrap());
    assert_eq!(c.advance_head("room", token_a, h).unwrap(), Advance::Fenced);
    let h = Head {
        seq: 1,
        token: token_b,
    };
    assert_eq!(c.advance_head("room", token_b, h).unwrap(), Advance::Done);
}

#[test]
fn the_keeper_holds_a_lease_past_its_ttl_and_gives_it_up_when_etcd_is_gone() {
    let Some(etcd) = Etcd::start("the_keeper_holds_a_lease_past_its_ttl") else {
        return;
    };
    let c = Arc::new(coordinator(&etcd));
    let sent = Instant::now();
    let lease: Lease = c.grant_lease(FLEET_LEASE_TTL_MIN).unwrap();
    let token = won(c.claim("room", NODE_A, &lease).unwrap());
    let keeper = LeaseKeeper::start(Arc::clone(&c), lease, sent).unwrap();
    // Three TTLs pass: without renewals the key would be gone after the first. On a loaded
    // machine a renewal may time out and the lease lapse; what must hold is that it lapses only
    // after renewals failed, and never while the keeper says the node may serve.
    let until = Instant::now() + lease.ttl * 3;
    let mut lapsed = false;
    wait_until("three lease TTLs to pass", lease.ttl * 4, || {
        let owner = c.owner("room").unwrap();
        let answered = Instant::now();
        if owner.is_none() {
            lapsed = true;
            assert!(
                keeper.lost() || keeper.valid_until() <= answered,
                "the lease lapsed while the keeper held it until {:?} from now",
                keeper.valid_until() - answered
            );
        } else {
            assert_eq!(owner.map(|o| o.token), Some(token));
        }
        Instant::now() >= until
    });
    if lapsed {
        assert!(
            keeper.renewals_failed() >= 1,
            "the lease lapsed with no renewal failed"
        );
        eprintln!(
            "note: the lease lapsed after {} failed renewal(s) (a loaded machine)",
            keeper.renewals_failed()
        );
        return;
    }
    assert!(keeper.holds_at(Instant::now()));
    assert!(keeper.valid_until() > Instant::now());

    // etcd goes away: the keeper's renewals fail, and the node must stop serving no later
    // than the lease could lapse (counted from the last renewal sent, before etcd got it).
    drop(etcd);
    let deadline = keeper.valid_until();
    assert!(deadline <= Instant::now() + lease.ttl);
    wait_until(
        "the keeper to give the lease up",
        lease.ttl + Duration::from_secs(2),
        || !keeper.holds_at(Instant::now()),
    );
    assert!(Instant::now() >= deadline || keeper.lost());
    wait_until(
        "the keeper to mark the lease lost",
        lease.ttl + Duration::from_secs(2),
        || keeper.lost(),
    );
    assert!(keeper.renewals_failed() >= 1);
}

#[test]
fn an_unreachable_coordinator_fails_fast_naming_the_call() {
    // Nothing listens on this port: every call fails as unreachable within the timeout, after
    // trying each endpoint.
    let port = support::free_port();
    let c = Coordinator::new(
        &[
            format!("http://127.0.0.1:{port}"),
            format!("http://127.0.0.1:{port}/"),
        ],
        "combd-test/",
    );
    let started = Instant::now();
    let e = c.owner("room").unwrap_err();
    assert!(matches!(e.failure, Failure::Unreachable(_)), "{e}");
    assert_eq!(e.op, "owner");
    assert!(e.to_string().contains("\"room\""), "{e}");
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn an_etcd_user_is_authenticated_again_when_its_token_lapses_and_kept_to_its_keys() {
    // Tokens that lapse a second after their last use, so the test sees one lapse.
    let Some(etcd) = Etcd::start_with(
        "an_etcd_user_is_authenticated_again",
        "http",
        &["--auth-token-ttl=1".to_string()],
        &ureq::Agent::new_with_defaults(),
    ) else {
        return;
    };
    etcd.enable_auth(
        &ureq::Agent::new_with_defaults(),
        "node",
        "node-password",
        "combd-test/",
    );
    let endpoints = std::slice::from_ref(&etcd.endpoint);
    // Without a user, etcd refuses every call.
    let e = coordinator(&etcd).fleet_id().unwrap_err();
    assert!(
        matches!(&e.failure, Failure::Status { code: 400, body } if body.contains("user name is empty")),
        "{e}"
    );
    // A wrong password fails at once, on its own call, and says so (not the password).
    let wrong = Coordinator::new(endpoints, "combd-test/").with_user("node", "not-it");
    let e = wrong.authenticate().unwrap_err();
    assert_eq!(e.op, "authenticate");
    assert!(e.to_string().contains("authentication failed"), "{e}");
    assert!(!e.to_string().contains("not-it"), "{e}");
    assert!(
        !format!("{wrong:?}").contains("not-it"),
        "the password is never shown"
    );
    // The right one works, token and all.
    let c = Coordinator::new(endpoints, "combd-test/").with_user("node", "node-password");
    c.authenticate().unwrap();
    assert_eq!(c.fleet_id().unwrap(), None);
    let lease = c.grant_lease(Duration::from_secs(30)).unwrap();
    let token = won(c.claim("room", NODE_A, &lease).unwrap());
    // The token lapses (etcd checks its TTL each second): the next call is refused 401 and
    // made again with a new token, unseen by the caller.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(c.owner("room").unwrap().unwrap().token, token);
    assert_eq!(
        c.advance_head("room", token, Head { seq: 1, token })
            .unwrap(),
        Advance::Done
    );
    // The user's role covers its prefix only: a client of another prefix is refused.
    let outside = Coordinator::new(endpoints, "other/").with_user("node", "node-password");
    let e = outside.owner("room").unwrap_err();
    assert!(
        matches!(&e.failure, Failure::Status { code: 403, body } if body.contains("permission denied")),
        "{e}"
    );
}

#[test]
fn the_wake_index_moves_with_the_head_fenced_and_pages_through_what_is_due() {
    let Some(etcd) = Etcd::start("the_wake_index_moves_with_the_head") else {
        return;
    };
    let c = coordinator(&etcd);
    let lease = c.grant_lease(Duration::from_secs(30)).unwrap();
    const N: usize = 150;
    let mut tokens = Vec::new();
    for i in 0..N {
        let object = format!("app/o{i:03}");
        let token = won(c.claim(&object, NODE_A, &lease).unwrap());
        let head = Head { seq: 1, token };
        let change = DueChange {
            was: None,
            now: Some(1_000 + i as u64),
        };
        assert_eq!(
            c.advance_head_and_due(&object, token, Some(head), change)
                .unwrap(),
            Advance::Done
        );
        tokens.push(token);
    }
    // Recorded with the head, and read with it.
    let (head, _, due) = c.state_and_due("app/o007").unwrap();
    assert_eq!(head.map(|h| h.seq), Some(1));
    assert_eq!(due, Some(1_007));
    // Due by 1,099: the first hundred, earliest first, in pages.
    let first = c.due_wakes(1_099, 64, None).unwrap();
    assert_eq!(first.len(), 64);
    assert_eq!(first[0], ("app/o000".to_string(), 1_000));
    let rest = c.due_wakes(1_099, 64, first.last()).unwrap();
    assert_eq!(rest.len(), 36);
    assert_eq!(rest[0], ("app/o064".to_string(), 1_064));
    assert_eq!(rest.last().unwrap().1, 1_099);
    // Moved later, the object leaves its old place; with nothing due it leaves the index.
    let change = DueChange {
        was: Some(1_000),
        now: Some(5_000),
    };
    assert_eq!(
        c.advance_head_and_due("app/o000", tokens[0], None, change)
            .unwrap(),
        Advance::Done
    );
    let gone = DueChange {
        was: Some(1_001),
        now: None,
    };
    c.advance_head_and_due("app/o001", tokens[1], None, gone)
        .unwrap();
    let now = c.due_wakes(1_099, 200, None).unwrap();
    assert_eq!(now.len(), 98);
    assert_eq!(now[0].0, "app/o002");
    assert_eq!(c.due("app/o000").unwrap(), Some(5_000));
    assert_eq!(c.due("app/o001").unwrap(), None);
    // A stale token moves nothing.
    let stale = DueChange {
        was: Some(1_002),
        now: None,
    };
    assert_eq!(
        c.advance_head_and_due("app/o002", tokens[2] - 1, None, stale)
            .unwrap(),
        Advance::Fenced
    );
    assert_eq!(c.due("app/o002").unwrap(), Some(1_002));
    // Who owns them: all of them, until the lease goes.
    let objects: Vec<String> = (0..N).map(|i| format!("app/o{i:03}")).collect();
    assert!(c.owned(&objects).unwrap().iter().all(|o| *o));
    c.revoke(&lease).unwrap();
    assert!(c.owned(&objects).unwrap().iter().all(|o| !*o));
    assert_eq!(
        c.due("app/o002").unwrap(),
        Some(1_002),
        "outlives the lease"
    );
}
