//! How long a restore of a 1 MiB object takes from a real bucket (issue 18's goal: ≤ 500 ms
//! from a 3-node Garage): a database of about 1 MiB shipped as the owner ships it (a snapshot,
//! then 64 committed batches as 64 segments after it), then restored from the bucket ROUNDS
//! times, each into a fresh file, and checked.
//!
//!     COMBD_FLEET_TEST_S3=endpoint,bucket,region,access_key,secret_key \
//!         cargo run --release -p combd-fleet --example restore_bench [ROUNDS]
//!
//! (`tools/fleet-env/up DIR` writes that variable into DIR/env.) Prints each restore's time
//! and their median.

#![allow(clippy::unwrap_used)]

#[path = "support/test_s3.rs"]
mod test_s3;

#[path = "../tests/support/db.rs"]
mod db;

use std::time::Instant;

use combd_fleet::coordinator::{Head, Snapshot};
use combd_fleet::keys;
use combd_fleet::restore::restore_object;
use combd_fleet::segment::WalCursor;
use combd_fleet::ship::{prune, upload_segment};

/// Segments after the snapshot.
const SEGMENTS: u64 = 64;
/// Bytes of blob in each segment's batch; the snapshot holds the rest of the 1 MiB.
const SEGMENT_BLOB: usize = 4 * 1024;

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(5, |a| a.parse().expect("ROUNDS is a number"));
    let bucket = test_s3::bucket();
    let object = format!("restore-bench-{}/room", std::process::id());
    let dir = std::env::temp_dir().join(format!("combd-restore-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // The owner: the snapshot's part in one transaction, then 64 batches.
    let owner = db::Db::create(&dir);
    let snapshot_blob = (1 << 20) - SEGMENTS as usize * SEGMENT_BLOB;
    owner.commit(&format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 64) \
         INSERT INTO t(v, b) SELECT 'base' || i, randomblob({}) FROM n",
        snapshot_blob / 64
    ));
    let token = 1;
    // The snapshot as an owner ships it, but with no coordinator to record it in: the restores
    // are told of it as a node reads it from etcd.
    let snap = Snapshot {
        seq: 1,
        token,
        writer: token,
    };
    let snapshot = owner.snapshot();
    bucket
        .put_sealed(&keys::snapshot(&object, &snap), snapshot.clone())
        .unwrap();
    let mut cursor = WalCursor::new();
    let mut head = snap.head();
    for i in 0..SEGMENTS {
        owner.commit(&format!(
            "INSERT INTO t(v, b) VALUES ('batch {i}', randomblob({SEGMENT_BLOB}))"
        ));
        let seq = head.seq + 1;
        let segment = cursor
            .next_segment(&owner.wal_path(), &object, seq, token, head.token)
            .unwrap()
            .expect("a committed batch");
        upload_segment(&bucket, &segment).unwrap();
        head = Head { seq, token };
    }
    let expected = db::rows(&owner.conn);
    let size = std::fs::metadata(&owner.path).unwrap().len()
        + std::fs::metadata(owner.wal_path()).unwrap().len();
    println!(
        "object: snapshot {} bytes + {SEGMENTS} segments ({size} bytes of database and WAL at the owner)",
        snapshot.len()
    );

    let mut times = Vec::new();
    for r in 0..rounds {
        let out = dir.join(format!("restored-{r}.sqlite"));
        let started = Instant::now();
        let restored = restore_object(&bucket, &object, Some(head), Some(snap), &out).unwrap();
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        assert_eq!(restored.segments, SEGMENTS as usize);
        assert_eq!(
            db::rows(&db::open_checked(&out)),
            expected,
            "restored as shipped"
        );
        let bytes = std::fs::metadata(&out).unwrap().len();
        println!(
            "restore {r}: {ms:.1} ms ({} segments; database {bytes} bytes)",
            restored.segments
        );
        times.push(ms);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "median {:.1} ms, min {:.1}, max {:.1} over {rounds} restores",
        times[times.len() / 2],
        times[0],
        times[times.len() - 1]
    );
    // Everything this run put in the bucket goes.
    let past = Snapshot {
        seq: head.seq + 1,
        token,
        writer: token,
    };
    prune(&bucket, &object, past).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
