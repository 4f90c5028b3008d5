//! Segments from a real SQLite WAL and restores from them, with no server: what the commit
//! task packs after each batch, and what a node gets back. Every restored database passes
//! `PRAGMA integrity_check` and holds exactly the rows of the original at that point.

#![allow(clippy::unwrap_used)]

mod support;

use combd_fleet::segment::{restore, Segment, SegmentError, WalCursor};
use combd_kernel::limits::FLEET_SEGMENT_MAX_BYTES;
use support::db::{open_checked, rows, Db};
use support::temp_dir;

const TOKEN: i64 = 41;

/// A common table `s(value)` of 1 to `n` (the bundled SQLite has no generate_series).
fn series(n: usize) -> String {
    format!(
        "WITH RECURSIVE s(value) AS (SELECT 1 UNION ALL SELECT value + 1 FROM s WHERE value < {n})"
    )
}

#[test]
fn a_committed_batch_packs_as_one_segment_and_reads_back() {
    let dir = temp_dir("segment");
    let db = Db::create(&dir);
    let mut cursor = WalCursor::new();
    // The WAL holds the schema's transaction: the first segment.
    let first = cursor
        .next_segment(&db.wal_path(), "room", 1, TOKEN, 0)
        .unwrap()
        .expect("the schema's frames");
    assert!(first.frame_count() >= 1);
    // Nothing committed since: nothing to ship.
    assert_eq!(
        cursor
            .next_segment(&db.wal_path(), "room", 2, TOKEN, TOKEN)
            .unwrap(),
        None
    );

    db.commit("INSERT INTO t(v) VALUES ('a'), ('b')");
    let seg = cursor
        .next_segment(&db.wal_path(), "room", 2, TOKEN, TOKEN)
        .unwrap()
        .unwrap();
    assert_eq!(
        (seg.object.as_str(), seg.seq, seg.token, seg.prev_token),
        ("room", 2, TOKEN, TOKEN)
    );
    let page: u32 = db
        .conn
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .unwrap();
    assert_eq!(seg.page_size, page);
    // Its last frame commits, recording the database's size in pages.
    let (_, db_pages, _) = seg.frames().last().unwrap();
    let pages: u32 = db
        .conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    assert_eq!(db_pages, pages);
    assert_eq!(
        cursor.offset(),
        std::fs::metadata(db.wal_path()).unwrap().len()
    );

    let bytes = seg.encode();
    assert_eq!(Segment::decode(&bytes).unwrap(), seg);
    // A flipped byte anywhere, or a cut, is caught.
    for at in [0, 20, bytes.len() / 2, bytes.len() - 1] {
        let mut bad = bytes.clone();
        bad[at] ^= 0x40;
        assert!(
            matches!(Segment::decode(&bad), Err(SegmentError::Malformed(_))),
            "a flip at byte {at} went unnoticed"
        );
    }
    assert!(Segment::decode(&bytes[..bytes.len() - 5]).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn restoring_a_snapshot_and_its_segments_gives_the_same_database_at_every_step() {
    let dir = temp_dir("restore");
    let db = Db::create(&dir);
    // The snapshot is taken after the schema (segment 0 is the snapshot's state).
    let snapshot = db.snapshot();
    let mut cursor = WalCursor::new();
    let mut segments: Vec<Segment> = Vec::new();
    let mut states: Vec<Vec<String>> = vec![rows(&db.conn)];
    let batches: Vec<String> = vec![
        "INSERT INTO t(v) VALUES ('one'), ('two'), ('three')".into(),
        "UPDATE t SET v = v || '!' WHERE id = 2".into(),
        // Many pages in one transaction (and overflow pages for the blobs).
        format!(
            "{} INSERT INTO t(v, b) SELECT 'blob' || value, randomblob(3000) FROM s",
            series(200)
        ),
        "DELETE FROM t WHERE id % 3 = 0".into(),
        "CHECKPOINT".into(),
        // After a full checkpoint the WAL starts over with new salts: the cursor follows.
        "INSERT INTO t(v) VALUES ('after checkpoint')".into(),
        "DELETE FROM t WHERE b IS NOT NULL".into(),
        // VACUUM rewrites the database smaller: the commit frame's size truncates the file.
        "VACUUM".into(),
        "INSERT INTO t(v) VALUES ('last')".into(),
    ];
    for sql in &batches {
        match sql.as_str() {
            "CHECKPOINT" => {
                db.checkpoint();
                continue;
            }
            "VACUUM" => db.conn.execute_batch("VACUUM").unwrap(),
            _ => db.commit(sql),
        }
        let seq = segments.len() as u64 + 1;
        let prev = if seq == 1 { 0 } else { TOKEN };
        let seg = cursor
            .next_segment(&db.wal_path(), "room", seq, TOKEN, prev)
            .unwrap()
            .unwrap_or_else(|| panic!("no segment after {sql:?}"));
        // Shipped bytes, read back: what a restore gets from the bucket.
        segments.push(Segment::decode(&seg.encode()).unwrap());
        states.push(rows(&db.conn));
    }
    let file_pages: u64 = db
        .conn
        .query_row("PRAGMA page_count", [], |r| r.get(0))
        .unwrap();
    for n in 0..=segments.len() {
        let out = dir.join(format!("restored-{n}.sqlite"));
        let at = restore(&out, Some(&snapshot), 0, &segments[..n]).unwrap();
        assert_eq!(at, n as u64);
        let restored = open_checked(&out);
        assert_eq!(rows(&restored), states[n], "after {n} segments");
        if n == segments.len() {
            let pages: u64 = restored
                .query_row("PRAGMA page_count", [], |r| r.get(0))
                .unwrap();
            assert_eq!(pages, file_pages, "the vacuumed size");
            assert_eq!(std::fs::metadata(&out).unwrap().len(), pages * 4096);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_restore_refuses_a_gap_or_a_broken_owner_chain() {
    let dir = temp_dir("gap");
    let db = Db::create(&dir);
    let snapshot = db.snapshot();
    let mut cursor = WalCursor::new();
    let mut segs = Vec::new();
    for (i, token) in [(1u64, 5i64), (2, 5), (3, 9)] {
        db.commit(&format!("INSERT INTO t(v) VALUES ('{i}')"));
        let prev = segs.last().map_or(0, |s: &Segment| s.token);
        segs.push(
            cursor
                .next_segment(&db.wal_path(), "room", i, token, prev)
                .unwrap()
                .unwrap(),
        );
    }
    let out = dir.join("out.sqlite");
    assert_eq!(restore(&out, Some(&snapshot), 0, &segs).unwrap(), 3);
    // Segment 2 missing.
    let gap = [segs[0].clone(), segs[2].clone()];
    match restore(&out, Some(&snapshot), 0, &gap) {
        Err(SegmentError::Gap {
            expected: 2,
            found: 3,
        }) => {}
        other => panic!("expected a gap at 2, got {other:?}"),
    }
    // The snapshot is at 1 but the segments start at 1 again.
    assert!(matches!(
        restore(&out, Some(&snapshot), 1, &segs),
        Err(SegmentError::Gap {
            expected: 2,
            found: 1
        })
    ));
    // Segment 3 names token 5 before it; one by token 7 in its place breaks the chain.
    let mut forged = segs.clone();
    let bytes = forged[1].encode();
    let mut seg2 = Segment::decode(&bytes).unwrap();
    seg2.token = 7;
    forged[1] = seg2;
    assert!(matches!(
        restore(&out, Some(&snapshot), 0, &forged),
        Err(SegmentError::Malformed(_))
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_transaction_larger_than_a_segment_is_refused_not_cut() {
    let dir = temp_dir("large");
    let db = Db::create(&dir);
    let mut cursor = WalCursor::new();
    cursor
        .next_segment(&db.wal_path(), "room", 1, TOKEN, 0)
        .unwrap()
        .unwrap();
    // One transaction of more pages than a segment holds.
    let blob_bytes = 1 << 20;
    let rows_over = FLEET_SEGMENT_MAX_BYTES / blob_bytes + 1;
    db.commit(&format!(
        "{} INSERT INTO t(v, b) SELECT 'big', zeroblob({blob_bytes}) FROM s",
        series(rows_over)
    ));
    match cursor.next_segment(&db.wal_path(), "room", 2, TOKEN, TOKEN) {
        Err(SegmentError::TooLarge { bytes, limit }) => {
            assert_eq!(limit, FLEET_SEGMENT_MAX_BYTES);
            assert!(bytes > limit as u64);
        }
        other => panic!(
            "expected TooLarge, got {:?}",
            other.map(|s| s.map(|s| s.frame_count()))
        ),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn transactions_that_together_overflow_a_segment_split_at_a_commit() {
    let dir = temp_dir("split");
    let db = Db::create(&dir);
    let snapshot = db.snapshot();
    let mut cursor = WalCursor::new();
    // Three transactions of a little over a third of a segment each: two fit in one segment,
    // the third goes to the next.
    let blob_bytes = 1 << 20;
    let per_txn = FLEET_SEGMENT_MAX_BYTES / blob_bytes / 3 + 1;
    for _ in 0..3 {
        db.commit(&format!(
            "{} INSERT INTO t(v, b) SELECT 'part', randomblob({blob_bytes}) FROM s",
            series(per_txn)
        ));
    }
    let mut segs = Vec::new();
    while let Some(seg) = cursor
        .next_segment(&db.wal_path(), "room", segs.len() as u64 + 1, TOKEN, TOKEN)
        .unwrap()
    {
        assert!(seg.encode().len() <= FLEET_SEGMENT_MAX_BYTES);
        segs.push(seg);
    }
    assert_eq!(segs.len(), 2, "two segments for three transactions");
    let commits = |s: &Segment| s.frames().filter(|(_, size, _)| *size != 0).count();
    assert_eq!((commits(&segs[0]), commits(&segs[1])), (2, 1));
    let out = dir.join("out.sqlite");
    assert_eq!(restore(&out, Some(&snapshot), 0, &segs).unwrap(), 2);
    assert_eq!(rows(&open_checked(&out)), rows(&db.conn));
    let _ = std::fs::remove_dir_all(&dir);
}

/// SQLite starts a WAL over after a `RESTART` checkpoint without shortening it: the new
/// generation's frames come first, the older one's after them. The cursor packs the new frames
/// only, says it reached their end, and never reads far into the older ones.
#[test]
fn after_a_restart_the_cursor_packs_the_new_generation_only() {
    let dir = temp_dir("restart");
    let db = Db::create(&dir);
    let mut cursor = WalCursor::new();
    db.commit(&format!(
        "{} INSERT INTO t(v) SELECT printf('%0500d', value) FROM s",
        series(2000)
    ));
    let mut seq = 0;
    while cursor
        .next_segment(&db.wal_path(), "room", seq + 1, TOKEN, TOKEN)
        .unwrap()
        .is_some()
    {
        seq += 1;
    }
    assert!(cursor.at_end());
    let long = std::fs::metadata(db.wal_path()).unwrap().len();
    let busy: i64 = db
        .conn
        .query_row("PRAGMA wal_checkpoint(RESTART)", [], |r| r.get(0))
        .unwrap();
    assert_eq!(busy, 0);
    db.commit("INSERT INTO t(v) VALUES ('after')");
    assert_eq!(
        std::fs::metadata(db.wal_path()).unwrap().len(),
        long,
        "the WAL kept its length"
    );
    let seg = cursor
        .next_segment(&db.wal_path(), "room", seq + 1, TOKEN, TOKEN)
        .unwrap()
        .expect("the new transaction");
    assert!(seg.frame_count() <= 4, "{} frames", seg.frame_count());
    assert!(
        cursor.at_end(),
        "the older generation's frames are not this one's"
    );
    assert!(cursor.offset() < long / 10);
    assert_eq!(
        cursor
            .next_segment(&db.wal_path(), "room", seq + 2, TOKEN, TOKEN)
            .unwrap(),
        None
    );
    let _ = std::fs::remove_dir_all(&dir);
}
