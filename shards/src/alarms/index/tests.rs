//! The alarm index on real SQLite files.

#![allow(clippy::unwrap_used)]

use super::*;

fn dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("combd-alarm-index-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn none(_: &str, _: &str) -> bool {
    false
}

/// An object name whose home is `shard` of `shards`.
fn homed(shard: usize, shards: usize, tag: &str) -> String {
    (0..)
        .map(|i| format!("{tag}{i}"))
        .find(|n| home_shard("a", n, shards) == shard)
        .unwrap()
}

#[test]
fn lowering_only_lowers_and_settling_sets_or_removes() {
    let d = dir("lower");
    let ix = AlarmIndex::open(&d, 2).unwrap();
    let o = homed(1, 2, "o");
    ix.lower("a", &o, 1, 5_000, 1).unwrap();
    ix.lower("a", &o, 1, 9_000, 2).unwrap();
    assert_eq!(
        ix.due(1, 6_000, 10, none).unwrap().len(),
        1,
        "still due at 5 s"
    );
    assert!(
        ix.due(0, 6_000, 10, none).unwrap().is_empty(),
        "another shard's"
    );
    assert!(
        ix.due(1, 6_000, 10, |_, n| n == o).unwrap().is_empty(),
        "skipped"
    );
    assert_eq!(ix.pending(), (2, 1));
    // A wake's mark taken before a lower: its answer does not undo the lower.
    let early = ix.mark(1);
    ix.lower("a", &o, 1, 5_000, 2).unwrap();
    ix.settle("a", &o, 1, None, 0, early).unwrap();
    assert_eq!(ix.pending(), (2, 1), "a later lower stands");
    let mark = ix.mark(1);
    ix.settle("a", &o, 1, Some(9_000), 1, mark).unwrap();
    assert!(ix.due(1, 6_000, 10, none).unwrap().is_empty());
    ix.settle("a", &o, 1, None, 0, ix.mark(1)).unwrap();
    assert_eq!(ix.pending(), (0, 0));
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn a_lower_to_an_entry_already_due_by_then_is_not_synced() {
    let d = dir("fold");
    let ix = AlarmIndex::open(&d, 1).unwrap();
    ix.lower("a", "o", 0, 5_000, 1).unwrap();
    assert_eq!(ix.syncs(0), 1, "a new entry is synced");
    for i in 0..50 {
        ix.lower("a", "o", 0, 6_000 + i, 2 + i).unwrap();
    }
    assert_eq!(
        ix.syncs(0),
        1,
        "later alarms of an entry due earlier: no sync"
    );
    assert_eq!(ix.pending(), (51, 1), "the count follows");
    // Its number moved all the same: a wake's answer marked before it does not undo it.
    let early = ix.mark(0);
    ix.lower("a", "o", 0, 7_000, 52).unwrap();
    ix.settle("a", "o", 0, None, 0, early).unwrap();
    assert_eq!(ix.pending(), (52, 1));
    ix.lower("a", "o", 0, 4_000, 53).unwrap();
    assert_eq!(ix.syncs(0), 2, "an earlier alarm is synced");
    assert_eq!(ix.due(0, 4_000, 10, none).unwrap().len(), 1);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn lowers_waiting_for_the_lock_share_one_sync_and_shards_share_no_lock() {
    let d = dir("group");
    let ix = Arc::new(AlarmIndex::open(&d, 2).unwrap());
    const N: usize = 8;
    // Shard 0's lock held (as a sync in flight holds it): lowers pile up behind it.
    let held = ix.shards[0].db.lock().unwrap();
    let threads: Vec<_> = (0..N)
        .map(|i| {
            let ix = ix.clone();
            let name = homed(0, 2, &format!("g{i}-"));
            std::thread::spawn(move || ix.lower("a", &name, 0, 1_000, 1).unwrap())
        })
        .collect();
    while ix.shards[0].queue.lock().unwrap().len() < N {
        std::thread::yield_now();
    }
    // Shard 1's lowers do not wait for shard 0's lock.
    ix.lower("a", &homed(1, 2, "h"), 1, 1_000, 1).unwrap();
    assert_eq!(ix.syncs(1), 1);
    drop(held);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(ix.syncs(0), 1, "{N} lowers, one sync");
    assert_eq!(ix.due(0, 1_000, 100, none).unwrap().len(), N);
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn another_shard_count_moves_each_object_to_its_new_shard() {
    let d = dir("shards");
    let ix = AlarmIndex::open(&d, 3).unwrap();
    for i in 0..30 {
        let name = format!("o{i}");
        ix.lower("a", &name, home_shard("a", &name, 3), 1, 1)
            .unwrap();
    }
    drop(ix);
    for n in [2, 1, 4] {
        let ix = AlarmIndex::open(&d, n).unwrap();
        let mut on = 0;
        for s in 0..n {
            for w in ix.due(s, 10, 100, none).unwrap() {
                assert_eq!(home_shard(&w.app, &w.name, n), s);
                on += 1;
            }
        }
        assert_eq!(on, 30, "{n} shards");
        assert_eq!(ix.pending(), (30, 30));
        assert!(!shard_path(&d, n).exists(), "no file past the shards");
    }
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn the_single_index_of_earlier_versions_is_read_into_the_shards_and_removed() {
    let d = dir("legacy");
    let old = rusqlite::Connection::open(d.join(LEGACY)).unwrap();
    old.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE alarm_index (app TEXT NOT NULL, name TEXT NOT NULL,
           shard INTEGER NOT NULL, next_ms INTEGER NOT NULL, count INTEGER NOT NULL,
           seq INTEGER NOT NULL, PRIMARY KEY (app, name)) WITHOUT ROWID;
         INSERT INTO alarm_index VALUES ('a', 'x', 0, 10, 2, 7), ('a', 'y', 1, 20, 1, 9);",
    )
    .unwrap();
    drop(old);
    let ix = AlarmIndex::open(&d, 2).unwrap();
    assert!(!d.join(LEGACY).exists());
    assert_eq!(ix.pending(), (3, 2));
    let due: usize = (0..2).map(|s| ix.due(s, 20, 10, none).unwrap().len()).sum();
    assert_eq!(due, 2);
    // Numbers go on past the moved entries'.
    assert!(ix.mark(home_shard("a", "y", 2)) > 9);
    std::fs::remove_dir_all(d).unwrap();
}
