//! Verified identity in a fleet: a request for an identified app passed on to its object's
//! owner keeps its client, because the owner verifies the same token again (it trusts no
//! identity a peer asserts); a request without a token is refused where it arrived.

use super::support::{request, Resp, TestNode, TEST_APPS};
use super::{Fleet, LEASE_TTL};

const SECRET: &str = "combd-fleet-identity-secret-0123456789abcdef";

/// `POST /o/whoami/room`: counts the client's visits in the object's database.
fn whoami(node: &TestNode, token: Option<&str>) -> Resp {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    request(
        node.public(),
        format!(
            "POST /o/whoami/room HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\n\
             Connection: close\r\n\r\n"
        )
        .as_bytes(),
    )
}

#[test]
fn a_request_passed_on_to_the_owner_keeps_its_verified_client() {
    let Some(fleet) = Fleet::start("a_request_passed_on_keeps_its_client") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("combd-fleet-identity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("jwt.key");
    std::fs::write(&key, format!("{SECRET}\n")).unwrap();
    let settings = [
        TEST_APPS,
        ("COMBD_AUTH_JWT_KEY_FILE", key.to_str().unwrap()),
    ];
    let bucket = fleet.s3.bucket.endpoint.clone();
    let (a, b) = (
        fleet.node_on(LEASE_TTL, &bucket, &settings),
        fleet.node_on(LEASE_TTL, &bucket, &settings),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = combd_shards::auth::mint(SECRET, "alice", None, 600, now, (None, None)).unwrap();
    // A owns the object (it wrote alice's first visit); B passes the request on with the
    // token, and A's app sees alice: her second visit, in A's database.
    let r = super::retried(|| whoami(&a, Some(&token)));
    assert_eq!(r.json()["n"], 1, "{}", r.text());
    let r = whoami(&b, Some(&token));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["sub"], "alice");
    assert_eq!(r.json()["n"], 2, "counted by the owner");
    assert_eq!(super::stat(&b, "fleet_forwarded"), 1);
    // Without a token: refused where it arrived, never passed on.
    let forwarded = super::stat(&b, "fleet_forwarded");
    assert_eq!(whoami(&b, None).status, 401);
    assert_eq!(super::stat(&b, "fleet_forwarded"), forwarded);
}

/// `POST /o/caller/<path>` from client address 127.0.3.21, with an `x-request-id` the app
/// declares and a `user-agent` it does not.
fn caller_post(node: &TestNode, path: &str) -> Resp {
    super::support::request_from(
        [127, 0, 3, 21],
        node.public(),
        format!(
            "POST /o/caller/{path} HTTP/1.1\r\nHost: x\r\nX-Request-Id: f-1\r\nUser-Agent: u\r\n\
             Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
}

#[test]
fn a_request_passed_on_tells_the_owners_app_what_the_client_sent() {
    let Some(fleet) = Fleet::start("a_request_passed_on_tells_the_app") else {
        return;
    };
    let settings = [TEST_APPS];
    let bucket = fleet.s3.bucket.endpoint.clone();
    let (a, b) = (
        fleet.node_on(LEASE_TTL, &bucket, &settings),
        fleet.node_on(LEASE_TTL, &bucket, &settings),
    );
    // A owns the object; B passes the request on: A's app sees the client's address (not B's),
    // the path under the object and the declared field, and B's client gets the app's cookie.
    let r = super::retried(|| caller_post(&a, "obj"));
    assert_eq!(r.json()["calls"], 1, "{}", r.text());
    let r = caller_post(&b, "obj/deeper/path");
    assert_eq!(r.status, 200, "{}", r.text());
    let j = r.json();
    assert_eq!(j["calls"], 2, "answered by the owner");
    assert_eq!(j["addr"], "127.0.3.21");
    assert_eq!(j["rest"], "deeper/path");
    assert_eq!(j["headers"], serde_json::json!([["x-request-id", "f-1"]]));
    assert_eq!(
        r.header("set-cookie"),
        Some("seen=1; Path=/; HttpOnly; SameSite=Lax")
    );
    assert_eq!(super::stat(&b, "fleet_forwarded"), 1);
}
