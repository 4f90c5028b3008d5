//! The clients of a `host_imports` script ([`super::host`]): HTTP connections that pipeline
//! requests and hold every answer to HTTP/1.1's framing, and WebSocket sessions that hold
//! every frame the node sends to RFC 6455. A broken rule is an `Err` naming it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use super::node::WAIT;

/// One answer the node gave: a response, or (for a session) a text message.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The status (0 for a message).
    pub status: u16,
    /// The body or the message.
    pub body: Vec<u8>,
}

/// Connects from `from` (a loopback address) to `to`.
fn connect(from: [u8; 4], to: SocketAddr) -> Result<TcpStream, String> {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .map_err(|e| format!("a socket: {e}"))?;
    sock.bind(&SocketAddr::from((from, 0)).into())
        .map_err(|e| format!("bind {from:?}: {e}"))?;
    sock.connect_timeout(&to.into(), WAIT)
        .map_err(|e| format!("connect to the node: {e}"))?;
    let s: TcpStream = sock.into();
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Waits up to `until` for the socket to be readable (or writable too, with `write`).
/// Answers (readable, writable).
fn poll(s: &TcpStream, write: bool, until: Instant) -> (bool, bool) {
    use nix::poll::{PollFd, PollFlags, PollTimeout};
    let events = PollFlags::POLLIN
        | if write {
            PollFlags::POLLOUT
        } else {
            PollFlags::empty()
        };
    let mut fds = [PollFd::new(s.as_fd(), events)];
    let ms = until.saturating_duration_since(Instant::now()).as_millis();
    let timeout =
        PollTimeout::try_from(ms.min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX);
    let _ = nix::poll::poll(&mut fds, timeout);
    let got = fds[0].revents().unwrap_or(PollFlags::empty());
    let hup = got.intersects(PollFlags::POLLHUP | PollFlags::POLLERR);
    (
        got.contains(PollFlags::POLLIN) || hup,
        got.contains(PollFlags::POLLOUT),
    )
}

/// An HTTP connection with requests pipelined on it.
pub struct HttpConn {
    sock: TcpStream,
    pending: Vec<u8>,
    /// Per request not yet answered: whether it was a `HEAD`.
    heads: Vec<bool>,
    buf: Vec<u8>,
    closed: bool,
}

impl HttpConn {
    /// Opens a connection from `from`.
    pub fn open(from: [u8; 4], to: SocketAddr) -> Result<HttpConn, String> {
        let sock = connect(from, to)?;
        sock.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok(HttpConn {
            sock,
            pending: Vec::new(),
            heads: Vec::new(),
            buf: Vec::new(),
            closed: false,
        })
    }

    /// Queues a request for `target` with `body`.
    pub fn queue(&mut self, method: &str, target: &str, body: &[u8]) {
        let _ = write!(
            self.pending,
            "{method} {target} HTTP/1.1\r\nHost: fuzz\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        self.pending.extend_from_slice(body);
        self.heads.push(method == "HEAD");
    }

    /// Writes what is queued, reading what comes meanwhile (the node holds answers a client
    /// does not read, and stops reading its requests).
    pub fn flush(&mut self) -> Result<(), String> {
        let until = Instant::now() + WAIT;
        while !self.pending.is_empty() && !self.closed {
            if Instant::now() >= until {
                return Err("timed out writing pipelined requests".into());
            }
            let (readable, writable) = poll(&self.sock, true, until);
            if writable {
                match self.sock.write(&self.pending) {
                    Ok(n) => {
                        self.pending.drain(..n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => self.closed = true,
                }
            }
            if readable {
                self.read_some();
            }
        }
        Ok(())
    }

    fn read_some(&mut self) {
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.sock.read(&mut chunk) {
                Ok(0) => {
                    self.closed = true;
                    return;
                }
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.closed = true;
                    return;
                }
            }
        }
    }

    /// Sends the rest and reads one answer per request, each held to HTTP/1.1's framing;
    /// nothing may follow the last.
    pub fn answers(mut self) -> Result<Vec<Answer>, String> {
        self.flush()?;
        let until = Instant::now() + WAIT;
        let mut out = Vec::new();
        while out.len() < self.heads.len() {
            if let Some((answer, used, close)) = parse_response(&self.buf, self.heads[out.len()])? {
                self.buf.drain(..used);
                out.push(answer);
                if close {
                    return Err(format!(
                        "the node closed the connection after {} of {} requests",
                        out.len(),
                        self.heads.len()
                    ));
                }
                continue;
            }
            if self.closed {
                return Err(format!(
                    "the connection closed with {} of {} requests answered ({} bytes of a \
                     response: {:?})",
                    out.len(),
                    self.heads.len(),
                    self.buf.len(),
                    String::from_utf8_lossy(&self.buf[..self.buf.len().min(200)])
                ));
            }
            if Instant::now() >= until {
                return Err(format!(
                    "timed out waiting for the answer to request {} of {}",
                    out.len() + 1,
                    self.heads.len()
                ));
            }
            poll(&self.sock, false, until);
            self.read_some();
        }
        if !self.buf.is_empty() {
            return Err(format!(
                "{} bytes after the last answer: {:?}",
                self.buf.len(),
                String::from_utf8_lossy(&self.buf[..self.buf.len().min(200)])
            ));
        }
        Ok(out)
    }
}

/// One response at the start of `buf`, if it is all there: the answer, its length, and
/// whether it closes the connection. A response that breaks HTTP/1.1 is an error.
fn parse_response(buf: &[u8], head: bool) -> Result<Option<(Answer, usize, bool)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut r = httparse::Response::new(&mut headers);
    let at = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => {
            return Err(format!(
                "not an HTTP response ({e}): {:?}",
                String::from_utf8_lossy(&buf[..buf.len().min(200)])
            ))
        }
    };
    let status = r.code.unwrap_or(0);
    if r.version != Some(1) || !(200..=599).contains(&status) {
        return Err(format!(
            "a response with status {status} (version {:?})",
            r.version
        ));
    }
    let field = |name: &str| {
        r.headers
            .iter()
            .filter(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
            .collect::<Vec<_>>()
    };
    if !field("transfer-encoding").is_empty() {
        return Err(format!("a {status} framed with transfer-encoding"));
    }
    let lengths = field("content-length");
    let no_body = status == 204 || status == 304;
    // RFC 9110, 8.6: no content-length on a 204; a 304's would be the 200's.
    if no_body && !lengths.is_empty() {
        return Err(format!("a {status} with content-length {lengths:?}"));
    }
    let len: usize = match (&lengths[..], no_body) {
        (_, true) => 0,
        ([one], false) => one
            .parse()
            .map_err(|_| format!("a {status} with content-length {one:?}"))?,
        (_, false) => return Err(format!("a {status} with content-length {lengths:?}")),
    };
    let body_len = if head { 0 } else { len };
    if buf.len() < at + body_len {
        return Ok(None);
    }
    let close = field("connection")
        .iter()
        .any(|v| v.eq_ignore_ascii_case("close"));
    Ok(Some((
        Answer {
            status,
            body: buf[at..at + body_len].to_vec(),
        },
        at + body_len,
        close,
    )))
}

/// A WebSocket session.
pub struct Session {
    sock: TcpStream,
}

/// What a session was sent, to its close.
#[derive(Debug, Default)]
pub struct Heard {
    /// Its text messages.
    pub texts: Vec<String>,
    /// Payload bytes of its messages.
    pub bytes: u64,
}

impl Heard {
    /// Adds what another session heard.
    pub fn add(&mut self, other: Heard) {
        self.texts.extend(other.texts);
        self.bytes += other.bytes;
    }
}

impl Session {
    /// Opens a session on `target`: the session, or the answer that refused it.
    pub fn open(
        from: [u8; 4],
        to: SocketAddr,
        target: &str,
    ) -> Result<Result<Session, Answer>, String> {
        let mut sock = connect(from, to)?;
        sock.set_read_timeout(Some(WAIT))
            .map_err(|e| e.to_string())?;
        sock.set_write_timeout(Some(WAIT))
            .map_err(|e| e.to_string())?;
        write!(
            sock,
            "GET {target} HTTP/1.1\r\nHost: fuzz\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .map_err(|e| format!("write an upgrade: {e}"))?;
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        // Byte by byte to the end of the head: what follows is the session's.
        while !buf.ends_with(b"\r\n\r\n") {
            match sock.read(&mut byte) {
                Ok(1) => buf.push(byte[0]),
                _ => {
                    return Err(format!(
                        "the upgrade was not answered (timed out or closed): {:?}",
                        String::from_utf8_lossy(&buf)
                    ))
                }
            }
        }
        if buf.starts_with(b"HTTP/1.1 101 ") {
            return Ok(Ok(Session { sock }));
        }
        // A refusal: a whole response, then the connection may close.
        let _ = sock.set_read_timeout(Some(Duration::from_millis(500)));
        let mut rest = Vec::new();
        loop {
            if let Some((answer, _, _)) = parse_response(&[&buf[..], &rest[..]].concat(), false)? {
                return Ok(Err(answer));
            }
            let mut chunk = [0u8; 16 * 1024];
            match sock.read(&mut chunk) {
                Ok(n) if n > 0 => rest.extend_from_slice(&chunk[..n]),
                _ => return Err(format!("a refused upgrade's answer ended short: {buf:?}")),
            }
        }
    }

    /// Sends a message (masked, key 0); a session the node closed takes nothing.
    pub fn send(&mut self, binary: bool, payload: &[u8]) {
        let mut f = vec![0x80 | if binary { 0x2 } else { 0x1 }];
        let len = payload.len() as u64;
        match len {
            0..=125 => f.push(0x80 | len as u8),
            126..=0xffff => {
                f.push(0x80 | 126);
                f.extend((len as u16).to_be_bytes());
            }
            _ => {
                f.push(0x80 | 127);
                f.extend(len.to_be_bytes());
            }
        }
        f.extend([0, 0, 0, 0]);
        f.extend_from_slice(payload);
        let _ = self.sock.write_all(&f);
    }

    /// Closes the session and reads what it was sent to the end, each frame held to RFC 6455
    /// (a server's frames are not masked, control frames are short and whole, text is UTF-8,
    /// nothing follows a close).
    pub fn close(mut self) -> Result<Heard, String> {
        // A close frame, code 1000, masked with key 0.
        let _ = self.sock.write_all(&[0x88, 0x82, 0, 0, 0, 0, 0x03, 0xe8]);
        let _ = self.sock.set_read_timeout(Some(WAIT));
        let mut heard = Heard::default();
        let mut message: Option<(u8, Vec<u8>)> = None;
        loop {
            let mut h = [0u8; 2];
            if self.sock.read_exact(&mut h).is_err() {
                // Closed (or reset) without a close frame: allowed, the node may drop a
                // session it closes for a limit.
                return Ok(heard);
            }
            let (fin, opcode) = (h[0] & 0x80 != 0, h[0] & 0x0f);
            if h[0] & 0x70 != 0 || h[1] & 0x80 != 0 || ![0, 1, 2, 8, 9, 10].contains(&opcode) {
                return Err(format!("a frame header {h:02x?} a server may not send"));
            }
            let len = match h[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    self.read(&mut b)?;
                    u64::from(u16::from_be_bytes(b))
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.read(&mut b)?;
                    u64::from_be_bytes(b)
                }
                n => u64::from(n),
            };
            if opcode >= 8 && (len > 125 || !fin) {
                return Err(format!(
                    "a control frame {opcode:#x} of {len} bytes, fin {fin}"
                ));
            }
            if len > 1 << 26 {
                return Err(format!("a frame of {len} bytes"));
            }
            let mut payload = vec![0u8; len as usize];
            self.read(&mut payload)?;
            heard.bytes += len;
            match opcode {
                8 => {
                    close_payload(&payload)?;
                    let mut more = [0u8; 1];
                    return match self.sock.read(&mut more) {
                        Ok(0) | Err(_) => Ok(heard),
                        Ok(_) => Err("bytes after a close frame".into()),
                    };
                }
                9 | 10 => {}
                0 => match &mut message {
                    Some((_, m)) => m.extend_from_slice(&payload),
                    None => return Err("a continuation without a message".into()),
                },
                _ if message.is_some() => return Err("a message inside a message".into()),
                op => message = Some((op, payload)),
            }
            if fin && opcode < 8 {
                if let Some((op, m)) = message.take() {
                    if op == 1 {
                        let t = String::from_utf8(m)
                            .map_err(|_| "a text message that is not UTF-8".to_string())?;
                        heard.texts.push(t);
                    }
                }
            }
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<(), String> {
        self.sock
            .read_exact(buf)
            .map_err(|e| format!("a frame ended short: {e}"))
    }
}

/// A close frame's payload: nothing, or a code a server may send and a UTF-8 reason.
fn close_payload(p: &[u8]) -> Result<(), String> {
    if p.is_empty() {
        return Ok(());
    }
    let code = match p {
        [a, b, ..] => u16::from_be_bytes([*a, *b]),
        _ => return Err("a close frame of one byte".into()),
    };
    let sendable = matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999);
    if !sendable || std::str::from_utf8(&p[2..]).is_err() {
        return Err(format!("a close frame {p:?}"));
    }
    Ok(())
}
