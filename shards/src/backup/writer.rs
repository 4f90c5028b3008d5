//! The backup's writer: one thread of the node's, taking what the objects queue ([`Item`]) in
//! rounds: it appends each segment to its object's log (in a directory, a file synced once a
//! round; in a bucket, one chunk per object per round), uploads the bases staged for a bucket,
//! then tells the objects what is durable (`Backup::confirmed`), so each may checkpoint its
//! WAL. Between rounds, every [`BACKUP_PRUNE_INTERVAL`], it drops per object what no restore
//! within the retention needs.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use combd_kernel::limits::{
    BACKUP_BUCKET_LOG_CHUNKS_MAX, BACKUP_BUCKET_ROUND_INTERVAL, BACKUP_LAG_WARN, BACKUP_OPEN_FILES,
    BACKUP_PRUNE_INTERVAL, BACKUP_ROUND_INTERVAL,
};

use crate::object_key::ObjectKey;

use super::files::{self, Record};
use super::{Backup, Target};

/// What an object hands the writer, in its order.
pub(crate) enum Item {
    /// A segment, to append to the object's log.
    Segment {
        key: ObjectKey,
        record: Record,
        /// When it was queued (milliseconds since the epoch): how far behind the writer is.
        queued_ms: u64,
    },
    /// The object wrote base `seq`: in place in a directory (`upload` is `None`), or staged,
    /// to be uploaded as its name from its file. Its later segments go to its log.
    Base {
        key: ObjectKey,
        seq: u64,
        upload: Option<(String, PathBuf)>,
    },
}

impl Item {
    fn bytes(&self) -> u64 {
        match self {
            Item::Segment { record, .. } => record.segment.len() as u64,
            Item::Base { .. } => 0,
        }
    }
}

/// An object's log being written: the base it follows, its file (a directory's, once opened),
/// its chunks (a bucket's).
struct Log {
    base: u64,
    file: Option<File>,
    chunks: usize,
    used: Instant,
}

/// A round's records of one object for its log after one base (a bucket's chunk).
struct Run {
    key: ObjectKey,
    base: u64,
    records: Vec<(Record, u64)>,
}

/// The writer's state: the logs it has open, and (for a bucket) the objects written since
/// they were last pruned.
struct Writer {
    backup: Arc<Backup>,
    logs: HashMap<ObjectKey, Log>,
    touched: HashSet<ObjectKey>,
    /// Objects a write failed for: their segments are not written until their next base (it
    /// holds them), so no log goes on past a hole (a restore would stop there at a gap).
    holed: HashSet<ObjectKey>,
}

/// Runs the writer until every sender is gone (the node stopped).
pub(super) fn run(backup: Arc<Backup>, items: mpsc::Receiver<Item>) {
    let interval = match backup.target.is_local() {
        true => BACKUP_ROUND_INTERVAL,
        false => BACKUP_BUCKET_ROUND_INTERVAL,
    };
    let mut w = Writer {
        backup,
        logs: HashMap::new(),
        touched: HashSet::new(),
        holed: HashSet::new(),
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
        // What comes within the round's interval shares its syncs (or its chunks).
        if first.is_some() {
            w.backup.nap(interval.saturating_sub(last_round.elapsed()));
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
    /// Writes a round: every segment appended, every log synced (or chunk stored), then what
    /// is durable told.
    fn round(&mut self, round: Vec<Item>, warned: &mut Option<Instant>) {
        if let Some(oldest) = round.iter().find_map(|i| match i {
            Item::Segment { queued_ms, .. } => Some(*queued_ms),
            Item::Base { .. } => None,
        }) {
            self.warn_lag(crate::alarms::now_ms().saturating_sub(oldest), warned);
        }
        let bytes: u64 = round.iter().map(Item::bytes).sum();
        let mut written: HashMap<ObjectKey, u64> = HashMap::new();
        let mut runs: Vec<Run> = Vec::new();
        for item in round {
            match item {
                Item::Base { key, seq, upload } => {
                    if self.base(&key, seq, upload) {
                        written.insert(key, seq);
                    }
                }
                Item::Segment {
                    key,
                    record,
                    queued_ms,
                } => self.segment(key, (record, queued_ms), &mut runs, &mut written),
            }
        }
        for run in runs {
            self.store_run(run, &mut written);
        }
        let mut synced = Vec::new();
        for (key, seq) in written {
            let synced_now = self
                .logs
                .get(&key)
                .and_then(|l| l.file.as_ref())
                .map(File::sync_data);
            match synced_now {
                Some(Err(e)) => self.failed(&key, &format!("cannot sync its log: {e}")),
                Some(Ok(())) | None => synced.push((key, seq)),
            }
        }
        self.backup.queued_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.backup.confirm(synced);
        self.close_idle();
    }

    /// Base `seq` of `key` (uploaded first, when staged): its later segments follow it. False
    /// when the upload failed (the object's next batch takes another).
    fn base(&mut self, key: &ObjectKey, seq: u64, upload: Option<(String, PathBuf)>) -> bool {
        if let (Some((name, file)), Target::Bucket(b)) = (upload, &self.backup.target) {
            if let Err(e) = b.upload_base(key, &name, &file) {
                self.failed(key, &format!("cannot upload base {seq}: {e}"));
                return false;
            }
        }
        self.touched.insert(key.clone());
        self.holed.remove(key);
        let log = Log {
            base: seq,
            file: None,
            chunks: 0,
            used: Instant::now(),
        };
        self.logs.insert(key.clone(), log);
        true
    }

    /// A write for `key` failed: its chain has a hole now, so its next batch takes a base.
    fn failed(&mut self, key: &ObjectKey, what: &str) {
        self.backup.stats.errors.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(object = %key, "backup: {what}");
        self.logs.remove(key);
        self.holed.insert(key.clone());
        self.backup.broken(key);
    }

    /// A segment: appended to its log's file in a directory, or to the round's run of its
    /// object in a bucket.
    fn segment(
        &mut self,
        key: ObjectKey,
        (record, queued_ms): (Record, u64),
        runs: &mut Vec<Run>,
        written: &mut HashMap<ObjectKey, u64>,
    ) {
        let seq = record.seq;
        if self.holed.contains(&key) {
            // After a hole: its next base holds this batch.
            return;
        }
        let base = match self.log(&key) {
            Ok(log) if seq > log.base => log.base,
            Ok(log) => {
                let base = log.base;
                return self.failed(&key, &format!("segment {seq} is not after base {base}"));
            }
            Err(e) => return self.failed(&key, &format!("cannot open its log: {e}")),
        };
        if let Target::Bucket(_) = self.backup.target {
            match runs.iter_mut().find(|r| r.key == key && r.base == base) {
                Some(run) => run.records.push((record, queued_ms)),
                None => runs.push(Run {
                    key,
                    base,
                    records: vec![(record, queued_ms)],
                }),
            }
            return;
        }
        let backup = self.backup.clone();
        let appended = self.log(&key).and_then(|log| {
            let file = match &mut log.file {
                Some(f) => f,
                None => log
                    .file
                    .insert(open_dir_log(&backup.target, &key, log.base)?),
            };
            file.write_all(&files::encode(&record))
        });
        match appended {
            Ok(()) => {
                self.counted(&record, queued_ms);
                written.insert(key, seq);
            }
            Err(e) => self.failed(&key, &format!("cannot write segment {seq}: {e}")),
        }
    }

    /// Stores a bucket's run as one chunk of its object's log.
    fn store_run(&mut self, run: Run, written: &mut HashMap<ObjectKey, u64>) {
        let Target::Bucket(b) = &self.backup.target else {
            return;
        };
        let records: Vec<&Record> = run.records.iter().map(|(r, _)| r).collect();
        let Some(last) = records.last().map(|r| r.seq) else {
            return;
        };
        if let Err(e) = b.put_chunk(&run.key, run.base, &records) {
            let what = format!("cannot store segments to {last}: {e}");
            return self.failed(&run.key, &what);
        }
        for (r, queued_ms) in &run.records {
            self.counted(r, *queued_ms);
        }
        written.insert(run.key.clone(), last);
        self.touched.insert(run.key.clone());
        if let Some(log) = self.logs.get_mut(&run.key) {
            log.chunks += 1;
            if log.chunks >= BACKUP_BUCKET_LOG_CHUNKS_MAX {
                // Long enough: a base, so a restore reads a bounded log.
                self.backup.broken(&run.key);
            }
        }
    }

    /// A segment written: counted, and its lag.
    fn counted(&self, record: &Record, queued_ms: u64) {
        let stats = &self.backup.stats;
        stats.segments.fetch_add(1, Ordering::Relaxed);
        stats
            .written_bytes
            .fetch_add(record.segment.len() as u64, Ordering::Relaxed);
        let lag = crate::alarms::now_ms().saturating_sub(record.at_ms.min(queued_ms));
        stats.lag_max_ms.fetch_max(lag, Ordering::Relaxed);
        stats.lag.record(lag);
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

    /// `key`'s log: the one being written, else the newest base's (found in the target).
    fn log(&mut self, key: &ObjectKey) -> std::io::Result<&mut Log> {
        if !self.logs.contains_key(key) {
            let target = &self.backup.target;
            let base = target
                .bases(key)?
                .last()
                .map(|b| b.seq)
                .ok_or_else(|| std::io::Error::other("no base to follow"))?;
            let chunks = match target {
                Target::Bucket(b) => b.chunk_count(key, base)?,
                Target::Dir(_) => 0,
            };
            let log = Log {
                base,
                file: None,
                chunks,
                used: Instant::now(),
            };
            self.logs.insert(key.clone(), log);
        }
        let log = self
            .logs
            .get_mut(key)
            .ok_or_else(|| std::io::Error::other("no log"))?;
        log.used = Instant::now();
        Ok(log)
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

    /// Drops, for every object (in a bucket: every object written since it was last pruned),
    /// the bases and logs older than the newest base that is itself past the retention: a
    /// restore to any moment within it starts there or later.
    fn prune(&mut self) {
        let horizon =
            crate::alarms::now_ms().saturating_sub(self.backup.retention.as_millis() as u64);
        let target = &self.backup.target;
        let objects: Vec<ObjectKey> = match target {
            Target::Dir(_) => target.objects().unwrap_or_default(),
            Target::Bucket(_) => self.touched.iter().cloned().collect(),
        };
        for key in objects {
            let Ok(bases) = target.bases(&key) else {
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
            let mut all_gone = true;
            for b in bases.iter().filter(|b| b.seq < keep) {
                match target.drop_base(&key, b) {
                    Ok(()) => self.backup.stats.pruned.fetch_add(1, Ordering::Relaxed),
                    Err(_) => {
                        all_gone = false;
                        continue;
                    }
                };
            }
            if all_gone && bases.last().is_some_and(|b| b.seq == keep) {
                // Nothing more to drop until it is written again.
                self.touched.remove(&key);
            }
        }
    }
}

/// Opens `key`'s log after `base` in a directory target for append.
fn open_dir_log(target: &Target, key: &ObjectKey, base: u64) -> std::io::Result<File> {
    let Target::Dir(dir) = target else {
        return Err(std::io::Error::other("not a directory"));
    };
    files::open_log(&files::dir_of(dir, key).join(files::log_name(base)))
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
            files::write_base(&dir, &files::base_name(seq, at, None, true), |p| {
                std::fs::write(p, b"db")
            })
            .unwrap();
            std::fs::write(dir.join(files::log_name(seq)), b"").unwrap();
        }
        let mut w = Writer {
            backup: Arc::new(Backup::new(
                Target::Dir(root.clone()),
                Duration::from_secs(7 * 86_400),
                mpsc::channel().0,
            )),
            logs: HashMap::new(),
            touched: HashSet::new(),
            holed: HashSet::new(),
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

    /// After a write that failed, an object's segments are not written until its next base:
    /// none follows a hole in its log.
    #[test]
    fn after_a_hole_nothing_is_written_until_the_next_base() {
        let root = std::env::temp_dir().join(format!("combd-hole-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let key = ObjectKey::new("a", "x");
        let dir = files::dir_of(&root, &key);
        files::write_base(&dir, &files::base_name(5, 1, None, true), |p| {
            std::fs::write(p, b"db")
        })
        .unwrap();
        let mut w = Writer {
            backup: Arc::new(Backup::new(
                Target::Dir(root.clone()),
                Duration::from_secs(3600),
                mpsc::channel().0,
            )),
            logs: HashMap::new(),
            touched: HashSet::new(),
            holed: HashSet::new(),
        };
        let segment = |seq: u64| Item::Segment {
            key: key.clone(),
            record: Record {
                seq,
                at_ms: 1,
                wal: ([0; 8], 32),
                segment: vec![seq as u8],
            },
            queued_ms: 1,
        };
        let seqs = |base: u64| {
            let mut seen = Vec::new();
            files::read_log(
                &dir.join(files::log_name(base)),
                |_, _| false,
                |r| {
                    seen.push(r.seq);
                    true
                },
            )
            .unwrap();
            seen
        };
        // 5 is not after base 5: a hole, so 6 is not written either.
        w.round(vec![segment(5), segment(6)], &mut None);
        assert_eq!(seqs(5), Vec::<u64>::new());
        assert_eq!(w.backup.stats.errors.load(Ordering::Relaxed), 1);
        let base = Item::Base {
            key: key.clone(),
            seq: 7,
            upload: None,
        };
        w.round(vec![segment(7), base, segment(8)], &mut None);
        assert_eq!(seqs(7), vec![8], "after its next base, written again");
        let _ = std::fs::remove_dir_all(&root);
    }
}
