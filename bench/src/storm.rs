//! The `storm` scenario (issue 42): a resume storm after a restart. N numbered viewers
//! (`--conns`, 10,000) of a million board (`--board`) over `--pages` pages keep their place
//! (`combd_after`) while a clicker sends `--rate` clicks a second. Once every viewer is live
//! and the clicks have run three seconds, the scenario writes the file `--ready`: the script
//! (`bench/storm.sh`) then kills the node with SIGKILL and starts it again on its data. Every
//! viewer sees its connection end and reconnects with its place, as the protocol asks (a 503
//! or a refused connection is tried again after 50 ms to 100 ms). The **storm** is the time
//! from the first connection lost to the last viewer told `resumed`. Then the clicks run two
//! seconds more and stop; every viewer is given until it has its page's last frame, and the
//! viewers of a page must hold the same frames (the same running hash of every frame, numbered
//! one by one with no gap): **lossless**. Viewers run on `THREADS` threads, each polling its
//! sockets (a reconnection's handshake blocks only its thread).

use std::io::Read;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::click::{frames, masked_text};
use crate::{rss_bytes, Args};

/// Threads for the viewers: each handshake of a reconnection blocks its thread, and 8 threads
/// measured the client (18 to 22 s for 10,000), 64 the node (about 1 s).
const THREADS: usize = 64;

/// One numbered viewer.
struct Viewer {
    i: usize,
    page: u64,
    stream: Option<TcpStream>,
    inbuf: Vec<u8>,
    epoch: u64,
    last: u64,
    placed: bool,
    hash: u64,
    /// Lost its connection since the storm began, and not told `resumed` yet.
    out: bool,
    retry_at: Instant,
    snapshots: u64,
    gaps: u64,
}

/// What the threads share.
struct Shared {
    /// The storm has begun (the first connection lost), in µs since `t0`; 0 before.
    dropped_us: AtomicU64,
    /// The last viewer told `resumed`, in µs since `t0`.
    resumed_us: AtomicU64,
    /// Viewers out (lost, not yet resumed).
    out: AtomicU64,
    /// Each page's last frame once the clicks stopped: the viewers are done once they have it.
    targets: Mutex<Option<Vec<u64>>>,
    stop: AtomicBool,
    t0: Instant,
}

fn chain(h: u64, seq: u64, payload: &[u8]) -> u64 {
    let mut h = h ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for b in payload {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01B3);
    }
    h
}

impl Viewer {
    fn path(&self, board: &str) -> String {
        let after = match (self.epoch, self.last) {
            (0, 0) => "new".to_string(),
            (e, l) => format!("{e}.{l}"),
        };
        format!("/o/million/{board}?page={}&combd_after={after}", self.page)
    }

    fn connect(&mut self, a: &Args) -> bool {
        let opened = crate::connect_from(a.target, a.port, self.i)
            .and_then(|mut s| crate::upgrade(&mut s, &self.path(&a.board)).map(|rest| (s, rest)));
        match opened {
            Ok((s, rest)) => {
                let _ = s.set_nonblocking(true);
                self.stream = Some(s);
                self.inbuf = rest;
                self.placed = false;
                true
            }
            Err(_) => false,
        }
    }

    /// Reads what is there; false if the connection ended.
    fn read(&mut self, sh: &Shared) -> bool {
        let Some(s) = self.stream.as_mut() else {
            return false;
        };
        let mut tmp = [0u8; 65536];
        let alive = loop {
            match s.read(&mut tmp) {
                Ok(0) => break false,
                Ok(n) => self.inbuf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break true,
                Err(_) => break false,
            }
        };
        for (op, payload) in frames(&mut self.inbuf) {
            if op == 8 || !self.take(&payload, sh) {
                return false;
            }
        }
        alive
    }

    /// Takes one message; false on a gap (the connection is dropped and resumes).
    fn take(&mut self, text: &[u8], sh: &Shared) -> bool {
        let Some(bar) = text.iter().position(|b| *b == b'|') else {
            return true;
        };
        let (header, payload) = (&text[..bar], &text[bar + 1..]);
        if let Some(place) = header.strip_prefix(b"!") {
            let place = String::from_utf8_lossy(place);
            let (e, l) = place.split_once('.').unwrap_or(("0", "0"));
            let (epoch, last) = (e.parse().unwrap_or(0), l.parse().unwrap_or(0));
            match payload {
                b"resumed" => {
                    if self.out {
                        self.out = false;
                        sh.out.fetch_sub(1, Ordering::Relaxed);
                        let now = sh.t0.elapsed().as_micros() as u64;
                        sh.resumed_us.fetch_max(now, Ordering::Relaxed);
                    }
                }
                b"snapshot" => {
                    self.snapshots += 1;
                    (self.last, self.hash) = (last, 0);
                }
                _ => self.last = last,
            }
            (self.epoch, self.placed) = (epoch, true);
            return true;
        }
        if header.is_empty() || !self.placed {
            return true;
        }
        let seq: u64 = String::from_utf8_lossy(header).parse().unwrap_or(0);
        if seq <= self.last {
            return true;
        }
        if seq > self.last + 1 {
            self.gaps += 1;
            return false;
        }
        self.last = seq;
        self.hash = chain(self.hash, seq, payload);
        true
    }

    /// Its connection ended: it reconnects (the storm begins with the first such).
    fn lost(&mut self, sh: &Shared) {
        self.stream = None;
        self.retry_at = Instant::now();
        if !self.out {
            self.out = true;
            sh.out.fetch_add(1, Ordering::Relaxed);
            let now = (sh.t0.elapsed().as_micros() as u64).max(1);
            let _ = sh
                .dropped_us
                .compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

/// Runs a thread's viewers until they all have their page's target, or `stop`.
fn run(mut viewers: Vec<Viewer>, a: &Args, sh: &Shared) -> Vec<Viewer> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    use std::os::fd::AsFd;
    while !sh.stop.load(Ordering::Relaxed) {
        if let Some(t) = sh.targets.lock().ok().and_then(|t| t.clone()) {
            if viewers.iter().all(|v| v.last >= t[v.page as usize]) {
                break;
            }
        }
        for v in viewers.iter_mut().filter(|v| v.stream.is_none()) {
            if Instant::now() >= v.retry_at && !v.connect(a) {
                v.retry_at = Instant::now() + Duration::from_millis(50 + (v.i % 50) as u64);
            }
        }
        let live: Vec<usize> = (0..viewers.len())
            .filter(|k| viewers[*k].stream.is_some())
            .collect();
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = live
                .iter()
                .filter_map(|k| viewers[*k].stream.as_ref())
                .map(|s| PollFd::new(s.as_fd(), PollFlags::POLLIN))
                .collect();
            let _ = poll(&mut fds, PollTimeout::from(10u8));
            fds.iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect()
        };
        for (n, k) in live.into_iter().enumerate() {
            if ready[n] && !viewers[k].read(sh) {
                viewers[k].lost(sh);
            }
        }
    }
    viewers
}

/// Clicks at `rate` a second on the pages, one plain WebSocket a page, until `stop`; then
/// waits a second for the last ones to commit. Returns the clicks sent.
fn click(a: &Args, stop: &AtomicBool) -> u64 {
    let pages = a.pages.max(1) as usize;
    let mut socks: Vec<Option<TcpStream>> = (0..pages).map(|_| None).collect();
    let (mut sent, t0) = (0u64, Instant::now());
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let due = t0.elapsed().as_millis() as u64 * a.rate / 1000;
        while sent < due {
            let page = (sent % pages as u64) as usize;
            if socks[page].is_none() {
                let path = format!("/o/million/{}?page={page}", a.board);
                socks[page] = crate::connect_from(a.target, a.port, 240)
                    .and_then(|mut s| crate::upgrade(&mut s, &path).map(|_| s))
                    .ok()
                    .inspect(|s| {
                        let _ = s.set_nonblocking(true);
                    });
            }
            let Some(s) = socks[page].as_mut() else { break };
            let mut tmp = [0u8; 65536];
            while matches!(s.read(&mut tmp), Ok(n) if n > 0) {}
            out.clear();
            let i = (sent / pages as u64) % 4096 + page as u64 * 4096;
            let msg = format!(r#"{{"t":"click","i":{i},"c":{sent}}}"#);
            masked_text(&mut out, msg.as_bytes());
            if std::io::Write::write_all(s, &out).is_err() {
                socks[page] = None;
                break;
            }
            sent += 1;
        }
        // Paced, not synchronised: the clicks' rate.
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_secs(1));
    sent
}

/// Each page's last frame: a fresh numbered viewer's position says it.
fn lasts(a: &Args) -> Result<Vec<u64>, String> {
    (0..a.pages.max(1))
        .map(|page| {
            let path = format!("/o/million/{}?page={page}&combd_after=new", a.board);
            let mut s = crate::connect_from(a.target, a.port, 239)?;
            let mut buf = crate::upgrade(&mut s, &path)?;
            loop {
                for (_, p) in frames(&mut buf) {
                    if let Some(place) = p.strip_prefix(b"!") {
                        let place = String::from_utf8_lossy(place);
                        return place
                            .split(['.', '|'])
                            .nth(1)
                            .and_then(|l| l.parse().ok())
                            .ok_or_else(|| format!("position {place}"));
                    }
                }
                let mut tmp = [0u8; 16384];
                let n = s.read(&mut tmp).map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err("closed before its position".into());
                }
                buf.extend_from_slice(&tmp[..n]);
            }
        })
        .collect()
}

pub fn storm(a: &Args) -> Result<serde_json::Value, String> {
    let ready = a
        .ready
        .clone()
        .ok_or("storm needs --ready FILE (bench/storm.sh)")?;
    let pages = a.pages.max(1);
    let sh = Arc::new(Shared {
        dropped_us: AtomicU64::new(0),
        resumed_us: AtomicU64::new(0),
        out: AtomicU64::new(0),
        targets: Mutex::new(None),
        stop: AtomicBool::new(false),
        t0: Instant::now(),
    });
    let mut groups: Vec<Vec<Viewer>> = (0..THREADS).map(|_| Vec::new()).collect();
    for i in 0..a.conns {
        let mut v = Viewer {
            i,
            page: i as u64 % pages,
            stream: None,
            inbuf: Vec::new(),
            epoch: 0,
            last: 0,
            placed: false,
            hash: 0,
            out: false,
            retry_at: Instant::now(),
            snapshots: 0,
            gaps: 0,
        };
        if !v.connect(a) {
            return Err(format!("viewer {i} could not connect"));
        }
        groups[i % THREADS].push(v);
    }
    eprintln!("storm: {} viewers live", a.conns);
    let stop_clicks = Arc::new(AtomicBool::new(false));
    let clicker = {
        let (a, stop) = (a.clone(), stop_clicks.clone());
        std::thread::spawn(move || click(&a, &stop))
    };
    let threads: Vec<_> = groups
        .into_iter()
        .map(|g| {
            let (a, sh) = (a.clone(), sh.clone());
            std::thread::spawn(move || run(g, &a, &sh))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    std::fs::write(&ready, "ready").map_err(|e| format!("{ready}: {e}"))?;
    eprintln!("storm: ready; the node is killed and started again");
    // The storm: from the first connection lost until every viewer resumed (bounded: 60 s).
    let deadline = Instant::now() + Duration::from_secs(60);
    while sh.dropped_us.load(Ordering::Relaxed) == 0 || sh.out.load(Ordering::Relaxed) > 0 {
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let storm_s = sh
        .resumed_us
        .load(Ordering::Relaxed)
        .saturating_sub(sh.dropped_us.load(Ordering::Relaxed)) as f64
        / 1e6;
    let still_out = sh.out.load(Ordering::Relaxed);
    eprintln!("storm: {storm_s:.2} s, {still_out} still out");
    std::thread::sleep(Duration::from_secs(2));
    stop_clicks.store(true, Ordering::Relaxed);
    let clicks = clicker.join().map_err(|_| "the clicker failed")?;
    let targets = lasts(a)?;
    if let Ok(mut t) = sh.targets.lock() {
        *t = Some(targets.clone());
    }
    let settle = Instant::now() + Duration::from_secs(30);
    while threads.iter().any(|t| !t.is_finished()) && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(10));
    }
    sh.stop.store(true, Ordering::Relaxed);
    let viewers: Vec<Viewer> = threads
        .into_iter()
        .filter_map(|t| t.join().ok())
        .flatten()
        .collect();
    let mut by_page: Vec<Option<(u64, u64)>> = vec![None; pages as usize];
    let (mut short, mut differ) = (0usize, 0usize);
    for v in &viewers {
        if v.last < targets[v.page as usize] {
            short += 1;
            continue;
        }
        match by_page[v.page as usize] {
            None => by_page[v.page as usize] = Some((v.last, v.hash)),
            Some(h) if h != (v.last, v.hash) => differ += 1,
            Some(_) => {}
        }
    }
    let snapshots: u64 = viewers.iter().map(|v| v.snapshots).sum();
    let gaps: u64 = viewers.iter().map(|v| v.gaps).sum();
    let pid = crate::target_pid(a).unwrap_or(0);
    let after = crate::stats_or_null(a);
    Ok(serde_json::json!({
        "scenario": "storm",
        "viewers": viewers.len(),
        "pages": pages,
        "clicks_per_second": a.rate,
        "clicks": clicks,
        "storm_seconds": storm_s,
        "viewers_still_out": still_out,
        "viewers_short_of_the_log": short,
        "viewers_differing": differ,
        "lossless": short == 0 && differ == 0 && snapshots == 0,
        "snapshots": snapshots,
        "gaps_resumed": gaps,
        "node_rss_bytes": rss_bytes(pid),
        "node_resumes_refused": after["topic_log_resumes_refused"],
        "node_alive_after": crate::local_get(a.port, "/healthz").is_ok(),
    }))
}
