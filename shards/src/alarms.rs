//! Durable alarms: an object asks to be called at a time (`Cx::set_alarm`), and is, exactly
//! once per alarm, across crashes and restarts.
//!
//! **Where an alarm lives.** In its object's own database, table `_combd_alarms` (an app's SQL
//! cannot touch a `_combd_` table: the sandbox denies it; and the node prepares its own
//! statements on an object's connection afresh, never from the connection's statement cache,
//! where a module's text could find one the authorizer passed for the node), written in the
//! call's transaction:
//! a call that rolls back sets nothing, and a cancel is as durable as the call.
//!
//! **How the node knows what is due without opening every object.** The node keeps an index
//! ([`AlarmIndex`]): for each object with alarms, the earliest time one may be due (`next_ms`)
//! and how many it had. The index may say an object is due when it is not (then waking the
//! object finds nothing due, and the entry is corrected), never the other way round:
//! - a call that sets an alarm lowers the object's `next_ms` to it in the index, durably,
//!   *before* the call commits (so once the alarm is in the object's database, the index knows);
//! - the index's entry moves later (or goes) only once what made it so is durable: after a wake's
//!   batch was synced, from what the object says remains.
//!
//! **One index a shard.** The index is a file a shard, `<COMBD_DATA>/alarms-<shard>.sqlite`,
//! holding the objects whose home is that shard (`crate::home::home_shard`, where the object
//! runs), each behind its own lock: the lock is taken by that shard's blocking threads (and, in
//! a fleet, by the once-a-second sweep that takes up a dead owner's objects), so a client
//! setting alarms on one shard's objects never holds up another shard's commits. A start with
//! another shard count moves each entry to its new home's file (synced there before it leaves
//! the old one: a crash between leaves it in both, early at worst); the single
//! `alarms.sqlite` of earlier versions is read into the shards' files the same way, then
//! removed.
//!
//! **What a lower costs.** A lower that does not lower anything (the object's entry is due at
//! or before the new alarm already: the common case of an object that sets alarms later than
//! its earliest) only moves the entry's count and number, unsynced. That is safe because the
//! index's file is written in WAL mode with `synchronous=NORMAL` and its only synced writes
//! are lowers: what a power cut can lose is a suffix of the unsynced commits after the last
//! synced one, all of which only move entries later (a wake's settle, a postpone) or renumber
//! them, so the entry comes back due as early or earlier than the one this lower saw. A lower
//! that does lower an entry (or makes one) is synced, grouped: it is queued, and the first of
//! the shard's threads to hold the index's lock writes every lower queued by then in one
//! transaction with one sync (`synchronous=FULL` for that commit), and tells each its outcome;
//! so while one sync is in flight the shard's other batches' lowers gather for the next, as
//! the objects' WAL syncs do (`crate::cells` `commit`). `alarm_index_syncs` counts a shard's
//! synced commits.
//!
//! **In a fleet** the node's index covers the objects this node owns; the fleet keeps one more,
//! in etcd (`combd_fleet::coordinator`, `wakes`): each owner records, with every head it ships
//! and in the head's fenced transaction, when the object next has something due as of that head
//! (read after each batch that set an alarm, queued a message or ran the node's inputs). The
//! keys outlive the owner's lease; each node sweeps them for objects due without an owner and
//! takes those up into its own index (`crate::fleet` `wakes`), so a dead owner's alarms fire
//! on the node that claims the object.
//!
//! **Firing.** Each shard's housekeeping tick (100 ms), and a timer for the earliest entry due
//! before the next tick (`crate::cells` `alarm_wakes`, at least
//! [`ALARM_READ_GAP_MS`](combd_kernel::limits::ALARM_READ_GAP_MS) after the last read), read
//! from the index the objects of its own that are due ([`ALARM_WAKES_PER_TICK`](combd_kernel::limits::ALARM_WAKES_PER_TICK) at
//! most), and sends each a wake through its mailbox, like any input (the object is restored
//! first if it is closed, within `COMBD_RESTORES_AT_ONCE`). The object's batch takes the
//! alarms due (up to [`ALARMS_PER_WAKE`](combd_kernel::limits::ALARMS_PER_WAKE)), each in its
//! own transaction: the alarm's row is deleted in the transaction that runs its handler
//! (`Input::Alarm`), so a crash before the commit fires it again and one after does not. A
//! handler that fails is rolled back with its alarm, which is tried again after a backoff
//! ([`ALARM_RETRY_MIN_MS`](combd_kernel::limits::ALARM_RETRY_MIN_MS) doubling to
//! [`ALARM_RETRY_MAX_MS`](combd_kernel::limits::ALARM_RETRY_MAX_MS)).

use combd_kernel::limits::{ALARM_RETRY_MAX_MS, ALARM_RETRY_MIN_MS};

mod index;
pub use index::{shard_path, AlarmIndex, Wake};

/// The SQL that makes an object's alarm table (run by the node, in the call's transaction,
/// the first time the object sets one).
pub(crate) const TABLE: &str = "CREATE TABLE IF NOT EXISTS _combd_alarms (\
     id INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL, payload BLOB NOT NULL, \
     set_ms INTEGER NOT NULL, tries INTEGER NOT NULL DEFAULT 0); \
     CREATE INDEX IF NOT EXISTS _combd_alarms_at ON _combd_alarms (at_ms, id);";

/// The SQL that makes an object's outbox (messages to other objects, `Cx::send_to_object`)
/// and its inbox (for each sender, the last message it took), run by the node.
pub(crate) const OUTBOX: &str = "CREATE TABLE IF NOT EXISTS _combd_outbox (\
     id INTEGER PRIMARY KEY AUTOINCREMENT, app TEXT NOT NULL, name TEXT NOT NULL, \
     body BLOB NOT NULL, next_ms INTEGER NOT NULL, tries INTEGER NOT NULL DEFAULT 0); \
     CREATE INDEX IF NOT EXISTS _combd_outbox_to ON _combd_outbox (app, name, id);";

/// Makes the object's outbox if it has none ([`OUTBOX`]), numbering its messages from the time
/// in nanoseconds: a receiver takes each sender's messages once by their ids (its inbox keeps
/// the last), so a new object of a deleted one's name must number past every message the old
/// one sent (counted from 1, a receiver would take its first messages for ones it had).
pub(crate) fn open_outbox(db: &rusqlite::Connection) -> rusqlite::Result<()> {
    db.execute_batch(OUTBOX)?;
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos().min(i64::MAX as u128 / 2) as i64);
    db.prepare(
        "INSERT INTO sqlite_sequence (name, seq) SELECT '_combd_outbox', ?1
           WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = '_combd_outbox')",
    )?
    .execute([now_ns])
    .map(|_| ())
}

/// The SQL that makes an object's inbox: for each sender, the last of its messages taken.
pub(crate) const INBOX: &str = "CREATE TABLE IF NOT EXISTS _combd_inbox (\
     app TEXT NOT NULL, name TEXT NOT NULL, last_id INTEGER NOT NULL, PRIMARY KEY (app, name)) \
     WITHOUT ROWID;";

/// Whether the object's database has table `name`.
pub(crate) fn has(db: &rusqlite::Connection, name: &str) -> rusqlite::Result<bool> {
    db.prepare("SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1)")?
        .query_row([name], |r| r.get(0))
}

/// A message at the head of the outbox for its receiver (messages go out one at a time per
/// receiver, in order), due to be sent.
#[derive(Debug, Clone)]
pub(crate) struct OutboxHead {
    pub id: i64,
    pub app: String,
    pub name: String,
    pub body: Vec<u8>,
    pub tries: u32,
}

/// The outbox's heads due at `now` (at most `limit`).
pub(crate) fn heads(
    db: &rusqlite::Connection,
    now: u64,
    limit: usize,
) -> rusqlite::Result<Vec<OutboxHead>> {
    if !has(db, "_combd_outbox")? {
        return Ok(Vec::new());
    }
    let mut stmt = db.prepare(
        "SELECT id, app, name, body, tries FROM _combd_outbox WHERE next_ms <= ?1
           AND id IN (SELECT min(id) FROM _combd_outbox GROUP BY app, name) ORDER BY id LIMIT ?2",
    )?;
    let rows = stmt.query_map([now as i64, limit as i64], |r| {
        Ok(OutboxHead {
            id: r.get(0)?,
            app: r.get(1)?,
            name: r.get(2)?,
            body: r.get(3)?,
            tries: r.get::<_, i64>(4)?.clamp(0, 64) as u32,
        })
    })?;
    rows.collect()
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Whether the object's database has an alarm table.
pub(crate) fn has_table(db: &rusqlite::Connection) -> rusqlite::Result<bool> {
    has(db, "_combd_alarms")
}

/// When the object next has something for the node to do, and how many things: its earliest
/// alarm, or the earliest time a message at the head of its outbox is to be sent (again);
/// its alarms and undelivered messages (`None`, 0 without any).
pub(crate) fn remaining(db: &rusqlite::Connection) -> rusqlite::Result<(Option<u64>, u64)> {
    let mut next: Option<u64> = None;
    let mut count = 0;
    let ms = |v: Option<i64>| v.map(|v| v.max(0) as u64);
    if has_table(db)? {
        let (at, n) = db
            .prepare("SELECT min(at_ms), count(*) FROM _combd_alarms")?
            .query_row([], |r| Ok((ms(r.get(0)?), r.get::<_, i64>(1)? as u64)))?;
        next = at;
        count += n;
    }
    if has(db, "_combd_outbox")? {
        let (at, n) = db
            .prepare(
                "SELECT (SELECT min(next_ms) FROM _combd_outbox
                   WHERE id IN (SELECT min(id) FROM _combd_outbox GROUP BY app, name)),
                 (SELECT count(*) FROM _combd_outbox)",
            )?
            .query_row([], |r| Ok((ms(r.get(0)?), r.get::<_, i64>(1)? as u64)))?;
        next = match (next, at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        count += n;
    }
    Ok((next, count))
}

/// One alarm due, as the object's batch takes it.
#[derive(Debug, Clone)]
pub(crate) struct Due {
    pub id: i64,
    pub at_ms: u64,
    pub payload: Vec<u8>,
    pub tries: u32,
}

/// The alarms of the object due at `now` (at most `limit`, earliest first).
pub(crate) fn due(db: &rusqlite::Connection, now: u64, limit: usize) -> rusqlite::Result<Vec<Due>> {
    if !has_table(db)? {
        return Ok(Vec::new());
    }
    let mut stmt = db.prepare(
        "SELECT id, at_ms, payload, tries FROM _combd_alarms WHERE at_ms <= ?1 ORDER BY at_ms, id LIMIT ?2",
    )?;
    let rows = stmt.query_map([now as i64, limit as i64], |r| {
        Ok(Due {
            id: r.get(0)?,
            at_ms: r.get::<_, i64>(1)?.max(0) as u64,
            payload: r.get(2)?,
            tries: r.get::<_, i64>(3)?.clamp(0, 64) as u32,
        })
    })?;
    rows.collect()
}

/// When a failed alarm is tried again: its `tries`-th failure at `now`.
pub(crate) fn retry_at(now: u64, tries: u32) -> u64 {
    let wait = ALARM_RETRY_MIN_MS
        .saturating_mul(1u64 << tries.min(16))
        .min(ALARM_RETRY_MAX_MS);
    now + wait
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod remaining_tests {
    #[test]
    fn remaining_counts_alarms_and_outbox_heads() {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        let tx = db.unchecked_transaction().unwrap();
        tx.execute_batch(super::OUTBOX).unwrap();
        tx.execute(
            "INSERT INTO _combd_outbox (app, name, body, next_ms) VALUES ('a', 'b', x'00', 50)",
            [],
        )
        .unwrap();
        assert_eq!(super::remaining(&tx).unwrap(), (Some(50), 1));
    }
}

#[cfg(test)]
mod retry_tests {
    #[test]
    fn retries_back_off_to_a_minute() {
        assert_eq!(super::retry_at(0, 0), 1_000);
        assert_eq!(super::retry_at(0, 1), 2_000);
        assert_eq!(super::retry_at(0, 10), 60_000);
        assert_eq!(super::retry_at(0, 64), 60_000);
    }
}
