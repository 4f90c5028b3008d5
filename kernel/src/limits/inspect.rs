//! The bounds of the operator's look into objects on the localhost listener (`/objects`,
//! `combd objects`): a listing's page, and the read-only SQL query's rows, time and answer; and
//! of the sweep that deletes the objects their app lets expire.

use std::time::Duration;

/// Objects a listing's page holds unless it asks for fewer (`?limit=`).
pub const OBJECT_LIST_PAGE: usize = 100;

/// Most objects a listing's page may hold (`?limit=` past it is a 400): each is a read of its
/// files and a look into its database on a blocking thread.
pub const OBJECT_LIST_PAGE_MAX: usize = 1_000;

/// Most rows a read-only query answers: past it the answer stops and says `"truncated": true`.
pub const OBJECT_SQL_ROWS_MAX: usize = 1_000;

/// Longest a read-only query may run: past it SQLite interrupts it and the answer is 408
/// (`query time limit`). It runs on its own read-only connection beside the object's writer,
/// which it never blocks (WAL); the bound keeps it from holding a blocking thread, and the
/// WAL from being checkpointed past it, for long.
pub const OBJECT_SQL_TIME_LIMIT: Duration = Duration::from_secs(1);

/// Largest answer of a read-only query, in bytes of its values: past it the answer stops and
/// says `"truncated": true`.
pub const OBJECT_SQL_ANSWER_MAX_BYTES: usize = 1024 * 1024;

/// Objects one sweep of the node's expiries deletes at most (each an open, a check and a
/// delete, one after the other on shard 0): past it the next sweep goes on.
pub const OBJECT_EXPIRY_PER_SWEEP: usize = 100;

/// Longest wait between two sweeps of the node's expiries; an app whose expiry is shorter than
/// ten of these is swept every tenth of its expiry (at most once a second).
pub const OBJECT_EXPIRY_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
