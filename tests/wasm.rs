//! Apps deployed as WebAssembly modules, against the real node: the limits the runtime
//! enforces (fuel, memory, output, traps, the sandbox), start-up refusals, and SIGHUP reloads.
//! The modules are text format (`tests/wasm/*.wat`, or written here).

#![allow(clippy::unwrap_used)]

mod support;

use std::net::TcpStream;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use support::*;
use tungstenite::{Message, WebSocket};

const PROBE: &str = include_str!("wasm/probe.wat");

fn probe_node(extra: &[(&str, &str)]) -> TestNode {
    let dir = apps_dir(&[("probe.wat", PROBE)]);
    let mut env = vec![("COMBD_APPS_DIR", dir.to_str().unwrap())];
    env.extend_from_slice(extra);
    TestNode::start(&env)
}

fn rows(node: &TestNode, object: &str) -> i64 {
    let r = post(node, &format!("/o/probe/{object}"), "c");
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["n"].as_i64().unwrap()
}

#[test]
fn a_module_serves_sql_and_unreachable_fails_one_input_with_nothing_written() {
    let node = probe_node(&[]);
    assert_eq!(post(&node, "/o/probe/a", "w1").json()["n"], 1);
    let r = post(&node, "/o/probe/a", "u");
    assert_eq!(error(&r), (500, "the module trapped on this input".into()));
    assert_eq!(
        rows(&node, "a"),
        1,
        "the trapped call's insert was rolled back"
    );
    assert_eq!(post(&node, "/o/probe/a", "w2").json()["n"], 1);
    assert_eq!(rows(&node, "a"), 2);
    // Recursion without end exhausts the module's stack, not the node's thread.
    let r = post(&node, "/o/probe/a", "r");
    assert_eq!(error(&r), (500, "the module trapped on this input".into()));
    let r = post(&node, "/o/probe/a", "e");
    assert_eq!(r.status, 500);
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("exited (status 3)"));
    let s = node.stats();
    assert_eq!(s["apps"]["probe"]["kind"], "wasm");
    assert_eq!(s["apps"]["probe"]["memory_kb"], 1024);
    assert_eq!(s["apps"]["probe"]["hash"].as_str().unwrap().len(), 64);
    assert_eq!(s["apps"]["counter"]["kind"], "native");
}

#[test]
fn an_endless_loop_is_killed_while_the_shard_keeps_answering() {
    // One shard: the spinning object, /healthz and the echo WebSocket all live on it. Enough
    // fuel that the loop spins for a while before it is killed.
    let node = probe_node(&[
        ("COMBD_SHARDS", "1"),
        ("COMBD_CPU_LIMIT_TICKS", "3000000000"),
    ]);
    let addr = node.public();
    let spin = std::thread::spawn(move || {
        let raw = "POST /o/probe/spin HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\ns";
        request(addr, raw.as_bytes())
    });
    wait_stats(&node, "the spinning call", |s| s["cells_awake"] == 1);
    let url = format!("ws://127.0.0.2:{}/o/echo/e", node.port);
    let (mut ws, _): (WebSocket<TcpStream>, _) =
        tungstenite::client(url.as_str(), connect(node.public())).unwrap();
    for i in 0..20 {
        let r = request(
            node.public(),
            b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 200);
        ws.send(Message::text(format!("m{i}"))).unwrap();
        assert_eq!(ws.read().unwrap(), Message::text(format!("m{i}")));
    }
    assert!(!spin.is_finished(), "the echoes ran while the module spun");
    let r = spin.join().unwrap();
    assert_eq!(error(&r), (500, "cpu_limit".into()));
    assert_eq!(
        rows(&node, "spin"),
        0,
        "the spinning call's insert was rolled back"
    );
    let s = node.stats();
    assert_eq!(s["cpu_limit_killed"], 1);
}

#[test]
fn memory_past_memory_kb_fails_with_memory_limit() {
    let node = probe_node(&[]);
    let r = post(&node, "/o/probe/m", "g");
    assert_eq!(error(&r), (500, "memory_limit".into()));
    assert_eq!(node.stats()["memory_limit_killed"], 1);
    assert_eq!(
        post(&node, "/o/probe/m", "w").status,
        200,
        "the object carries on"
    );
}

/// A growth past the memory's own declared maximum fails (`memory.grow` answers -1) and is
/// not counted against `memory_kb`: a module of 1 MiB whose memory may reach 2 pages asks for
/// 8 more three times, then grows by one page and answers (found while reading what the
/// `host_imports` fuzz corpus was answered: each refused growth was counted, and the second
/// one killed the call with `memory_limit`).
#[test]
fn growing_past_the_memorys_own_maximum_answers_minus_one_and_is_not_counted() {
    let module = r#"(module
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1 2)
  (data (i32.const 0) "{}")
  (func (export "memory_kb") (result i32) (i32.const 1024))
  (func (export "handle") (result i32)
    (if (i32.ne (memory.grow (i32.const 8)) (i32.const -1)) (then unreachable))
    (if (i32.ne (memory.grow (i32.const 8)) (i32.const -1)) (then unreachable))
    (if (i32.ne (memory.grow (i32.const 8)) (i32.const -1)) (then unreachable))
    (if (i32.ne (memory.grow (i32.const 1)) (i32.const 1)) (then unreachable))
    (call $respond (i32.const 200) (i32.const 0) (i32.const 2))
    (i32.const 0)))"#;
    let dir = apps_dir(&[("capped.wat", module)]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    let r = post(&node, "/o/capped/a", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(node.stats()["memory_limit_killed"], 0);
}

#[test]
fn one_mib_of_stdout_is_kept_as_64_kib() {
    let dir = apps_dir(&[("probe.wat", PROBE)]);
    let data = std::env::temp_dir().join(format!("combd-test-stdout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let env = [
        ("COMBD_APPS_DIR", dir.to_str().unwrap()),
        ("COMBD_LOG", "info"),
    ];
    let Captured {
        mut child,
        err,
        port,
        ..
    } = start_captured(&data, &env);
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let r = request(
        addr,
        b"POST /o/probe/out HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\no",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut kept = 0;
    let full = "x".repeat(1023);
    loop {
        let line = wait_line(&err, "probe/out");
        if line.contains("past 64 KiB") {
            break;
        }
        kept += line.contains(&full) as usize;
    }
    // 64 KiB of 1,024-byte lines (1,023 x's and a newline): 64 lines, then the marker.
    assert_eq!(kept, 64);
    // Our own child, not yet reaped.
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
    let _ = child.wait();
}

/// A failed call of a module (a trap, a limit) is logged at WARN with its app and object and
/// what stopped it, at most `APP_ERROR_LOGS_PER_WINDOW` (10) a window on a shard; the rest are
/// counted (`app_errors_log_suppressed`) and summed up in one line once the window is over.
#[test]
fn a_failed_call_is_logged_at_warn_with_its_app_and_object_within_a_rate() {
    const BURST: usize = 30;
    // A module whose SQL fails and which then gives up: answers 1.
    let bad_sql = r#"(module
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "CREATE TABLE IF NOT EXISTS t (v);\00")
  (data (i32.const 64) "SELECT v FROM nope")
  (func (export "schema") (result i32) (i32.const 0))
  (func (export "handle") (result i32)
    (drop (call $sql (i32.const 64) (i32.const 18)))
    (i32.const 1)))"#;
    let dir = apps_dir(&[("probe.wat", PROBE), ("badsql.wat", bad_sql)]);
    let data = std::env::temp_dir().join(format!("combd-test-warn-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&data);
    let env = [
        ("COMBD_APPS_DIR", dir.to_str().unwrap()),
        ("COMBD_SHARDS", "1"),
    ];
    let Captured {
        mut child,
        err,
        port,
        ..
    } = start_captured(&data, &env);
    let addr: std::net::SocketAddr = format!("127.0.0.2:{port}").parse().unwrap();
    let post_to = move |object: &str, body: &str| {
        let raw = format!(
            "POST /o/{object} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        request(addr, raw.as_bytes())
    };

    // A trap: its app, its object, its status and the trap itself.
    assert_eq!(
        error(&post_to("probe/trapped", "u")),
        (500, "the module trapped on this input".into())
    );
    let line = wait_line(&err, "call failed");
    assert!(line.contains("WARN"), "{line}");
    for part in ["app=probe", "object=trapped", "status=500", "unreachable"] {
        assert!(line.contains(part), "{part:?} in {line}");
    }
    // A limit.
    assert_eq!(
        error(&post_to("probe/grown", "g")),
        (500, "memory_limit".into())
    );
    let line = wait_line(&err, "call failed");
    assert!(
        line.contains("object=grown") && line.contains("memory_limit"),
        "{line}"
    );
    // A SQL error the module gave up on: the statement's error is the detail.
    let r = post_to("badsql/q", "");
    assert_eq!(
        error(&r),
        (500, "the module answered 1 for this input".into())
    );
    let line = wait_line(&err, "call failed");
    for part in [
        "app=badsql",
        "object=q",
        "last SQL error",
        "no such table: nope",
    ] {
        assert!(line.contains(part), "{part:?} in {line}");
    }
    assert!(
        !r.text().contains("nope"),
        "the detail is the log's, not the client's"
    );
    // An answer is no failure.
    assert_eq!(post_to("probe/fine", "w").status, 200);

    // A burst: at most ten lines a window, the rest counted, then summed up.
    let started = std::time::Instant::now();
    let burst: Vec<_> = (0..BURST)
        .map(|i| std::thread::spawn(move || post_to(&format!("probe/b{i}"), "u").status))
        .collect();
    for b in burst {
        assert_eq!(b.join().unwrap(), 500);
    }
    let within_a_window = started.elapsed() < std::time::Duration::from_secs(1);
    let stats = request(
        format!("127.0.0.1:{port}").parse().unwrap(),
        b"GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .json();
    let suppressed = stats["app_errors_log_suppressed"].as_u64().unwrap() as usize;
    // The warnings were written before the answers left; the summary comes once the window is
    // over (a housekeeping tick after it, at the latest).
    let mut logged = 0;
    let mut summed = 0;
    let deadline = std::time::Instant::now() + WAIT;
    while summed < suppressed {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = err
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("timed out waiting for the summary of {suppressed}: {e}"));
        logged += line.contains("call failed") as usize;
        if let Some(n) = line.split("suppressed=").nth(1) {
            summed += n
                .split_whitespace()
                .next()
                .unwrap()
                .parse::<usize>()
                .unwrap();
        }
    }
    assert_eq!(summed, suppressed);
    assert_eq!(
        logged + suppressed,
        BURST,
        "every failure logged or counted"
    );
    if within_a_window {
        // A burst within a second spans two windows at most.
        assert!(logged <= 20 && suppressed >= BURST - 20, "{logged} logged");
    }
    // Our own child, not yet reaped.
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn no_file_or_socket_can_be_opened() {
    let node = probe_node(&[]);
    // WASI's ENOTCAPABLE (76): there is no preopened directory to open a path under.
    assert_eq!(post(&node, "/o/probe/f", "f").json()["n"], 76);
    // ENOSYS (52): no socket call is provided.
    assert_eq!(post(&node, "/o/probe/f", "k").json()["n"], 52);
}

#[test]
fn a_bad_module_stops_the_start_naming_its_file() {
    let (stderr, dir) = refused_with(&[("bad.wasm", "not a module")]);
    assert!(stderr.contains("COMBD_APPS_DIR"), "{stderr}");
    assert!(
        stderr.contains(&dir.join("bad.wasm").display().to_string()),
        "{stderr}"
    );

    let sock = r#"(module (import "env" "socket" (func (param i32 i32 i32) (result i32)))
        (memory (export "memory") 1) (func (export "handle") (result i32) (i32.const 0)))"#;
    let (stderr, dir) = refused_with(&[("net.wat", sock)]);
    assert!(
        stderr.contains(&dir.join("net.wat").display().to_string()),
        "{stderr}"
    );
    assert!(stderr.contains("may import only from"), "{stderr}");

    let (stderr, _) = refused_with(&[("counter.wat", &versioned(1))]);
    assert!(stderr.contains("registered twice"), "{stderr}");
}

#[test]
fn compiled_code_is_cached_in_the_data_directory() {
    let dir = apps_dir(&[("ver.wat", &versioned(7))]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    assert_eq!(node.stats()["apps"]["ver"]["from_cache"], false);
    let data = node.kill9();
    let cached: Vec<_> = std::fs::read_dir(data.join("wasm-cache"))
        .unwrap()
        .collect();
    assert_eq!(cached.len(), 1);
    let node = TestNode::start_in(data, &[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    assert_eq!(node.stats()["apps"]["ver"]["from_cache"], true);
    assert_eq!(post(&node, "/o/ver/x", "").json()["v"], 7);
}

#[test]
fn the_readme_example_module_runs() {
    let readme = include_str!("../README.md");
    let start = readme.find("```wat\n").unwrap() + "```wat\n".len();
    let end = start + readme[start..].find("```").unwrap();
    let dir = apps_dir(&[("hello.wat", &readme[start..end])]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    // Past 9 and past 99: the answer is the whole count, not its last digit.
    for seen in 1..=101 {
        let resp = post(&node, "/o/hello/a", r#"{"x":1}"#);
        assert_eq!(resp.status, 200, "call {seen}: {}", resp.text());
        assert_eq!(resp.text(), format!(r#"{{"seen":{seen}}}"#), "call {seen}");
    }
    // Another object counts from 1.
    assert_eq!(post(&node, "/o/hello/b", "").text(), r#"{"seen":1}"#);
}

/// A module that answers who its client is: `input` part 3 (the subject) or, without one,
/// "anyone"; `identified` makes the node refuse it any request without a valid token.
fn whois(identified: bool) -> String {
    let export = if identified {
        r#"(func (export "identified") (result i32) (i32.const 1))"#
    } else {
        ""
    };
    format!(
        r#"(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 1024) "anyone")
  {export}
  (func (export "handle") (result i32)
    (local $n i32)
    (local.set $n (call $input (i32.const 3) (i32.const 0) (i32.const 256)))
    (if (i32.lt_s (local.get $n) (i32.const 0))
      (then (call $respond (i32.const 200) (i32.const 1024) (i32.const 6)))
      (else (call $respond (i32.const 200) (i32.const 0) (local.get $n))))
    (i32.const 0)))"#
    )
}

#[test]
fn a_module_may_serve_identified_clients_only_and_reads_who_they_are() {
    const SECRET: &str = "combd-wasm-identity-secret-0123456789abcdef";
    let dir = apps_dir(&[("whois.wat", &whois(true)), ("anyone.wat", &whois(false))]);
    let key = std::env::temp_dir().join(format!("combd-wasm-jwt-{}.key", std::process::id()));
    std::fs::write(&key, format!("{SECRET}\n")).unwrap();
    let node = TestNode::start(&[
        ("COMBD_APPS_DIR", dir.to_str().unwrap()),
        ("COMBD_AUTH_JWT_KEY_FILE", key.to_str().unwrap()),
    ]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = combd_shards::auth::mint(SECRET, "alice", None, 600, now, (None, None)).unwrap();
    let ask = |path: &str, token: Option<&str>| {
        let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
        request(
            node.public(),
            format!("POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
    };
    let r = ask("/o/whois/x", None);
    assert_eq!(r.status, 401, "{}", r.text());
    let r = ask("/o/whois/x", Some(&token));
    assert_eq!((r.status, r.text()), (200, "alice".to_string()));
    // A public module: anyone, and the client named when its token is valid.
    assert_eq!(ask("/o/anyone/x", None).text(), "anyone");
    assert_eq!(ask("/o/anyone/x", Some(&token)).text(), "alice");
    // identified() must answer 0 or 1.
    let odd = whois(true).replace("(i32.const 1))\n", "(i32.const 7))\n");
    let (stderr, _) = refused_with(&[("odd.wat", &odd)]);
    assert!(stderr.contains("identified() answered 7"), "{stderr}");
}

/// Asks for none of its input, for ever (until its fuel is spent).
const INPUT_LOOP: &str = r#"(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "handle") (result i32)
    (loop $l
      (drop (call $input (i32.const 0) (i32.const 0) (i32.const 0)))
      (br $l))
    (i32.const 0)))"#;

/// Runs the SQL it is given, then asks for none of the first value, for ever.
const SQL_TEXT_LOOP: &str = r#"(module
  (import "combd" "input" (func $input (param i32 i32 i32) (result i32)))
  (import "combd" "sql" (func $sql (param i32 i32) (result i32)))
  (import "combd" "sql_text" (func $text (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "handle") (result i32)
    (local $n i32)
    (local.set $n (call $input (i32.const 0) (i32.const 0) (i32.const 256)))
    (if (i32.ne (call $sql (i32.const 0) (local.get $n)) (i32.const 1)) (then unreachable))
    (loop $l
      (drop (call $text (i32.const 0) (i32.const 0) (i32.const 0) (i32.const 0)))
      (br $l))
    (i32.const 0)))"#;

/// A host call costs what it copies, not what it could have: a module asking for none of a
/// 1 MiB body (or of a 1 MiB value) in a loop reaches `cpu_limit` about as soon as with 1 byte
/// (issue 40: each call cloned the whole body and charged nothing for it, 3.5-4.3 s to
/// `cpu_limit` at a million ticks against 9 ms for a 1-byte body).
#[test]
fn a_host_call_costs_what_it_copies_not_what_it_could() {
    let dir = apps_dir(&[("inputs.wat", INPUT_LOOP), ("cells.wat", SQL_TEXT_LOOP)]);
    let node = TestNode::start(&[
        ("COMBD_APPS_DIR", dir.to_str().unwrap()),
        ("COMBD_CPU_LIMIT_TICKS", "1000000"),
    ]);
    let timed = |path: &str, body: &str| {
        let t = std::time::Instant::now();
        let r = post(&node, path, body);
        assert_eq!(error(&r), (500, "cpu_limit".into()), "{path}");
        t.elapsed()
    };
    let slack = std::time::Duration::from_millis(250);
    let small = timed("/o/inputs/a", "x");
    let big = timed("/o/inputs/b", &"x".repeat(1 << 20));
    eprintln!("input(0, 0, 0) to cpu_limit: 1 MiB body {big:?}, 1 byte {small:?}");
    assert!(
        big < small * 4 + slack,
        "1 MiB body {big:?}, 1 byte {small:?}"
    );
    let small = timed("/o/cells/a", "SELECT zeroblob(1)");
    let big = timed("/o/cells/b", "SELECT zeroblob(1048576)");
    eprintln!("sql_text(0, 0, 0, 0) to cpu_limit: 1 MiB value {big:?}, 1 byte {small:?}");
    assert!(
        big < small * 4 + slack,
        "1 MiB value {big:?}, 1 byte {small:?}"
    );
    assert_eq!(node.stats()["cpu_limit_killed"], 4);
}

/// Fills its whole memory (16 MiB) for ever: one tick of fuel a fill, whatever its length.
/// Its `topic()` does the same.
const FILLER: &str = r#"(module
  (memory (export "memory") 256)
  (func $fill
    (loop $l
      (memory.fill (i32.const 0) (i32.const 0) (i32.const 16777216))
      (br $l)))
  (func (export "topic") (result i32) (call $fill) (i32.const 0))
  (func (export "handle") (result i32) (call $fill) (i32.const 0)))"#;

/// A module's call is bounded in wall time beside fuel (issue 40): a loop of bulk memory
/// instructions, which fuel counts one tick each whatever they fill, is stopped at
/// `wasm_call_deadline_ms` (500 `cpu_limit`, counted), and its `topic()`, which runs on the
/// shard's loop, at `wasm_topic_deadline_ms` (the attach refused); the node answers meanwhile.
#[test]
fn a_call_past_its_wall_time_deadline_is_stopped() {
    use combd_kernel::limits::{WASM_CALL_DEADLINE, WASM_EPOCH_TICK, WASM_TOPIC_DEADLINE};
    let dir = apps_dir(&[("filler.wat", FILLER)]);
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    let t = std::time::Instant::now();
    let r = post(&node, "/o/filler/a", "");
    let took = t.elapsed();
    assert_eq!(error(&r), (500, "cpu_limit".into()));
    assert!(
        took >= WASM_CALL_DEADLINE - WASM_EPOCH_TICK
            && took < WASM_CALL_DEADLINE + std::time::Duration::from_secs(3),
        "stopped after {took:?}"
    );
    assert_eq!(node.stats()["cpu_limit_killed"], 1);
    let t = std::time::Instant::now();
    let upgrade = request(
        node.public(),
        b"GET /o/filler/a HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
          Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    );
    let took = t.elapsed();
    assert_ne!(upgrade.status, 101, "{}", upgrade.text());
    assert!(
        took < WASM_TOPIC_DEADLINE + std::time::Duration::from_secs(1),
        "refused after {took:?}"
    );
    let r = request(
        node.public(),
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.status, 200);
}
