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
/// How long the clicks run between two kills.
const BETWEEN_KILLS: Duration = Duration::from_millis(1500);
const BOARD: &str = "lossless";

/// A running hash of the frames a viewer took: (seq, payload) after (seq, payload).
fn chain(h: u64, seq: u64, payload: &[u8]) -> u64 {
    let mut h = h ^ seq.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for b in payload {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01B3);
    }
    h
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
        let addr = std::net::SocketAddr::from(([127, 0, 0, 2], port));
        let Ok(stream) = std::panic::catch_unwind(|| connect_from(self.from, addr)) else {
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
            assert_ne!(why, "snapshot", "page {}: a place was lost", self.page);
            if self.epoch != 0 {
                assert_eq!(epoch, self.epoch, "the log's epoch changed");
            }
            if why != "resumed" {
                assert_eq!(self.last, 0, "a new position after frames were taken");
                self.last = last;
                // Frames before the log's first are not in it: only a new log counts from 0.
                assert_eq!(last, 0, "page {}: a viewer that joined late", self.page);
            }
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

/// Clicks at `CLICKS_PER_SECOND` over the pages, one plain WebSocket a page, until `stop`;
/// reconnects those the kills end. Returns the clicks sent.
fn run_clickers(port: u16, stop: Arc<AtomicBool>) -> u64 {
    let mut socks: Vec<Option<WebSocket<TcpStream>>> = (0..PAGES).map(|_| None).collect();
    let (mut sent, started) = (0u64, Instant::now());
    while !stop.load(Ordering::Relaxed) {
        for (page, s) in socks.iter_mut().enumerate() {
            if s.is_none() {
                let url = format!("ws://127.0.0.2:{port}/o/million/{BOARD}?page={page}");
                let addr = std::net::SocketAddr::from(([127, 0, 0, 2], port));
                let stream = std::panic::catch_unwind(|| connect(addr));
                if let Ok(Ok((ws, _))) = stream.map(|st| tungstenite::client(url.as_str(), st)) {
                    ws.get_ref().set_nonblocking(true).unwrap();
                    *s = Some(ws);
                }
            }
            let Some(ws) = s.as_mut() else { continue };
            // What the node sends back is read and dropped, so the socket never stalls.
            let ended = loop {
                match ws.read() {
                    Ok(_) => continue,
                    Err(tungstenite::Error::Io(e))
                        if e.kind() == std::io::ErrorKind::WouldBlock =>
                    {
                        break false
                    }
                    Err(_) => break true,
                }
            };
            let due = started.elapsed().as_millis() as u64 * CLICKS_PER_SECOND / 1000 / PAGES;
            let box_ = (sent % 4096) + page as u64 * 4096;
            let click = format!(r#"{{"t":"click","i":{box_},"c":{sent}}}"#);
            if ended || (sent / PAGES < due && ws.send(Message::text(click)).is_err()) {
                *s = None;
            } else if sent / PAGES < due {
                sent += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(1));
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
            .query_map([id], |r| Ok((r.get::<_, i64>(0)? as u64 & ((1 << 40) - 1), r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows[0].0, 1, "page {page}: its log was trimmed; the test is too long");
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
    let (tx, rx) = mpsc::channel();
    let viewers_thread = {
        let (targets, watching) = (targets.clone(), watching.clone());
        std::thread::spawn(move || {
            let viewers = run_viewers(viewers, port, targets, watching);
            let _ = tx.send(());
            viewers
        })
    };
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
    assert!(clicks >= CLICKS_PER_SECOND * 4, "only {clicks} clicks");
    // Where each page's log ends: a fresh viewer's position says it.
    let mut lasts = HashMap::new();
    for page in 0..PAGES {
        let mut ws = open_ws(
            &node,
            &format!("/o/million/{BOARD}?page={page}&combd_after=new"),
        );
        let first = ws.read().unwrap().into_text().unwrap();
        let place = first.as_str().strip_prefix('!').unwrap();
        let last: u64 = place.split(['.', '|']).nth(1).unwrap().parse().unwrap();
        lasts.insert(page, last);
    }
    *targets.lock().unwrap() = Some(lasts.clone());
    // Bounded: past a minute the viewers stop, and the checks below say which fell short.
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        watching.store(true, Ordering::Relaxed);
    }
    let viewers = viewers_thread.join().unwrap();
    let data = node.kill9();
    let logs = logs(&data);
    let (mut reconnects, mut gaps) = (0, 0);
    for (i, v) in viewers.iter().enumerate() {
        let (epoch, last, hash) = logs[&v.page];
        assert_eq!(lasts[&v.page], last, "page {}: the log moved after the clicks", v.page);
        assert_eq!(
            (v.epoch, v.last),
            (epoch, last),
            "viewer {i} of page {} did not reach its log's end",
            v.page
        );
        assert_eq!(v.hash, hash, "viewer {i}: not its page's log, frame for frame");
        reconnects += v.reconnects;
        gaps += v.gaps;
    }
    assert!(
        reconnects >= (KILLS * VIEWERS) as u64,
        "each viewer reconnected after each kill: {reconnects}"
    );
    eprintln!("lossless: {clicks} clicks, {reconnects} reconnections ({gaps} after a gap), every viewer equal to its log");
}
