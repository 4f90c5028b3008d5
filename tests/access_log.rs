//! The access log (`COMBD_ACCESS_LOG`) against the real node: one JSON line per HTTP response
//! (errors and `/stats` included) and per WebSocket opened and closed, with the right fields;
//! never a query string or a body; a new file after logrotate's rename and SIGHUP; a path that
//! cannot be opened stops the start; and under a burst every line is either written or counted
//! as dropped, while the node keeps answering. (Dropping itself, with the writer behind, is
//! the unit test `a_shard_drops_and_counts_when_its_chunks_are_all_waiting` in
//! `shards/src/access_log/mod.rs`: a node's writer cannot be held back from outside.)

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use support::*;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::Message;

/// A fresh directory for a test's log files.
fn log_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("combd-alog-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn node_logging_to(path: &Path, extra: &[(&str, &str)]) -> TestNode {
    let mut env = vec![("COMBD_ACCESS_LOG", path.to_str().unwrap())];
    env.extend_from_slice(extra);
    TestNode::start(&env)
}

/// The log's lines, each parsed.
fn lines_of(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?} is not JSON: {e}")))
        .collect()
}

/// Waits until the log holds at least `n` lines; returns them.
fn wait_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let lines = lines_of(path);
        if lines.len() >= n {
            return lines;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {n} lines in {}: {lines:?}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The line of `kind` for `path` (each shard's lines are in order, the shards' are not among
/// each other).
fn line_for<'a>(lines: &'a [serde_json::Value], kind: &str, path: &str) -> &'a serde_json::Value {
    lines
        .iter()
        .find(|l| l["kind"] == kind && l["path"] == path)
        .unwrap_or_else(|| panic!("no {kind} line for {path}: {lines:?}"))
}

/// Sends `raw` on a connection of its own and reads everything until the node closes it.
fn exchange(addr: SocketAddr, raw: &[u8]) -> Vec<u8> {
    let mut s = connect(addr);
    s.write_all(raw).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got)
        .expect("timed out waiting for the node to close");
    got
}

fn status_of(response: &[u8]) -> u16 {
    std::str::from_utf8(&response[9..12])
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn every_response_is_one_line_with_its_request_and_never_its_query_or_body() {
    let dir = log_dir("http");
    let path = dir.join("access.log");
    let node = node_logging_to(&path, &[("COMBD_MAX_BODY", "1K")]);
    let body = "the-body-is-secret";
    let post = format!(
        "POST /o/echo/a?token=s3cr3t HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\
         Authorization: Bearer hdr-s3cr3t\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let get = "GET /healthz?q=s3cr3t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let missing = "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let too_large = "POST /o/echo/big HTTP/1.1\r\nHost: x\r\nContent-Length: 2048\r\n\r\n";
    let stats = "GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    let cases: [(SocketAddr, &str, &str, &str, u16); 5] = [
        (node.public(), &post, "POST", "/o/echo/a", 200),
        (node.public(), get, "GET", "/healthz", 200),
        (node.public(), missing, "GET", "/nope", 404),
        (node.public(), too_large, "POST", "/o/echo/big", 413),
        (node.local(), stats, "GET", "/stats", 200),
    ];
    let mut answers = Vec::new();
    for (addr, raw, ..) in &cases {
        let answer = exchange(*addr, raw.as_bytes());
        answers.push(answer);
    }
    let lines = wait_lines(&path, cases.len());
    assert_eq!(lines.len(), cases.len(), "one line each: {lines:?}");
    // Each shard's lines are in order; the shards' are not, among each other.
    for ((_, raw, method, path_, status), answer) in cases.iter().zip(&answers) {
        let line = line_for(&lines, "http", path_);
        assert_eq!(status_of(answer), *status, "{raw}");
        assert_eq!(line["kind"], "http", "{line}");
        assert_eq!(line["method"], *method, "{line}");
        assert_eq!(line["path"], *path_, "{line}");
        assert_eq!(line["status"], *status, "{line}");
        assert_eq!(line["bytes_in"], raw.len(), "{line}");
        assert_eq!(line["bytes_out"], answer.len(), "{line}");
        assert!(line["ms"].as_f64().unwrap() >= 0.0, "{line}");
        assert!(line["shard"].is_u64(), "{line}");
        assert!(line["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
        let ts = line["ts"].as_str().unwrap();
        assert!(
            ts.len() == 24 && ts.ends_with('Z') && ts.as_bytes()[10] == b'T',
            "{ts}"
        );
    }
    let text = std::fs::read_to_string(&path).unwrap();
    for secret in ["s3cr3t", "token", "the-body", "Bearer", "Authorization"] {
        assert!(!text.contains(secret), "{secret:?} in the log: {text}");
    }
    let s = node.stats();
    assert_eq!(
        s["access_log_lines"],
        cases.len(),
        "this /stats request's own line after"
    );
    assert_eq!(s["access_log_dropped"], 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_websocket_logs_its_open_and_its_close_with_the_code() {
    let dir = log_dir("ws");
    let path = dir.join("access.log");
    let node = node_logging_to(&path, &[("COMBD_WS_MAX_MESSAGE", "1K")]);

    // The client closes with 1000, after two messages each way.
    let mut ws = open_ws(&node, "/o/echo/w?token=s3cr3t");
    for m in ["one", "two"] {
        ws.send(Message::text(m)).unwrap();
        assert_eq!(ws.read().unwrap(), Message::text(m));
    }
    ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "bye".into(),
    }))
    .unwrap();
    while ws.read().is_ok() {}
    let lines = wait_lines(&path, 2);
    let open = line_for(&lines, "ws_open", "/o/echo/w");
    let close = line_for(&lines, "ws_close", "/o/echo/w");
    assert_eq!(open["kind"], "ws_open", "{open}");
    assert_eq!(open["path"], "/o/echo/w", "{open}");
    assert_eq!(close["kind"], "ws_close", "{close}");
    assert_eq!(close["path"], "/o/echo/w", "{close}");
    assert_eq!(close["code"], 1000, "{close}");
    assert_eq!(close["by"], "client", "{close}");
    assert_eq!(close["reason"], serde_json::Value::Null, "{close}");
    assert_eq!(close["messages_in"], 2, "{close}");
    assert_eq!(close["messages_out"], 2, "{close}");
    // Two masked frames of 3 bytes and a masked close of 5 (9 + 9 + 11 bytes) in; two frames
    // of 3 and the echoed close out (5 + 5 + 4).
    assert_eq!(close["bytes_in"], 9 + 9 + 11, "{close}");
    assert_eq!(close["bytes_out"], 5 + 5 + 4, "{close}");
    assert!(close["ms"].as_f64().unwrap() > 0.0, "{close}");

    // The node closes one that sends a message past COMBD_WS_MAX_MESSAGE with 1009.
    let mut ws = open_ws(&node, "/o/echo/big");
    ws.send(Message::binary(vec![0u8; 2048])).unwrap();
    while ws.read().is_ok() {}
    let lines = wait_lines(&path, 4);
    line_for(&lines, "ws_open", "/o/echo/big");
    let close = line_for(&lines, "ws_close", "/o/echo/big");
    assert_eq!(close["kind"], "ws_close", "{close}");
    assert_eq!(close["path"], "/o/echo/big", "{close}");
    assert_eq!(close["code"], 1009, "{close}");
    assert_eq!(close["by"], "node", "{close}");
    assert!(close["reason"].is_string(), "{close}");

    // One whose client just goes away: 1006, no close frame.
    let ws = open_ws(&node, "/o/echo/gone");
    drop(ws);
    let lines = wait_lines(&path, 6);
    let close = line_for(&lines, "ws_close", "/o/echo/gone");
    assert_eq!(close["code"], 1006, "{close}");
    assert_eq!(close["by"], "connection", "{close}");

    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains("s3cr3t"),
        "the upgrade's query in the log: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sighup_after_a_rename_writes_to_a_new_file_at_the_path() {
    let dir = log_dir("rotate");
    let path = dir.join("access.log");
    let rotated = dir.join("access.log.1");
    let node = node_logging_to(&path, &[]);
    assert_eq!(get(&node, "/healthz").status, 200);
    wait_lines(&path, 1);
    std::fs::rename(&path, &rotated).unwrap();
    node.signal(Signal::SIGHUP);
    let deadline = Instant::now() + WAIT;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the new file"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(&node, "/nope").status, 404);
    let new = wait_lines(&path, 1);
    assert_eq!(new.len(), 1);
    assert_eq!(new[0]["path"], "/nope");
    let old = lines_of(&rotated);
    assert_eq!(old.len(), 1);
    assert_eq!(old[0]["path"], "/healthz");
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777 & !0o640,
        0,
        "created 0640 (less the umask): {mode:o}"
    );
    let s = node.stats();
    assert_eq!(s["access_log_reopens"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What the node logged just before a SIGTERM is in the file once it has exited: the shards
/// hand their last lines over as they end, and the writer writes them before the exit.
#[test]
fn the_last_lines_are_written_before_the_node_exits() {
    let dir = log_dir("exit");
    let path = dir.join("access.log");
    let mut node = node_logging_to(&path, &[]);
    for _ in 0..20 {
        assert_eq!(get(&node, "/healthz").status, 200);
    }
    node.sigterm();
    assert_eq!(node.wait_exit().code(), Some(0));
    let lines = lines_of(&path);
    let healthz = lines.iter().filter(|l| l["path"] == "/healthz").count();
    assert_eq!(healthz, 20, "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_path_that_cannot_be_opened_stops_the_start_naming_the_setting() {
    let dir = log_dir("refused");
    let data = dir.join("data");
    let missing = dir.join("no-such-dir").join("access.log");
    let stderr = refused(&mut combd_command(
        &data,
        &[("COMBD_ACCESS_LOG", missing.to_str().unwrap())],
    ));
    assert!(stderr.contains("COMBD_ACCESS_LOG"), "{stderr}");
    assert!(stderr.contains(missing.to_str().unwrap()), "{stderr}");
    // A directory is not a file either.
    let stderr = refused(&mut combd_command(
        &data,
        &[("COMBD_ACCESS_LOG", dir.to_str().unwrap())],
    ));
    assert!(stderr.contains("COMBD_ACCESS_LOG"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A burst of pipelined requests from many addresses: every one is answered, and every
/// response's line is either in the file or counted as dropped; none is lost silently.
#[test]
fn under_a_burst_every_line_is_written_or_counted_and_the_node_keeps_answering() {
    const CLIENTS: usize = 40;
    const EACH: usize = 200;
    let dir = log_dir("burst");
    let path = dir.join("access.log");
    let node = node_logging_to(&path, &[]);
    let addr = node.public();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            std::thread::spawn(move || {
                let mut s: TcpStream = connect_from(client_address(i), addr);
                let one = "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
                s.write_all(one.repeat(EACH).as_bytes()).unwrap();
                let mut r = std::io::BufReader::new(s);
                for _ in 0..EACH {
                    assert_eq!(read_response(&mut r).status, 200);
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let s = node.stats();
    let (logged, dropped) = (
        s["access_log_lines"].as_u64().unwrap(),
        s["access_log_dropped"].as_u64().unwrap(),
    );
    assert_eq!(logged + dropped, (CLIENTS * EACH) as u64, "{s}");
    assert_eq!(s["requests"], logged + dropped);
    assert!(
        s["access_log_chunks_waiting_max"].as_u64().unwrap() <= 8,
        "{s}"
    );
    // The /stats request's own line comes after its figures.
    let lines = wait_lines(&path, logged as usize + 1);
    assert_eq!(lines.len(), logged as usize + 1);
    let healthz = lines.iter().filter(|l| l["path"] == "/healthz").count();
    assert_eq!(healthz as u64, logged);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn off_by_default_and_stderr_is_a_sink() {
    // Off: nothing is counted.
    let node = TestNode::start(&[]);
    assert_eq!(get(&node, "/healthz").status, 200);
    assert_eq!(node.stats()["access_log_lines"], 0);
    drop(node);
    // stderr: the lines come between the node's own.
    let data = log_dir("stderr").join("data");
    let Captured {
        mut child,
        err,
        port,
        ..
    } = start_captured(&data, &[("COMBD_ACCESS_LOG", "stderr")]);
    let addr = SocketAddr::from(([127, 0, 0, 2], port));
    let answer = exchange(
        addr,
        b"GET /o/echo/x?k=s3cr3t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status_of(&answer), 405);
    let line = wait_line(&err, "\"kind\":\"http\"");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(
        (v["path"].as_str(), v["status"].as_u64()),
        (Some("/o/echo/x"), Some(405))
    );
    let _ = child.kill();
    let _ = child.wait();
}
