//! `combd-bench`: load scenarios against a running combd node.
//!
//! This first scenario, `idle`, measures what an idle WebSocket costs the node: it opens N
//! WebSockets to the public address from source addresses spread over 127.0.0.10-250, holds
//! them, and reads the node's resident memory (`/proc/<pid>/status`, the pid from `/stats`)
//! and the kernel's TCP memory (`/proc/net/sockstat`) before and after. Then it pings a sample
//! of the sockets and reports the round trip.
//!
//! `flood` opens N connections as fast as it can past the node's cap while one WebSocket
//! already connected keeps echoing, and reports how many were kept, answered 503, or refused
//! at TCP, how long the node took from full to refusing, and the connected client's echo
//! latency during the flood.
//!
//! `click` and `mailbox`: see `click.rs`; `http`: `http.rs`; `fanout`: `fanout.rs`; `chat`:
//! `chat.rs`; `presence`: `presence.rs`; `storm` (with `bench/storm.sh`): `storm.rs`.
//!
//! Usage: `combd-bench idle|flood|click|mailbox --port P [--target 127.0.0.2] [--conns N]
//! [--out FILE] [--pages N] [--board NAME] [--interval-ms MS] [--duration-s S] [--deflate on]`
//! `--deflate on`: every WebSocket offers permessage-deflate (as browsers do) and decompresses
//! what comes compressed.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

mod chat;
mod click;
mod fanout;
mod http;
mod presence;
mod storm;
mod subscriptions;
mod svg;
mod target;
mod tls;

pub(crate) use target::{
    cpu_seconds, local_get, rss_bytes, slab_bytes, stats_or_null, target_pid, tcp_mem_bytes,
    CpuWindow,
};

#[derive(Clone)]
pub(crate) struct Args {
    target: Ipv4Addr,
    port: u16,
    conns: usize,
    out: Option<String>,
    /// `click`: pages the viewers spread over, the board, the click interval, the run length.
    pages: u64,
    board: String,
    /// `click`: the app serving the board (`million`, or a module speaking its protocol).
    app: String,
    interval: Duration,
    duration: Duration,
    /// TLS scenarios: the certificate to trust and the node's TLS port.
    tls_cert: Option<String>,
    tls_port: Option<u16>,
    /// The target's pid, for a target without combd's `/stats` (the peers).
    pid: Option<u64>,
    /// `idle`: view this million board instead of the echo app.
    idle_board: Option<String>,
    /// `fanout`: frames each publisher call broadcasts.
    frames: usize,
    /// `chat`: the rooms the users spread over, and the node's HS256 secret to mint tokens.
    rooms: usize,
    auth_key_file: Option<String>,
    /// `presence`: changes (a leave or a join) a second; `storm`: clicks a second.
    rate: u64,
    /// `storm`: the file written once the viewers are live (the script then restarts the node).
    ready: Option<String>,
    /// `subscriptions`: subscriptions on each multiplexed socket.
    subs: usize,
}

/// `--deflate on`: the WebSockets offer permessage-deflate.
pub(crate) static DEFLATE: AtomicBool = AtomicBool::new(false);

/// A permessage-deflate message's payload decompressed (RFC 7692, 7.2.2: the sync flush's
/// four bytes added back); what does not decompress comes back empty.
pub(crate) fn inflate(payload: &[u8]) -> Vec<u8> {
    let mut d = flate2::Decompress::new(false);
    let mut input = payload.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut out = Vec::with_capacity(payload.len() * 8 + 1024);
    loop {
        let before = d.total_in();
        if d.decompress_vec(
            &input[d.total_in() as usize..],
            &mut out,
            flate2::FlushDecompress::Sync,
        )
        .is_err()
        {
            return Vec::new();
        }
        if d.total_in() as usize == input.len() && out.len() < out.capacity() {
            return out;
        }
        if out.len() == out.capacity() {
            out.reserve(out.len());
        } else if d.total_in() == before {
            return Vec::new();
        }
    }
}

fn parse_args() -> Result<(String, Args), String> {
    let mut it = std::env::args().skip(1);
    let scenario = it
        .next()
        .ok_or("usage: combd-bench idle --port P [--target IP] [--conns N] [--out FILE]")?;
    let mut a = Args {
        target: Ipv4Addr::new(127, 0, 0, 2),
        port: 0,
        conns: 10_000,
        out: None,
        pages: 245,
        board: "bench".into(),
        app: "million".into(),
        interval: Duration::from_secs(10),
        duration: Duration::from_secs(60),
        tls_cert: None,
        tls_port: None,
        pid: None,
        idle_board: None,
        frames: 8,
        rooms: 10,
        auth_key_file: None,
        rate: 100,
        ready: None,
        subs: 100,
    };
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--target" => a.target = v.parse().map_err(|_| format!("--target {v:?}"))?,
            "--port" => a.port = v.parse().map_err(|_| format!("--port {v:?}"))?,
            "--conns" => a.conns = v.parse().map_err(|_| format!("--conns {v:?}"))?,
            "--out" => a.out = Some(v),
            "--frames" => a.frames = v.parse().map_err(|_| format!("--frames {v:?}"))?,
            "--rooms" => a.rooms = v.parse().map_err(|_| format!("--rooms {v:?}"))?,
            "--rate" => a.rate = v.parse().map_err(|_| format!("--rate {v:?}"))?,
            "--ready" => a.ready = Some(v),
            "--subs" => a.subs = v.parse().map_err(|_| format!("--subs {v:?}"))?,
            "--auth-key-file" => a.auth_key_file = Some(v),
            "--deflate" => DEFLATE.store(v == "on", Ordering::Relaxed),
            "--pages" => a.pages = v.parse().map_err(|_| format!("--pages {v:?}"))?,
            "--board" => {
                a.idle_board = Some(v.clone());
                a.board = v;
            }
            "--app" => a.app = v,
            "--tls-cert" => a.tls_cert = Some(v),
            "--pid" => a.pid = Some(v.parse().map_err(|_| format!("--pid {v:?}"))?),
            "--tls-port" => a.tls_port = Some(v.parse().map_err(|_| format!("--tls-port {v:?}"))?),
            "--interval-ms" => {
                a.interval =
                    Duration::from_millis(v.parse().map_err(|_| format!("--interval-ms {v:?}"))?)
            }
            "--duration-s" => {
                a.duration =
                    Duration::from_secs(v.parse().map_err(|_| format!("--duration-s {v:?}"))?)
            }
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.port == 0 {
        return Err("--port is required".into());
    }
    Ok((scenario, a))
}

/// Connects to the target from a source address picked by `i` (127.0.0.10-250).
pub(crate) fn connect_from(target: Ipv4Addr, port: u16, i: usize) -> Result<TcpStream, String> {
    let src = Ipv4Addr::new(127, 0, 0, 10 + (i % 241) as u8);
    let sock =
        Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).map_err(|e| e.to_string())?;
    sock.bind(&SocketAddr::V4(SocketAddrV4::new(src, 0)).into())
        .map_err(|e| format!("bind {src}: {e}"))?;
    sock.connect(&SocketAddr::V4(SocketAddrV4::new(target, port)).into())
        .map_err(|e| format!("connect: {e}"))?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    Ok(s)
}

/// Sends a WebSocket upgrade for `path` on `s` and reads the 101; returns any bytes read past
/// the handshake (the first frames).
pub(crate) fn upgrade(s: &mut (impl Read + Write), path: &str) -> Result<Vec<u8>, String> {
    upgrade_with(s, path, "")
}

/// [`upgrade`] with `extra` header lines (each ending in CRLF).
pub(crate) fn upgrade_with(
    s: &mut (impl Read + Write),
    path: &str,
    extra: &str,
) -> Result<Vec<u8>, String> {
    let ext = if DEFLATE.load(Ordering::Relaxed) {
        "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    } else {
        ""
    };
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{ext}{extra}\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let end = loop {
        let n = s.read(&mut tmp).map_err(|e| format!("handshake: {e}"))?;
        if n == 0 {
            return Err("closed during the handshake".into());
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
    };
    if !buf.starts_with(b"HTTP/1.1 101") {
        return Err(format!(
            "handshake: {:?}",
            String::from_utf8_lossy(&buf[..buf.len().min(40)])
        ));
    }
    Ok(buf[end..].to_vec())
}

/// Opens a WebSocket to `path` from a source address picked by `i`; returns the stream and
/// any bytes read past the handshake.
pub(crate) fn open_ws_path(
    target: Ipv4Addr,
    port: u16,
    i: usize,
    path: &str,
) -> Result<(TcpStream, Vec<u8>), String> {
    let mut s = connect_from(target, port, i)?;
    let rest = upgrade(&mut s, path)?;
    Ok((s, rest))
}

/// An idle WebSocket: on the echo app, or with `--board`, a viewer of the million board's
/// pages (the protocol the peers speak too).
fn open_ws(a: &Args, i: usize) -> Result<TcpStream, String> {
    let path = match &a.idle_board {
        Some(board) => format!("/o/million/{board}?page={}", i as u64 % a.pages.max(1)),
        None => format!("/o/echo/idle{}", i % 100),
    };
    open_ws_path(a.target, a.port, i, &path).map(|(s, _)| s)
}

/// Sends a masked ping and waits for the pong.
fn ping(s: &mut TcpStream) -> Result<Duration, String> {
    let t = Instant::now();
    s.write_all(&[0x89, 0x80, 1, 2, 3, 4])
        .map_err(|e| e.to_string())?;
    // Frames that were waiting (a page's state, updates) come first: skip them.
    loop {
        let mut hdr = [0u8; 2];
        s.read_exact(&mut hdr).map_err(|e| e.to_string())?;
        let len = match hdr[1] & 0x7f {
            126 => {
                let mut l = [0u8; 2];
                s.read_exact(&mut l).map_err(|e| e.to_string())?;
                u64::from(u16::from_be_bytes(l))
            }
            127 => {
                let mut l = [0u8; 8];
                s.read_exact(&mut l).map_err(|e| e.to_string())?;
                u64::from_be_bytes(l)
            }
            n => u64::from(n),
        };
        std::io::copy(&mut (&mut *s).take(len), &mut std::io::sink()).map_err(|e| e.to_string())?;
        if hdr[0] == 0x8A {
            return Ok(t.elapsed());
        }
    }
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn idle(a: &Args) -> Result<serde_json::Value, String> {
    let pid = crate::target_pid(a)?;
    let rss_before = rss_bytes(pid);
    let tcp_before = tcp_mem_bytes();
    let slab_before = slab_bytes();
    let cpu_before = cpu_seconds(pid);
    let out_before = stats_or_null(a)["bytes_out"].as_u64().unwrap_or(0);
    let started = Instant::now();
    let mut socks = Vec::with_capacity(a.conns);
    let mut failed = 0usize;
    for i in 0..a.conns {
        match open_ws(a, i) {
            Ok(s) => socks.push(s),
            Err(e) => {
                failed += 1;
                if failed <= 3 {
                    eprintln!("connection {i}: {e}");
                }
            }
        }
        if (i + 1) % 1000 == 0 {
            eprintln!(
                "idle: {} open, {failed} failed, {:.1}s",
                socks.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let open_secs = started.elapsed().as_secs_f64();
    let open_cpu = cpu_seconds(pid) - cpu_before;
    // Let the node settle: the last handshakes' buffers are freed and the allocator is quiet.
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = rss_bytes(pid);
    let tcp_after = tcp_mem_bytes();
    let slab_after = slab_bytes();
    let stats = stats_or_null(a);
    let mut rtts = Vec::new();
    let step = (socks.len() / 200).max(1);
    for s in socks.iter_mut().step_by(step) {
        rtts.push(ping(s)?);
    }
    rtts.sort();
    let n = socks.len().max(1) as f64;
    let user_per = (rss_after.saturating_sub(rss_before)) as f64 / n;
    // Both ends of each loopback connection are on this machine: half the delta is the node's.
    let kernel_per = (tcp_after.saturating_sub(tcp_before)) as f64 / n / 2.0;
    let slab_per = (slab_after.saturating_sub(slab_before)) as f64 / n / 2.0;
    Ok(serde_json::json!({
        "scenario": "idle",
        "conns_requested": a.conns,
        "conns_open": socks.len(),
        "conns_failed": failed,
        "open_seconds": open_secs,
        "node_ws_open": stats["ws_open"],
        "node_rss_before_bytes": rss_before,
        "node_rss_after_bytes": rss_after,
        "node_user_bytes_per_conn": user_per.round(),
        "tcp_mem_before_bytes": tcp_before,
        "tcp_mem_after_bytes": tcp_after,
        "kernel_tcp_bytes_per_conn_half_of_pair": kernel_per.round(),
        "slab_before_bytes": slab_before,
        "slab_after_bytes": slab_after,
        "kernel_slab_bytes_per_conn_half_of_pair": slab_per.round(),
        "ping_samples": rtts.len(),
        "ping_p50_ms": percentile(&rtts, 0.50),
        "ping_p99_ms": percentile(&rtts, 0.99),
        "deflate": DEFLATE.load(Ordering::Relaxed),
        "node_cpu_seconds_to_open": open_cpu,
        "node_bytes_out_per_conn": (stats["bytes_out"].as_u64().unwrap_or(0).saturating_sub(out_before)) as f64 / n,
        "node_ws_deflated_out": stats["ws_deflated_out"],
    }))
}

/// Sends one masked text frame.
fn send_text(s: &mut TcpStream, payload: &[u8]) -> Result<(), String> {
    let mask = [1u8, 2, 3, 4];
    let mut f = vec![0x81, 0x80 | payload.len() as u8];
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&f).map_err(|e| e.to_string())
}

/// Reads one unmasked server frame of at most 125 bytes and returns its payload.
fn read_small_frame(s: &mut TcpStream) -> Result<Vec<u8>, String> {
    let mut hdr = [0u8; 2];
    s.read_exact(&mut hdr).map_err(|e| e.to_string())?;
    let mut p = vec![0u8; (hdr[1] & 0x7f) as usize];
    s.read_exact(&mut p).map_err(|e| e.to_string())?;
    Ok(p)
}

fn flood(a: &Args) -> Result<serde_json::Value, String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let before: serde_json::Value =
        serde_json::from_str(&local_get(a.port, "/stats")?).map_err(|e| format!("stats: {e}"))?;
    // The client already connected: it echoes every 10 ms through the flood.
    let mut served = open_ws_path(a.target, a.port, 0, "/o/echo/served").map(|(s, _)| s)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let echo = std::thread::spawn(move || {
        let mut lat = Vec::new();
        let mut errors = 0usize;
        while !stop2.load(Ordering::Relaxed) {
            let t = Instant::now();
            let ok = send_text(&mut served, b"tick").and_then(|_| read_small_frame(&mut served));
            match ok {
                Ok(_) => lat.push(t.elapsed()),
                Err(_) => errors += 1,
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        (lat, errors)
    });

    let started = Instant::now();
    let mut streams = Vec::new();
    let mut connect_times = Vec::new();
    let mut refused_times = Vec::new();
    let mut other_errors = 0usize;
    for i in 0..a.conns {
        let src = Ipv4Addr::new(127, 0, 0, 10 + (i % 241) as u8);
        let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP))
            .map_err(|e| e.to_string())?;
        sock.bind(&SocketAddr::V4(SocketAddrV4::new(src, 0)).into())
            .map_err(|e| e.to_string())?;
        match sock.connect(&SocketAddr::V4(SocketAddrV4::new(a.target, a.port)).into()) {
            Ok(()) => {
                connect_times.push(started.elapsed());
                streams.push(TcpStream::from(sock));
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused_times.push(started.elapsed())
            }
            Err(_) => other_errors += 1,
        }
    }
    let flood_secs = started.elapsed().as_secs_f64();
    // Classify what got in: a request gets 200 if kept, the 503 written on accept if late.
    let (mut kept, mut late, mut closed) = (0usize, 0usize, 0usize);
    let mut last_kept: Option<Duration> = None;
    for (s, t) in streams.iter_mut().zip(&connect_times) {
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        let mut buf = [0u8; 12];
        match s.read_exact(&mut buf) {
            Ok(()) if &buf[9..12] == b"200" => {
                kept += 1;
                last_kept = Some(*t);
            }
            Ok(()) if &buf[9..12] == b"503" => late += 1,
            _ => closed += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (mut lat, echo_errors) = echo.join().map_err(|_| "echo thread panicked")?;
    lat.sort();
    let after: serde_json::Value =
        serde_json::from_str(&local_get(a.port, "/stats")?).map_err(|e| format!("stats: {e}"))?;
    let first_refused = refused_times.first().copied();
    let full_to_refusing_ms = match (last_kept, first_refused) {
        (Some(k), Some(r)) if r >= k => Some((r - k).as_secs_f64() * 1000.0),
        _ => None,
    };
    let delta = |k: &str| {
        after[k]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(before[k].as_u64().unwrap_or(0))
    };
    Ok(serde_json::json!({
        "scenario": "flood",
        "attempts": a.conns,
        "flood_seconds": flood_secs,
        "kept": kept,
        "answered_503": late,
        "closed_without_answer": closed,
        "refused_at_tcp": refused_times.len(),
        "other_connect_errors": other_errors,
        "full_to_refusing_ms": full_to_refusing_ms,
        "node_max_conns_effective": after["max_conns_effective"],
        "node_refused_late": delta("refused_late"),
        "node_listen_stops": delta("listen_stops"),
        "node_memory_own_bytes": after["memory_own_bytes"],
        "node_memory_budget_bytes": after["memory_budget_bytes"],
        "node_memory_budget_source": after["memory_budget_source"],
        "node_pressure": after["pressure"],
        "served_echo_samples": lat.len(),
        "served_echo_errors": echo_errors,
        "served_echo_p50_ms": percentile(&lat, 0.50),
        "served_echo_p99_ms": percentile(&lat, 0.99),
        "served_echo_max_ms": lat.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
    }))
}

/// Above this share of its core, the generator (one thread) may be what limits a figure.
const GENERATOR_SATURATED_PERCENT: f64 = 90.0;

/// Marks a result whose generator ran above [`GENERATOR_SATURATED_PERCENT`] of its core
/// (`"generator_saturated": true`) and says so on stderr: its figures may be the generator's
/// ceiling, not the target's.
fn flag_saturated_generator(v: &mut serde_json::Value) {
    let Some(cpu) = v.get("generator_cpu_percent").and_then(|c| c.as_f64()) else {
        return;
    };
    let saturated = cpu > GENERATOR_SATURATED_PERCENT;
    if saturated {
        eprintln!(
            "combd-bench: warning: the generator used {cpu:.0} % of its core (above \
             {GENERATOR_SATURATED_PERCENT:.0} %): the figures may be its ceiling, not the target's"
        );
    }
    if let Some(map) = v.as_object_mut() {
        map.insert("generator_saturated".into(), saturated.into());
    }
}

fn main() {
    // `combd-bench gen-cert DIR`: a self-signed certificate for localhost (cert.pem, key.pem).
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("gen-cert") {
        let dir = std::path::PathBuf::from(argv.get(2).map_or(".", String::as_str));
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
            .map_err(|e| e.to_string())
            .and_then(|ck| {
                std::fs::write(dir.join("cert.pem"), ck.cert.pem()).map_err(|e| e.to_string())?;
                std::fs::write(dir.join("key.pem"), ck.key_pair.serialize_pem())
                    .map_err(|e| e.to_string())
            });
        if let Err(e) = made {
            eprintln!("combd-bench: gen-cert: {e}");
            std::process::exit(1);
        }
        return;
    }
    let (scenario, args) = match parse_args() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("combd-bench: {e}");
            std::process::exit(2);
        }
    };
    let result = match scenario.as_str() {
        "idle" => idle(&args),
        "flood" => flood(&args),
        "click" => click::click(&args),
        // `overload`: the click scenario with more viewers than the node holds; the result
        // counts how those turned away were refused (at TCP, 503, closed).
        "overload" => click::click(&args),
        "mailbox" => click::mailbox(&args),
        "idle-tls" => tls::idle_tls(&args),
        "http" => http::http(&args),
        "handshakes" => tls::handshakes(&args),
        "fanout" => fanout::fanout(&args),
        "chat" => chat::chat(&args),
        "presence" => presence::presence(&args),
        "storm" => storm::storm(&args),
        "subscriptions" => subscriptions::subscriptions(&args),
        other => Err(format!(
            "unknown scenario {other:?} (have: idle, flood, click, overload, mailbox, idle-tls, http, handshakes, fanout, chat, presence, storm, subscriptions)"
        )),
    };
    match result {
        Ok(mut v) => {
            flag_saturated_generator(&mut v);
            let text = serde_json::to_string_pretty(&v).unwrap_or_default();
            println!("{text}");
            if let Some(path) = &args.out {
                if let Err(e) = std::fs::write(path, &text) {
                    eprintln!("combd-bench: cannot write {path}: {e}");
                    std::process::exit(1);
                }
            }
        }
        Err(e) => {
            eprintln!("combd-bench: {e}");
            std::process::exit(1);
        }
    }
}
