//! Where the backup goes (`COMBD_BACKUP`): a directory, or an S3 bucket.
//!
//! Both hold the same things under the same names ([`files`]): per object, its bases and,
//! after each, its log of records. A directory's log is one file, appended to a round at a
//! time (`log-<base>`). A bucket cannot append, so there a log is a folder of **chunks**
//! (`log-<base>/<first>-<last>-<salts>-<end>`), one per round per object written in it, each
//! the round's records of the object; the newest chunk's name says where the object's backup
//! stands, unread. In a bucket every base and chunk is **sealed** with the backup key
//! (`COMBD_BACKUP_KEY_FILE`: a MAC over its key and its bytes, as the fleet seals its
//! segments), so a restore takes back only what a node with that key stored, where it stored
//! it: the bucket is not trusted with more than keeping bytes.
//!
//! A base bound for a bucket is written on this machine first (`scratch`, by the object's
//! thread, as a directory's base is) and uploaded by the writer thread in its order: an
//! object's thread never waits for the network.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use combd_fleet::bucket::Bucket;
use combd_kernel::limits::{
    BACKUP_BUCKET_BASE_MAX_BYTES, BACKUP_QUEUE_MAX_BYTES, FLEET_LIST_KEYS_MAX,
};

use super::files::{self, Base, Position, Record};
use crate::object_key::ObjectKey;

/// The backup's target.
#[derive(Debug)]
pub enum Target {
    /// A directory on this machine.
    Dir(PathBuf),
    /// An S3 bucket.
    Bucket(Box<BucketTarget>),
}

/// A bucket as the backup's target.
#[derive(Debug)]
pub struct BucketTarget {
    bucket: Bucket,
    /// What every key begins with: empty, or ending with `/`.
    prefix: String,
    /// Where bases are written before they are uploaded, or downloaded to.
    scratch: PathBuf,
}

/// Numbers the scratch files, so no two are the same.
static SCRATCH: AtomicU64 = AtomicU64::new(0);

fn io_error(e: impl std::fmt::Display) -> io::Error {
    io::Error::other(e.to_string())
}

/// A chunk's key's last part: its first and last batch, and where the WAL stood after the last.
fn chunk_name(records: &[&Record]) -> Option<String> {
    let (first, last) = (records.first()?, records.last()?);
    let (salts, end) = last.wal;
    let hex: String = salts.iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("{:020}-{:020}-{hex}-{end}", first.seq, last.seq))
}

/// The last batch a chunk's name says it holds, and where the WAL stood after it.
fn parse_chunk(name: &str) -> Option<Position> {
    let mut parts = name.split('-');
    let _first: u64 = parts.next()?.parse().ok()?;
    let seq = parts.next()?.parse().ok()?;
    let hex = parts.next()?;
    let end = parts.next()?.parse().ok()?;
    if hex.len() != 16 || parts.next().is_some() {
        return None;
    }
    let mut salts = [0u8; 8];
    for (i, b) in salts.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Position {
        seq,
        wal: Some((salts, end)),
    })
}

impl BucketTarget {
    /// The bucket `bucket` (which seals with the backup key), its keys under `prefix`, bases
    /// staged in `scratch` (created).
    pub fn new(bucket: Bucket, prefix: String, scratch: PathBuf) -> io::Result<BucketTarget> {
        std::fs::create_dir_all(&scratch)?;
        Ok(BucketTarget {
            bucket,
            prefix,
            scratch,
        })
    }

    /// The prefix of object `key`'s keys.
    fn object(&self, key: &ObjectKey) -> String {
        format!("{}objects/{}/{}/", self.prefix, key.app(), key.name())
    }

    /// The prefix of the chunks of `key`'s log after base `base`.
    fn log(&self, key: &ObjectKey, base: u64) -> String {
        format!("{}{}/", self.object(key), files::log_name(base))
    }

    /// A new file's path in the scratch directory.
    pub(crate) fn scratch_file(&self) -> PathBuf {
        let n = SCRATCH.fetch_add(1, Ordering::Relaxed);
        self.scratch
            .join(format!("base-{}-{n}.tmp", std::process::id()))
    }

    fn chunks(&self, key: &ObjectKey, base: u64) -> io::Result<Vec<String>> {
        self.bucket
            .list(&self.log(key, base), FLEET_LIST_KEYS_MAX)
            .map_err(io_error)
    }

    /// Uploads the base staged at `file` as `key`'s `name`; the file goes either way.
    pub(crate) fn upload_base(&self, key: &ObjectKey, name: &str, file: &Path) -> io::Result<()> {
        let at = format!("{}{name}", self.object(key));
        let sent = self
            .bucket
            .put_sealed_file(&at, file, BACKUP_BUCKET_BASE_MAX_BYTES)
            .map_err(io_error);
        let _ = std::fs::remove_file(file);
        sent.map(|_| ())
    }

    /// Stores `records` (one round's, in order, after base `base`) as a chunk of `key`'s log.
    pub(crate) fn put_chunk(
        &self,
        key: &ObjectKey,
        base: u64,
        records: &[&Record],
    ) -> io::Result<()> {
        let Some(name) = chunk_name(records) else {
            return Ok(());
        };
        let mut body = Vec::with_capacity(records.iter().map(|r| r.segment.len() + 64).sum());
        for r in records {
            files::encode_into(r, &mut body);
        }
        let at = format!("{}{name}", self.log(key, base));
        self.bucket.put_sealed(&at, body).map_err(io_error)
    }

    /// How many chunks `key`'s log after `base` has.
    pub(crate) fn chunk_count(&self, key: &ObjectKey, base: u64) -> io::Result<usize> {
        self.chunks(key, base).map(|c| c.len())
    }
}

impl Target {
    /// What `/stats` and the log call it.
    pub fn describe(&self) -> String {
        match self {
            Target::Dir(d) => d.display().to_string(),
            Target::Bucket(b) => format!("{:?} under {:?}", b.bucket, b.prefix),
        }
    }

    /// Whether what is written to it is durable when written (a directory), rather than
    /// once the writer has uploaded it.
    pub(crate) fn is_local(&self) -> bool {
        matches!(self, Target::Dir(_))
    }

    /// `key`'s bases, oldest first. Blocks.
    pub(crate) fn bases(&self, key: &ObjectKey) -> io::Result<Vec<Base>> {
        match self {
            Target::Dir(d) => files::bases(&files::dir_of(d, key)),
            Target::Bucket(b) => {
                let prefix = b.object(key);
                let keys = b
                    .bucket
                    .list(&format!("{prefix}snap-"), FLEET_LIST_KEYS_MAX)
                    .map_err(io_error)?;
                let mut found: Vec<Base> = keys
                    .iter()
                    .filter_map(|k| files::parse_base(k.strip_prefix(&prefix)?))
                    .collect();
                found.sort_by_key(|b| b.seq);
                Ok(found)
            }
        }
    }

    /// Copies `key`'s base `base` to `out` (replaced). Blocks.
    pub(crate) fn fetch_base(&self, key: &ObjectKey, base: &Base, out: &Path) -> io::Result<()> {
        let _ = std::fs::remove_file(out);
        match self {
            Target::Dir(d) => {
                std::fs::copy(files::dir_of(d, key).join(&base.name), out).map(|_| ())
            }
            Target::Bucket(b) => {
                let at = format!("{}{}", b.object(key), base.name);
                match b
                    .bucket
                    .get_sealed_to_file(&at, out, BACKUP_BUCKET_BASE_MAX_BYTES)
                    .map_err(io_error)?
                {
                    Some(_) => Ok(()),
                    None => Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{at}: gone"),
                    )),
                }
            }
        }
    }

    /// Reads the records of `key`'s log after base `base`, as [`files::read_log`] does. Blocks.
    pub(crate) fn read_log(
        &self,
        key: &ObjectKey,
        base: u64,
        with: impl Fn(u64, u64) -> bool,
        mut each: impl FnMut(Record) -> bool,
    ) -> io::Result<()> {
        match self {
            Target::Dir(d) => files::read_log(
                &files::dir_of(d, key).join(files::log_name(base)),
                with,
                each,
            )
            .map(|_| ()),
            Target::Bucket(b) => {
                for chunk in b.chunks(key, base)? {
                    let Some(bytes) = b
                        .bucket
                        .get_sealed(&chunk, BACKUP_QUEUE_MAX_BYTES as u64)
                        .map_err(io_error)?
                    else {
                        // Pruned meanwhile: the log ends here.
                        return Ok(());
                    };
                    let size = bytes.len() as u64;
                    let (_, whole) =
                        files::read_records(io::Cursor::new(bytes), size, &with, &mut each)?;
                    if !whole {
                        return Ok(());
                    }
                }
                Ok(())
            }
        }
    }

    /// Where `key`'s backup stands: its newest base and the last record of its log. `None`
    /// when it has no base. Blocks.
    pub(crate) fn position(&self, key: &ObjectKey) -> io::Result<Option<Position>> {
        match self {
            Target::Dir(d) => files::position(d, key),
            Target::Bucket(b) => {
                let Some(base) = self.bases(key)?.pop() else {
                    return Ok(None);
                };
                let last = b.chunks(key, base.seq)?.pop();
                let at = last.and_then(|c| parse_chunk(c.rsplit('/').next()?));
                Ok(Some(at.unwrap_or(Position {
                    seq: base.seq,
                    wal: base.wal,
                })))
            }
        }
    }

    /// Drops `key`'s base `base` and its log. Blocks.
    pub(crate) fn drop_base(&self, key: &ObjectKey, base: &Base) -> io::Result<()> {
        match self {
            Target::Dir(d) => {
                let dir = files::dir_of(d, key);
                std::fs::remove_file(dir.join(&base.name))?;
                match std::fs::remove_file(dir.join(files::log_name(base.seq))) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                }
            }
            Target::Bucket(b) => {
                // The log first: a base whose log is gone is still a moment to restore to.
                let chunks = b.chunks(key, base.seq)?;
                b.bucket.delete_many(&chunks).map_err(io_error)?;
                b.bucket
                    .delete(&format!("{}{}", b.object(key), base.name))
                    .map_err(io_error)
            }
        }
    }

    /// Every object the backup has something of. Blocks.
    pub(crate) fn objects(&self) -> io::Result<Vec<ObjectKey>> {
        let valid = |app: &str, name: &str| {
            crate::app::valid_object_name(app) && crate::app::valid_object_name(name)
        };
        match self {
            Target::Dir(d) => {
                let list = |d: &Path| -> Vec<String> {
                    std::fs::read_dir(d)
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                };
                let root = d.join("objects");
                Ok(list(&root)
                    .into_iter()
                    .flat_map(|app| {
                        let names = list(&root.join(&app));
                        names.into_iter().map(move |n| (app.clone(), n))
                    })
                    .filter(|(a, n)| valid(a, n))
                    .map(|(a, n)| ObjectKey::new(&a, &n))
                    .collect())
            }
            Target::Bucket(b) => {
                let root = format!("{}objects/", b.prefix);
                let mut found: Vec<ObjectKey> = Vec::new();
                b.bucket
                    .for_each_key(&root, |k| {
                        let mut parts = k[root.len()..].splitn(3, '/');
                        if let (Some(a), Some(n)) = (parts.next(), parts.next()) {
                            let new = found.last().is_none_or(|l| l.app() != a || l.name() != n);
                            if new && valid(a, n) {
                                found.push(ObjectKey::new(a, n));
                            }
                        }
                        true
                    })
                    .map_err(io_error)?;
                Ok(found)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunks_name_says_where_its_last_record_left_the_wal() {
        let rec = |seq: u64| Record {
            seq,
            at_ms: 1,
            wal: ([0xa0 | seq as u8; 8], 4096 * seq),
            segment: Vec::new(),
        };
        let name = chunk_name(&[&rec(7), &rec(8), &rec(9)]).expect("a name");
        assert!(
            name.starts_with("00000000000000000007-00000000000000000009-"),
            "{name}"
        );
        assert_eq!(
            parse_chunk(&name),
            Some(Position {
                seq: 9,
                wal: Some(([0xa9; 8], 4096 * 9))
            })
        );
        assert_eq!(chunk_name(&[]), None);
        assert_eq!(parse_chunk("7-9-zz-1"), None);
    }
}
