//! TLS against the real node with a real rustls client verifying a certificate made in the
//! test: HTTPS, WSS echo, a plain-text client, a silent client, refusal while full, a
//! certificate reload on SIGHUP under an open WSS session, the handshake cap, and 2,000 silent
//! sockets that must not lock a real client out of the handshakes.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;
use rustls::pki_types::CertificateDer;
use support::tls::*;
use support::*;
use tungstenite::Message;

fn tmpdir(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("combd-tls-{tag}-{}", std::process::id()))
}

fn start(dir: &Path, extra: &[(&str, &str)]) -> TestNode {
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    let mut env = vec![
        ("COMBD_TLS_LISTEN", "127.0.0.2:0".to_string()),
        ("COMBD_TLS_CERT", c.to_str().unwrap().to_string()),
        ("COMBD_TLS_KEY", k.to_str().unwrap().to_string()),
    ];
    env.extend(extra.iter().map(|(a, b)| (*a, b.to_string())));
    let env: Vec<(&str, &str)> = env.iter().map(|(a, b)| (*a, b.as_str())).collect();
    TestNode::start(&env)
}

/// A rustls client that trusts only `trusted`.
fn tls_connect(node: &TestNode, trusted: &CertificateDer<'static>) -> std::io::Result<Tls> {
    tls_connect_to(node, "127.0.0.2", trusted)
}

#[test]
fn https_and_wss_serve_every_route() {
    let dir = tmpdir("serve");
    let pair = make_pair();
    write_pair(&dir, &pair);
    let node = start(&dir, &[]);
    let mut tls = tls_connect(&node, &pair.der).unwrap();
    assert_eq!(tls.conn.alpn_protocol(), Some(&b"http/1.1"[..]));
    tls.write_all(
        b"POST /o/counter/t HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    .unwrap();
    let mut r = BufReader::new(tls);
    let resp = read_response(&mut r);
    assert_eq!((resp.status, resp.json()["value"].as_i64()), (200, Some(1)));
    assert_eq!(read_response(&mut r).status, 200);

    let tls = tls_connect(&node, &pair.der).unwrap();
    let url = format!("ws://localhost:{}/o/echo/secure", node.tls_port.unwrap());
    let (mut ws, resp) = tungstenite::client(url.as_str(), tls).unwrap();
    assert_eq!(resp.status(), 101);
    ws.send(Message::text("over tls")).unwrap();
    assert_eq!(ws.read().unwrap(), Message::text("over tls"));
    let big = vec![9u8; 300_000];
    ws.send(Message::binary(big.clone())).unwrap();
    assert_eq!(ws.read().unwrap(), Message::binary(big));
    let s = node.stats();
    assert!(s["tls_handshakes"].as_u64().unwrap() >= 2);
    assert_eq!(s["tls_handshakes_in_progress"], 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_plain_text_client_and_a_silent_client_are_dropped() {
    let dir = tmpdir("bad");
    write_pair(&dir, &make_pair());
    let node = start(
        &dir,
        &[
            ("COMBD_TLS_HANDSHAKE_TIMEOUT", "300ms"),
            ("COMBD_TLS_HELLO_TIMEOUT", "300ms"),
        ],
    );
    let mut plain = TcpStream::connect(("127.0.0.2", node.tls_port.unwrap())).unwrap();
    plain.set_read_timeout(Some(WAIT)).unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 1024];
    // The node answers with a TLS alert at most, never HTTP, then closes.
    let mut got = Vec::new();
    loop {
        match plain.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("timed out waiting for the close: {e}"),
        }
    }
    assert!(!got.starts_with(b"HTTP"), "answered in plain text");
    // A client that never sends a ClientHello is closed at the hello timeout.
    let mut silent = TcpStream::connect(("127.0.0.2", node.tls_port.unwrap())).unwrap();
    silent.set_read_timeout(Some(WAIT)).unwrap();
    assert_closed(&mut silent);
    let s = wait_stats(&node, "both closes counted", |s| {
        s["tls_handshake_failures"].as_u64().unwrap_or(0) >= 1
            && s["tls_hello_timeouts"].as_u64().unwrap_or(0) >= 1
    });
    assert_eq!(s["tls_handshake_failures"], 1, "the plain-text client: {s}");
    assert_eq!(s["tls_hello_timeouts"], 1, "the silent client: {s}");
    assert_eq!(
        s["conns"].as_u64().unwrap(),
        1,
        "only the /stats request is open: {s}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_tls_listener_stops_while_full() {
    let dir = tmpdir("full");
    let pair = make_pair();
    write_pair(&dir, &pair);
    let node = start(&dir, &[("COMBD_MEMORY_BUDGET", "1M")]);
    wait_stats(
        &node,
        "every public listener stopped",
        all_public_listeners_stopped,
    );
    let e = TcpStream::connect(("127.0.0.2", node.tls_port.unwrap())).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused);
    // The localhost TLS listener still serves.
    let mut tls = tls_connect_to(&node, "127.0.0.1", &pair.der).unwrap();
    tls.write_all(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let r = read_response(&mut BufReader::new(tls));
    assert_eq!(
        (r.status, r.json()["tcp_refusing"].as_u64()),
        (200, Some(1))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sighup_reloads_the_certificate_and_keeps_open_sessions() {
    let dir = tmpdir("reload");
    let a = make_pair();
    write_pair(&dir, &a);
    let node = start(&dir, &[]);
    let tls = tls_connect(&node, &a.der).unwrap();
    let url = format!("ws://localhost:{}/o/echo/keep", node.tls_port.unwrap());
    let (mut ws, _) = tungstenite::client(url.as_str(), tls).unwrap();
    ws.send(Message::text("before")).unwrap();
    assert_eq!(ws.read().unwrap(), Message::text("before"));

    let b = make_pair();
    write_pair(&dir, &b);
    node.signal(Signal::SIGHUP);
    wait_stats(&node, "the reload", |s| s["tls_reloads"] == 1);
    // New connections get the new certificate.
    assert!(tls_connect(&node, &b.der).is_ok());
    assert!(
        tls_connect(&node, &a.der).is_err(),
        "the old certificate is no longer served"
    );
    // The session opened before the reload goes on.
    ws.send(Message::text("after")).unwrap();
    assert_eq!(ws.read().unwrap(), Message::text("after"));

    // A bad new pair is refused and the last good one stays.
    std::fs::write(
        dir.join("key.pem"),
        "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    node.signal(Signal::SIGHUP);
    wait_stats(&node, "the refused reload", |s| {
        s["tls_reload_failures"] == 1
    });
    assert!(
        tls_connect(&node, &b.der).is_ok(),
        "the last good pair is still served"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_tls_files_fail_startup_naming_the_setting() {
    let dir = tmpdir("startup");
    let a = make_pair();
    let b = make_pair();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.pem"), &a.cert_pem).unwrap();
    std::fs::write(dir.join("b.key"), &b.key_pem).unwrap();
    std::fs::write(dir.join("a.key"), &a.key_pem).unwrap();
    let run = |cert: &str, key: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_combd"))
            .env("COMBD_LISTEN", "127.0.0.2:0")
            .env("COMBD_DATA", dir.join("data"))
            .env("COMBD_TLS_LISTEN", "127.0.0.2:0")
            .env("COMBD_TLS_CERT", dir.join(cert))
            .env("COMBD_TLS_KEY", dir.join(key))
            .output()
            .unwrap()
    };
    for (cert, key, setting) in [
        ("missing.pem", "a.key", "COMBD_TLS_CERT"),
        ("a.pem", "b.key", "COMBD_TLS_KEY"),
        ("a.pem", "missing.key", "COMBD_TLS_KEY"),
    ] {
        let out = run(cert, key);
        assert_eq!(out.status.code(), Some(78), "{cert} {key}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(setting), "{cert} {key}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn handshakes_past_the_per_shard_cap_are_closed_at_once() {
    let dir = tmpdir("cap");
    let pair = make_pair();
    write_pair(&dir, &pair);
    let node = start(
        &dir,
        &[("COMBD_SHARDS", "1"), ("COMBD_TLS_HANDSHAKE_TIMEOUT", "5s")],
    );
    // 300 clients that send a complete ClientHello and nothing after it: each takes a
    // handshake slot once its hello is in; 256 handshakes wait, the rest are refused. They
    // come from 16 addresses, each of which may hold a sixteenth of the slots (a client's
    // share, `crate::fair`): the cap is what binds.
    let hello = client_hello(&pair.der);
    let to: std::net::SocketAddr = ([127, 0, 0, 2], node.tls_port.unwrap()).into();
    let silent: Vec<TcpStream> = (0..300)
        .map(|i| {
            let mut s = connect_from([127, 0, 3, 1 + (i % 16) as u8], to);
            s.write_all(&hello).unwrap();
            s
        })
        .collect();
    let s = wait_stats(&node, "300 ClientHellos in", |s| {
        s["tls_handshakes_in_progress"].as_u64().unwrap_or(0)
            + s["tls_handshakes_refused"].as_u64().unwrap_or(0)
            >= 300
    });
    assert_eq!(s["tls_handshakes_in_progress"], 256, "{s}");
    assert_eq!(s["tls_handshakes_refused"], 44);
    assert_eq!(s["tls_hello_timeouts"], 0, "{s}");
    drop(silent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Silent sockets: this many, spread over [`SOURCES`] client addresses.
const SILENT: usize = 2_000;
/// The client addresses the silent sockets come from: 127.0.0.10 to 127.0.0.19 (loopback).
const SOURCES: u8 = 10;

/// Opens [`SILENT`] TCP connections to the node's TLS port that send nothing, from
/// 127.0.0.10 .. 127.0.0.19 in turn, and waits until the node has accepted every one.
fn open_silent(node: &TestNode) -> Vec<TcpStream> {
    let to: std::net::SocketAddr = ([127, 0, 0, 2], node.tls_port.unwrap()).into();
    let accepted_before = node.stats()["accepted"].as_u64().unwrap();
    let silent: Vec<TcpStream> = (0..SILENT)
        .map(|i| {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
            let from: std::net::SocketAddr =
                ([127, 0, 0, 10 + (i % SOURCES as usize) as u8], 0).into();
            sock.bind(&from.into()).unwrap();
            sock.connect_timeout(&to.into(), WAIT).unwrap();
            sock.into()
        })
        .collect();
    wait_stats(node, "every silent socket accepted", |s| {
        s["accepted"].as_u64().unwrap_or(0) >= accepted_before + SILENT as u64
    });
    silent
}

#[test]
fn silent_sockets_do_not_lock_a_real_client_out_of_the_handshakes() {
    let dir = tmpdir("silent");
    let pair = make_pair();
    write_pair(&dir, &pair);
    // Deadlines long enough that no silent socket is dropped before the checks. Before the
    // hello timeout existed, each of them took one of the 256 handshake slots at its accept
    // and held it to the handshake timeout, and this client was refused at once.
    let node = start(
        &dir,
        &[
            ("COMBD_SHARDS", "1"),
            ("COMBD_TLS_HANDSHAKE_TIMEOUT", "60s"),
            ("COMBD_TLS_HELLO_TIMEOUT", "60s"),
        ],
    );
    let silent = open_silent(&node);
    // A real client completes its handshake and is answered.
    let mut tls = tls_connect(&node, &pair.der).unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(tls);
    assert_eq!(read_response(&mut r).status, 200);
    let s = node.stats();
    // The silent sockets are still open on the node (every one, the real client and /stats)
    // and none holds a handshake slot.
    assert!(
        s["conns"].as_u64().unwrap() >= SILENT as u64 + 2,
        "the silent sockets are open: {s}"
    );
    assert_eq!(s["tls_hello_timeouts"], 0, "none was dropped yet: {s}");
    assert!(
        s["tls_handshakes_in_progress"].as_u64().unwrap()
            < combd_kernel::limits::TLS_HANDSHAKES_MAX as u64,
        "{s}"
    );
    assert_eq!(s["tls_handshakes_refused"], 0, "{s}");
    assert_eq!(s["tls_handshakes"], 1, "{s}");
    drop(silent);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn silent_sockets_are_dropped_at_the_hello_timeout() {
    let dir = tmpdir("hello");
    let pair = make_pair();
    write_pair(&dir, &pair);
    let node = start(
        &dir,
        &[("COMBD_SHARDS", "1"), ("COMBD_TLS_HELLO_TIMEOUT", "500ms")],
    );
    let mut silent = open_silent(&node);
    let s = wait_stats(
        &node,
        "every silent socket dropped at the hello timeout",
        |s| s["tls_hello_timeouts"].as_u64().unwrap_or(0) >= SILENT as u64,
    );
    assert_eq!(s["tls_hello_timeouts"], SILENT as u64, "{s}");
    assert_eq!(s["conns"], 1, "only the /stats request is open: {s}");
    assert_eq!(s["tls_handshakes_refused"], 0, "{s}");
    assert_eq!(s["tls_handshake_failures"], 0, "{s}");
    // Each one sees its close.
    for sock in &mut silent {
        sock.set_read_timeout(Some(WAIT)).unwrap();
        assert_closed(sock);
    }
    // And the node still serves a real client.
    let mut tls = tls_connect(&node, &pair.der).unwrap();
    tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    assert_eq!(read_response(&mut BufReader::new(tls)).status, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Pipelined requests over TLS from clients that never read: each costs the node at most its
/// held responses (64 KiB), its rustls session's send buffer (`tls_send_buffer_max_bytes`) and
/// the session's fixed buffers; the node stops answering them and serves others.
#[test]
fn pipelined_requests_over_tls_from_clients_that_never_read_are_bounded() {
    const CONNS: u64 = 20;
    let dir = tmpdir("pipeline");
    let pair = make_pair();
    write_pair(&dir, &pair);
    let node = start(&dir, &[]);
    let get = b"GET /million/ HTTP/1.1\r\nHost: x\r\n\r\n";
    let post = b"POST /o/counter/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\n1";
    // Warm what the attack touches, over TLS, so the baseline holds it.
    let mut warm = BufReader::new(tls_connect(&node, &pair.der).unwrap());
    for req in [&post[..], &get[..]] {
        warm.get_mut().write_all(req).unwrap();
        assert_eq!(read_response(&mut warm).status, 200);
    }
    let base = rss_peak(node.pid(), std::time::Duration::from_millis(200));

    let mut burst = post.to_vec();
    while burst.len() + get.len() <= 64 * 1024 {
        burst.extend_from_slice(get);
    }
    let attackers: Vec<Tls> = (0..CONNS)
        .map(|_| {
            let mut tls = tls_connect(&node, &pair.der).unwrap();
            tls.write_all(&burst).unwrap();
            tls
        })
        .collect();
    let peak = rss_peak(node.pid(), std::time::Duration::from_secs(2));
    let per_conn = peak.saturating_sub(base) / CONNS;
    eprintln!("{per_conn} bytes a TLS connection");
    let tls_bound = node.stats()["limits"]["tls_send_buffer_max_bytes"]
        .as_u64()
        .unwrap();
    assert!(
        per_conn <= 256 * 1024 + tls_bound,
        "{per_conn} bytes a connection (baseline {base}, peak {peak})"
    );
    let s = node.stats();
    assert!(s["pipeline_held_waits"].as_u64().unwrap() >= CONNS, "{s}");
    warm.get_mut().write_all(get).unwrap();
    assert_eq!(read_response(&mut warm).status, 200, "an honest client");
    drop(attackers);
    let _ = std::fs::remove_dir_all(&dir);
}

/// On the TLS listener a page of the node's own name counts as its own only over https: an
/// `http://` page of that name (which anyone on the path can rewrite) may not open a WSS
/// WebSocket, on the plain listener it may (a TLS proxy in front sends https pages' upgrades
/// there).
#[test]
fn over_tls_only_an_https_page_of_the_own_host_may_upgrade() {
    let dir = tmpdir("origin");
    let pair = make_pair();
    write_pair(&dir, &pair);
    let node = start(&dir, &[]);
    let port = node.tls_port.unwrap();
    let upgrade = |origin: &str| {
        let mut tls = tls_connect(&node, &pair.der).unwrap();
        write!(
            tls,
            "GET /o/echo/o HTTP/1.1\r\nHost: localhost:{port}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nOrigin: {origin}\r\n\r\n"
        )
        .unwrap();
        read_response(&mut BufReader::new(tls)).status
    };
    assert_eq!(upgrade(&format!("https://localhost:{port}")), 101);
    assert_eq!(upgrade(&format!("http://localhost:{port}")), 403);
    assert_eq!(node.stats()["origin_refused"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}
