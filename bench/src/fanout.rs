//! The `fanout` scenario: how many frames a second the node delivers to many viewers of one
//! object. `--conns` viewers open WebSockets to the `fanout` test app's object `--board`
//! (the node is `combd-test-node`, which serves the test apps); then a publisher posts
//! `POST /o/fanout/<board>?n=<--frames>` every `--interval-ms` (one call in flight at most:
//! a call still unanswered when the next is due is counted late and skipped) for
//! `--duration-s`. Each call broadcasts `--frames` frames of 40 bytes to every viewer.
//! Viewers only count the frames they receive (frame headers, no parsing of payloads), so
//! the generator's cost per frame is small. The node's `ws_messages_out` and `ws_sends` give
//! the frames each send carried.

use std::io::{ErrorKind, Read, Write};
use std::time::{Duration, Instant};

use mio::net::TcpStream as MioStream;
use mio::{Events, Interest, Poll, Token};

use crate::{connect_from, open_ws_path, stats_or_null, target_pid, Args, CpuWindow};

struct Viewer {
    stream: MioStream,
    inbuf: Vec<u8>,
    frames: u64,
    closed: bool,
}

/// Counts the complete server frames at the start of `buf` (text frames in `frames`), answers
/// pings with a masked pong into `pong`, and removes them from `buf`; true if a close came.
fn count_frames(buf: &mut Vec<u8>, frames: &mut u64, pong: &mut Vec<u8>) -> bool {
    let mut pos = 0;
    let mut closed = false;
    while buf.len() >= pos + 2 {
        let op = buf[pos] & 0x0f;
        let (len, hdr) = match buf[pos + 1] & 0x7f {
            126 if buf.len() >= pos + 4 => {
                (u16::from_be_bytes([buf[pos + 2], buf[pos + 3]]) as usize, 4)
            }
            127 if buf.len() >= pos + 10 => {
                let mut b = [0u8; 8];
                b.copy_from_slice(&buf[pos + 2..pos + 10]);
                (u64::from_be_bytes(b) as usize, 10)
            }
            126 | 127 => break,
            n => (n as usize, 2),
        };
        if buf.len() < pos + hdr + len {
            break;
        }
        match op {
            1 | 2 => *frames += 1,
            8 => closed = true,
            9 => {
                let payload = &buf[pos + hdr..pos + hdr + len];
                pong.extend_from_slice(&[0x8a, 0x80 | payload.len() as u8, 0, 0, 0, 0]);
                pong.extend_from_slice(payload);
            }
            _ => {}
        }
        pos += hdr + len;
    }
    buf.drain(..pos);
    closed
}

/// The publisher: one keep-alive HTTP connection, one call in flight at most.
struct Publisher {
    stream: MioStream,
    inbuf: Vec<u8>,
    in_flight: bool,
    ok: u64,
    failed: u64,
    late: u64,
}

impl Publisher {
    /// Takes complete responses off `inbuf`.
    fn read_answers(&mut self) {
        let mut tmp = [0u8; 4096];
        while let Ok(n) = self.stream.read(&mut tmp) {
            if n == 0 {
                break;
            }
            self.inbuf.extend_from_slice(&tmp[..n]);
        }
        while let Some(end) = self.inbuf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&self.inbuf[..end]).to_string();
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            if self.inbuf.len() < end + 4 + len {
                break;
            }
            self.inbuf.drain(..end + 4 + len);
            self.in_flight = false;
            if head.starts_with("HTTP/1.1 200") {
                self.ok += 1;
            } else {
                self.failed += 1;
            }
        }
    }
}

pub fn fanout(a: &Args) -> Result<serde_json::Value, String> {
    let pid = target_pid(a)?;
    let path = format!("/o/fanout/{}", a.board);
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    let mut viewers = Vec::with_capacity(a.conns);
    for i in 0..a.conns {
        let (s, rest) = open_ws_path(a.target, a.port, i + 1, &path)?;
        s.set_nonblocking(true).map_err(|e| e.to_string())?;
        let mut stream = MioStream::from_std(s);
        poll.registry()
            .register(&mut stream, Token(i), Interest::READABLE)
            .map_err(|e| e.to_string())?;
        viewers.push(Viewer {
            stream,
            inbuf: rest,
            frames: 0,
            closed: false,
        });
    }
    let s = connect_from(a.target, a.port, 0)?;
    s.set_nodelay(true).ok();
    s.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut publisher = Publisher {
        stream: MioStream::from_std(s),
        inbuf: Vec::new(),
        in_flight: false,
        ok: 0,
        failed: 0,
        late: 0,
    };
    let pub_token = Token(usize::MAX);
    poll.registry()
        .register(&mut publisher.stream, pub_token, Interest::READABLE)
        .map_err(|e| e.to_string())?;
    let request = format!(
        "POST {path}?n={} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        a.frames
    );
    let before = stats_or_null(a);
    let mut cpu = CpuWindow::start(pid);
    let t0 = Instant::now();
    let publish_until = t0 + a.duration;
    // After the last call, the frames still on their way get a moment to arrive.
    let end = publish_until + Duration::from_secs(2);
    let mut next_call = t0;
    let mut received_in_window = 0u64;
    let mut events = Events::with_capacity(4096);
    let mut tmp = vec![0u8; 256 * 1024];
    let mut pong = Vec::new();
    while Instant::now() < end {
        cpu.tick(publish_until);
        let now = Instant::now();
        if now < publish_until && now >= next_call {
            if publisher.in_flight {
                publisher.late += 1;
            } else if publisher.stream.write_all(request.as_bytes()).is_ok() {
                publisher.in_flight = true;
            }
            next_call += a.interval;
        }
        let wait = next_call
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(5));
        poll.poll(&mut events, Some(wait))
            .map_err(|e| e.to_string())?;
        for ev in events.iter() {
            if ev.token() == pub_token {
                publisher.read_answers();
                continue;
            }
            let v = &mut viewers[ev.token().0];
            loop {
                match v.stream.read(&mut tmp) {
                    Ok(0) => {
                        v.closed = true;
                        break;
                    }
                    Ok(n) => v.inbuf.extend_from_slice(&tmp[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(_) => {
                        v.closed = true;
                        break;
                    }
                }
            }
            let had = v.frames;
            v.closed |= count_frames(&mut v.inbuf, &mut v.frames, &mut pong);
            if Instant::now() < publish_until {
                received_in_window += v.frames - had;
            }
            if !pong.is_empty() {
                let _ = v.stream.write_all(&pong);
                pong.clear();
            }
        }
    }
    let (node_cpu, self_cpu) = cpu.percents();
    let after = stats_or_null(a);
    let delta = |k: &str| {
        after[k]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(before[k].as_u64().unwrap_or(0))
    };
    let received: u64 = viewers.iter().map(|v| v.frames).sum();
    let expected = publisher.ok * a.frames as u64 * viewers.len() as u64;
    let (frames_out, sends) = (delta("ws_messages_out"), delta("ws_sends"));
    Ok(serde_json::json!({
        "scenario": "fanout",
        "viewers": viewers.len(),
        "viewers_closed": viewers.iter().filter(|v| v.closed).count(),
        "frames_per_call": a.frames,
        "interval_ms": a.interval.as_millis() as u64,
        "duration_s": a.duration.as_secs(),
        "calls_ok": publisher.ok,
        "calls_failed": publisher.failed,
        "calls_late": publisher.late,
        "frames_expected": expected,
        "frames_received": received,
        "frames_missing": expected.saturating_sub(received),
        "frames_per_second": received_in_window as f64 / a.duration.as_secs_f64(),
        "node_frames_out": frames_out,
        "node_sends": sends,
        "node_frames_per_send": if sends == 0 { 0.0 } else { frames_out as f64 / sends as f64 },
        "node_session_mailbox_dropped": delta("session_mailbox_dropped"),
        "node_session_resyncs": delta("session_resyncs"),
        "node_cpu_percent": node_cpu,
        "generator_cpu_percent": self_cpu,
    }))
}
