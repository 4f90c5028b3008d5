//! The coordinator's calls about one object ([`Objects`]): its claim, its owner, its head and
//! its snapshot, each write fenced on the owner's token (the keys: see the module above).

use serde_json::json;

use super::gateway::Gateway;
use super::{
    b64, bad, first_kv, int, Advance, Claim, CoordinatorError, Head, Lease, Owner, Snapshot,
};

/// An object's head, its recorded snapshot and its due time, read together.
pub type ObjectState = (Option<Head>, Option<Snapshot>, Option<u64>);

/// The coordinator's calls about objects, over its gateway and under its prefix.
pub(super) struct Objects<'c> {
    pub(super) etcd: &'c Gateway,
    pub(super) prefix: &'c str,
}

impl<'c> Objects<'c> {
    /// The calls through `etcd`, on the keys under `prefix`.
    pub(super) fn new(etcd: &'c Gateway, prefix: &'c str) -> Objects<'c> {
        Objects { etcd, prefix }
    }

    pub(super) fn owner_key(&self, object: &str) -> String {
        format!("{}owner/{object}", self.prefix)
    }

    pub(super) fn head_key(&self, object: &str) -> String {
        format!("{}head/{object}", self.prefix)
    }

    pub(super) fn snapshot_key(&self, object: &str) -> String {
        format!("{}snap/{object}", self.prefix)
    }

    pub(super) fn due_key(&self, object: &str) -> String {
        format!("{}due/{object}", self.prefix)
    }

    pub(super) fn gone_key(&self, object: &str) -> String {
        format!("{}gone/{object}", self.prefix)
    }

    /// Whether `object` has a tombstone: it was forgotten and the bucket may still hold some
    /// of it ([`super::Coordinator::forget`]).
    pub(super) fn gone(&self, object: &str) -> Result<bool, CoordinatorError> {
        let v = self.etcd.call(
            "gone",
            object,
            "/v3/kv/range",
            &json!({ "key": b64(&self.gone_key(object)), "count_only": true }),
        )?;
        Ok(int(&v["count"]).unwrap_or(0) > 0)
    }

    /// Takes away `object`'s tombstone once the bucket holds nothing of it, and with
    /// `release` its owner key too (this node does not serve it any more), fenced on `token`.
    pub(super) fn forgotten(
        &self,
        object: &str,
        token: i64,
        release: bool,
    ) -> Result<Advance, CoordinatorError> {
        let mut requests =
            vec![json!({ "request_delete_range": { "key": b64(&self.gone_key(object)) } })];
        if release {
            requests
                .push(json!({ "request_delete_range": { "key": b64(&self.owner_key(object)) } }));
        }
        self.fenced_all("forgotten", object, token, requests)
    }

    /// Claims `object` for `node` under `lease`: if nobody owns it, this node does from now
    /// on ([`Claim::Won`], with the fencing token); else who does ([`Claim::Held`]).
    pub(super) fn claim(
        &self,
        object: &str,
        node: &str,
        lease: &Lease,
    ) -> Result<Claim, CoordinatorError> {
        let key = b64(&self.owner_key(object));
        let txn = json!({
            "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
            "success": [{ "request_put": { "key": key, "value": b64(node), "lease": lease.id.to_string() } }],
            "failure": [{ "request_range": { "key": key } }],
        });
        let v = self.etcd.call("claim", object, "/v3/kv/txn", &txn)?;
        let err = |failure| CoordinatorError {
            op: "claim",
            object: object.to_string(),
            failure,
        };
        if v["succeeded"].as_bool().unwrap_or(false) {
            // The put is the transaction's only write: the revision it made is the key's
            // create_revision.
            let token = int(&v["header"]["revision"])
                .filter(|r| *r > 0)
                .ok_or_else(|| err(bad("no header revision")))?;
            return Ok(Claim::Won(Owner {
                node: node.to_string(),
                token,
                lease: lease.id,
            }));
        }
        let range = &v["responses"][0]["response_range"];
        match first_kv(range).map_err(err)? {
            Some((owner, token, held_by)) => {
                let o = Owner {
                    node: owner,
                    token,
                    lease: held_by,
                };
                Ok(if o.node == node && o.lease == lease.id {
                    Claim::Won(o)
                } else {
                    Claim::Held(o)
                })
            }
            // The compare failed, so the key existed when the transaction ran: its range
            // must show it.
            None => Err(err(bad("claim refused but the owner key is absent"))),
        }
    }

    /// Who owns `object`, if anyone.
    pub(super) fn owner(&self, object: &str) -> Result<Option<Owner>, CoordinatorError> {
        let v = self.etcd.call(
            "owner",
            object,
            "/v3/kv/range",
            &json!({ "key": b64(&self.owner_key(object)) }),
        )?;
        let kv = first_kv(&v).map_err(|failure| CoordinatorError {
            op: "owner",
            object: object.to_string(),
            failure,
        })?;
        Ok(kv.map(|(node, token, lease)| Owner { node, token, lease }))
    }

    /// Gives back `object`'s claim made with `token` (its owner key deleted, if it is still
    /// that claim's): for an object never written, so nothing of it stays. [`Advance::Fenced`]
    /// when another claim holds it.
    pub(super) fn release(&self, object: &str, token: i64) -> Result<Advance, CoordinatorError> {
        let delete = json!({ "request_delete_range": { "key": b64(&self.owner_key(object)) } });
        self.fenced("release", object, token, delete)
    }

    /// Records `snapshot` (uploaded already) as the one `object`'s restores start from, if
    /// `writer` still owns the object: the same fence as [`Coordinator::advance_head`], so a
    /// stale owner's snapshot is never recorded, and so never read.
    pub(super) fn record_snapshot(
        &self,
        object: &str,
        snapshot: Snapshot,
    ) -> Result<Advance, CoordinatorError> {
        let put = json!({ "request_put": {
            "key": b64(&self.snapshot_key(object)), "value": b64(&snapshot.encode()) } });
        self.fenced("record snapshot", object, snapshot.writer, put)
    }

    /// Does `request` (one write of a transaction) if `token` is still `object`'s owner's
    /// fencing token (its owner key's `create_revision`); else nothing, [`Advance::Fenced`].
    fn fenced(
        &self,
        op: &'static str,
        object: &str,
        token: i64,
        request: serde_json::Value,
    ) -> Result<Advance, CoordinatorError> {
        self.fenced_all(op, object, token, vec![request])
    }

    /// Does `requests` (the writes of one transaction) if `token` is still `object`'s owner's
    /// fencing token; else none of them, [`Advance::Fenced`].
    pub(super) fn fenced_all(
        &self,
        op: &'static str,
        object: &str,
        token: i64,
        requests: Vec<serde_json::Value>,
    ) -> Result<Advance, CoordinatorError> {
        if token <= 0 {
            // No claim yields it (revisions start at 1), and etcd compares an absent key's
            // create_revision as 0: such a token would pass the fence of an unowned object.
            return Ok(Advance::Fenced);
        }
        let txn = json!({
            "compare": [{
                "key": b64(&self.owner_key(object)),
                "target": "CREATE",
                "result": "EQUAL",
                "create_revision": token.to_string(),
            }],
            "success": requests,
            "failure": [],
        });
        let v = self.etcd.call(op, object, "/v3/kv/txn", &txn)?;
        Ok(if v["succeeded"].as_bool().unwrap_or(false) {
            Advance::Done
        } else {
            Advance::Fenced
        })
    }

    /// `object`'s head and its recorded snapshot, read together (one transaction, so at one
    /// revision).
    pub(super) fn state(
        &self,
        object: &str,
    ) -> Result<(Option<Head>, Option<Snapshot>), CoordinatorError> {
        self.state_and_due(object)
            .map(|(head, snapshot, _)| (head, snapshot))
    }

    /// `object`'s head, its recorded snapshot and its due time (`super::wakes`), read together.
    pub(super) fn state_and_due(&self, object: &str) -> Result<ObjectState, CoordinatorError> {
        let txn = json!({
            "compare": [],
            "success": [
                { "request_range": { "key": b64(&self.head_key(object)) } },
                { "request_range": { "key": b64(&self.snapshot_key(object)) } },
                { "request_range": { "key": b64(&self.due_key(object)) } },
            ],
            "failure": [],
        });
        let v = self.etcd.call("state", object, "/v3/kv/txn", &txn)?;
        let err = |failure| CoordinatorError {
            op: "state",
            object: object.to_string(),
            failure,
        };
        let range = |i: usize| first_kv(&v["responses"][i]["response_range"]).map_err(err);
        let head = match range(0)? {
            None => None,
            Some((text, _, _)) => {
                Some(Head::decode(&text).ok_or_else(|| err(bad(format!("head {text:?}"))))?)
            }
        };
        let snapshot = match range(1)? {
            None => None,
            Some((text, _, _)) => Some(
                Snapshot::decode(&text).ok_or_else(|| err(bad(format!("snapshot {text:?}"))))?,
            ),
        };
        let due = match range(2)? {
            None => None,
            Some((text, _, _)) => Some(
                text.parse()
                    .map_err(|_| err(bad(format!("due {text:?}"))))?,
            ),
        };
        Ok((head, snapshot, due))
    }

    /// `object`'s head, if a segment of it was ever shipped.
    pub(super) fn head(&self, object: &str) -> Result<Option<Head>, CoordinatorError> {
        let v = self.etcd.call(
            "head",
            object,
            "/v3/kv/range",
            &json!({ "key": b64(&self.head_key(object)) }),
        )?;
        let err = |failure| CoordinatorError {
            op: "head",
            object: object.to_string(),
            failure,
        };
        match first_kv(&v).map_err(err)? {
            None => Ok(None),
            Some((text, _, _)) => Head::decode(&text)
                .map(Some)
                .ok_or_else(|| err(bad(format!("head {text:?}")))),
        }
    }
}
