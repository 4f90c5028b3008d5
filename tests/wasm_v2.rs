//! ABI v2 of app modules (issue 28, item 3), against the real node: a module reads what the node
//! saw of its caller (`input` parts 5 to 8: the client's address, its `Origin`, the path under
//! the object, the header fields it declared with `headers()`; part 9, the object's name), declares a CORS policy with
//! `cors()`, and sets its answer's content type and header fields (`content_type`, `header`;
//! a field an app may not set is refused with -1). A v1 module (none of these) keeps working:
//! every other test of `tests/wasm.rs` runs one.

#![allow(clippy::unwrap_used)]

mod support;

use support::*;

/// A v2 module: its answer is parts 5, 6, 7, 8 and 9 of its input, each followed by `|`, then
/// what `header` answered for `transfer-encoding` (`0` for -1); as plain text with a cookie.
fn v2(headers: &str, cors: &str) -> String {
    format!(
        r#"(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (import "combd" "content_type" (func $ct (param i32 i32) (result i32)))
  (import "combd" "header" (func $header (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "{headers}\00")
  (data (i32.const 32768) "{cors}\00")
  (data (i32.const 1024) "text/plain; charset=utf-8")
  (data (i32.const 1056) "set-cookie")
  (data (i32.const 1072) "m=1; Path=/")
  (data (i32.const 1088) "transfer-encoding")
  (data (i32.const 1120) "chunked")
  (func (export "headers") (result i32) (i32.const 16))
  (func (export "cors") (result i32) (i32.const 32768))
  (func $part (param $p i32) (param $at i32) (result i32)
    (local $n i32)
    (local.set $n (call $input (local.get $p) (local.get $at) (i32.const 1024)))
    (if (i32.lt_s (local.get $n) (i32.const 0)) (then (local.set $n (i32.const 0))))
    (i32.store8 (i32.add (local.get $at) (local.get $n)) (i32.const 124))
    (i32.add (i32.add (local.get $at) (local.get $n)) (i32.const 1)))
  (func (export "handle") (result i32)
    (local $at i32)
    (local.set $at (call $part (i32.const 5) (i32.const 4096)))
    (local.set $at (call $part (i32.const 6) (local.get $at)))
    (local.set $at (call $part (i32.const 7) (local.get $at)))
    (local.set $at (call $part (i32.const 8) (local.get $at)))
    (local.set $at (call $part (i32.const 9) (local.get $at)))
    (i32.store8 (local.get $at)
      (i32.add (i32.const 49)
        (call $header (i32.const 1088) (i32.const 17) (i32.const 1120) (i32.const 7))))
    (local.set $at (i32.add (local.get $at) (i32.const 1)))
    (drop (call $ct (i32.const 1024) (i32.const 25)))
    (drop (call $header (i32.const 1056) (i32.const 10) (i32.const 1072) (i32.const 11)))
    (call $respond (i32.const 200) (i32.const 4096) (i32.sub (local.get $at) (i32.const 4096)))
    (i32.const 0)))"#
    )
}

#[test]
fn a_module_reads_its_caller_sets_its_answer_and_declares_cors() {
    let dir = apps_dir(&[(
        "v2.wat",
        &v2("X-Request-Id, accept-language", "http://pages.example"),
    )]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    let r = request_from(
        [127, 0, 3, 11],
        node.public(),
        b"POST /o/v2/a/rest/x HTTP/1.1\r\nHost: x\r\nOrigin: http://pages.example\r\n\
          X-Request-Id: r-1\r\nUser-Agent: u\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.text(),
        "127.0.3.11|http://pages.example|rest/x|x-request-id: r-1\n|a|0",
        "parts 5 to 9, and `header` refusing transfer-encoding"
    );
    assert_eq!(r.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(r.header("set-cookie"), Some("m=1; Path=/"));
    assert_eq!(r.header("transfer-encoding"), None);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("http://pages.example")
    );
    // Its CORS policy: another origin's preflight and POST are refused.
    let r = request(
        node.public(),
        b"OPTIONS /o/v2/a HTTP/1.1\r\nHost: x\r\nOrigin: http://evil.example\r\n\
          Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 403);
    let r = request(
        node.public(),
        b"OPTIONS /o/v2/a HTTP/1.1\r\nHost: x\r\nOrigin: http://pages.example\r\n\
          Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: accept-language\r\n\
          Connection: close\r\n\r\n",
    );
    assert_eq!(r.status, 204);
    assert_eq!(
        r.header("access-control-allow-headers"),
        Some("accept-language")
    );
    // Without an Origin or a rest, those parts are absent (-1): empty here.
    let r = request_from(
        [127, 0, 3, 11],
        node.public(),
        b"GET /o/v2/b HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.text(), "127.0.3.11||||b|0");
}

#[test]
fn a_modules_bad_declarations_stop_the_start() {
    let (stderr, _) = refused_with(&[("v2.wat", &v2("bad name", "*"))]);
    assert!(stderr.contains("headers() names \"bad name\""), "{stderr}");
    let (stderr, _) = refused_with(&[("v2.wat", &v2("a", "http://x.example/path"))]);
    assert!(stderr.contains("cors() names"), "{stderr}");
    let many: Vec<String> = (0..17).map(|i| format!("h{i}")).collect();
    let (stderr, _) = refused_with(&[("v2.wat", &v2(&many.join(","), "*"))]);
    assert!(stderr.contains("app_headers_max"), "{stderr}");
    // At most app_cors_origins_max origins: 64 load, 65 stop the start.
    let origins =
        |n: usize| -> Vec<String> { (0..n).map(|i| format!("https://o{i}.example")).collect() };
    let (stderr, _) = refused_with(&[("v2.wat", &v2("a", &origins(65).join(",")))]);
    assert!(stderr.contains("app_cors_origins_max"), "{stderr}");
    let dir = apps_dir(&[("v2.wat", &v2("a", &origins(64).join(",")))]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    assert_eq!(node.stats()["apps"]["v2"]["kind"], "wasm");
}

/// A module that sets an alarm due now on each request, and whose alarm handler succeeds only
/// if it is handed the alarm (kind 5) with its payload `ping`, its id and how late it is.
const ALARMS: &str = r#"(module
  (import "combd" "kind" (func $kind (result i32)))
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (import "combd" "set_alarm" (func $set (param i64 i32 i32) (result i64)))
  (import "combd" "alarm_id" (func $id (result i64)))
  (import "combd" "alarm_late_ms" (func $late (result i64)))
  (memory (export "memory") 1)
  (data (i32.const 300) "ping")
  (func (export "handle") (result i32)
    (if (i32.eq (call $kind) (i32.const 5))
      (then
        (if (i32.ne (call $input (i32.const 0) (i32.const 1024) (i32.const 16)) (i32.const 4))
          (then (return (i32.const 7))))
        (if (i32.ne (i32.load8_u (i32.const 1024)) (i32.const 112)) (then (return (i32.const 7))))
        (if (i64.lt_s (call $id) (i64.const 1)) (then (return (i32.const 7))))
        (if (i64.lt_s (call $late) (i64.const 0)) (then (return (i32.const 7))))
        (return (i32.const 0))))
    (drop (call $set (i64.const 0) (i32.const 300) (i32.const 4)))
    (call $respond (i32.const 200) (i32.const 300) (i32.const 4))
    (i32.const 0)))"#;

#[test]
fn a_module_sets_an_alarm_and_is_handed_it() {
    let dir = apps_dir(&[("alarms.wat", ALARMS)]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    let r = post(&node, "/o/alarms/a", "");
    assert_eq!(r.status, 200, "{}", r.text());
    // The index forgets a fired alarm after its handler committed (fired counts then): both
    // are waited for.
    let s = wait_stats(&node, "the module's alarm fired and settled", |s| {
        s["alarms_fired"] == 1 && s["alarms_pending"] == 0
    });
    assert_eq!(s["alarms_failed"], 0, "the handler saw its alarm");
}

/// An identified module that any page may call (`cors()` answers `*`: without cookies), and
/// answers its client's subject.
const ANY_PAGE: &str = r#"(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 512) "*\00")
  (func (export "identified") (result i32) (i32.const 1))
  (func (export "cors") (result i32) (i32.const 512))
  (func (export "handle") (result i32)
    (call $respond (i32.const 200) (i32.const 0)
      (call $input (i32.const 3) (i32.const 0) (i32.const 256)))
    (i32.const 0)))"#;

#[test]
fn a_page_let_in_without_cookies_does_not_act_with_the_token_cookie() {
    const SECRET: &str = "combd-wasm-v2-cors-secret-0123456789abcdef";
    let dir = apps_dir(&[("anypage.wat", ANY_PAGE)]);
    let key = support::auth::key_file("v2-cors", SECRET);
    let node = TestNode::start(&[
        ("COMBD_APPS_DIR", dir.to_str().unwrap()),
        ("COMBD_AUTH_JWT_KEY_FILE", key.to_str().unwrap()),
    ]);
    let token = support::auth::token(SECRET, "alice", None);
    let ask = |headers: &str| {
        request(
            node.public(),
            format!(
                "POST /o/anypage/a HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
    };
    // Its own page (no Origin) acts with the cookie; another site's page, let in by `*`, does
    // not (a cross-site request forged with the user's cookie); with the token in a header it
    // does (a page can only send it on purpose).
    let cookie = format!("Cookie: combd_token={token}\r\n");
    assert_eq!(ask(&cookie).text(), "alice");
    let r = ask(&format!("Origin: http://evil.example\r\n{cookie}"));
    assert_eq!(r.status, 401, "{}", r.text());
    let r = ask(&format!(
        "Origin: http://evil.example\r\nAuthorization: Bearer {token}\r\n"
    ));
    assert_eq!((r.status, r.text()), (200, "alice".to_string()));
}

/// A module never sees the client's credentials (issue 40: one declaring `authorization,
/// cookie` read the raw bearer token and the `combd_token` cookie, and the token opened the
/// identified apps as its user): declaring `authorization`, `cookie`, `proxy-authorization` or
/// `sec-websocket-protocol` in `headers()` stops the start, naming the field.
#[test]
fn a_module_declaring_the_clients_credentials_is_refused() {
    for field in [
        "authorization",
        "Cookie",
        "proxy-authorization",
        "sec-websocket-protocol",
    ] {
        let declared = format!("x-request-id, {field}");
        let (stderr, _) = refused_with(&[("v2.wat", &v2(&declared, "*"))]);
        let named = format!("headers() names {:?}", field.to_ascii_lowercase());
        assert!(
            stderr.contains(&named) && stderr.contains("never hands an app"),
            "{stderr}"
        );
    }
}

/// A module that keeps presence (`presence()` answers 1): it tells a session attaching whether
/// it resumed (`input` part 12) and who its client is (part 3), answers a message with its
/// sender's subject (part 3 of a message), and answers a `GET` with its topic's members
/// (`presence`), or with `?<sub>` where that user is (`user`; 404 for one never seen).
const PRESENCE_MODULE: &str = r#"(module
  (import "combd" "kind" (func $kind (result i32)))
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "send" (func $send (param i32 i64 i32 i32) (result i32)))
  (import "combd" "session_shard" (func $shard (result i32)))
  (import "combd" "session_id" (func $sid (result i64)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (import "combd" "presence" (func $presence (param i32 i32 i32 i32) (result i32)))
  (import "combd" "user" (func $user (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "resumed=")
  (data (i32.const 120) ",sub=")
  (data (i32.const 140) "from=")
  (func (export "presence") (result i32) (i32.const 1))
  (func $append (param $part i32) (param $at i32) (result i32)
    (local $n i32)
    (local.set $n (call $input (local.get $part) (local.get $at) (i32.const 256)))
    (if (i32.lt_s (local.get $n) (i32.const 0)) (then (local.set $n (i32.const 0))))
    (i32.add (local.get $at) (local.get $n)))
  (func (export "handle") (result i32)
    (local $k i32) (local $n i32) (local $at i32)
    (local.set $k (call $kind))
    (if (i32.eq (local.get $k) (i32.const 3)) (then
      (memory.copy (i32.const 4096) (i32.const 100) (i32.const 8))
      (local.set $at (call $append (i32.const 12) (i32.const 4104)))
      (memory.copy (local.get $at) (i32.const 120) (i32.const 5))
      (local.set $at (call $append (i32.const 3) (i32.add (local.get $at) (i32.const 5))))
      (drop (call $send (call $shard) (call $sid) (i32.const 4096)
        (i32.sub (local.get $at) (i32.const 4096))))
      (return (i32.const 0))))
    (if (i32.eq (local.get $k) (i32.const 1)) (then
      (memory.copy (i32.const 4096) (i32.const 140) (i32.const 5))
      (local.set $at (call $append (i32.const 3) (i32.const 4101)))
      (drop (call $send (call $shard) (call $sid) (i32.const 4096)
        (i32.sub (local.get $at) (i32.const 4096))))
      (return (i32.const 0))))
    (if (i32.eq (local.get $k) (i32.const 0)) (then
      (local.set $n (call $input (i32.const 1) (i32.const 2048) (i32.const 256)))
      (if (i32.gt_s (local.get $n) (i32.const 0))
        (then (local.set $n
          (call $user (i32.const 2048) (local.get $n) (i32.const 8192) (i32.const 32768))))
        (else (local.set $n
          (call $presence (i32.const 0) (i32.const 0) (i32.const 8192) (i32.const 32768)))))
      (if (i32.lt_s (local.get $n) (i32.const 0))
        (then (call $respond (i32.const 404) (i32.const 0) (i32.const 0)))
        (else (call $respond (i32.const 200) (i32.const 8192) (local.get $n))))))
    (i32.const 0)))"#;

#[test]
fn a_module_keeps_presence_knows_a_resume_and_who_sent_a_message() {
    const SECRET: &str = "combd-wasm-presence-secret-0123456789abcdef";
    let key = support::auth::key_file("wasm-presence", SECRET);
    let dir = apps_dir(&[("pres.wat", PRESENCE_MODULE)]);
    let node = TestNode::start(&[
        ("COMBD_APPS_DIR", dir.to_str().unwrap()),
        ("COMBD_AUTH_JWT_KEY_FILE", key.to_str().unwrap()),
    ]);
    let open = |after: &str| {
        let token = support::auth::token(SECRET, "alice", Some("Alice"));
        support::auth::open_ws_with(&node, &format!("/o/pres/r?combd_after={after}"), &token)
    };
    // Its messages, headed as a numbered session's are, until the members came.
    let until_members = |ws: &mut tungstenite::WebSocket<std::net::TcpStream>| {
        let mut got = Vec::new();
        loop {
            let text = ws.read().unwrap().into_text().unwrap().as_str().to_string();
            // A change may come first (the client drops it): the members end the wait.
            let members = text.starts_with("!presence|{\"members\"");
            got.push(text);
            if members {
                return got;
            }
        }
    };
    let mut ws = open("new");
    let got = until_members(&mut ws);
    assert!(got.contains(&"|resumed=0,sub=alice".to_string()), "{got:?}");
    let members: serde_json::Value =
        serde_json::from_str(got.last().unwrap().strip_prefix("!presence|").unwrap()).unwrap();
    assert_eq!(members["members"][0]["who"], "alice", "{members}");
    ws.send(tungstenite::Message::text("hi")).unwrap();
    let from = ws.read().unwrap().into_text().unwrap();
    assert_eq!(
        from.as_str(),
        "|from=alice",
        "a message carries its session's client"
    );
    // The module reads its topic's members, and where a user is.
    let r = get(&node, "/o/pres/r");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["members"][0]["devices"], 1, "{}", r.text());
    let r = get(&node, "/o/pres/r?alice");
    assert_eq!(r.json()["places"][0]["object"], "r", "{}", r.text());
    assert_eq!(r.json()["last_seen"], serde_json::Value::Null);
    assert_eq!(get(&node, "/o/pres/r?bob").status, 404);
    // A second device of alice that resumes from before the log began is told it resumed.
    let mut again = open("0.0");
    let got = until_members(&mut again);
    assert!(got.contains(&"|resumed=1,sub=alice".to_string()), "{got:?}");
    assert!(got.iter().any(|t| t.ends_with("|resumed")), "{got:?}");
}

/// A module that keeps `retention` of its topics' logs (`log_retention()`): a `POST` writes a
/// row and broadcasts its body to the object's topic.
fn short(retention: &str) -> String {
    format!(
        r#"(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "kind" (func $kind (result i32)))
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (import "combd" "broadcast" (func $broadcast (param i32 i32 i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "{retention}\00")
  (data (i32.const 256) "CREATE TABLE IF NOT EXISTS t (x INTEGER);\00")
  (data (i32.const 512) "INSERT INTO t VALUES (1)")
  (data (i32.const 600) "{{}}")
  (func (export "log_retention") (result i32) (i32.const 16))
  (func (export "schema") (result i32) (i32.const 256))
  (func (export "handle") (result i32)
    (local $n i32)
    (if (i32.eqz (call $kind)) (then
      (drop (call $sql (i32.const 512) (i32.const 24)))
      (local.set $n (call $input (i32.const 0) (i32.const 4096) (i32.const 1024)))
      (drop (call $broadcast (i32.const 0) (i32.const 0) (i32.const 4096) (local.get $n)))
      (call $respond (i32.const 200) (i32.const 600) (i32.const 2))))
    (i32.const 0)))"#
    )
}

#[test]
fn a_module_keeps_its_own_log_retention_and_a_bad_one_stops_the_start() {
    for (bad, says) in [
        ("frames=0", "it must be 1 to 2000 (topic_log_frames)"),
        ("frames=5000", "it must be 1 to 2000 (topic_log_frames)"),
        ("age_ms=x", "expected frames=, bytes= or age_ms="),
        ("colour=1", "expected frames=, bytes= or age_ms="),
    ] {
        let (stderr, _) = refused_with(&[("short.wat", &short(bad))]);
        assert!(
            stderr.contains("log_retention()") && stderr.contains(says),
            "{bad}: {stderr}"
        );
    }
    let dir = apps_dir(&[("short.wat", &short("frames=3, age_ms=60000"))]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    let say = |n: u32| {
        for i in 0..n {
            let r = post(&node, "/o/short/s", &format!("line {i}"));
            assert_eq!(r.status, 200, "{}", r.text());
        }
    };
    // The position a viewer of `after` is told first.
    let position = |after: &str| {
        let mut ws = open_ws(&node, &format!("/o/short/s?combd_after={after}"));
        loop {
            if let tungstenite::Message::Text(t) = ws.read().unwrap() {
                if t.as_str().starts_with('!') {
                    return t.as_str().to_string();
                }
            }
        }
    };
    say(1);
    let first = position("new");
    let epoch = first[1..].split('.').next().unwrap().to_string();
    assert_eq!(first, format!("!{epoch}.1|new"));
    say(2);
    assert_eq!(
        position(&format!("{epoch}.1")),
        format!("!{epoch}.3|resumed")
    );
    // Four more: the log keeps 3, so frame 4 is gone for a viewer at 3.
    say(4);
    assert_eq!(
        position(&format!("{epoch}.3")),
        format!("!{epoch}.7|snapshot")
    );
    assert_eq!(
        position(&format!("{epoch}.5")),
        format!("!{epoch}.7|resumed")
    );
}

/// A module that deletes its object on `DELETE` (`delete()`), and writes a row on any other
/// request.
const GONE: &str = r#"(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (import "combd" "delete" (func $delete (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 256) "CREATE TABLE IF NOT EXISTS t (x INTEGER);\00")
  (data (i32.const 512) "INSERT INTO t VALUES (1)")
  (data (i32.const 600) "{}")
  (func (export "schema") (result i32) (i32.const 256))
  (func (export "handle") (result i32)
    (if (i32.eq (call $input (i32.const 2) (i32.const 4096) (i32.const 16)) (i32.const 6))
      (then (drop (call $delete)))
      (else (drop (call $sql (i32.const 512) (i32.const 24)))))
    (call $respond (i32.const 200) (i32.const 600) (i32.const 2))
    (i32.const 0)))"#;

#[test]
fn a_module_deletes_its_object() {
    let dir = apps_dir(&[("gone.wat", GONE)]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    for _ in 0..2 {
        assert_eq!(post(&node, "/o/gone/x", "").status, 200);
    }
    let db = node.data_dir.join("objects/gone/x.sqlite");
    assert!(db.exists());
    let r = request(
        node.public(),
        b"DELETE /o/gone/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    wait_stats(&node, "the module's object deleted", |s| {
        s["objects_deleted"] == 1
    });
    assert!(!db.exists());
    assert_eq!(post(&node, "/o/gone/x", "").status, 200);
    let shown = request(
        node.local(),
        b"GET /objects/gone/x HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .json();
    let rows = shown["tables"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "t")
        .map(|t| t["rows"].clone());
    assert_eq!(rows, Some(1.into()), "a new object, one row: {shown}");
}
