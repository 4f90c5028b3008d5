//! The fleet's index of objects with something due ([`Wakes`]) (an alarm, a message to send): what lets
//! another node take up a dead owner's alarms without opening every object.
//!
//! ## Keys
//!
//! - `<prefix>due/<object>`: when the object next has something for a node to do, in
//!   milliseconds since the Unix epoch (decimal), as of the head its owner shipped last;
//! - `<prefix>wake/<16-digit ms>/<object>`: the same, ordered by time, so the objects due by
//!   now are one range read ([`Coordinator::due_wakes`]).
//!
//! Both are written only by their owner, with the head that makes them true, in the head's
//! fenced transaction ([`Coordinator::advance_head_and_due`]): what the index says is what the
//! shipped state holds (a write that was never shipped was never acknowledged either), and a
//! stale owner cannot move it. Neither key is attached to a lease: they outlive the owner.
//! While its owner lives, the owner's own index (on its disk) fires the object; when the owner
//! is gone (no owner key), any node that finds the object due claims it, restores it and fires
//! what is due.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

use super::objects::Objects;
use super::{b64, bad, first_kv, Advance, CoordinatorError, Head};

/// Digits of a time in a wake key: milliseconds since the epoch, zero-padded so keys sort by
/// time (16 digits last until the year 318857).
const MS_DIGITS: usize = 16;

/// How an object's due time moves with a head advance: from what the coordinator records
/// (`was`) to `now` (`None`: nothing due any more).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DueChange {
    /// What the coordinator records now.
    pub was: Option<u64>,
    /// What it is to record.
    pub now: Option<u64>,
}

impl DueChange {
    /// No change.
    pub const NONE: DueChange = DueChange {
        was: None,
        now: None,
    };
}

/// The coordinator's calls about the wake index: those about objects, and the wake keys.
pub(super) struct Wakes<'c> {
    objects: Objects<'c>,
}

impl<'c> Wakes<'c> {
    /// The calls of `objects`' coordinator.
    pub(super) fn new(objects: Objects<'c>) -> Wakes<'c> {
        Wakes { objects }
    }

    fn wake_key(&self, ms: u64, object: &str) -> String {
        format!(
            "{}wake/{ms:0width$}/{object}",
            self.objects.prefix,
            width = MS_DIGITS
        )
    }

    /// The writes that move `object`'s due time as `change` says.
    fn due_requests(&self, object: &str, change: DueChange) -> Vec<Value> {
        let mut requests = Vec::new();
        if change.was == change.now {
            return requests;
        }
        if let Some(was) = change.was {
            requests.push(json!({ "request_delete_range": {
                "key": b64(&self.wake_key(was, object)) } }));
        }
        match change.now {
            Some(now) => {
                requests.push(json!({ "request_put": {
                    "key": b64(&self.wake_key(now, object)), "value": "" } }));
                requests.push(json!({ "request_put": {
                    "key": b64(&self.objects.due_key(object)), "value": b64(&now.to_string()) } }));
            }
            None => requests.push(json!({ "request_delete_range": {
                "key": b64(&self.objects.due_key(object)) } })),
        }
        requests
    }

    /// Records `head` as `object`'s head and moves its due time as `change` says (if it
    /// moves), in one transaction fenced on `token` (as [`Coordinator::advance_head`]).
    pub(super) fn advance_head_and_due(
        &self,
        object: &str,
        token: i64,
        head: Option<Head>,
        change: DueChange,
    ) -> Result<Advance, CoordinatorError> {
        let mut requests = Vec::new();
        if let Some(head) = head {
            requests.push(json!({ "request_put": {
                "key": b64(&self.objects.head_key(object)), "value": b64(&head.encode()) } }));
        }
        requests.extend(self.due_requests(object, change));
        if requests.is_empty() {
            return Ok(Advance::Done);
        }
        self.objects
            .fenced_all("advance head", object, token, requests)
    }

    /// Forgets `object` (deleted), fenced on `token`: in one transaction its head, its
    /// snapshot, its due time (`due`, as the owner knows it) and wake key go, and its
    /// tombstone is written, which says its segments and snapshots may still be in the bucket.
    pub(super) fn forget(
        &self,
        object: &str,
        token: i64,
        due: Option<u64>,
    ) -> Result<Advance, CoordinatorError> {
        let o = &self.objects;
        let mut requests = vec![
            json!({ "request_delete_range": { "key": b64(&o.head_key(object)) } }),
            json!({ "request_delete_range": { "key": b64(&o.snapshot_key(object)) } }),
            json!({ "request_put": { "key": b64(&o.gone_key(object)), "value": b64(&token.to_string()) } }),
        ];
        requests.extend(self.due_requests(
            object,
            DueChange {
                was: due,
                now: None,
            },
        ));
        if due.is_none() {
            requests.push(json!({ "request_delete_range": { "key": b64(&o.due_key(object)) } }));
        }
        o.fenced_all("forget", object, token, requests)
    }

    /// When `object` next has something due, as its last owner recorded it.
    pub(super) fn due(&self, object: &str) -> Result<Option<u64>, CoordinatorError> {
        let v = self.objects.etcd.call(
            "due",
            object,
            "/v3/kv/range",
            &json!({ "key": b64(&self.objects.due_key(object)) }),
        )?;
        let err = |failure| CoordinatorError {
            op: "due",
            object: object.to_string(),
            failure,
        };
        match first_kv(&v).map_err(err)? {
            None => Ok(None),
            Some((text, _, _)) => text
                .parse()
                .map(Some)
                .map_err(|_| err(bad(format!("due {text:?}")))),
        }
    }

    /// The objects due at `now` or before (earliest first, at most `limit`; after the wake
    /// `after`, an object and its due time, if given: the last one of the page before), each
    /// with its due time.
    pub(super) fn due_wakes(
        &self,
        now: u64,
        limit: usize,
        after: Option<&(String, u64)>,
    ) -> Result<Vec<(String, u64)>, CoordinatorError> {
        let from = format!("{}wake/", self.objects.prefix);
        let start = match after {
            // The first key past it.
            Some((object, ms)) => format!("{}\0", self.wake_key(*ms, object)),
            None => from.clone(),
        };
        let to = self.wake_key(now.saturating_add(1), "");
        let v = self.objects.etcd.call(
            "due wakes",
            "",
            "/v3/kv/range",
            &json!({
                "key": b64(&start), "range_end": b64(&to), "limit": limit.to_string(),
                "keys_only": true,
            }),
        )?;
        let mut out = Vec::new();
        for kv in v["kvs"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let key = kv["key"]
                .as_str()
                .and_then(|k| B64.decode(k).ok())
                .and_then(|k| String::from_utf8(k).ok());
            let parsed = key.as_deref().and_then(|k| {
                let rest = k.strip_prefix(&from)?;
                let (ms, object) = rest.split_at_checked(MS_DIGITS)?;
                Some((object.strip_prefix('/')?.to_string(), ms.parse().ok()?))
            });
            match parsed {
                Some(wake) => out.push(wake),
                None => {
                    return Err(CoordinatorError {
                        op: "due wakes",
                        object: String::new(),
                        failure: bad(format!("a wake key {key:?}")),
                    })
                }
            }
        }
        Ok(out)
    }

    /// Which of `objects` have an owner now (one answer each, in order).
    pub(super) fn owned(&self, objects: &[String]) -> Result<Vec<bool>, CoordinatorError> {
        let mut out = Vec::with_capacity(objects.len());
        // etcd takes at most 128 operations in a transaction (`--max-txn-ops`).
        for chunk in objects.chunks(64) {
            let ranges: Vec<Value> = chunk
                .iter()
                .map(|o| {
                    json!({ "request_range": {
                        "key": b64(&self.objects.owner_key(o)), "count_only": true } })
                })
                .collect();
            let txn = json!({ "compare": [], "success": ranges, "failure": [] });
            let v = self.objects.etcd.call("owners", "", "/v3/kv/txn", &txn)?;
            for i in 0..chunk.len() {
                let count = super::int(&v["responses"][i]["response_range"]["count"]);
                out.push(count.unwrap_or(0) > 0);
            }
        }
        Ok(out)
    }
}
