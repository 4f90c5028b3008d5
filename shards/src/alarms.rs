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
//! **How the node knows what is due without opening every object.** The node keeps an index,
//! `<COMBD_DATA>/alarms.sqlite` ([`AlarmIndex`]): for each object with alarms, the earliest time
//! one may be due (`next_ms`) and how many it had. The index may say an object is due when it
//! is not (then waking the object finds nothing due, and the entry is corrected), never the
//! other way round:
//! - a call that sets an alarm lowers the object's `next_ms` to it in the index, synced,
//!   *before* the call commits (so once the alarm is in the object's database, the index knows);
//! - the index's entry moves later (or goes) only once what made it so is durable: after a wake's
//!   batch was synced, from what the object says remains.
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

use std::path::Path;
use std::sync::Mutex;

use combd_kernel::limits::{ALARM_RETRY_MAX_MS, ALARM_RETRY_MIN_MS};
use rusqlite::OptionalExtension;

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
pub(crate) struct Head {
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
) -> rusqlite::Result<Vec<Head>> {
    if !has(db, "_combd_outbox")? {
        return Ok(Vec::new());
    }
    let mut stmt = db.prepare(
        "SELECT id, app, name, body, tries FROM _combd_outbox WHERE next_ms <= ?1
           AND id IN (SELECT min(id) FROM _combd_outbox GROUP BY app, name) ORDER BY id LIMIT ?2",
    )?;
    let rows = stmt.query_map([now as i64, limit as i64], |r| {
        Ok(Head {
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

/// The node's index of objects with alarms (see the module's notes).
///
/// Each entry carries the sequence number of the last call that lowered it. A wake takes a
/// number ([`AlarmIndex::mark`]) when it reads what its object has left; its answer settles
/// the entry only if no call lowered it since ([`AlarmIndex::settle`]): the answer of a wake
/// comes once its batch is durable, which may be after a later batch set an alarm or queued
/// a message, and must not undo what that batch told the index.
pub struct AlarmIndex {
    db: Mutex<rusqlite::Connection>,
    seq: std::sync::atomic::AtomicU64,
}

/// An object the index says may have an alarm due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wake {
    /// The object's app.
    pub app: String,
    /// The object's name.
    pub name: String,
    /// When its earliest alarm may be due, in milliseconds since the Unix epoch.
    pub next_ms: u64,
}

impl AlarmIndex {
    /// Opens (or creates) the index at `path`; `shards` is the node's shard count now (an
    /// index written by a node with another count has each object's shard computed again).
    pub fn open(path: &Path, shards: usize) -> Result<AlarmIndex, String> {
        let db =
            rusqlite::Connection::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let setup = || -> rusqlite::Result<()> {
            db.execute_batch(
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA busy_timeout=5000;
                 CREATE TABLE IF NOT EXISTS alarm_index (app TEXT NOT NULL, name TEXT NOT NULL,
                   shard INTEGER NOT NULL, next_ms INTEGER NOT NULL, count INTEGER NOT NULL,
                   seq INTEGER NOT NULL, PRIMARY KEY (app, name)) WITHOUT ROWID;
                 CREATE INDEX IF NOT EXISTS alarm_index_due ON alarm_index (shard, next_ms);
                 CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);",
            )?;
            let was: Option<i64> = db
                .query_row("SELECT v FROM meta WHERE k = 'shards'", [], |r| r.get(0))
                .ok();
            if was != Some(shards as i64) {
                let rows: Vec<(String, String)> = db
                    .prepare("SELECT app, name FROM alarm_index")?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                let tx = db.unchecked_transaction()?;
                for (app, name) in rows {
                    tx.execute(
                        "UPDATE alarm_index SET shard = ?3 WHERE app = ?1 AND name = ?2",
                        rusqlite::params![
                            app,
                            name,
                            crate::app::home_shard(&app, &name, shards) as i64
                        ],
                    )?;
                }
                tx.execute(
                    "INSERT OR REPLACE INTO meta (k, v) VALUES ('shards', ?1)",
                    [shards as i64],
                )?;
                tx.commit()?;
            }
            Ok(())
        };
        setup().map_err(|e| format!("{}: {e}", path.display()))?;
        // Numbers go on from the last life's: an entry it lowered stays newer than a wake's
        // mark only if the mark is taken after it.
        let last: i64 = db
            .query_row("SELECT COALESCE(max(seq), 0) FROM alarm_index", [], |r| {
                r.get(0)
            })
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(AlarmIndex {
            db: Mutex::new(db),
            seq: std::sync::atomic::AtomicU64::new(last.max(0) as u64 + 1),
        })
    }

    /// A number later than every lower so far: a wake takes one when it reads what its object
    /// has left, and settles with it.
    pub fn mark(&self) -> u64 {
        self.seq.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        f(&db)
    }

    /// Lowers the object's `next_ms` to `next_ms` (its `count` as the call leaves it), synced:
    /// before a call that set an alarm commits.
    pub fn lower(
        &self,
        app: &str,
        name: &str,
        shard: usize,
        next_ms: u64,
        count: u64,
    ) -> rusqlite::Result<()> {
        self.with(|db| {
            let seq = self.mark();
            db.prepare_cached(
                "INSERT INTO alarm_index (app, name, shard, next_ms, count, seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (app, name) DO UPDATE SET next_ms = min(next_ms, excluded.next_ms),
                   count = excluded.count, seq = excluded.seq",
            )?
            .execute(rusqlite::params![
                app,
                name,
                shard as i64,
                next_ms as i64,
                count as i64,
                seq as i64
            ])?;
            Ok(())
        })
    }

    /// Moves the object's entry to `until` at the earliest (its wake was refused), unless a
    /// call lowered it since `mark`. Not synced.
    pub fn postpone(&self, app: &str, name: &str, until: u64, mark: u64) -> rusqlite::Result<()> {
        self.with(|db| {
            db.execute_batch("PRAGMA synchronous=NORMAL")?;
            let r = db
                .prepare_cached(
                    "UPDATE alarm_index SET next_ms = max(next_ms, ?3)
                     WHERE app = ?1 AND name = ?2 AND seq < ?4",
                )?
                .execute(rusqlite::params![app, name, until as i64, mark as i64]);
            db.execute_batch("PRAGMA synchronous=FULL")?;
            r.map(|_| ())
        })
    }

    /// Makes the object's entry due no later than `next_ms` (with `count`), writing (synced)
    /// only if it is not already: for an object just opened.
    pub fn ensure(
        &self,
        app: &str,
        name: &str,
        shard: usize,
        next_ms: u64,
        count: u64,
    ) -> rusqlite::Result<()> {
        let known: Option<i64> = self.with(|db| {
            db.prepare_cached("SELECT next_ms FROM alarm_index WHERE app = ?1 AND name = ?2")?
                .query_row([app, name], |r| r.get(0))
                .optional()
        })?;
        match known {
            Some(at) if at.max(0) as u64 <= next_ms => Ok(()),
            _ => self.lower(app, name, shard, next_ms, count),
        }
    }

    /// Sets the object's entry to what it had when a wake took `mark`, once the wake's batch
    /// is durable: its earliest alarm (or message to send) and how many, or no entry without
    /// any; unless a call lowered the entry since the mark. Not synced: lost in a crash, the
    /// entry is only earlier than it should be.
    pub fn settle(
        &self,
        app: &str,
        name: &str,
        next: Option<u64>,
        count: u64,
        mark: u64,
    ) -> rusqlite::Result<()> {
        self.with(|db| {
            db.execute_batch("PRAGMA synchronous=NORMAL")?;
            let r = match next {
                Some(next) => db
                    .prepare_cached(
                        "UPDATE alarm_index SET next_ms = ?3, count = ?4
                         WHERE app = ?1 AND name = ?2 AND seq < ?5",
                    )?
                    .execute(rusqlite::params![
                        app,
                        name,
                        next as i64,
                        count as i64,
                        mark as i64
                    ]),
                None => db
                    .prepare_cached(
                        "DELETE FROM alarm_index WHERE app = ?1 AND name = ?2 AND seq < ?3",
                    )?
                    .execute(rusqlite::params![app, name, mark as i64]),
            };
            db.execute_batch("PRAGMA synchronous=FULL")?;
            r.map(|_| ())
        })
    }

    /// The objects of `shard` that may have an alarm due at `now`, earliest first, at most
    /// `limit`, none of those `skip` says are already being woken.
    pub fn due(
        &self,
        shard: usize,
        now: u64,
        limit: usize,
        skip: impl Fn(&str, &str) -> bool,
    ) -> rusqlite::Result<Vec<Wake>> {
        self.with(|db| {
            let mut stmt = db.prepare_cached(
                "SELECT app, name, next_ms FROM alarm_index WHERE shard = ?1 AND next_ms <= ?2
                 ORDER BY next_ms",
            )?;
            let mut rows = stmt.query(rusqlite::params![shard as i64, now as i64])?;
            let mut out = Vec::new();
            while let Some(r) = rows.next()? {
                let (app, name): (String, String) = (r.get(0)?, r.get(1)?);
                if skip(&app, &name) {
                    continue;
                }
                out.push(Wake {
                    app,
                    name,
                    next_ms: r.get::<_, i64>(2)?.max(0) as u64,
                });
                if out.len() == limit {
                    break;
                }
            }
            Ok(out)
        })
    }

    /// The earliest time after `now` one of `shard`'s objects may have something due, if any.
    pub fn next_after(&self, shard: usize, now: u64) -> rusqlite::Result<Option<u64>> {
        self.with(|db| {
            db.prepare_cached(
                "SELECT min(next_ms) FROM alarm_index WHERE shard = ?1 AND next_ms > ?2",
            )?
            .query_row(rusqlite::params![shard as i64, now as i64], |r| {
                r.get::<_, Option<i64>>(0)
            })
            .map(|at| at.map(|at| at.max(0) as u64))
        })
    }

    /// Alarms the index knows of (each object's count as its last call or wake left it), and
    /// objects with any.
    pub fn pending(&self) -> (u64, u64) {
        self.with(|db| {
            db.prepare_cached("SELECT COALESCE(sum(count), 0), count(*) FROM alarm_index")?
                .query_row([], |r| {
                    Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
                })
        })
        .unwrap_or((0, 0))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn index(tag: &str, shards: usize) -> (AlarmIndex, std::path::PathBuf) {
        let dir =
            std::env::temp_dir().join(format!("combd-alarm-index-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("alarms.sqlite");
        (AlarmIndex::open(&path, shards).unwrap(), dir)
    }

    #[test]
    fn lowering_only_lowers_and_settling_sets_or_removes() {
        let (ix, dir) = index("lower", 2);
        ix.lower("a", "o", 1, 5_000, 1).unwrap();
        ix.lower("a", "o", 1, 9_000, 2).unwrap();
        assert_eq!(
            ix.due(1, 6_000, 10, |_, _| false).unwrap().len(),
            1,
            "still due at 5 s"
        );
        assert!(
            ix.due(0, 6_000, 10, |_, _| false).unwrap().is_empty(),
            "another shard's"
        );
        assert!(
            ix.due(1, 6_000, 10, |_, n| n == "o").unwrap().is_empty(),
            "skipped"
        );
        assert_eq!(ix.pending(), (2, 1));
        // A wake's mark taken before a lower: its answer does not undo the lower.
        let early = ix.mark();
        ix.lower("a", "o", 1, 5_000, 2).unwrap();
        ix.settle("a", "o", None, 0, early).unwrap();
        assert_eq!(ix.pending(), (2, 1), "a later lower stands");
        let mark = ix.mark();
        ix.settle("a", "o", Some(9_000), 1, mark).unwrap();
        assert!(ix.due(1, 6_000, 10, |_, _| false).unwrap().is_empty());
        ix.settle("a", "o", None, 0, ix.mark()).unwrap();
        assert_eq!(ix.pending(), (0, 0));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn another_shard_count_moves_each_object_to_its_new_shard() {
        let (ix, dir) = index("shards", 1);
        for i in 0..20 {
            ix.lower("a", &format!("o{i}"), 0, 1, 1).unwrap();
        }
        drop(ix);
        let ix = AlarmIndex::open(&dir.join("alarms.sqlite"), 2).unwrap();
        let on: usize = (0..2)
            .map(|s| ix.due(s, 10, 100, |_, _| false).unwrap().len())
            .sum();
        assert_eq!(on, 20);
        for s in 0..2 {
            for w in ix.due(s, 10, 100, |_, _| false).unwrap() {
                assert_eq!(crate::app::home_shard(&w.app, &w.name, 2), s);
            }
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn retries_back_off_to_a_minute() {
        assert_eq!(retry_at(0, 0), 1_000);
        assert_eq!(retry_at(0, 1), 2_000);
        assert_eq!(retry_at(0, 10), 60_000);
        assert_eq!(retry_at(0, 64), 60_000);
    }
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
