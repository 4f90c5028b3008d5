//! The whole path with real parts: an owner ships each committed batch (segment uploaded, then
//! the head advanced, fenced by its token) to a real S3 server and a real etcd; another node
//! claims the object once the first one's lease is gone, restores it from the bucket, and goes
//! on; the stale owner's next batch is fenced and never read by a restore.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use combd_fleet::bucket::Bucket;
use combd_fleet::coordinator::{Advance, Claim, Coordinator, Head, Snapshot};
use combd_fleet::restore::{restore_object, restore_object_within, RestoreError, Restored};
use combd_fleet::segment::WalCursor;
use combd_fleet::ship::{prune, ship_segment, ship_snapshot};
use combd_fleet::{keys, Failure};
use combd_kernel::limits::FLEET_LIST_KEYS_MAX;
use support::db::{open_checked, rows, Db};
use support::{temp_dir, Etcd, S3};

/// An owner of one object: its database, where shipping stands, and its token.
struct Owner {
    db: Db,
    cursor: WalCursor,
    object: String,
    token: i64,
    /// The last segment shipped (seq, token).
    head: (u64, i64),
}

impl Owner {
    /// The owner of `object` that won its claim (made `token`), its database new in `dir`.
    fn new(dir: &std::path::Path, object: &str, token: i64) -> Owner {
        Owner {
            db: Db::create(dir),
            cursor: WalCursor::new(),
            object: object.to_string(),
            token,
            head: (0, 0),
        }
    }

    /// Packs what committed since the last call and ships it; the coordinator's answer.
    fn ship(&mut self, bucket: &Bucket, c: &Coordinator) -> Advance {
        let seq = self.head.0 + 1;
        let seg = self
            .cursor
            .next_segment(
                &self.db.wal_path(),
                &self.object,
                seq,
                self.token,
                self.head.1,
            )
            .unwrap()
            .expect("a committed batch to ship");
        let advance = ship_segment(bucket, c, &seg).unwrap();
        if advance == Advance::Done {
            self.head = (seq, self.token);
        }
        advance
    }

    fn commit_and_ship(&mut self, sql: &str, bucket: &Bucket, c: &Coordinator) -> Advance {
        self.db.commit(sql);
        self.ship(bucket, c)
    }

    /// The snapshot this owner takes at its head.
    fn snapshot_at_head(&self) -> Snapshot {
        Snapshot {
            seq: self.head.0,
            token: self.head.1,
            writer: self.token,
        }
    }

    /// Ships its database as the snapshot at its head; the coordinator's answer.
    fn ship_snapshot(&self, bucket: &Bucket, c: &Coordinator) -> Advance {
        let file = file_of(&self.db.snapshot());
        ship_snapshot(bucket, c, &self.object, self.snapshot_at_head(), &file).unwrap()
    }
}

/// A new file holding `bytes` (a snapshot is shipped from a file, streamed).
fn file_of(bytes: &[u8]) -> std::path::PathBuf {
    let path = temp_dir("snapshot-file").join("snapshot.sqlite");
    std::fs::write(&path, bytes).unwrap();
    path
}

/// `object` restored to `out` as a node does: from the head and the snapshot the coordinator
/// records now.
fn restore_now(
    bucket: &Bucket,
    c: &Coordinator,
    object: &str,
    out: &std::path::Path,
) -> Result<Restored, RestoreError> {
    let (head, recorded) = c.state(object).unwrap();
    restore_object(bucket, object, head, recorded, out)
}

#[test]
fn another_node_restores_every_shipped_write_and_the_stale_owner_is_fenced() {
    let test = "another_node_restores_every_shipped_write_and_the_stale_owner_is_fenced";
    let Some((bucket, c, object, _servers)) = fleet_for(test, "room") else {
        return;
    };
    let ttl = Duration::from_secs(30);
    let (lease_a, lease_b) = (c.grant_lease(ttl).unwrap(), c.grant_lease(ttl).unwrap());

    // Node A claims the object and ships its schema and three batches, with a snapshot
    // after the second.
    let Claim::Won(claim) = c.claim(&object, "127.0.0.2:8080", &lease_a).unwrap() else {
        panic!("A's first claim must win");
    };
    let dir_a = temp_dir("node-a");
    let mut a = Owner::new(&dir_a, &object, claim.token);
    assert_eq!(a.ship(&bucket, &c), Advance::Done);
    assert_eq!(
        a.commit_and_ship("INSERT INTO t(v) VALUES ('a1'), ('a2')", &bucket, &c),
        Advance::Done
    );
    let snap_head = a.snapshot_at_head();
    assert_eq!(a.ship_snapshot(&bucket, &c), Advance::Done);
    assert_eq!(
        a.commit_and_ship("UPDATE t SET v = v || '+' WHERE v = 'a1'", &bucket, &c),
        Advance::Done
    );
    assert_eq!(
        a.commit_and_ship(
            "INSERT INTO t(v, b) VALUES ('blob', randomblob(20000))",
            &bucket,
            &c
        ),
        Advance::Done
    );
    assert_eq!(
        c.head(&object).unwrap(),
        Some(Head {
            seq: 4,
            token: a.token
        })
    );
    let acknowledged_by_a = rows(&a.db.conn);

    // A's lease ends (revoked here; a lapse is the coordinator test's), and B claims.
    c.revoke(&lease_a).unwrap();
    let Claim::Won(claim_b) = c.claim(&object, "127.0.0.3:8080", &lease_b).unwrap() else {
        panic!("B's claim after A's lease ended must win");
    };
    assert!(claim_b.token > a.token);

    // B restores from the bucket: the snapshot and the two segments after it.
    let dir_b = temp_dir("node-b");
    let path_b = dir_b.join("object.sqlite");
    let (head, recorded) = c.state(&object).unwrap();
    assert_eq!(recorded, Some(snap_head));
    let restored = restore_object(&bucket, &object, head, recorded, &path_b).unwrap();
    assert_eq!(
        restored,
        Restored {
            snapshot: Some((snap_head.seq, snap_head.token)),
            segments: 2,
            seq: 4
        }
    );
    assert_eq!(
        rows(&open_checked(&path_b)),
        acknowledged_by_a,
        "every write A shipped"
    );
    // A restore holds at most FLEET_RESTORE_SEGMENTS_MAX_BYTES of segments (256 MiB): crossed
    // here with a bound of the two segments' own bytes. At it, the restore is whole; one byte
    // below, it fails before writing anything.
    let segment_bytes: u64 = [3, 4]
        .iter()
        .map(|&seq| {
            let key = keys::segment(&object, seq, a.token);
            // What a restore holds of it: its bytes without their seal.
            bucket.get_sealed(&key, u64::MAX).unwrap().unwrap().len() as u64
        })
        .sum();
    let path_at = dir_b.join("at-bound.sqlite");
    let at =
        restore_object_within(&bucket, &object, head, recorded, &path_at, segment_bytes).unwrap();
    assert_eq!(at, restored);
    assert_eq!(rows(&open_checked(&path_at)), acknowledged_by_a);
    let path_past = dir_b.join("past-bound.sqlite");
    let e = restore_object_within(
        &bucket,
        &object,
        head,
        recorded,
        &path_past,
        segment_bytes - 1,
    )
    .unwrap_err();
    assert!(
        matches!(e, RestoreError::TooLarge { limit } if limit == segment_bytes - 1),
        "{e}"
    );
    assert!(!path_past.exists(), "nothing written by a failed restore");

    // A does not know yet: its next batch uploads, but the head advance is fenced, so A must
    // not acknowledge it.
    assert_eq!(
        a.commit_and_ship("INSERT INTO t(v) VALUES ('stale write')", &bucket, &c),
        Advance::Fenced
    );
    // B goes on from the head it restored, shipping segment 5 as well.
    let mut b = Owner {
        db: Db::open(&path_b),
        cursor: WalCursor::new(),
        object: object.clone(),
        token: claim_b.token,
        head: (4, a.token),
    };
    assert_eq!(
        b.commit_and_ship("INSERT INTO t(v) VALUES ('b1')", &bucket, &c),
        Advance::Done
    );
    // Both segments 5 are in the bucket, under their own tokens: the stale one overwrote
    // nothing.
    let fives: Vec<String> = bucket
        .list(&keys::segment_prefix(&object), FLEET_LIST_KEYS_MAX)
        .unwrap()
        .into_iter()
        .filter(|k| keys::parse_segment(k).is_some_and(|(seq, _)| seq == 5))
        .collect();
    assert_eq!(
        fives,
        [
            keys::segment(&object, 5, a.token),
            keys::segment(&object, 5, b.token)
        ]
    );

    // A third node restores: B's write is there, A's stale one is not.
    let dir_c = temp_dir("node-c");
    let path_c = dir_c.join("object.sqlite");
    let restored = restore_now(&bucket, &c, &object, &path_c).unwrap();
    assert_eq!(restored.seq, 5);
    let rows_c = rows(&open_checked(&path_c));
    assert_eq!(rows_c, rows(&b.db.conn));
    assert!(rows_c.iter().any(|r| r.contains("|b1|")));
    assert!(!rows_c.iter().any(|r| r.contains("stale write")));

    // A segment the chain needs, gone from the bucket, fails the restore naming it.
    bucket.delete(&keys::segment(&object, 5, b.token)).unwrap();
    let path_d = dir_c.join("missing.sqlite");
    let e = restore_now(&bucket, &c, &object, &path_d).unwrap_err();
    assert!(e.to_string().contains("segment 5"), "{e}");

    // B snapshots at its head: pruning then deletes every segment at or before it (the stale
    // segment 5 of A too) and the older snapshot, and a restore reads the snapshot alone.
    let snap_b = b.snapshot_at_head();
    assert_eq!((snap_b.seq, snap_b.token), (5, b.token));
    assert_eq!(b.ship_snapshot(&bucket, &c), Advance::Done);
    let before = bucket
        .list(&keys::object_prefix(&object), FLEET_LIST_KEYS_MAX)
        .unwrap();
    let pruned = prune(&bucket, &object, snap_b).unwrap();
    let left = bucket
        .list(&keys::object_prefix(&object), FLEET_LIST_KEYS_MAX)
        .unwrap();
    assert_eq!(
        left,
        [keys::snapshot(&object, &snap_b)],
        "before: {before:?}"
    );
    assert_eq!(pruned, before.len() - 1);
    let path_e = dir_c.join("pruned.sqlite");
    let restored = restore_now(&bucket, &c, &object, &path_e).unwrap();
    assert_eq!(
        restored,
        Restored {
            snapshot: Some((5, b.token)),
            segments: 0,
            seq: 5
        }
    );
    assert_eq!(rows(&open_checked(&path_e)), rows(&b.db.conn));
    // And the chain goes on from it.
    assert_eq!(
        b.commit_and_ship("INSERT INTO t(v) VALUES ('b2')", &bucket, &c),
        Advance::Done
    );
    let path_f = dir_c.join("after-prune.sqlite");
    let restored = restore_now(&bucket, &c, &object, &path_f).unwrap();
    assert_eq!((restored.segments, restored.seq), (1, 6));
    assert_eq!(rows(&open_checked(&path_f)), rows(&b.db.conn));

    for d in [dir_a, dir_b, dir_c] {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[test]
fn shipping_fails_when_the_bucket_is_unreachable_and_nothing_advances() {
    let test = "shipping_fails_when_the_bucket_is_unreachable";
    let Some(etcd) = Etcd::start(test) else {
        return;
    };
    let c = Coordinator::new(std::slice::from_ref(&etcd.endpoint), "combd-test/");
    let lease = c.grant_lease(Duration::from_secs(30)).unwrap();
    let Claim::Won(claim) = c.claim("room", "127.0.0.2:8080", &lease).unwrap() else {
        panic!("first claim");
    };
    let port = support::free_port();
    let bucket = Bucket::new(&combd_fleet::bucket::BucketConfig {
        endpoint: format!("http://127.0.0.1:{port}"),
        bucket: "combd-test".into(),
        region: "garage".into(),
        access_key: "GK".into(),
        secret_key: "s".into(),
    })
    .unwrap()
    .with_fleet_key(support::fleet_key());
    let dir = temp_dir("no-bucket");
    let db = Db::create(&dir);
    let seg = WalCursor::new()
        .next_segment(&db.wal_path(), "room", 1, claim.token, 0)
        .unwrap()
        .unwrap();
    match ship_segment(&bucket, &c, &seg) {
        Err(combd_fleet::ship::ShipError::Bucket(e)) => {
            assert!(matches!(e.failure, Failure::Unreachable(_)), "{e}")
        }
        other => panic!("expected the upload to fail, got {other:?}"),
    }
    // The head did not move: the batch is not in the fleet and must not be acknowledged.
    assert_eq!(c.head("room").unwrap(), None);
    let _ = std::fs::remove_dir_all(dir);
}

/// A fleet of one owner for `test`: the bucket (sealing with the tests' key), the coordinator,
/// the servers (kept alive by the caller), and an owner that claimed object `<prefix>name`
/// and shipped its schema and one batch with a 20 KB blob; `None` where etcd or Garage is not
/// installed.
fn one_shipped_owner(test: &str, name: &str) -> Option<(Bucket, Coordinator, Owner, (Etcd, S3))> {
    let (bucket, c, object, servers) = fleet_for(test, name)?;
    let lease = c.grant_lease(Duration::from_secs(30)).unwrap();
    let Claim::Won(claim) = c.claim(&object, "127.0.0.2:8080", &lease).unwrap() else {
        panic!("first claim");
    };
    let mut a = Owner::new(&temp_dir(name), &object, claim.token);
    assert_eq!(a.ship(&bucket, &c), Advance::Done);
    assert_eq!(
        a.commit_and_ship(
            "INSERT INTO t(v, b) VALUES ('a1', randomblob(20000))",
            &bucket,
            &c
        ),
        Advance::Done
    );
    Some((bucket, c, a, servers))
}

/// The servers of a fleet for `test` (kept alive by the caller), its bucket (sealing with the
/// tests' key), its coordinator, and an object `<prefix>name` no other run uses; `None` where
/// etcd or Garage is not installed.
fn fleet_for(test: &str, name: &str) -> Option<(Bucket, Coordinator, String, (Etcd, S3))> {
    let etcd = Etcd::start(test)?;
    let s3 = S3::start(test)?;
    let bucket = Bucket::new(&s3.bucket)
        .unwrap()
        .with_fleet_key(support::fleet_key());
    let c = Coordinator::new(std::slice::from_ref(&etcd.endpoint), "combd-test/");
    let object = format!("{}{name}", s3.unique_prefix().trim_end_matches('/'));
    Some((bucket, c, object, (etcd, s3)))
}

#[test]
fn what_the_fleet_key_did_not_seal_for_its_key_is_never_restored() {
    let Some((bucket, c, a, (_etcd, s3))) = one_shipped_owner(
        "what_the_fleet_key_did_not_seal_is_never_restored",
        "sealed",
    ) else {
        return;
    };
    let other_fleet = Bucket::new(&s3.bucket)
        .unwrap()
        .with_fleet_key(std::sync::Arc::new(
            combd_fleet::auth::parse_fleet_key("some-other-fleet-key-0123456789abcdef").unwrap(),
        ));
    let (object, dir) = (a.object.clone(), temp_dir("sealed-restores"));
    let head = c.head(&object).unwrap();
    let good = dir.join("good.sqlite");
    restore_now(&bucket, &c, &object, &good).unwrap();
    assert_eq!(rows(&open_checked(&good)), rows(&a.db.conn));

    let seg2 = keys::segment(&object, 2, a.token);
    let sealed = bucket.get(&seg2, 1 << 20).unwrap().unwrap();
    let not_sealed = |what: &str| {
        let e = restore_now(&bucket, &c, &object, &dir.join("bad.sqlite")).unwrap_err();
        assert!(
            matches!(&e, RestoreError::Bucket(b) if b.failure == Failure::NotSealed && b.key == seg2),
            "{what}: {e}"
        );
    };
    // One byte of the segment changed (its own CRC-32 made right again would not help: the
    // MAC covers it).
    let mut changed = sealed.clone();
    changed[40] ^= 1;
    bucket.put(&seg2, &changed).unwrap();
    not_sealed("a changed byte");
    // A segment as a node without the key would write it: no MAC at all.
    bucket.put(&seg2, &sealed[..sealed.len() - 32]).unwrap();
    not_sealed("unsealed");
    // Sealed by another fleet's key.
    other_fleet
        .put_sealed(&seg2, sealed[..sealed.len() - 32].to_vec())
        .unwrap();
    not_sealed("another fleet's key");
    // This fleet's sealed segment 1, copied to segment 2's key.
    let seg1 = bucket
        .get(&keys::segment(&object, 1, a.token), 1 << 20)
        .unwrap()
        .unwrap();
    bucket.put(&seg2, &seg1).unwrap();
    not_sealed("sealed for another key");
    // Put back, it restores again.
    bucket.put(&seg2, &sealed).unwrap();
    restore_now(&bucket, &c, &object, &dir.join("again.sqlite")).unwrap();

    // A snapshot at the head that is not sealed, recorded: refused, not restored.
    let (hs, ht) = (head.unwrap().seq, head.unwrap().token);
    let recorded = a.snapshot_at_head();
    let snap = keys::snapshot(&object, &recorded);
    bucket.put(&snap, &a.db.snapshot()).unwrap();
    assert_eq!(c.record_snapshot(&object, recorded).unwrap(), Advance::Done);
    let e = restore_now(&bucket, &c, &object, &dir.join("snap.sqlite")).unwrap_err();
    assert!(
        matches!(&e, RestoreError::Bucket(b) if b.failure == Failure::NotSealed && b.key == snap),
        "{e}"
    );
    assert_eq!(a.ship_snapshot(&bucket, &c), Advance::Done);
    let from_snapshot = dir.join("from-snapshot.sqlite");
    let restored = restore_now(&bucket, &c, &object, &from_snapshot).unwrap();
    assert_eq!(restored.snapshot, Some((hs, ht)));
    assert_eq!(rows(&open_checked(&from_snapshot)), rows(&a.db.conn));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_restored_database_that_fails_its_check_is_refused() {
    let Some((bucket, c, a, _servers)) = one_shipped_owner(
        "a_restored_database_that_fails_its_check_is_refused",
        "corrupt",
    ) else {
        return;
    };
    let (object, dir) = (a.object.clone(), temp_dir("corrupt-restores"));
    let head = c.head(&object).unwrap().unwrap();
    // A snapshot at the head, sealed by this fleet (so only the check can find it wrong), whose
    // second page is garbage: the schema's root page is fine, the table's is not.
    let mut bad = a.db.snapshot();
    let page = u16::from_be_bytes([bad[16], bad[17]]) as usize;
    for b in &mut bad[page..2 * page] {
        *b = 0xA5;
    }
    let snap = a.snapshot_at_head();
    assert_eq!(snap.head(), head);
    assert_eq!(
        ship_snapshot(&bucket, &c, &object, snap, &file_of(&bad)).unwrap(),
        Advance::Done
    );
    let out = dir.join("restored.sqlite");
    let e = restore_now(&bucket, &c, &object, &out).unwrap_err();
    assert!(matches!(e, RestoreError::Corrupt(_)), "{e}");
    // The good snapshot restores and passes.
    assert_eq!(a.ship_snapshot(&bucket, &c), Advance::Done);
    restore_now(&bucket, &c, &object, &out).unwrap();
    assert_eq!(rows(&open_checked(&out)), rows(&a.db.conn));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_snapshot_is_read_only_as_etcd_records_it_and_a_fenced_owner_records_none() {
    let test = "a_snapshot_is_read_only_as_etcd_records_it";
    let Some((bucket, c, object, _servers)) = fleet_for(test, "snaps") else {
        return;
    };
    let ttl = Duration::from_secs(30);
    let (lease_a, lease_b) = (c.grant_lease(ttl).unwrap(), c.grant_lease(ttl).unwrap());
    let Claim::Won(claim_a) = c.claim(&object, "127.0.0.2:8080", &lease_a).unwrap() else {
        panic!("A's claim");
    };
    let mut a = Owner::new(&temp_dir("snaps-a"), &object, claim_a.token);
    assert_eq!(a.ship(&bucket, &c), Advance::Done);
    assert_eq!(
        a.commit_and_ship("INSERT INTO t(v) VALUES ('a1')", &bucket, &c),
        Advance::Done
    );
    // Snapshots nobody recorded are never read: one of a writer etcd does not name (its
    // database wrong on purpose, so reading it would show), while the object has no record.
    let unrecorded = a.snapshot_at_head();
    bucket
        .put_sealed(
            &keys::snapshot(&object, &unrecorded),
            b"not a database".to_vec(),
        )
        .unwrap();
    let dir = temp_dir("snaps-restores");
    let restored = restore_now(&bucket, &c, &object, &dir.join("1.sqlite")).unwrap();
    assert_eq!((restored.snapshot, restored.segments), (None, 2));
    bucket
        .delete(&keys::snapshot(&object, &unrecorded))
        .unwrap();
    // A snapshot under the key nodes used before snapshots were recorded is still read where
    // etcd records none.
    let (hs, ht) = a.head;
    bucket
        .put_sealed(&keys::legacy_snapshot(&object, hs, ht), a.db.snapshot())
        .unwrap();
    let restored = restore_now(&bucket, &c, &object, &dir.join("2.sqlite")).unwrap();
    assert_eq!((restored.snapshot, restored.segments), (Some((hs, ht)), 0));

    // A's lease ends; B claims, restores, and snapshots the same state: its own key.
    c.revoke(&lease_a).unwrap();
    let Claim::Won(claim_b) = c.claim(&object, "127.0.0.3:8080", &lease_b).unwrap() else {
        panic!("B's claim");
    };
    let path_b = dir.join("b.sqlite");
    restore_now(&bucket, &c, &object, &path_b).unwrap();
    let b = Owner {
        db: Db::open(&path_b),
        cursor: WalCursor::new(),
        object: object.clone(),
        token: claim_b.token,
        head: a.head,
    };
    assert_eq!(b.ship_snapshot(&bucket, &c), Advance::Done);
    let snap_b = b.snapshot_at_head();
    // A, not knowing, snapshots too, at the same head: it lands under its own key, and etcd
    // does not record it.
    a.db.commit("INSERT INTO t(v) VALUES ('never shipped')");
    assert_eq!(a.ship_snapshot(&bucket, &c), Advance::Fenced);
    let snap_a = a.snapshot_at_head();
    assert_ne!(
        keys::snapshot(&object, &snap_a),
        keys::snapshot(&object, &snap_b)
    );
    assert_eq!(c.state(&object).unwrap().1, Some(snap_b));
    // So a restore reads B's, and never A's unshipped write.
    let path_c = dir.join("c.sqlite");
    let restored = restore_now(&bucket, &c, &object, &path_c).unwrap();
    assert_eq!(restored.snapshot, Some((hs, ht)));
    let rows_c = rows(&open_checked(&path_c));
    assert_eq!(rows_c, rows(&b.db.conn));
    assert!(!rows_c.iter().any(|r| r.contains("never shipped")));
    // A fenced owner cannot record a snapshot directly either.
    assert_eq!(c.record_snapshot(&object, snap_a).unwrap(), Advance::Fenced);
    assert_eq!(c.state(&object).unwrap().1, Some(snap_b));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_node_older_than_recorded_snapshots_can_share_the_fleet() {
    // A fleet upgraded node by node: a newer node recorded a snapshot; then an older node owned
    // the object, snapshotted it under the key it knows (not recorded) and pruned the segments
    // before it, the recorded snapshot's way back included. A restore still reaches a start.
    let Some((bucket, c, mut a, _servers)) =
        one_shipped_owner("a_node_older_than_recorded_snapshots", "mixed")
    else {
        return;
    };
    let object = a.object.clone();
    assert_eq!(a.ship_snapshot(&bucket, &c), Advance::Done);
    let recorded = a.snapshot_at_head();
    for v in ["b1", "b2"] {
        assert_eq!(
            a.commit_and_ship(&format!("INSERT INTO t(v) VALUES ('{v}')"), &bucket, &c),
            Advance::Done
        );
    }
    let (seq, token) = a.head;
    assert!(seq > recorded.seq);
    // What the older node does: its snapshot under the legacy key, then its prune.
    bucket
        .put_sealed(&keys::legacy_snapshot(&object, seq, token), a.db.snapshot())
        .unwrap();
    for s in 1..=seq {
        bucket.delete(&keys::segment(&object, s, token)).unwrap();
    }
    assert_eq!(c.state(&object).unwrap().1, Some(recorded));
    let dir = temp_dir("mixed-restores");
    let out = dir.join("restored.sqlite");
    let restored = restore_now(&bucket, &c, &object, &out).unwrap();
    assert_eq!(
        (restored.snapshot, restored.segments),
        (Some((seq, token)), 0)
    );
    assert_eq!(rows(&open_checked(&out)), rows(&a.db.conn));
    let _ = std::fs::remove_dir_all(dir);
}
