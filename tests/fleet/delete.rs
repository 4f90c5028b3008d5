//! Deleting an object in a fleet: its owner forgets it in etcd (head, snapshot, due, wake; a
//! tombstone while the bucket still holds it), clears it from the bucket, then takes the
//! tombstone and its claim away. Its name is a new, empty object at once, and nothing of the
//! old one comes back on another node after a failover; a delete its owner died in the middle
//! of is finished by the next owner before it serves the name again.

use super::support::{local, TestNode};
use super::{b64, get, post_acked, stat, until_200, value, Fleet};

/// Whether etcd has `object`'s key of `kind` (`head`, `snap`, `due`, `gone`, `owner`).
fn etcd_has(fleet: &Fleet, kind: &str, object: &str) -> bool {
    let key = b64(format!("combd/{kind}/{object}").as_bytes());
    let v = fleet.etcd_call(
        "/v3/kv/range",
        serde_json::json!({ "key": key, "count_only": true }),
    );
    v["count"].as_str().unwrap_or("0") != "0"
}

/// The bucket's keys of `object`.
fn bucket_keys(fleet: &Fleet, object: &str) -> Vec<String> {
    combd_fleet::bucket::Bucket::new(&fleet.s3.bucket)
        .unwrap()
        .list(&format!("{object}/"), 10_000)
        .unwrap()
}

#[test]
fn a_deleted_object_is_forgotten_by_etcd_and_the_bucket_and_stays_gone_after_a_failover() {
    let Some(fleet) = Fleet::start("a_deleted_object_is_forgotten") else {
        return;
    };
    let a = fleet.node();
    for i in 1..=5 {
        assert_eq!(post_acked(&a, "x"), i);
    }
    assert!(!bucket_keys(&fleet, "counter/x").is_empty());
    assert!(etcd_has(&fleet, "head", "counter/x"));
    // Only its owner deletes it: another node refuses, as for any object it does not own.
    let b = fleet.node();
    let r = local(&b, "DELETE", "/objects/counter/x", "");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"], "object owned by another node");
    assert!(etcd_has(&fleet, "head", "counter/x"));
    let r = local(&a, "DELETE", "/objects/counter/x", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["deleted"], true);
    for kind in ["head", "snap", "due", "gone", "owner"] {
        assert!(!etcd_has(&fleet, kind, "counter/x"), "{kind} left in etcd");
    }
    assert_eq!(bucket_keys(&fleet, "counter/x"), Vec::<String>::new());
    assert_eq!(stat(&a, "fleet_objects_forgotten"), 1);
    // The name is a new object, written as any other.
    assert_eq!(post_acked(&a, "x"), 1);
    assert_eq!(post_acked(&a, "x"), 2);
    // A dies; B restores the new object, with nothing of the old one.
    let _ = a.kill9();
    fleet.revoke_owners_lease("counter/x");
    let r = until_200("the new object on B", || get(&b, "x"));
    assert_eq!(value(&r), 2);
    assert_eq!(stat(&b, "fleet_forgets_finished"), 0);
}

/// A's delete stopped after its tombstone was written (as `Coordinator::forget` leaves it):
/// no head in etcd, the old segments still in the bucket. The next owner clears the bucket and
/// the tombstone before it serves the name, as a new object (not refused as an object whose
/// head etcd lost).
#[test]
fn a_delete_its_owner_died_in_is_finished_by_the_next_owner() {
    let Some(fleet) = Fleet::start("a_delete_its_owner_died_in") else {
        return;
    };
    let a = fleet.node();
    for i in 1..=4 {
        assert_eq!(post_acked(&a, "y"), i);
    }
    let _ = a.kill9();
    fleet.revoke_owners_lease("counter/y");
    for kind in ["head", "snap", "due"] {
        let key = b64(format!("combd/{kind}/counter/y").as_bytes());
        fleet.etcd_call("/v3/kv/deleterange", serde_json::json!({ "key": key }));
    }
    let gone = b64(b"combd/gone/counter/y");
    fleet.etcd_call(
        "/v3/kv/put",
        serde_json::json!({ "key": gone, "value": b64(b"1") }),
    );
    let old = bucket_keys(&fleet, "counter/y");
    assert!(!old.is_empty());
    let b: TestNode = fleet.node();
    assert_eq!(post_acked(&b, "y"), 1, "a new object");
    assert_eq!(stat(&b, "fleet_forgets_finished"), 1);
    assert!(!etcd_has(&fleet, "gone", "counter/y"));
    let now = bucket_keys(&fleet, "counter/y");
    assert!(
        now.iter().all(|k| !old.contains(k)),
        "an old key is back: {now:?}"
    );
}

/// An object that deletes itself (`cx.delete()`, the test app `brief`): once the batch that
/// asked is shipped and answered, the fleet forgets it as it does for the operator.
#[test]
fn an_object_that_deletes_itself_in_a_fleet_is_forgotten() {
    let Some(fleet) = Fleet::start("an_object_that_deletes_itself_in_a_fleet") else {
        return;
    };
    let endpoint = fleet.s3.bucket.endpoint.clone();
    let a = fleet.node_on(super::LEASE_TTL, &endpoint, &[super::support::TEST_APPS]);
    let ask = |method: &str, body: &str| {
        super::retried(|| {
            super::support::request(
                a.public(),
                format!(
                    "{method} /o/brief/z HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
        })
    };
    for said in ["one", "two", "three"] {
        assert_eq!(ask("POST", said).status, 200);
    }
    assert!(!bucket_keys(&fleet, "brief/z").is_empty());
    let r = ask("DELETE", "");
    assert_eq!(r.status, 200, "{}", r.text());
    let t0 = std::time::Instant::now();
    while stat(&a, "fleet_objects_forgotten") == 0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "not forgotten"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for kind in ["head", "snap", "gone"] {
        assert!(!etcd_has(&fleet, kind, "brief/z"), "{kind} left in etcd");
    }
    assert_eq!(bucket_keys(&fleet, "brief/z"), Vec::<String>::new());
    assert_eq!(ask("POST", "anew").status, 200);
    assert!(etcd_has(&fleet, "head", "brief/z"), "the new object ships");
}
