//! The coordinator: etcd v3 through its JSON gateway (`/v3/...`, keys and values in base64,
//! 64-bit numbers as strings), over blocking HTTP.
//!
//! ## Keys
//!
//! Under a prefix (one per fleet), each object has three keys:
//!
//! - `<prefix>owner/<object>`: the owning node's fleet address, attached to that node's lease,
//!   so it vanishes when the lease lapses. Its `create_revision` is the owner's **fencing
//!   token**: a later owner's key is created at a later revision, so the token of every owner
//!   differs from every earlier one's.
//! - `<prefix>head/<object>`: the last segment the owner shipped and the token of the owner
//!   that wrote it ([`Head`]). It is written only by [`Coordinator::advance_head`], in a
//!   transaction that first checks the owner key's `create_revision` against the caller's
//!   token: an owner whose lease lapsed (its key deleted, or re-created by another node's
//!   claim) cannot move the head.
//! - `<prefix>snap/<object>`: the snapshot restores start from ([`Snapshot`]), written only by
//!   [`Coordinator::record_snapshot`], fenced the same way.
//! - `<prefix>gone/<object>`: a deleted object's **tombstone**, while the bucket may still hold
//!   its segments and snapshots ([`Coordinator::forget`], [`Coordinator::forgotten`]).
//!
//! ## The parts
//!
//! [`Coordinator`] holds etcd's members (`gateway`: the member that answered last, the etcd
//! user and its tokens, `user`) and the fleet's prefix. Its calls about one object are
//! `objects`'s, those about the wake index `wakes`'s, each a type over the gateway and the
//! prefix; the coordinator's own methods hand each call to its part, and make the lease and
//! fleet id calls themselves.
//!
//! ## Leases
//!
//! One lease per node covers all its objects. [`LeaseKeeper`] renews it on a thread every
//! TTL / [`FLEET_KEEPALIVE_DIVISOR`] and tracks until when the lease is surely alive: the
//! instant each successful renewal was *sent* plus the TTL it was granted, which is no later
//! than etcd's own expiry. A node must stop serving its objects at that instant.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

use crate::http::Failure;
use crate::tls::FleetTls;

mod gateway;
mod keeper;
mod objects;
mod user;
mod wakes;

use gateway::Gateway;
pub use keeper::LeaseKeeper;
use objects::ObjectState;
use objects::Objects;
pub use wakes::DueChange;
use wakes::Wakes;

/// A coordinator call that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoordinatorError {
    /// `grant`, `keepalive`, `revoke`, `claim`, `owner`, `advance head`, `head`.
    pub op: &'static str,
    /// The object (empty for lease calls).
    pub object: String,
    /// What happened (after trying every endpoint, for a server that could not be reached).
    pub failure: Failure,
}

impl std::fmt::Display for CoordinatorError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.object.is_empty() {
            write!(f, "coordinator {}: {}", self.op, self.failure)
        } else {
            write!(
                f,
                "coordinator {} {:?}: {}",
                self.op, self.object, self.failure
            )
        }
    }
}

impl std::error::Error for CoordinatorError {}

/// A node's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// etcd's lease id.
    pub id: i64,
    /// The TTL etcd granted (it may raise the one asked for to its minimum).
    pub ttl: Duration,
}

/// An object's owner as the coordinator records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The owner's fleet address.
    pub node: String,
    /// Its fencing token: the owner key's `create_revision`.
    pub token: i64,
    /// The lease the key is attached to.
    pub lease: i64,
}

/// The outcome of a claim: a value, not an error, when another node holds the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This node owns the object (it just claimed it, or already held it under this lease).
    Won(Owner),
    /// Another node (or this node under an older lease) owns it.
    Held(Owner),
}

/// An object's head: the last segment shipped, and the token of the owner that shipped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The segment number.
    pub seq: u64,
    /// The fencing token of the owner that wrote that segment.
    pub token: i64,
}

impl Head {
    fn encode(&self) -> String {
        format!("{} {}", self.seq, self.token)
    }

    fn decode(text: &str) -> Option<Head> {
        let (seq, token) = text.split_once(' ')?;
        Some(Head {
            seq: seq.parse().ok()?,
            token: token.parse().ok()?,
        })
    }
}

/// The snapshot an object's restores start from, as its owner recorded it after uploading it:
/// the state it holds (the head it was taken at: `seq`, `token`) and the owner that wrote it
/// (`writer`, its fencing token, in the snapshot's key too), so no two owners ever write the
/// same snapshot key, and a snapshot not recorded (its writer fenced) is never read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// The segment number it is the database as of.
    pub seq: u64,
    /// The token of that segment's writer.
    pub token: i64,
    /// The token of the owner that took and uploaded it.
    pub writer: i64,
}

impl Snapshot {
    /// The head it stands for.
    pub fn head(&self) -> Head {
        Head {
            seq: self.seq,
            token: self.token,
        }
    }

    fn encode(&self) -> String {
        format!("{} {} {}", self.seq, self.token, self.writer)
    }

    fn decode(text: &str) -> Option<Snapshot> {
        let mut parts = text.split(' ');
        let s = Snapshot {
            seq: parts.next()?.parse().ok()?,
            token: parts.next()?.parse().ok()?,
            writer: parts.next()?.parse().ok()?,
        };
        parts.next().is_none().then_some(s)
    }
}

/// The outcome of a fenced head advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advance {
    /// The head is now the one given.
    Done,
    /// The caller's token is not the owner key's: it no longer owns the object, and must not
    /// acknowledge what the segment holds.
    Fenced,
}

/// A client of the coordinator. Calls block: run them on a blocking thread.
#[derive(Debug)]
pub struct Coordinator {
    /// etcd's members, and the user the calls are made as.
    etcd: Gateway,
    /// Where the fleet's keys are.
    prefix: String,
}

/// The status [`Coordinator::keep_alive`] reports for a lease that is gone for good.
pub const LEASE_GONE: u16 = 404;

fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

/// A 64-bit number from the gateway: a string (proto3 JSON) or a number; absent is 0.
fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Null => Some(0),
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

fn bad(m: impl Into<String>) -> Failure {
    Failure::BadAnswer(m.into())
}

/// The key-value of a range answer's first entry, as (value, create_revision, lease).
fn first_kv(range: &Value) -> Result<Option<(String, i64, i64)>, Failure> {
    let Some(kv) = range["kvs"].as_array().and_then(|k| k.first()) else {
        return Ok(None);
    };
    let value = match kv["value"].as_str() {
        None => String::new(),
        Some(v) => String::from_utf8(B64.decode(v).map_err(|e| bad(format!("value: {e}")))?)
            .map_err(|_| bad("value is not UTF-8"))?,
    };
    let create = int(&kv["create_revision"]).ok_or_else(|| bad("create_revision"))?;
    let lease = int(&kv["lease"]).ok_or_else(|| bad("lease"))?;
    Ok(Some((value, create, lease)))
}

impl Coordinator {
    /// A client of the etcd cluster at `endpoints` (`http://host:port`, tried in turn), keeping
    /// its keys under `prefix` (e.g. `combd/`).
    pub fn new(endpoints: &[String], prefix: &str) -> Coordinator {
        Coordinator {
            etcd: Gateway::new(endpoints),
            prefix: prefix.to_string(),
        }
    }

    /// The client, reaching `https://` endpoints with `tls` (the authorities trusted and the
    /// client certificate shown).
    pub fn with_tls(mut self, tls: &FleetTls) -> Coordinator {
        self.etcd = self.etcd.with_tls(tls);
        self
    }

    /// The client, making every call as the etcd user `name` (RBAC): its token is asked for
    /// with `password` at the first call, and again whenever a member no longer takes it.
    pub fn with_user(mut self, name: &str, password: &str) -> Coordinator {
        self.etcd = self.etcd.with_user(name, password);
        self
    }

    /// Authenticates as the configured user now (at start-up, so a wrong password fails it
    /// naming the user's settings rather than at the first object); nothing without a user.
    pub fn authenticate(&self) -> Result<(), CoordinatorError> {
        self.etcd.authenticate()
    }

    /// The calls about one object ([`objects`]).
    fn objects(&self) -> Objects<'_> {
        Objects::new(&self.etcd, &self.prefix)
    }

    /// The calls about the wake index ([`wakes`]).
    fn wakes(&self) -> Wakes<'_> {
        Wakes::new(self.objects())
    }

    // --- One object (`objects`) ---

    /// Claims `object` for `node` under `lease`: if nobody owns it, this node does from now
    /// on ([`Claim::Won`], with the fencing token); else who does ([`Claim::Held`]).
    pub fn claim(
        &self,
        object: &str,
        node: &str,
        lease: &Lease,
    ) -> Result<Claim, CoordinatorError> {
        self.objects().claim(object, node, lease)
    }

    /// Who owns `object`, if anyone.
    pub fn owner(&self, object: &str) -> Result<Option<Owner>, CoordinatorError> {
        self.objects().owner(object)
    }

    /// Gives back `object`'s claim made with `token` (its owner key deleted, if it is still
    /// that claim's): for an object never written, so nothing of it stays. [`Advance::Fenced`]
    /// when another claim holds it.
    pub fn release(&self, object: &str, token: i64) -> Result<Advance, CoordinatorError> {
        self.objects().release(object, token)
    }

    /// Records `snapshot` (uploaded already) as the one `object`'s restores start from, if
    /// `writer` still owns the object: the same fence as [`Coordinator::advance_head`], so a
    /// stale owner's snapshot is never recorded, and so never read.
    pub fn record_snapshot(
        &self,
        object: &str,
        snapshot: Snapshot,
    ) -> Result<Advance, CoordinatorError> {
        self.objects().record_snapshot(object, snapshot)
    }

    /// `object`'s head and its recorded snapshot, read together (one transaction, so at one
    /// revision).
    pub fn state(
        &self,
        object: &str,
    ) -> Result<(Option<Head>, Option<Snapshot>), CoordinatorError> {
        self.objects().state(object)
    }

    /// `object`'s head, its recorded snapshot and its due time (`super::wakes`), read together.
    pub fn state_and_due(&self, object: &str) -> Result<ObjectState, CoordinatorError> {
        self.objects().state_and_due(object)
    }

    /// `object`'s head, if a segment of it was ever shipped.
    pub fn head(&self, object: &str) -> Result<Option<Head>, CoordinatorError> {
        self.objects().head(object)
    }

    /// Records `head` as `object`'s head if `token` is still its owner's fencing token; else
    /// changes nothing and answers [`Advance::Fenced`].
    pub fn advance_head(
        &self,
        object: &str,
        token: i64,
        head: Head,
    ) -> Result<Advance, CoordinatorError> {
        self.wakes()
            .advance_head_and_due(object, token, Some(head), DueChange::NONE)
    }

    // --- The wake index (`wakes`) ---

    /// Records `head` as `object`'s head and moves its due time as `change` says (if it
    /// moves), in one transaction fenced on `token` (as [`Coordinator::advance_head`]).
    pub fn advance_head_and_due(
        &self,
        object: &str,
        token: i64,
        head: Option<Head>,
        change: DueChange,
    ) -> Result<Advance, CoordinatorError> {
        self.wakes()
            .advance_head_and_due(object, token, head, change)
    }

    /// Forgets `object` (deleted), if `token` is still its owner's: in one transaction its
    /// head, snapshot, due time (`due`, as its owner knows it) and wake key go and its
    /// tombstone is written. From then on it restores as a new object, once the bucket holds
    /// nothing of it and its tombstone is gone ([`Coordinator::forgotten`]); an owner that
    /// finds the tombstone finishes that first.
    pub fn forget(
        &self,
        object: &str,
        token: i64,
        due: Option<u64>,
    ) -> Result<Advance, CoordinatorError> {
        self.wakes().forget(object, token, due)
    }

    /// Whether `object` has a tombstone ([`Coordinator::forget`]).
    pub fn gone(&self, object: &str) -> Result<bool, CoordinatorError> {
        self.objects().gone(object)
    }

    /// Takes away `object`'s tombstone (the bucket holds nothing of it any more), and with
    /// `release` its owner key, if `token` is still its owner's.
    pub fn forgotten(
        &self,
        object: &str,
        token: i64,
        release: bool,
    ) -> Result<Advance, CoordinatorError> {
        self.objects().forgotten(object, token, release)
    }

    /// When `object` next has something due, as its last owner recorded it.
    pub fn due(&self, object: &str) -> Result<Option<u64>, CoordinatorError> {
        self.wakes().due(object)
    }

    /// The objects due at `now` or before (earliest first, at most `limit`; after the wake
    /// `after`, an object and its due time, if given: the last one of the page before), each
    /// with its due time.
    pub fn due_wakes(
        &self,
        now: u64,
        limit: usize,
        after: Option<&(String, u64)>,
    ) -> Result<Vec<(String, u64)>, CoordinatorError> {
        self.wakes().due_wakes(now, limit, after)
    }

    /// Which of `objects` have an owner now (one answer each, in order).
    pub fn owned(&self, objects: &[String]) -> Result<Vec<bool>, CoordinatorError> {
        self.wakes().owned(objects)
    }

    // --- Leases and the fleet id ---

    /// Grants a lease of `ttl` (whole seconds) for this node.
    pub fn grant_lease(&self, ttl: Duration) -> Result<Lease, CoordinatorError> {
        let v = self.etcd.call(
            "grant",
            "",
            "/v3/lease/grant",
            &json!({ "TTL": ttl.as_secs() }),
        )?;
        let err = |m: &str| CoordinatorError {
            op: "grant",
            object: String::new(),
            failure: bad(m),
        };
        let id = int(&v["ID"])
            .filter(|id| *id != 0)
            .ok_or_else(|| err("no lease ID"))?;
        let granted = int(&v["TTL"])
            .filter(|t| *t > 0)
            .ok_or_else(|| err("no TTL"))?;
        Ok(Lease {
            id,
            ttl: Duration::from_secs(granted as u64),
        })
    }

    /// Renews `lease`; the TTL it has again. A lease that already lapsed (or was revoked)
    /// fails with [`Failure::Status`] [`LEASE_GONE`] (the gateway answers 200 with no TTL).
    pub fn keep_alive(&self, lease: &Lease) -> Result<Duration, CoordinatorError> {
        let v = self.etcd.call(
            "keepalive",
            "",
            "/v3/lease/keepalive",
            &json!({ "ID": lease.id.to_string() }),
        )?;
        let ttl = int(&v["result"]["TTL"]).unwrap_or(0);
        if ttl <= 0 {
            return Err(CoordinatorError {
                op: "keepalive",
                object: String::new(),
                failure: Failure::Status {
                    code: LEASE_GONE,
                    body: format!("lease {} expired", lease.id),
                },
            });
        }
        Ok(Duration::from_secs(ttl as u64))
    }

    /// Revokes `lease` at once: every object it holds is unowned from now on.
    pub fn revoke(&self, lease: &Lease) -> Result<(), CoordinatorError> {
        self.etcd
            .call(
                "revoke",
                "",
                "/v3/lease/revoke",
                &json!({ "ID": lease.id.to_string() }),
            )
            .map(|_| ())
    }

    /// The fleet's id, if one was ever recorded (see `combd_shards::fleet`'s start).
    pub fn fleet_id(&self) -> Result<Option<String>, CoordinatorError> {
        let v = self.etcd.call(
            "fleet id",
            "",
            "/v3/kv/range",
            &json!({ "key": b64(&format!("{}fleet-id", self.prefix)) }),
        )?;
        let kv = first_kv(&v).map_err(|failure| CoordinatorError {
            op: "fleet id",
            object: String::new(),
            failure,
        })?;
        Ok(kv.map(|(id, _, _)| id))
    }

    /// Records `id` as the fleet's id unless one is recorded already; the id in force (this one,
    /// or the one another node recorded first).
    pub fn create_fleet_id(&self, id: &str) -> Result<String, CoordinatorError> {
        let key = b64(&format!("{}fleet-id", self.prefix));
        let txn = json!({
            "compare": [{ "key": key, "target": "CREATE", "result": "EQUAL", "create_revision": "0" }],
            "success": [{ "request_put": { "key": key, "value": b64(id) } }],
            "failure": [{ "request_range": { "key": key } }],
        });
        let v = self.etcd.call("fleet id", "", "/v3/kv/txn", &txn)?;
        if v["succeeded"].as_bool().unwrap_or(false) {
            return Ok(id.to_string());
        }
        let err = |failure| CoordinatorError {
            op: "fleet id",
            object: String::new(),
            failure,
        };
        first_kv(&v["responses"][0]["response_range"])
            .map_err(err)?
            .map(|(id, _, _)| id)
            .ok_or_else(|| err(bad("fleet id refused but absent")))
    }
}
