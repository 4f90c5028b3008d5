//! Verified identity against the real node (issue 28, item 1): an identified app (`whoami`, a
//! test app) is reached only with a valid token (a JWT signed with `COMBD_AUTH_JWT_KEY_FILE`),
//! checked in the node before the request reaches the app or the WebSocket is upgraded: no
//! token, another key, an expired token, another audience → 401 with `www-authenticate:
//! Bearer` and no session. A valid token in `Authorization`, the `combd_token` cookie or the
//! subprotocol `combd.bearer.<jwt>` (the 101 answering `combd`) names its client to the app.
//! The key is reloaded on SIGHUP, a bad one keeping the old; `combd token` mints tokens the
//! node takes.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use support::*;

const SECRET: &str = "combd-identity-test-secret-0123456789abcdef";
const AUDIENCE: &str = "combd-test";

use support::auth::{key_file, now};

/// A token for `sub` signed with `secret`, issued at `at`, valid for `ttl` seconds, for
/// `audience`.
fn token(secret: &str, sub: &str, at: u64, ttl: u64, audience: &str) -> String {
    combd_shards::auth::mint(secret, sub, Some("Alice"), ttl, at, (None, Some(audience))).unwrap()
}

fn node_with(file: &Path) -> TestNode {
    TestNode::start(&[
        TEST_APPS,
        ("COMBD_AUTH_JWT_KEY_FILE", file.to_str().unwrap()),
        ("COMBD_AUTH_AUDIENCE", AUDIENCE),
    ])
}

/// `GET path` with `headers` (each `name: value\r\n`).
fn get_with(node: &TestNode, path: &str, headers: &str) -> Resp {
    request(
        node.public(),
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{headers}Connection: close\r\n\r\n").as_bytes(),
    )
}

/// A WebSocket handshake for `/o/whoami/w` with `headers`.
fn upgrade_with(node: &TestNode, headers: &str) -> Resp {
    request(
        node.public(),
        format!(
            "GET /o/whoami/w HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{headers}\r\n"
        )
        .as_bytes(),
    )
}

fn stat(node: &TestNode, name: &str) -> u64 {
    node.stats()[name].as_u64().unwrap()
}

fn assert_401(r: &Resp, challenge: &str) {
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.json()["error"], "unauthorized");
    assert_eq!(r.header("www-authenticate"), Some(challenge));
}

#[test]
fn an_identified_app_is_reached_only_with_a_valid_token_and_sees_its_subject() {
    let file = key_file("main", SECRET);
    let node = node_with(&file);
    let bearer = |t: &str| format!("Authorization: Bearer {t}\r\n");

    // No token, another key, expired (past the leeway), not yet valid, another audience:
    // 401 before the app, and no session for the upgrades.
    assert_401(&get_with(&node, "/o/whoami/a", ""), "Bearer");
    assert_401(&upgrade_with(&node, ""), "Bearer");
    let invalid = "Bearer error=\"invalid_token\"";
    for t in [
        token(&SECRET.replace('0', "1"), "alice", now(), 600, AUDIENCE),
        token(SECRET, "alice", now() - 3600, 60, AUDIENCE),
        token(SECRET, "alice", now(), 600, "another-audience"),
        "not-a-token".to_string(),
    ] {
        assert_401(&get_with(&node, "/o/whoami/a", &bearer(&t)), invalid);
        assert_401(&upgrade_with(&node, &bearer(&t)), invalid);
    }
    assert_eq!(stat(&node, "auth_refused"), 10);
    assert_eq!(
        stat(&node, "sessions"),
        0,
        "no session made for a refused upgrade"
    );
    assert_eq!(stat(&node, "auth_verified"), 0);

    // A valid token, in a header or a cookie: the app sees its subject and name.
    let good = token(SECRET, "alice", now(), 600, AUDIENCE);
    for headers in [
        bearer(&good),
        format!("Cookie: theme=dark; combd_token={good}\r\n"),
    ] {
        let r = get_with(&node, "/o/whoami/a", &headers);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.json(),
            serde_json::json!({ "sub": "alice", "name": "Alice" })
        );
    }

    // A browser's way: the token as a subprotocol beside `combd`; the 101 answers `combd`
    // (never the token) and the attach sees the subject.
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://127.0.0.2:{}/o/whoami/w", node.port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        format!("combd, combd.bearer.{good}").parse().unwrap(),
    );
    let stream: TcpStream = connect(node.public());
    let (mut ws, resp) = tungstenite::client(req, stream).expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    assert_eq!(
        resp.headers().get("sec-websocket-protocol").unwrap(),
        "combd"
    );
    let hello = read_json(&mut ws);
    assert_eq!(hello["t"], "hello");
    assert_eq!(hello["me"], "alice");
    assert_eq!(hello["name"], "Alice");
    assert_eq!(stat(&node, "auth_verified"), 3);

    // A public app takes anyone, a bad token too (it is anyone's request then).
    let r = request(
        node.public(),
        format!(
            "POST /o/counter/c HTTP/1.1\r\nHost: x\r\n{}Content-Length: 0\r\nConnection: close\r\n\r\n",
            bearer("not-a-token")
        )
        .as_bytes(),
    );
    assert_eq!(r.json()["value"], 1);
    assert_eq!(stat(&node, "auth_refused"), 10);
}

#[test]
fn the_key_is_read_again_on_sighup_and_a_bad_one_keeps_the_old() {
    let file = key_file("reload", SECRET);
    let node = node_with(&file);
    let new_secret = SECRET.replace('a', "b");
    let (old, new) = (
        token(SECRET, "alice", now(), 600, AUDIENCE),
        token(&new_secret, "alice", now(), 600, AUDIENCE),
    );
    let ask = |t: &str| {
        get_with(
            &node,
            "/o/whoami/a",
            &format!("Authorization: Bearer {t}\r\n"),
        )
        .status
    };
    assert_eq!((ask(&old), ask(&new)), (200, 401));

    // Waits for a figure the SIGHUP moves (another process's counter: polled).
    let until = |name: &str| {
        let t0 = Instant::now();
        while stat(&node, name) < 1 {
            assert!(t0.elapsed() < Duration::from_secs(10), "{name} never moved");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    std::fs::write(&file, format!("{new_secret}\n")).unwrap();
    node.signal(nix::sys::signal::Signal::SIGHUP);
    until("auth_key_reloads");
    assert_eq!((ask(&old), ask(&new)), (401, 200));

    std::fs::write(&file, "too short\n").unwrap();
    node.signal(nix::sys::signal::Signal::SIGHUP);
    until("auth_key_reload_failures");
    assert_eq!(ask(&new), 200, "the old key kept");
    assert_eq!(stat(&node, "auth_key_reloads"), 1);
}

#[test]
fn combd_token_mints_a_token_the_node_takes() {
    let file = key_file("cli", SECRET);
    let node = node_with(&file);
    let out = run_to_exit(
        std::process::Command::new(env!("CARGO_BIN_EXE_combd"))
            .args(["token", "--sub", "bob", "--name", "Bob", "--ttl", "10m"])
            .env("COMBD_AUTH_JWT_KEY_FILE", &file)
            .env("COMBD_AUTH_AUDIENCE", AUDIENCE),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let minted = String::from_utf8(out.stdout).unwrap();
    let r = get_with(
        &node,
        "/o/whoami/b",
        &format!("Authorization: Bearer {}\r\n", minted.trim()),
    );
    assert_eq!(r.json(), serde_json::json!({ "sub": "bob", "name": "Bob" }));
    // No subject, or a public key file: a usage error and a clear one.
    let out = run_to_exit(
        std::process::Command::new(env!("CARGO_BIN_EXE_combd"))
            .args(["token", "--name", "x"])
            .env("COMBD_AUTH_JWT_KEY_FILE", &file),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sub is required"));
}

#[test]
fn a_missing_or_weak_key_or_a_claim_without_a_key_fails_start_up() {
    let dir = std::env::temp_dir().join(format!("combd-identity-start-{}", std::process::id()));
    let short = key_file("short", "only-sixteen-byt");
    let private = key_file(
        "private",
        "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----",
    );
    for (env, says) in [
        (
            vec![("COMBD_AUTH_JWT_KEY_FILE", "/nonexistent/jwt.key")],
            "COMBD_AUTH_JWT_KEY_FILE: /nonexistent/jwt.key",
        ),
        (
            vec![("COMBD_AUTH_JWT_KEY_FILE", short.to_str().unwrap())],
            "at least 32",
        ),
        (
            vec![("COMBD_AUTH_JWT_KEY_FILE", private.to_str().unwrap())],
            "private key",
        ),
        (
            vec![("COMBD_AUTH_AUDIENCE", "x")],
            "COMBD_AUTH_AUDIENCE: is set but COMBD_AUTH_JWT_KEY_FILE is not",
        ),
    ] {
        let err = refused(&mut combd_command(&dir, &env));
        assert!(err.contains(says), "{env:?}: {err}");
        assert!(!err.contains(SECRET));
    }
}

/// A WebSocket to `/o/whoami/<object>` with `token` as its bearer header.
fn whoami_ws(node: &TestNode, object: &str, token: &str) -> tungstenite::WebSocket<TcpStream> {
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://127.0.0.2:{}/o/whoami/{object}", node.port)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    let (ws, _) = tungstenite::client(req, connect(node.public())).expect("handshake");
    ws
}

#[test]
fn a_session_whose_token_expires_is_closed_3000_and_others_stay() {
    let file = key_file("expiring", SECRET);
    let node = TestNode::start(&[
        TEST_APPS,
        ("COMBD_AUTH_JWT_KEY_FILE", file.to_str().unwrap()),
        ("COMBD_AUTH_AUDIENCE", AUDIENCE),
        ("COMBD_WS_PING_INTERVAL", "200ms"),
    ]);
    // Expired 28 s ago: within the 30 s leeway at the upgrade, past it two seconds later.
    let leeway = combd_kernel::limits::AUTH_LEEWAY_SECONDS;
    let expiring = token(SECRET, "alice", now() - 100, 100 - (leeway - 2), AUDIENCE);
    let lasting = token(SECRET, "bob", now(), 600, AUDIENCE);
    let mut alice = whoami_ws(&node, "e", &expiring);
    let mut bob = whoami_ws(&node, "e", &lasting);
    assert_eq!(read_json(&mut alice)["me"], "alice");
    assert_eq!(read_json(&mut bob)["me"], "bob");
    // Both read (answering the node's pings) until alice's session is closed.
    for ws in [&mut alice, &mut bob] {
        ws.get_mut()
            .set_read_timeout(Some(std::time::Duration::from_millis(50)))
            .unwrap();
    }
    let waiting = Instant::now();
    let close = loop {
        assert!(waiting.elapsed() < WAIT, "timed out waiting for the close");
        match alice.read() {
            Ok(tungstenite::Message::Close(frame)) => break frame.unwrap(),
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        match bob.read() {
            Ok(tungstenite::Message::Close(_)) => panic!("bob's session was closed"),
            Ok(_) => {}
            Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    };
    bob.get_mut().set_read_timeout(Some(WAIT)).unwrap();
    assert_eq!(u16::from(close.code), 3000);
    assert_eq!(close.reason, "token expired");
    assert_eq!(stat(&node, "auth_expired_closed"), 1);
    // Bob's session, with a token that lasts, is still served.
    bob.send(tungstenite::Message::text("hi")).unwrap();
    assert_eq!(read_json(&mut bob)["t"], "seen");
}

/// Issue 40, item 3: a token is verified once a shard and then answered from the shard's cache
/// (`auth_cache_hits`, `auth_cache_misses`), until its `exp` and the leeway: past them it is
/// refused, from the cache, without a second check. One keep-alive connection, so one shard.
#[test]
fn a_token_used_twice_is_verified_once_and_refused_from_the_cache_past_its_exp() {
    use std::io::{BufReader, Write};
    let file = key_file("cache", SECRET);
    let node = node_with(&file);
    assert_eq!(
        node.stats()["limits"]["auth_token_cache_entries"],
        combd_kernel::limits::AUTH_TOKEN_CACHE_ENTRIES as u64
    );
    let conn = connect(node.public());
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut ask = |t: &str| {
        (&conn)
            .write_all(
                format!("GET /o/whoami/a HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {t}\r\n\r\n")
                    .as_bytes(),
            )
            .unwrap();
        read_response(&mut reader)
    };
    let cache = |node: &TestNode| {
        (
            stat(node, "auth_cache_hits"),
            stat(node, "auth_cache_misses"),
        )
    };

    let good = token(SECRET, "alice", now(), 600, AUDIENCE);
    assert_eq!(ask(&good).status, 200);
    assert_eq!(ask(&good).status, 200);
    assert_eq!(cache(&node), (1, 1), "the second time from the cache");
    assert_eq!(stat(&node, "auth_verified"), 2);

    // A token good for three seconds more (its exp within the leeway), used twice, then
    // again once the clock passes its exp and the leeway.
    let leeway = combd_kernel::limits::AUTH_LEEWAY_SECONDS;
    let issued = now() - 60;
    let exp = now() - leeway + 3;
    let short = token(SECRET, "bob", issued, exp - issued, AUDIENCE);
    assert_eq!(ask(&short).status, 200);
    assert_eq!(ask(&short).status, 200);
    assert_eq!(cache(&node), (2, 2));
    // Waits for the wall clock itself (the node reads the same one).
    while now() <= exp + leeway {
        std::thread::sleep(Duration::from_millis(50));
    }
    for _ in 0..2 {
        let r = ask(&short);
        assert_eq!(r.status, 401, "{}", r.text());
        assert_eq!(
            r.header("www-authenticate"),
            Some("Bearer error=\"invalid_token\"")
        );
    }
    assert_eq!(
        cache(&node),
        (4, 2),
        "refused from the cache, not checked again"
    );
    assert_eq!(stat(&node, "auth_refused"), 2);
    assert_eq!(ask(&good).status, 200, "the connection goes on");
}

/// A token is for every app of the node when its `aud` names the node, and for the apps it
/// names as `<audience>/<app>` only: a token for one app is not one for all. `combd token
/// --app` mints one.
#[test]
fn a_token_for_one_app_is_not_a_token_for_all() {
    let file = key_file("per-app", SECRET);
    let node = node_with(&file);
    let bearer = |t: &str| format!("Authorization: Bearer {t}\r\n");
    let all = token(SECRET, "alice", now(), 600, AUDIENCE);
    let whoami = token(SECRET, "alice", now(), 600, &format!("{AUDIENCE}/whoami"));
    let chat = token(SECRET, "alice", now(), 600, &format!("{AUDIENCE}/chat"));
    assert_eq!(get_with(&node, "/o/whoami/p", &bearer(&all)).status, 200);
    assert_eq!(get_with(&node, "/o/whoami/p", &bearer(&whoami)).status, 200);
    let refused = get_with(&node, "/o/whoami/p", &bearer(&chat));
    assert_401(&refused, "Bearer error=\"invalid_token\"");
    // The WebSocket's upgrade the same way.
    assert_eq!(upgrade_with(&node, &bearer(&chat)).status, 401);
    assert_eq!(upgrade_with(&node, &bearer(&whoami)).status, 101);
    // `combd token --app whoami` is such a token; without an audience `--app` says why not.
    let out = run_to_exit(
        std::process::Command::new(env!("CARGO_BIN_EXE_combd"))
            .args(["token", "--sub", "bob", "--app", "chat"])
            .env("COMBD_AUTH_JWT_KEY_FILE", &file)
            .env("COMBD_AUTH_AUDIENCE", AUDIENCE),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let minted = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        get_with(&node, "/o/whoami/p", &bearer(minted.trim())).status,
        401
    );
    let out = run_to_exit(
        std::process::Command::new(env!("CARGO_BIN_EXE_combd"))
            .args(["token", "--sub", "bob", "--app", "chat"])
            .env("COMBD_AUTH_JWT_KEY_FILE", &file)
            .env_remove("COMBD_AUTH_AUDIENCE"),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--app needs COMBD_AUTH_AUDIENCE"));
}
