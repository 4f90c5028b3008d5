//! What the matrix measures while an attack runs: the honest client's service (from an address
//! of its own), the node's peak memory, and the node's figures of every fair pool.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::support::*;

/// The honest client's address.
pub const HONEST: [u8; 4] = [127, 0, 5, 2];

/// A request the honest client makes, and the status it gets when no one attacks.
#[derive(Clone)]
pub struct Ask {
    pub raw: Vec<u8>,
    pub status: u16,
}

/// What the honest client got.
#[derive(Default)]
pub struct Served {
    pub latencies: Vec<Duration>,
    /// Each request not answered as it is when no one attacks: what it got instead.
    pub lost: Vec<String>,
}

impl Served {
    /// The `q`th quantile of the latencies, in milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        let mut l = self.latencies.clone();
        l.sort();
        l.get(((l.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }
}

/// An honest client asking in turn, on one keep-alive connection, until stopped; `first`
/// once, when its time into the attack has passed (a new object's first write).
pub struct Honest {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Served>,
}

impl Honest {
    pub fn start(to: SocketAddr, asks: Vec<Ask>, first: Option<(Ask, Duration)>) -> Honest {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || serve(to, &asks, first, &flag));
        Honest { stop, handle }
    }

    pub fn stop(self) -> Served {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

/// One response's status, read without a panic: `None` if the connection ended or timed out
/// before it was whole. Whether the node closes after it (`connection: close`) too.
pub fn try_read(r: &mut BufReader<TcpStream>) -> Option<(u16, bool)> {
    let mut line = String::new();
    r.read_line(&mut line).ok().filter(|n| *n > 0)?;
    let status = line.get(9..12)?.parse().ok()?;
    let (mut len, mut close) = (0usize, false);
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok().filter(|n| *n > 0)?;
        let h = h.trim_end().to_ascii_lowercase();
        if h.is_empty() {
            break;
        }
        if let Some(v) = h.strip_prefix("content-length:") {
            len = v.trim().parse().ok()?;
        }
        close |= h == "connection: close";
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some((status, close))
}

/// One request on `conn` (a new connection if it has none), its status or why it failed.
fn once(
    to: SocketAddr,
    conn: &mut Option<BufReader<TcpStream>>,
    raw: &[u8],
) -> Result<u16, String> {
    let r = conn.get_or_insert_with(|| BufReader::new(connect_from(HONEST, to)));
    if let Err(e) = r.get_mut().write_all(raw) {
        *conn = None;
        return Err(format!("write: {e}"));
    }
    match try_read(r) {
        Some((status, close)) => {
            if close {
                *conn = None;
            }
            Ok(status)
        }
        None => {
            *conn = None;
            Err("no answer".to_string())
        }
    }
}

fn serve(
    to: SocketAddr,
    asks: &[Ask],
    mut first: Option<(Ask, Duration)>,
    stop: &AtomicBool,
) -> Served {
    let mut served = Served::default();
    let mut conn = None;
    let started = Instant::now();
    let mut i = 0;
    while !stop.load(Ordering::Relaxed) {
        let ask = match first.take_if(|(_, at)| started.elapsed() > *at) {
            Some((f, _)) => f,
            None => asks[i % asks.len()].clone(),
        };
        i += 1;
        let t = Instant::now();
        match once(to, &mut conn, &ask.raw) {
            Ok(status) if status == ask.status => served.latencies.push(t.elapsed()),
            Ok(status) => served.lost.push(format!("{status} (not {})", ask.status)),
            Err(e) => served.lost.push(e),
        }
        // The honest client's own pace: a person's page, not a load generator.
        std::thread::sleep(Duration::from_millis(5));
    }
    served
}

/// The node's peak resident memory while it runs, sampled every 20 ms until stopped.
pub struct Peak {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<u64>,
}

impl Peak {
    pub fn start(pid: i32) -> Peak {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut peak = rss(pid);
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                peak = peak.max(rss(pid));
            }
            peak
        });
        Peak { stop, handle }
    }

    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap()
    }
}

/// Every fair pool `/stats` shows: the names `<pool>` of its `fair_<pool>_capacity`. A pool
/// added to the node is in the matrix's checks without a word here.
pub fn pools(s: &serde_json::Value) -> Vec<String> {
    s.as_object()
        .unwrap()
        .keys()
        .filter_map(|k| k.strip_prefix("fair_")?.strip_suffix("_capacity"))
        .map(str::to_string)
        .collect()
}

pub fn figure(s: &serde_json::Value, name: &str) -> u64 {
    s[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} in /stats"))
}

/// Each pool whose most one client ever held is past a client's largest share of it.
pub fn past_share(s: &serde_json::Value) -> Vec<String> {
    let pct = figure(&s["limits"], "client_share_max_percent");
    pools(s)
        .into_iter()
        .filter_map(|p| {
            let cap = figure(s, &format!("fair_{p}_capacity"));
            let most = figure(s, &format!("fair_{p}_client_max"));
            let share = (cap * pct).div_ceil(100);
            (most > share).then(|| format!("{p}: one client held {most} of {cap} (share {share})"))
        })
        .collect()
}

/// The refusals of every pool because a client held its share, and of one address's
/// connections past its cap: what the attacker was refused.
pub fn refused(s: &serde_json::Value) -> u64 {
    pools(s)
        .iter()
        .map(|p| figure(s, &format!("fair_{p}_refused_share")))
        .sum::<u64>()
        + figure(s, "address_conns_refused")
}

/// Whether the node is back at rest: its connections as before the attack, and nothing held
/// in any pool but `object_creations` (a creation is counted to its client for a burst's
/// length by design, `object_create_burst_seconds`).
pub fn at_rest(s: &serde_json::Value, conns: u64) -> bool {
    figure(s, "conns") <= conns
        && pools(s)
            .iter()
            .filter(|p| p.as_str() != "object_creations")
            .all(|p| figure(s, &format!("fair_{p}_held")) == 0)
}

/// Waits for the node to be at rest; how long it took, or what it still held after the wait.
pub fn rest(node: &TestNode, conns: u64) -> Result<Duration, String> {
    let started = Instant::now();
    loop {
        let s = node.stats();
        if at_rest(&s, conns) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > WAIT {
            let held: Vec<String> = pools(&s)
                .iter()
                .map(|p| format!("{p} {}", s[format!("fair_{p}_held")]))
                .collect();
            return Err(format!("not at rest: conns {} held {held:?}", s["conns"]));
        }
        // Nothing to wait on but the node's own figures: poll them gently.
        std::thread::sleep(Duration::from_millis(20));
    }
}
