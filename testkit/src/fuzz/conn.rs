//! The `http_conn` fuzz target's harness: the real node (the `combd-test-node` binary, started
//! once: the node and the test apps) and
//! a script of clients ([`super::script`]) played against it on loopback sockets: pipelined
//! requests, heads and bodies split anywhere, WebSocket frames, clients that stop reading or
//! close half-way. Nothing of the connection is modelled: the node's own loop answers.
//!
//! After each script every client is closed, a fresh client must be answered, the node must
//! come back to rest (no connection but the one asking for `/stats`, no input held), and its
//! high-water marks must be within the bounds the node states:
//! - `inbound_bytes_max` (one shard): at most the shard's budget and a connection's floor twice
//!   (a job's, a body's) per client, and at most what each client may hold ([`conn_bound`]);
//! - `pipeline_held_bytes_max`: at most `PIPELINE_HELD_MAX_BYTES` and the response that crossed
//!   it;
//! - the node's resident memory within [`RSS_GROWTH_MAX_BYTES`] of what it was before.
//!
//! The high-water marks are the node's since it started; a script is quiet before it (the node
//! at rest), so a mark that rose rose in it, and is held to the bound for its clients.
//! A broken bound panics with the script and the node's figures.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use combd_kernel::limits;
use serde_json::Value;

use super::node::{Node, Start, WAIT};
use super::script::{self, Op, CONNS_MAX, QUEUED_MAX_BYTES};

/// `COMBD_INBOUND_BUDGET` of the node under test: a few clients' bodies pass it, one client
/// cannot ([`conn_bound`] is under it).
pub const INBOUND_BUDGET_BYTES: u64 = 1 << 20;
/// `COMBD_MAX_BODY` of the node under test: the scripts' sizes reach past it.
pub const MAX_BODY_BYTES: u64 = 160 * 1024;
/// `COMBD_WS_MAX_MESSAGE` of the node under test.
pub const WS_MAX_MESSAGE_BYTES: u64 = 64 * 1024;
/// How much the node's resident memory may grow over its first measure, at rest after any
/// script: eight clients' worth of bounds is a few MiB; this is room for the allocator.
pub const RSS_GROWTH_MAX_BYTES: u64 = 64 << 20;
/// The address the fresh client after each script comes from (the scripts' are 127.0.1.x).
const HONEST_FROM: [u8; 4] = [127, 0, 2, 1];

/// The input one client may have held at once in its shard:
/// - over HTTP, the body read after its head (reserved as declared, then its job's) and the
///   jobs of the requests complete in one read behind it (the loop waits for every answer owed
///   before it reads a body or waits for input), and one body more: a job's hold is let go
///   when the job is dropped, which may come just after its answer;
/// - over a WebSocket, its messages up to `INBOUND_CONN_QUEUED_MAX_BYTES`, what one decode of
///   its buffer and its reassembly queues past that (one read and a message), and the partial
///   message it holds against the budget meanwhile (as much again).
pub fn conn_bound() -> u64 {
    let scratch = limits::READ_SCRATCH_BYTES as u64;
    let http = 2 * MAX_BODY_BYTES + scratch;
    let ws = limits::INBOUND_CONN_QUEUED_MAX_BYTES + 2 * (WS_MAX_MESSAGE_BYTES + scratch);
    http.max(ws)
}

/// What one script did, for the runs' summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    /// Operations in the script.
    pub ops: usize,
    /// Clients that connected.
    pub clients: usize,
    /// Bytes the clients wrote.
    pub sent_bytes: u64,
    /// Bytes the clients read.
    pub received_bytes: u64,
}

/// A running node and the marks seen so far.
pub struct Harness {
    node: Node,
    /// The largest response a script can get: the page, or an echo of the largest body.
    response_max_bytes: u64,
    rss_base_bytes: u64,
    /// The shard's high-water marks after the last script.
    inbound_max_seen: u64,
    held_max_seen: u64,
}

/// One script's client.
struct Client {
    sock: TcpStream,
    pending: Vec<u8>,
    sent: usize,
}

impl Harness {
    /// Starts `bin` (a built `combd-test-node`: the test apps are asked for) on 127.0.0.2 with
    /// one shard, and waits for its ready line. Panics if it does not start.
    pub fn start(bin: &Path) -> Harness {
        let env = [
            ("COMBD_INBOUND_BUDGET", INBOUND_BUDGET_BYTES.to_string()),
            // A client may hold half the small budget: the honest client's largest body
            // (`MAX_BODY_BYTES`) is within its share, and the bounds below still hold.
            ("COMBD_CLIENT_SHARE_MAX_PERCENT", "50".to_string()),
            ("COMBD_MAX_BODY", MAX_BODY_BYTES.to_string()),
            ("COMBD_WS_MAX_MESSAGE", WS_MAX_MESSAGE_BYTES.to_string()),
            // Thousands of scripts a minute from 250 addresses: the accept rate is not fuzzed.
            ("COMBD_ACCEPT_RATE_PER_ADDRESS", "1000000".to_string()),
        ];
        let node = Node::start(
            bin,
            Start {
                dir: Node::fresh_dir("conn"),
                env: env.into_iter().map(|(k, v)| (k, v.into())).collect(),
                log: ("error", false),
                cwd: None,
            },
        );
        let mut h = Harness {
            node,
            response_max_bytes: 0,
            rss_base_bytes: 0,
            inbound_max_seen: 0,
            held_max_seen: 0,
        };
        h.warm_up();
        h
    }

    fn public(&self) -> SocketAddr {
        self.node.public()
    }

    /// Touches what scripts touch (the page, the counter, an echo, the hold object), so the
    /// memory measured first holds them; measures the page.
    fn warm_up(&mut self) {
        let page = self.honest("GET /million/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let body = "1".repeat(MAX_BODY_BYTES as usize);
        let echo = self.honest(&format!(
            "POST /o/echo/e HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        self.honest("POST /o/counter/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\n1");
        self.honest("POST /o/hold/h?ms=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        self.response_max_bytes = page.max(echo) as u64;
        let s = self.rest("the warm-up");
        self.inbound_max_seen = shard(&s, "inbound_bytes_max");
        self.held_max_seen = shard(&s, "pipeline_held_bytes_max");
        self.rss_base_bytes = self.rss();
    }

    /// Sends `req` from [`HONEST_FROM`] on a new connection and reads the answer to its close;
    /// it must be a 200. Returns its length.
    fn honest(&self, req: &str) -> usize {
        let sock = socket(HONEST_FROM, false);
        sock.connect_timeout(&self.public().into(), WAIT)
            .expect("connect a fresh client to the node");
        let mut s: TcpStream = sock.into();
        s.set_read_timeout(Some(WAIT)).expect("read timeout");
        s.write_all(req.as_bytes())
            .expect("write a fresh client's request");
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        assert!(
            got.starts_with(b"HTTP/1.1 200"),
            "a fresh client was not answered 200 (timed out waiting for its answer?): {:?}",
            String::from_utf8_lossy(&got[..got.len().min(300)])
        );
        got.len()
    }

    /// Plays one script (any bytes: see [`script::decode`]), then checks the node.
    pub fn run(&mut self, data: &[u8]) -> Outcome {
        let ops = script::decode(data);
        let mut out = Outcome {
            ops: ops.len(),
            ..Outcome::default()
        };
        let mut clients: Vec<Client> = Vec::new();
        let mut open_max = 0;
        let mut queued = 0;
        let mut buf = vec![0u8; 64 * 1024];
        for op in &ops {
            let pick = |conn: &u8, n: usize| (n > 0).then(|| usize::from(*conn) % n);
            match op {
                Op::Open { from, small_rcvbuf } => {
                    if clients.len() >= CONNS_MAX {
                        continue;
                    }
                    let sock = socket([127, 0, 1, from % 250 + 1], *small_rcvbuf);
                    if sock.connect_timeout(&self.public().into(), WAIT).is_err() {
                        continue;
                    }
                    let sock: TcpStream = sock.into();
                    sock.set_nonblocking(true).expect("non-blocking");
                    let _ = sock.set_nodelay(true);
                    clients.push(Client {
                        sock,
                        pending: Vec::new(),
                        sent: 0,
                    });
                    out.clients += 1;
                    open_max = open_max.max(clients.len());
                }
                Op::Queue { conn, item, times } => {
                    if let Some(i) = pick(conn, clients.len()) {
                        let c = &mut clients[i];
                        for _ in 0..*times {
                            let before = c.pending.len();
                            item.write(&mut c.pending);
                            queued += c.pending.len() - before;
                            if queued > QUEUED_MAX_BYTES {
                                queued -= c.pending.len() - before;
                                c.pending.truncate(before);
                                break;
                            }
                        }
                    }
                }
                Op::Send { conn, bytes } => {
                    if let Some(i) = pick(conn, clients.len()) {
                        out.sent_bytes += clients[i].send(bytes.unwrap_or(usize::MAX)) as u64;
                    }
                }
                Op::Read {
                    conn,
                    bytes,
                    wait_ms,
                } => {
                    if let Some(i) = pick(conn, clients.len()) {
                        out.received_bytes += clients[i].read(*bytes, *wait_ms, &mut buf) as u64;
                    }
                }
                Op::Close { conn } => {
                    if let Some(i) = pick(conn, clients.len()) {
                        clients.remove(i);
                    }
                }
                Op::ShutdownWrite { conn } => {
                    if let Some(i) = pick(conn, clients.len()) {
                        let _ = clients[i].sock.shutdown(Shutdown::Write);
                    }
                }
            }
        }
        drop(clients);
        self.check(&ops, open_max);
        out
    }

    /// After a script: a fresh client is answered, the node comes back to rest, and its marks
    /// are within their bounds for `clients` clients at once.
    fn check(&mut self, ops: &[Op], clients: usize) {
        if let Some(status) = self.node.exited() {
            panic!("the node exited ({status}) during the script {ops:?}");
        }
        self.honest("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let s = self.rest("the script's clients closed");
        let k = clients.max(1) as u64;
        let inbound = shard(&s, "inbound_bytes_max");
        if inbound > self.inbound_max_seen {
            let floor = limits::INBOUND_CONN_FLOOR_BYTES;
            let budget_bound = INBOUND_BUDGET_BYTES + 2 * floor * k;
            let bound = budget_bound.min(k * conn_bound());
            assert!(
                inbound <= bound,
                "inbound_bytes_max {inbound} past its bound {bound} ({k} clients at once) \
                 in the script {ops:?}\nstats: {s}"
            );
            self.inbound_max_seen = inbound;
        }
        let held = shard(&s, "pipeline_held_bytes_max");
        if held > self.held_max_seen {
            let bound = limits::PIPELINE_HELD_MAX_BYTES as u64 + self.response_max_bytes;
            assert!(
                held <= bound,
                "pipeline_held_bytes_max {held} past its bound {bound} (64 KiB and the largest \
                 response, {}) in the script {ops:?}\nstats: {s}",
                self.response_max_bytes
            );
            self.held_max_seen = held;
        }
        let rss = self.rss();
        assert!(
            rss <= self.rss_base_bytes + RSS_GROWTH_MAX_BYTES,
            "the node grew from {} to {rss} bytes at rest after the script {ops:?}",
            self.rss_base_bytes
        );
    }

    /// Waits until the node holds no client connection and no input; its `/stats` then.
    fn rest(&self, after: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            let s = self.stats();
            // The one connection open is the one asking.
            if s["conns"] == 1 && s["inbound_bytes"] == 0 && s["sessions"] == 0 {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the node to come back to rest after {after}: {s}"
            );
            // Nothing to wait on but the node's figures: poll them gently.
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The node's `/stats`.
    pub fn stats(&self) -> Value {
        self.node.stats()
    }

    fn rss(&self) -> u64 {
        self.node.rss()
    }
}

impl Client {
    /// Writes up to `n` of what is pending, as much as the socket takes now. A node that
    /// closed the connection ends the writes.
    fn send(&mut self, n: usize) -> usize {
        let end = self.pending.len().min(self.sent.saturating_add(n));
        let start = self.sent;
        while self.sent < end {
            match self.sock.write(&self.pending[self.sent..end]) {
                Ok(0) | Err(_) => break,
                Ok(w) => self.sent += w,
            }
        }
        self.sent - start
    }

    /// Reads up to `n` bytes of what the node sent, waiting up to `wait_ms` for the first.
    fn read(&mut self, n: usize, wait_ms: u16, buf: &mut [u8]) -> usize {
        if wait_ms > 0 {
            use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
            let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::from(wait_ms));
        }
        let mut got = 0;
        while got < n {
            let want = (n - got).min(buf.len());
            match self.sock.read(&mut buf[..want]) {
                Ok(0) | Err(_) => break,
                Ok(r) => got += r,
            }
        }
        got
    }
}

/// A TCP socket bound to `from` (any port); `small_rcvbuf`: with the kernel's smallest
/// receive buffer.
fn socket(from: [u8; 4], small_rcvbuf: bool) -> socket2::Socket {
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("a socket");
    if small_rcvbuf {
        let _ = sock.set_recv_buffer_size(1);
    }
    sock.bind(&SocketAddr::from((from, 0)).into())
        .expect("bind a loopback client address");
    sock
}

/// A figure of shard 0 (the node under test has one).
fn shard(s: &Value, name: &str) -> u64 {
    s["shards"][0][name]
        .as_u64()
        .unwrap_or_else(|| panic!("/stats has no shards[0].{name}: {s}"))
}

/// The fuzz target's entry: plays `data` against a node started at the first call from the
/// binary `COMBD_BIN` names.
pub fn http_conn(data: &[u8]) {
    use std::sync::{Mutex, OnceLock};
    static HARNESS: OnceLock<Mutex<Harness>> = OnceLock::new();
    let h = HARNESS.get_or_init(|| {
        let bin = std::env::var_os("COMBD_BIN").expect(
            "set COMBD_BIN to a built combd-test-node binary \
             (cargo build --release -p combd: target/release/combd-test-node)",
        );
        Mutex::new(Harness::start(Path::new(&bin)))
    });
    h.lock().unwrap_or_else(|p| p.into_inner()).run(data);
}
