//! etcd kept small (issue 27: every head advance and claim is a revision, and nothing was
//! compacted, so the whole fleet would stop at etcd's quota). etcd compacts its history itself
//! (`--auto-compaction-mode=periodic`, as `tools/fleet-env/up` and README run it, 5 minutes
//! there; 2 s here, so a bounded test sees several compactions): what the node owes is to leave
//! nothing a compaction cannot drop. Under a counter load and a spray of written names the
//! revision goes on growing while the bytes etcd holds in use stay level, and etcd keeps one
//! owner, one head and at most one snapshot key per object written.

use std::io::{BufReader, Write};
use std::time::{Duration, Instant};

use super::fleet_support;
use super::no_work::etcd_keys;
use super::support::{self, TestNode};
use super::{post_acked, Fleet};

/// Each phase of counter load.
const PHASE: Duration = Duration::from_secs(8);
/// Names written besides the counter.
const NAMES: u64 = 40;

/// etcd's revision and the bytes of its database in use.
fn status(fleet: &Fleet) -> (u64, u64) {
    let v = fleet.etcd_call("/v3/maintenance/status", serde_json::json!({}));
    let n = |f: &serde_json::Value| f.as_str().map_or(0, |s| s.parse().unwrap());
    (n(&v["header"]["revision"]), n(&v["dbSizeInUse"]))
}

/// Waits until etcd compacted its history past `revision` (a read at it is refused), within
/// 20 s: from then on what it holds in use is the live keys and what came after.
fn until_compacted(fleet: &Fleet, revision: u64) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let body =
        serde_json::json!({ "key": super::b64(b"combd/"), "revision": revision.to_string() });
    let t0 = Instant::now();
    loop {
        let v = agent
            .post(&format!("{}/v3/kv/range", fleet.etcd.endpoint))
            .send(body.to_string())
            .unwrap()
            .body_mut()
            .read_to_string()
            .unwrap();
        if v.contains("compacted") {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "etcd never compacted past {revision}: {v}"
        );
        std::thread::sleep(Duration::from_millis(200)); // polling etcd's compactor
    }
}

/// Writes `counter/hot` from 4 threads for `PHASE`, each on a keep-alive connection from a
/// client address of its own (a loop that opened a connection a request from one address would
/// pass `COMBD_ACCEPT_RATE_PER_ADDRESS` and be closed at the accept); the writes acknowledged.
fn load(node: &TestNode) -> u64 {
    const POST_HOT: &[u8] = b"POST /o/counter/hot HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
    let until = Instant::now() + PHASE;
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..4)
            .map(|i| {
                s.spawn(move || {
                    let mut acked = 0;
                    let mut conn = None;
                    while Instant::now() < until {
                        let c = conn.get_or_insert_with(|| {
                            BufReader::new(support::connect_from(
                                support::client_address(200 + i),
                                node.public(),
                            ))
                        });
                        c.get_mut().write_all(POST_HOT).expect("write");
                        let r = support::read_response(c);
                        acked += u64::from(r.status == 200);
                        if r.header("connection") == Some("close") {
                            conn = None;
                        }
                    }
                    acked
                })
            })
            .collect();
        writers.into_iter().map(|w| w.join().unwrap()).sum()
    })
}

#[test]
fn etcd_stays_level_under_a_counter_run_and_a_spray_of_names() {
    let test = "etcd_stays_level";
    let agent = ureq::Agent::new_with_defaults();
    let Some(etcd) = fleet_support::Etcd::start_with(
        test,
        "http",
        &["--auto-compaction-retention=2s".to_string()],
        &agent,
    ) else {
        return;
    };
    let Some(fleet) = Fleet::with_etcd(test, etcd) else {
        return;
    };
    let a = fleet.node();
    // Warm: the counter claimed, its first compactions done.
    let mut acked = load(&a);
    until_compacted(&fleet, status(&fleet).0);
    let (rev_warm, in_use_warm) = status(&fleet);
    for i in 0..NAMES {
        assert_eq!(post_acked(&a, &format!("spray-{i}")), 1);
    }
    acked += load(&a);
    acked += load(&a);
    until_compacted(&fleet, status(&fleet).0);
    let (rev_end, in_use_end) = status(&fleet);
    eprintln!(
        "{acked} writes acknowledged; revision {rev_warm} -> {rev_end}, \
         bytes in use {in_use_warm} -> {in_use_end}"
    );
    let revisions = rev_end - rev_warm;
    assert!(
        revisions >= 600,
        "too few revisions to tell ({revisions}: {acked} writes)"
    );
    // Without compaction each revision keeps its key and value in use (measured with the
    // compaction off: ~83 bytes a revision, 86,016 -> 212,992 bytes over 1,527 revisions);
    // compacted, what stays is the live keys: the counter's and the names'.
    let grown = in_use_end.saturating_sub(in_use_warm);
    let bound = 16 * 1024 + NAMES * 1024;
    assert!(
        grown <= bound,
        "bytes in use grew from {in_use_warm} to {in_use_end} over {revisions} revisions \
         (bound {bound})"
    );
    // The keys: one owner and one head per object written, at most one snapshot record.
    let objects = NAMES + 1;
    assert_eq!(etcd_keys(&fleet, "combd/owner/"), objects);
    assert_eq!(etcd_keys(&fleet, "combd/head/"), objects);
    assert!(etcd_keys(&fleet, "combd/snap/") <= objects);
}
