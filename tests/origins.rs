//! The `Origin` policy (`COMBD_ALLOWED_ORIGINS`) against the real node: a page of another site
//! can neither open a WebSocket in its visitor's name (cross-site WebSocket hijacking: the
//! handshake is not subject to CORS, and the browser sends the visitor's cookies with it) nor
//! change state with a `POST`; a page of the node's own host, a listed origin and a client that
//! sends no `Origin` can. A refusal is `403 {"error":"origin not allowed"}`, counted in
//! `origin_refused`, before any session or object exists.

#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;

use support::*;

/// A WebSocket handshake for `/o/echo/o` with `origin` (if any), as a browser writes it.
fn upgrade(node: &TestNode, origin: Option<&str>) -> Resp {
    let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
    request(
        node.public(),
        format!(
            "GET /o/echo/o HTTP/1.1\r\nHost: 127.0.0.2:{}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{origin}\r\n",
            node.port
        )
        .as_bytes(),
    )
}

/// `POST /o/counter/c` with `origin` (if any).
fn post_counter(node: &TestNode, origin: Option<&str>) -> Resp {
    let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
    request(
        node.public(),
        format!(
            "POST /o/counter/c HTTP/1.1\r\nHost: 127.0.0.2:{}\r\n{origin}Content-Length: 0\r\n\
             Connection: close\r\n\r\n",
            node.port
        )
        .as_bytes(),
    )
}

fn stat(node: &TestNode, name: &str) -> u64 {
    node.stats()[name].as_u64().unwrap()
}

fn assert_refused(r: &Resp) {
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(r.json()["error"], "origin not allowed");
}

/// A real client (tungstenite) opening `/o/echo/<name>` with `Origin: origin`; echoes a message.
fn echo_with_origin(node: &TestNode, origin: &str) {
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://127.0.0.2:{}/o/echo/real", node.port)
        .into_client_request()
        .unwrap();
    req.headers_mut().insert("origin", origin.parse().unwrap());
    let stream: TcpStream = connect(node.public());
    let (mut ws, resp) = tungstenite::client(req, stream).expect("websocket handshake");
    assert_eq!(resp.status(), 101);
    ws.send(tungstenite::Message::text("hi")).unwrap();
    loop {
        match ws.read().unwrap() {
            tungstenite::Message::Text(t) => {
                assert_eq!(t.as_str(), "hi");
                break;
            }
            tungstenite::Message::Ping(_) | tungstenite::Message::Pong(_) => {}
            m => panic!("{m:?}"),
        }
    }
}

#[test]
fn by_default_only_pages_of_the_requests_own_host_may_upgrade_or_write() {
    let node = TestNode::start(&[]);
    let own = format!("http://127.0.0.2:{}", node.port);

    // Not a browser (no Origin), and a page the node served: the upgrade is answered.
    assert_eq!(upgrade(&node, None).status, 101);
    assert_eq!(upgrade(&node, Some(&own)).status, 101);
    echo_with_origin(&node, &own);
    assert_eq!(stat(&node, "origin_refused"), 0);

    // Another site's page, the same host on another port, a name that only begins with the
    // host, and a sandboxed frame: 403, no WebSocket.
    for foreign in [
        "http://evil.example".to_string(),
        format!("http://127.0.0.2:{}", node.port + 1),
        format!("https://127.0.0.2.evil.example:{}", node.port),
        "null".to_string(),
    ] {
        assert_refused(&upgrade(&node, Some(&foreign)));
    }
    assert_eq!(stat(&node, "origin_refused"), 4);

    // A POST from another site's page changes nothing; one from the node's own page and one
    // with no Origin do. A GET (a read, which CORS keeps from the page) is answered.
    assert_refused(&post_counter(&node, Some("https://evil.example")));
    assert_eq!(post_counter(&node, Some(&own)).json()["value"], 1);
    assert_eq!(post_counter(&node, None).json()["value"], 2);
    let read = request(
        node.public(),
        b"GET /o/counter/c HTTP/1.1\r\nHost: x\r\nOrigin: https://evil.example\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(read.json()["value"], 2, "the refused POST wrote nothing");
    assert_eq!(stat(&node, "origin_refused"), 5);
    // Shown with the other refusals in /metrics.
    let metrics = request(
        node.local(),
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .text();
    assert!(
        metrics.contains("combd_origin_refused_total{shard="),
        "{metrics}"
    );
}

#[test]
fn listed_origins_may_upgrade_and_star_allows_any() {
    let node = TestNode::start(&[(
        "COMBD_ALLOWED_ORIGINS",
        "https://app.example, http://localhost:3000",
    )]);
    assert_eq!(upgrade(&node, Some("https://app.example")).status, 101);
    assert_eq!(upgrade(&node, Some("https://APP.example:443")).status, 101);
    assert_eq!(upgrade(&node, Some("http://localhost:3000")).status, 101);
    echo_with_origin(&node, "https://app.example");
    let own = format!("http://127.0.0.2:{}", node.port);
    assert_eq!(upgrade(&node, Some(&own)).status, 101, "its own host still");
    assert_refused(&upgrade(&node, Some("http://app.example")));
    assert_refused(&upgrade(&node, Some("http://localhost:3001")));
    assert_refused(&post_counter(&node, Some("https://evil.example")));
    assert_eq!(
        post_counter(&node, Some("https://app.example")).json()["value"],
        1
    );
    assert_eq!(stat(&node, "origin_refused"), 3);

    let open = TestNode::start(&[("COMBD_ALLOWED_ORIGINS", "*")]);
    assert_eq!(upgrade(&open, Some("https://evil.example")).status, 101);
    assert_eq!(upgrade(&open, Some("null")).status, 101);
    assert_eq!(stat(&open, "origin_refused"), 0);
}

#[test]
fn an_invalid_origin_list_fails_start_up_naming_the_setting() {
    let dir = std::env::temp_dir().join(format!("combd-origins-{}", std::process::id()));
    for bad in [
        "",
        "app.example",
        "https://app.example/",
        "https://a.example,*",
    ] {
        let err = refused(&mut combd_command(&dir, &[("COMBD_ALLOWED_ORIGINS", bad)]));
        assert!(
            err.starts_with("combd: COMBD_ALLOWED_ORIGINS: "),
            "{bad:?}: {err}"
        );
    }
}
