//! No work for nothing: an object opened again at the head its last clean close left it at
//! restores nothing from the bucket, and closed with nothing shipped since its snapshot
//! uploads nothing (issue 27: eight GETs of an unchanged counter, each after it idled out, made
//! 8 restores and 9 full snapshots).

use std::time::{Duration, Instant};

use super::support::TestNode;
use super::{get, post_acked, stat, value, Fleet};

/// Waits until `node` has let every object go (`fleet_objects_owned` 0: each object idles out
/// after `object_idle_ms`, 1 s).
fn until_let_go(node: &TestNode) {
    let t0 = Instant::now();
    while stat(node, "fleet_objects_owned") != 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "the object was not let go"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_unchanged_object_opened_again_restores_nothing_and_closed_again_uploads_nothing() {
    let Some(fleet) = Fleet::start("an_unchanged_object_restores_nothing") else {
        return;
    };
    let a = fleet.node();
    for i in 1..=3 {
        assert_eq!(post_acked(&a, "n"), i);
    }
    until_let_go(&a);
    let (restores, snapshots) = (stat(&a, "fleet_restores"), stat(&a, "fleet_snapshots"));
    assert_eq!(snapshots, 1, "its close snapshotted the three writes");
    for round in 1..=4 {
        assert_eq!(value(&get(&a, "n")), 3, "round {round}");
        until_let_go(&a);
        assert_eq!(
            stat(&a, "fleet_restores"),
            restores,
            "round {round}: restored again"
        );
        assert_eq!(
            stat(&a, "fleet_snapshots"),
            snapshots,
            "round {round}: uploaded again"
        );
        assert_eq!(stat(&a, "fleet_restores_skipped"), round);
        assert_eq!(stat(&a, "fleet_snapshots_skipped"), round);
    }
    // A write moves the head: the next close uploads one snapshot, and the open after it
    // still restores nothing (the file was left at the new head).
    assert_eq!(post_acked(&a, "n"), 4);
    until_let_go(&a);
    assert_eq!(stat(&a, "fleet_snapshots"), snapshots + 1);
    assert_eq!(value(&get(&a, "n")), 4);
    assert_eq!(stat(&a, "fleet_restores"), restores);
    until_let_go(&a);
    drop(a);

    // Another node that takes the object over has no mark of its own: it restores, with
    // every write.
    let b = fleet.node();
    assert_eq!(
        value(&super::until_200("B to serve it", || get(&b, "n"))),
        4
    );
    assert_eq!(stat(&b, "fleet_restores"), 1);
    assert_eq!(stat(&b, "fleet_restores_skipped"), 0);
}

#[test]
fn an_object_etcd_has_no_head_for_but_the_bucket_holds_is_refused_not_started_empty() {
    let Some(fleet) = Fleet::start("an_object_etcd_has_no_head_for") else {
        return;
    };
    let a = fleet.node();
    for i in 1..=2 {
        assert_eq!(post_acked(&a, "lost"), i);
    }
    until_let_go(&a);
    // etcd loses the head (as a re-initialised member would).
    let key = super::b64(b"combd/head/counter/lost");
    fleet.etcd_call("/v3/kv/deleterange", serde_json::json!({ "key": key }));
    let r = get(&a, "lost");
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"], "fleet unavailable");
    assert_eq!(stat(&a, "fleet_head_missing"), 1);
    // A write is refused too: nothing starts the object over empty.
    let w = super::post(&a, "lost");
    assert_eq!(w.status, 503, "{}", w.text());
    assert!(stat(&a, "fleet_head_missing") >= 2);
    // A new object, of which the bucket holds nothing, starts empty as before.
    assert_eq!(post_acked(&a, "fresh"), 1);
}

#[test]
fn a_fleet_object_waits_its_own_idle_time_before_it_is_let_go() {
    let Some(fleet) = Fleet::start("a_fleet_object_waits_its_own_idle_time") else {
        return;
    };
    let address = format!("127.0.0.1:{}", super::fleet_support::free_port());
    let a = fleet.node_at(
        &address,
        super::LEASE_TTL,
        &fleet.s3.bucket.endpoint,
        &[("COMBD_FLEET_OBJECT_IDLE", "4s")],
    );
    assert_eq!(a.stats()["limits"]["fleet_object_idle_ms"], 4000);
    let asked = Instant::now();
    // Written (an object never written goes as soon as nothing waits for it).
    assert_eq!(post_acked(&a, "idle"), 1);
    // A node alone lets an object go after 1 s; this one keeps it past that.
    std::thread::sleep(Duration::from_millis(2_000));
    if asked.elapsed() < Duration::from_millis(3_500) {
        assert_eq!(stat(&a, "fleet_objects_owned"), 1, "let go before its 4 s");
    }
    until_let_go(&a);
    assert!(
        asked.elapsed() >= Duration::from_secs(4),
        "let go after {:?}",
        asked.elapsed()
    );
}

/// The number of etcd keys under `prefix`.
pub(super) fn etcd_keys(fleet: &Fleet, prefix: &str) -> u64 {
    let b64 = super::b64;
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let v = fleet.etcd_call(
        "/v3/kv/range",
        serde_json::json!({ "key": b64(prefix.as_bytes()), "range_end": b64(&end), "count_only": true }),
    );
    v["count"].as_str().map_or(0, |c| c.parse().unwrap())
}

#[test]
fn a_spray_of_names_only_read_leaves_nothing_in_etcd_or_the_bucket() {
    let Some(fleet) = Fleet::start("a_spray_of_names_only_read_leaves_nothing") else {
        return;
    };
    let a = fleet.node();
    const NAMES: u64 = 200;
    for i in 0..NAMES {
        assert_eq!(value(&get(&a, &format!("spray-{i}"))), 0);
    }
    // Each is let go once nothing waits for it, and its claim given back: etcd holds no key
    // of any of them (the finding: a head and an owner key for every name ever asked).
    until_let_go(&a);
    assert_eq!(stat(&a, "fleet_claims_released"), NAMES);
    for prefix in ["combd/owner/", "combd/head/", "combd/snap/"] {
        assert_eq!(etcd_keys(&fleet, prefix), 0, "{prefix}");
    }
    let bucket = combd_fleet::bucket::Bucket::new(&fleet.s3.bucket).unwrap();
    assert!(!bucket.any("counter/").unwrap(), "nothing in the bucket");
    // A name written is an object like any other: claimed, shipped, kept.
    assert_eq!(post_acked(&a, "spray-7"), 1);
    assert_eq!(etcd_keys(&fleet, "combd/head/"), 1);
    assert!(bucket.any("counter/spray-7/").unwrap());
    until_let_go(&a);
    assert_eq!(
        etcd_keys(&fleet, "combd/head/"),
        1,
        "a written object's head stays"
    );
    assert_eq!(
        stat(&a, "fleet_claims_released"),
        NAMES,
        "a written one keeps its claim"
    );
    assert_eq!(value(&get(&a, "spray-7")), 1);
}

#[test]
fn requests_for_an_object_owned_elsewhere_go_there_without_a_cell_or_a_claim() {
    let Some(fleet) = Fleet::start("requests_for_an_object_owned_elsewhere_go_there") else {
        return;
    };
    let (a, b) = (fleet.node(), fleet.node());
    assert_eq!(post_acked(&a, "r"), 1);
    // The first request on B reads who owns the object (no claim, no cell) and passes it
    // on; the next ones go straight to A, many at once, without asking again.
    assert_eq!(value(&super::post(&b, "r")), 2);
    let claims = stat(&b, "fleet_claims_lost");
    assert_eq!(claims, 0, "a read, not a claim");
    assert_eq!(stat(&b, "fleet_lookups"), 1);
    assert_eq!(stat(&b, "objects_live"), 0, "no cell");
    let answered: Vec<u64> = std::thread::scope(|s| {
        let asks: Vec<_> = (0..16)
            .map(|_| s.spawn(|| value(&super::post(&b, "r"))))
            .collect();
        asks.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut sorted = answered.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (3..=18).collect::<Vec<_>>(),
        "each answered once, by A"
    );
    assert_eq!(
        stat(&b, "fleet_claims_lost"),
        claims,
        "no claim per request"
    );
    assert_eq!(stat(&b, "fleet_lookups"), 1, "the owner read once");
    assert!(
        stat(&b, "fleet_routed") >= 16,
        "{}",
        stat(&b, "fleet_routed")
    );
    assert_eq!(stat(&b, "fleet_forward_failed"), 0);
    // A dies: what B remembers of it does not outlive A's claim; once A's lease lapses, B
    // claims the object and restores every write A acknowledged.
    drop(a);
    let r = super::until_200("B serving it", || super::post(&b, "r"));
    assert_eq!(value(&r), 19);
}

/// `fleet_lookups_max` crossed: with etcd holding every call, one shard keeps at most that many
/// reads of an owner on their way; a request for one more name goes to an object cell (bounded
/// by `COMBD_MAX_OPEN_OBJECTS`) instead of queueing another read, and once etcd answers again
/// every request is answered.
#[test]
fn a_shard_waits_on_at_most_fleet_lookups_max_reads_of_an_owner() {
    use std::io::{BufReader, Write};

    use super::support::proxy::{url_like, Proxy};
    use super::support::{client_address, connect_from, read_response};

    let Some(fleet) = Fleet::start("a_shard_waits_on_at_most_fleet_lookups_max") else {
        return;
    };
    let etcd: url_like::Endpoint = fleet.etcd.endpoint.parse().unwrap();
    let link = Proxy::start(etcd.addr);
    let a = fleet.node_on(
        super::LEASE_TTL,
        &fleet.s3.bucket.endpoint,
        &[("COMBD_FLEET_ETCD", &link.url()), ("COMBD_SHARDS", "1")],
    );
    let max = a.stats()["limits"]["fleet_lookups_max"].as_u64().unwrap();
    let over = 40;
    let names = (max + over) as usize;
    // Every request on a connection of its own, connected before etcd is held, then sent at
    // once: all of them reach the shard well within one etcd call's timeout.
    let mut conns: Vec<_> = (0..names)
        .map(|i| connect_from(client_address(i), a.public()))
        .collect();
    link.set_held(true);
    for (i, c) in conns.iter_mut().enumerate() {
        let ask =
            format!("GET /o/counter/spray-{i} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        c.write_all(ask.as_bytes()).unwrap();
    }
    let t0 = Instant::now();
    while stat(&a, "fleet_lookups_waiting_max") < max {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "never {max} reads on their way: {} now, {} overflowed",
            stat(&a, "fleet_lookups_waiting"),
            stat(&a, "fleet_lookups_overflowed")
        );
        std::thread::sleep(Duration::from_millis(20)); // polling another process's counter
    }
    let overflowed = stat(&a, "fleet_lookups_overflowed");
    link.set_held(false);
    assert!(
        (1..=over).contains(&overflowed),
        "{overflowed} requests went to a cell unread ({over} past the cap)"
    );
    for (i, c) in conns.into_iter().enumerate() {
        let r = read_response(&mut BufReader::new(c));
        assert!(
            r.status == 200 || r.status == 503,
            "spray-{i}: {} {}",
            r.status,
            r.text()
        );
        if r.status == 200 {
            assert_eq!(value(&r), 0, "spray-{i} was never written");
        }
    }
    assert_eq!(stat(&a, "fleet_lookups_waiting"), 0);
    assert_eq!(
        stat(&a, "fleet_lookups_waiting_max"),
        max,
        "never more than fleet_lookups_max"
    );
}
