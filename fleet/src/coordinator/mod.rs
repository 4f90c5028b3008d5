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
//!
//! ## Leases
//!
//! One lease per node covers all its objects. [`LeaseKeeper`] renews it on a thread every
//! TTL / [`FLEET_KEEPALIVE_DIVISOR`] and tracks until when the lease is surely alive: the
//! instant each successful renewal was *sent* plus the TTL it was granted, which is no later
//! than etcd's own expiry. A node must stop serving its objects at that instant.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use combd_kernel::limits::{FLEET_COORDINATOR_ANSWER_MAX_BYTES, FLEET_COORDINATOR_TIMEOUT};
use serde_json::{json, Value};

use crate::http::{self, Failure};
use crate::tls::FleetTls;

mod keeper;
mod objects;
mod user;
mod wakes;

pub use keeper::LeaseKeeper;
use user::{another_member_may_answer, EtcdUser};
pub use wakes::DueChange;

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
    endpoints: Vec<String>,
    /// The endpoint that answered last: calls start there.
    current: AtomicUsize,
    prefix: String,
    agent: ureq::Agent,
    /// The etcd user the calls are made as, where etcd has authentication on.
    user: Option<EtcdUser>,
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
            endpoints: endpoints.to_vec(),
            current: AtomicUsize::new(0),
            prefix: prefix.to_string(),
            agent: http::agent(FLEET_COORDINATOR_TIMEOUT, &FleetTls::default()),
            user: None,
        }
    }

    /// The client, reaching `https://` endpoints with `tls` (the authorities trusted and the
    /// client certificate shown).
    pub fn with_tls(mut self, tls: &FleetTls) -> Coordinator {
        self.agent = http::agent(FLEET_COORDINATOR_TIMEOUT, tls);
        self
    }

    /// Posts `body` to `path` on the first endpoint that answers, starting from the one that
    /// answered last; the answer's JSON.
    fn call(
        &self,
        op: &'static str,
        object: &str,
        path: &str,
        body: &Value,
    ) -> Result<Value, CoordinatorError> {
        let error = |failure| CoordinatorError {
            op,
            object: object.to_string(),
            failure,
        };
        let n = self.endpoints.len();
        let start = self.current.load(Ordering::Relaxed);
        let payload = body.to_string();
        let mut last = Failure::Unreachable("no endpoint".to_string());
        for i in 0..n {
            let at = (start + i) % n;
            let mut resp = match self.send_as_user(at, path, payload.as_bytes()) {
                Ok(r) => r,
                Err(f) if another_member_may_answer(&f) => {
                    last = f;
                    continue; // try the next member
                }
                Err(f) => return Err(error(f)),
            };
            if resp.status().is_server_error() {
                // A member without a leader, or shutting down: another may answer.
                last = http::status(&mut resp);
                continue;
            }
            self.current.store(at, Ordering::Relaxed);
            if !resp.status().is_success() {
                return Err(error(http::status(&mut resp)));
            }
            let bytes = http::body(&mut resp, FLEET_COORDINATOR_ANSWER_MAX_BYTES).map_err(error)?;
            return serde_json::from_slice(&bytes).map_err(|e| error(bad(format!("JSON: {e}"))));
        }
        Err(error(last))
    }

    /// Grants a lease of `ttl` (whole seconds) for this node.
    pub fn grant_lease(&self, ttl: Duration) -> Result<Lease, CoordinatorError> {
        let v = self.call(
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
        let v = self.call(
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
        self.call(
            "revoke",
            "",
            "/v3/lease/revoke",
            &json!({ "ID": lease.id.to_string() }),
        )
        .map(|_| ())
    }

    /// The fleet's id, if one was ever recorded (see `combd_shards::fleet`'s start).
    pub fn fleet_id(&self) -> Result<Option<String>, CoordinatorError> {
        let v = self.call(
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
        let v = self.call("fleet id", "", "/v3/kv/txn", &txn)?;
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
