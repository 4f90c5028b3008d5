//! The fleet's trust zone, attacked: the fleet listener (never refused, past admission) takes
//! only requests signed with the fleet key, for this node, lately, once; a client cannot pass
//! for a node on the public listener either; and an owner the coordinator records that is not
//! a fleet address is never dialled.

use std::net::SocketAddr;

use combd_fleet::auth::{now_ms, parse_fleet_key, AUTH_HEADER};
use combd_kernel::limits::FLEET_AUTH_SKEW;

use super::support::{request, Resp};
use super::{fleet_support, get, post_acked, stat, value, Fleet, FLEET_KEY, LEASE_TTL};

/// `POST /o/counter/<object>` as a node passes it on, with `auth` as its signature header (if
/// any), sent to `to`.
fn forwarded_post(to: SocketAddr, object: &str, body: &str, auth: Option<&str>) -> Resp {
    let auth = auth.map_or(String::new(), |a| format!("{AUTH_HEADER}: {a}\r\n"));
    request(
        to,
        format!(
            "POST /o/counter/{object} HTTP/1.1\r\nHost: x\r\ncombd-forwarded: 1\r\n{auth}\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
}

fn refused(r: &Resp, why: &str) {
    assert_eq!(r.status, 401, "{why}: {}", r.text());
    let error = r.json()["error"].as_str().unwrap_or_default().to_string();
    assert!(
        error.starts_with("fleet authentication failed"),
        "{why}: {error}"
    );
    assert_eq!(r.header("www-authenticate"), Some("combd-fleet"), "{why}");
}

#[test]
fn the_fleet_listener_takes_only_what_the_fleet_key_signed_for_this_node_lately_and_once() {
    let Some(fleet) = Fleet::start("the_fleet_listener_takes_only_signed") else {
        return;
    };
    let me = format!("127.0.0.1:{}", fleet_support::free_port());
    let a = fleet.node_at(&me, LEASE_TTL, &fleet.s3.bucket.endpoint, &[]);
    let at: SocketAddr = me.parse().unwrap();
    assert_eq!(post_acked(&a, "t"), 1);
    let key = parse_fleet_key(FLEET_KEY).unwrap();
    let other_key = parse_fleet_key("another-fleet-entirely-0123456789abcdef").unwrap();
    let target = "/o/counter/t";

    let mut refusals = 0;
    let mut attack = |r: Resp, why: &str| {
        refused(&r, why);
        refusals += 1;
    };
    // The finding: a plain request marked forwarded, with no credentials at all.
    attack(forwarded_post(at, "t", "", None), "unsigned");
    // On the public listener too: a client cannot pass for a node.
    attack(
        forwarded_post(a.public(), "t", "", None),
        "unsigned, public listener",
    );
    // Everything on the fleet listener, not only objects.
    attack(
        request(at, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"),
        "unsigned healthz on the fleet listener",
    );
    // Signed with another key.
    let forged = other_key.sign(&me, "POST", target, b"");
    attack(forwarded_post(at, "t", "", Some(&forged)), "another key");
    // Signed for another node, another object, another body, another method.
    let elsewhere = key.sign("127.0.0.1:1", "POST", target, b"");
    attack(
        forwarded_post(at, "t", "", Some(&elsewhere)),
        "for another node",
    );
    let other_object = key.sign(&me, "POST", "/o/counter/u", b"");
    attack(
        forwarded_post(at, "t", "", Some(&other_object)),
        "for another object",
    );
    let other_body = key.sign(&me, "POST", target, b"");
    attack(
        forwarded_post(at, "t", "{}", Some(&other_body)),
        "with another body",
    );
    let other_method = key.sign(&me, "GET", target, b"");
    attack(
        forwarded_post(at, "t", "", Some(&other_method)),
        "for another method",
    );
    // Signed for one client address, carrying another: the app would be told a lie.
    let for_one = key.sign_for(&me, "POST", target, "192.0.2.1", b"");
    attack(
        request(
            at,
            format!(
                "POST {target} HTTP/1.1\r\nHost: x\r\ncombd-forwarded: 1\r\n\
                 {AUTH_HEADER}: {for_one}\r\ncombd-client: 192.0.2.2\r\nContent-Length: 0\r\n\r\n"
            )
            .as_bytes(),
        ),
        "for another client address",
    );
    // Signed with the client's token and origin, carrying another origin, or a field more:
    // what the app is told of the client is covered too (`combd_fleet::forward::covered`).
    let fields: [(&str, &[u8]); 2] = [
        ("authorization", b"Bearer abc"),
        ("origin", b"https://a.example"),
    ];
    let covered = combd_fleet::forward::covered("192.0.2.1", fields);
    let with_fields = key.sign_for(&me, "POST", target, &covered, b"");
    for (told, why) in [
        ("origin: https://evil.example\r\n", "with another origin"),
        (
            "origin: https://a.example\r\nx-role: admin\r\n",
            "with a field more",
        ),
    ] {
        attack(
            request(
                at,
                format!(
                    "POST {target} HTTP/1.1\r\nHost: x\r\ncombd-forwarded: 1\r\n\
                     {AUTH_HEADER}: {with_fields}\r\ncombd-client: 192.0.2.1\r\n\
                     authorization: Bearer abc\r\n{told}Content-Length: 0\r\n\r\n"
                )
                .as_bytes(),
            ),
            why,
        );
    }
    // Out of date: signed more than the skew ago.
    let old = now_ms() - FLEET_AUTH_SKEW.as_millis() as u64 - 1_000;
    let stale = key.sign_at(&me, "POST", target, "", b"", old, [3; 16]);
    attack(forwarded_post(at, "t", "", Some(&stale)), "out of date");
    attack(forwarded_post(at, "t", "", Some("v1 garbage")), "malformed");
    assert_eq!(value(&get(&a, "t")), 1, "no refused request was applied");
    assert_eq!(stat(&a, "fleet_auth_refused"), refusals);

    // Signed by the fleet for this node: taken, once.
    let good = key.sign(&me, "POST", target, b"");
    let taken = forwarded_post(at, "t", "", Some(&good));
    assert_eq!(taken.status, 200, "{}", taken.text());
    assert_eq!(value(&taken), 2);
    let again = forwarded_post(at, "t", "", Some(&good));
    refused(&again, "replayed");
    assert_eq!(
        again.json()["error"],
        "fleet authentication failed: fleet request replayed"
    );
    assert_eq!(value(&get(&a, "t")), 2, "the replay was not applied");
    assert_eq!(stat(&a, "fleet_auth_refused"), refusals + 1);
    assert!(stat(&a, "fleet_auth_replays_held") >= 1);
}

#[test]
fn an_owner_the_coordinator_records_that_is_not_a_fleet_address_is_never_dialled() {
    let Some(fleet) = Fleet::start("an_owner_that_is_not_a_fleet_address") else {
        return;
    };
    let a = fleet.node();
    // Whoever writes the coordinator names the owner: values no node could have written.
    for (object, owner) in [
        ("bad1", "0.0.0.0:9"),
        ("bad2", "[not-an-address"),
        ("bad3", "127.0.0.1:0"),
    ] {
        fleet.claim_for(&format!("counter/{object}"), owner, 60);
        let r = get(&a, object);
        assert_eq!(r.status, 503, "{owner}: {}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"), "{owner}");
    }
    assert_eq!(stat(&a, "fleet_owner_invalid"), 3);
    assert_eq!(stat(&a, "fleet_forwarded"), 0);
    assert_eq!(stat(&a, "fleet_forward_failed"), 0, "none was dialled");
}

#[test]
fn a_node_whose_etcd_lost_the_fleet_refuses_to_start_rather_than_serve_its_objects_empty() {
    let Some(fleet) = Fleet::start("a_node_whose_etcd_lost_the_fleet") else {
        return;
    };
    let a = fleet.node();
    assert_eq!(post_acked(&a, "kept"), 1);
    drop(a);
    // An empty etcd (as a member re-initialised, or the wrong endpoints), the same bucket.
    let Some(empty) = fleet_support::Etcd::start("a_node_whose_etcd_lost_the_fleet, etcd 2") else {
        return;
    };
    let b = &fleet.s3.bucket;
    let (secret, key) = (
        fleet.secret.display().to_string(),
        fleet.key.display().to_string(),
    );
    let node = format!("127.0.0.1:{}", fleet_support::free_port());
    let data = fleet_support::temp_dir("lost-etcd-node");
    let out = super::support::run_to_exit(&mut super::support::combd_command(
        &data,
        &[
            ("COMBD_FLEET_ETCD", &empty.endpoint),
            ("COMBD_FLEET_BUCKET_URL", &b.endpoint),
            ("COMBD_FLEET_BUCKET", &b.bucket),
            ("COMBD_FLEET_BUCKET_REGION", &b.region),
            ("COMBD_FLEET_ACCESS_KEY", &b.access_key),
            ("COMBD_FLEET_SECRET_KEY_FILE", &secret),
            ("COMBD_FLEET_KEY_FILE", &key),
            ("COMBD_FLEET_NODE", &node),
        ],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "it started: {stderr}");
    assert!(stderr.contains("COMBD_FLEET_ETCD"), "{stderr}");
    assert!(stderr.contains("etcd records no fleet"), "{stderr}");
    // The fleet's own etcd still starts a node, and the write is there (once the killed
    // node's lease lapsed).
    let c = fleet.node();
    let kept = super::until_200("the next node to serve it", || get(&c, "kept"));
    assert_eq!(value(&kept), 1);
    let _ = std::fs::remove_dir_all(data);
}

#[test]
fn an_owner_that_answers_what_is_not_a_bounded_http_answer_gets_its_caller_a_503() {
    let Some(fleet) = Fleet::start("an_owner_that_answers_badly") else {
        return;
    };
    let a = fleet.node();
    // Peers on the fleet network are untrusted input: each answer below comes from a node
    // etcd names as an object's owner, and each is refused whole, the node unharmed.
    let long_head = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(20 * 1024));
    let answers: Vec<(&str, String)> = vec![
        (
            "a body longer than a node passes back",
            "HTTP/1.1 200 OK\r\ncontent-length: 99999999999\r\n\r\n".into(),
        ),
        (
            "chunked",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n".into(),
        ),
        ("no length", "HTTP/1.1 200 OK\r\n\r\n{}".into()),
        ("not HTTP", "SSH-2.0-OpenSSH\r\n\r\n".into()),
        ("a header section past its bound", long_head),
        (
            "cut short",
            "HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"value\":1".into(),
        ),
        // Well formed, but not signed for the request by the fleet key: a node on the
        // fleet's network without the key (or anyone between two nodes) cannot answer for an
        // owner.
        (
            "unsigned",
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"value\":7}"
                .into(),
        ),
        (
            "signed with another key",
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\
                 combd-fleet-answer: {}\r\n\r\n{{\"value\":7}}",
                "ab".repeat(32)
            ),
        ),
    ];
    let mut failed = 0u64;
    for (i, (what, answer)) in answers.into_iter().enumerate() {
        let owner = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = owner.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut conn, _) = owner.accept().unwrap();
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = conn.write_all(answer.as_bytes());
            // Then close: an answer is whatever came before the close.
        });
        let object = format!("hostile{i}");
        fleet.claim_for(&format!("counter/{object}"), &addr.to_string(), 60);
        let r = get(&a, &object);
        server.join().unwrap();
        assert!(
            r.status == 503 || r.status == 502,
            "{what}: {} {}",
            r.status,
            r.text()
        );
        failed += 1;
        assert_eq!(stat(&a, "fleet_forward_failed"), failed, "{what}");
    }
    assert_eq!(
        stat(&a, "fleet_forwarded"),
        0,
        "nothing of them was passed back"
    );
    // The node still serves its own.
    assert_eq!(post_acked(&a, "mine"), 1);
}

/// A host on the fleet's network holding connections open to the fleet listener (which is
/// never stopped, past admission) holds its share of it, as many as a client address's, and
/// a node's request is served beside them once they are gone.
#[test]
fn the_fleet_listener_holds_each_peer_to_its_share_of_connections() {
    let Some(fleet) = Fleet::start("the_fleet_listener_holds_each_peer") else {
        return;
    };
    let me = format!("127.0.0.1:{}", fleet_support::free_port());
    let more = [("COMBD_MAX_CONNS_PER_ADDRESS", "8")];
    let a = fleet.node_at(&me, LEASE_TTL, &fleet.s3.bucket.endpoint, &more);
    let at: SocketAddr = me.parse().unwrap();
    let silent: Vec<std::net::TcpStream> = (0..12)
        .map(|_| std::net::TcpStream::connect(at).unwrap())
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stat(&a, "fleet_conns_refused") < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "the peer was not held to its share"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(stat(&a, "fleet_conns_refused"), 4);
    drop(silent);
    // Once the node has seen them close, a node's request is served.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while stat(&a, "conns_fleet") > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the silent connections stayed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let key = parse_fleet_key(FLEET_KEY).unwrap();
    let signed = key.sign(&me, "POST", "/o/counter/p", b"");
    let r = forwarded_post(at, "p", "", Some(&signed));
    assert_eq!(r.status, 200, "{}", r.text());
}
