//! One object's backup, on its blocking thread ([`ObjectBackup`]): where it stands in its
//! WAL, the number of its next batch, and whether its chain goes on from a base. Made as the
//! object opens (or its database is created), it reads what each batch committed once the
//! batch has run, and writes a base when the chain would break (see the module above).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use combd_fleet::segment::WalCursor;
use combd_kernel::limits::{
    BACKUP_CHECKPOINT_WAIT, BACKUP_CHECKPOINT_WAL_BYTES, BACKUP_SNAPSHOT_AFTER_BYTES,
    BACKUP_WAL_MAX_BYTES,
};
use std::sync::atomic::Ordering;

use crate::object_key::ObjectKey;

use super::files::{Position, Record};
use super::writer::Item;
use super::Backup;

/// An object's backup while it is open.
pub(crate) struct ObjectBackup {
    backup: Arc<Backup>,
    key: ObjectKey,
    wal: PathBuf,
    cursor: WalCursor,
    /// The number of its next batch.
    next: u64,
    /// Its chain goes on from a base to `next - 1`; else its next batch takes a base.
    based: bool,
    /// Bytes of segments since its last base.
    since_base: u64,
    /// The salts of the WAL generation it last checkpointed (SQLite starts the WAL over from
    /// its top at the next write, new salts, the file as long as it was).
    restarted: Option<[u8; 8]>,
    /// A checkpoint waits for the writer only once the WAL's generation is this long (after a
    /// wait that failed, as much longer again: a writer that does not keep up costs a wait per
    /// [`BACKUP_CHECKPOINT_WAL_BYTES`], not per batch).
    wait_at: u64,
}

impl std::fmt::Debug for ObjectBackup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectBackup")
            .field("key", &self.key)
            .field("next", &self.next)
            .finish()
    }
}

/// The salts and length of a WAL file that has a header.
fn wal_salts(wal: &Path) -> Option<[u8; 8]> {
    let mut head = [0u8; 24];
    let mut f = std::fs::File::open(wal).ok()?;
    std::io::Read::read_exact(&mut f, &mut head).ok()?;
    let mut salts = [0u8; 8];
    salts.copy_from_slice(&head[16..24]);
    Some(salts)
}

impl ObjectBackup {
    /// The backup of object `key` whose database at `db_path` is open as `db`: it goes on where
    /// its backup stands, or takes a base now (the first time, or when its chain cannot go on).
    /// Blocks.
    pub fn open(
        backup: &Arc<Backup>,
        key: &ObjectKey,
        db_path: &Path,
        db: &rusqlite::Connection,
    ) -> ObjectBackup {
        let wal = crate::object_files::sidecar(db_path, "-wal");
        let mut ob = ObjectBackup {
            backup: backup.clone(),
            key: key.clone(),
            wal,
            cursor: WalCursor::new(),
            next: 1,
            based: false,
            since_base: 0,
            restarted: None,
            wait_at: 0,
        };
        match backup.position(key) {
            Ok(Some(p)) => {
                ob.next = p.seq + 1;
                ob.based = true;
                if let Some((salts, end)) = p.wal {
                    ob.cursor = WalCursor::resume(salts, end);
                }
            }
            // Never backed up: a base of what it is now.
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(object = %key, "backup: cannot read where it stands: {e}");
                ob.next = 1;
            }
        }
        if !ob.based {
            ob.take_base(db);
        }
        ob
    }

    /// After a batch committed on `db`: its frames read and queued, a base if the chain broke
    /// or its log grew, and the WAL checkpointed once the backup holds all of it. Blocks.
    pub fn after_batch(&mut self, db: &rusqlite::Connection) {
        if self.backup.take_broken(&self.key) {
            self.based = false;
        }
        if !self.based {
            return self.take_base(db);
        }
        if !self.read() {
            let wal_len = std::fs::metadata(&self.wal).map_or(0, |m| m.len());
            if wal_len > BACKUP_WAL_MAX_BYTES {
                // The backup does not keep up: a base, then the WAL may go.
                self.gap();
                self.take_base(db);
            }
            return;
        }
        // The database's size is read only once the log is long enough to ask.
        let db_bytes = || {
            db.path()
                .and_then(|p| std::fs::metadata(p).ok())
                .map_or(0, |m| m.len())
        };
        if self.since_base > BACKUP_SNAPSHOT_AFTER_BYTES
            && self.since_base > BACKUP_SNAPSHOT_AFTER_BYTES.max(db_bytes())
        {
            self.take_base(db);
        } else if self.wal_used() > BACKUP_CHECKPOINT_WAL_BYTES {
            self.checkpoint_if_held(db);
        }
    }

    /// Bytes of the WAL's generation read so far (0 once it was checkpointed, until SQLite
    /// starts it over): how much a checkpoint would take in.
    fn wal_used(&self) -> u64 {
        match self.cursor.position() {
            Some((salts, end)) if Some(salts) != self.restarted => end,
            _ => 0,
        }
    }

    /// Reads the frames committed and queues them, a segment per batch read; false when the
    /// queue had no room (they stay in the WAL) or reading failed (a gap). Called right after
    /// a commit on the object's thread, so no transaction is being written meanwhile.
    fn read(&mut self) -> bool {
        let name = self.key.as_str();
        loop {
            let before = self.cursor.clone();
            let seg =
                match self
                    .cursor
                    .next_segment_upto(&self.wal, name, self.next, 0, 0, u64::MAX)
                {
                    Ok(Some(seg)) => seg,
                    Ok(None) => return true,
                    Err(e) => {
                        tracing::warn!(object = %self.key, "backup: cannot read its WAL: {e}");
                        self.gap();
                        return false;
                    }
                };
            let bytes = seg.encode();
            if !self.backup.reserve(bytes.len() as u64) {
                // Read again at a later batch.
                self.cursor = before;
                self.backup.stats.deferred.fetch_add(1, Ordering::Relaxed);
                return false;
            }
            let Some(wal) = self.cursor.position() else {
                return false;
            };
            self.since_base += bytes.len() as u64;
            let record = Record {
                seq: self.next,
                at_ms: crate::alarms::now_ms(),
                wal,
                segment: bytes,
            };
            let at = Position {
                seq: self.next,
                wal: Some(wal),
            };
            self.next += 1;
            let queued_ms = record.at_ms;
            let item = Item::Segment {
                key: self.key.clone(),
                record,
                queued_ms,
            };
            self.backup.queue(&self.key, item, at);
            if self.cursor.at_end() {
                // Everything committed is read: no second look at the file.
                return true;
            }
        }
    }

    /// The chain breaks here: a base follows.
    fn gap(&mut self) {
        self.based = false;
        self.backup.stats.gaps.fetch_add(1, Ordering::Relaxed);
    }

    /// Checkpoints the WAL once the backup holds every frame of it, waiting for the writer
    /// (hurried) at most [`BACKUP_CHECKPOINT_WAIT`] (a busy object's last batch is never held
    /// already); else, or if a reader holds it back, at a later batch.
    fn checkpoint_if_held(&mut self, db: &rusqlite::Connection) {
        let (last, used) = (self.next - 1, self.wal_used());
        let held = self.backup.confirmed(&self.key) >= last
            || (used >= self.wait_at
                && self
                    .backup
                    .wait_confirmed(&self.key, last, BACKUP_CHECKPOINT_WAIT));
        if !held {
            if used >= self.wait_at {
                self.wait_at = used + BACKUP_CHECKPOINT_WAL_BYTES;
            }
            return;
        }
        self.wait_at = 0;
        self.restart(db);
    }

    /// `PRAGMA wal_checkpoint(RESTART)`: every frame into the database, and the next write
    /// starts the WAL over from its top, overwriting it rather than growing it again (a growing
    /// file costs every sync of it a metadata write: a `TRUNCATE` here cost click 5,000 a
    /// tenth more CPU, RESULTS "Backup"). The cursor stays: it knows the new generation by its
    /// salts. A checkpoint a reader holds back is left for later.
    fn restart(&mut self, db: &rusqlite::Connection) {
        let _node = crate::sandbox::NodeSql::enter();
        let done = db
            .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get::<_, i64>(0))
            .is_ok_and(|busy| busy == 0);
        if done {
            self.restarted = self.cursor.position().map(|(salts, _)| salts);
        }
    }

    /// Writes a base: the database as it is now (its WAL's frames with it), as batch `next`
    /// (a new number when the chain broke, else the last batch's), then truncates the WAL if it
    /// can. A failure leaves the chain broken (tried again at the next batch).
    fn take_base(&mut self, db: &rusqlite::Connection) {
        let seq = if self.based { self.next - 1 } else { self.next };
        // Every committed frame goes into the base: the cursor skips them.
        let mut cursor = self.cursor.clone();
        while let Ok(Some(_)) = cursor.next_segment(&self.wal, self.key.as_str(), 0, 0, 0) {}
        let wal = cursor
            .position()
            .or_else(|| wal_salts(&self.wal).map(|s| (s, 32)));
        let written = self.backup.write_base(&self.key, (seq, wal, true), |tmp| {
            db.backup(rusqlite::DatabaseName::Main, tmp, None)
                .map_err(std::io::Error::other)
        });
        if let Err(e) = written {
            self.backup.stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(object = %self.key, "backup: cannot write a base: {e}");
            return;
        }
        self.cursor = cursor;
        self.next = seq + 1;
        self.based = true;
        self.since_base = 0;
        // A base in place holds everything: the WAL may go (one bound for a bucket is held once
        // the writer has uploaded it: `checkpoint_if_held`).
        if self.backup.target.is_local() {
            self.restart(db);
        }
    }

    /// As the object closes: its WAL checkpointed if the backup holds all of it. Blocks.
    pub fn close(mut self, db: &rusqlite::Connection) {
        if self.based && self.read() {
            self.checkpoint_if_held(db);
        }
    }
}

/// The object `key` was deleted: its backup gets an empty base after where it stands (restored
/// to then, it does not exist). Blocks.
pub(crate) fn deleted(backup: &Arc<Backup>, key: &ObjectKey) {
    let seq = match backup.position(key) {
        Ok(Some(p)) => p.seq + 1,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(object = %key, "backup: cannot read where it stands: {e}");
            return;
        }
    };
    if let Err(e) = backup.write_base(key, (seq, None, false), |tmp| std::fs::write(tmp, b"")) {
        backup.stats.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(object = %key, "backup: cannot record its delete: {e}");
    }
}

/// Object `key`'s database was replaced by the one at `db` (a restore in place, or a fork made
/// from another object's backup): its backup goes on from a base of it, after where it stands,
/// so no segment of the database it replaced is ever read onto it. Blocks.
pub(crate) fn rebased(backup: &Arc<Backup>, key: &ObjectKey, db: &Path) -> std::io::Result<u64> {
    let seq = backup.position(key)?.map_or(1, |p| p.seq + 1);
    backup.write_base(key, (seq, None, true), |tmp| {
        std::fs::copy(db, tmp).map(|_| ())
    })?;
    Ok(seq)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::backup::restore::{build, At};
    use crate::backup::Target;

    fn open_db(path: &Path) -> rusqlite::Connection {
        let db = rusqlite::Connection::open(path).unwrap();
        db.execute_batch("PRAGMA journal_mode=WAL; PRAGMA wal_autocheckpoint=0;")
            .unwrap();
        db.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        )
        .unwrap();
        db
    }

    fn wait_confirmed(b: &Backup, key: &ObjectKey, seq: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while b.confirmed(key) < seq {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer never synced {seq}"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn values(path: &Path) -> Vec<i64> {
        let db = rusqlite::Connection::open(path).unwrap();
        let mut s = db.prepare("SELECT x FROM t ORDER BY x").unwrap();
        let v = s.query_map([], |r| r.get(0)).unwrap();
        v.map(Result::unwrap).collect()
    }

    /// The writer lost what was queued (a kill -9): the WAL still holds it, and the object's
    /// next backup reads it from where the backup's last record ended.
    #[test]
    fn a_backup_that_lost_its_queue_catches_up_from_the_wal() {
        let root = std::env::temp_dir().join(format!("combd-catchup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("data")).unwrap();
        let (backup_dir, db_path) = (root.join("backup"), root.join("data/x.sqlite"));
        let key = ObjectKey::new("a", "x");
        let db = open_db(&db_path);
        db.execute_batch("CREATE TABLE t (x INTEGER);").unwrap();
        let b1 = Backup::start(
            Target::Dir(backup_dir.clone()),
            std::time::Duration::from_secs(3600),
        )
        .unwrap();
        let mut ob = ObjectBackup::open(&b1, &key, &db_path, &db);
        for x in 1..=3 {
            db.execute("INSERT INTO t VALUES (?1)", [x]).unwrap();
            ob.after_batch(&db);
        }
        wait_confirmed(&b1, &key, 4);
        // Batches 5 and 6 go to a writer that is gone.
        let lost = Backup::detached(&backup_dir);
        let mut ob = ObjectBackup::open(&lost, &key, &db_path, &db);
        for x in 4..=5 {
            db.execute("INSERT INTO t VALUES (?1)", [x]).unwrap();
            ob.after_batch(&db);
        }
        drop(db);
        // After the restart: the WAL's frames after the last record are read again.
        let db = open_db(&db_path);
        let b3 = Backup::start(
            Target::Dir(backup_dir.clone()),
            std::time::Duration::from_secs(3600),
        )
        .unwrap();
        let mut ob = ObjectBackup::open(&b3, &key, &db_path, &db);
        ob.after_batch(&db);
        wait_confirmed(&b3, &key, 5);
        let out = root.join("restored.sqlite");
        let built = build(&Target::Dir(backup_dir.clone()), &key, At::Latest, &out).unwrap();
        assert_eq!(built.seq, 5, "the two lost batches, read again as one");
        assert_eq!(values(&out), vec![1, 2, 3, 4, 5]);
        build(&Target::Dir(backup_dir.clone()), &key, At::Seq(3), &out).unwrap();
        assert_eq!(values(&out), vec![1, 2]);
        assert_eq!(b3.stats.gaps.load(Ordering::Relaxed), 0);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Past `BACKUP_CHECKPOINT_WAL_BYTES` of WAL, an object checkpoints only what its backup
    /// holds: with its writer gone (nothing confirmed) the WAL grows on; with a writer, the WAL
    /// starts over (new salts) at its next write, and a restore still has every batch.
    #[test]
    fn the_wal_is_checkpointed_past_its_bytes_only_once_the_backup_holds_it() {
        let root = std::env::temp_dir().join(format!("combd-ckpt-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("data")).unwrap();
        let (backup_dir, db_path) = (root.join("backup"), root.join("data/x.sqlite"));
        let wal = crate::object_files::sidecar(&db_path, "-wal");
        let key = ObjectKey::new("a", "x");
        let db = open_db(&db_path);
        db.execute_batch("CREATE TABLE t (x INTEGER, pad BLOB);")
            .unwrap();
        let salts = || wal_salts(&wal).unwrap();
        let write = |ob: &mut ObjectBackup, x: i64| {
            // A quarter of the checkpoint's bytes a batch.
            let pad = vec![x as u8; (BACKUP_CHECKPOINT_WAL_BYTES / 4) as usize];
            db.execute("INSERT INTO t VALUES (?1, ?2)", rusqlite::params![x, pad])
                .unwrap();
            ob.after_batch(&db);
        };
        let lost = Backup::detached(&backup_dir);
        let mut ob = ObjectBackup::open(&lost, &key, &db_path, &db);
        write(&mut ob, 1);
        let first = salts();
        for x in 2..=6 {
            write(&mut ob, x);
        }
        assert_eq!(salts(), first, "nothing held by a backup: no checkpoint");
        assert!(std::fs::metadata(&wal).unwrap().len() > BACKUP_CHECKPOINT_WAL_BYTES);
        drop(ob);
        let b = Backup::start(
            Target::Dir(backup_dir.clone()),
            std::time::Duration::from_secs(3600),
        )
        .unwrap();
        let mut ob = ObjectBackup::open(&b, &key, &db_path, &db);
        // Its batch past the bytes waits for the writer to hold it, then checkpoints: the next
        // write starts the WAL over.
        write(&mut ob, 7);
        write(&mut ob, 8);
        assert_ne!(salts(), first, "held, the WAL started over");
        write(&mut ob, 9);
        wait_confirmed(&b, &key, ob.next - 1);
        let out = root.join("restored.sqlite");
        build(&Target::Dir(backup_dir.clone()), &key, At::Latest, &out).unwrap();
        assert_eq!(values(&out), (1..=9).collect::<Vec<i64>>());
        let _ = std::fs::remove_dir_all(&root);
    }
}
