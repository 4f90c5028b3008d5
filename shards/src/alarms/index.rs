//! The node's alarm index: one SQLite file a shard, `<COMBD_DATA>/alarms-<shard>.sqlite`,
//! each behind its own lock (the module's notes in `crate::alarms` say what it holds and why it
//! is never late).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use rusqlite::OptionalExtension;

use crate::home::home_shard;

/// A shard's index file: the entries of the objects whose home is that shard.
const SCHEMA: &str = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;
     CREATE TABLE IF NOT EXISTS alarm_index (app TEXT NOT NULL, name TEXT NOT NULL,
       next_ms INTEGER NOT NULL, count INTEGER NOT NULL, seq INTEGER NOT NULL,
       PRIMARY KEY (app, name)) WITHOUT ROWID;
     CREATE INDEX IF NOT EXISTS alarm_index_next ON alarm_index (next_ms);
     CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v INTEGER NOT NULL);";

/// Where shard `shard`'s index is kept in the data directory `dir`.
pub fn shard_path(dir: &Path, shard: usize) -> PathBuf {
    dir.join(format!("alarms-{shard}.sqlite"))
}

/// The single index of earlier versions, read once into the shards' files and then removed.
const LEGACY: &str = "alarms.sqlite";

/// The node's index of objects with alarms: one [`ShardIndex`] a shard (see the module's notes
/// in `crate::alarms`).
///
/// Each entry carries the sequence number of the last call that lowered it. A wake takes a
/// number ([`AlarmIndex::mark`]) when it reads what its object has left; its answer settles
/// the entry only if no call lowered it since ([`AlarmIndex::settle`]): the answer of a wake
/// comes once its batch is durable, which may be after a later batch set an alarm or queued
/// a message, and must not undo what that batch told the index.
pub struct AlarmIndex {
    shards: Vec<ShardIndex>,
}

/// One shard's index: its file's connection (the lock only that shard's blocking threads
/// take), the lowers waiting for the next group commit, its sequence numbers and its syncs.
struct ShardIndex {
    db: Mutex<rusqlite::Connection>,
    /// Lowers handed in and not written yet: the next thread to take `db` writes them all in
    /// one transaction, with one sync.
    queue: Mutex<Vec<Lowering>>,
    seq: AtomicU64,
    /// Group commits of lowers that were synced (`alarm_index_syncs`).
    syncs: AtomicU64,
    path: PathBuf,
}

/// A lower waiting for its group's commit, and where its outcome goes.
struct Lowering {
    app: String,
    name: String,
    next_ms: u64,
    count: u64,
    done: Arc<OnceLock<Result<(), String>>>,
}

/// An entry as a file holds it (for moving it to another file).
#[derive(Debug, Clone)]
struct Row {
    app: String,
    name: String,
    next_ms: i64,
    count: i64,
    seq: i64,
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

/// A failure of a group commit, as each of its lowers sees it.
fn group_error(message: &str) -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_IOERR),
        Some(message.to_string()),
    )
}

impl ShardIndex {
    fn open(path: &Path) -> Result<ShardIndex, String> {
        let at = |e: rusqlite::Error| format!("{}: {e}", path.display());
        let db = rusqlite::Connection::open(path).map_err(at)?;
        db.execute_batch(SCHEMA).map_err(at)?;
        Ok(ShardIndex {
            db: Mutex::new(db),
            queue: Mutex::new(Vec::new()),
            seq: AtomicU64::new(1),
            syncs: AtomicU64::new(0),
            path: path.to_path_buf(),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<T>,
    ) -> rusqlite::Result<T> {
        let db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        f(&db)
    }

    /// Runs `f` in one transaction, committed synced (`full`) or not.
    fn commit(
        &self,
        db: &rusqlite::Connection,
        full: bool,
        f: impl FnOnce(&rusqlite::Connection) -> rusqlite::Result<()>,
    ) -> rusqlite::Result<()> {
        if full {
            db.execute_batch("PRAGMA synchronous=FULL")?;
        }
        let r = db.unchecked_transaction().and_then(|tx| {
            f(&tx)?;
            tx.commit()
        });
        if full {
            db.execute_batch("PRAGMA synchronous=NORMAL")?;
        }
        r
    }

    fn mark(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    /// Numbers go on from the last life's: an entry it lowered stays newer than a wake's mark
    /// only if the mark is taken after it.
    fn resume_seq(&self) -> Result<(), String> {
        let last: i64 = self
            .with(|db| {
                db.query_row("SELECT COALESCE(max(seq), 0) FROM alarm_index", [], |r| {
                    r.get(0)
                })
            })
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        self.seq.fetch_max(last.max(0) as u64 + 1, Ordering::SeqCst);
        Ok(())
    }

    /// Group commit: hands the lower in, then takes the lock; whoever holds it first writes
    /// every lower handed in so far, in one transaction, and tells each its outcome.
    fn lower(&self, app: &str, name: &str, next_ms: u64, count: u64) -> rusqlite::Result<()> {
        let done = Arc::new(OnceLock::new());
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Lowering {
                app: app.to_string(),
                name: name.to_string(),
                next_ms,
                count,
                done: done.clone(),
            });
        let db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = done.get() {
            // A thread that held the lock before this one wrote it.
            return r.clone().map_err(|e| group_error(&e));
        }
        let group = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
        let r = self.write(&db, &group).map_err(|e| e.to_string());
        // Told before the lock goes: the next holder finds its outcome set, or its lower
        // still queued.
        for l in &group {
            let _ = l.done.set(r.clone());
        }
        drop(db);
        r.map_err(|e| group_error(&e))
    }

    /// Writes a group of lowers: synced if any of them lowers an entry (or makes one); an
    /// entry already due by a lower's time only takes its count and number, unsynced (see the
    /// module's notes: what a crash may lose of it leaves the entry due as early or earlier).
    fn write(&self, db: &rusqlite::Connection, group: &[Lowering]) -> rusqlite::Result<()> {
        let mut lowers = Vec::with_capacity(group.len());
        for l in group {
            let known: Option<i64> = db
                .prepare_cached("SELECT next_ms FROM alarm_index WHERE app = ?1 AND name = ?2")?
                .query_row([&l.app, &l.name], |r| r.get(0))
                .optional()?;
            lowers.push(known.is_none_or(|at| at.max(0) as u64 > l.next_ms));
        }
        let full = lowers.iter().any(|l| *l);
        if full {
            self.syncs.fetch_add(1, Ordering::Relaxed);
        }
        self.commit(db, full, |tx| {
            for (l, lowers) in group.iter().zip(lowers) {
                let seq = self.mark() as i64;
                let sql = if lowers {
                    "INSERT INTO alarm_index (app, name, next_ms, count, seq)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (app, name) DO UPDATE SET next_ms = min(next_ms, excluded.next_ms),
                       count = excluded.count, seq = excluded.seq"
                } else {
                    "UPDATE alarm_index SET count = ?4, seq = ?5
                     WHERE app = ?1 AND name = ?2 AND next_ms <= ?3"
                };
                tx.prepare_cached(sql)?.execute(rusqlite::params![
                    l.app,
                    l.name,
                    l.next_ms.min(i64::MAX as u64) as i64,
                    l.count as i64,
                    seq
                ])?;
            }
            Ok(())
        })
    }

    /// Every entry of the file.
    fn rows(&self) -> rusqlite::Result<Vec<Row>> {
        self.with(read_rows)
    }

    /// Puts `rows` (moved from another file) in, synced; an entry already here keeps the
    /// earlier time.
    fn put(&self, rows: &[&Row]) -> rusqlite::Result<()> {
        let db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        self.commit(&db, true, |tx| {
            for r in rows {
                tx.prepare_cached(
                    "INSERT INTO alarm_index (app, name, next_ms, count, seq)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (app, name) DO UPDATE SET next_ms = min(next_ms, excluded.next_ms),
                       count = max(count, excluded.count), seq = max(seq, excluded.seq)",
                )?
                .execute(rusqlite::params![r.app, r.name, r.next_ms, r.count, r.seq])?;
            }
            Ok(())
        })
    }

    /// Removes `rows` (moved to their home shard's file) and records the shard count the file
    /// is now laid out for.
    fn moved_out(&self, rows: &[Row], shards: usize) -> rusqlite::Result<()> {
        let db = self.db.lock().unwrap_or_else(|p| p.into_inner());
        self.commit(&db, true, |tx| {
            for r in rows {
                tx.prepare_cached("DELETE FROM alarm_index WHERE app = ?1 AND name = ?2")?
                    .execute([&r.app, &r.name])?;
            }
            tx.execute(
                "INSERT OR REPLACE INTO meta (k, v) VALUES ('shards', ?1)",
                [shards as i64],
            )?;
            Ok(())
        })
    }

    /// The shard count the file was laid out for, if it says.
    fn laid_out_for(&self) -> rusqlite::Result<Option<i64>> {
        self.with(|db| {
            db.query_row("SELECT v FROM meta WHERE k = 'shards'", [], |r| r.get(0))
                .optional()
        })
    }
}

/// Every entry of an index file (one of a shard, or the single one of earlier versions: both
/// have these columns).
fn read_rows(db: &rusqlite::Connection) -> rusqlite::Result<Vec<Row>> {
    db.prepare("SELECT app, name, next_ms, count, seq FROM alarm_index")?
        .query_map([], |r| {
            Ok(Row {
                app: r.get(0)?,
                name: r.get(1)?,
                next_ms: r.get(2)?,
                count: r.get(3)?,
                seq: r.get(4)?,
            })
        })?
        .collect()
}

/// Index files in `dir` no shard of a node of `shards` shards keeps: the single file of
/// earlier versions, and the files of shards past the count.
fn strays(dir: &Path, shards: usize) -> Result<Vec<PathBuf>, String> {
    let mut found = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(file) = file.to_str() else {
            continue;
        };
        let past = file
            .strip_prefix("alarms-")
            .and_then(|f| f.strip_suffix(".sqlite"))
            .and_then(|k| k.parse::<usize>().ok())
            .is_some_and(|k| k >= shards);
        if past || file == LEGACY {
            found.push(entry.path());
        }
    }
    found.sort();
    Ok(found)
}

/// Removes an SQLite file with its WAL and shared memory.
fn remove_db(path: &Path) -> Result<(), String> {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", path.display())),
        }
    }
    Ok(())
}

impl AlarmIndex {
    /// Opens (or creates) the index of a node of `shards` shards in the data directory `dir`:
    /// a file a shard. Entries another layout left (the single file of earlier versions, the
    /// files of a node with another shard count) move to their home shard's file first, synced
    /// there before they leave where they were (a crash between leaves them in both: early at
    /// worst, never lost).
    pub fn open(dir: &Path, shards: usize) -> Result<AlarmIndex, String> {
        let n = shards.max(1);
        let shards = (0..n)
            .map(|k| ShardIndex::open(&shard_path(dir, k)))
            .collect::<Result<Vec<_>, _>>()?;
        let ix = AlarmIndex { shards };
        for path in strays(dir, n)? {
            let at = |e: rusqlite::Error| format!("{}: {e}", path.display());
            let rows = rusqlite::Connection::open(&path)
                .and_then(|db| read_rows(&db))
                .map_err(at)?;
            ix.rehome(rows.iter(), n).map_err(at)?;
            remove_db(&path)?;
        }
        for (k, s) in ix.shards.iter().enumerate() {
            let at = |e: rusqlite::Error| format!("{}: {e}", s.path.display());
            if s.laid_out_for().map_err(at)? == Some(n as i64) {
                continue;
            }
            let away: Vec<Row> = s
                .rows()
                .map_err(at)?
                .into_iter()
                .filter(|r| home_shard(&r.app, &r.name, n) != k)
                .collect();
            ix.rehome(away.iter(), n).map_err(at)?;
            s.moved_out(&away, n).map_err(at)?;
        }
        for s in &ix.shards {
            s.resume_seq()?;
        }
        Ok(ix)
    }

    /// Puts `rows` in their home shards' files, synced.
    fn rehome<'r>(&self, rows: impl Iterator<Item = &'r Row>, n: usize) -> rusqlite::Result<()> {
        let mut by_home: BTreeMap<usize, Vec<&Row>> = BTreeMap::new();
        for r in rows {
            by_home
                .entry(home_shard(&r.app, &r.name, n))
                .or_default()
                .push(r);
        }
        for (home, rows) in by_home {
            self.shards[home].put(&rows)?;
        }
        Ok(())
    }

    fn of(&self, shard: usize) -> &ShardIndex {
        &self.shards[shard % self.shards.len()]
    }

    /// The shards the index has a file for.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// A number later than every lower of `shard`'s index so far: a wake takes one when it
    /// reads what its object has left, and settles with it.
    pub fn mark(&self, shard: usize) -> u64 {
        self.of(shard).mark()
    }

    /// Commits of `shard`'s index that were synced since start (`alarm_index_syncs`).
    pub fn syncs(&self, shard: usize) -> u64 {
        self.of(shard).syncs.load(Ordering::Relaxed)
    }

    /// Lowers the object's `next_ms` to `next_ms` (its `count` as the call leaves it), in the
    /// index of its home `shard`: before a call that set an alarm commits. Durable when it
    /// returns: synced (one sync for every lower of the shard waiting by then), or already due
    /// by then in a form a crash cannot make later.
    pub fn lower(
        &self,
        app: &str,
        name: &str,
        shard: usize,
        next_ms: u64,
        count: u64,
    ) -> rusqlite::Result<()> {
        self.of(shard).lower(app, name, next_ms, count)
    }

    /// Moves the object's entry to `until` at the earliest (its wake was refused), unless a
    /// call lowered it since `mark`. Not synced.
    pub fn postpone(
        &self,
        app: &str,
        name: &str,
        shard: usize,
        until: u64,
        mark: u64,
    ) -> rusqlite::Result<()> {
        self.of(shard).with(|db| {
            db.prepare_cached(
                "UPDATE alarm_index SET next_ms = max(next_ms, ?3)
                 WHERE app = ?1 AND name = ?2 AND seq < ?4",
            )?
            .execute(rusqlite::params![app, name, until as i64, mark as i64])
            .map(|_| ())
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
        let known: Option<i64> = self.of(shard).with(|db| {
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
        shard: usize,
        next: Option<u64>,
        count: u64,
        mark: u64,
    ) -> rusqlite::Result<()> {
        self.of(shard).with(|db| {
            match next {
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
            }
            .map(|_| ())
        })
    }

    /// Forgets a deleted object's entry (in the index of its home `shard`). Not synced: lost
    /// in a crash, the entry is only early (a wake finds nothing due and settles it).
    pub fn forget(&self, app: &str, name: &str, shard: usize) -> rusqlite::Result<()> {
        self.of(shard).with(|db| {
            db.prepare_cached("DELETE FROM alarm_index WHERE app = ?1 AND name = ?2")?
                .execute([app, name])
                .map(|_| ())
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
        self.of(shard).with(|db| {
            let mut stmt = db.prepare_cached(
                "SELECT app, name, next_ms FROM alarm_index WHERE next_ms <= ?1 ORDER BY next_ms",
            )?;
            let mut rows = stmt.query([now as i64])?;
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
        self.of(shard).with(|db| {
            db.prepare_cached("SELECT min(next_ms) FROM alarm_index WHERE next_ms > ?1")?
                .query_row([now as i64], |r| r.get::<_, Option<i64>>(0))
                .map(|at| at.map(|at| at.max(0) as u64))
        })
    }

    /// Alarms the index knows of (each object's count as its last call or wake left it), and
    /// objects with any, over every shard.
    pub fn pending(&self) -> (u64, u64) {
        self.shards
            .iter()
            .map(|s| {
                s.with(|db| {
                    db.prepare_cached("SELECT COALESCE(sum(count), 0), count(*) FROM alarm_index")?
                        .query_row([], |r| {
                            Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
                        })
                })
                .unwrap_or((0, 0))
            })
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    }
}

#[cfg(test)]
mod tests;
