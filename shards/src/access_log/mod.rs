//! The access log (`COMBD_ACCESS_LOG`): one JSON line per HTTP request and per WebSocket
//! opened and closed, written off the event loop in bounded memory.
//!
//! - **On a shard**, a line is written ([`line`]) straight into the chunk the shard holds
//!   ([`ShardLog::record`]): no lock, no allocation, no system call. A full chunk (and, once a
//!   housekeeping tick, one that holds any line) is handed to the writer thread and the shard
//!   takes an empty one. Each shard owns
//!   [`ACCESS_LOG_CHUNKS_PER_SHARD`](limits::ACCESS_LOG_CHUNKS_PER_SHARD) chunks of
//!   [`ACCESS_LOG_CHUNK_BYTES`](limits::ACCESS_LOG_CHUNK_BYTES), reserved when the node starts:
//!   when none is free (the writer is behind: a stalled disk, a slow reader of stderr) the line
//!   is dropped and counted in `access_log_dropped`. A shard never waits for the log, and the
//!   log never holds more than its chunks.
//! - **The writer thread** ([`AccessLog::start`]) writes each chunk whole (one `write(2)` for
//!   a file opened with `O_APPEND`; line-aligned pieces a pipe takes whole for stderr) and
//!   gives it back to its shard. On SIGHUP ([`AccessLog::reopen`]) it writes what it has, then
//!   opens the file's path again: logrotate renames the file, signals, and the node writes to
//!   a new file at the path. It ends, having written every chunk handed over, at
//!   [`AccessLog::finish`].
//!
//! Off (the default), there is no [`AccessLog`]: a connection pays one branch on an `Option`
//! per request.

mod line;

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Instant;

use combd_kernel::limits;
use combd_kernel::settings::AccessLogSink;

use crate::stats::ShardStats;

pub(crate) use line::{request_line, Event, LogLine};

/// Where the lines go: standard error, or a file opened for append.
pub enum Sink {
    /// Standard error.
    Stderr,
    /// A file, and its path (to open it again on SIGHUP).
    File {
        /// Its path, as `COMBD_ACCESS_LOG` gave it.
        path: PathBuf,
        /// The file open now.
        file: File,
    },
}

impl Sink {
    /// Opens where `COMBD_ACCESS_LOG` says, at start-up: `None` when it is off. A file is
    /// opened for append and created with mode 0640 (the owner writes, its group reads: an
    /// access log names clients' addresses).
    pub fn open(setting: &AccessLogSink) -> io::Result<Option<Sink>> {
        Ok(match setting {
            AccessLogSink::Off => None,
            AccessLogSink::Stderr => Some(Sink::Stderr),
            AccessLogSink::File(path) => Some(Sink::File {
                file: open_append(path)?,
                path: path.clone(),
            }),
        })
    }

    /// Opens a file's path again (SIGHUP): `Ok(false)` for stderr, which has no path; on
    /// failure the file open now is kept.
    fn reopen(&mut self) -> io::Result<bool> {
        match self {
            Sink::File { path, file } => {
                *file = open_append(path)?;
                Ok(true)
            }
            Sink::Stderr => Ok(false),
        }
    }

    /// Writes a chunk of whole lines.
    fn write_chunk(&mut self, chunk: &[u8]) -> io::Result<()> {
        match self {
            Sink::File { file, .. } => file.write_all(chunk),
            Sink::Stderr => {
                let mut stderr = io::stderr();
                for piece in pieces(chunk, limits::ACCESS_LOG_STDERR_WRITE_BYTES) {
                    stderr.write_all(piece)?;
                }
                Ok(())
            }
        }
    }
}

fn open_append(path: &std::path::Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
}

/// `chunk` in pieces of at most `max` bytes, each ending at a line's end (a line is never
/// longer than `max`: see the relations in the limits).
fn pieces(chunk: &[u8], max: usize) -> impl Iterator<Item = &[u8]> {
    let mut rest = chunk;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let cut = if rest.len() <= max {
            rest.len()
        } else {
            rest[..max]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(max, |i| i + 1)
        };
        let (piece, after) = rest.split_at(cut);
        rest = after;
        Some(piece)
    })
}

/// One shard's chunks: those handed to the writer, and those written and free again.
struct Chunks {
    full: (
        async_channel::Sender<Vec<u8>>,
        async_channel::Receiver<Vec<u8>>,
    ),
    free: (
        async_channel::Sender<Vec<u8>>,
        async_channel::Receiver<Vec<u8>>,
    ),
}

/// The node's access log: every shard's chunks and the writer thread.
pub struct AccessLog {
    shards: Box<[Chunks]>,
    writer: OnceLock<Thread>,
    handle: Mutex<Option<JoinHandle<()>>>,
    reopen: AtomicBool,
    stop: AtomicBool,
    /// Writes that failed (`access_log_write_errors`): their lines are lost.
    pub write_errors: AtomicU64,
    /// Times SIGHUP opened the file again (`access_log_reopens`).
    pub reopens: AtomicU64,
    /// The most chunks one shard had waiting for the writer when it looked
    /// (`access_log_chunks_waiting_max`): at `ACCESS_LOG_CHUNKS_PER_SHARD` that shard was
    /// dropping lines.
    pub waiting_max: AtomicU64,
}

impl AccessLog {
    /// The chunks of `shards` shards, reserved now, and no writer.
    fn new(shards: usize) -> AccessLog {
        let n = limits::ACCESS_LOG_CHUNKS_PER_SHARD;
        let shards = (0..shards)
            .map(|_| {
                let chunks = Chunks {
                    full: async_channel::bounded(n),
                    free: async_channel::bounded(n),
                };
                for _ in 0..n {
                    let chunk = Vec::with_capacity(limits::ACCESS_LOG_CHUNK_BYTES);
                    // Room for every chunk: the channel holds as many as there are.
                    let _ = chunks.free.0.try_send(chunk);
                }
                chunks
            })
            .collect();
        AccessLog {
            shards,
            writer: OnceLock::new(),
            handle: Mutex::new(None),
            reopen: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            write_errors: AtomicU64::new(0),
            reopens: AtomicU64::new(0),
            waiting_max: AtomicU64::new(0),
        }
    }

    /// Reserves the chunks of `shards` shards and starts the writer thread, writing to `sink`.
    pub fn start(sink: Sink, shards: usize) -> io::Result<Arc<AccessLog>> {
        let log = Arc::new(AccessLog::new(shards));
        let for_writer = log.clone();
        let handle = std::thread::Builder::new()
            .name("combd-access-log".into())
            .spawn(move || for_writer.run_writer(sink))?;
        let _ = log.writer.set(handle.thread().clone());
        *log.handle.lock().unwrap_or_else(|p| p.into_inner()) = Some(handle);
        Ok(log)
    }

    /// Asks the writer to open the file again once it has written what it has (SIGHUP).
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Release);
        self.wake_writer();
    }

    /// Stops the writer once it has written every chunk handed to it, and waits for it. The
    /// shards hand over what they hold as they end: call it after they did.
    pub fn finish(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake_writer();
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }

    fn wake_writer(&self) {
        if let Some(t) = self.writer.get() {
            t.unpark();
        }
    }

    /// Chunks handed to the writer and not yet written, every shard together
    /// (`access_log_chunks_waiting`).
    pub fn waiting(&self) -> u64 {
        self.shards.iter().map(|c| c.full.1.len() as u64).sum()
    }

    /// Shard `id`'s end of the log.
    pub(crate) fn shard(self: &Arc<Self>, id: usize) -> ShardLog {
        ShardLog {
            log: self.clone(),
            id,
            chunk: RefCell::new(Vec::new()),
        }
    }

    /// Writes every chunk handed over so far with `write`, and gives each back to its shard.
    /// Returns how many it wrote; a write that fails is counted and its chunk given back all
    /// the same.
    fn write_queued(&self, write: &mut dyn FnMut(&[u8]) -> io::Result<()>) -> (usize, usize) {
        let (mut written, mut failed) = (0, 0);
        for chunks in self.shards.iter() {
            let waiting = chunks.full.1.len() as u64;
            self.waiting_max.fetch_max(waiting, Ordering::Relaxed);
            while let Ok(mut chunk) = chunks.full.1.try_recv() {
                match write(&chunk) {
                    Ok(()) => written += 1,
                    Err(_) => failed += 1,
                }
                chunk.clear();
                // Room for it: the channel holds as many chunks as the shard owns.
                let _ = chunks.free.0.try_send(chunk);
            }
        }
        self.write_errors
            .fetch_add(failed as u64, Ordering::Relaxed);
        (written, failed)
    }

    /// The writer thread: writes what the shards hand over, opens the file again when asked,
    /// and ends when stopped with nothing left.
    fn run_writer(&self, mut sink: Sink) {
        let mut last_warn: Option<Instant> = None;
        loop {
            // Read before the pass: what was handed over before the stop is written by it.
            let stopping = self.stop.load(Ordering::Acquire);
            let (written, failed) = self.write_queued(&mut |c| sink.write_chunk(c));
            let warn_due =
                last_warn.is_none_or(|t| t.elapsed() >= limits::ACCESS_LOG_ERROR_LOG_EVERY);
            if failed > 0 && warn_due {
                last_warn = Some(Instant::now());
                tracing::warn!(
                    failed_writes = self.write_errors.load(Ordering::Relaxed),
                    "cannot write the access log (its lines are lost)"
                );
            }
            if self.reopen.swap(false, Ordering::AcqRel) {
                match sink.reopen() {
                    Ok(false) => {}
                    Ok(true) => {
                        self.reopens.fetch_add(1, Ordering::Relaxed);
                        tracing::info!("SIGHUP: access log opened again");
                    }
                    Err(e) => {
                        tracing::error!("SIGHUP: keeping the access log open as it was: {e}")
                    }
                }
            }
            if stopping {
                return;
            }
            if written + failed == 0 {
                std::thread::park_timeout(limits::ACCESS_LOG_WRITER_WAIT);
            }
        }
    }
}

/// A shard's end of the access log: the chunk in its hand.
pub(crate) struct ShardLog {
    log: Arc<AccessLog>,
    id: usize,
    /// The chunk lines are written into; empty with no capacity when the shard holds none.
    chunk: RefCell<Vec<u8>>,
}

impl ShardLog {
    /// Writes one line with `write` (at most
    /// [`ACCESS_LOG_LINE_MAX_BYTES`](limits::ACCESS_LOG_LINE_MAX_BYTES)) into the chunk in
    /// hand, handing a full one over first; with no chunk free, the line is dropped. Counted
    /// either way.
    pub fn record(&self, stats: &ShardStats, write: impl FnOnce(&mut Vec<u8>)) {
        let mut chunk = self.chunk.borrow_mut();
        let room = chunk.capacity() >= limits::ACCESS_LOG_CHUNK_BYTES
            && chunk.len() + limits::ACCESS_LOG_LINE_MAX_BYTES <= limits::ACCESS_LOG_CHUNK_BYTES;
        if !room {
            self.hand_over_locked(&mut chunk);
            match self.log.shards[self.id].free.1.try_recv() {
                Ok(free) => *chunk = free,
                Err(_) => return ShardStats::add(&stats.access_log_dropped, 1),
            }
        }
        let before = chunk.len();
        write(&mut chunk);
        debug_assert!(chunk.len() - before <= limits::ACCESS_LOG_LINE_MAX_BYTES);
        ShardStats::add(&stats.access_log_lines, 1);
    }

    /// Hands the chunk in hand to the writer if it holds any line (the housekeeping tick, so
    /// that a line is written within a tick; the shard's end).
    pub fn hand_over(&self) {
        self.hand_over_locked(&mut self.chunk.borrow_mut());
    }

    fn hand_over_locked(&self, chunk: &mut Vec<u8>) {
        if chunk.is_empty() {
            return;
        }
        let full = std::mem::take(chunk);
        // Room for it: the channel holds as many chunks as the shard owns.
        let _ = self.log.shards[self.id].full.0.try_send(full);
        self.log.wake_writer();
    }
}

impl Drop for ShardLog {
    fn drop(&mut self) {
        self.hand_over();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn line(out: &mut Vec<u8>) {
        out.extend_from_slice(&[b'x'; 999]);
        out.push(b'\n');
    }

    fn figures(stats: &ShardStats) -> (u64, u64) {
        (
            stats.access_log_lines.load(Ordering::Relaxed),
            stats.access_log_dropped.load(Ordering::Relaxed),
        )
    }

    /// With the writer behind, a shard fills its chunks, then drops and counts every line
    /// (never growing, never waiting); once the writer catches up, lines are kept again, and
    /// every line kept is written once, whole.
    #[test]
    fn a_shard_drops_and_counts_when_its_chunks_are_all_waiting() {
        let log = Arc::new(AccessLog::new(2));
        let shard = log.shard(1);
        let stats = ShardStats::default();
        let per_chunk =
            (limits::ACCESS_LOG_CHUNK_BYTES - limits::ACCESS_LOG_LINE_MAX_BYTES) / 1000 + 1;
        let fits = per_chunk * limits::ACCESS_LOG_CHUNKS_PER_SHARD;
        for _ in 0..fits {
            shard.record(&stats, line);
        }
        assert_eq!(figures(&stats), (fits as u64, 0), "every chunk filled");
        shard.record(&stats, line);
        assert_eq!(figures(&stats), (fits as u64, 1), "the next line dropped");
        for _ in 0..10 {
            shard.record(&stats, line);
        }
        assert_eq!(figures(&stats), (fits as u64, 11));

        // The writer writes the chunks handed over (the last one as the first line was
        // dropped), and the shard keeps lines again.
        let mut out = Vec::new();
        let (written, failed) = log.write_queued(&mut |c| {
            out.extend_from_slice(c);
            Ok(())
        });
        assert_eq!((written, failed), (limits::ACCESS_LOG_CHUNKS_PER_SHARD, 0));
        let max = log.waiting_max.load(Ordering::Relaxed);
        assert_eq!(
            max,
            limits::ACCESS_LOG_CHUNKS_PER_SHARD as u64,
            "every chunk waited"
        );
        assert_eq!(log.waiting(), 0);
        shard.record(&stats, line);
        assert_eq!(figures(&stats), (fits as u64 + 1, 11));
        shard.hand_over();
        log.write_queued(&mut |c| {
            out.extend_from_slice(c);
            Ok(())
        });
        assert_eq!(out.len(), (fits + 1) * 1000, "every line kept was written");
        assert!(out
            .split(|&b| b == b'\n')
            .all(|l| l.is_empty() || l.len() == 999));
        // No chunk grew past its reservation.
        while let Ok(c) = log.shards[1].free.1.try_recv() {
            assert!(c.capacity() < 2 * limits::ACCESS_LOG_CHUNK_BYTES && c.is_empty());
        }
    }

    #[test]
    fn a_failed_write_is_counted_and_its_chunk_given_back() {
        let log = Arc::new(AccessLog::new(1));
        let shard = log.shard(0);
        let stats = ShardStats::default();
        shard.record(&stats, line);
        shard.hand_over();
        let (written, failed) = log.write_queued(&mut |_| Err(io::ErrorKind::StorageFull.into()));
        assert_eq!((written, failed), (0, 1));
        assert_eq!(log.write_errors.load(Ordering::Relaxed), 1);
        assert_eq!(
            log.shards[0].free.1.len(),
            limits::ACCESS_LOG_CHUNKS_PER_SHARD
        );
    }

    #[test]
    fn stderr_pieces_end_at_lines_and_fit_a_pipe_write() {
        let mut chunk = Vec::new();
        for i in 0..100 {
            chunk.extend_from_slice(&vec![b'a' + (i % 26) as u8; 100 + i * 7]);
            chunk.push(b'\n');
        }
        let pieces: Vec<&[u8]> = pieces(&chunk, 4096).collect();
        assert!(pieces.len() > 1);
        assert_eq!(pieces.concat(), chunk);
        for p in pieces {
            assert!(p.len() <= 4096 && p.ends_with(b"\n"));
        }
    }

    /// The writer thread writes a shard's lines to a file, opens the path again on reopen (a
    /// renamed file keeps what it had), and writes everything handed over before it finishes.
    #[test]
    fn the_writer_writes_reopens_and_finishes() {
        let dir = std::env::temp_dir().join(format!("combd-access-log-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("access.log");
        let sink = Sink::open(&AccessLogSink::File(path.clone()))
            .unwrap()
            .unwrap();
        let log = AccessLog::start(sink, 1).unwrap();
        let shard = log.shard(0);
        let stats = ShardStats::default();
        shard.record(&stats, |o| o.extend_from_slice(b"one\n"));
        shard.hand_over();
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read(&path).unwrap() != b"one\n" {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the first line"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::fs::rename(&path, dir.join("access.log.1")).unwrap();
        log.reopen();
        while !path.exists() {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the reopen"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        shard.record(&stats, |o| o.extend_from_slice(b"two\n"));
        drop(shard);
        log.finish();
        assert_eq!(std::fs::read(&path).unwrap(), b"two\n");
        assert_eq!(std::fs::read(dir.join("access.log.1")).unwrap(), b"one\n");
        assert_eq!(log.reopens.load(Ordering::Relaxed), 1);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777 & !0o640, 0, "{mode:o}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
