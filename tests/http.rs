//! HTTP/1.1 against the real node: routes, keep-alive, pipelining, every error status.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, Write};

use support::*;

#[test]
fn healthz_on_both_listeners_and_stats_only_on_localhost() {
    let node = TestNode::start(&[]);
    let get = |addr, path: &str| {
        request(
            addr,
            format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes(),
        )
    };

    let r = get(node.public(), "/healthz");
    assert_eq!((r.status, r.json()["status"].as_str()), (200, Some("ok")));
    assert_eq!(get(node.local(), "/healthz").status, 200);

    for path in ["/stats", "/metrics"] {
        let r = get(node.public(), path);
        assert_eq!(r.status, 404, "{path} must not be served publicly");
        assert!(r.json()["error"].is_string());
    }

    let stats = node.stats();
    let shards = stats["shards"].as_array().expect("shards array");
    assert!(!shards.is_empty());
    for key in [
        "conns",
        "accepted",
        "requests",
        "ws_open",
        "bytes_in",
        "bytes_out",
    ] {
        assert!(stats[key].is_u64(), "node total {key}");
        for s in shards {
            assert!(s[key].is_u64(), "shard {key}");
        }
    }
    let sum: u64 = shards.iter().map(|s| s["accepted"].as_u64().unwrap()).sum();
    assert_eq!(stats["accepted"].as_u64(), Some(sum));

    let m = get(node.local(), "/metrics");
    assert_eq!(m.status, 200);
    let text = m.text();
    assert!(text.contains("# TYPE combd_requests_total counter"));
    assert!(text.contains("combd_conns{shard=\"0\"}"));
}

#[test]
fn stats_counters_move_with_traffic() {
    let node = TestNode::start(&[]);
    let before = node.stats();
    for _ in 0..5 {
        let r = request(
            node.public(),
            b"POST /o/echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc",
        );
        assert_eq!(r.body, b"abc");
    }
    let after = node.stats();
    let delta = |k: &str| after[k].as_u64().unwrap() - before[k].as_u64().unwrap();
    // Five echo requests plus the first /stats request itself.
    assert!(
        delta("requests") >= 6,
        "requests moved by {}",
        delta("requests")
    );
    assert!(delta("accepted") >= 6);
    assert!(delta("bytes_in") >= 5 * 40);
    assert!(delta("bytes_out") >= 5 * 40);
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection() {
    let node = TestNode::start(&[]);
    let s = connect(node.public());
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    for i in 0..10 {
        let body = format!("req{i}");
        write!(
            w,
            "POST /o/echo/k HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let resp = read_response(&mut r);
        assert_eq!((resp.status, resp.text()), (200, body));
        assert_eq!(resp.header("connection"), None);
    }
    write!(
        w,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let resp = read_response(&mut r);
    assert_eq!(resp.header("connection"), Some("close"));
    assert_closed(&mut r);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let node = TestNode::start(&[]);
    let mut s = connect(node.public());
    let mut all = Vec::new();
    for i in 0..20 {
        let body = format!("p{i}");
        all.extend_from_slice(
            format!(
                "POST /o/echo/p HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        );
        all.extend_from_slice(b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    s.write_all(&all).unwrap();
    let mut r = BufReader::new(s);
    for i in 0..20 {
        let a = read_response(&mut r);
        assert_eq!((a.status, a.text()), (200, format!("p{i}")));
        let b = read_response(&mut r);
        assert_eq!(b.status, 404);
    }
}

/// Pipelined requests for an object reach it together, up to `http_object_pipeline` of a
/// connection at once (the object takes them as one batch), and are answered in order; a
/// `Connection: close` behind them closes only after every answer before it.
#[test]
fn pipelined_object_requests_reach_the_object_together_up_to_the_limit() {
    let node = TestNode::start(&[]);
    let depth = node.stats()["limits"]["http_object_pipeline"]
        .as_u64()
        .expect("http_object_pipeline in /stats limits");
    assert!(depth >= 2, "a depth of {depth} pipelines nothing");
    let n = 3 * depth as usize + 1;
    let post = b"POST /o/counter/p HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    let mut all = Vec::new();
    for _ in 0..n {
        all.extend_from_slice(post);
    }
    all.extend_from_slice(b"GET /o/counter/p HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut s = connect(node.public());
    s.write_all(&all).unwrap();
    let mut r = BufReader::new(s);
    for i in 1..=n {
        let a = read_response(&mut r);
        assert_eq!(
            (a.status, a.json()["value"].as_u64()),
            (200, Some(i as u64))
        );
    }
    let last = read_response(&mut r);
    assert_eq!(
        (last.status, last.json()["value"].as_u64()),
        (200, Some(n as u64))
    );
    assert_eq!(last.header("connection"), Some("close"));
    assert_closed(&mut r);
    // The connection sent the object `depth` requests at a time: batches of more than one,
    // never more than the limit (one client, so nothing else filled the mailbox).
    let batch_max = node.stats()["batch_max"].as_u64().expect("batch_max");
    assert!(
        (2..=depth).contains(&batch_max),
        "largest batch {batch_max}, limit {depth}"
    );
}

#[test]
fn error_statuses_carry_json_and_close_where_they_must() {
    let node = TestNode::start(&[("COMBD_MAX_BODY", "1K")]);
    let cases: &[(&[u8], u16, bool)] = &[
        (
            b"POST /o/echo/a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            400,
            true,
        ),
        (b"BLAH\x01 / HTTP/1.1\r\nHost: x\r\n\r\n", 400, true),
        (b"GET /unknown HTTP/1.1\r\nHost: x\r\n\r\n", 404, false),
        (b"GET /o/nosuchapp/a HTTP/1.1\r\nHost: x\r\n\r\n", 404, false),
        (
            b"POST /o/echo/..%2f HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            400,
            false,
        ),
        (
            b"POST /o/echo/.hidden HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            400,
            false,
        ),
        (b"GET /o/echo/a HTTP/1.1\r\nHost: x\r\n\r\n", 405, false),
        (
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            405,
            false,
        ),
        (
            b"POST /o/echo/a HTTP/1.1\r\nHost: x\r\nExpect: magic\r\n\r\n",
            417,
            true,
        ),
    ];
    for (raw, status, closes) in cases {
        let mut s = connect(node.public());
        s.write_all(raw).unwrap();
        let mut r = BufReader::new(s);
        let resp = read_response(&mut r);
        assert_eq!(resp.status, *status, "{}", String::from_utf8_lossy(raw));
        assert!(
            resp.json()["error"].is_string(),
            "JSON error body for {status}"
        );
        if *closes {
            assert_eq!(resp.header("connection"), Some("close"));
            assert_closed(&mut r);
        }
    }
    let stats = node.stats();
    assert!(stats["responses_4xx"].as_u64().unwrap() >= cases.len() as u64);
}

#[test]
fn body_limit_at_max_and_past_it() {
    let node = TestNode::start(&[("COMBD_MAX_BODY", "1K")]);
    for (len, status) in [(1023usize, 200u16), (1024, 200), (1025, 413)] {
        let mut s = connect(node.public());
        let body = vec![b'x'; len];
        write!(
            s,
            "POST /o/echo/b HTTP/1.1\r\nHost: x\r\nContent-Length: {len}\r\n\r\n"
        )
        .unwrap();
        s.write_all(&body).unwrap();
        let mut r = BufReader::new(s);
        let resp = read_response(&mut r);
        assert_eq!(resp.status, status, "body of {len} bytes");
        if status == 200 {
            assert_eq!(resp.body, body);
        } else {
            assert_eq!(resp.json()["error"], "request body too large");
            assert_closed(&mut r);
        }
    }
}

#[test]
fn expect_continue_gets_100_before_the_body() {
    let node = TestNode::start(&[]);
    let mut s = connect(node.public());
    s.write_all(
        b"POST /o/echo/c HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n",
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut r, &mut line).unwrap();
    assert_eq!(line, "HTTP/1.1 100 Continue\r\n");
    line.clear();
    std::io::BufRead::read_line(&mut r, &mut line).unwrap();
    assert_eq!(line, "\r\n");
    s.write_all(b"body").unwrap();
    let resp = read_response(&mut r);
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"body"[..]));
}

#[test]
fn header_section_limit_gives_431() {
    let node = TestNode::start(&[]);
    // Just under 16 KiB in all: served.
    let ok = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(16 * 1024 - 64)
    );
    assert_eq!(request(node.public(), ok.as_bytes()).status, 200);
    // Over it: refused, whether or not the head ever completes.
    let big = format!(
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(16 * 1024)
    );
    let resp = request(node.public(), big.as_bytes());
    assert_eq!(resp.status, 431);
    assert!(resp.json()["error"].is_string());
    let mut many = String::from("GET /healthz HTTP/1.1\r\nHost: x\r\n");
    for i in 0..65 {
        many.push_str(&format!("X-{i}: y\r\n"));
    }
    many.push_str("\r\n");
    assert_eq!(request(node.public(), many.as_bytes()).status, 431);
}

#[test]
fn slow_head_gets_408_and_close() {
    let node = TestNode::start(&[("COMBD_HEADER_TIMEOUT", "300ms")]);
    let mut s = connect(node.public());
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .unwrap();
    let mut r = BufReader::new(s);
    let resp = read_response(&mut r);
    assert_eq!(resp.status, 408);
    assert_eq!(resp.json()["error"], "request head not received in time");
    assert_closed(&mut r);
    // A connection that sends nothing at all gets the same.
    let mut r = BufReader::new(connect(node.public()));
    assert_eq!(read_response(&mut r).status, 408);
    assert!(node.stats()["request_timeouts"].as_u64().unwrap() >= 2);
}

#[test]
fn slow_body_gets_408() {
    let node = TestNode::start(&[("COMBD_BODY_TIMEOUT", "300ms")]);
    let mut s = connect(node.public());
    s.write_all(b"POST /o/echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        .unwrap();
    let mut r = BufReader::new(s);
    let resp = read_response(&mut r);
    assert_eq!(resp.status, 408);
    assert_eq!(resp.json()["error"], "request body not received in time");
}

#[test]
fn idle_keep_alive_connection_is_closed() {
    let node = TestNode::start(&[("COMBD_IDLE_TIMEOUT", "300ms")]);
    let mut s = connect(node.public());
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s);
    assert_eq!(read_response(&mut r).status, 200);
    assert_closed(&mut r);
    assert!(node.stats()["idle_closed"].as_u64().unwrap() >= 1);
}

#[test]
fn invalid_settings_fail_startup_naming_the_setting() {
    for (name, value) in [
        ("COMBD_MAX_BODY", "0"),
        ("COMBD_HEADER_TIMEOUT", "never"),
        ("COMBD_SHARDS", "999"),
        ("COMBD_LISTEN", "nowhere"),
        ("COMBD_LOG", "info,=[bad"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_combd"))
            .env(name, value)
            .env(
                "COMBD_DATA",
                std::env::temp_dir().join("combd-test-invalid"),
            )
            .output()
            .expect("run combd");
        assert_eq!(out.status.code(), Some(78), "{name}={value}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(name), "{name}={value}: stderr {err:?}");
    }
}

#[test]
fn help_lists_every_setting_with_its_default() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_combd"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for s in combd_kernel::settings::SETTINGS {
        let line = text
            .lines()
            .find(|l| l.split_whitespace().take(2).eq([s.flag, s.env]))
            .unwrap_or_else(|| panic!("--help lacks {}", s.env));
        assert!(
            line.ends_with(&format!("default: {}", s.default_text())),
            "--help's {} has not its default {:?}: {line:?}",
            s.env,
            s.default_text()
        );
    }
}

#[test]
fn stats_limits_show_every_setting_that_is_a_number() {
    let given: [(&str, &str, &str, u64); 6] = [
        ("COMBD_MAX_BODY", "3K", "max_body_bytes", 3072),
        ("COMBD_HEADER_TIMEOUT", "1500ms", "header_timeout_ms", 1500),
        ("COMBD_WS_RATE", "77", "ws_rate", 77),
        ("COMBD_SHARDS", "1", "shards", 1),
        ("COMBD_MEMORY_BUDGET", "3G", "memory_budget_bytes", 3 << 30),
        (
            "COMBD_INBOUND_BUDGET",
            "5M",
            "inbound_budget_bytes",
            5 << 20,
        ),
    ];
    let env: Vec<(&str, &str)> = given.iter().map(|(e, v, _, _)| (*e, *v)).collect();
    let node = TestNode::start(&env);
    let stats = node.stats();
    let limits = &stats["limits"];
    let settings = combd_kernel::settings::SETTINGS;
    let mut numbers = 0;
    for s in settings
        .iter()
        .filter(|s| s.unit != combd_kernel::settings::Unit::Text)
    {
        let limit = s
            .limit
            .unwrap_or_else(|| panic!("{} is a number with no /stats limit", s.env));
        let value = limits[limit.name]
            .as_u64()
            .unwrap_or_else(|| panic!("/stats limits lack {} ({}): {limits}", limit.name, s.env));
        assert!(value > 0, "{}: zero never means unlimited", limit.name);
        numbers += 1;
    }
    assert!(numbers >= 25, "{numbers} number settings");
    for l in combd_kernel::settings::DERIVED_LIMITS {
        assert!(
            limits[l.name].as_u64().is_some(),
            "/stats limits lack {}",
            l.name
        );
    }
    for (env, _, name, value) in given {
        assert_eq!(limits[name], value, "{env}: {limits}");
    }
    // The connection cap is the one in force, clamped.
    assert_eq!(limits["max_conns"], stats["max_conns_effective"]);
}

/// Sends a head with `Expect: 100-continue` and waits for the `100 Continue`: from then on the
/// request is in flight on the node.
fn start_request_in_flight(
    node: &TestNode,
    body_len: usize,
) -> (std::net::TcpStream, BufReader<std::net::TcpStream>) {
    let mut s = connect(node.public());
    write!(
        s,
        "POST /o/echo/d HTTP/1.1\r\nHost: x\r\nContent-Length: {body_len}\r\nExpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut r, &mut line).expect("timed out waiting for 100 Continue");
    assert_eq!(line, "HTTP/1.1 100 Continue\r\n");
    std::io::BufRead::read_line(&mut r, &mut line).unwrap();
    (s, r)
}

#[test]
fn sigterm_lets_a_request_in_flight_finish() {
    let mut node = TestNode::start(&[]);
    let (mut s, mut r) = start_request_in_flight(&node, 8);
    s.write_all(b"half").unwrap();
    node.sigterm();
    // Public connections are refused once the drain has stopped the listeners.
    let deadline = std::time::Instant::now() + WAIT;
    while std::net::TcpStream::connect(node.public()).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for the listener to stop"
        );
    }
    s.write_all(b"half").unwrap();
    let resp = read_response(&mut r);
    assert_eq!((resp.status, resp.body.as_slice()), (200, &b"halfhalf"[..]));
    assert_eq!(resp.header("connection"), Some("close"));
    assert_eq!(node.wait_exit().code(), Some(0));
}

#[test]
fn drain_deadline_bounds_shutdown() {
    let mut node = TestNode::start(&[
        ("COMBD_SHUTDOWN_TIMEOUT", "300ms"),
        ("COMBD_BODY_TIMEOUT", "1h"),
    ]);
    let (_s, mut r) = start_request_in_flight(&node, 8);
    node.sigterm();
    // The body never comes; the node still exits, cleanly, at its deadline.
    assert_eq!(node.wait_exit().code(), Some(0));
    assert_closed(&mut r);
}

#[test]
fn readme_documents_every_setting_with_its_default() {
    use combd_kernel::settings::DefaultValue;
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for s in combd_kernel::settings::SETTINGS {
        let row = format!("| `{}` | `{}` | ", s.env, s.flag);
        let line = readme
            .lines()
            .find(|l| l.starts_with(&row))
            .unwrap_or_else(|| panic!("README.md lacks {}", s.env));
        let default = line[row.len()..].split(" | ").next().unwrap_or_default();
        match s.default {
            // A value as the setting takes it, as --help writes it.
            DefaultValue::Value(_) => assert_eq!(
                default,
                format!("`{}`", s.default_text()),
                "README.md's default of {}",
                s.env
            ),
            // How it is found, in words: the README may say more.
            DefaultValue::Described(how) => assert!(
                default.replace('`', "").starts_with(how),
                "README.md's default of {} does not begin with {how:?}: {default:?}",
                s.env
            ),
        }
    }
}

#[test]
fn readme_lists_every_fixed_limit_with_its_value() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for f in combd_kernel::limits::FIXED {
        assert!(
            readme.contains(&format!("| `{}` | {} |", f.name, f.value)),
            "README.md's fixed limits lack {} = {} (regenerate the table from --check-config)",
            f.name,
            f.value
        );
    }
}
