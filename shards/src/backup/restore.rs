//! Rebuilding an object from the backup as it was after one of its batches: named by its
//! number, by a moment (its last batch committed then or before), or its latest. The object's
//! newest base at or before that batch is copied, the segments after it are written over it
//! (`combd_fleet::segment::restore_onto`), and the result is checked (`PRAGMA
//! integrity_check`) before anything uses it.

use std::path::Path;

use combd_fleet::segment::{restore_onto, Segment};

use crate::object_key::ObjectKey;

use super::files::Base;
use super::Target;

/// Which of an object's batches a restore rebuilds it as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// After batch `seq`.
    Seq(u64),
    /// At a moment (milliseconds since the Unix epoch): after its last batch committed then or
    /// before.
    Time(u64),
    /// After its latest batch in the backup.
    Latest,
}

impl At {
    /// `latest`, a batch's number, or an RFC 3339 time (`2026-12-05T17:30:00Z`, with a
    /// fraction of a second and an offset if wanted).
    pub fn parse(text: &str) -> Result<At, String> {
        let t = text.trim();
        if t == "latest" {
            return Ok(At::Latest);
        }
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            return t
                .parse()
                .map(At::Seq)
                .map_err(|_| format!("{t:?}: a batch number too large"));
        }
        rfc3339_ms(t).map(At::Time).ok_or_else(|| {
            format!("{t:?}: expected latest, a batch number, or an RFC 3339 time such as 2026-12-05T17:30:00Z")
        })
    }
}

/// Days from 1970-01-01 to a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// An RFC 3339 time as milliseconds since the Unix epoch.
fn rfc3339_ms(t: &str) -> Option<u64> {
    let b = t.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = t.get(r)?;
        s.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| s.parse().ok())?
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    if h > 23 || mi > 59 || s > 60 {
        return None;
    }
    let mut at = 19;
    let mut ms = 0i64;
    if b.get(at) == Some(&b'.') {
        let start = at + 1;
        at = start;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        let frac = t.get(start..at)?;
        let padded: String = frac.chars().chain("000".chars()).take(3).collect();
        ms = padded.parse().ok()?;
    }
    let offset_min = match t.get(at..)? {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) && &o[3..4] == ":" => {
            let sign = if o.starts_with('-') { -1 } else { 1 };
            sign * (num(at + 1..at + 3)? * 60 + num(at + 4..at + 6)?)
        }
        _ => return None,
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset_min * 60;
    u64::try_from(secs * 1000 + ms).ok()
}

/// What a restore rebuilt: the batch, when it committed, and whether the object existed then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Built {
    /// The batch.
    pub seq: u64,
    /// When it committed (milliseconds since the Unix epoch).
    pub at_ms: u64,
}

/// Why a restore could not be made.
#[derive(Debug)]
pub enum RestoreError {
    /// The backup has no such batch (or nothing at that moment, or nothing of the object).
    NotFound(String),
    /// The object had no database after that batch: deleted, or not made yet.
    NoObject {
        /// The batch.
        seq: u64,
    },
    /// Reading or writing failed, or what was rebuilt failed its check.
    Failed(String),
}

impl std::fmt::Display for RestoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RestoreError::NotFound(m) | RestoreError::Failed(m) => f.write_str(m),
            RestoreError::NoObject { seq } => {
                write!(f, "the object had no database after batch {seq}")
            }
        }
    }
}

fn failed(e: impl std::fmt::Display) -> RestoreError {
    RestoreError::Failed(e.to_string())
}

/// The batch `at` names among the backup's of `key` in `target`, when it committed, and the
/// base it is rebuilt from.
fn resolve(target: &Target, key: &ObjectKey, at: At) -> Result<(u64, u64, Base), RestoreError> {
    let bases = target.bases(key).map_err(failed)?;
    if bases.is_empty() {
        return Err(RestoreError::NotFound(
            "the backup has nothing of the object".into(),
        ));
    }
    for base in bases.iter().rev() {
        if let At::Seq(s) = at {
            if base.seq > s {
                continue;
            }
        }
        if let At::Time(t) = at {
            if base.at_ms > t {
                continue;
            }
        }
        let mut found = (base.seq, base.at_ms);
        target
            .read_log(
                key,
                base.seq,
                |_, _| false,
                |r| {
                    let fits = match at {
                        At::Seq(s) => r.seq <= s,
                        At::Time(t) => r.at_ms <= t,
                        At::Latest => true,
                    };
                    if fits {
                        found = (r.seq, r.at_ms);
                    }
                    fits
                },
            )
            .map_err(failed)?;
        if let At::Seq(s) = at {
            if found.0 != s {
                return Err(RestoreError::NotFound(format!(
                    "the backup has no batch {s} (the chain it would be in ends at {})",
                    found.0
                )));
            }
        }
        return Ok((found.0, found.1, base.clone()));
    }
    Err(RestoreError::NotFound(
        "the backup has nothing of the object that early (or it was pruned)".into(),
    ))
}

/// Writes `key` as of `at`, from the backup in `target`, to `out` (replaced), checked. Blocks.
pub fn build(target: &Target, key: &ObjectKey, at: At, out: &Path) -> Result<Built, RestoreError> {
    let (seq, at_ms, base) = resolve(target, key, at)?;
    let mut segments = Vec::new();
    let mut bad = None;
    target
        .read_log(
            key,
            base.seq,
            |s, _| s <= seq,
            |r| {
                if r.seq > seq {
                    return false;
                }
                match Segment::decode(&r.segment) {
                    Ok(s) => segments.push(s),
                    Err(e) => bad = Some(e.to_string()),
                }
                bad.is_none()
            },
        )
        .map_err(failed)?;
    if let Some(e) = bad {
        return Err(RestoreError::Failed(format!("a segment is corrupt: {e}")));
    }
    if !base.exists && segments.is_empty() {
        return Err(RestoreError::NoObject { seq });
    }
    if base.exists {
        target.fetch_base(key, &base, out).map_err(failed)?;
    } else {
        std::fs::write(out, b"").map_err(failed)?;
    }
    let reached = restore_onto(out, true, base.seq, &segments).map_err(failed)?;
    if reached != seq {
        return Err(RestoreError::Failed(format!(
            "the segments stop at batch {reached}, not {seq}"
        )));
    }
    check(out)?;
    Ok(Built { seq, at_ms })
}

/// `PRAGMA integrity_check` of a rebuilt database.
fn check(path: &Path) -> Result<(), RestoreError> {
    let db = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(failed)?;
    let verdict: String = db
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(failed)?;
    if verdict != "ok" {
        return Err(RestoreError::Failed(format!(
            "the rebuilt database fails its check: {verdict}"
        )));
    }
    Ok(())
}

/// An object's batches in the backup: its bases and, of the newest `limit`, each segment's
/// number and time.
pub fn history(
    target: &Target,
    key: &ObjectKey,
    limit: usize,
) -> std::io::Result<serde_json::Value> {
    let bases = target.bases(key)?;
    let mut batches = std::collections::VecDeque::new();
    for b in &bases {
        target.read_log(
            key,
            b.seq,
            |_, _| false,
            |r| {
                if batches.len() == limit {
                    batches.pop_front();
                }
                batches.push_back(serde_json::json!({ "seq": r.seq, "at_ms": r.at_ms }));
                true
            },
        )?;
    }
    let bases: Vec<serde_json::Value> = bases
        .iter()
        .map(|b| serde_json::json!({ "seq": b.seq, "at_ms": b.at_ms, "exists": b.exists }))
        .collect();
    Ok(serde_json::json!({ "bases": bases, "batches": Vec::from(batches) }))
}

/// Restores every object of the backup in `target`, as of its latest batch, into the data
/// directory `data`, which must hold no object's database yet (a node restored whole onto an
/// empty disk). Returns how many were restored, and how many had no database at their latest
/// batch (deleted). Blocks; run with no node on `data`.
pub fn restore_all(target: &Target, data: &Path) -> Result<(u64, u64), String> {
    let objects = data.join("objects");
    let holds = |d: &Path| {
        std::fs::read_dir(d)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                std::fs::read_dir(e.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|f| f.file_name().to_string_lossy().ends_with(".sqlite"))
            })
    };
    if holds(&objects) {
        return Err(format!(
            "{} holds objects already: restore a whole node onto an empty data directory",
            data.display()
        ));
    }
    let (mut restored, mut absent) = (0, 0);
    let keys = target
        .objects()
        .map_err(|e| format!("{}: {e}", target.describe()))?;
    for key in keys {
        let out = crate::app::object_path(data, key.app(), key.name());
        let tmp = crate::object_files::sidecar(&out, "-restoring");
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        match build(target, &key, At::Latest, &tmp) {
            Ok(_) => {
                std::fs::rename(&tmp, &out).map_err(|e| format!("{key}: {e}"))?;
                restored += 1;
            }
            Err(RestoreError::NoObject { .. }) => absent += 1,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(format!("{key}: {e}"));
            }
        }
    }
    Ok((restored, absent))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_parse_as_rfc_3339_and_batches_as_numbers() {
        assert_eq!(At::parse("latest"), Ok(At::Latest));
        assert_eq!(At::parse("42"), Ok(At::Seq(42)));
        assert_eq!(At::parse("1970-01-01T00:00:00Z"), Ok(At::Time(0)));
        assert_eq!(
            At::parse("2026-12-05T17:30:00.25Z"),
            Ok(At::Time(1_796_491_800_250))
        );
        assert_eq!(
            At::parse("2026-12-05T18:30:00+01:00"),
            Ok(At::Time(1_796_491_800_000))
        );
        for bad in [
            "",
            "yesterday",
            "2026-13-05T17:30:00Z",
            "2026-12-05T17:30:00",
            "-1",
        ] {
            assert!(At::parse(bad).is_err(), "{bad}");
        }
    }
}
