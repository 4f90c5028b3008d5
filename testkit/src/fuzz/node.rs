//! The node under test of the fuzz targets that play scripts against a real node
//! ([`super::conn`], [`super::host`]): a node binary (`combd-test-node` for `http_conn`, which
//! uses the test apps) started once through [`crate::launch`] in its own temporary directory,
//! on 127.0.0.2 with one shard, with the settings the harness gives and no other `COMBD_*` of
//! the environment; its `/stats`, its memory, and (when kept) its log.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use serde_json::Value;

pub use crate::launch::WAIT;
use crate::launch::{self, Launched, Stderr};

/// A running node.
pub struct Node {
    node: Launched,
    /// Its port, on 127.0.0.2 (public) and 127.0.0.1 (localhost).
    pub port: u16,
    /// Its own directory: `data/` is `COMBD_DATA`, beside what the harness puts there.
    pub dir: PathBuf,
}

/// How the node is started.
pub struct Start<'a> {
    /// Its own directory ([`Node::fresh_dir`]).
    pub dir: PathBuf,
    /// Settings beside `COMBD_LISTEN`, `COMBD_DATA`, `COMBD_SHARDS` and `COMBD_LOG`.
    pub env: Vec<(&'a str, OsString)>,
    /// `COMBD_LOG`, and whether its stderr is read by the harness (else inherited).
    pub log: (&'a str, bool),
    /// Its working directory (by default the harness's).
    pub cwd: Option<PathBuf>,
}

impl Node {
    /// A new empty directory for a node, `combd-fuzz-<tag>-<pid>-<n>` under the temporary
    /// directory: one per node, as two in one process (the tests run in parallel) would
    /// share the node's lock, and the second node would refuse to start.
    pub fn fresh_dir(tag: &str) -> PathBuf {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("combd-fuzz-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("make the node's directory");
        dir
    }

    /// Starts `bin` (a built `combd` or `combd-test-node`) and waits for its ready line; it
    /// dies with the thread that started it. Panics if it does not start.
    pub fn start(bin: &Path, how: Start<'_>) -> Node {
        let dir = how.dir;
        let mut cmd = launch::command(bin, &dir.join("data"), how.log.0);
        cmd.env("COMBD_SHARDS", "1").envs(how.env);
        if let Some(cwd) = how.cwd {
            cmd.current_dir(cwd);
        }
        let stderr = if how.log.1 {
            Stderr::Kept
        } else {
            Stderr::Inherit
        };
        let node = launch::start(cmd, stderr, true);
        Node {
            port: node.port,
            node,
            dir,
        }
    }

    /// The public address.
    pub fn public(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 2], self.port))
    }

    /// `COMBD_DATA`.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The node's process id.
    pub fn pid(&self) -> u32 {
        self.node.child.id()
    }

    /// How the node exited, if it has.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.node.child.try_wait().ok().flatten()
    }

    /// The log lines since the last call (the last 200), and those saying a thread panicked.
    /// Empty if the log is not kept.
    pub fn take_log(&self) -> (Vec<String>, Vec<String>) {
        self.node.take_log()
    }

    /// The node's `/stats` (from the localhost listener).
    pub fn stats(&self) -> Value {
        let mut s =
            TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], self.port)), WAIT)
                .expect("connect to the localhost listener");
        s.set_read_timeout(Some(WAIT)).expect("read timeout");
        s.write_all(b"GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("ask for /stats");
        let mut got = Vec::new();
        s.read_to_end(&mut got)
            .expect("timed out waiting for /stats");
        let at = got
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        assert!(got.starts_with(b"HTTP/1.1 200"), "/stats answered {got:?}");
        serde_json::from_slice(&got[at + 4..]).expect("/stats is JSON")
    }

    /// A figure of the node's `/proc/<pid>/status`, in bytes (`VmRSS`, `VmHWM`).
    pub fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.node.child.id()))
            .expect("the node's /proc/<pid>/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {field} in the node's status"))
            * 1024
    }

    /// The node's resident memory, in bytes.
    pub fn rss(&self) -> u64 {
        self.status_bytes("VmRSS")
    }

    /// Starts the node's resident peak (`VmHWM`) again from what it holds now, and answers
    /// that (`/proc/<pid>/clear_refs` 5). Panics where the kernel does not allow it.
    pub fn reset_peak(&self) -> u64 {
        std::fs::write(format!("/proc/{}/clear_refs", self.node.child.id()), "5")
            .expect("reset the node's peak resident memory (/proc/<pid>/clear_refs)");
        self.rss()
    }

    /// Sends the node a signal (its pid is this handle's child, not reaped yet).
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.node.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, sig);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.node.child.kill();
        let _ = self.node.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
