//! What the generator reads of its target: its pid, its `/stats`, its memory and its CPU (and
//! its own), and the machine's kernel memory.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::Args;

/// The target's pid: `--pid`, else combd's `/stats`.
pub(crate) fn target_pid(a: &Args) -> Result<u64, String> {
    if let Some(pid) = a.pid {
        return Ok(pid);
    }
    let stats: serde_json::Value =
        serde_json::from_str(&local_get(a.port, "/stats")?).map_err(|e| format!("stats: {e}"))?;
    stats["pid"]
        .as_u64()
        .ok_or_else(|| "no --pid, and /stats has no pid".to_string())
}

/// `/stats` if the target is combd (a peer has none: `null`).
pub(crate) fn stats_or_null(a: &Args) -> serde_json::Value {
    local_get(a.port, "/stats")
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default()
}

/// A GET on the localhost listener (127.0.0.1): the body of the answer.
pub(crate) fn local_get(port: u16, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("stats: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    Ok(text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default())
}

/// The target's resident memory in bytes (`VmRSS` of `/proc/<pid>/status`).
pub(crate) fn rss_bytes(pid: u64) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// TCP memory in bytes from `/proc/net/sockstat` (`TCP: ... mem N`, in pages).
pub(crate) fn tcp_mem_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
    let page = 4096u64;
    text.lines()
        .find(|l| l.starts_with("TCP:"))
        .and_then(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.iter()
                .position(|x| *x == "mem")
                .and_then(|i| w.get(i + 1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * page)
}

/// Kernel slab memory in bytes from `/proc/meminfo` (`Slab:`), machine-wide: socket structs,
/// inodes and files live there, not in `sockstat`'s buffer pages.
pub(crate) fn slab_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("Slab:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// User and system CPU seconds of a process (`/proc/<pid>/stat`).
pub(crate) fn cpu_seconds(pid: u64) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the ")".
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    use nix::unistd::{sysconf, SysconfVar};
    let hz = sysconf(SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(1)
        .max(1) as f64;
    ticks as f64 / hz
}

/// The target's and the generator's CPU, in percent of a core, over a load's window: from
/// `start` to the first [`CpuWindow::tick`] at or after the load's end. A run that then waits
/// for late answers (up to 10 s when a refused click never echoes) would otherwise count that
/// idle wait as well, and understate both.
pub(crate) struct CpuWindow {
    pid: u64,
    t0: Instant,
    start: (f64, f64),
    end: Option<(f64, f64)>,
}

impl CpuWindow {
    pub(crate) fn start(pid: u64) -> Self {
        CpuWindow {
            pid,
            t0: Instant::now(),
            start: (cpu_seconds(pid), cpu_seconds(std::process::id() as u64)),
            end: None,
        }
    }

    /// Closes the window the first time it is called at or after `until`.
    pub(crate) fn tick(&mut self, until: Instant) {
        if self.end.is_none() && Instant::now() >= until {
            self.end = Some(self.now());
        }
    }

    /// (target, generator) percent over the window; to now if it was never closed.
    pub(crate) fn percents(&self) -> (f64, f64) {
        self.end.unwrap_or_else(|| self.now())
    }

    fn now(&self) -> (f64, f64) {
        let secs = self.t0.elapsed().as_secs_f64().max(1e-9);
        (
            (cpu_seconds(self.pid) - self.start.0) / secs * 100.0,
            (cpu_seconds(std::process::id() as u64) - self.start.1) / secs * 100.0,
        )
    }
}
