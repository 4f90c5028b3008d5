//! Continuous backup on a node alone (`COMBD_BACKUP`, README "Backup and restore").
//!
//! Every object's committed batches go to the backup (a directory or a bucket: [`target`]) as
//! the fleet ships them to its bucket: one **segment** per batch (its WAL frames, `combd_fleet::segment`), appended to the
//! object's log behind a **base** (a copy of its database), and a new base now and then. So an
//! object can be rebuilt as it was after any batch ([`restore`]).
//!
//! - **Off the event loop, bounded.** At the end of each batch, on the object's blocking thread,
//!   its backup ([`object::ObjectBackup`]) reads the frames the batch committed and queues them
//!   for the node's writer thread ([`writer`]), within [`BACKUP_QUEUE_MAX_BYTES`] for the whole
//!   node; past it the frames stay in the WAL and are read at a later batch. An answer never
//!   waits for the backup: the lag (`backup_queued_bytes`, `backup_behind_ms`) is what a lost
//!   disk would lose.
//! - **Nothing skipped, across crashes.** While backup is on, SQLite checkpoints nothing by
//!   itself (`wal_autocheckpoint=0`, no checkpoint at close): an object truncates its WAL only
//!   once the writer has synced every frame of it ([`Backup::confirmed`]). Each record says where
//!   in the WAL it ended, so an object opened after a kill -9 goes on reading its WAL where its
//!   backup's last record ended: the batches the writer lost are read again.
//! - **A base when the chain would break**: the first time an object is backed up, when its
//!   database changed outside its chain (an in-place restore), after a write the writer could
//!   not make, when its WAL passed [`BACKUP_WAL_MAX_BYTES`] without the backup keeping up, and
//!   every [`BACKUP_SNAPSHOT_AFTER_BYTES`] of segments (so a restore reads a bounded log). A
//!   deleted object gets an empty base: restored to then, it did not exist.
//! - **Retention**: the writer drops what came before the newest base older than
//!   `COMBD_BACKUP_RETENTION`.
//!
//! [`BACKUP_QUEUE_MAX_BYTES`]: combd_kernel::limits::BACKUP_QUEUE_MAX_BYTES
//! [`BACKUP_WAL_MAX_BYTES`]: combd_kernel::limits::BACKUP_WAL_MAX_BYTES
//! [`BACKUP_SNAPSHOT_AFTER_BYTES`]: combd_kernel::limits::BACKUP_SNAPSHOT_AFTER_BYTES

pub(crate) mod files;
pub(crate) mod object;
pub mod restore;
pub mod target;
mod writer;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use combd_kernel::limits::BACKUP_QUEUE_MAX_BYTES;

use crate::object_key::ObjectKey;
use files::Position;
pub use target::{BucketTarget, Target};
use writer::Item;

/// What the backup counts, for `/stats`.
#[derive(Debug, Default)]
pub(crate) struct BackupStats {
    /// Segments written (and synced).
    pub segments: AtomicU64,
    /// Bytes of segments written.
    pub written_bytes: AtomicU64,
    /// Bases written.
    pub bases: AtomicU64,
    /// Times an object's chain broke (a base followed).
    pub gaps: AtomicU64,
    /// Writes that failed.
    pub errors: AtomicU64,
    /// Bases (and their logs) dropped past the retention.
    pub pruned: AtomicU64,
    /// The most a segment waited between its batch's commit and its sync in the backup.
    pub lag_max_ms: AtomicU64,
    /// How long each segment waited, as a histogram (`crate::stats::stages`' buckets).
    pub lag: LagTimes,
    /// How long the oldest segment of the writer's last round had waited.
    pub behind_ms: AtomicU64,
    /// Times an object left frames in its WAL because the queue was full.
    pub deferred: AtomicU64,
}

/// How long segments waited between their batch's commit and their sync in the backup: a
/// histogram with the stages' buckets (a quarter of an octave wide).
#[derive(Debug)]
pub(crate) struct LagTimes([AtomicU64; crate::stats::stages::BUCKETS]);

impl Default for LagTimes {
    fn default() -> LagTimes {
        LagTimes(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl LagTimes {
    /// Records one segment's lag.
    pub(crate) fn record(&self, lag_ms: u64) {
        let b = crate::stats::stages::bucket(lag_ms.saturating_mul(1000));
        self.0[b].fetch_add(1, Ordering::Relaxed);
    }

    /// The `q` quantile in milliseconds (its bucket's upper bound), 0 with nothing recorded.
    pub(crate) fn quantile_ms(&self, q: f64) -> u64 {
        let h = crate::stats::stages::Histogram {
            counts: self.0.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
            sum_us: 0,
        };
        h.quantile_us(q) / 1000
    }
}

/// The node's backup: its target, the queue to its writer, where each object's backup
/// stands.
pub struct Backup {
    target: Target,
    retention: Duration,
    items: Mutex<mpsc::Sender<Item>>,
    queued_bytes: AtomicU64,
    /// Where each object's backup stands as its batches queued it (this process's).
    positions: Mutex<HashMap<ObjectKey, Position>>,
    /// Each object's last batch the writer has synced.
    confirmed: Mutex<HashMap<ObjectKey, u64>>,
    /// Told when `confirmed` moves.
    confirmed_moved: Condvar,
    /// An object waits for the writer: it writes its next round at once.
    hurry: Mutex<bool>,
    hurried: Condvar,
    /// Objects whose chain broke in the writer: their next batch takes a base.
    broken: Mutex<Vec<ObjectKey>>,
    pub(crate) stats: BackupStats,
}

impl std::fmt::Debug for Backup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backup")
            .field("target", &self.target)
            .finish()
    }
}

impl Backup {
    /// Starts the backup into `target` (a directory is created if missing) and its writer
    /// thread.
    pub fn start(target: Target, retention: Duration) -> Result<Arc<Backup>, String> {
        if let Target::Dir(dir) = &target {
            std::fs::create_dir_all(dir.join("objects"))
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let (tx, rx) = mpsc::channel();
        let backup = Arc::new(Backup::new(target, retention, tx));
        let writer = backup.clone();
        std::thread::Builder::new()
            .name("combd-backup".into())
            .spawn(move || writer::run(writer, rx))
            .map_err(|e| format!("cannot start the backup's writer: {e}"))?;
        Ok(backup)
    }

    /// A backup into `dir` whose writer is gone: everything queued is lost, as a kill -9 loses
    /// what waits for the writer.
    #[cfg(test)]
    pub(crate) fn detached(dir: &std::path::Path) -> Arc<Backup> {
        let (tx, _) = mpsc::channel();
        let target = Target::Dir(dir.to_path_buf());
        Arc::new(Backup::new(target, Duration::from_secs(3600), tx))
    }

    /// A backup into `target` whose items go to `items`.
    fn new(target: Target, retention: Duration, items: mpsc::Sender<Item>) -> Backup {
        Backup {
            target,
            retention,
            items: Mutex::new(items),
            queued_bytes: AtomicU64::new(0),
            positions: Mutex::new(HashMap::new()),
            confirmed: Mutex::new(HashMap::new()),
            confirmed_moved: Condvar::new(),
            hurry: Mutex::new(false),
            hurried: Condvar::new(),
            broken: Mutex::new(Vec::new()),
            stats: BackupStats::default(),
        }
    }

    /// The backup's target.
    pub fn target(&self) -> &Target {
        &self.target
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where `key`'s backup stands: as this process queued it, else as its files say.
    fn position(&self, key: &ObjectKey) -> std::io::Result<Option<Position>> {
        if let Some(p) = Self::lock(&self.positions).get(key) {
            return Ok(Some(*p));
        }
        self.target.position(key)
    }

    /// Takes room for `bytes` in the queue; false when it is full.
    fn reserve(&self, bytes: u64) -> bool {
        self.queued_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q + bytes <= BACKUP_QUEUE_MAX_BYTES as u64).then_some(q + bytes)
            })
            .is_ok()
    }

    /// Queues `item` (its bytes reserved), and notes where `key` stands after it.
    fn queue(&self, key: &ObjectKey, item: Item, at: Position) {
        Self::lock(&self.positions).insert(key.clone(), at);
        if Self::lock(&self.items).send(item).is_err() {
            // The writer is gone (the node stops): nothing more is written.
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes `key`'s base as of batch `seq` (where its WAL stood then: `wal`; `exists`: it
    /// has a database, which `write` writes to the path it is given), durably in a directory,
    /// or staged for the writer to upload to a bucket; then queues it, so `key`'s later
    /// segments follow it. Blocks.
    fn write_base(
        &self,
        key: &ObjectKey,
        (seq, wal, exists): (u64, Option<([u8; 8], u64)>, bool),
        write: impl FnOnce(&std::path::Path) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let name = files::base_name(seq, crate::alarms::now_ms(), wal, exists);
        let upload = match &self.target {
            Target::Dir(dir) => {
                files::write_base(&files::dir_of(dir, key), &name, write)?;
                None
            }
            Target::Bucket(b) => {
                let file = b.scratch_file();
                if let Err(e) = write(&file) {
                    let _ = std::fs::remove_file(&file);
                    return Err(e);
                }
                Some((name, file))
            }
        };
        self.stats.bases.fetch_add(1, Ordering::Relaxed);
        let item = Item::Base {
            key: key.clone(),
            seq,
            upload,
        };
        self.queue(key, item, Position { seq, wal });
        Ok(())
    }

    /// The last batch of `key` the writer has synced (0: none).
    pub(crate) fn confirmed(&self, key: &ObjectKey) -> u64 {
        Self::lock(&self.confirmed).get(key).copied().unwrap_or(0)
    }

    fn confirm(&self, synced: Vec<(ObjectKey, u64)>) {
        let mut c = Self::lock(&self.confirmed);
        for (key, seq) in synced {
            let at = c.entry(key).or_insert(0);
            *at = (*at).max(seq);
        }
        self.confirmed_moved.notify_all();
    }

    /// Waits until the writer has synced `key`'s batch `seq` (hurrying it), at most `wait`:
    /// whether it has. Blocks.
    pub(crate) fn wait_confirmed(&self, key: &ObjectKey, seq: u64, wait: Duration) -> bool {
        *Self::lock(&self.hurry) = true;
        self.hurried.notify_one();
        let deadline = std::time::Instant::now() + wait;
        let mut c = Self::lock(&self.confirmed);
        loop {
            if c.get(key).is_some_and(|&at| at >= seq) {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            c = self
                .confirmed_moved
                .wait_timeout(c, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The writer's wait between rounds: `for` long, or until an object hurries it. Blocks.
    fn nap(&self, time: Duration) {
        let mut h = Self::lock(&self.hurry);
        if !*h {
            h = self
                .hurried
                .wait_timeout(h, time)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        *h = false;
    }

    /// `key`'s chain broke in the writer (or its log is long enough): its next batch takes a
    /// base.
    fn broken(&self, key: &ObjectKey) {
        let mut b = Self::lock(&self.broken);
        if !b.contains(key) {
            b.push(key.clone());
        }
    }

    /// Whether `key`'s chain broke since it last asked (and it is told once).
    fn take_broken(&self, key: &ObjectKey) -> bool {
        let mut b = Self::lock(&self.broken);
        let before = b.len();
        b.retain(|k| k != key);
        b.len() != before
    }

    /// The figures `/stats` shows (all 0 with backup off).
    pub(crate) fn figures(backup: Option<&Backup>) -> Vec<crate::stats::Field> {
        use crate::stats::Kind::{Counter, Gauge};
        fn l(a: &AtomicU64) -> u64 {
            a.load(Ordering::Relaxed)
        }
        let g = |f: fn(&Backup) -> u64| backup.map_or(0, f);
        vec![
            ("backup_queued_bytes", "combd_backup_queued_bytes", Gauge, "Bytes of segments waiting for the backup's writer.", g(|b| b.queued_bytes.load(Ordering::Relaxed))),
            ("backup_behind_ms", "combd_backup_behind_ms", Gauge, "How long the oldest segment of the writer's last round had waited (0 with nothing waiting): what a lost disk would lose.", g(|b| if b.queued_bytes.load(Ordering::Relaxed) == 0 { 0 } else { l(&b.stats.behind_ms) })),
            ("backup_lag_max_ms", "combd_backup_lag_max_ms", Gauge, "The most a segment waited between its batch's commit and its sync in the backup.", g(|b| l(&b.stats.lag_max_ms))),
            ("backup_lag_p99_ms", "combd_backup_lag_p99_ms", Gauge, "The 99th percentile of how long segments waited between their batch's commit and their sync in the backup, since start (within a fifth above).", g(|b| b.stats.lag.quantile_ms(0.99))),
            ("backup_segments", "combd_backup_segments_total", Counter, "Segments (a batch each) written to the backup and synced.", g(|b| l(&b.stats.segments))),
            ("backup_written_bytes", "combd_backup_written_bytes_total", Counter, "Bytes of segments written to the backup.", g(|b| l(&b.stats.written_bytes))),
            ("backup_bases", "combd_backup_bases_total", Counter, "Bases (copies of an object's database) written to the backup.", g(|b| l(&b.stats.bases))),
            ("backup_gaps", "combd_backup_gaps_total", Counter, "Times an object's chain of segments broke (a base followed): the batches between restore only together.", g(|b| l(&b.stats.gaps))),
            ("backup_errors", "combd_backup_errors_total", Counter, "Backup writes that failed.", g(|b| l(&b.stats.errors))),
            ("backup_pruned", "combd_backup_pruned_total", Counter, "Bases (with their logs) dropped past COMBD_BACKUP_RETENTION.", g(|b| l(&b.stats.pruned))),
            ("backup_deferred", "combd_backup_deferred_total", Counter, "Times an object left its frames in its WAL for a later batch: the backup's queue was full.", g(|b| l(&b.stats.deferred))),
        ]
    }
}
