//! A WebSocket (plain and over TLS) asked of a node that does not own its object reaches the
//! owner whole, passed through.

use tungstenite::{Message, WebSocket};

use super::support::*;
use super::*;

pub(super) fn open_ws(
    node: &TestNode,
    object: &str,
) -> Result<WebSocket<std::net::TcpStream>, String> {
    let url = format!("ws://127.0.0.2:{}/o/counter/{object}", node.port);
    let stream = connect(node.public());
    stream.set_read_timeout(Some(WAIT)).unwrap();
    match tungstenite::client(url.as_str(), stream) {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::HandshakeError::Failure(tungstenite::Error::Http(resp))) => Err(format!(
            "{} {}",
            resp.status().as_u16(),
            String::from_utf8_lossy(resp.body().as_deref().unwrap_or_default())
        )),
        Err(e) => panic!("websocket handshake: {e}"),
    }
}

/// Closes a WebSocket that `via` passes through to `owner`, and waits until both let go.
fn close_passed_through<S: std::io::Read + std::io::Write>(
    mut ws: WebSocket<S>,
    via: &TestNode,
    owner: &TestNode,
) {
    ws.close(None).unwrap();
    while ws.read().is_ok() {}
    drop(ws);
    wait_stats(via, "the pass-through to end", |s| {
        s["fleet_ws_passing"] == 0
    });
    wait_stats(owner, "the owner's session to end", |s| s["sessions"] == 0);
}

/// The counter's value as a session is sent it (it answers any message with the value).
fn ws_value(ws: &mut WebSocket<std::net::TcpStream>) -> u64 {
    ws.send(Message::text("?")).unwrap();
    loop {
        if let Message::Text(t) = ws.read().expect("timed out waiting for a message") {
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            return v["value"].as_u64().unwrap_or_else(|| panic!("{t}"));
        }
    }
}

/// A WebSocket asked of a node that does not own its object is passed through whole to the
/// owner (browsers do not follow redirects on an upgrade): the owner runs the session, the
/// node in between only carries bytes, and its end closes the owner's session too.
#[test]
fn a_websocket_to_a_node_that_does_not_own_the_object_reaches_the_owner() {
    let Some(fleet) = Fleet::start("a_websocket_reaches_the_owner") else {
        return;
    };
    let a = fleet.node();
    let (b, b_at) = fleet.node_and_address();
    for i in 1..=3 {
        assert_eq!(post_acked(&a, "w"), i);
    }
    let mut ws = open_ws(&b, "w").expect("the upgrade passed through to the owner");
    assert_eq!(ws_value(&mut ws), 3);
    // A write on the owner is what the session passed through sees.
    assert_eq!(post_acked(&a, "w"), 4);
    assert_eq!(ws_value(&mut ws), 4);
    assert_eq!(stat(&b, "fleet_ws_passed"), 1);
    assert_eq!(stat(&b, "fleet_ws_passing"), 1);
    assert_eq!(stat(&b, "sessions"), 0, "the session is the owner's");
    assert_eq!(stat(&a, "sessions"), 1);
    // The client's close reaches the owner, and the node in between lets go.
    close_passed_through(ws, &b, &a);

    // An upgrade another node already passed on (signed by it, its fields covered) is not
    // passed on again.
    let fields: [(&str, &[u8]); 4] = [
        ("Upgrade", b"websocket"),
        ("Sec-WebSocket-Version", b"13"),
        ("Sec-WebSocket-Key", b"dGhlIHNhbXBsZSBub25jZQ=="),
        ("Connection", b"Upgrade"),
    ];
    let covered = combd_fleet::forward::covered("", fields);
    let signed = combd_fleet::auth::parse_fleet_key(super::FLEET_KEY)
        .unwrap()
        .sign_for(&b_at, "GET", "/o/counter/w", &covered, b"");
    let r = request(
        b.public(),
        format!(
            "GET /o/counter/w HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             combd-forwarded: 1\r\ncombd-fleet-auth: {signed}\r\n\r\n"
        )
        .as_bytes(),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"], "object owned by another node");

    // The owner gone: 503 while its lease lives (owner unreachable), then B serves it itself,
    // with every acknowledged write.
    drop(a.kill9());
    let killed = Instant::now();
    let r = request(
        b.public(),
        b"GET /o/counter/w HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    );
    // Right after the kill the owner's listening socket may still accept a moment (the
    // kernel tears down its io_uring after the process): refused or reset, the answer is 503.
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.json()["error"], "object owner unreachable");
    let mut ws = loop {
        match open_ws(&b, "w") {
            Ok(ws) => break ws,
            Err(e) => assert!(e.starts_with("503 "), "{e}"),
        }
        assert!(
            killed.elapsed() < MOVE_WITHIN,
            "no WebSocket after {MOVE_WITHIN:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(ws_value(&mut ws), 4);
    assert_eq!(stat(&b, "sessions"), 1);
    assert!(stat(&b, "fleet_ws_pass_failed") >= 1);
}

/// The same through TLS: a WSS session asked of a node that does not own its object is
/// decrypted there and passed through to the owner.
#[test]
fn a_wss_to_a_node_that_does_not_own_the_object_reaches_the_owner() {
    use support::tls::{make_pair, tls_connect_to, write_pair};
    let Some(fleet) = Fleet::start("a_wss_reaches_the_owner") else {
        return;
    };
    let pair = make_pair();
    let dir = fleet_support::temp_dir("tls");
    let (cert, key) = write_pair(&dir, &pair);
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let a = fleet.node();
    let b = fleet.node_on(
        LEASE_TTL,
        &fleet.s3.bucket.endpoint,
        &[
            ("COMBD_TLS_LISTEN", "127.0.0.2:0"),
            ("COMBD_TLS_CERT", &cert),
            ("COMBD_TLS_KEY", &key),
        ],
    );
    for i in 1..=2 {
        assert_eq!(post_acked(&a, "s"), i);
    }
    let tls = tls_connect_to(&b, "127.0.0.2", &pair.der).unwrap();
    let url = format!("ws://localhost:{}/o/counter/s", b.tls_port.unwrap());
    let (mut ws, resp) = tungstenite::client(url.as_str(), tls).unwrap();
    assert_eq!(resp.status(), 101);
    ws.send(Message::text("?")).unwrap();
    let value = loop {
        if let Message::Text(t) = ws.read().unwrap() {
            break serde_json::from_str::<serde_json::Value>(&t).unwrap()["value"].clone();
        }
    };
    assert_eq!(value, 2);
    assert_eq!(stat(&b, "fleet_ws_passed"), 1);
    assert_eq!(stat(&a, "sessions"), 1);
    close_passed_through(ws, &b, &a);
}
