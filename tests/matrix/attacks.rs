//! The attack patterns, each run from one address ([`ATTACKER`]) against one route for the
//! case's window, bounded in sockets (at most 80 at once) and in time. Each says what it did,
//! or why it does not apply to the route (a skip the table shows).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use flate2::{Compress, Compression, FlushCompress};

use super::measure::{try_read, HONEST};
use super::registry::{http, messages, Role, Target};
use crate::support::tls::{client_hello, tls_over, Pair};
use crate::support::*;

/// The attacker's address.
pub const ATTACKER: [u8; 4] = [127, 0, 5, 1];

/// What one attack is given.
pub struct Ctx<'a> {
    pub node: &'a TestNode,
    /// How long the attack lasts.
    pub window: Duration,
    /// The case's number, for names of its own.
    pub case: usize,
    /// The node's certificate, when it has a TLS listener.
    pub tls: Option<&'a Pair>,
}

/// What an attack did.
pub enum Outcome {
    /// It ran: what it did, and what the honest side of it was not given.
    Ran { note: String, failures: Vec<String> },
    /// It does not apply to the route: why.
    Skipped(String),
}

fn ran(note: String) -> Outcome {
    Outcome::Ran {
        note,
        failures: Vec::new(),
    }
}

/// An attack: its name, and how it is run against a route.
pub struct Attack {
    pub name: &'static str,
    pub run: fn(&Ctx<'_>, &Target) -> Outcome,
}

/// Every attack of the matrix.
pub const ATTACKS: &[Attack] = &[
    Attack {
        name: "pipelined, read a byte a second",
        run: pipelined,
    },
    Attack {
        name: "largest answer, read a byte a second",
        run: largest_answer,
    },
    Attack {
        name: "name spray",
        run: name_spray,
    },
    Attack {
        name: "trickled bodies",
        run: trickled_bodies,
    },
    Attack {
        name: "slowloris heads",
        run: slowloris,
    },
    Attack {
        name: "non-reading WebSockets, busy topic",
        run: ws_not_reading,
    },
    Attack {
        name: "deflate bombs",
        run: deflate_bombs,
    },
    Attack {
        name: "numbered churn, forged places",
        run: numbered_churn,
    },
    Attack {
        name: "subscription flood on /ws",
        run: subscription_flood,
    },
    Attack {
        name: "canned ClientHellos",
        run: canned_hellos,
    },
    Attack {
        name: "connection pool fill",
        run: conn_fill,
    },
];

/// A connection from the attacker to `to`; `rcvbuf`: a small receive buffer, so what the
/// node writes waits in the node. Writes give up after 200 ms (the node stopped reading).
fn attacker_to(to: SocketAddr, rcvbuf: Option<usize>) -> Option<TcpStream> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    if let Some(n) = rcvbuf {
        sock.set_recv_buffer_size(n).ok()?;
    }
    sock.bind(&SocketAddr::from((ATTACKER, 0)).into()).ok()?;
    sock.connect_timeout(&to.into(), WAIT).ok()?;
    let s: TcpStream = sock.into();
    s.set_write_timeout(Some(Duration::from_millis(200))).ok()?;
    s.set_read_timeout(Some(Duration::from_millis(1))).ok()?;
    Some(s)
}

fn attacker(ctx: &Ctx<'_>, rcvbuf: Option<usize>) -> Option<TcpStream> {
    attacker_to(ctx.node.public(), rcvbuf)
}

/// Holds `socks` open for the window, reading one byte a second from each if `read`.
fn hold(ctx: &Ctx<'_>, socks: &mut [TcpStream], started: Instant, read: bool) {
    while started.elapsed() < ctx.window {
        if read {
            for s in socks.iter_mut() {
                let _ = s.read(&mut [0u8; 1]);
            }
        }
        // The attacker's own pace: a byte a second.
        std::thread::sleep(
            Duration::from_secs(1).min(ctx.window.saturating_sub(started.elapsed())),
        );
    }
}

/// Four connections, each 64 KiB of pipelined requests for the route, read a byte a second.
fn pipelined(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    let one = t.ask("victim", Role::Attacker);
    let burst = one.repeat((64 * 1024 / one.len()).max(1));
    let started = Instant::now();
    let mut socks: Vec<TcpStream> = (0..4).filter_map(|_| attacker(ctx, Some(4096))).collect();
    for s in socks.iter_mut() {
        let _ = s.write_all(&burst);
    }
    hold(ctx, &mut socks, started, true);
    ran(format!("4 conns × {} requests", burst.len() / one.len()))
}

/// Makes the object `big` of the route's app answer a `GET` with at least 256 KiB, from the
/// node's own machine; `None` if its answer does not grow with its writes.
fn grow(ctx: &Ctx<'_>, t: &Target) -> Option<usize> {
    let app = t.app.as_ref()?;
    let write = http(
        "POST",
        &t.path("big"),
        app.write.as_deref()?,
        Some(app),
        Role::Setup,
    );
    let read = http("GET", &t.path("big"), b"", Some(app), Role::Setup);
    let size = || {
        let mut s = connect(ctx.node.local());
        s.write_all(&read).unwrap();
        read_response(&mut std::io::BufReader::new(s)).body.len()
    };
    let before = size();
    let mut now = before;
    for round in 0..40 {
        let mut s = connect(ctx.node.local());
        s.write_all(&write.repeat(50)).unwrap();
        let mut r = std::io::BufReader::new(s);
        for _ in 0..50 {
            assert!((200..300).contains(&read_response(&mut r).status));
        }
        now = size();
        if now >= 256 * 1024 || (round == 0 && now < before + 50) {
            break;
        }
    }
    (now >= 256 * 1024).then_some(now)
}

/// The largest answer the route's app can be made to give, asked eight times pipelined on
/// four connections read a byte a second: a grown object's `GET`, or a stateless app's answer
/// to its largest body.
fn largest_answer(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    let Some(app) = &t.app else {
        return Outcome::Skipped("a node route's answer is its own size".into());
    };
    let (ask, note) = if app.stateless && app.write.is_some() {
        let body = vec![b'x'; app.max_input.min(1 << 20) as usize];
        let ask = http("POST", &t.path("big"), &body, Some(app), Role::Attacker);
        (ask, format!("bodies of {} B", body.len()))
    } else if (200..300).contains(&app.get_status) {
        match grow(ctx, t) {
            Some(n) => (
                http("GET", &t.path("big"), b"", Some(app), Role::Attacker),
                format!("GETs of {} KB", n / 1000),
            ),
            None => return Outcome::Skipped("no write of the harness grows its answer".into()),
        }
    } else {
        return Outcome::Skipped("no request of the harness gets a large answer".into());
    };
    let started = Instant::now();
    let mut socks: Vec<TcpStream> = (0..4).filter_map(|_| attacker(ctx, Some(4096))).collect();
    for s in socks.iter_mut() {
        let _ = s.write_all(&ask.repeat(8));
    }
    hold(ctx, &mut socks, started, true);
    ran(format!("4 conns × 8 {note}"))
}

/// Statuses seen, as `200×n 429×m …`.
fn tally(statuses: &[u16]) -> String {
    let mut seen: Vec<(u16, usize)> = Vec::new();
    for s in statuses {
        match seen.iter_mut().find(|(k, _)| k == s) {
            Some((_, n)) => *n += 1,
            None => seen.push((*s, 1)),
        }
    }
    seen.sort();
    seen.iter()
        .map(|(s, n)| format!("{s}×{n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Four connections writing to new object names, 16 pipelined at a time, reading each
/// answer, for the whole window (as fast as the node answers).
fn name_spray(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    match &t.app {
        None => return Outcome::Skipped("a node route has no names".into()),
        Some(a) if a.stateless => return Outcome::Skipped("a stateless app has no objects".into()),
        Some(_) => {}
    }
    let started = Instant::now();
    let mut statuses = Vec::new();
    let mut conns: Vec<std::io::BufReader<TcpStream>> = (0..4)
        .filter_map(|_| attacker(ctx, None))
        .map(|s| {
            s.set_read_timeout(Some(WAIT)).unwrap();
            std::io::BufReader::new(s)
        })
        .collect();
    let mut n = 0;
    while started.elapsed() < ctx.window {
        for c in conns.iter_mut() {
            let raw: Vec<u8> = (n..n + 16)
                .flat_map(|i| t.write(&format!("s{}-{i}", ctx.case), Role::Attacker))
                .collect();
            n += 16;
            if c.get_mut().write_all(&raw).is_err() {
                continue;
            }
            for _ in 0..16 {
                match try_read(c) {
                    Some((status, _)) => statuses.push(status),
                    None => break,
                }
            }
        }
    }
    ran(format!("{n} names: {}", tally(&statuses)))
}

/// Thirty bodies as large as the route takes (at most 100,000 bytes), ten bytes sent, then
/// a byte every 200 ms on each.
fn trickled_bodies(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    let len = t.app.as_ref().map_or(100_000, |a| a.max_input.min(100_000));
    let head = http(
        "POST",
        &t.path("trickle"),
        b"",
        t.app.as_ref(),
        Role::Attacker,
    );
    let head = String::from_utf8(head)
        .unwrap()
        .replace("Content-Length: 0", &format!("Content-Length: {len}"));
    let started = Instant::now();
    let mut socks: Vec<TcpStream> = (0..30).filter_map(|_| attacker(ctx, None)).collect();
    for s in socks.iter_mut() {
        let _ = s.write_all(head.as_bytes());
        let _ = s.write_all(&[b'1'; 10][..len.min(10) as usize]);
    }
    let mut sent = 10u64;
    while started.elapsed() < ctx.window && sent < len {
        // The attacker's own pace: a byte every 200 ms.
        std::thread::sleep(Duration::from_millis(200));
        for s in socks.iter_mut() {
            let _ = s.write_all(b"1");
        }
        sent += 1;
    }
    hold(ctx, &mut socks, started, false);
    ran(format!("30 bodies of {len} B, {sent} B sent each"))
}

/// Thirty heads for the route, a byte every 100 ms on each, never complete.
fn slowloris(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    let mut head = t.ask("slow", Role::Attacker);
    head.truncate(head.len() - 2);
    head.extend(std::iter::repeat_n(b'a', 4096));
    let started = Instant::now();
    let mut socks: Vec<TcpStream> = (0..30).filter_map(|_| attacker(ctx, None)).collect();
    let mut i = 0;
    while started.elapsed() < ctx.window && i < head.len() {
        for s in socks.iter_mut() {
            let _ = s.write_all(&head[i..i + 1]);
        }
        i += 1;
        // The attacker's own pace: a byte every 100 ms.
        std::thread::sleep(Duration::from_millis(100));
    }
    ran(format!("30 heads, {i} B sent each"))
}

/// The upgrade request for `path` (a token if the app is identified; permessage-deflate if
/// `deflate`).
fn upgrade_head(t: &Target, path: &str, role: Role, deflate: bool) -> Vec<u8> {
    let mut head = http("GET", path, b"", t.app.as_ref(), role);
    head.truncate(head.len() - 2);
    head.extend_from_slice(
        b"Upgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n",
    );
    if deflate {
        head.extend_from_slice(b"Sec-WebSocket-Extensions: permessage-deflate\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// Upgrades `s` to a WebSocket; whether the node answered 101.
fn upgrade(s: &mut TcpStream, head: &[u8]) -> bool {
    s.set_read_timeout(Some(WAIT)).unwrap();
    if s.write_all(head).is_err() {
        return false;
    }
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n\r\n") {
        if s.read_exact(&mut b).is_err() {
            return false;
        }
        got.push(b[0]);
    }
    let _ = s.set_read_timeout(Some(Duration::from_millis(1)));
    got.starts_with(b"HTTP/1.1 101")
}

/// A final, masked client frame; `rsv1`: compressed.
fn frame(opcode: u8, rsv1: bool, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let rsv1 = if rsv1 { 0x40 } else { 0 };
    combd_shards::ws::encode_masked_frame(&mut out, 0x80 | rsv1 | opcode, payload);
    out
}

/// Eight WebSockets on the route's object that never read (small receive buffers), while a
/// ninth of the attacker's keeps its topic busy: a message every 2 ms, in turn a click, a
/// chat line and a word (what the app answers, to it or to the topic, is the app's). An
/// honest WebSocket on the same object is let in meanwhile.
fn ws_not_reading(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    if t.app.is_none() {
        return Outcome::Skipped("a node route takes no WebSocket".into());
    }
    let head = upgrade_head(t, &t.path("busy"), Role::Attacker, false);
    let started = Instant::now();
    let mut quiet: Vec<TcpStream> = (0..8)
        .filter_map(|_| attacker(ctx, Some(4096)))
        .filter_map(|mut s| upgrade(&mut s, &head).then_some(s))
        .collect();
    if quiet.is_empty() {
        return Outcome::Skipped("the app let no WebSocket in".into());
    }
    let mut driver = attacker(ctx, None).and_then(|mut s| upgrade(&mut s, &head).then_some(s));
    let mut sent = 0u64;
    let mut failures = Vec::new();
    while started.elapsed() < ctx.window {
        if let Some(d) = driver.as_mut() {
            let m = &messages(sent)[(sent % 3) as usize];
            if d.write_all(&frame(1, false, m.as_bytes())).is_err() {
                driver = None;
            }
            let _ = drain(driver.as_mut());
            sent += 1;
        }
        if sent == 100 {
            failures.extend(honest_ws(ctx, t));
        }
        // The attacker's own pace, under the node's message rate.
        std::thread::sleep(Duration::from_millis(2));
    }
    hold(ctx, &mut quiet, started, false);
    Outcome::Ran {
        note: format!("{} quiet, {sent} messages", quiet.len()),
        failures,
    }
}

/// WebSockets that attach numbered and leave at once, again and again (for an app that keeps
/// presence each is a join and a leave told to the room; each attach reads the topic's log),
/// and upgrades with forged places (ahead of the log, another epoch): the node's attach,
/// resume and presence paths under churn.
fn numbered_churn(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    if t.app.is_none() {
        return Outcome::Skipped("a node route takes no WebSocket".into());
    }
    let places = ["new", "0.0", "1.99999999", "77.3"];
    let started = Instant::now();
    let (mut opened, mut refused, mut i) = (0u64, 0u64, 0usize);
    let mut failures = Vec::new();
    while started.elapsed() < ctx.window {
        let path = format!(
            "{}?combd_after={}",
            t.path("busy"),
            places[i % places.len()]
        );
        let head = upgrade_head(t, &path, Role::Attacker, false);
        // Each socket closes as it goes out of scope: its session leaves.
        match attacker(ctx, None).map(|mut s| upgrade(&mut s, &head)) {
            Some(true) => opened += 1,
            _ => refused += 1,
        }
        i += 1;
        if i == 50 {
            failures.extend(honest_ws(ctx, t));
        }
        // The attacker's own pace, under the node's accept rate for one address.
        std::thread::sleep(Duration::from_millis(5));
    }
    Outcome::Ran {
        note: format!("{opened} attached and left, {refused} refused"),
        failures,
    }
}

/// Multiplexed sockets (`/ws`) that subscribe to as many of the route's objects as the node
/// lets them (past a socket's bound, past the client's share of the node's pool), send each
/// a message and never read (small receive buffers), while the honest client subscribes to
/// the route's object on a socket of its own and must be taken.
fn subscription_flood(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    let Some(app) = t.app.as_ref().filter(|a| !a.stateless) else {
        return Outcome::Skipped("no object to subscribe to".into());
    };
    let head = upgrade_head(t, "/ws", Role::Attacker, false);
    let started = Instant::now();
    let mut socks: Vec<TcpStream> = (0..8)
        .filter_map(|_| attacker(ctx, Some(4096)))
        .filter_map(|mut s| upgrade(&mut s, &head).then_some(s))
        .collect();
    let mut sent = 0u64;
    for (k, s) in socks.iter_mut().enumerate() {
        for ch in 0..120u32 {
            let name = format!("flood-{}-{}", ctx.case, (k as u32 * 120 + ch) % 64);
            let mut out = frame(1, false, format!("+{ch}|{}/{name}", app.name).as_bytes());
            out.extend(frame(
                1,
                false,
                format!("{ch}|{}", messages(sent)[0]).as_bytes(),
            ));
            if s.write_all(&out).is_err() {
                break;
            }
            sent += 1;
        }
    }
    let mut failures = Vec::new();
    failures.extend(honest_subscription(ctx, t));
    hold(ctx, &mut socks, started, false);
    Outcome::Ran {
        note: format!("{} sockets, {sent} subscribes sent", socks.len()),
        failures,
    }
}

/// An honest multiplexed socket subscribing to the route's object: what went wrong, if
/// anything.
fn honest_subscription(ctx: &Ctx<'_>, t: &Target) -> Option<String> {
    let app = t.app.as_ref()?;
    let mut s = connect_from(HONEST, ctx.node.public());
    if !upgrade(&mut s, &upgrade_head(t, "/ws", Role::Honest, false)) {
        return Some("an honest /ws was not let in".into());
    }
    let sub = format!("+1|{}/busy", app.name);
    s.write_all(&frame(1, false, sub.as_bytes())).ok()?;
    s.set_read_timeout(Some(WAIT)).ok()?;
    loop {
        let Ok((_, payload)) = read_frame(&mut s) else {
            return Some("an honest subscribe was not answered".into());
        };
        if payload.starts_with(b"+1|") {
            return None;
        }
        if payload.starts_with(b"-1|") {
            let why = String::from_utf8_lossy(&payload);
            return Some(format!("an honest subscribe was refused: {why}"));
        }
    }
}

/// Reads whatever waits on the driver's socket, so only the quiet ones hold the node's
/// writes.
fn drain(s: Option<&mut TcpStream>) -> Option<()> {
    let s = s?;
    let mut buf = [0u8; 16 * 1024];
    while s.read(&mut buf).ok()? > 0 {}
    Some(())
}

/// An honest WebSocket to the route's object: what went wrong, if anything.
fn honest_ws(ctx: &Ctx<'_>, t: &Target) -> Option<String> {
    let mut s = connect_from(HONEST, ctx.node.public());
    let head = upgrade_head(t, &t.path("busy"), Role::Honest, false);
    (!upgrade(&mut s, &head)).then(|| "an honest WebSocket was not let in".to_string())
}

/// A message's payload compressed as a permessage-deflate sender does.
fn compress(data: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(data.len() / 100 + 1024);
    c.compress_vec(data, &mut out, FlushCompress::Sync).unwrap();
    out.truncate(out.len() - 4);
    out
}

/// Eight WebSockets offering permessage-deflate, each sending 62 messages of about a
/// kilobyte that inflate to the largest message the node takes, never reading.
fn deflate_bombs(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    if t.app.is_none() {
        return Outcome::Skipped("a node route takes no WebSocket".into());
    }
    let max = figure_of(ctx, "ws_max_message_bytes");
    let bomb = frame(2, true, &compress(&vec![0u8; max as usize - 64]));
    let head = upgrade_head(t, &t.path("bomb"), Role::Attacker, true);
    let started = Instant::now();
    let mut socks: Vec<TcpStream> = (0..8)
        .filter_map(|_| attacker(ctx, Some(4096)))
        .filter_map(|mut s| upgrade(&mut s, &head).then_some(s))
        .collect();
    if socks.is_empty() {
        return Outcome::Skipped("the app let no WebSocket in".into());
    }
    for s in socks.iter_mut() {
        let _ = s.write_all(&bomb.repeat(62));
    }
    hold(ctx, &mut socks, started, false);
    ran(format!(
        "{} sockets × 62 bombs of {} B",
        socks.len(),
        bomb.len()
    ))
}

fn figure_of(ctx: &Ctx<'_>, limit: &str) -> u64 {
    ctx.node.stats()["limits"][limit]
        .as_u64()
        .unwrap_or_else(|| panic!("{limit} in /stats limits"))
}

/// Forty copies of one real ClientHello from the attacker, each socket then silent, while an
/// honest client completes a real handshake and is answered. The node's route: `/healthz`.
fn canned_hellos(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    let (Some(pair), Some(port)) = (ctx.tls, ctx.node.tls_port) else {
        return Outcome::Skipped("TLS is off".into());
    };
    if t.label != "/healthz" {
        return Outcome::Skipped("node-wide: attacked once, against /healthz".into());
    }
    let to = SocketAddr::from(([127, 0, 0, 2], port));
    let hello = client_hello(&pair.der);
    let started = Instant::now();
    let mut socks: Vec<TcpStream> = (0..40).filter_map(|_| attacker_to(to, None)).collect();
    for s in socks.iter_mut() {
        let _ = s.write_all(&hello);
    }
    let mut failures = Vec::new();
    let served = tls_over(connect_from(HONEST, to), &pair.der).and_then(|mut tls| {
        tls.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")?;
        Ok(read_response(&mut std::io::BufReader::new(tls)).status)
    });
    if !matches!(served, Ok(200)) {
        failures.push(format!("an honest TLS client: {served:?}"));
    }
    hold(ctx, &mut socks, started, false);
    Outcome::Ran {
        note: format!("{} hellos", socks.len()),
        failures,
    }
}

/// Eighty connections from the attacker, silent: past its address's cap they are closed at
/// once. The node's route: `/healthz`.
fn conn_fill(ctx: &Ctx<'_>, t: &Target) -> Outcome {
    if t.label != "/healthz" {
        return Outcome::Skipped("node-wide: attacked once, against /healthz".into());
    }
    let started = Instant::now();
    let mut socks: Vec<TcpStream> = (0..80).filter_map(|_| attacker(ctx, None)).collect();
    hold(ctx, &mut socks, started, false);
    ran(format!("{} connections", socks.len()))
}
