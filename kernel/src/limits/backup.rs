//! The bounds of continuous backup on a node alone (`COMBD_BACKUP`): what waits for the
//! backup's writer, when an object's WAL is checkpointed and when its backup takes a new
//! snapshot.

use std::time::Duration;

/// `COMBD_BACKUP_RETENTION`: how long a backup keeps what a restore to any moment needs.
pub const BACKUP_RETENTION_DEFAULT: Duration = Duration::from_secs(7 * 86_400);

/// Shortest `COMBD_BACKUP_RETENTION`: a minute (a restore needs a moment to name).
pub const BACKUP_RETENTION_MIN: Duration = Duration::from_secs(60);

/// Bytes of segments the node's objects may have waiting for the backup's writer, in all:
/// past it an object leaves its new frames in its WAL (read at its next batch), so a slow
/// backup target costs WAL, never memory.
pub const BACKUP_QUEUE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// An object's WAL past this is checkpointed (truncated) at the end of a batch once the backup
/// holds every frame of it durably: SQLite's own checkpoints are off while backup is on, so no
/// frame goes before the backup has it.
pub const BACKUP_CHECKPOINT_WAL_BYTES: u64 = 4 * 1024 * 1024;

/// An object's WAL past this is checkpointed even though the backup does not hold all of it
/// (a target that stopped): its backup starts again from a snapshot, and the batches between
/// are restorable only together (`backup_gaps`).
pub const BACKUP_WAL_MAX_BYTES: u64 = 256 * 1024 * 1024;

/// An object's backup takes a new snapshot once the segments since its last one pass this
/// (or the database's size, whichever is more): a restore reads one snapshot and at most about
/// this much of segments, and retention can drop what came before.
pub const BACKUP_SNAPSHOT_AFTER_BYTES: u64 = 64 * 1024 * 1024;

/// The backup's writer writes a round at most this often: the segments that came meanwhile
/// share one sync of each log (one sync a segment cost click 5,000 a quarter more CPU; a round
/// of 200 ms rather than 50 ms, with RESTART checkpoints, took its cost from 16 % to 12 %,
/// RESULTS "Backup"). The lag it adds is at most this (an object waiting to checkpoint hurries
/// it).
pub const BACKUP_ROUND_INTERVAL: Duration = Duration::from_millis(200);

/// Log files the backup's writer keeps open at once (one per object written lately).
pub const BACKUP_OPEN_FILES: usize = 64;

/// How often the backup's writer drops, per object, what no restore within the retention
/// needs.
pub const BACKUP_PRUNE_INTERVAL: Duration = Duration::from_secs(60);

/// The backup is lagging past this (its oldest segment waiting): a warning, at most one a
/// minute while it lasts.
pub const BACKUP_LAG_WARN: Duration = Duration::from_secs(10);

/// With an `s3://` target, the writer writes a round at most this often: each round is one PUT
/// per object written in it (a log chunk), so a bucket gets at most one a second per object;
/// the lag it adds is at most this.
pub const BACKUP_BUCKET_ROUND_INTERVAL: Duration = Duration::from_secs(1);

/// With an `s3://` target, an object's log of chunks since its last base is at most about this
/// many: past it, its next batch takes a new base, so a restore reads one base and at most this
/// many chunks (a busy object's base at most every few minutes).
pub const BACKUP_BUCKET_LOG_CHUNKS_MAX: usize = 256;

/// The largest base the backup stores in a bucket: S3's largest single PUT (5 GiB).
pub const BACKUP_BUCKET_BASE_MAX_BYTES: u64 = 5 * 1024 * 1024 * 1024;

/// How long an object past [`BACKUP_CHECKPOINT_WAL_BYTES`] waits, at the end of a batch, for the
/// backup's writer to hold its last batch (the writer is hurried: it does not wait out its
/// round), so it can checkpoint: a busy object's batches never all wait out a round, and its
/// WAL would grow on. Past it the object goes on and checkpoints at a later batch.
pub const BACKUP_CHECKPOINT_WAIT: Duration = Duration::from_secs(1);
