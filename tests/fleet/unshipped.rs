//! A bucket that stops answering: one object's uploads reach `fleet_uploads_in_flight` and no
//! more, its committed batches wait for their shipment up to `fleet_unshipped_batches` (and one
//! more, committed and waiting to be handed over), past that it runs nothing; nothing is
//! answered before its shipment, and everything is once the bucket answers again, in commit
//! order.

use std::io::{BufReader, Read, Write};
use std::time::Duration;

use super::support::proxy::{url_like, Proxy};
use super::support::{connect, read_response, wait_stats, TestNode, WAIT};
use super::{get, post_acked, stat, value, Fleet, LEASE_TTL};

/// A fleet, a proxy in front of its bucket, and a node that reaches the bucket through it and
/// owns `counter/{object}` (one write acknowledged).
fn owner_behind_a_proxy(test: &str, object: &str) -> Option<(Fleet, Proxy, TestNode)> {
    let fleet = Fleet::start(test)?;
    let bucket: url_like::Endpoint = fleet.s3.bucket.endpoint.parse().unwrap();
    let proxy = Proxy::start(bucket.addr);
    let a = fleet.node_on(LEASE_TTL, &proxy.url(), &[]);
    assert_eq!(post_acked(&a, object), 1, "the object claimed");
    Some((fleet, proxy, a))
}

#[test]
fn an_object_behind_a_held_bucket_stops_past_its_unshipped_batches_and_answers_all_after() {
    let Some((_fleet, proxy, a)) = owner_behind_a_proxy("an_object_behind_a_held_bucket", "u")
    else {
        return;
    };
    let limits = &a.stats()["limits"];
    let cap = limits["fleet_unshipped_batches"].as_u64().unwrap();
    let in_flight = limits["fleet_uploads_in_flight"].as_u64().unwrap();
    let before = stat(&a, "batches");

    // The bucket stops answering (what the node sends waits in the proxy; its uploads time
    // out only after 10 s). One request at a time, so each is a batch of its own.
    proxy.set_held(true);
    let post = b"POST /o/counter/u HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    let mut conns = Vec::new();
    for i in 0..cap + 3 {
        let mut c = connect(a.public());
        c.write_all(post).unwrap();
        conns.push(c);
        if i <= cap {
            let n = before + i + 1;
            wait_stats(&a, "the request's batch", |s| {
                s["batches"].as_u64() >= Some(n)
            });
        }
    }
    // An absence has no event to wait on: one short pause stands for "nothing came" (one for
    // all of them: the uploads held time out after 10 s).
    std::thread::sleep(Duration::from_millis(50));
    for c in &conns {
        c.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let nothing = (&*c).read(&mut b).map_err(|e| e.kind());
        assert_eq!(
            nothing,
            Err(std::io::ErrorKind::WouldBlock),
            "an answer left before its shipment"
        );
        c.set_nonblocking(false).unwrap();
    }
    assert_eq!(
        stat(&a, "batches"),
        before + cap + 1,
        "the object stopped past {cap} unshipped batches"
    );
    assert_eq!(stat(&a, "fleet_uploads_in_flight_max"), in_flight);
    assert_eq!(stat(&a, "fleet_ship_failed"), 0);

    // The bucket answers again: every request is answered, each value once.
    proxy.set_held(false);
    let mut values = Vec::new();
    for c in conns {
        c.set_read_timeout(Some(WAIT)).unwrap();
        let r = read_response(&mut BufReader::new(c));
        assert_eq!(r.status, 200, "{}", r.text());
        values.push(r.json()["value"].as_u64().unwrap());
    }
    values.sort();
    assert_eq!(values, (2..=cap + 4).collect::<Vec<_>>());
    assert_eq!(stat(&a, "fleet_ship_failed"), 0);
}

/// While the bucket holds every upload, one object's groups go out several at once: up to
/// `fleet_uploads_in_flight` (8), never more, the rest waiting for room; once the bucket
/// answers (all at once, in any order) the head advances in commit order, so every
/// acknowledged write is there, each value acknowledged once.
#[test]
fn uploads_of_one_object_are_in_flight_together_up_to_their_cap() {
    let Some((fleet, proxy, a)) = owner_behind_a_proxy("uploads_in_flight_together", "p") else {
        return;
    };
    let cap = a.stats()["limits"]["fleet_uploads_in_flight"]
        .as_u64()
        .unwrap();
    assert_eq!(cap, 8);
    // Bursts of pipelined writes, each sent once the one before it is in: on its way to the
    // bucket while there is room (its answers held back), committed and waiting for room
    // once the cap's groups are in flight. Nothing finishes while the bucket holds them.
    // (12 × 4 requests: fewer batches than `fleet_unshipped_batches` even if each were one.)
    const BURSTS: u64 = 12;
    const DEPTH: u64 = 4;
    let count = |s: &serde_json::Value, name: &str| s[name].as_u64().unwrap();
    proxy.set_held(true);
    let workers: Vec<_> = (0..BURSTS)
        .map(|_| {
            let before = a.stats();
            let full = count(&before, "fleet_uploads_in_flight_max") >= cap;
            let mut stream = connect(a.public());
            let one = b"POST /o/counter/p HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
            stream.write_all(&one.repeat(DEPTH as usize)).unwrap();
            let (what, name) = match full {
                false => ("the burst to upload", "fleet_acks_waiting_upload"),
                true => ("the burst to commit", "batches"),
            };
            wait_stats(&a, what, |s| count(s, name) > count(&before, name));
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                (0..DEPTH)
                    .map(|_| value(&read_response(&mut reader)))
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    // Each burst while there was room started at least one upload: the cap was reached, and
    // the groups past it wait (their answers not yet counted as waiting for an upload).
    let s = a.stats();
    assert_eq!(count(&s, "fleet_uploads_in_flight_max"), cap, "{s}");
    let waiting = count(&s, "fleet_acks_waiting_upload");
    assert!(
        (cap..BURSTS * DEPTH).contains(&waiting),
        "{waiting} answers waiting for an upload"
    );
    proxy.set_held(false);
    let values: Vec<u64> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    let mut sorted = values.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), values.len(), "a value acknowledged twice");
    let total = 1 + BURSTS * DEPTH;
    assert_eq!(value(&get(&a, "p")), total);
    assert_eq!(
        stat(&a, "fleet_uploads_in_flight_max"),
        cap,
        "{}",
        a.stats()
    );
    assert_eq!(stat(&a, "fleet_ship_failed"), 0);
    // Every acknowledged write is in the bucket: another node restores all of them.
    let mut a = a;
    a.sigterm();
    assert!(a.wait_exit().success());
    let b = fleet.node();
    assert_eq!(value(&get(&b, "p")), total);
}
