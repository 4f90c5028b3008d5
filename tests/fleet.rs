//! The fleet with real parts: a real etcd and a real Garage bucket (each started by the test,
//! skipped with one line when not installed: `tools/fleet-env/install`), and real nodes.
//! An object belongs to the first node asked for it; every write that node acknowledged is in
//! the bucket, so when it dies another node restores the object with all of them; a node asked
//! for an object another node owns passes the request on; and a node whose lease is gone
//! acknowledges nothing more for the objects it had.

#![allow(clippy::unwrap_used)]

#[path = "fleet/alarms.rs"]
mod alarms;
#[path = "fleet/delete.rs"]
mod delete;
#[path = "fleet/etcd_size.rs"]
mod etcd_size;
#[path = "../fleet/tests/support/mod.rs"]
mod fleet_support;
#[path = "fleet/identity.rs"]
mod identity;
#[path = "fleet/no_work.rs"]
mod no_work;
#[path = "fleet/presence.rs"]
mod presence;
#[path = "fleet/resume.rs"]
mod resume;
mod support;
#[path = "fleet/tls.rs"]
mod tls;
#[path = "fleet/trust.rs"]
mod trust;
#[path = "fleet/unreachable.rs"]
mod unreachable;
#[path = "fleet/unshipped.rs"]
mod unshipped;
#[path = "fleet/websocket.rs"]
mod websocket;

use std::time::{Duration, Instant};

use support::proxy::{url_like, Proxy};
use support::*;

/// Short, so a dead owner's objects come back within the test's bounds.
const LEASE_TTL: &str = "2s";
/// How long a lapsed owner's object may take to answer from another node (TTL + margin).
const MOVE_WITHIN: Duration = Duration::from_secs(15);

struct Fleet {
    etcd: fleet_support::Etcd,
    s3: fleet_support::S3,
    secret: std::path::PathBuf,
    /// The fleet key's file (every node of the fleet reads the same).
    key: std::path::PathBuf,
}

/// The fleet key the tests' fleets sign with.
const FLEET_KEY: &str = "combd-test-fleet-key-0123456789abcdef";

impl Fleet {
    fn start(test: &str) -> Option<Fleet> {
        Fleet::with_etcd(test, fleet_support::Etcd::start(test)?)
    }

    /// A fleet whose coordinator is `etcd`, started by the caller.
    fn with_etcd(test: &str, etcd: fleet_support::Etcd) -> Option<Fleet> {
        let s3 = fleet_support::S3::start(test)?;
        let secret = fleet_support::temp_dir("secret").join("secret");
        std::fs::write(&secret, format!("{}\n", s3.bucket.secret_key)).unwrap();
        let key = secret.with_file_name("fleet.key");
        std::fs::write(&key, format!("{FLEET_KEY}\n")).unwrap();
        Some(Fleet {
            etcd,
            s3,
            secret,
            key,
        })
    }

    /// A node of this fleet, its fleet listener on a port of its own.
    fn node(&self) -> TestNode {
        self.node_with_ttl(LEASE_TTL)
    }

    fn node_with_ttl(&self, ttl: &str) -> TestNode {
        self.node_on(ttl, &self.s3.bucket.endpoint, &[])
    }

    /// A node of this fleet that reaches the bucket at `bucket_url`, with `more` settings.
    fn node_on(&self, ttl: &str, bucket_url: &str, more: &[(&str, &str)]) -> TestNode {
        let address = format!("127.0.0.1:{}", fleet_support::free_port());
        self.node_at(&address, ttl, bucket_url, more)
    }

    /// A node of this fleet and its fleet address.
    fn node_and_address(&self) -> (TestNode, String) {
        let address = format!("127.0.0.1:{}", fleet_support::free_port());
        let node = self.node_at(&address, LEASE_TTL, &self.s3.bucket.endpoint, &[]);
        (node, address)
    }

    /// The fleet key's signature of `method target` (no body) to the node at `to`: what a
    /// node passing the request on sends.
    fn sign(&self, to: &str, method: &str, target: &str) -> String {
        combd_fleet::auth::parse_fleet_key(FLEET_KEY)
            .unwrap()
            .sign(to, method, target, b"")
    }

    /// A node of this fleet at fleet address `address`.
    fn node_at(
        &self,
        address: &str,
        ttl: &str,
        bucket_url: &str,
        more: &[(&str, &str)],
    ) -> TestNode {
        let env = self.settings(address, ttl, bucket_url);
        let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        env.extend_from_slice(more);
        TestNode::start(&env)
    }

    /// The settings of a node of this fleet at fleet address `address`.
    fn settings(&self, address: &str, ttl: &str, bucket_url: &str) -> Vec<(&'static str, String)> {
        let b = &self.s3.bucket;
        vec![
            ("COMBD_FLEET_ETCD", self.etcd.endpoint.clone()),
            ("COMBD_FLEET_BUCKET_URL", bucket_url.to_string()),
            ("COMBD_FLEET_BUCKET", b.bucket.clone()),
            ("COMBD_FLEET_BUCKET_REGION", b.region.clone()),
            ("COMBD_FLEET_ACCESS_KEY", b.access_key.clone()),
            (
                "COMBD_FLEET_SECRET_KEY_FILE",
                self.secret.display().to_string(),
            ),
            ("COMBD_FLEET_KEY_FILE", self.key.display().to_string()),
            ("COMBD_FLEET_NODE", address.to_string()),
            ("COMBD_FLEET_LEASE_TTL", ttl.to_string()),
            // The tests watch objects being let go and opened again: a second, as a node
            // alone, not the fleet's default 30 s (crossed in no_work.rs).
            ("COMBD_FLEET_OBJECT_IDLE", "1s".to_string()),
        ]
    }

    /// A call to etcd's JSON gateway; its answer.
    fn etcd_call(&self, path: &str, body: serde_json::Value) -> serde_json::Value {
        let text = ureq::post(&format!("{}{path}", self.etcd.endpoint))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// Records in etcd, as a node would by claiming it, that `object` is owned by a node at
    /// `node` (a fleet address), under a lease of its own that holds for `ttl_s` seconds.
    fn claim_for(&self, object: &str, node: &str, ttl_s: u64) {
        let lease = self.etcd_call("/v3/lease/grant", serde_json::json!({ "TTL": ttl_s }));
        let key = b64(format!("combd/owner/{object}").as_bytes());
        self.etcd_call(
            "/v3/kv/put",
            serde_json::json!({ "key": key, "value": b64(node.as_bytes()), "lease": lease["ID"] }),
        );
    }

    /// Revokes the lease of the node that owns `object` (that node's lease is gone, as after a
    /// partition longer than its TTL): every object it owned is unowned at once.
    fn revoke_owners_lease(&self, object: &str) {
        let key = b64(format!("combd/owner/{object}").as_bytes());
        let owner = self.etcd_call("/v3/kv/range", serde_json::json!({ "key": key }));
        let lease = owner["kvs"][0]["lease"].clone();
        assert!(lease.is_string(), "no owner of {object}: {owner}");
        self.etcd_call("/v3/lease/revoke", serde_json::json!({ "ID": lease }));
    }
}

/// Standard base64, as etcd's JSON gateway takes keys and values.
fn b64(bytes: &[u8]) -> String {
    base64::Engine::encode(&base64::engine::general_purpose::STANDARD, bytes)
}

fn post(node: &TestNode, object: &str) -> Resp {
    request(
        node.public(),
        format!("POST /o/counter/{object} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            .as_bytes(),
    )
}

/// [`post`] from the client address `from`: a loop that asks as fast as it can spreads its
/// connections over addresses, or the node's accept rate per address (256/s) closes them.
fn post_from(from: [u8; 4], node: &TestNode, object: &str) -> Resp {
    support::request_from(
        from,
        node.public(),
        format!("POST /o/counter/{object} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            .as_bytes(),
    )
}

/// A `POST` until it is acknowledged: a node answers 503 `fleet unavailable` (with
/// `retry-after`) while it cannot reach the coordinator or the bucket, and a client retries
/// (etcd has been seen to refuse a claim with a lease it had just granted). Nothing
/// unacknowledged counts, so the counter's values stay in step with the acknowledgements.
fn post_acked(node: &TestNode, object: &str) -> u64 {
    value(&retried(|| post(node, object)))
}

/// `ask()` again while it answers 503 `fleet unavailable` (with `retry-after`, as a client
/// does), for up to 10 s; its last answer.
fn retried(ask: impl Fn() -> Resp) -> Resp {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = ask();
        if r.status == 503 && r.json()["error"] == "fleet unavailable" && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        return r;
    }
}

fn get(node: &TestNode, object: &str) -> Resp {
    request(
        node.public(),
        format!("GET /o/counter/{object} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
    )
}

fn value(r: &Resp) -> u64 {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["value"].as_u64().unwrap()
}

/// A time limit from `/stats` (`limits`, `name` in milliseconds).
fn limit_ms(node: &TestNode, name: &str) -> Duration {
    let ms = node.stats()["limits"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no {name} in /stats limits"));
    Duration::from_millis(ms)
}

/// `ask()` until it answers 200 (503s are what a client retries), within `MOVE_WITHIN`.
fn until_200(what: &str, ask: impl Fn() -> Resp) -> Resp {
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

fn stat(node: &TestNode, name: &str) -> u64 {
    node.stats()[name]
        .as_u64()
        .unwrap_or_else(|| panic!("no {name} in /stats"))
}

#[test]
fn a_dead_owners_object_answers_from_another_node_with_every_acknowledged_write() {
    let Some(fleet) = Fleet::start("a_dead_owners_object_answers_from_another_node") else {
        return;
    };
    let a = fleet.node();
    let (b, b_at) = fleet.node_and_address();
    const WRITES: u64 = 30;
    for i in 1..=WRITES {
        assert_eq!(post_acked(&a, "x"), i);
    }
    assert!(stat(&a, "fleet_claims_won") >= 1);
    assert!(stat(&a, "fleet_segments_uploaded") >= 1);
    // A owns it while its lease lives: B passes requests on to A.
    assert_eq!(value(&get(&b, "x")), WRITES);
    assert_eq!(post_acked(&b, "x"), WRITES + 1);
    assert!(stat(&b, "fleet_lookups") >= 1);
    assert_eq!(
        stat(&b, "fleet_claims_lost"),
        0,
        "B read the owner, it did not claim"
    );
    assert!(stat(&b, "fleet_forwarded") >= 2);
    // A request another node already passed on (signed by it) is not passed on again.
    let signed = fleet.sign(&b_at, "GET", "/o/counter/x");
    let r = request(
        b.public(),
        format!(
            "GET /o/counter/x HTTP/1.1\r\nHost: x\r\ncombd-forwarded: 1\r\n\
             combd-fleet-auth: {signed}\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"], "object owned by another node");

    // While A is gone and its lease has not lapsed, B answers 503 (owner unreachable), then
    // serves the object itself.
    drop(a.kill9());
    let moved = until_200("B to serve the dead owner's object", || get(&b, "x"));
    assert_eq!(
        value(&moved),
        WRITES + 1,
        "every acknowledged write restored"
    );
    assert_eq!(stat(&b, "fleet_restores"), 1);
    assert_eq!(post_acked(&b, "x"), WRITES + 2);
}

#[test]
fn a_node_whose_lease_is_gone_acknowledges_nothing_more() {
    let Some(fleet) = Fleet::start("a_node_whose_lease_is_gone_acknowledges_nothing_more") else {
        return;
    };
    let a = fleet.node();
    let b = fleet.node();
    assert_eq!(post_acked(&a, "y"), 1);
    assert_eq!(post_acked(&a, "y"), 2);
    // A's lease is gone (its objects' owner keys with it); B claims the object at once.
    fleet.revoke_owners_lease("counter/y");
    assert_eq!(value(&get(&b, "y")), 2);
    assert_eq!(value(&post(&b, "y")), 3);
    // A, if it still has the object open (an object idles out after 1 s), does not
    // acknowledge the write (its head advance is fenced, or its lease seen gone), and B never
    // shows it; if A had let the object go, it finds B the owner and passes the write on,
    // and B's answer is the acknowledgement. Either way B shows exactly what was acknowledged.
    let r = post(&a, "y");
    let acknowledged = match r.status {
        503 => {
            assert!(stat(&a, "fleet_ship_fenced") + stat(&a, "fleet_ship_failed") >= 1);
            3
        }
        _ => {
            assert_eq!(value(&r), 4, "A's write passed on to B");
            assert!(stat(&a, "fleet_forwarded") >= 1);
            4
        }
    };
    assert_eq!(value(&get(&b, "y")), acknowledged);
    // A asks for a new lease (its keeper found the old one gone): it serves again, claiming
    // under the new lease, and passes what B owns on to B.
    assert_eq!(post_acked(&a, "fresh"), 1);
    assert_eq!(stat(&a, "fleet_lease_grants"), 2);
    assert_eq!(stat(&a, "fleet_lease_holds"), 1);
    // Its object of the old lease, if still open, refuses once (503) and lets go; asked
    // again, A finds B the owner.
    assert_eq!(value(&retried(|| get(&a, "y"))), acknowledged);
}

/// A node that stops (SIGTERM) snapshots its objects and gives its lease back: another node
/// serves them at once, long before the lease's TTL would have run out.
#[test]
fn a_node_that_stops_gives_its_objects_back_at_once() {
    let Some(fleet) = Fleet::start("a_node_that_stops_gives_its_objects_back_at_once") else {
        return;
    };
    const TTL: Duration = Duration::from_secs(30);
    let mut a = fleet.node_with_ttl("30s");
    let b = fleet.node_with_ttl("30s");
    for i in 1..=5 {
        assert_eq!(post_acked(&a, "z"), i);
    }
    a.sigterm();
    assert!(a.wait_exit().success());
    let stopped = Instant::now();
    // B's first request claims the object: no owner is left to pass it on to.
    assert_eq!(value(&get(&b, "z")), 5);
    assert!(
        stopped.elapsed() < TTL / 2,
        "served {:?} after the stop",
        stopped.elapsed()
    );
    assert_eq!(stat(&b, "fleet_claims_won"), 1);
}

/// A node cut off from etcd (its link to the coordinator down, its clients still reaching it)
/// acknowledges nothing more; once its lease lapses another node serves the object with every
/// write the first acknowledged; when the link is back, the first node takes a new lease and
/// passes the object's requests on to its new owner.
#[test]
fn a_node_cut_off_from_etcd_acknowledges_nothing_and_comes_back_with_a_new_lease() {
    let Some(fleet) = Fleet::start("a_node_cut_off_from_etcd") else {
        return;
    };
    let etcd: url_like::Endpoint = fleet.etcd.endpoint.parse().unwrap();
    let link = Proxy::start(etcd.addr);
    let a = fleet.node_on(
        LEASE_TTL,
        &fleet.s3.bucket.endpoint,
        &[("COMBD_FLEET_ETCD", &link.url())],
    );
    let b = fleet.node();
    for i in 1..=3 {
        assert_eq!(post_acked(&a, "q"), i);
    }
    link.set_cut(true);
    let cut = Instant::now();
    // Cut off: nothing A is asked to write is acknowledged (its head advance cannot reach
    // etcd), and B serves the object once A's lease lapsed there, with A's three writes.
    let mut refused = 0;
    let served = loop {
        let r = post(&a, "q");
        assert_ne!(
            r.status,
            200,
            "A acknowledged a write while cut off: {}",
            r.text()
        );
        refused += 1;
        let r = get(&b, "q");
        if r.status == 200 {
            break r;
        }
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(cut.elapsed() < MOVE_WITHIN, "B never served the object");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(refused >= 1);
    assert_eq!(
        value(&served),
        3,
        "every write A acknowledged, none it refused"
    );
    assert_eq!(post_acked(&b, "q"), 4);
    // Still cut off, A is asked again and again: it asks etcd for a new lease at most once a
    // fleet_lease_regrant_interval_ms, not once a request (a bound on a count over the time
    // the link was cut, whatever the machine's speed).
    let interval = limit_ms(&a, "fleet_lease_regrant_interval_ms");
    let asked_until = Instant::now() + 2 * interval;
    let mut asked = 0;
    while Instant::now() < asked_until {
        let r = post_from(support::client_address(asked as usize), &a, "q");
        assert_eq!(r.status, 503, "{}", r.text());
        asked += 1;
    }
    let tried = stat(&a, "fleet_lease_grant_failed");
    let bound = (cut.elapsed().as_millis() / interval.as_millis()) as u64 + 1;
    assert!(
        (1..=bound).contains(&tried),
        "{tried} grants tried in {:?} ({asked} requests)",
        cut.elapsed()
    );
    assert!(asked > bound, "asked {asked} times: too few to tell");
    // The link is back: A takes a new lease, and what it is asked of the object goes to B.
    link.set_cut(false);
    assert_eq!(post_acked(&a, "q"), 5);
    assert_eq!(value(&get(&b, "q")), 5);
    // It asks for a new lease at a request once the interval since its last try has passed
    // (what it passes on needs none).
    let until = Instant::now() + 3 * interval;
    while stat(&a, "fleet_lease_grants") < 2 {
        assert!(Instant::now() < until, "A never took a new lease");
        assert_eq!(value(&get(&a, "q")), 5);
        std::thread::sleep(Duration::from_millis(100)); // polling another process's counter
    }
    assert_eq!(stat(&a, "fleet_lease_grants"), 2);
    assert!(stat(&a, "fleet_forwarded") >= 1);
}
