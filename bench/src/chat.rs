//! The `chat` scenario (issue 28): N users in `--rooms` rooms of the `chat` app, each with a
//! token of its own (`u<i>`, minted from `--auth-key-file`, the node's HS256 secret), each
//! saying something every `interval` (jittered ±50 %). A message's **echo** is the time from
//! sending it to receiving its broadcast back (the same text from the same user); a message
//! with no echo within 10 s, or answered with an error, is **lost**. Every user in a room gets
//! every message of the room: the node's fan-out is users / rooms frames per message. One
//! thread drives every socket with mio (its CPU time is reported).

use std::collections::{BinaryHeap, HashMap};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use mio::net::TcpStream as MioStream;
use mio::{Events, Interest, Poll, Token};

use crate::click::{frames, masked_text, Rng};
use crate::{percentile, rss_bytes, Args, CpuWindow};

struct User {
    stream: MioStream,
    sub: String,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    seq: u64,
    pending: HashMap<u64, Instant>,
    closed: bool,
}

/// An HS256 token for `sub`, signed with the secret in `key_file`, valid for a day.
pub(crate) fn token(secret: &str, sub: &str) -> Result<String, String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &serde_json::json!({ "sub": sub, "name": sub, "exp": now + 86_400 }),
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())
}

/// The node's HS256 secret, from `--auth-key-file`, for `scenario`'s users' tokens.
pub(crate) fn secret(a: &Args, scenario: &str) -> Result<String, String> {
    let key_file = a.auth_key_file.as_deref().ok_or_else(|| {
        format!("{scenario} needs --auth-key-file (the node's COMBD_AUTH_JWT_KEY_FILE)")
    })?;
    let secret = std::fs::read_to_string(key_file).map_err(|e| format!("{key_file}: {e}"))?;
    Ok(secret.trim_end_matches(['\n', '\r']).to_string())
}

pub fn chat(a: &Args) -> Result<serde_json::Value, String> {
    let pid = crate::target_pid(a)?;
    let secret = secret(a, "chat")?;
    let rooms = a.rooms.max(1);
    let run = std::process::id();
    let mut rng = Rng(0x2545f4914f6cdd1d);
    let started = Instant::now();
    let mut users = Vec::with_capacity(a.conns);
    let mut failed = 0usize;
    for i in 0..a.conns {
        let sub = format!("u{i}");
        let bearer = token(&secret, &sub)?;
        let path = format!("/o/chat/{}-{run}-{}", a.board, i % rooms);
        let extra = format!("Sec-WebSocket-Protocol: combd, combd.bearer.{bearer}\r\n");
        let opened = crate::connect_from(a.target, a.port, i)
            .and_then(|mut s| crate::upgrade_with(&mut s, &path, &extra).map(|rest| (s, rest)));
        match opened {
            Ok((mut s, first)) => {
                // Wait for the hello: the user is in the room.
                let mut buf = first;
                'hello: loop {
                    for (_, p) in frames(&mut buf) {
                        if p.starts_with(b"{") && String::from_utf8_lossy(&p).contains("\"hello\"")
                        {
                            break 'hello;
                        }
                    }
                    let mut tmp = [0u8; 16384];
                    let n = s.read(&mut tmp).map_err(|e| format!("hello: {e}"))?;
                    if n == 0 {
                        return Err("closed before the hello".into());
                    }
                    buf.extend_from_slice(&tmp[..n]);
                }
                s.set_nonblocking(true).map_err(|e| e.to_string())?;
                users.push(User {
                    stream: MioStream::from_std(s),
                    sub,
                    inbuf: buf,
                    outbuf: Vec::new(),
                    seq: 0,
                    pending: HashMap::new(),
                    closed: false,
                });
            }
            Err(e) => {
                failed += 1;
                if failed <= 3 {
                    eprintln!("user {i}: {e}");
                }
            }
        }
        if (i + 1) % 1000 == 0 {
            eprintln!("chat: {} users in, {failed} failed", users.len());
        }
    }
    let connect_secs = started.elapsed().as_secs_f64();
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    for (i, u) in users.iter_mut().enumerate() {
        poll.registry()
            .register(
                &mut u.stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| e.to_string())?;
    }
    let interval = a.interval;
    let mut due: BinaryHeap<std::cmp::Reverse<(Instant, usize)>> = BinaryHeap::new();
    let t0 = Instant::now();
    for i in 0..users.len() {
        let off = Duration::from_micros(rng.next() % interval.as_micros().max(1) as u64);
        due.push(std::cmp::Reverse((t0 + off, i)));
    }
    let mut cpu = CpuWindow::start(pid);
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .map_err(|e| e.to_string())?;
    let (mut sent, mut errors, mut received) = (0u64, 0u64, 0u64);
    let mut events = Events::with_capacity(4096);
    let run_until = t0 + a.duration;
    let drain_until = run_until + Duration::from_secs(10);
    let mut last_progress = Instant::now();
    loop {
        let now = Instant::now();
        cpu.tick(run_until);
        if now >= drain_until || (now >= run_until && users.iter().all(|u| u.pending.is_empty())) {
            break;
        }
        while let Some(std::cmp::Reverse((t, i))) = due.peek().copied().filter(|_| now < run_until)
        {
            if t > now {
                break;
            }
            due.pop();
            let u = &mut users[i];
            if !u.closed {
                u.seq += 1;
                let msg = format!(r#"{{"t":"say","text":"{}:{}"}}"#, u.sub, u.seq);
                masked_text(&mut u.outbuf, msg.as_bytes());
                u.pending.insert(u.seq, Instant::now());
                sent += 1;
                if let Ok(n) = u.stream.write(&u.outbuf) {
                    u.outbuf.drain(..n);
                }
            }
            let jitter =
                interval.as_micros() as u64 / 2 + rng.next() % interval.as_micros().max(1) as u64;
            due.push(std::cmp::Reverse((t + Duration::from_micros(jitter), i)));
        }
        let next_due = due
            .peek()
            .map(|r| r.0 .0)
            .unwrap_or(run_until)
            .min(drain_until);
        let timeout = next_due
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(50));
        poll.poll(&mut events, Some(timeout))
            .map_err(|e| e.to_string())?;
        for ev in events.iter() {
            let u = &mut users[ev.token().0];
            if ev.is_writable() && !u.outbuf.is_empty() {
                if let Ok(n) = u.stream.write(&u.outbuf) {
                    u.outbuf.drain(..n);
                }
            }
            if !ev.is_readable() {
                continue;
            }
            let mut tmp = [0u8; 65536];
            loop {
                match u.stream.read(&mut tmp) {
                    Ok(0) => {
                        u.closed = true;
                        break;
                    }
                    Ok(n) => u.inbuf.extend_from_slice(&tmp[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        u.closed = true;
                        break;
                    }
                }
            }
            // Our own messages come back as {"at":…,"from":"u<i>",…,"text":"u<i>:<seq>",…}.
            let mine = format!("\"text\":\"{}:", u.sub);
            for (op, payload) in frames(&mut u.inbuf) {
                if op == 8 {
                    u.closed = true;
                    continue;
                }
                received += 1;
                let text = String::from_utf8_lossy(&payload);
                if text.contains("\"error\"") {
                    errors += 1;
                    continue;
                }
                let Some(at) = text.find(&mine) else { continue };
                let seq: u64 = text[at + mine.len()..]
                    .split('"')
                    .next()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
                if let Some(sent_at) = u.pending.remove(&seq) {
                    let _ = hist.record((sent_at.elapsed().as_micros() as u64).max(1));
                }
            }
        }
        if last_progress.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "chat: {sent} sent, {} echoed, {:.0}s",
                hist.len(),
                t0.elapsed().as_secs_f64()
            );
            last_progress = Instant::now();
        }
    }
    let (node_cpu, self_cpu) = cpu.percents();
    let lost: usize = users.iter().map(|u| u.pending.len()).sum();
    let after = crate::stats_or_null(a);
    let q = |x: f64| hist.value_at_quantile(x) as f64 / 1000.0;
    let _ = percentile;
    Ok(serde_json::json!({
        "scenario": "chat",
        "users_requested": a.conns,
        "users": users.len(),
        "users_failed": failed,
        "users_closed": users.iter().filter(|u| u.closed).count(),
        "rooms": rooms,
        "interval_ms": interval.as_millis() as u64,
        "duration_s": a.duration.as_secs(),
        "connect_seconds": connect_secs,
        "messages_sent": sent,
        "messages_echoed": hist.len(),
        "messages_lost": lost,
        "frames_received": received,
        "error_messages": errors,
        "lost_percent": if sent == 0 { 0.0 } else { lost as f64 * 100.0 / sent as f64 },
        "echo_p50_ms": q(0.50),
        "echo_p99_ms": q(0.99),
        "echo_max_ms": hist.max() as f64 / 1000.0,
        "node_cpu_percent": node_cpu,
        "generator_cpu_percent": self_cpu,
        "node_rss_bytes": rss_bytes(pid),
        "node_alive_after": crate::local_get(a.port, "/healthz").is_ok(),
        "node_batches": after["batches"],
        "node_batch_max": after["batch_max"],
        "node_mailbox_refused": after["mailbox_refused"],
        "node_auth_verified": after["auth_verified"],
    }))
}
