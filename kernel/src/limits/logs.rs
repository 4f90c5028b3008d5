//! The bounds of what the node logs: the access log's queue and lines, and the rate of the
//! warnings about apps' failed calls.

use std::time::Duration;

/// One chunk of access-log lines, in bytes: a shard appends its lines to the chunk in hand
/// and hands it to the writer thread whole (when it is full, and once a housekeeping tick),
/// which writes it with one `write(2)`. 64 KiB holds about 400 lines, so the writer makes one
/// system call for hundreds of requests; the chunks are reserved at start-up, only when the log
/// is on, and never grow.
pub const ACCESS_LOG_CHUNK_BYTES: usize = 64 * 1024;
/// Chunks each shard owns: one in its hand, the others waiting for the writer or written and
/// waiting to be filled again. When none is free the shard drops its line and counts it
/// (`access_log_dropped`): the log never blocks a shard and never grows. Eight (512 KiB a
/// shard) hold about 3,000 lines while the writer is busy: at 100,000 requests a second on a
/// shard that is 30 ms of a stalled disk or a slow reader of stderr before lines are dropped.
pub const ACCESS_LOG_CHUNKS_PER_SHARD: usize = 8;
/// What the access log holds per shard at most, in bytes: its chunks (reserved at start-up).
pub const ACCESS_LOG_SHARD_BYTES: usize = ACCESS_LOG_CHUNK_BYTES * ACCESS_LOG_CHUNKS_PER_SHARD;
/// The longest access-log line, in bytes: a line is written into a chunk only if this much is
/// free in it, so no line can make a chunk grow. The method and the path are cut to their
/// bounds below (at most six bytes each once escaped), and every other field is a number, an
/// address or a fixed word: 6 × (16 + 256) + 512 = 2,144 bytes at most (asserted in `mod.rs`).
pub const ACCESS_LOG_LINE_MAX_BYTES: usize = 2560;
/// The bytes of a request's method the access log keeps (methods are short tokens; a longer
/// one is cut here).
pub const ACCESS_LOG_METHOD_MAX_BYTES: usize = 16;
/// The bytes of a request's path the access log keeps: enough for every route of the node
/// (`/o/<app>/<64-byte name>`) and most pages; a longer path is cut here, so that a client
/// sending 8 KiB targets cannot make each line 8 KiB.
pub const ACCESS_LOG_PATH_MAX_BYTES: usize = 256;
/// The fields of a line other than the method and the path, at their longest (a timestamp,
/// an IPv6 address with its scope and port, seven 20-digit numbers, the field names).
pub const ACCESS_LOG_FIELDS_MAX_BYTES: usize = 512;
/// Access-log lines go to standard error in writes of at most this many bytes, each ending at
/// a line's end: a pipe (systemd's journal) takes a write of up to `PIPE_BUF` (4,096 on Linux)
/// whole, so the node's own log lines never land inside an access-log line.
pub const ACCESS_LOG_STDERR_WRITE_BYTES: usize = 4096;
/// The writer thread's longest sleep: each chunk handed over wakes it, as do SIGHUP's reopen
/// and the node's stop; this only bounds a sleep nothing cut short.
pub const ACCESS_LOG_WRITER_WAIT: Duration = Duration::from_secs(1);
/// A failing access-log write (a full disk, a closed stderr) is logged at most once in this
/// long; every failed write is counted (`access_log_write_errors`).
pub const ACCESS_LOG_ERROR_LOG_EVERY: Duration = Duration::from_secs(10);

/// The window of the warnings about apps' failed calls: a shard logs at most
/// [`APP_ERROR_LOGS_PER_WINDOW`] in each, then says how many it did not.
pub const APP_ERROR_LOG_WINDOW: Duration = Duration::from_secs(1);
/// Warnings about apps' failed calls (a trap, a SQL error, a limit: a 5xx or a limit's answer)
/// one shard logs a window; the rest are counted (`app_errors_log_suppressed`) and summed up in
/// one line once the window is over. A module failing every request at 10,000 a second would
/// otherwise write 10,000 lines a second from the shard's loop; ten show what fails and where,
/// and the count says how often.
pub const APP_ERROR_LOGS_PER_WINDOW: u32 = 10;
/// The bytes of a failed call's detail (a trap's message, the last SQL error) a warning shows:
/// a module's own text (a table's name in a SQL error) cannot make the line long.
pub const APP_ERROR_DETAIL_MAX_BYTES: usize = 512;
