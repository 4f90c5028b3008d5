//! Lossless across faults (README "Resuming a WebSocket"): 1,000 numbered viewers of a million
//! board, 100 on each of 10 pages (10 topics), while clickers send 2,000 clicks a second; the
//! node is killed with SIGKILL three times and started again on its data, and every viewer
//! reconnects with its place as the protocol asks. At the end each viewer has taken exactly its
//! topic's log, as the node's database holds it: every frame from the first to the last, once
//! each, in order, with the same payload.
//!
//! The viewers run on one thread that polls their sockets (nonblocking); a viewer whose
//! connection ends (the kill) reconnects with its place, retrying until the node is back.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;
use tungstenite::{Message, WebSocket};

const VIEWERS: usize = 1000;
const PAGES: u64 = 10;
/// Clicks a second, all pages together.
const CLICKS_PER_SECOND: u64 = 2000;
const KILLS: usize = 3;
/// Threads polling the viewers' sockets (a reconnection's handshake blocks its thread).
const THREADS: usize = 10;
/// How long the clicks run between two kills.
const BETWEEN_KILLS: Duration = Duration::from_millis(1000);
const BOARD: &str = "lossless";

/// A running hash of the frames a viewer took: (seq, payload) after (seq, payload).
fn chain(h: u64, seq: u64, payload: &[u8]) -> u64 {
    let mut h = h ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for b in payload {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01B3);
    }
    h
}

/// A connection to the node's public address from `from`, with timeouts; `None` while the
/// node is not listening.
fn try_connect(from: [u8; 4], port: u16) -> Option<TcpStream> {
    let to = std::net::SocketAddr::from(([127, 0, 0, 2], port));
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    sock.bind(&std::net::SocketAddr::from((from, 0)).into())
        .ok()?;
    sock.connect_timeout(&to.into(), Duration::from_secs(5))
        .ok()?;
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    Some(s)
}

/// One numbered viewer of a page.
struct Viewer {
    page: u64,
    from: [u8; 4],
    ws: Option<WebSocket<TcpStream>>,
    retry_at: Instant,
    epoch: u64,
    last: u64,
    placed: bool,
    hash: u64,
    reconnects: u64,
    /// Positions that said `resumed`: reconnections that picked up from its place.
    resumes: u64,
    gaps: u64,
}

impl Viewer {
    /// Connects with its place (or new); `false` while the node is not there.
    fn connect(&mut self, port: u16) -> bool {
        let after = match self.last {
            0 if self.epoch == 0 => "new".to_string(),
            last => format!("{}.{last}", self.epoch),
        };
        let url = format!(
            "ws://127.0.0.2:{port}/o/million/{BOARD}?page={}&combd_after={after}",
            self.page
        );
        let Some(stream) = try_connect(self.from, port) else {
            return false;
        };
        match tungstenite::client(url.as_str(), stream) {
            Ok((ws, _)) => {
                ws.get_ref().set_nonblocking(true).unwrap();
                self.ws = Some(ws);
                self.placed = false;
                true
            }
            Err(_) => false,
        }
    }

    /// Takes what its socket has; drops the connection (to reconnect) when it ends or a
    /// frame skips a number.
    fn read(&mut self) {
        loop {
            let Some(ws) = self.ws.as_mut() else { return };
            let text = match ws.read() {
                Ok(Message::Text(t)) => t.as_str().as_bytes().to_vec(),
                Ok(Message::Binary(b)) => b.to_vec(),
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return
                }
                Err(_) => {
                    self.lost();
                    return;
                }
            };
            if !self.take(&text) {
                self.gaps += 1;
                self.lost();
                return;
            }
        }
    }

    /// Takes one message as the protocol asks; false on a gap.
    fn take(&mut self, text: &[u8]) -> bool {
        let bar = text.iter().position(|b| *b == b'|').unwrap();
        let (header, payload) = (std::str::from_utf8(&text[..bar]).unwrap(), &text[bar + 1..]);
        if let Some(place) = header.strip_prefix('!') {
            let (epoch, last) = place.split_once('.').unwrap();
            let (epoch, last): (u64, u64) = (epoch.parse().unwrap(), last.parse().unwrap());
            let why = std::str::from_utf8(payload).unwrap();
            assert_ne!(
                why, "snapshot",
                "page {}: place {}.{} lost, the log at {epoch}.{last}",
                self.page, self.epoch, self.last
            );
            if self.epoch != 0 {
                assert_eq!(epoch, self.epoch, "the log's epoch changed");
            }
            if why != "resumed" {
                assert_eq!(self.last, 0, "a new position after frames were taken");
                self.last = last;
                // Frames before the log's first are not in it: only a new log counts from 0.
                assert_eq!(last, 0, "page {}: a viewer that joined late", self.page);
            }
            self.resumes += u64::from(why == "resumed");
            (self.epoch, self.placed) = (epoch, true);
            return true;
        }
        if header.is_empty() || !self.placed {
            return true;
        }
        let seq: u64 = header.parse().unwrap();
        if seq <= self.last {
            return true;
        }
        if seq > self.last + 1 {
            return false;
        }
        self.last = seq;
        self.hash = chain(self.hash, seq, payload);
        true
    }

    fn lost(&mut self) {
        self.ws = None;
        self.retry_at = Instant::now();
    }
}

/// Each page's last frame, once the clicks stopped: the viewers are done when they all have
/// theirs.
type Targets = Arc<Mutex<Option<HashMap<u64, u64>>>>;

/// Polls every viewer's socket until each has its page's target (or `stop`); reconnects those
/// whose connection ended.
fn run_viewers(
    mut viewers: Vec<Viewer>,
    port: u16,
    targets: Targets,
    stop: Arc<AtomicBool>,
) -> Vec<Viewer> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    while !stop.load(Ordering::Relaxed) {
        if let Some(t) = targets.lock().unwrap().as_ref() {
            if viewers.iter().all(|v| v.last >= t[&v.page]) {
                break;
            }
        }
        for v in viewers.iter_mut().filter(|v| v.ws.is_none()) {
            if Instant::now() >= v.retry_at {
                v.reconnects += 1;
                if !v.connect(port) {
                    v.retry_at = Instant::now() + Duration::from_millis(50);
                }
            }
        }
        let live: Vec<usize> = (0..viewers.len())
            .filter(|i| viewers[*i].ws.is_some())
            .collect();
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = live
                .iter()
                .map(|i| {
                    let fd = viewers[*i].ws.as_ref().unwrap().get_ref().as_fd();
                    PollFd::new(fd, PollFlags::POLLIN)
                })
                .collect();
            poll(&mut fds, PollTimeout::from(20u8)).unwrap();
            fds.iter()
                .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
                .collect()
        };
        for (k, i) in live.into_iter().enumerate() {
            if ready[k] {
                viewers[i].read();
            }
        }
    }
    viewers
}

/// One page's clicker: its plain WebSocket (none while the node is away), and the last click
/// it sent on it.
struct Clicker {
    ws: Option<WebSocket<TcpStream>>,
    last: Option<u64>,
}

impl Clicker {
    fn connect(&mut self, port: u16, page: usize) {
        let url = format!("ws://127.0.0.2:{port}/o/million/{BOARD}?page={page}");
        let stream = try_connect([127, 0, 0, 1], port);
        if let Some(Ok((ws, _))) = stream.map(|st| tungstenite::client(url.as_str(), st)) {
            ws.get_ref().set_nonblocking(true).unwrap();
            (self.ws, self.last) = (Some(ws), None);
        }
    }

    /// Reads what the node sent (dropped, so the socket never stalls); false once it ended.
    fn drain(&mut self) -> bool {
        let Some(ws) = self.ws.as_mut() else {
            return false;
        };
        loop {
            match ws.read() {
                Ok(_) => continue,
                Err(tungstenite::Error::Io(e)) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    return true
                }
                Err(_) => {
                    self.ws = None;
                    return false;
                }
            }
        }
    }

    /// Sends click `c` on box `i`; false if the connection ended.
    fn click(&mut self, i: u64, c: u64) -> bool {
        let Some(ws) = self.ws.as_mut() else {
            return false;
        };
        let click = format!(r#"{{"t":"click","i":{i},"c":{c}}}"#);
        if ws.send(Message::text(click)).is_err() {
            self.ws = None;
            return false;
        }
        self.last = Some(c);
        true
    }

    /// Waits until the node broadcast its last click (every click before it on this
    /// connection is committed then), or the connection ends.
    fn settle(&mut self) {
        let (Some(ws), Some(last)) = (self.ws.as_mut(), self.last) else {
            return;
        };
        ws.get_ref().set_nonblocking(false).unwrap();
        while let Ok(m) = ws.read() {
            let Ok(text) = m.into_text() else { continue };
            let v: serde_json::Value = serde_json::from_str(text.as_str()).unwrap_or_default();
            let clicks = v["u"].as_array().cloned().unwrap_or_default();
            if clicks.iter().any(|u| u[3].as_u64() == Some(last)) {
                return;
            }
        }
    }
}

/// Clicks at `CLICKS_PER_SECOND` over the pages, one plain WebSocket a page, until `stop`;
/// reconnects those the kills end; then waits until each one's last click is committed.
/// Returns the clicks sent.
fn run_clickers(port: u16, stop: Arc<AtomicBool>) -> u64 {
    let mut clickers: Vec<Clicker> = (0..PAGES)
        .map(|_| Clicker {
            ws: None,
            last: None,
        })
        .collect();
    let (mut sent, started) = (0u64, Instant::now());
    while !stop.load(Ordering::Relaxed) {
        let due = started.elapsed().as_millis() as u64 * CLICKS_PER_SECOND / 1000;
        for (page, c) in clickers.iter_mut().enumerate() {
            if c.ws.is_none() {
                c.connect(port, page);
            }
            if c.drain() && sent < due && c.click((sent % 4096) + page as u64 * 4096, sent) {
                sent += 1;
            }
        }
        // Paced, not synchronised: the clicks' rate.
        std::thread::sleep(Duration::from_millis(1));
    }
    for c in &mut clickers {
        c.settle();
    }
    sent
}

/// Each page's log as the node's database holds it: its epoch, and its frames' running hash
/// from the first (which must still be there) to the last.
fn logs(data: &std::path::Path) -> HashMap<u64, (u64, u64, u64)> {
    let db = rusqlite::Connection::open_with_flags(
        data.join(format!("objects/million/{BOARD}.sqlite")),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let mut out = HashMap::new();
    for page in 0..PAGES {
        let (id, epoch): (i64, i64) = db
            .query_row(
                "SELECT id, epoch FROM _combd_topics WHERE topic = ?1",
                [format!("p{page}")],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        let mut stmt = db
            .prepare("SELECT key, payload FROM _combd_log WHERE key >> 40 = ?1 ORDER BY key")
            .unwrap();
        let rows: Vec<(u64, Vec<u8>)> = stmt
            .query_map([id], |r| {
                Ok((r.get::<_, i64>(0)? as u64 & ((1 << 40) - 1), r.get(1)?))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            rows[0].0, 1,
            "page {page}: its log was trimmed; the test is too long"
        );
        let hash = rows.iter().fold(0, |h, (seq, p)| chain(h, *seq, p));
        out.insert(page, (epoch as u64, rows.last().unwrap().0, hash));
    }
    out
}

#[test]
fn a_thousand_viewers_lose_nothing_across_three_kill_9s() {
    let mut node = TestNode::start(&[]);
    let port = node.port;
    let listen = format!("127.0.0.2:{port}");
    let env = [("COMBD_LISTEN", listen.as_str())];
    let mut viewers: Vec<Viewer> = (0..VIEWERS)
        .map(|i| Viewer {
            page: i as u64 % PAGES,
            from: client_address(i),
            ws: None,
            retry_at: Instant::now(),
            epoch: 0,
            last: 0,
            placed: false,
            hash: 0,
            reconnects: 0,
            resumes: 0,
            gaps: 0,
        })
        .collect();
    for v in &mut viewers {
        assert!(v.connect(port), "viewer {} could not connect", v.page);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let clickers = {
        let stop = stop.clone();
        std::thread::spawn(move || run_clickers(port, stop))
    };
    let targets: Targets = Arc::default();
    let watching = Arc::new(AtomicBool::new(false));
    // The viewers in THREADS groups, each polled (and reconnected) by a thread of its own.
    let (tx, rx) = mpsc::channel();
    let mut groups: Vec<Vec<Viewer>> = (0..THREADS).map(|_| Vec::new()).collect();
    for (i, v) in viewers.into_iter().enumerate() {
        groups[i % THREADS].push(v);
    }
    let threads: Vec<_> = groups
        .into_iter()
        .map(|group| {
            let (targets, watching, tx) = (targets.clone(), watching.clone(), tx.clone());
            std::thread::spawn(move || {
                let viewers = run_viewers(group, port, targets, watching);
                let _ = tx.send(());
                viewers
            })
        })
        .collect();
    // The clicks run; between kills the node runs BETWEEN_KILLS (the load's length, not a
    // wait for an event).
    for _ in 0..KILLS {
        std::thread::sleep(BETWEEN_KILLS);
        let data = node.kill9();
        node = TestNode::start_in(data, &env);
    }
    std::thread::sleep(BETWEEN_KILLS);
    stop.store(true, Ordering::Relaxed);
    let clicks = clickers.join().unwrap();
    assert!(clicks >= CLICKS_PER_SECOND * 3, "only {clicks} clicks");
    // Where each page's log ends: a fresh viewer's position says it.
    let mut lasts = HashMap::new();
    for page in 0..PAGES {
        let mut ws = open_ws(
            &node,
            &format!("/o/million/{BOARD}?page={page}&combd_after=new"),
        );
        // Its position; broadcasts may come before it.
        let last: u64 = loop {
            let text = ws.read().unwrap().into_text().unwrap();
            if let Some(place) = text.as_str().strip_prefix('!') {
                break place.split(['.', '|']).nth(1).unwrap().parse().unwrap();
            }
        };
        lasts.insert(page, last);
    }
    *targets.lock().unwrap() = Some(lasts.clone());
    // Bounded: past a minute the viewers stop, and the checks below say which fell short.
    let deadline = Instant::now() + Duration::from_secs(60);
    for _ in 0..THREADS {
        let left = deadline.saturating_duration_since(Instant::now());
        if rx.recv_timeout(left).is_err() {
            watching.store(true, Ordering::Relaxed);
            break;
        }
    }
    let viewers: Vec<Viewer> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let data = node.kill9();
    let logs = logs(&data);
    let (mut resumes, mut gaps) = (0, 0);
    for (i, v) in viewers.iter().enumerate() {
        let (epoch, last, hash) = logs[&v.page];
        assert_eq!(
            lasts[&v.page], last,
            "page {}: the log moved after the clicks",
            v.page
        );
        assert_eq!(
            (v.epoch, v.last),
            (epoch, last),
            "viewer {i} of page {} did not reach its log's end",
            v.page
        );
        assert_eq!(
            v.hash, hash,
            "viewer {i}: not its page's log, frame for frame"
        );
        assert!(v.resumes >= 1, "viewer {i} never resumed from its place");
        resumes += v.resumes;
        gaps += v.gaps;
    }
    eprintln!(
        "lossless: {clicks} clicks, {resumes} resumes ({gaps} after a gap), every viewer equal to its log"
    );
}
