//! The backup's writer: one thread of the node's, taking what the objects queue ([`Item`]) in
//! rounds: it appends each segment to its object's log, syncs every log it wrote, then tells
//! the objects what is durable (`Backup::confirmed`), so each may checkpoint its WAL. Between
//! rounds, every [`BACKUP_PRUNE_INTERVAL`], it drops per object what no restore within the
//! retention needs.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use combd_kernel::limits::{
    BACKUP_LAG_WARN, BACKUP_OPEN_FILES, BACKUP_PRUNE_INTERVAL, BACKUP_ROUND_INTERVAL,
};

use crate::object_key::ObjectKey;

use super::files::{self, Record};
use super::Backup;

/// What an object hands the writer, in its order.
pub(crate) enum Item {
    /// A segment, to append to the object's log.
    Segment {
        key: ObjectKey,
        record: Record,
        /// When it was queued (milliseconds since the epoch): how far behind the writer is.
        queued_ms: u64,
    },
    /// The object wrote base `seq` (its file is in place): its later segments go to `log-<seq>`.
    Base { key: ObjectKey, seq: u64 },
}

impl Item {
    fn bytes(&self) -> u64 {
        match self {
            Item::Segment { record, .. } => record.segment.len() as u64,
            Item::Base { .. } => 0,
        }
    }
}

/// An open log and the base it follows.
struct Log {
    base: u64,
    file: File,
    used: Instant,
}

/// The writer's state: the logs it has open.
struct Writer {
    backup: Arc<Backup>,
    logs: HashMap<ObjectKey, Log>,
}

/// Runs the writer until every sender is gone (the node stopped).
pub(super) fn run(backup: Arc<Backup>, items: mpsc::Receiver<Item>) {
    let mut w = Writer {
        backup,
        logs: HashMap::new(),
    };
    let mut pruned = Instant::now();
    let mut warned: Option<Instant> = None;
    let mut last_round = Instant::now();
    loop {
        let first = match items.recv_timeout(BACKUP_PRUNE_INTERVAL) {
            Ok(item) => Some(item),
            Err(mpsc::RecvTimeoutError::Timeout) => None,
            Err(mpsc::RecvTimeoutError::Disconnected) => return,
        };
        // What comes within the round's interval shares its syncs.
        if first.is_some() {
            std::thread::sleep(BACKUP_ROUND_INTERVAL.saturating_sub(last_round.elapsed()));
            last_round = Instant::now();
        }
        let round: Vec<Item> = first.into_iter().chain(items.try_iter()).collect();
        if !round.is_empty() {
            w.round(round, &mut warned);
        }
        if pruned.elapsed() >= BACKUP_PRUNE_INTERVAL {
            pruned = Instant::now();
            w.prune();
        }
    }
}

impl Writer {
    /// Writes a round: every segment appended, every log synced, then what is durable told.
    fn round(&mut self, round: Vec<Item>, warned: &mut Option<Instant>) {
        let backup = self.backup.clone();
        let stats = &backup.stats;
        let now = crate::alarms::now_ms();
        if let Some(oldest) = round.iter().find_map(|i| match i {
            Item::Segment { queued_ms, .. } => Some(*queued_ms),
            Item::Base { .. } => None,
        }) {
            self.warn_lag(now.saturating_sub(oldest), warned);
        }
        let mut written: HashMap<ObjectKey, u64> = HashMap::new();
        let mut bytes = 0;
        for item in round {
            bytes += item.bytes();
            match item {
                Item::Base { key, seq } => {
                    // The base is in place (written and synced by its object): later records
                    // go to its log, made as they come.
                    self.logs.remove(&key);
                    written.insert(key, seq);
                }
                Item::Segment {
                    key,
                    record,
                    queued_ms,
                } => {
                    let seq = record.seq;
                    match self.append(&key, &record) {
                        Ok(()) => {
                            stats.segments.fetch_add(1, Ordering::Relaxed);
                            stats
                                .written_bytes
                                .fetch_add(record.segment.len() as u64, Ordering::Relaxed);
                            written.insert(key, seq);
                            let lag =
                                crate::alarms::now_ms().saturating_sub(record.at_ms.min(queued_ms));
                            stats.lag_max_ms.fetch_max(lag, Ordering::Relaxed);
                        }
                        Err(e) => {
                            stats.errors.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(object = %key, "backup: cannot write segment {seq}: {e}");
                            // Its chain has a hole now: its next batch takes a base.
                            self.backup.broken(&key);
                        }
                    }
                }
            }
        }
        let mut synced = Vec::new();
        for (key, seq) in written {
            let ok = match self.logs.get(&key) {
                Some(log) => log.file.sync_data().map_err(|e| {
                    stats.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(object = %key, "backup: cannot sync its log: {e}");
                    self.backup.broken(&key);
                }),
                None => Ok(()),
            };
            if ok.is_ok() {
                synced.push((key, seq));
            }
        }
        self.backup.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.backup.confirm(synced);
        self.close_idle();
    }

    /// A warning when the writer is behind by more than [`BACKUP_LAG_WARN`], at most one a
    /// minute.
    fn warn_lag(&self, behind_ms: u64, warned: &mut Option<Instant>) {
        self.backup
            .stats
            .behind_ms
            .store(behind_ms, Ordering::Relaxed);
        if behind_ms > BACKUP_LAG_WARN.as_millis() as u64
            && warned.is_none_or(|w| w.elapsed() > Duration::from_secs(60))
        {
            *warned = Some(Instant::now());
            tracing::warn!(
                behind_ms,
                queued_bytes = self.backup.queued_bytes.load(Ordering::Relaxed),
                "backup: the writer is behind (backup_lag_warn_ms)"
            );
        }
    }

    /// Appends `record` to its object's log (the newest base's), opening it if need be.
    fn append(&mut self, key: &ObjectKey, record: &Record) -> std::io::Result<()> {
        if !self.logs.contains_key(key) {
            let dir = files::dir_of(&self.backup.dir, key);
            let base = files::bases(&dir)?
                .last()
                .map(|b| b.seq)
                .ok_or_else(|| std::io::Error::other("no base to follow"))?;
            let file = files::open_log(&dir.join(files::log_name(base)))?;
            self.logs.insert(
                key.clone(),
                Log {
                    base,
                    file,
                    used: Instant::now(),
                },
            );
        }
        let log = self
            .logs
            .get_mut(key)
            .ok_or_else(|| std::io::Error::other("no log"))?;
        if record.seq <= log.base {
            return Err(std::io::Error::other(format!(
                "segment {} is not after base {}",
                record.seq, log.base
            )));
        }
        log.used = Instant::now();
        log.file.write_all(&files::encode(record))
    }

    /// Closes the logs used longest ago past [`BACKUP_OPEN_FILES`].
    fn close_idle(&mut self) {
        while self.logs.len() > BACKUP_OPEN_FILES {
            let Some(oldest) = self
                .logs
                .iter()
                .min_by_key(|(_, l)| l.used)
                .map(|(k, _)| k.clone())
            else {
                return;
            };
            self.logs.remove(&oldest);
        }
    }

    /// Drops, for every object, the bases and logs older than the newest base that is itself
    /// past the retention: a restore to any moment within it starts there or later.
    fn prune(&mut self) {
        let horizon =
            crate::alarms::now_ms().saturating_sub(self.backup.retention.as_millis() as u64);
        let root = self.backup.dir.join("objects");
        for dir in object_dirs(&root) {
            let Ok(bases) = files::bases(&dir) else {
                continue;
            };
            let Some(keep) = bases
                .iter()
                .rev()
                .find(|b| b.at_ms <= horizon)
                .map(|b| b.seq)
            else {
                continue;
            };
            for b in bases.iter().filter(|b| b.seq < keep) {
                let _ = std::fs::remove_file(&b.path);
                let _ = std::fs::remove_file(dir.join(files::log_name(b.seq)));
                self.backup.stats.pruned.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Every object's directory under `<backup>/objects/`.
fn object_dirs(root: &Path) -> Vec<PathBuf> {
    let list = |d: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .map(|e| e.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    list(root).iter().flat_map(|app| list(app)).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Past the retention, an object keeps its newest base older than it and everything after:
    /// a restore to any moment within it still has what it needs.
    #[test]
    fn pruning_keeps_the_newest_base_past_the_retention_and_what_follows() {
        let root = std::env::temp_dir().join(format!("combd-prune-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let key = ObjectKey::new("a", "x");
        let dir = files::dir_of(&root, &key);
        let now = crate::alarms::now_ms();
        let day = 86_400_000;
        for (seq, at) in [(1, now - 9 * day), (5, now - 8 * day), (9, now - day)] {
            files::write_base(&dir, &files::base_name(seq, at, None), |p| {
                std::fs::write(p, b"db")
            })
            .unwrap();
            std::fs::write(dir.join(files::log_name(seq)), b"").unwrap();
        }
        let mut w = Writer {
            backup: Arc::new(Backup::new(
                &root,
                Duration::from_secs(7 * 86_400),
                mpsc::channel().0,
            )),
            logs: HashMap::new(),
        };
        w.prune();
        let kept: Vec<u64> = files::bases(&dir).unwrap().iter().map(|b| b.seq).collect();
        assert_eq!(kept, vec![5, 9], "base 5 is the newest older than 7 days");
        assert!(!dir.join(files::log_name(1)).exists());
        assert!(dir.join(files::log_name(5)).exists());
        assert_eq!(w.backup.stats.pruned.load(Ordering::Relaxed), 1);
        let _ = std::fs::remove_dir_all(&root);
    }

    /// What waits for the writer is bounded: past `BACKUP_QUEUE_MAX_BYTES` nothing more is
    /// taken (the object leaves its frames in its WAL).
    #[test]
    fn the_queue_takes_no_more_than_its_bytes() {
        let b = Backup::detached(std::path::Path::new("."));
        let max = combd_kernel::limits::BACKUP_QUEUE_MAX_BYTES as u64;
        assert!(b.reserve(max - 10));
        assert!(!b.reserve(11));
        assert!(b.reserve(10));
        assert!(!b.reserve(1));
    }
}
