//! Shared fixtures for the integration tests: start the real node on a free port and talk to
//! it with real sockets. Every wait is bounded and fails with "timed out waiting for ...".
//!
//! A node is the `combd` binary, or `combd-test-node` (the node and the test apps) when its
//! settings list [`TEST_APPS`]. Either is started by `combd_testkit::launch`, the launcher the
//! fuzz harness uses too; [`TestNode`] and [`start_captured`] add the tests' helpers.

#![allow(dead_code, unused_imports, clippy::unwrap_used)]

pub mod auth;
pub mod powercut;
pub mod proxy;
pub mod tls;
pub mod tls_front;

mod apps;
mod disk;
mod skip;
pub use apps::{apps_dir, error, refused_with, versioned};
pub use disk::SmallDisk;
pub use skip::skipped;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use combd_testkit::launch::{self, Stderr};
pub use combd_testkit::launch::{ready_port, WAIT};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Put among a node's settings, starts `combd-test-node` (the node and the test apps:
/// `fanout`, `hold`, `limits`, `stall`, `whoami`, `caller`, `alarmer`, `bank`, `room`) instead of
/// `combd`. It is no setting: [`combd_command`] takes it out before the node sees the rest.
pub const TEST_APPS: (&str, &str) = ("binary", "combd-test-node");

pub(crate) static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A running node.
pub struct TestNode {
    child: Option<Child>,
    pub port: u16,
    /// The TLS port, when TLS is on.
    pub tls_port: Option<u16>,
    pub data_dir: std::path::PathBuf,
}

impl TestNode {
    /// Starts the node on 127.0.0.2 with a fresh data directory and the given settings, and
    /// waits for its ready line.
    pub fn start(env: &[(&str, &str)]) -> TestNode {
        let data_dir = std::env::temp_dir().join(format!(
            "combd-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&data_dir);
        Self::start_in(data_dir, env)
    }

    /// Starts the node on an existing data directory (a restart).
    pub fn start_in(data_dir: std::path::PathBuf, env: &[(&str, &str)]) -> TestNode {
        Self::start_with(data_dir, env, Stdio::inherit())
    }

    /// Starts the node on `data_dir` with its stderr going to `stderr`.
    pub fn start_with(
        data_dir: std::path::PathBuf,
        env: &[(&str, &str)],
        stderr: Stdio,
    ) -> TestNode {
        let node = launch::start(combd_command(&data_dir, env), Stderr::To(stderr), false);
        TestNode {
            child: Some(node.child),
            port: node.port,
            tls_port: node.tls_port,
            data_dir,
        }
    }

    /// The public address (127.0.0.2).
    pub fn public(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 2], self.port))
    }

    /// The localhost listener (127.0.0.1).
    pub fn local(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    /// `/stats` from the localhost listener.
    pub fn stats(&self) -> serde_json::Value {
        let r = request(
            self.local(),
            b"GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(r.status, 200, "/stats: {}", r.text());
        serde_json::from_slice(&r.body).expect("/stats is JSON")
    }

    /// Kills the process with SIGKILL and waits for it; the data directory stays.
    pub fn kill9(mut self) -> std::path::PathBuf {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
        std::mem::take(&mut self.data_dir)
    }

    /// Sends a signal.
    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid()), sig).unwrap_or_else(|e| panic!("kill {sig}: {e}"));
    }

    /// Sends SIGTERM.
    pub fn sigterm(&self) {
        self.signal(Signal::SIGTERM);
    }

    /// Waits for the process to exit.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let status = child.wait();
            let _ = tx.send(());
            (child, status)
        });
        if rx.recv_timeout(WAIT + WAIT).is_err() {
            panic!("timed out waiting for the node to exit");
        }
        let (_, status) = waiter.join().expect("waiter");
        status.expect("wait")
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !self.data_dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.data_dir);
        }
    }
}

/// The node's binary set up as the tests run a node (`combd_testkit::launch::command`): public
/// listener on `127.0.0.2` (port 0 picks one), data in `data_dir`, logs at `warn`, none of the
/// tests' own `COMBD_*` variables, then `env` on top. The binary is `combd-test-node` when
/// `env` holds [`TEST_APPS`], else `combd`.
pub fn combd_command(data_dir: &Path, env: &[(&str, &str)]) -> Command {
    let bin = if env.contains(&TEST_APPS) {
        env!("CARGO_BIN_EXE_combd-test-node")
    } else {
        env!("CARGO_BIN_EXE_combd")
    };
    let mut cmd = launch::command(Path::new(bin), data_dir, "warn");
    cmd.envs(env.iter().copied().filter(|kv| *kv != TEST_APPS));
    cmd
}

/// Runs `cmd` to its end (stdin empty, stdout and stderr captured). A process still running
/// after the wait is killed and fails the test: a node that should have refused to start.
pub fn run_to_exit(cmd: &mut Command) -> std::process::Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(WAIT) {
        Ok(out) => out.expect("wait"),
        Err(_) => {
            // Our own child's pid, which has not been reaped (the waiter holds it).
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            let out = rx.recv_timeout(WAIT).expect("the killed process's output");
            let out = out.expect("wait");
            panic!(
                "timed out waiting for the process to exit (it kept running); stdout: {} stderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// Runs `cmd`, which must refuse to start: exit status 78 within the wait. Returns its stderr.
pub fn refused(cmd: &mut Command) -> String {
    let out = run_to_exit(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(78), "stderr: {stderr}");
    stderr
}

/// Waits for `child` to exit within the wait and returns its status; one still running then is
/// killed and fails the test.
pub fn exit_within(mut child: Child) -> ExitStatus {
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    match rx.recv_timeout(WAIT) {
        Ok(status) => status.expect("wait"),
        Err(_) => {
            // Our own child's pid, which has not been reaped (the waiter holds it).
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            panic!("timed out waiting for the process to exit");
        }
    }
}

/// Every line a reader gives, on a channel (read by a thread until EOF).
pub fn lines(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits for the next line that contains `text`; fails with "timed out waiting for ...".
pub fn wait_line(lines: &mpsc::Receiver<String>, text: &str) -> String {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(text) => return line,
            Ok(_) => {}
            Err(e) => panic!("timed out waiting for a line with {text:?}: {e}"),
        }
    }
}

/// A node whose stdout and stderr the test reads line by line: started, and its ready line
/// waited for.
pub struct Captured {
    pub child: Child,
    pub out: mpsc::Receiver<String>,
    pub err: mpsc::Receiver<String>,
    pub port: u16,
}

/// Starts the node on `data` with `env`, both its outputs captured; waits until it is ready.
pub fn start_captured(data: &std::path::Path, env: &[(&str, &str)]) -> Captured {
    let node = launch::start(combd_command(data, env), Stderr::Lines, false);
    Captured {
        child: node.child,
        out: node.out,
        err: node.err.expect("the node's stderr, read line by line"),
        port: node.port,
    }
}

/// A port on 127.0.0.2 that nothing listens on (the kernel picked it free a moment ago), and
/// never one this process was given before (the kernel may hand a just-freed port to the next
/// bind, and two tests starting nodes at once would share it).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap();
    loop {
        let l = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        let port = l.local_addr().unwrap().port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// Polls `/stats` until `cond` holds; fails with "timed out waiting for {what}".
pub fn wait_stats(
    node: &TestNode,
    what: &str,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let s = node.stats();
        if cond(&s) {
            return s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: {s}"
        );
        // Nothing to wait on but the node's own figures: poll them gently.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A parsed HTTP response.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// Connects with read and write timeouts.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect_timeout(&addr, WAIT).expect("connect");
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.set_write_timeout(Some(WAIT)).unwrap();
    s
}

/// Connects to `to` from the loopback source address `from` (127.x.x.x, chosen by the test),
/// with read and write timeouts: a test that opens more connections than one address's share
/// (`COMBD_MAX_CONNS_PER_ADDRESS`) spreads them, as many clients would come from many addresses.
pub fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    sock.connect_timeout(&to.into(), WAIT).expect("connect");
    let s: TcpStream = sock.into();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.set_write_timeout(Some(WAIT)).unwrap();
    s
}

/// The `i`th of 250 client addresses (127.0.1.1 to 127.0.1.250), for [`connect_from`].
pub fn client_address(i: usize) -> [u8; 4] {
    [127, 0, 1, (i % 250) as u8 + 1]
}

/// Reads one response (content-length framed).
pub fn read_response(r: &mut impl BufRead) -> Resp {
    let mut status_line = String::new();
    r.read_line(&mut status_line)
        .expect("timed out waiting for a response");
    assert!(
        status_line.starts_with("HTTP/1.1 "),
        "status line {status_line:?}"
    );
    let status: u16 = status_line[9..12].parse().expect("status code");
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).expect("header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (n, v) = line.split_once(':').expect("header field");
        headers.push((n.trim().to_string(), v.trim().to_string()));
    }
    let len: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.parse().expect("content-length"))
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).expect("body");
    Resp {
        status,
        headers,
        body,
    }
}

/// Reads a response head, byte by byte up to its blank line, so nothing after it (a
/// WebSocket's first frame) is consumed.
pub fn read_head(r: &mut impl Read) -> Vec<u8> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        r.read_exact(&mut b)
            .expect("timed out waiting for a response head");
        head.push(b[0]);
    }
    head
}

/// Sends raw bytes on a new connection and reads one response.
pub fn request(addr: SocketAddr, raw: &[u8]) -> Resp {
    let mut s = connect(addr);
    s.write_all(raw).expect("write");
    read_response(&mut BufReader::new(s))
}

/// [`request`] from the client address `from` (see [`client_address`]): a test that opens
/// connections faster than `COMBD_ACCEPT_RATE_PER_ADDRESS` allows one address spreads them.
pub fn request_from(from: [u8; 4], addr: SocketAddr, raw: &[u8]) -> Resp {
    let mut s = connect_from(from, addr);
    s.write_all(raw).expect("write");
    read_response(&mut BufReader::new(s))
}

/// Reads (and discards) until the node has closed `s` (a slow reader it closed: what was in
/// flight comes first), within the wait.
pub fn read_until_closed(s: &mut TcpStream) {
    use std::io::Read;
    s.set_read_timeout(Some(WAIT)).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => assert!(
                std::time::Instant::now() < deadline,
                "the slow reader was not closed"
            ),
        }
    }
}

/// `POST path` with `body` to the node's public listener, on a connection of its own.
pub fn post(node: &TestNode, path: &str, body: &str) -> Resp {
    request(
        node.public(),
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
}

/// `method path` with `body` to the node's localhost listener, on a connection of its own.
pub fn local(node: &TestNode, method: &str, path: &str, body: &str) -> Resp {
    request(
        node.local(),
        format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
}

/// `GET path` from the node's public listener, on a connection of its own.
pub fn get(node: &TestNode, path: &str) -> Resp {
    request(
        node.public(),
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

/// A WebSocket to `path` on the node's public listener (tungstenite's client handshake).
pub fn open_ws(node: &TestNode, path: &str) -> tungstenite::WebSocket<TcpStream> {
    let stream = connect(node.public());
    let url = format!("ws://127.0.0.2:{}{path}", node.port);
    tungstenite::client(url.as_str(), stream)
        .expect("websocket handshake")
        .0
}

/// The next text message of `ws` as JSON (pings and pongs skipped).
pub fn read_json(ws: &mut tungstenite::WebSocket<TcpStream>) -> serde_json::Value {
    loop {
        match ws.read().expect("timed out waiting for a message") {
            tungstenite::Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
            tungstenite::Message::Ping(_) | tungstenite::Message::Pong(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    }
}

/// Asserts the peer closed: the next read returns EOF (or a reset), not data, within the wait.
pub fn assert_closed(r: &mut impl Read) {
    let mut buf = [0u8; 256];
    match r.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!(
            "expected close, got {:?}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("timed out waiting for the close: {e}"),
    }
}

/// Whether every shard's public listener is stopped and the node says it refuses at TCP.
pub fn all_public_listeners_stopped(s: &serde_json::Value) -> bool {
    s["tcp_refusing"] == 1
        && s["shards"]
            .as_array()
            .unwrap()
            .iter()
            .all(|sh| sh["listening"] == 0)
}

/// The node's resident memory (`VmRSS` of `/proc/<pid>/status`), in bytes.
pub fn rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    kb * 1024
}

/// The most `rss` reached over `window`, sampled every 20 ms: the attacks below cost the node
/// within milliseconds (34 MB a connection, before), so a peak is seen if there is one. A
/// bounded observation, not a wait for an event: the event to wait for is that nothing happens.
pub fn rss_peak(pid: i32, window: Duration) -> u64 {
    let end = Instant::now() + window;
    let mut peak = rss(pid);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        peak = peak.max(rss(pid));
    }
    peak
}

/// Upgrades the raw socket `s` to a WebSocket at `path` (Host `host`) with a fixed key, and
/// reads the 101's head: a client that then speaks frames by hand.
pub fn upgrade_raw(s: &mut TcpStream, path: &str, host: &str) {
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    let head = read_head(s);
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
}

/// Reads one server frame: (opcode, payload).
pub fn read_frame(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut h = [0u8; 2];
    s.read_exact(&mut h)?;
    let len = match h[1] & 0x7f {
        126 => {
            let mut l = [0u8; 2];
            s.read_exact(&mut l)?;
            u16::from_be_bytes(l) as usize
        }
        127 => {
            let mut l = [0u8; 8];
            s.read_exact(&mut l)?;
            u64::from_be_bytes(l) as usize
        }
        n => n as usize,
    };
    let mut p = vec![0; len];
    s.read_exact(&mut p)?;
    Ok((h[0] & 0x0f, p))
}
