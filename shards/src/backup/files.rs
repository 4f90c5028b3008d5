//! An object's files in the backup: `<backup>/objects/<app>/<name>/` (in a bucket, the same
//! keys under its prefix: `crate::backup::target`).
//!
//! - `snap-<seq>-<at_ms>-<salts>-<end>.db`: a **base**, the object's database as of its batch
//!   `seq` (committed at `at_ms`), with where its WAL stood then (`salts` in hex, and the offset
//!   `end` after the last frame it holds; `0000000000000000-0` when it had none);
//!   `snap-….none` (or an empty `.db`, as the first backups wrote it) is *no database* (the
//!   object was deleted at `seq`, or did not exist yet).
//! - `log-<seq>`: the **segments** after base `seq`, appended one record each:
//!   `seq u64 | at_ms u64 | salts [8] | end u64 | len u32 | segment (len bytes) | crc32 u32`
//!   (little-endian; the CRC covers every byte of the record before it). A segment is one
//!   batch's WAL frames in the fleet's format (`combd_fleet::segment`); `salts` and `end` say
//!   where in the object's WAL it ended. A record cut short by a crash ends the log.
//!
//! Numbers are zero-padded to 20 digits (13 for a time), so names sort as their numbers.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::object_key::ObjectKey;

/// Bytes of a record before its segment.
const RECORD_HEAD: usize = 8 + 8 + 8 + 8 + 4;

/// Where an object's backup stands: its last batch (`seq`), and where its WAL stood after it
/// (`None`: it had no WAL: a new or deleted object).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub seq: u64,
    pub wal: Option<([u8; 8], u64)>,
}

/// A base: its batch, when, where the WAL stood, whether it holds a database, and its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Base {
    pub seq: u64,
    pub at_ms: u64,
    pub wal: Option<([u8; 8], u64)>,
    /// False: the object had no database then.
    pub exists: bool,
    /// Its file's name (its key's last part, in a bucket).
    pub name: String,
}

/// One record of a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub seq: u64,
    pub at_ms: u64,
    pub wal: ([u8; 8], u64),
    pub segment: Vec<u8>,
}

/// The directory of `key`'s backup.
pub(crate) fn dir_of(backup: &Path, key: &ObjectKey) -> PathBuf {
    backup.join("objects").join(key.app()).join(key.name())
}

fn hex(salts: &[u8; 8]) -> String {
    salts.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; 8]> {
    if s.len() != 16 {
        return None;
    }
    let mut out = [0u8; 8];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A base's file name (`exists`: it holds a database).
pub(crate) fn base_name(seq: u64, at_ms: u64, wal: Option<([u8; 8], u64)>, exists: bool) -> String {
    let (salts, end) = wal.unwrap_or(([0; 8], 0));
    let ext = if exists { "db" } else { "none" };
    format!("snap-{seq:020}-{at_ms:013}-{}-{end}.{ext}", hex(&salts))
}

/// A log's file name.
pub(crate) fn log_name(base: u64) -> String {
    format!("log-{base:020}")
}

/// The base a file name names.
pub(crate) fn parse_base(name: &str) -> Option<Base> {
    let rest = name.strip_prefix("snap-")?;
    let (rest, exists) = match rest.strip_suffix(".db") {
        Some(r) => (r, true),
        None => (rest.strip_suffix(".none")?, false),
    };
    let mut parts = rest.split('-');
    let seq = parts.next()?.parse().ok()?;
    let at_ms = parts.next()?.parse().ok()?;
    let salts = unhex(parts.next()?)?;
    let end: u64 = parts.next()?.parse().ok()?;
    let wal = (end != 0).then_some((salts, end));
    Some(Base {
        seq,
        at_ms,
        wal,
        exists,
        name: name.to_string(),
    })
}

/// The bases in `dir`, oldest first (an empty `.db` holds no database).
pub(crate) fn bases(dir: &Path) -> io::Result<Vec<Base>> {
    let mut found = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let mut b = parse_base(e.file_name().to_str()?)?;
                b.exists = b.exists && e.metadata().is_ok_and(|m| m.len() > 0);
                Some(b)
            })
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    found.sort_by_key(|b| b.seq);
    Ok(found)
}

/// A record as bytes.
pub(crate) fn encode(r: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEAD + r.segment.len() + 4);
    encode_into(r, &mut out);
    out
}

/// A record's bytes, appended to `out` (a bucket's chunk holds a round's records).
pub(crate) fn encode_into(r: &Record, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&r.seq.to_le_bytes());
    out.extend_from_slice(&r.at_ms.to_le_bytes());
    out.extend_from_slice(&r.wal.0);
    out.extend_from_slice(&r.wal.1.to_le_bytes());
    out.extend_from_slice(&(r.segment.len() as u32).to_le_bytes());
    out.extend_from_slice(&r.segment);
    let crc = crc32fast::hash(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Reads a log's records, in order, calling `each` with each (its segment only when `with`
/// says so of its number and time: a scan of times and numbers seeks over the frames); stops at
/// the first record cut short or corrupt (one whose segment was skipped is checked when it is
/// read), or when `each` answers false. Returns the bytes of the records read whole.
pub(crate) fn read_log(
    path: &Path,
    with: impl Fn(u64, u64) -> bool,
    each: impl FnMut(Record) -> bool,
) -> io::Result<u64> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let size = file.metadata()?.len();
    read_records(io::BufReader::new(file), size, with, each).map(|(at, _)| at)
}

/// [`read_log`] of `size` bytes of records from `r`; also whether it read them all (not
/// stopped by a torn or corrupt record, or by `each`).
pub(crate) fn read_records(
    mut r: impl Read + io::Seek,
    size: u64,
    with: impl Fn(u64, u64) -> bool,
    mut each: impl FnMut(Record) -> bool,
) -> io::Result<(u64, bool)> {
    use std::io::SeekFrom;
    let mut at = 0u64;
    let mut head = [0u8; RECORD_HEAD];
    while at + RECORD_HEAD as u64 <= size {
        r.read_exact(&mut head)?;
        let len = u32::from_le_bytes([head[32], head[33], head[34], head[35]]) as u64;
        let end = at + RECORD_HEAD as u64 + len + 4;
        if end > size {
            return Ok((at, false));
        }
        let (seq, at_ms) = (u64_at(&head, 0), u64_at(&head, 8));
        let mut salts = [0u8; 8];
        salts.copy_from_slice(&head[16..24]);
        let segment = if with(seq, at_ms) {
            let mut body = vec![0u8; len as usize + 4];
            r.read_exact(&mut body)?;
            let crc = u32::from_le_bytes([
                body[len as usize],
                body[len as usize + 1],
                body[len as usize + 2],
                body[len as usize + 3],
            ]);
            let mut h = crc32fast::Hasher::new();
            h.update(&head);
            h.update(&body[..len as usize]);
            if h.finalize() != crc {
                return Ok((at, false));
            }
            body.truncate(len as usize);
            body
        } else {
            r.seek(SeekFrom::Current(len as i64 + 4))?;
            Vec::new()
        };
        let record = Record {
            seq,
            at_ms,
            wal: (salts, u64_at(&head, 24)),
            segment,
        };
        at = end;
        if !each(record) {
            return Ok((at, false));
        }
    }
    Ok((at, at == size))
}

/// Where `key`'s backup stands on disk: its newest base and the last whole record of its log.
/// `None` when it has no base. Blocks.
pub(crate) fn position(backup: &Path, key: &ObjectKey) -> io::Result<Option<Position>> {
    let dir = dir_of(backup, key);
    let Some(base) = bases(&dir)?.pop() else {
        return Ok(None);
    };
    let mut pos = Position {
        seq: base.seq,
        wal: base.wal,
    };
    read_log(
        &dir.join(log_name(base.seq)),
        |_, _| false,
        |r| {
            pos = Position {
                seq: r.seq,
                wal: Some(r.wal),
            };
            true
        },
    )?;
    Ok(Some(pos))
}

/// Writes a base durably: `write` fills a temporary file, which is synced and renamed into
/// place, the directory synced. Blocks.
pub(crate) fn write_base(
    dir: &Path,
    name: &str,
    write: impl FnOnce(&Path) -> io::Result<()>,
) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{name}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    write(&tmp)?;
    File::open(&tmp)?.sync_all()?;
    let path = dir.join(name);
    std::fs::rename(&tmp, &path)?;
    File::open(dir)?.sync_all()?;
    Ok(path)
}

/// Appends records to a log, creating it; its cut-short tail (a crash's) is cut off first.
pub(crate) fn open_log(path: &Path) -> io::Result<File> {
    let whole = read_log(path, |_, _| false, |_| true)?;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    if f.metadata()?.len() != whole {
        f.set_len(whole)?;
    }
    f.flush()?;
    Ok(f)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("combd-bfiles-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_log_reads_back_its_whole_records_and_stops_at_a_torn_one() {
        let d = dir("log");
        let log = d.join(log_name(3));
        let rec = |seq| Record {
            seq,
            at_ms: 1000 + seq,
            wal: ([seq as u8; 8], 32 + seq),
            segment: vec![seq as u8; 10],
        };
        {
            let mut f = open_log(&log).unwrap();
            f.write_all(&encode(&rec(4))).unwrap();
            f.write_all(&encode(&rec(5))).unwrap();
            f.write_all(&encode(&rec(6))[..20]).unwrap();
        }
        let mut seen = Vec::new();
        read_log(
            &log,
            |_, _| true,
            |r| {
                seen.push(r);
                true
            },
        )
        .unwrap();
        assert_eq!(seen, vec![rec(4), rec(5)]);
        // Opened again for append, the torn tail goes.
        let mut f = open_log(&log).unwrap();
        f.write_all(&encode(&rec(6))).unwrap();
        let mut n = 0;
        read_log(
            &log,
            |_, _| false,
            |_| {
                n += 1;
                true
            },
        )
        .unwrap();
        assert_eq!(n, 3);
    }

    #[test]
    fn the_position_is_the_newest_bases_last_record() {
        let d = dir("pos");
        let key = ObjectKey::new("a", "x");
        let o = dir_of(&d, &key);
        assert_eq!(position(&d, &key).unwrap(), None);
        write_base(&o, &base_name(2, 5, None, false), |p| {
            std::fs::write(p, b"")
        })
        .unwrap();
        let salts = [7u8; 8];
        write_base(&o, &base_name(9, 6, Some((salts, 4128)), true), |p| {
            std::fs::write(p, b"db")
        })
        .unwrap();
        assert_eq!(
            position(&d, &key).unwrap(),
            Some(Position {
                seq: 9,
                wal: Some((salts, 4128))
            })
        );
        let mut f = open_log(&o.join(log_name(9))).unwrap();
        let r = Record {
            seq: 10,
            at_ms: 7,
            wal: ([1; 8], 8256),
            segment: vec![1],
        };
        f.write_all(&encode(&r)).unwrap();
        assert_eq!(
            position(&d, &key).unwrap(),
            Some(Position {
                seq: 10,
                wal: Some(([1; 8], 8256))
            })
        );
        let b = bases(&o).unwrap();
        assert_eq!((b[0].seq, b[0].wal, b[1].seq), (2, None, 9));
    }
}
