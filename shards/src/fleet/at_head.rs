//! The mark a clean close leaves beside an object's database: the head (segment number and
//! token) the file is the database of. An open that finds the coordinator's head equal to it
//! opens the file as it is instead of restoring it from the bucket.
//!
//! The mark is written only after everything committed was shipped, a snapshot at that head
//! is in the bucket, and the database was closed; and it is taken away (durably: the
//! directory synced) at the next open before anything can change the file. So a mark that
//! names the coordinator's head means no write was shipped since, and what the file may hold
//! past the head (frames committed but never shipped, so never acknowledged) is in the WAL,
//! which that open deletes; a database that was checkpointed with such frames (SQLite's close
//! after a failed shipment) never has a mark, its own having been taken at its open.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use combd_fleet::coordinator::Head;

use super::sidecar;

/// What a mark's one line starts with.
const MAGIC: &str = "combd fleet head v1";

/// Syncs the directory `path` is in (a rename or a removal in it made durable).
fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => File::open(dir)?.sync_all(),
        _ => File::open(".")?.sync_all(),
    }
}

/// Marks the database at `path` as `head`'s: written beside it, synced, renamed into place,
/// the directory synced.
pub(super) fn mark(path: &Path, head: Head) -> std::io::Result<()> {
    let tmp = sidecar(path, "-fleet-at.tmp");
    let mut f = File::create(&tmp)?;
    writeln!(f, "{MAGIC} {} {}", head.seq, head.token)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, sidecar(path, "-fleet-at"))?;
    sync_dir(path)
}

/// The head the database at `path` was marked at, if a mark was there; the mark is removed,
/// and the removal synced, before this returns. A mark that does not parse counts as none.
pub(super) fn take(path: &Path) -> std::io::Result<Option<Head>> {
    let marker = sidecar(path, "-fleet-at");
    let text = match std::fs::read_to_string(&marker) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    std::fs::remove_file(&marker)?;
    sync_dir(path)?;
    Ok(parse(&text))
}

/// A mark's head.
fn parse(text: &str) -> Option<Head> {
    let rest = text
        .strip_suffix('\n')?
        .strip_prefix(MAGIC)?
        .strip_prefix(' ')?;
    let (seq, token) = rest.split_once(' ')?;
    Some(Head {
        seq: seq.parse().ok()?,
        token: token.parse().ok()?,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_read_once_and_gone_after() {
        let dir = std::env::temp_dir().join(format!("combd-at-head-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let db = dir.join("o.sqlite");
        assert_eq!(take(&db).unwrap(), None);
        let head = Head { seq: 7, token: 42 };
        mark(&db, head).unwrap();
        assert_eq!(take(&db).unwrap(), Some(head));
        assert_eq!(take(&db).unwrap(), None, "taken once");
        std::fs::write(sidecar(&db, "-fleet-at"), "combd fleet head v1 7\n").unwrap();
        assert_eq!(take(&db).unwrap(), None, "a torn mark is none");
        assert!(!sidecar(&db, "-fleet-at").exists());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn only_a_whole_mark_parses() {
        assert_eq!(
            parse("combd fleet head v1 3 -1\n"),
            Some(Head { seq: 3, token: -1 })
        );
        for bad in [
            "",
            "combd fleet head v1 3 1",
            "combd fleet head v2 3 1\n",
            "combd fleet head v1 x 1\n",
            "combd fleet head v1 3 1 2\n",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
