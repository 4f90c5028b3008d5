//! The `http` scenario: keep-alive `GET /healthz` at a fixed concurrency (`--conns`) for
//! `--duration-s`, each connection sending its next request when the last answer is in.
//! Requests per second and latency percentiles; the target's and the generator's CPU.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use mio::net::TcpStream as MioStream;
use mio::{Events, Interest, Poll, Token};

use crate::{connect_from, cpu_seconds, percentile, target_pid, Args};

const REQUEST: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n";

struct Client {
    stream: MioStream,
    inbuf: Vec<u8>,
    sent_at: Instant,
}

/// Splits one complete response off `buf`, if there is one (content-length framed).
fn take_response(buf: &mut Vec<u8>) -> Option<u16> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = std::str::from_utf8(&buf[..end]).ok()?;
    let status: u16 = head.get(9..12)?.parse().ok()?;
    let len: usize = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())
                .flatten()
        })
        .unwrap_or(0);
    if buf.len() < end + len {
        return None;
    }
    buf.drain(..end + len);
    Some(status)
}

pub fn http(a: &Args) -> Result<serde_json::Value, String> {
    let pid = target_pid(a)?;
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    let mut clients = Vec::with_capacity(a.conns);
    for i in 0..a.conns {
        let s = connect_from(a.target, a.port, i)?;
        s.set_nodelay(true).ok();
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut stream = MioStream::from_std(s);
        poll.registry()
            .register(&mut stream, Token(i), Interest::READABLE)
            .map_err(|e| e.to_string())?;
        clients.push(Client {
            stream,
            inbuf: Vec::new(),
            sent_at: Instant::now(),
        });
    }
    let cpu0 = cpu_seconds(pid);
    let self0 = cpu_seconds(std::process::id() as u64);
    let started = Instant::now();
    for c in clients.iter_mut() {
        c.sent_at = Instant::now();
        c.stream.write_all(REQUEST).map_err(|e| e.to_string())?;
    }
    let mut latencies: Vec<Duration> = Vec::with_capacity(1 << 20);
    let (mut ok, mut other) = (0u64, 0u64);
    let mut events = Events::with_capacity(1024);
    let mut buf = [0u8; 65536];
    let mut last_progress = Instant::now();
    while started.elapsed() < a.duration {
        poll.poll(&mut events, Some(Duration::from_millis(50)))
            .map_err(|e| e.to_string())?;
        for ev in events.iter() {
            let c = &mut clients[ev.token().0];
            loop {
                match c.stream.read(&mut buf) {
                    Ok(0) => return Err("the target closed a keep-alive connection".into()),
                    Ok(n) => c.inbuf.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e.to_string()),
                }
            }
            while let Some(status) = take_response(&mut c.inbuf) {
                latencies.push(c.sent_at.elapsed());
                if status == 200 {
                    ok += 1;
                } else {
                    other += 1;
                }
                c.sent_at = Instant::now();
                // A small request fits the socket buffer: write_all does not block here.
                c.stream.write_all(REQUEST).map_err(|e| e.to_string())?;
            }
        }
        if last_progress.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "http: {ok} answered, {:.0}s",
                started.elapsed().as_secs_f64()
            );
            last_progress = Instant::now();
        }
    }
    let secs = started.elapsed().as_secs_f64();
    latencies.sort();
    Ok(serde_json::json!({
        "scenario": "http",
        "conns": a.conns,
        "duration_s": secs,
        "answered_200": ok,
        "answered_other": other,
        "requests_per_second": ok as f64 / secs,
        "latency_p50_ms": percentile(&latencies, 0.5),
        "latency_p99_ms": percentile(&latencies, 0.99),
        "target_cpu_percent": (cpu_seconds(pid) - cpu0) / secs * 100.0,
        "generator_cpu_percent": (cpu_seconds(std::process::id() as u64) - self0) / secs * 100.0,
    }))
}
