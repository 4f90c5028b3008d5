//! Backup and restore on a node alone (README "Backup and restore"), against the real node
//! with real files: random writes to 20 objects with the moment of each recorded, each object
//! restored to random moments and compared, row for row, with its history replayed to then;
//! the same across a kill -9 during the writes; a whole node restored onto an empty data
//! directory; a deleted object restored; and the refusals. The same to a real S3 bucket
//! (Garage, skipped with one line when it is not installed), which gets back only what the
//! node sealed.

#![allow(clippy::unwrap_used)]

#[path = "../fleet/tests/support/mod.rs"]
mod fleet_support;
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use support::*;

/// A small random source (xorshift), seeded per test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// One object's history: after each write answered, when, and the map it left.
type History = Vec<(u64, BTreeMap<String, String>)>;

fn backup_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("combd-backup-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn start(data: Option<std::path::PathBuf>, backup: &std::path::Path) -> TestNode {
    let b = backup.to_str().unwrap();
    let vars = [TEST_APPS, ("COMBD_BACKUP", b)];
    match data {
        Some(d) => TestNode::start_in(d, &vars),
        None => TestNode::start(&vars),
    }
}

/// `writes` random writes to `kv/<name>`, one at a time, each answered before the next is
/// sent and a millisecond after the last was answered (so every moment is between two
/// batches), appended to `history`.
fn write(node: &TestNode, i: usize, name: &str, writes: usize, seed: u64, history: &mut History) {
    let mut rng = Rng(seed | 1);
    let mut map = history.last().map(|(_, m)| m.clone()).unwrap_or_default();
    for _ in 0..writes {
        let k = format!("k{}", rng.below(12));
        let v = match rng.below(5) {
            0 => String::new(),
            _ => format!("v{}", rng.below(1000)),
        };
        let raw = format!(
            "POST /o/kv/{name} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{k}={v}",
            k.len() + v.len() + 1
        );
        let r = request_from(client_address(i), node.public(), raw.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
        let answered = now_ms();
        match v.as_str() {
            "" => map.remove(&k),
            v => map.insert(k, v.to_string()),
        };
        history.push((answered, map.clone()));
        while now_ms() <= answered {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The map of `kv/<name>`, read from an address of its own (a test that reads a hundred forks
/// from one address would pass its share of the node's live objects).
fn state(node: &TestNode, name: &str) -> BTreeMap<String, String> {
    let from = client_address(name.bytes().map(usize::from).sum::<usize>() * 7);
    let raw = format!("GET /o/kv/{name} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let r = request_from(from, node.public(), raw.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    serde_json::from_value(r.json()["kv"].clone()).unwrap()
}

/// The RFC 3339 form of a moment in milliseconds (UTC).
fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// Restores `kv/<name>` as of the moment `at` into `<name>-<tag>` and checks it against the
/// history at that moment.
fn check_moment(node: &TestNode, name: &str, history: &History, at: u64, tag: &str) {
    let fork = format!("{name}-{tag}");
    let path = format!("/objects/kv/{name}/restore?at={}&as={fork}", rfc3339(at));
    let r = local(node, "POST", &path, "");
    let expected = history.iter().rev().find(|(t, _)| *t <= at).map(|(_, m)| m);
    match expected {
        Some(m) => {
            assert_eq!(r.status, 200, "{name} at {at}: {}", r.text());
            assert_eq!(&state(node, &fork), m, "{name} at {at} ({})", r.text());
        }
        None => assert_eq!(r.status, 404, "{name} before its first write: {}", r.text()),
    }
}

/// `combd restore --all` of `backup` (a directory, or `s3://…` with its settings in `env`) into
/// the data directory `data`, with no node running.
fn restore_all(backup: &str, data: &std::path::Path, env: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_combd"))
        .args(["restore", "--all", "--backup", backup])
        .args(["--data", data.to_str().unwrap()])
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// [`restore_all`], which must succeed: what it said.
fn restored_whole(backup: &str, data: &std::path::Path, env: &[(&str, &str)]) -> String {
    let out = restore_all(backup, data, env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Each object `<prefix><i>` of `histories` on `node` is as its history ends.
fn each_as_last(node: &TestNode, histories: &[History], prefix: &str) {
    for (i, h) in histories.iter().enumerate() {
        let name = format!("{prefix}{i}");
        assert_eq!(&state(node, &name), &h.last().unwrap().1, "{name}");
    }
}

/// Waits until the backup's writer holds everything queued.
fn settled(node: &TestNode) {
    wait_stats(node, "the backup's queue empty", |s| {
        s["backup_queued_bytes"] == 0
    });
}

const OBJECTS: usize = 20;
const WRITES: usize = 500;

#[test]
fn ten_thousand_writes_restore_to_any_moment_row_for_row() {
    let backup = backup_dir("moments");
    let node = start(None, &backup);
    let begun = now_ms();
    std::thread::sleep(Duration::from_millis(2));
    let histories: Vec<History> = std::thread::scope(|s| {
        let node = &node;
        let threads: Vec<_> = (0..OBJECTS)
            .map(|i| {
                s.spawn(move || {
                    let mut h = History::new();
                    write(
                        node,
                        i,
                        &format!("o{i}"),
                        WRITES,
                        0x9e37 * (i as u64 + 1),
                        &mut h,
                    );
                    h
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    settled(&node);
    let s = node.stats();
    // A batch that changed nothing (a delete of a key not there) writes no frame: no segment.
    let segments = s["backup_segments"].as_u64().unwrap();
    assert!(segments >= (OBJECTS * WRITES / 2) as u64, "{segments}");
    assert_eq!(s["backup_gaps"], 0, "{s}");
    // The lag's 99th percentile: a bucket's bound, within a fifth above the true one, so never
    // far above the most any segment waited; a round waits for its interval, so not nothing.
    let (p99, max) = (
        s["backup_lag_p99_ms"].as_u64().unwrap(),
        s["backup_lag_max_ms"].as_u64().unwrap(),
    );
    assert!(
        p99 >= 1 && p99 <= max + max / 5 + 1,
        "p99 {p99} ms, max {max} ms"
    );
    let mut rng = Rng(0x5eed);
    for (i, h) in histories.iter().enumerate() {
        for k in 0..5 {
            let at = h[rng.below(h.len() as u64) as usize].0;
            check_moment(&node, &format!("o{i}"), h, at, &format!("m{k}"));
        }
        // Before its first write it did not exist.
        check_moment(&node, &format!("o{i}"), h, begun, "none");
    }
    // By batch: an object's listing names its batches; the last is its latest state.
    let listed = local(&node, "GET", "/objects/kv/o3/backup", "").json();
    let last = listed["batches"].as_array().unwrap().last().unwrap()["seq"].clone();
    let r = local(
        &node,
        "POST",
        &format!("/objects/kv/o3/restore?at={last}&as=o3-last"),
        "",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(&state(&node, "o3-last"), &histories[3].last().unwrap().1);
}

/// Restores each object of `histories` to 3 random moments the backup held before a kill (its
/// first `held` writes, settled then) and 3 after the restart (its writes from `after` on), and
/// checks each against its history.
fn check_around_a_kill(
    node: &TestNode,
    histories: &[History],
    seed: u64,
    (held, after): (u64, usize),
) {
    let mut rng = Rng(seed);
    for (i, h) in histories.iter().enumerate() {
        for k in 0..3 {
            let at = h[rng.below(held) as usize].0;
            check_moment(node, &format!("o{i}"), h, at, &format!("b{k}"));
            let at = h[after + rng.below((h.len() - after) as u64) as usize].0;
            check_moment(node, &format!("o{i}"), h, at, &format!("a{k}"));
        }
    }
}

/// Writes `n` more to each of `histories`' objects, `o0`, `o1`, …, at once.
fn writes_to_all(node: &TestNode, histories: &mut [History], n: usize, seed: u64) {
    std::thread::scope(|s| {
        for (i, h) in histories.iter_mut().enumerate() {
            s.spawn(move || write(node, i, &format!("o{i}"), n, seed + i as u64, h));
        }
    });
}

/// Killed while the writer still holds the last writes' segments (written right before, and
/// the writer writes a round at most every `backup_round_interval_ms`): the WALs keep what it
/// lost, read again after the restart, so no batch is skipped (the state at every moment
/// after the restart, and the last, restore exactly). The moments of the lost batches
/// themselves are the lag at kill time: read again, they bear the time they were read.
#[test]
fn a_kill_during_the_writes_skips_nothing_and_a_whole_node_restores() {
    let backup = backup_dir("kill");
    let node = start(None, &backup);
    let mut histories: Vec<History> = vec![History::new(); 4];
    writes_to_all(&node, &mut histories, 100, 77);
    settled(&node);
    writes_to_all(&node, &mut histories, 50, 177);
    let data = node.kill9();
    let node = start(Some(data), &backup);
    writes_to_all(&node, &mut histories, 100, 991);
    settled(&node);
    check_around_a_kill(&node, &histories, 0xcafe, (100, 150));
    // The disk lost: the whole node from its backup, onto an empty data directory. The
    // backup held everything (its queue was empty): every object is as it was last.
    let data = node.kill9();
    let restored = backup_dir("kill-data");
    let dir = backup.to_str().unwrap();
    let said = restored_whole(dir, &restored, &[]);
    assert!(said.starts_with("restored "), "{said}");
    let again = restore_all(dir, &restored, &[]);
    assert_eq!(
        again.status.code(),
        Some(1),
        "not onto a data directory with objects"
    );
    let node = start(Some(restored), &backup);
    each_as_last(&node, &histories, "o");
    let _ = std::fs::remove_dir_all(data);
}

#[test]
fn a_deleted_object_restores_to_before_its_delete_and_the_refusals_say_why() {
    let backup = backup_dir("deleted");
    let node = start(None, &backup);
    let mut h = History::new();
    write(&node, 0, "gone", 20, 5, &mut h);
    let before = h.last().unwrap().0;
    assert_eq!(local(&node, "DELETE", "/objects/kv/gone", "").status, 200);
    settled(&node);
    let deleted_at = now_ms();
    std::thread::sleep(Duration::from_millis(2));
    // As of the delete, it has no database; before it, its last state, in place.
    let r = local(
        &node,
        "POST",
        &format!("/objects/kv/gone/restore?at={}", rfc3339(deleted_at)),
        "",
    );
    assert_eq!(r.status, 404, "{}", r.text());
    let r = local(
        &node,
        "POST",
        &format!("/objects/kv/gone/restore?at={}", rfc3339(before)),
        "",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(&state(&node, "gone"), &h.last().unwrap().1);
    // A fork onto a name that has a database, a bad moment, an unknown batch.
    for (path, status) in [
        ("/objects/kv/gone/restore?at=latest&as=gone", 200),
        ("/objects/kv/x/restore?at=latest", 404),
        ("/objects/kv/gone/restore?at=yesterday", 400),
        ("/objects/kv/gone/restore", 400),
        ("/objects/kv/gone/restore?at=999999", 404),
    ] {
        assert_eq!(local(&node, "POST", path, "").status, status, "{path}");
    }
    write(&node, 0, "other", 1, 9, &mut History::new());
    let r = local(
        &node,
        "POST",
        "/objects/kv/gone/restore?at=latest&as=other",
        "",
    );
    assert_eq!(
        r.status,
        409,
        "a fork onto an object that has a database: {}",
        r.text()
    );
    assert!(node.stats()["objects_restored"].as_u64().unwrap() >= 2);
    // Not from a public address; not with backup off.
    assert_eq!(
        post(&node, "/objects/kv/gone/restore?at=latest", "").status,
        404
    );
    let off = TestNode::start(&[TEST_APPS]);
    assert_eq!(
        local(&off, "POST", "/objects/kv/gone/restore?at=latest", "").status,
        409
    );
}

/// Objects made before backup was turned on, and never opened after: each gets its base once
/// the node starts with backup on, so a whole node restored from the backup has them.
#[test]
fn objects_from_before_the_backup_get_a_base_and_restore_whole() {
    let node = TestNode::start(&[TEST_APPS]);
    let mut histories = vec![History::new(); 3];
    for (i, h) in histories.iter_mut().enumerate() {
        write(&node, i, &format!("old{i}"), 5, 31 + i as u64, h);
    }
    let data = node.kill9();
    let backup = backup_dir("before");
    let node = start(Some(data), &backup);
    wait_stats(&node, "a base for each object", |s| s["backup_bases"] == 3);
    let restored = backup_dir("before-data");
    drop(node);
    restored_whole(backup.to_str().unwrap(), &restored, &[]);
    let node = TestNode::start_in(restored, &[TEST_APPS]);
    each_as_last(&node, &histories, "old");
}

/// The backup in a real bucket: every moment restores as in a directory, across a kill -9 (the
/// WALs keep what the writer had not uploaded, read again after the restart: the moments of
/// the batches lost with the writer, a second's worth at most, are the lag, and are not
/// checked), and a whole node restores from it; what the bucket holds that the node did not
/// seal (a base planted there) is refused, not restored.
#[test]
fn a_bucket_backup_restores_any_moment_and_takes_back_only_what_the_node_sealed() {
    let Some(s3) = fleet_support::S3::start("a bucket backup") else {
        return;
    };
    let keys = backup_dir("s3-keys");
    std::fs::create_dir_all(&keys).unwrap();
    let (secret, key) = (keys.join("secret"), keys.join("backup.key"));
    std::fs::write(&secret, format!("{}\n", s3.bucket.secret_key)).unwrap();
    std::fs::write(&key, "combd-test-backup-key-0123456789abcdef\n").unwrap();
    let prefix = s3.unique_prefix();
    let target = format!("s3://{}/{}", s3.bucket.bucket, prefix.trim_end_matches('/'));
    let vars: Vec<(&str, &str)> = vec![
        TEST_APPS,
        ("COMBD_BACKUP", &target),
        ("COMBD_BACKUP_S3_URL", &s3.bucket.endpoint),
        ("COMBD_BACKUP_S3_REGION", &s3.bucket.region),
        ("COMBD_BACKUP_S3_ACCESS_KEY", &s3.bucket.access_key),
        ("COMBD_BACKUP_S3_SECRET_KEY_FILE", secret.to_str().unwrap()),
        ("COMBD_BACKUP_KEY_FILE", key.to_str().unwrap()),
    ];
    let node = TestNode::start(&vars);
    let mut histories: Vec<History> = vec![History::new(); 4];
    writes_to_all(&node, &mut histories, 40, 17);
    settled(&node);
    writes_to_all(&node, &mut histories, 20, 99);
    let data = node.kill9();
    let node = TestNode::start_in(data, &vars);
    writes_to_all(&node, &mut histories, 40, 4242);
    settled(&node);
    assert_eq!(node.stats()["backup_errors"], 0);
    check_around_a_kill(&node, &histories, 0xb0c7, (40, 60));
    // A base planted in the bucket, newer than the node's: not sealed with the backup key, so
    // refused rather than restored.
    let planted = format!(
        "{prefix}objects/kv/o1/snap-{:020}-{:013}-0000000000000000-0.db",
        1u64 << 40,
        now_ms()
    );
    combd_fleet::bucket::Bucket::new(&s3.bucket)
        .unwrap()
        .put(&planted, b"SQLite format 3\0 not really")
        .unwrap();
    let r = local(
        &node,
        "POST",
        "/objects/kv/o1/restore?at=latest&as=o1-planted",
        "",
    );
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains("sealed"), "{}", r.text());
    combd_fleet::bucket::Bucket::new(&s3.bucket)
        .unwrap()
        .delete(&planted)
        .unwrap();
    // The disk lost: every object restored whole from the bucket.
    let gone = node.kill9();
    let restored = backup_dir("s3-data");
    let s3: Vec<(&str, &str)> = vars
        .iter()
        .copied()
        .filter(|(k, _)| k.starts_with("COMBD_BACKUP_"))
        .collect();
    let said = restored_whole(&target, &restored, &s3);
    assert!(said.starts_with("restored "), "{said}");
    let node = TestNode::start_in(restored, &[TEST_APPS]);
    each_as_last(&node, &histories, "o");
    let _ = std::fs::remove_dir_all(gone);
    let _ = std::fs::remove_dir_all(keys);
}
