//! What an app is told of its caller and what it may answer (issue 28, item 3), against the
//! real node and the `caller` test app: the client's address, its `Origin`, the path under the
//! object, the request header fields the app declared (bounded); an answer's own content type
//! and header fields, an invalid one failing its call with nothing applied; the app's CORS
//! policy answering preflights and letting its origin's pages call it; session ids that name
//! their node's life, so a send to a session of another life is dropped.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, Write};

use combd_kernel::limits::{APP_HEADERS_MAX, APP_HEADER_VALUE_MAX_BYTES, APP_PATH_REST_MAX_BYTES};
use support::*;

fn node() -> TestNode {
    TestNode::start(&[TEST_APPS])
}

/// `method path` with `headers` (each `name: value\r\n`) from client address 127.0.3.9.
fn ask(node: &TestNode, method: &str, path: &str, headers: &str) -> Resp {
    request_from(
        [127, 0, 3, 9],
        node.public(),
        format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .as_bytes(),
    )
}

fn calls(node: &TestNode) -> i64 {
    let r = ask(node, "GET", "/o/caller/a", "");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["calls"].as_i64().unwrap()
}

#[test]
fn an_app_sees_its_callers_address_origin_path_and_declared_headers() {
    let node = node();
    let r = ask(
        &node,
        "POST",
        "/o/caller/a/files/x%20y.txt?q=1",
        "X-Request-Id: r-17\r\nAuthorization: Bearer tok\r\nAccept-Language: fr\r\n\
         User-Agent: test\r\nCookie: combd_token=tok\r\nProxy-Authorization: Basic eA==\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let j = r.json();
    assert_eq!(j["addr"], "127.0.3.9");
    assert_eq!(j["object"], "a", "the object's own name");
    assert_eq!(j["rest"], "files/x%20y.txt");
    assert_eq!(j["origin"], serde_json::Value::Null);
    // Only the fields it declared, names in lower case, in the order sent; never the client's
    // credentials, though it declares `authorization` and `cookie` (issue 40).
    assert_eq!(
        j["headers"],
        serde_json::json!([["x-request-id", "r-17"], ["accept-language", "fr"]])
    );
    assert_eq!(j["calls"], 1);
    // The object is `a` whatever follows it: the same database.
    let r = ask(&node, "POST", "/o/caller/a", "");
    assert_eq!(r.json()["rest"], serde_json::Value::Null);
    assert_eq!(r.json()["calls"], 2);

    // At most app_headers_max fields, each value at most app_header_value_max_bytes.
    let many: String = (0..APP_HEADERS_MAX + 4)
        .map(|i| format!("X-Request-Id: {i}\r\n"))
        .collect();
    let r = ask(&node, "GET", "/o/caller/a", &many);
    assert_eq!(
        r.json()["headers"].as_array().unwrap().len(),
        APP_HEADERS_MAX
    );
    let long = format!(
        "X-Request-Id: {}\r\nAccept-Language: {}\r\n",
        "v".repeat(APP_HEADER_VALUE_MAX_BYTES + 1),
        "w".repeat(APP_HEADER_VALUE_MAX_BYTES)
    );
    let r = ask(&node, "GET", "/o/caller/a", &long);
    let kept = r.json()["headers"].clone();
    assert_eq!(
        kept.as_array().unwrap().len(),
        1,
        "the long one is left out"
    );
    assert_eq!(kept[0][0], "accept-language");

    // The path under the object: at most app_path_rest_max_bytes.
    let at = format!("/o/caller/a/{}", "p".repeat(APP_PATH_REST_MAX_BYTES));
    assert_eq!(ask(&node, "GET", &at, "").status, 200);
    let past = format!("/o/caller/a/{}", "p".repeat(APP_PATH_REST_MAX_BYTES + 1));
    let r = ask(&node, "GET", &past, "");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("app_path_rest_max_bytes"));
    // An invalid object name is still refused, with or without a rest.
    assert_eq!(ask(&node, "GET", "/o/caller/.x/y", "").status, 400);
}

#[test]
fn an_answer_sets_its_type_and_fields_and_an_invalid_one_applies_nothing() {
    let node = node();
    let r = ask(&node, "POST", "/o/caller/a", "");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("set-cookie"),
        Some("seen=1; Path=/; HttpOnly; SameSite=Lax")
    );
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("content-type"), Some("application/json"));
    let r = ask(
        &node,
        "GET",
        "/o/caller/a?type=text/plain;%20charset=utf-8",
        "",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    let r = ask(&node, "GET", "/o/caller/a?go=/chat/", "");
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("/chat/"));
    assert_eq!(calls(&node), 1);

    // A value that would split the response, a field an app may not set, a content type that
    // is not one: 500, the write rolled back, nothing of it on the wire.
    for bad in ["bad=split", "bad=field", "type=nonsense"] {
        let r = ask(&node, "POST", &format!("/o/caller/a?{bad}"), "");
        assert_eq!(r.status, 500, "{bad}: {}", r.text());
        assert_eq!(r.json()["error"], "the app's answer was invalid");
        assert_eq!(r.header("x-evil"), None);
        assert_eq!(r.header("set-cookie"), None);
    }
    assert_eq!(calls(&node), 1, "an invalid answer applied its call");
}

#[test]
fn the_apps_cors_policy_answers_preflights_and_lets_its_origin_call() {
    let node = node();
    let preflight = |origin: &str, method: &str, path: &str| {
        ask(
            &node,
            "OPTIONS",
            path,
            &format!(
                "Origin: {origin}\r\nAccess-Control-Request-Method: {method}\r\n\
                 Access-Control-Request-Headers: x-request-id, content-type, x-other\r\n"
            ),
        )
    };
    let r = preflight("http://pages.example", "POST", "/o/caller/a");
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://pages.example")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("x-request-id, content-type"),
        "a field the app does not take is not allowed"
    );
    assert!(r
        .header("access-control-allow-methods")
        .unwrap()
        .contains("POST"));
    assert_eq!(r.header("access-control-max-age"), Some("60"));
    assert_eq!(r.header("vary"), Some("origin"));
    // Another origin, a method an object does not take, an app with no policy.
    assert_eq!(
        preflight("http://evil.example", "POST", "/o/caller/a").status,
        403
    );
    assert_eq!(
        preflight("http://pages.example", "TRACE", "/o/caller/a").status,
        405
    );
    assert_eq!(
        preflight("http://pages.example", "POST", "/o/counter/a").status,
        403
    );
    // A preflight carries no token: an identified app's is answered by its policy, not 401.
    assert_eq!(
        preflight("http://pages.example", "POST", "/o/whoami/a").status,
        403
    );

    // Its page may POST (COMBD_ALLOWED_ORIGINS does not list it) and read the answer.
    let r = ask(
        &node,
        "POST",
        "/o/caller/a",
        "Origin: http://pages.example\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["origin"], "http://pages.example");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://pages.example")
    );
    assert_eq!(r.header("access-control-allow-credentials"), Some("true"));
    // Another site's page may not, here or on an app without a policy.
    let r = ask(
        &node,
        "POST",
        "/o/caller/a",
        "Origin: http://evil.example\r\n",
    );
    assert_eq!(r.status, 403);
    assert_eq!(r.header("access-control-allow-origin"), None);
    let r = ask(
        &node,
        "POST",
        "/o/counter/a",
        "Origin: http://pages.example\r\n",
    );
    assert_eq!(r.status, 403);
    assert_eq!(calls(&node), 1);
    // CORS is not the WebSocket's: its page may not open one (COMBD_ALLOWED_ORIGINS decides).
    let mut s = connect_from([127, 0, 3, 9], node.public());
    s.write_all(
        b"GET /o/caller/a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
          Origin: http://pages.example\r\n\r\n",
    )
    .unwrap();
    assert_eq!(read_response(&mut BufReader::new(s)).status, 403);
}

/// A WebSocket to `/o/caller/<path>` from 127.0.3.9 with `headers` (each `(name, value)`).
fn ws_from(
    node: &TestNode,
    path: &str,
    headers: &[(&'static str, &str)],
) -> tungstenite::WebSocket<std::net::TcpStream> {
    use tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://127.0.0.2:{}/o/caller/{path}", node.port)
        .into_client_request()
        .unwrap();
    for (n, v) in headers {
        req.headers_mut()
            .insert(*n, tungstenite::http::HeaderValue::from_str(v).unwrap());
    }
    let stream = connect_from([127, 0, 3, 9], node.public());
    tungstenite::client(req, stream).expect("handshake").0
}

#[test]
fn a_session_keeps_what_its_upgrade_said_and_its_id_names_the_nodes_life() {
    let node = node();
    // Nor a WebSocket's subprotocols (where a browser's token travels), though it declares them.
    let mut one = ws_from(
        &node,
        "room/left?x=1",
        &[
            ("x-request-id", "w-1"),
            ("sec-websocket-protocol", "combd, combd.bearer.tok"),
            ("cookie", "combd_token=tok"),
        ],
    );
    let hello = read_json(&mut one);
    assert_eq!(hello["t"], "hello");
    assert_eq!(hello["addr"], "127.0.3.9");
    assert_eq!(hello["rest"], "left");
    assert_eq!(
        hello["headers"],
        serde_json::json!([["x-request-id", "w-1"]])
    );
    let life = hello["life"].as_str().unwrap().to_string();
    assert!(hello["session"].as_str().unwrap().contains('.'));
    // A send to this life's session arrives.
    let mut two = ws_from(&node, "room", &[]);
    let hello_two = read_json(&mut two);
    assert_eq!(hello_two["life"], life.as_str(), "one life per node");
    let to_one = format!(
        "to:{life}:{}:{}",
        hello["shard"],
        hello["id"].as_str().unwrap()
    );
    two.send(tungstenite::Message::text(to_one.clone()))
        .unwrap();
    assert_eq!(read_json(&mut one)["t"], "poke");
    assert_eq!(node.stats()["sends_to_other_lives"], 0);
    drop((one, two));

    // After a restart: another life; a send to a session kept from the last one is dropped
    // (counted), whatever session of this life has its shard and number.
    let dir = node.kill9();
    let node = TestNode::start_in(dir, &[TEST_APPS]);
    let mut three = ws_from(&node, "room", &[]);
    let hello_three = read_json(&mut three);
    assert_ne!(hello_three["life"], life.as_str());
    let same_number = format!(
        "to:{life}:{}:{}",
        hello_three["shard"],
        hello_three["id"].as_str().unwrap()
    );
    three.send(tungstenite::Message::text(same_number)).unwrap();
    three.send(tungstenite::Message::text(to_one)).unwrap();
    three.send(tungstenite::Message::text("hi")).unwrap();
    // Messages are handled in order: the answer to the last comes after the two sends.
    assert_eq!(read_json(&mut three)["t"], "seen");
    assert_eq!(node.stats()["sends_to_other_lives"], 2);
}
