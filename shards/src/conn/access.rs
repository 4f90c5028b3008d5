//! What a connection tells the access log: a line per HTTP response it writes (every one, the
//! node's own refusals and errors included), and a line when its WebSocket opens and one when
//! it closes. Off, a connection holds no [`ConnLog`] and each hook is one branch on an
//! `Option`.
//!
//! A request is known by its parse ([`Asked::Parsed`]) or, refused before it was parsed, by
//! its request line read from the start of `inbuf` ([`Asked::Inbuf`]); a request answered
//! after it left `inbuf` keeps what the log needs of it
//! in an [`KeptRequest`]: an object's request in its place in the pipeline ([`Asked::Kept`]), an
//! upgrade in the connection's [`ConnLog`] ([`Asked::Upgrade`]), where its WebSocket's lines
//! find it too. Its duration
//! runs from the read that brought its first byte to its response written into the
//! connection's output (or, for a WebSocket, the 101 written to the socket).

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime};

use combd_kernel::limits::{ACCESS_LOG_METHOD_MAX_BYTES, ACCESS_LOG_PATH_MAX_BYTES};

use crate::access_log::{request_line, Event, LogLine};

use crate::state::ShardState;

/// A connection's figures for the access log, made only while it is on.
pub(super) struct ConnLog {
    peer: SocketAddr,
    opened: Instant,
    /// Bytes read from and written to the socket so far.
    read: Cell<u64>,
    written: Cell<u64>,
    /// When the read that brought the first byte of the request in progress came (the
    /// connection's start before any), and when the last read came.
    started: Cell<Option<Instant>>,
    last_read: Cell<Instant>,
    /// The WebSocket's messages, both ways.
    messages_in: Cell<u64>,
    messages_out: Cell<u64>,
    /// The upgrade the connection asked for, from its routing on.
    upgrade: RefCell<Option<KeptRequest>>,
    /// The WebSocket, once open.
    ws: RefCell<Option<WsLog>>,
}

/// What a WebSocket's close line needs of its opening.
struct WsLog {
    upgrade: KeptRequest,
    opened: Instant,
    read: u64,
    written: u64,
}

/// A request the log needs after it left `inbuf`: its method and path (each cut to its
/// bound), its bytes, and when its first byte came.
pub(super) struct KeptRequest {
    text: Vec<u8>,
    method_len: usize,
    bytes_in: u64,
    started: Instant,
}

impl KeptRequest {
    fn method(&self) -> &[u8] {
        &self.text[..self.method_len]
    }

    fn path(&self) -> &[u8] {
        &self.text[self.method_len..]
    }
}

/// Which request a response answers.
#[derive(Clone, Copy)]
pub(super) enum Asked<'a> {
    /// A request parsed and routed: its method, its path and its bytes (head and body).
    Parsed(&'a str, &'a str, u64),
    /// The request at the start of `inbuf` (one refused before it was parsed, or whole), of
    /// which this many bytes were read.
    Inbuf(u64),
    /// A request kept when it left `inbuf` (none while the log is off).
    Kept(Option<&'a KeptRequest>),
    /// The upgrade the connection asked for.
    Upgrade,
    /// Nothing was read: a connection refused as it came in.
    Nothing,
}

/// How a WebSocket ended, for its close line.
#[derive(Clone, Copy)]
pub(super) struct WsEnd {
    /// The close code: the one the node sent, the client's it echoed, 1005 for a close frame
    /// without one, 1006 when the connection ended without a close frame.
    pub code: u16,
    /// `node`, `client` or `connection` (no close frame: the client went away, or the node
    /// dropped a client it could not write to).
    pub by: &'static str,
    /// The reason the node sent with its close frame.
    pub reason: Option<&'static str>,
}

impl ConnLog {
    /// A connection's figures from its peer on.
    pub fn new(peer: SocketAddr) -> Box<ConnLog> {
        let now = Instant::now();
        Box::new(ConnLog {
            peer,
            opened: now,
            read: Cell::new(0),
            written: Cell::new(0),
            started: Cell::new(Some(now)),
            last_read: Cell::new(now),
            messages_in: Cell::new(0),
            messages_out: Cell::new(0),
            upgrade: RefCell::new(None),
            ws: RefCell::new(None),
        })
    }

    /// `n` bytes were read; `first`: into an empty `inbuf`, so they begin a request.
    pub fn on_read(&self, n: usize, first: bool) {
        let now = Instant::now();
        self.read.set(self.read.get() + n as u64);
        self.last_read.set(now);
        if first {
            self.started.set(Some(now));
        }
    }

    /// `n` bytes were written.
    pub fn on_written(&self, n: usize) {
        self.written.set(self.written.get() + n as u64);
    }

    /// A WebSocket message came in, or went out.
    pub fn on_message(&self, incoming: bool) {
        let c = if incoming {
            &self.messages_in
        } else {
            &self.messages_out
        };
        c.set(c.get() + 1);
    }

    /// A request was answered and left `inbuf`; `pipelined`: the next one is there already,
    /// its first byte read by the last read at the latest.
    pub fn request_done(&self, pipelined: bool) {
        self.started.set(pipelined.then(|| self.last_read.get()));
    }

    /// What the log keeps of the request in progress, about to leave `inbuf`.
    fn entry(&self, method: &str, path: &str, bytes_in: u64) -> KeptRequest {
        let method = &method.as_bytes()[..method.len().min(ACCESS_LOG_METHOD_MAX_BYTES)];
        let path = &path.as_bytes()[..path.len().min(ACCESS_LOG_PATH_MAX_BYTES)];
        KeptRequest {
            text: [method, path].concat(),
            method_len: method.len(),
            bytes_in,
            started: self.started.get().unwrap_or_else(Instant::now),
        }
    }

    /// What the log keeps of a request for an object, about to leave `inbuf`.
    pub fn kept(&self, method: &str, path: &str, bytes_in: u64) -> Box<KeptRequest> {
        Box::new(self.entry(method, path, bytes_in))
    }

    /// Keeps the upgrade request about to leave `inbuf`.
    pub fn keep_upgrade(&self, method: &str, path: &str, bytes_in: u64) {
        *self.upgrade.borrow_mut() = Some(self.entry(method, path, bytes_in));
    }

    /// The line of a response of `status`, `bytes_out` long, to the request `asked` (`inbuf`:
    /// the connection's, where [`Asked::Inbuf`] finds its request line).
    pub fn http(
        &self,
        state: &ShardState,
        inbuf: &[u8],
        asked: Asked<'_>,
        status: u16,
        bytes_out: u64,
    ) {
        let Some(shard) = state.access_log() else {
            return;
        };
        let upgrade = self.upgrade.borrow();
        let asked = match asked {
            Asked::Upgrade => Asked::Kept(upgrade.as_ref()),
            other => other,
        };
        let (method, path, bytes_in, started) = match asked {
            Asked::Parsed(method, path, bytes) => (
                Some(method.as_bytes()),
                Some(path.as_bytes()),
                bytes,
                self.started.get(),
            ),
            Asked::Inbuf(bytes) => {
                let (method, path) = request_line(inbuf);
                (method, path, bytes, self.started.get())
            }
            Asked::Kept(Some(e)) => (
                Some(e.method()),
                Some(e.path()),
                e.bytes_in,
                Some(e.started),
            ),
            Asked::Kept(None) | Asked::Upgrade => (None, None, 0, None),
            Asked::Nothing => (None, None, 0, Some(self.opened)),
        };
        let took = started.map_or(Duration::ZERO, |s| s.elapsed());
        shard.record(state.stats(), |out| {
            LogLine::begin(out, SystemTime::now(), state.id(), self.peer, Event::Http)
                .text("method", method, ACCESS_LOG_METHOD_MAX_BYTES)
                .text("path", path, ACCESS_LOG_PATH_MAX_BYTES)
                .number("status", u64::from(status))
                .number("bytes_in", bytes_in)
                .number("bytes_out", bytes_out)
                .ms(took)
                .end()
        });
    }

    /// The WebSocket of the upgrade asked for opened (its 101 is written).
    pub fn ws_open(&self, state: &ShardState) {
        let Some(shard) = state.access_log() else {
            return;
        };
        let Some(upgrade) = self.upgrade.borrow_mut().take() else {
            return;
        };
        shard.record(state.stats(), |out| {
            LogLine::begin(out, SystemTime::now(), state.id(), self.peer, Event::WsOpen)
                .text("path", Some(upgrade.path()), ACCESS_LOG_PATH_MAX_BYTES)
                .ms(upgrade.started.elapsed())
                .end()
        });
        *self.ws.borrow_mut() = Some(WsLog {
            upgrade,
            opened: Instant::now(),
            read: self.read.get(),
            written: self.written.get(),
        });
    }

    /// The WebSocket ended as `end` says (its close frame, if any, written).
    pub fn ws_close(&self, state: &ShardState, end: WsEnd) {
        let Some(shard) = state.access_log() else {
            return;
        };
        let Some(ws) = self.ws.borrow_mut().take() else {
            return;
        };
        shard.record(state.stats(), |out| {
            let line = LogLine::begin(
                out,
                SystemTime::now(),
                state.id(),
                self.peer,
                Event::WsClose,
            )
            .text("path", Some(ws.upgrade.path()), ACCESS_LOG_PATH_MAX_BYTES)
            .number("code", u64::from(end.code))
            .word("by", end.by);
            let line = match end.reason {
                Some(r) => line.word("reason", r),
                None => line.text("reason", None, 0),
            };
            line.number("bytes_in", self.read.get() - ws.read)
                .number("bytes_out", self.written.get() - ws.written)
                .number("messages_in", self.messages_in.get())
                .number("messages_out", self.messages_out.get())
                .ms(ws.opened.elapsed())
                .end()
        });
    }
}
