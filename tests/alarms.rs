//! Durable alarms (issue 29, item 1) against the real node: the `reminder` app's alarm reaches
//! its WebSockets once; an alarm set in a call that rolls back never fires, nor one cancelled;
//! an app's SQL cannot touch the node's alarm table; a failing handler is rolled back and its
//! alarm fires later; every alarm fires exactly once across a hundred `kill -9`s; a thousand
//! objects due at once all fire, after a restart that opened none of them.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, Write};
use std::time::{Duration, Instant};

use support::*;

fn alarmer(node: &TestNode, name: &str, query: &str) -> Resp {
    post(node, &format!("/o/alarmer/{name}?{query}"), "")
}

/// `{"fired","twice","fires",…}` of an alarmer object.
fn fired(node: &TestNode, name: &str) -> serde_json::Value {
    let r = get(node, &format!("/o/alarmer/{name}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

/// Polls an alarmer object until `cond` holds of its figures, within `limit`.
fn wait_fired(
    node: &TestNode,
    name: &str,
    limit: Duration,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let f = fired(node, name);
        if cond(&f) {
            return f;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting on {name}: {f}"
        );
        // The alarms fire at their time: nothing to wait on but the object's figures.
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_reminder_fires_once_to_its_websockets_and_is_listed() {
    let node = TestNode::start(&[]);
    let mut ws = open_ws(&node, "/o/reminder/r");
    let r = post(&node, "/o/reminder/r", r#"{"in_ms":300,"text":"tea"}"#);
    assert_eq!(r.status, 200, "{}", r.text());
    let id = r.json()["id"].as_i64().unwrap();
    let msg = read_json(&mut ws);
    assert_eq!(msg["t"], "fired");
    assert_eq!(msg["id"], id);
    assert_eq!(msg["text"], "tea");
    assert!(msg["late_ms"].as_u64().is_some());
    let list = get(&node, "/o/reminder/r").json();
    assert_eq!(list["pending"], serde_json::json!([]));
    assert_eq!(list["fired"][0]["id"], id);
    assert_eq!(list["fired"][0]["fires"], 1);
    // The wake's answer is counted, then settled in the index.
    let s = wait_stats(&node, "the index settled", |s| s["alarm_objects"] == 0);
    assert_eq!(s["alarms_fired"], 1);
    assert_eq!(s["alarms_pending"], 0);
    // Bad requests set nothing.
    for body in [
        r#"{"in_ms":-1,"text":"x"}"#,
        r#"{"in_ms":1,"text":""}"#,
        r#"{"in_ms":31536000001,"text":"x"}"#,
        "not json",
    ] {
        assert_eq!(post(&node, "/o/reminder/r", body).status, 400, "{body}");
    }
    assert_eq!(node.stats()["alarms_pending"], 0);
}

#[test]
fn an_alarm_of_a_rolled_back_call_or_cancelled_never_fires_and_apps_cannot_touch_the_table() {
    let node = TestNode::start(&[TEST_APPS]);
    // Rolled back: set, then the call fails.
    assert_eq!(
        alarmer(&node, "a", "n=3&in_ms=0&tag=rolled&fail=1").status,
        500
    );
    // Cancelled in a later call.
    let r = alarmer(&node, "a", "n=1&in_ms=200&tag=cancelled");
    let id = r.json()["ids"][0].as_i64().unwrap();
    assert_eq!(
        alarmer(&node, "a", &format!("cancel={id}")).json()["cancelled"],
        true
    );
    assert_eq!(
        alarmer(&node, "a", &format!("cancel={id}")).json()["cancelled"],
        false
    );
    // The app's own SQL on the node's table: denied, and the call rolled back.
    let r = alarmer(&node, "a", "tamper=1&n=1&in_ms=0&tag=tamper");
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(r.json()["error"], "sql_denied");
    // A marker due after all of them: alarms of an object fire in time order, so once it has
    // fired the others would have.
    alarmer(&node, "a", "n=1&in_ms=600&tag=marker");
    let f = wait_fired(&node, "a", WAIT, |f| f["fired"] == 1);
    assert_eq!(f["fires"], 1, "only the marker fired: {f}");
    let s = wait_stats(&node, "the index settled", |s| s["alarm_objects"] == 0);
    assert_eq!(s["alarms_fired"], 1);
    assert_eq!(s["alarms_pending"], 0);
}

#[test]
fn a_failing_handler_is_rolled_back_and_its_alarm_fires_again_later() {
    let node = TestNode::start(&[TEST_APPS]);
    alarmer(&node, "f", "broken=1");
    alarmer(&node, "f", "n=1&in_ms=0");
    wait_stats(&node, "a failed alarm", |s| s["alarms_failed"] == 1);
    assert_eq!(fired(&node, "f")["fired"], 0);
    assert_eq!(node.stats()["alarms_pending"], 1, "still pending");
    alarmer(&node, "f", "broken=0");
    // Tried again after the backoff (alarm_retry_min_ms), and then it fires once.
    wait_stats(&node, "the alarm tried again", |s| s["alarms_fired"] == 1);
    assert_eq!(fired(&node, "f")["fires"], 1);
}

/// A small xorshift, for kill points that differ run to run.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        Rng(t | 1)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[test]
fn every_alarm_fires_exactly_once_across_a_hundred_kills() {
    const OBJECTS: usize = 10;
    const EACH: u64 = 30;
    let node = TestNode::start(&[TEST_APPS]);
    // 300 alarms, each object's 30 half a second apart: due all through the kills below.
    for o in 0..OBJECTS {
        let r = alarmer(
            &node,
            &format!("k{o}"),
            &format!("n={EACH}&in_ms={}&step_ms=500", 300 + 50 * o),
        );
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let mut dir = node.kill9();
    let mut rng = Rng::new();
    for _ in 0..100 {
        let node = TestNode::start_in(dir, &[TEST_APPS]);
        // Killed at a random point of its life: starting up, waking objects, firing.
        std::thread::sleep(Duration::from_millis(rng.below(200)));
        dir = node.kill9();
    }
    let node = TestNode::start_in(dir, &[TEST_APPS]);
    for o in 0..OBJECTS {
        let f = wait_fired(&node, &format!("k{o}"), Duration::from_secs(60), |f| {
            f["fired"] == EACH
        });
        assert_eq!(f["twice"], 0, "k{o} fired an alarm twice: {f}");
        assert_eq!(f["fires"], EACH, "k{o}: {f}");
    }
    let s = wait_stats(&node, "the index settled", |s| s["alarm_objects"] == 0);
    assert_eq!(s["alarms_pending"], 0);
}

#[test]
fn a_thousand_objects_due_at_once_fire_after_a_restart_that_opened_none() {
    const N: usize = 1000;
    // Each object is a database made on its first write: without a sync per commit they are
    // made faster, and durability is not what this test is about.
    let settings = [TEST_APPS, ("COMBD_SQLITE_SYNC", "normal")];
    let node = TestNode::start(&settings);
    // All due at one second, far enough ahead for the setting and the restart.
    let due = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 15_000;
    // From the node's own machine: one client address may make a tenth of the node's live
    // objects (`COMBD_CLIENT_SHARE_MAX_PERCENT`), and this test makes a thousand at once.
    let mut conn = connect(node.local());
    conn.set_nodelay(true).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    for i in 0..N {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let in_ms = due.saturating_sub(now);
        let req = format!(
            "POST /o/alarmer/t{i}?n=1&in_ms={in_ms} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
        );
        conn.write_all(req.as_bytes()).unwrap();
        let r = read_response(&mut reader);
        assert_eq!(r.status, 200, "{}", r.text());
    }
    drop((conn, reader));
    let dir = node.kill9();
    let node = TestNode::start_in(dir, &settings);
    let s = node.stats();
    let set_by = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        set_by < due,
        "setting 1,000 alarms and restarting took past their time: the test says nothing"
    );
    assert_eq!(s["alarm_objects"], N, "the index knows every object");
    assert_eq!(s["alarms_pending"], N);
    assert_eq!(s["objects_open"], 0, "and the start opened none of them");
    let deadline = Instant::now() + Duration::from_secs(60);
    let s = loop {
        let s = node.stats();
        // Each wake's answer is counted, then settled in the index: both, for the last ones.
        if s["alarms_fired"] == N && s["alarm_objects"] == 0 {
            break s;
        }
        assert!(Instant::now() < deadline, "timed out: {s}");
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "1,000 objects due at one second: the last fired {} ms late",
        s["alarm_late_ms_max"]
    );
    assert_eq!(s["alarms_pending"], 0);
    assert_eq!(s["alarm_objects"], 0);
    for i in (0..N).step_by(97) {
        assert_eq!(fired(&node, &format!("t{i}"))["fires"], 1);
    }
}

#[test]
fn an_index_that_lost_an_object_learns_it_again_when_the_object_opens() {
    let node = TestNode::start(&[TEST_APPS]);
    assert_eq!(alarmer(&node, "lost", "n=2&in_ms=3600000").status, 200);
    assert_eq!(node.stats()["alarm_objects"], 1);
    // The index is gone (removed by hand, or a new owner in a fleet whose index never had it).
    let dir = node.kill9();
    // Every shard's file (`alarms-<shard>.sqlite`, its WAL and shared memory).
    for f in std::fs::read_dir(&dir).unwrap() {
        let f = f.unwrap();
        if f.file_name().to_string_lossy().starts_with("alarms-") {
            std::fs::remove_file(f.path()).unwrap();
        }
    }
    let node = TestNode::start_in(dir, &[TEST_APPS]);
    assert_eq!(node.stats()["alarm_objects"], 0);
    // Opening the object tells the index again what it has to do.
    assert_eq!(fired(&node, "lost")["fired"], 0);
    let s = node.stats();
    assert_eq!(s["alarm_objects"], 1);
    assert_eq!(s["alarms_pending"], 2);
}

/// A module whose objects can be written once and never opened again (its schema's insert
/// breaks a UNIQUE on the second open), and whose requests set an alarm due now.
const STUCK: &str = r#"(module
  (import "combd" "set_alarm" (func $set (param i64 i32 i32) (result i64)))
  (import "combd" "respond" (func $respond (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "CREATE TABLE IF NOT EXISTS t (x UNIQUE); INSERT INTO t VALUES (1);\00")
  (data (i32.const 200) "{}")
  (func (export "schema") (result i32) (i32.const 0))
  (func (export "handle") (result i32)
    (drop (call $set (i64.const 0) (i32.const 200) (i32.const 2)))
    (call $respond (i32.const 200) (i32.const 200) (i32.const 2))
    (i32.const 0)))"#;

#[test]
fn an_object_whose_wake_is_refused_waits_and_holds_no_other_alarm_back() {
    let apps = apps_dir(&[("stuck.wat", STUCK)]);
    let settings = [
        TEST_APPS,
        ("COMBD_APPS_DIR", apps.to_str().unwrap()),
        ("COMBD_SHARDS", "1"),
    ];
    let node = TestNode::start(&settings);
    // Written once, with an alarm due now that fires (and, its handler being the same, sets
    // another due at once, and so on: one every alarm_read_gap_ms); then one due after the
    // restart.
    assert_eq!(post(&node, "/o/stuck/s", "").status, 200);
    wait_stats(&node, "the first alarm", |s| {
        s["alarms_fired"].as_u64() >= Some(1)
    });
    let dir = node.kill9();
    let node = TestNode::start_in(dir, &settings);
    // The stuck object's alarm is due but its database will not open again: its wake is
    // refused, and it waits alarm_wake_retry_ms before the next, while another object's alarm
    // fires.
    assert_eq!(alarmer(&node, "ok", "n=1&in_ms=300").status, 200);
    wait_fired(&node, "ok", WAIT, |f| f["fired"] == 1);
    // By then (at least 300 ms, three ticks) the stuck object was woken once, not each tick.
    let s = node.stats();
    assert_eq!(s["alarm_wakes_refused"], 1, "woken again and again: {s}");
}

#[test]
fn the_bounds_of_alarms_and_outboxes_are_crossed_and_refuse_the_call() {
    use combd_kernel::limits::{
        ALARMS_PER_OBJECT_MAX, ALARM_PAYLOAD_MAX_BYTES, OBJECT_MESSAGE_MAX_BYTES, OUTBOX_MAX,
    };
    let node = TestNode::start(&[TEST_APPS]);
    let far = "in_ms=3600000";
    // A payload at alarm_payload_max_bytes is taken, one byte more refuses the call (413).
    let at = alarmer(
        &node,
        "p",
        &format!("n=1&{far}&payload_bytes={ALARM_PAYLOAD_MAX_BYTES}"),
    );
    assert_eq!(at.status, 200, "{}", at.text());
    let past = alarmer(
        &node,
        "p",
        &format!("n=1&{far}&payload_bytes={}", ALARM_PAYLOAD_MAX_BYTES + 1),
    );
    assert_eq!(past.status, 413, "{}", past.text());
    // alarms_per_object_max pending: the next set refuses its whole call (507), nothing of it set.
    let r = alarmer(&node, "full", &format!("n={ALARMS_PER_OBJECT_MAX}&{far}"));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = alarmer(&node, "full", &format!("n=1&{far}"));
    assert_eq!(r.status, 507, "{}", r.text());
    assert!(r.json()["error"]
        .as_str()
        .unwrap()
        .contains("alarms_per_object_max"));
    // A message at object_message_max_bytes waits in the outbox; one byte more is refused.
    let r = alarmer(
        &node,
        "o",
        &format!("send=1&bytes={OBJECT_MESSAGE_MAX_BYTES}"),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = alarmer(
        &node,
        "o",
        &format!("send=1&bytes={}", OBJECT_MESSAGE_MAX_BYTES + 1),
    );
    assert_eq!(r.status, 413, "{}", r.text());
    // outbox_max undelivered (their receiver's app does not exist): the next send is refused.
    let r = alarmer(&node, "ob", &format!("send={OUTBOX_MAX}"));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = alarmer(&node, "ob", "send=1");
    assert_eq!(r.status, 507, "{}", r.text());
    assert!(r.json()["error"].as_str().unwrap().contains("outbox_max"));
    let s = wait_stats(&node, "the index", |s| s["alarm_objects"] == 4);
    assert_eq!(
        s["alarms_pending"].as_u64().unwrap(),
        (1 + ALARMS_PER_OBJECT_MAX + 1 + OUTBOX_MAX) as u64
    );
}

/// Issue 40, item 4: the node's one alarm index took one lock and one sync for every batch
/// that set an alarm (2,109 syncs in 3 s under reminder POSTs on 16 connections), and either
/// shard's commits waited on it. Now each shard has its own index, and a lower to an entry due
/// earlier already is not synced: 16 connections setting reminders on four objects of shard 0
/// sync shard 0's index once per object at most, and never shard 1's.
#[test]
fn reminders_on_one_shard_sync_only_its_index_and_once_per_object() {
    let node = TestNode::start(&[("COMBD_SHARDS", "2")]);
    let names: Vec<String> = (0..)
        .map(|i| format!("s{i}"))
        .filter(|n| combd_shards::app::home_shard("reminder", n, 2) == 0)
        .take(4)
        .collect();
    const CONNS: usize = 16;
    const EACH: usize = 25;
    let threads: Vec<_> = (0..CONNS)
        .map(|c| {
            let (addr, name) = (node.local(), names[c % names.len()].clone());
            std::thread::spawn(move || {
                let body = r#"{"in_ms":3600000,"text":"later"}"#;
                let one = format!(
                    "POST /o/reminder/{name} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let mut s = connect(addr);
                s.write_all(one.repeat(EACH).as_bytes()).unwrap();
                let mut r = BufReader::new(s);
                for _ in 0..EACH {
                    let resp = read_response(&mut r);
                    assert_eq!(resp.status, 200, "{}", resp.text());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let shard = |s: &serde_json::Value, k: usize, f: &str| s["shards"][k][f].as_u64().unwrap();
    let first = wait_stats(&node, "shard 0's index syncs counted", |s| {
        shard(s, 0, "alarm_index_syncs") >= 1
    });
    // The figure is copied at each housekeeping tick: read it again after a few more.
    let s = wait_stats(&node, "more ticks", |s| {
        s["uptime_ms"].as_u64() > first["uptime_ms"].as_u64().map(|t| t + 300)
    });
    let syncs = shard(&s, 0, "alarm_index_syncs");
    assert!(
        syncs <= names.len() as u64,
        "{syncs} syncs for {} objects: {s}",
        names.len()
    );
    // Before, every batch that set an alarm synced the index (and took the node's one lock).
    assert!(shard(&s, 0, "batches") > 2 * syncs, "{s}");
    assert_eq!(shard(&s, 1, "alarm_index_syncs"), 0, "{s}");
    assert_eq!(s["alarms_pending"], (CONNS * EACH) as u64);
    assert_eq!(s["alarm_objects"], names.len() as u64);
}
