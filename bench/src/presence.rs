//! The `presence` scenario (issue 42): N users (`--conns`, 10,000) in `--rooms` rooms (100) of
//! the `chat` app, each with a token of its own (`u<i>`, minted from `--auth-key-file`), each
//! a numbered session that is told its room's presence (README "Presence"). Every
//! `1 / --rate` seconds (`--rate`, changes a second, 100) one user changes: a connected one
//! leaves (its socket closed) or one that left a second ago or more joins again (a new
//! WebSocket), alternately.
//! A change's **latency** is the time from the leave's close (or the join's upgrade request)
//! to the moment the room's watcher (its first user, which never changes) is told it in a
//! `!presence|` change; a change not told within 10 s is **lost**. Every user reads its
//! socket (each change goes to the whole room). One thread drives every socket with mio.

use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use mio::net::TcpStream as MioStream;
use mio::{Events, Interest, Poll, Token};

use crate::click::{frames, Rng};
use crate::{rss_bytes, Args, CpuWindow};

struct User {
    stream: Option<MioStream>,
    sub: String,
    room: usize,
    inbuf: Vec<u8>,
}

/// Opens user `i`'s numbered WebSocket to its room; what came after the upgrade's answer.
fn open(
    a: &Args,
    secret: &str,
    run: u32,
    i: usize,
    room: usize,
) -> Result<(MioStream, Vec<u8>), String> {
    let bearer = crate::chat::token(secret, &format!("u{i}"))?;
    let path = format!("/o/chat/{}-{run}-{room}?combd_after=new", a.board);
    let extra = format!("Sec-WebSocket-Protocol: combd, combd.bearer.{bearer}\r\n");
    let mut s = crate::connect_from(a.target, a.port, i)?;
    let rest = crate::upgrade_with(&mut s, &path, &extra)?;
    s.set_nonblocking(true).map_err(|e| e.to_string())?;
    Ok((MioStream::from_std(s), rest))
}

/// The changes a watcher was told: (joined, left) names.
fn told(payload: &[u8]) -> (Vec<String>, Vec<String>) {
    let Some(json) = payload.strip_prefix(b"!presence|") else {
        return (Vec::new(), Vec::new());
    };
    let v: serde_json::Value = serde_json::from_slice(json).unwrap_or_default();
    let names = |k: &str, f: fn(&serde_json::Value) -> Option<&str>| -> Vec<String> {
        v[k].as_array()
            .map(|a| a.iter().filter_map(f).map(str::to_string).collect())
            .unwrap_or_default()
    };
    (
        names("join", |m| m["who"].as_str()),
        names("leave", |m| m.as_str()),
    )
}

pub fn presence(a: &Args) -> Result<serde_json::Value, String> {
    let pid = crate::target_pid(a)?;
    let secret = crate::chat::secret(a, "presence")?;
    let rooms = a.rooms.max(1);
    let run = std::process::id();
    let started = Instant::now();
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    let mut users = Vec::with_capacity(a.conns);
    for i in 0..a.conns {
        let room = i % rooms;
        let (mut stream, inbuf) = open(a, &secret, run, i, room)?;
        poll.registry()
            .register(&mut stream, Token(i), Interest::READABLE)
            .map_err(|e| e.to_string())?;
        users.push(User {
            stream: Some(stream),
            sub: format!("u{i}"),
            room,
            inbuf,
        });
        if (i + 1) % 1000 == 0 {
            eprintln!("presence: {} users in", i + 1);
        }
    }
    let connect_secs = started.elapsed().as_secs_f64();
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let tick = Duration::from_secs_f64(1.0 / a.rate.max(1) as f64);
    // The changes told to no watcher yet: (name, leave?) -> when.
    let mut waiting: HashMap<(String, bool), Instant> = HashMap::new();
    // Users that left, and when: one joins again a second after it left at the soonest, so a
    // leave and the join after it are two changes, never one batch's (where they would cancel).
    let mut left: VecDeque<(usize, Instant)> = VecDeque::new();
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .map_err(|e| e.to_string())?;
    let (mut ticks, mut changes, mut lost, mut failed) = (0u64, 0u64, 0u64, 0u64);
    let mut cpu = CpuWindow::start(pid);
    let mut events = Events::with_capacity(4096);
    let t0 = Instant::now();
    let run_until = t0 + a.duration;
    let drain_until = run_until + Duration::from_secs(10);
    let mut next = t0;
    loop {
        let now = Instant::now();
        cpu.tick(run_until);
        if now >= drain_until || (now >= run_until && waiting.is_empty()) {
            break;
        }
        if now >= next && now < run_until {
            next += tick;
            ticks += 1;
            // Alternately: a user leaves (never a room's watcher, users 0..rooms), or the one
            // that left longest ago joins again (a second after it left at the soonest).
            let rejoin = left
                .front()
                .filter(|(_, at)| at.elapsed() >= Duration::from_secs(1));
            if ticks % 2 == 1 || rejoin.is_none() {
                let i = rooms + (rng.next() as usize % (users.len() - rooms).max(1));
                if let Some(mut s) = users[i].stream.take() {
                    let _ = poll.registry().deregister(&mut s);
                    drop(s);
                    waiting.insert((users[i].sub.clone(), true), Instant::now());
                    left.push_back((i, Instant::now()));
                    changes += 1;
                }
            } else if let Some((i, _)) = left.pop_front() {
                let at = Instant::now();
                match open(a, &secret, run, i, users[i].room) {
                    Ok((mut s, inbuf)) => {
                        poll.registry()
                            .register(&mut s, Token(i), Interest::READABLE)
                            .map_err(|e| e.to_string())?;
                        users[i].stream = Some(s);
                        users[i].inbuf = inbuf;
                        waiting.insert((users[i].sub.clone(), false), at);
                        changes += 1;
                    }
                    Err(_) => failed += 1,
                }
            }
        }
        let timeout = next
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(20));
        poll.poll(&mut events, Some(timeout))
            .map_err(|e| e.to_string())?;
        for ev in events.iter() {
            let i = ev.token().0;
            let u = &mut users[i];
            let Some(stream) = u.stream.as_mut() else {
                continue;
            };
            let mut tmp = [0u8; 65536];
            loop {
                match stream.read(&mut tmp) {
                    Ok(0) => break,
                    Ok(n) => u.inbuf.extend_from_slice(&tmp[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => break,
                }
            }
            let got = frames(&mut u.inbuf);
            if i >= rooms {
                continue; // not a watcher: read, and dropped
            }
            for (_, payload) in got {
                let (joined, gone) = told(&payload);
                let when = Instant::now();
                for (who, leave) in joined
                    .into_iter()
                    .map(|w| (w, false))
                    .chain(gone.into_iter().map(|w| (w, true)))
                {
                    // Told to the watcher of the user's room (every user's room is `i % rooms`).
                    let Some(n) = who.strip_prefix('u').and_then(|n| n.parse::<usize>().ok())
                    else {
                        continue;
                    };
                    if n % rooms != i {
                        continue;
                    }
                    if let Some(at) = waiting.remove(&(who, leave)) {
                        let _ = hist.record((when.duration_since(at).as_micros() as u64).max(1));
                    }
                }
            }
        }
        waiting.retain(|_, at| {
            let keep = at.elapsed() < Duration::from_secs(10);
            lost += u64::from(!keep);
            keep
        });
    }
    lost += waiting.len() as u64;
    let _ = std::io::stdout().flush();
    let (node_cpu, self_cpu) = cpu.percents();
    let after = crate::stats_or_null(a);
    let q = |x: f64| hist.value_at_quantile(x) as f64 / 1000.0;
    Ok(serde_json::json!({
        "scenario": "presence",
        "users": users.len(),
        "rooms": rooms,
        "changes_per_second": a.rate,
        "duration_s": a.duration.as_secs(),
        "connect_seconds": connect_secs,
        "changes": changes,
        "changes_told": hist.len(),
        "changes_lost": lost,
        "joins_failed": failed,
        "told_p50_ms": q(0.50),
        "told_p99_ms": q(0.99),
        "told_max_ms": hist.max() as f64 / 1000.0,
        "node_cpu_percent": node_cpu,
        "generator_cpu_percent": self_cpu,
        "node_rss_bytes": rss_bytes(pid),
        "node_presence_changes": after["presence_changes"],
        "node_presence_members": after["fair_presence_held"],
        "node_alive_after": crate::local_get(a.port, "/healthz").is_ok(),
    }))
}
