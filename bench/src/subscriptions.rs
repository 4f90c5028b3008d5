//! `subscriptions`: what one multiplexed WebSocket (`GET /ws`) costs the node with `--subs`
//! subscriptions on it, beside a viewer of one object (`idle --board`): `--conns` sockets, each
//! subscribing to `--subs` pages of the million board `--board` (plain viewers, as `idle`'s),
//! then idle. The node's resident memory before and after, per socket and per subscription.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::click::frames;
use crate::{connect_from, rss_bytes, stats_or_null, upgrade, Args};

/// Sends one masked text frame of any length.
fn send(s: &mut TcpStream, payload: &[u8]) -> Result<(), String> {
    let mask = [1u8, 2, 3, 4];
    let mut f = vec![0x81];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&f).map_err(|e| e.to_string())
}

/// Opens socket `i` and subscribes it to `subs` pages; returns once the node took them all.
fn open(a: &Args, i: usize, subs: usize) -> Result<TcpStream, String> {
    let mut s = connect_from(a.target, a.port, i)?;
    let mut buf = upgrade(&mut s, "/ws")?;
    for ch in 0..subs {
        let page = (i * subs + ch) as u64 % a.pages.max(1);
        send(
            &mut s,
            format!("+{ch}|million/{}?page={page}", a.board).as_bytes(),
        )?;
    }
    let (mut taken, mut tmp) = (0, [0u8; 16 * 1024]);
    while taken < subs {
        for (_, payload) in frames(&mut buf) {
            if payload.first() == Some(&b'+') {
                taken += 1;
            } else if payload.first() == Some(&b'-') {
                return Err(String::from_utf8_lossy(&payload).into_owned());
            }
        }
        if taken == subs {
            break;
        }
        let n = s.read(&mut tmp).map_err(|e| format!("socket {i}: {e}"))?;
        if n == 0 {
            return Err(format!("socket {i}: closed"));
        }
        buf.extend_from_slice(&tmp[..n]);
    }
    Ok(s)
}

pub fn subscriptions(a: &Args) -> Result<serde_json::Value, String> {
    let pid = crate::target_pid(a)?;
    let subs = a.subs.max(1);
    let rss_before = rss_bytes(pid);
    let started = Instant::now();
    let mut socks = Vec::with_capacity(a.conns);
    for i in 0..a.conns {
        socks.push(open(a, i, subs)?);
        if (i + 1) % 1000 == 0 {
            eprintln!(
                "subscriptions: {} sockets, {:.1}s",
                socks.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let open_secs = started.elapsed().as_secs_f64();
    // What the pages' states left in the kernel is read: the node's buffers are free.
    let mut closed = 0;
    for s in &mut socks {
        s.set_nonblocking(true).ok();
        let mut tmp = [0u8; 64 * 1024];
        loop {
            match s.read(&mut tmp) {
                Ok(0) => {
                    closed += 1;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        s.set_nonblocking(false).ok();
    }
    if closed > 0 {
        return Err(format!("{closed} sockets were closed by the node"));
    }
    // Let the node settle, as `idle` does.
    std::thread::sleep(Duration::from_secs(2));
    let rss_after = rss_bytes(pid);
    let stats = stats_or_null(a);
    let n = socks.len().max(1) as f64;
    let grown = rss_after.saturating_sub(rss_before) as f64;
    Ok(serde_json::json!({
        "scenario": "subscriptions",
        "sockets": socks.len(),
        "subscriptions_per_socket": subs,
        "open_seconds": open_secs,
        "node_ws_open": stats["ws_open"],
        "node_ws_subscriptions": stats["ws_subscriptions"],
        "node_sessions": stats["sessions"],
        "node_rss_before_bytes": rss_before,
        "node_rss_after_bytes": rss_after,
        "node_user_bytes_per_socket": (grown / n).round(),
        "node_user_bytes_per_subscription": (grown / n / subs as f64).round(),
    }))
}
