//! The `reminder` app's bounds (issue 40, item 4): 2,000 reminders posted in 0.2 s made one
//! 40-byte GET answer 12.4 MB, and reminders grew an object without end. Now an object holds at
//! most `reminders_pending_max` pending, one client at most `reminders_per_client_max` of them,
//! fired reminders are kept to the newest `reminders_fired_kept`, and a list answers at most
//! `reminder_list_max_bytes`, saying when it left some out. Each bound is crossed here.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{BufReader, Write};

use combd_kernel::limits::{
    REMINDERS_FIRED_KEPT, REMINDERS_PENDING_MAX, REMINDERS_PER_CLIENT_MAX, REMINDER_LIST_MAX_BYTES,
};
use support::*;

/// Posts `n` reminders with `body` to `reminder/<name>` from address `from`, pipelined 50 a
/// connection; their answers.
fn post_from(node: &TestNode, from: [u8; 4], name: &str, body: &str, n: usize) -> Vec<Resp> {
    let one = format!(
        "POST /o/reminder/{name} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let k = (n - out.len()).min(50);
        let mut s = connect_from(from, node.public());
        s.write_all(one.repeat(k).as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        out.extend((0..k).map(|_| read_response(&mut r)));
    }
    out
}

/// The statuses of `answers`, counted: (200s, others).
fn ok_count(answers: &[Resp]) -> usize {
    answers.iter().filter(|r| r.status == 200).count()
}

const LATER: &str = r#"{"in_ms":3600000,"text":"later"}"#;

#[test]
fn a_client_holds_its_share_of_an_objects_reminders_and_the_object_its_bound() {
    let node = TestNode::start(&[]);
    // One client: its bound of pending reminders on the object, then 429.
    let a = [127, 0, 6, 1];
    let r = post_from(&node, a, "q", LATER, REMINDERS_PER_CLIENT_MAX);
    assert_eq!(ok_count(&r), REMINDERS_PER_CLIENT_MAX);
    let past = &post_from(&node, a, "q", LATER, 1)[0];
    assert_eq!(past.status, 429, "{}", past.text());
    assert!(past.json()["error"]
        .as_str()
        .unwrap()
        .contains("reminders_per_client_max"));
    // Its quota is its own: another object takes its reminders.
    assert_eq!(post_from(&node, a, "q2", LATER, 1)[0].status, 200);
    // Other clients fill the object to its bound; past it, 507 whoever asks.
    let clients = REMINDERS_PENDING_MAX / REMINDERS_PER_CLIENT_MAX;
    for c in 1..clients {
        let from = [127, 0, 6, 1 + c as u8];
        let r = post_from(&node, from, "q", LATER, REMINDERS_PER_CLIENT_MAX);
        assert_eq!(ok_count(&r), REMINDERS_PER_CLIENT_MAX, "client {c}");
    }
    let full = &post_from(&node, [127, 0, 6, 100], "q", LATER, 1)[0];
    assert_eq!(full.status, 507, "{}", full.text());
    assert!(full.json()["error"]
        .as_str()
        .unwrap()
        .contains("reminders_pending_max"));
    let list = get(&node, "/o/reminder/q").json();
    assert_eq!(list["pending_count"], REMINDERS_PENDING_MAX as u64);
    let s = node.stats();
    assert_eq!(
        s["limits"]["reminders_pending_max"],
        REMINDERS_PENDING_MAX as u64
    );
    assert_eq!(
        s["limits"]["reminders_per_client_max"],
        REMINDERS_PER_CLIENT_MAX as u64
    );
}

#[test]
fn a_fired_reminder_frees_its_clients_quota_and_only_the_newest_fired_are_kept() {
    let node = TestNode::start(&[]);
    let a = [127, 0, 6, 1];
    let n = REMINDERS_FIRED_KEPT + 5;
    let r = post_from(&node, a, "f", r#"{"in_ms":0,"text":"now"}"#, n);
    assert_eq!(ok_count(&r), n);
    let ids: Vec<i64> = r.iter().map(|r| r.json()["id"].as_i64().unwrap()).collect();
    let s = wait_stats(&node, "every reminder fired", |s| {
        s["alarms_fired"].as_u64() == Some(n as u64) && s["alarm_objects"] == 0
    });
    assert_eq!(
        s["limits"]["reminders_fired_kept"],
        REMINDERS_FIRED_KEPT as u64
    );
    let list = get(&node, "/o/reminder/f").json();
    assert_eq!(list["pending_count"], 0);
    assert_eq!(list["fired_count"], REMINDERS_FIRED_KEPT as u64, "{list}");
    let mut kept: Vec<i64> = list["fired"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["id"].as_i64().unwrap())
        .collect();
    kept.sort_unstable();
    assert_eq!(kept, ids[n - REMINDERS_FIRED_KEPT..], "the newest are kept");
    assert_eq!(list["more"], false);
    // Fired, they no longer count to their client: it sets its whole quota again.
    let r = post_from(&node, a, "f", LATER, REMINDERS_PER_CLIENT_MAX);
    assert_eq!(ok_count(&r), REMINDERS_PER_CLIENT_MAX);
}

#[test]
fn a_list_answers_at_most_its_bytes_and_says_more() {
    let node = TestNode::start(&[]);
    // Texts of 1,024 control characters, each escaped to six bytes in the answer: ~6 KiB a
    // reminder, so the list's bytes run out long before its count.
    let text = "\\u0001".repeat(1024);
    let body = format!("{{\"in_ms\":3600000,\"text\":\"{text}\"}}");
    let n = REMINDER_LIST_MAX_BYTES / 6000 + 20;
    let mut posted = 0;
    for c in 0..n.div_ceil(REMINDERS_PER_CLIENT_MAX) {
        let k = (n - posted).min(REMINDERS_PER_CLIENT_MAX);
        let r = post_from(&node, [127, 0, 6, 1 + c as u8], "big", &body, k);
        assert_eq!(ok_count(&r), k, "{}", r[0].text());
        posted += k;
    }
    let r = get(&node, "/o/reminder/big");
    assert_eq!(r.status, 200);
    assert!(
        r.body.len() <= REMINDER_LIST_MAX_BYTES,
        "{} bytes",
        r.body.len()
    );
    let list = r.json();
    assert_eq!(list["more"], true);
    assert_eq!(list["pending_count"], n as u64);
    let listed = list["pending"].as_array().unwrap().len();
    assert!(listed > 0 && listed < n, "{listed} of {n}");
    // Earliest first: the first listed is the first posted.
    assert_eq!(list["pending"][0]["id"], 1);
    assert_eq!(
        node.stats()["limits"]["reminder_list_max_bytes"],
        REMINDER_LIST_MAX_BYTES as u64
    );
}
