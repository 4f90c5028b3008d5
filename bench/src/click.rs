//! The `click` and `mailbox` scenarios of `shared/BENCH.md`.
//!
//! `click`: N viewers of the `million` board spread over its pages, each clicking a random
//! box of its page every `interval` (jittered ±50 %). A click's **echo** is the time from
//! sending it to receiving the update that carries its `(session, c)`; a click with no echo
//! within 10 s, or answered with an error, is **lost**. One thread drives every socket with
//! mio, so the generator's cost is one core at most (its CPU time is reported).
//!
//! `mailbox`: a burst of requests at one counter object, more than its mailbox holds; every
//! request must be answered (200, or 503 `overloaded`), and the counter must equal the 200s.

use std::collections::{BinaryHeap, HashMap};
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use mio::net::TcpStream as MioStream;
use mio::{Events, Interest, Poll, Token};

use crate::{open_ws_path, percentile, rss_bytes, Args, CpuWindow};

/// A small xorshift generator: the same run gives the same clicks.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

struct Viewer {
    stream: MioStream,
    session: u64,
    page: u64,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    seq: u64,
    pending: HashMap<u64, Instant>,
    closed: bool,
}

pub(crate) fn masked_text(out: &mut Vec<u8>, payload: &[u8]) {
    let mask = [7u8, 1, 9, 3];
    out.push(0x81);
    if payload.len() < 126 {
        out.push(0x80 | payload.len() as u8);
    } else {
        out.push(0x80 | 126);
        out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
}

/// Splits complete server frames off `buf`; returns (opcode, payload) pairs, a compressed
/// message's payload decompressed (`--deflate`).
pub(crate) fn frames(buf: &mut Vec<u8>) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = 0;
    loop {
        let b = &buf[pos..];
        if b.len() < 2 {
            break;
        }
        let (len, hdr) = match b[1] & 0x7f {
            126 if b.len() >= 4 => (u16::from_be_bytes([b[2], b[3]]) as usize, 4),
            127 if b.len() >= 10 => (
                u64::from_be_bytes(b[2..10].try_into().unwrap_or_default()) as usize,
                10,
            ),
            126 | 127 => break,
            n => (n as usize, 2),
        };
        if b.len() < hdr + len {
            break;
        }
        let payload = &b[hdr..hdr + len];
        let payload = if b[0] & 0x40 != 0 {
            crate::inflate(payload)
        } else {
            payload.to_vec()
        };
        out.push((b[0] & 0x0f, payload));
        pos += hdr + len;
    }
    buf.drain(..pos);
    out
}

pub fn click(a: &Args) -> Result<serde_json::Value, String> {
    let pid = crate::target_pid(a)?;
    let pages = a.pages.max(1);
    let mut rng = Rng(0x9e3779b97f4a7c15);
    let started = Instant::now();
    let mut viewers = Vec::with_capacity(a.conns);
    let mut failed = 0usize;
    // How the viewers that did not get in were turned away (the `overload` scenario).
    let (mut refused_tcp, mut answered_503, mut closed_otherwise) = (0usize, 0usize, 0usize);
    for i in 0..a.conns {
        let page = (i as u64) % pages;
        match open_ws_path(
            a.target,
            a.port,
            i,
            &format!("/o/{}/{}?page={page}", a.app, a.board),
        ) {
            Ok((mut s, first)) => {
                // The first message is the page's state, with our session number.
                let mut buf = first;
                let session = loop {
                    if let Some((_, p)) = frames(&mut buf).into_iter().next() {
                        let v: serde_json::Value =
                            serde_json::from_slice(&p).map_err(|e| e.to_string())?;
                        break v["s"].as_u64().ok_or("no session in the page message")?;
                    }
                    let mut tmp = [0u8; 4096];
                    let n = s.read(&mut tmp).map_err(|e| format!("page message: {e}"))?;
                    if n == 0 {
                        return Err("closed before the page message".into());
                    }
                    buf.extend_from_slice(&tmp[..n]);
                };
                s.set_nonblocking(true).map_err(|e| e.to_string())?;
                viewers.push(Viewer {
                    stream: MioStream::from_std(s),
                    session,
                    page,
                    inbuf: buf,
                    outbuf: Vec::new(),
                    seq: 0,
                    pending: HashMap::new(),
                    closed: false,
                });
            }
            Err(e) => {
                failed += 1;
                if e.contains("Connection refused") {
                    refused_tcp += 1;
                } else if e.contains("HTTP/1.1 503") {
                    answered_503 += 1;
                } else {
                    closed_otherwise += 1;
                }
                if failed <= 3 {
                    eprintln!("viewer {i}: {e}");
                }
            }
        }
        if (i + 1) % 1000 == 0 {
            eprintln!(
                "click: {} viewers connected, {failed} failed",
                viewers.len()
            );
        }
    }
    let connect_secs = started.elapsed().as_secs_f64();
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    for (i, v) in viewers.iter_mut().enumerate() {
        poll.registry()
            .register(
                &mut v.stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| e.to_string())?;
    }
    // When each viewer clicks next: spread the first clicks over one interval.
    let interval = a.interval;
    let mut due: BinaryHeap<std::cmp::Reverse<(Instant, usize)>> = BinaryHeap::new();
    let t0 = Instant::now();
    for i in 0..viewers.len() {
        let off = Duration::from_micros(rng.next() % interval.as_micros().max(1) as u64);
        due.push(std::cmp::Reverse((t0 + off, i)));
    }
    let mut cpu = CpuWindow::start(pid);
    // Every echo in one histogram (µs), and per second for the timeline.
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .map_err(|e| e.to_string())?;
    let mut second: Vec<Duration> = Vec::new();
    let mut last_sample = Instant::now();
    let (mut p50_line, mut p99_line, mut open_line, mut rss_line) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut sent = 0u64;
    let mut errors = 0u64;
    // Bytes read from the node once every viewer is in: what the clicks' echoes cost on the wire.
    let mut bytes_received = 0u64;
    let mut events = Events::with_capacity(4096);
    let run_until = t0 + a.duration;
    let drain_until = run_until + Duration::from_secs(10);
    let mut last_progress = Instant::now();
    loop {
        let now = Instant::now();
        cpu.tick(run_until);
        if now >= drain_until || (now >= run_until && viewers.iter().all(|v| v.pending.is_empty()))
        {
            break;
        }
        // Send every click that is due (none once the run is over: then only echoes are awaited).
        while let Some(std::cmp::Reverse((t, i))) = due.peek().copied().filter(|_| now < run_until)
        {
            if t > now {
                break;
            }
            due.pop();
            let v = &mut viewers[i];
            if !v.closed {
                v.seq += 1;
                let box_i = (v.page * 4096 + rng.next() % 4096).min(999_999);
                let msg = format!(r#"{{"t":"click","i":{box_i},"c":{}}}"#, v.seq);
                masked_text(&mut v.outbuf, msg.as_bytes());
                v.pending.insert(v.seq, Instant::now());
                sent += 1;
                if let Ok(n) = v.stream.write(&v.outbuf) {
                    v.outbuf.drain(..n);
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
            let v = &mut viewers[ev.token().0];
            if ev.is_writable() && !v.outbuf.is_empty() {
                if let Ok(n) = v.stream.write(&v.outbuf) {
                    v.outbuf.drain(..n);
                }
            }
            if !ev.is_readable() {
                continue;
            }
            let mut tmp = [0u8; 65536];
            loop {
                match v.stream.read(&mut tmp) {
                    Ok(0) => {
                        v.closed = true;
                        break;
                    }
                    Ok(n) => {
                        bytes_received += n as u64;
                        v.inbuf.extend_from_slice(&tmp[..n]);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        v.closed = true;
                        break;
                    }
                }
            }
            let me = format!(",{},", v.session);
            for (op, payload) in frames(&mut v.inbuf) {
                if op == 8 {
                    v.closed = true;
                    continue;
                }
                let text = String::from_utf8_lossy(&payload);
                if text.contains("\"error\"") {
                    errors += 1;
                    continue;
                }
                if !text.contains(&me) {
                    continue;
                }
                // Our own clicks in this update: [i,v,session,c].
                if let Ok(m) = serde_json::from_str::<serde_json::Value>(&text) {
                    for u in m["u"].as_array().into_iter().flatten() {
                        if u[2].as_u64() == Some(v.session) {
                            if let Some(at) = u[3].as_u64().and_then(|c| v.pending.remove(&c)) {
                                let d = at.elapsed();
                                let _ = hist.record((d.as_micros() as u64).max(1));
                                second.push(d);
                            }
                        }
                    }
                }
            }
        }
        if last_sample.elapsed() >= Duration::from_secs(1) {
            let t = t0.elapsed().as_secs_f64();
            second.sort();
            p50_line.push((t, percentile(&second, 0.5)));
            p99_line.push((t, percentile(&second, 0.99)));
            open_line.push((t, viewers.iter().filter(|v| !v.closed).count() as f64));
            rss_line.push((t, rss_bytes(pid) as f64 / 1e6));
            second.clear();
            last_sample = Instant::now();
        }
        if last_progress.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "click: {sent} sent, {} echoed, {:.0}s",
                hist.len(),
                t0.elapsed().as_secs_f64()
            );
            last_progress = Instant::now();
        }
    }
    let (node_cpu, self_cpu) = cpu.percents();
    let lost: usize = viewers.iter().map(|v| v.pending.len()).sum();
    let closed = viewers.iter().filter(|v| v.closed).count();
    let after = crate::stats_or_null(a);
    if let Some(out) = &a.out {
        let svg = crate::svg::timeline(
            &format!(
                "click: {} viewers, a click every {} ms",
                viewers.len(),
                interval.as_millis()
            ),
            &[
                crate::svg::Panel {
                    title: "echo latency (ms), per second",
                    series: vec![
                        crate::svg::Series {
                            name: "p50",
                            points: p50_line,
                        },
                        crate::svg::Series {
                            name: "p99",
                            points: p99_line,
                        },
                    ],
                },
                crate::svg::Panel {
                    title: "viewers connected",
                    series: vec![crate::svg::Series {
                        name: "open",
                        points: open_line,
                    }],
                },
                crate::svg::Panel {
                    title: "server memory (MB, RSS)",
                    series: vec![crate::svg::Series {
                        name: "rss",
                        points: rss_line,
                    }],
                },
            ],
        );
        let path = out.strip_suffix(".json").unwrap_or(out).to_string() + ".svg";
        std::fs::write(&path, svg).map_err(|e| format!("{path}: {e}"))?;
    }
    let q = |x: f64| hist.value_at_quantile(x) as f64 / 1000.0;
    Ok(serde_json::json!({
        "scenario": "click",
        "viewers_requested": a.conns,
        "viewers": viewers.len(),
        "viewers_failed": failed,
        "viewers_refused_at_tcp": refused_tcp,
        "viewers_answered_503": answered_503,
        "viewers_closed_otherwise": closed_otherwise,
        "node_alive_after": crate::local_get(a.port, "/healthz").is_ok(),
        "node_memory_budget_bytes": after["memory_budget_bytes"],
        "node_tcp_refusing": after["tcp_refusing"],
        "node_refused_late": after["refused_late"],
        "viewers_closed": closed,
        "pages": pages,
        "interval_ms": interval.as_millis() as u64,
        "duration_s": a.duration.as_secs(),
        "connect_seconds": connect_secs,
        "clicks_sent": sent,
        "clicks_echoed": hist.len(),
        "clicks_lost": lost,
        "error_messages": errors,
        "lost_percent": if sent == 0 { 0.0 } else { lost as f64 * 100.0 / sent as f64 },
        "echo_p50_ms": q(0.50),
        "echo_p99_ms": q(0.99),
        "echo_max_ms": hist.max() as f64 / 1000.0,
        "node_cpu_percent": node_cpu,
        "generator_cpu_percent": self_cpu,
        "node_rss_bytes": rss_bytes(pid),
        "node_memory_own_bytes": after["memory_own_bytes"],
        "node_batches": after["batches"],
        "node_batch_max": after["batch_max"],
        "node_session_mailbox_dropped": after["session_mailbox_dropped"],
        "node_mailbox_refused": after["mailbox_refused"],
        "deflate": crate::DEFLATE.load(std::sync::atomic::Ordering::Relaxed),
        "bytes_received_after_connect": bytes_received,
        "node_ws_deflated_out": after["ws_deflated_out"],
        "node_stages": after["stages"],
    }))
}

pub fn mailbox(a: &Args) -> Result<serde_json::Value, String> {
    let object = format!("burst{}", std::process::id());
    let started = Instant::now();
    let mut socks = Vec::with_capacity(a.conns);
    for i in 0..a.conns {
        let s = crate::connect_from(a.target, a.port, i)?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok();
        socks.push(s);
    }
    // The burst: every request written before any answer is read.
    let burst_start = Instant::now();
    for s in socks.iter_mut() {
        write!(
            s,
            "POST /o/counter/{object} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
    }
    let burst_secs = burst_start.elapsed().as_secs_f64();
    let (mut ok, mut refused, mut other, mut hung) = (0u64, 0u64, 0u64, 0u64);
    let mut latencies = Vec::new();
    for s in socks.iter_mut() {
        let mut buf = [0u8; 512];
        match s.read(&mut buf) {
            Ok(n) if n >= 12 && &buf[9..12] == b"200" => {
                ok += 1;
                latencies.push(burst_start.elapsed());
            }
            Ok(n) if n >= 12 && &buf[9..12] == b"503" => refused += 1,
            Ok(_) => other += 1,
            Err(_) => hung += 1,
        }
    }
    let value_text = {
        let mut s = std::net::TcpStream::connect((a.target, a.port)).map_err(|e| e.to_string())?;
        write!(
            s,
            "GET /o/counter/{object} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .map_err(|e| e.to_string())?;
        let mut t = String::new();
        s.read_to_string(&mut t).map_err(|e| e.to_string())?;
        t
    };
    let value: serde_json::Value = value_text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or_default();
    latencies.sort();
    Ok(serde_json::json!({
        "scenario": "mailbox",
        "requests": a.conns,
        "write_burst_seconds": burst_secs,
        "answered_200": ok,
        "refused_503": refused,
        "other": other,
        "hung": hung,
        "counter_value": value["value"],
        "counter_matches_200s": value["value"].as_u64() == Some(ok),
        "answer_p50_ms": percentile(&latencies, 0.5),
        "answer_max_ms": latencies.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
        "total_seconds": started.elapsed().as_secs_f64(),
    }))
}
