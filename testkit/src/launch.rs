//! The one way a node under test is started, for the integration tests (`tests/support`'s
//! `TestNode` and `start_captured`) and the fuzz harness ([`crate::fuzz::node`]) alike: a
//! built node binary (`combd` or `combd-test-node`) with a data directory of the caller's, on
//! 127.0.0.2 (port 0: the kernel picks one), with no `COMBD_*` of the caller's environment but
//! those the caller sets; then its ready line waited for, its stdout read to the end, and its
//! stderr where the caller says (inherited, a file, kept with its panics, or line by line).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How long any one wait on the node may take.
pub const WAIT: Duration = Duration::from_secs(10);
/// Lines of a kept log held for a failure's message.
const LOG_KEPT_LINES: usize = 200;

/// `bin` set up as every node under test runs: public listener on `127.0.0.2:0`, data in
/// `data`, logging at `log`, and no `COMBD_*` variable of this process's environment (the
/// node refuses a `COMBD_` name it does not know, such as a harness's own `COMBD_BIN` or
/// `COMBD_SCREENSHOTS`, and one it knows would change what the test runs). The caller adds
/// its settings on top.
pub fn command(bin: &Path, data: &Path, log: &str) -> Command {
    let mut cmd = Command::new(bin);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("COMBD_") {
            cmd.env_remove(name);
        }
    }
    cmd.env("COMBD_LISTEN", "127.0.0.2:0")
        .env("COMBD_DATA", data)
        .env("COMBD_LOG", log);
    cmd
}

/// Where a started node's stderr goes.
pub enum Stderr {
    /// Where this process's goes.
    Inherit,
    /// Where the caller says (a file, nowhere).
    To(Stdio),
    /// Read here: the last lines kept, and those saying a thread panicked
    /// ([`Launched::take_log`]).
    Kept,
    /// Read here line by line, onto [`Launched::err`].
    Lines,
}

/// What a kept stderr held.
#[derive(Default)]
struct Log {
    /// Lines written since the last [`Launched::take_log`], the last [`LOG_KEPT_LINES`].
    lines: Vec<String>,
    /// Lines saying a thread panicked since the last take (caught or not).
    panics: Vec<String>,
}

/// A node started and ready.
pub struct Launched {
    /// The node's process (not reaped: the caller kills and waits for it).
    pub child: Child,
    /// Its localhost port (127.0.0.1), the same as its public one (127.0.0.2).
    pub port: u16,
    /// Its TLS port, when TLS is on.
    pub tls_port: Option<u16>,
    /// The lines of its stdout after the ready line.
    pub out: mpsc::Receiver<String>,
    /// The lines of its stderr, with [`Stderr::Lines`].
    pub err: Option<mpsc::Receiver<String>>,
    log: Option<Arc<Mutex<Log>>>,
}

/// Spawns `cmd` (made by [`command`]) with its stdin empty and stderr as `stderr` says, and
/// waits for its ready line (`combd ready: … local=127.0.0.1:<port> …`). With
/// `die_with_parent`, the node is killed when the thread that started it ends (a fuzzer that
/// stops at a crash leaves no node behind). Panics if it does not start within [`WAIT`].
pub fn start(mut cmd: Command, stderr: Stderr, die_with_parent: bool) -> Launched {
    let (stdio, kept, lines) = match stderr {
        Stderr::Inherit => (Stdio::inherit(), false, false),
        Stderr::To(to) => (to, false, false),
        Stderr::Kept => (Stdio::piped(), true, false),
        Stderr::Lines => (Stdio::piped(), false, true),
    };
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stdio);
    if die_with_parent {
        die_with_parent_thread(&mut cmd);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
    let log = kept.then(|| keep_log(child.stderr.take().expect("the node's stderr")));
    let err = lines.then(|| read_lines(child.stderr.take().expect("the node's stderr")));
    let out = read_lines(child.stdout.take().expect("the node's stdout"));
    let line = wait_ready(&out);
    Launched {
        child,
        port: ready_port(&line),
        tls_port: line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("tls="))
            .and_then(|a| a.rsplit_once(':'))
            .and_then(|(_, p)| p.parse().ok()),
        out,
        err,
        log,
    }
}

impl Launched {
    /// The log lines since the last call (the last 200), and those saying a thread panicked.
    /// Empty unless the log is [`Stderr::Kept`].
    pub fn take_log(&self) -> (Vec<String>, Vec<String>) {
        match &self.log {
            Some(log) => {
                let mut l = log.lock().unwrap_or_else(|p| p.into_inner());
                (std::mem::take(&mut l.lines), std::mem::take(&mut l.panics))
            }
            None => (Vec::new(), Vec::new()),
        }
    }
}

/// The localhost port a node's ready line names (`combd ready: … local=127.0.0.1:<port> …`).
pub fn ready_port(line: &str) -> u16 {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("local=127.0.0.1:"))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected ready line {line:?}"))
}

/// Waits for the line of `out` that says the node is ready, within [`WAIT`].
fn wait_ready(out: &mpsc::Receiver<String>) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match out.recv_timeout(left) {
            Ok(line) if line.starts_with("combd ready") => return line,
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("timed out waiting for the node's ready line")
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("the node closed its stdout (it exited) before its ready line")
            }
        }
    }
}

/// Every line `r` gives, on a channel, read by a thread to the end (a reader that went away
/// does not stop it: the node never finds its output closed).
fn read_lines(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    rx
}

/// Reads `stderr` to the end, keeping its last lines and those saying a thread panicked.
fn keep_log(stderr: impl Read + Send + 'static) -> Arc<Mutex<Log>> {
    let log = Arc::new(Mutex::new(Log::default()));
    let to = log.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            let mut l = to.lock().unwrap_or_else(|p| p.into_inner());
            if line.contains("panicked at") {
                l.panics.push(line.clone());
            }
            if l.lines.len() >= LOG_KEPT_LINES {
                l.lines.remove(0);
            }
            l.lines.push(line);
        }
    });
    log
}

/// Has the child killed (SIGKILL) when the thread that spawned it ends.
fn die_with_parent_thread(cmd: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe calls are sound: it makes one prctl system call (nix's wrapper
    // neither allocates nor locks) and touches no state of the parent's.
    #[allow(unsafe_code)]
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(cmd, || {
            let _ = nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL);
            Ok(())
        });
    }
}
