//! Admission against the real node: refusing at TCP at the connection cap and under memory
//! pressure, listening again, late connections answered 503, a burst past the cap, and the
//! disk guard on a real small filesystem.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, ErrorKind, Write};
use std::net::TcpStream;

use support::*;

fn all_public_listeners_listening(s: &serde_json::Value) -> bool {
    s["tcp_refusing"] == 0
        && s["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|sh| sh["listening"] == 1)
}

fn assert_refused(node: &TestNode) {
    let e = TcpStream::connect(node.public()).expect_err("a full node must refuse at TCP");
    assert_eq!(
        e.kind(),
        ErrorKind::ConnectionRefused,
        "refused, not timed out: {e}"
    );
}

#[test]
fn stats_show_the_admission_figures() {
    let node = TestNode::start(&[]);
    let s = wait_stats(&node, "a first measurement", |s| {
        s["measurements"].as_u64().unwrap_or(0) >= 1
    });
    for key in [
        "tcp_refusing",
        "pressure",
        "memory_own_bytes",
        "memory_budget_bytes",
        "machine_total_bytes",
        "machine_available_bytes",
        "conns",
        "max_conns_effective",
        "refused_late",
        "listen_stops",
        "disk_low",
        "disk_free_bytes",
    ] {
        assert!(s[key].is_u64(), "{key} in /stats: {s}");
    }
    assert_eq!(s["full_reason"], "none");
    for key in [
        "max_conns",
        "max_body_bytes",
        "max_awake",
        "restores_at_once",
        "mailbox_default",
        "session_mailbox",
    ] {
        assert!(
            s["limits"][key].as_u64().unwrap() > 0,
            "limits.{key} in /stats"
        );
    }
    assert!(["cgroup1", "cgroup2", "ram"].contains(&s["memory_budget_source"].as_str().unwrap()));
    assert!(s["memory_own_bytes"].as_u64().unwrap() > 0);
    // The fd limit here is 20,000: the default cap of 200,000 is clamped below it.
    assert!(s["max_conns_effective"].as_u64().unwrap() < 20_000);
    let m = request(node.local(), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").text();
    assert!(m.contains("combd_tcp_refusing 0\n"));
    assert!(m.contains("combd_memory_budget_info{source="));
}

#[test]
fn connection_cap_refuses_at_tcp_and_listens_again() {
    let node = TestNode::start(&[("COMBD_MAX_CONNS", "50"), ("COMBD_HEADER_TIMEOUT", "1m")]);
    let mut held = Vec::new();
    for _ in 0..50 {
        held.push(connect(node.public()));
    }
    let s = wait_stats(
        &node,
        "the node to stop listening at 50 connections",
        all_public_listeners_stopped,
    );
    assert!(s["full_reason"].as_str().unwrap().contains("conns"), "{s}");
    assert!(s["listen_stops"].as_u64().unwrap() >= 1);
    assert_eq!(s["max_conns_effective"], 50);
    assert_refused(&node);
    // The localhost listener never stops.
    assert_eq!(
        request(node.local(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status,
        200
    );

    drop(held);
    wait_stats(
        &node,
        "the node to listen again",
        all_public_listeners_listening,
    );
    let r = request(node.public(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(r.status, 200);
}

#[test]
fn memory_budget_far_below_use_refuses_public_but_not_localhost() {
    let node = TestNode::start(&[("COMBD_MEMORY_BUDGET", "1M")]);
    let s = wait_stats(
        &node,
        "pressure 2 and stopped listeners",
        all_public_listeners_stopped,
    );
    assert_eq!(s["pressure"], 2);
    assert_eq!(s["memory_budget_source"], "env");
    assert_eq!(s["memory_budget_bytes"], 1 << 20);
    assert!(s["full_reason"].as_str().unwrap().contains("memory"));
    assert_refused(&node);
    assert_eq!(
        request(node.local(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status,
        200
    );
}

#[test]
fn invalid_memory_budget_fails_startup() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_combd"))
        .env("COMBD_MEMORY_BUDGET", "12X")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("COMBD_MEMORY_BUDGET"));
}

#[test]
fn a_burst_past_the_cap_is_refused_or_answered_503_never_kept() {
    let cap = 20usize;
    let node = TestNode::start(&[("COMBD_MAX_CONNS", "20"), ("COMBD_HEADER_TIMEOUT", "1m")]);
    // Open connections as fast as possible, three times the cap, holding every one.
    let mut streams = Vec::new();
    let mut refused_at_tcp = 0;
    for _ in 0..cap * 3 {
        match TcpStream::connect(node.public()) {
            Ok(s) => streams.push(s),
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => refused_at_tcp += 1,
            Err(e) => panic!("connect failed other than by refusal: {e}"),
        }
    }
    // Classify each connection that got through: a request gets 200 if it was kept, or the
    // 503 that was written on accept if it got in while the node was full.
    let (mut kept, mut late) = (0usize, 0usize);
    for s in streams {
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut w = s.try_clone().unwrap();
        let _ = w.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        let r = read_response(&mut BufReader::new(s));
        match r.status {
            200 => kept += 1,
            503 => {
                late += 1;
                assert_eq!(r.header("retry-after"), Some("1"));
                assert_eq!(r.json()["error"], "overloaded");
                assert_eq!(r.header("connection"), Some("close"));
            }
            other => panic!("unexpected status {other}"),
        }
    }
    eprintln!("burst: {kept} kept, {late} answered 503, {refused_at_tcp} refused at TCP");
    assert!(kept <= cap, "{kept} connections kept past a cap of {cap}");
    assert_eq!(kept + late + refused_at_tcp, cap * 3);
    let s = node.stats();
    assert_eq!(s["refused_late"].as_u64().unwrap() as usize, late, "{s}");
    assert_eq!(
        request(node.local(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status,
        200
    );
}

#[test]
fn disk_low_on_a_small_filesystem_sets_and_clears() {
    let Some(disk) = SmallDisk::mount("4m") else {
        return;
    };
    let data = disk.data_dir();
    let node = TestNode::start(&[("COMBD_DATA", data.to_str().unwrap())]);
    let s = wait_stats(&node, "a first disk measurement", |s| {
        s["measurements"].as_u64().unwrap_or(0) >= 1
    });
    assert_eq!(s["disk_low"], 0);

    // Fill the filesystem to under a tenth free.
    let filler = disk.fill();
    let s = wait_stats(&node, "disk_low to be set", |s| s["disk_low"] == 1);
    assert!(s["disk_free_bytes"].as_u64().unwrap() < 4 << 20);

    std::fs::remove_file(&filler).unwrap();
    wait_stats(&node, "disk_low to clear", |s| s["disk_low"] == 0);
    drop(node);
}
