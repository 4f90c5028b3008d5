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

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use combd_kernel::limits::{
    FLEET_AUTHENTICATE_TIMEOUT, FLEET_COORDINATOR_ANSWER_MAX_BYTES, FLEET_COORDINATOR_TIMEOUT,
    FLEET_KEEPALIVE_DIVISOR,
};
use serde_json::{json, Value};

use crate::http::{self, Failure};
use crate::tls::FleetTls;

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

/// An etcd user (RBAC), its password, and the token the member that answered last issued it.
/// etcd's simple tokens live in the memory of the member that issued them, for its
/// `--auth-token-ttl` after their last use: a token is asked of the member a call goes to when
/// the one held is another member's, and again when that member answers 401 (it restarted, or
/// the token expired).
struct EtcdUser {
    name: String,
    password: String,
    /// (the endpoint's index, its token).
    token: Mutex<Option<(usize, String)>>,
}

impl std::fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Neither the password nor a token: either lets its holder act as the node.
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl EtcdUser {
    fn token_for(&self, at: usize) -> Option<String> {
        let held = self.token.lock().unwrap_or_else(|p| p.into_inner());
        held.as_ref()
            .filter(|(e, _)| *e == at)
            .map(|(_, t)| t.clone())
    }

    fn hold(&self, at: usize, token: &str) {
        *self.token.lock().unwrap_or_else(|p| p.into_inner()) = Some((at, token.to_string()));
    }
}

/// The longest token accepted from etcd (a simple token is ~20 bytes, a JWT one ~300).
const TOKEN_MAX_BYTES: usize = 4096;

/// Whether a failure of one member is worth trying the next for: it could not be reached, took
/// too long, or answered a server error (no leader, shutting down).
fn another_member_may_answer(f: &Failure) -> bool {
    matches!(f, Failure::Unreachable(_) | Failure::Timeout)
        || matches!(f, Failure::Status { code, .. } if *code >= 500)
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

    /// The client, making every call as the etcd user `name` (RBAC): its token is asked for
    /// with `password` at the first call, and again whenever a member no longer takes it.
    pub fn with_user(mut self, name: &str, password: &str) -> Coordinator {
        self.user = Some(EtcdUser {
            name: name.to_string(),
            password: password.to_string(),
            token: Mutex::new(None),
        });
        self
    }

    /// Authenticates as the configured user now (at start-up, so a wrong password fails it
    /// naming the user's settings rather than at the first object); nothing without a user.
    pub fn authenticate(&self) -> Result<(), CoordinatorError> {
        if self.user.is_none() {
            return Ok(());
        }
        let n = self.endpoints.len();
        let start = self.current.load(Ordering::Relaxed);
        let mut last = Failure::Unreachable("no endpoint".to_string());
        for i in 0..n {
            let at = (start + i) % n;
            match self.token_from(at) {
                Ok(_) => {
                    self.current.store(at, Ordering::Relaxed);
                    return Ok(());
                }
                Err(f) => {
                    let next = another_member_may_answer(&f);
                    last = f;
                    if !next {
                        break; // a wrong password: the next member would say the same
                    }
                }
            }
        }
        Err(CoordinatorError {
            op: "authenticate",
            object: String::new(),
            failure: last,
        })
    }

    /// One POST to member `at`, with `token` as etcd's gateway takes it, over within
    /// `timeout`.
    fn send(
        &self,
        at: usize,
        path: &str,
        payload: &[u8],
        token: Option<&str>,
        timeout: Duration,
    ) -> Result<ureq::http::Response<ureq::Body>, Failure> {
        let url = format!("{}{path}", self.endpoints[at]);
        let mut req = self
            .agent
            .post(&url)
            .config()
            .timeout_global(Some(timeout))
            .build()
            .header("content-type", "application/json");
        if let Some(t) = token {
            req = req.header("authorization", t);
        }
        req.send(payload).map_err(http::failure)
    }

    /// A new token for the user from member `at`, held for the next calls to it.
    fn token_from(&self, at: usize) -> Result<String, Failure> {
        let Some(user) = &self.user else {
            return Err(bad("no etcd user"));
        };
        let body = json!({ "name": user.name, "password": user.password }).to_string();
        let mut resp = self.send(
            at,
            "/v3/auth/authenticate",
            body.as_bytes(),
            None,
            FLEET_AUTHENTICATE_TIMEOUT,
        )?;
        if !resp.status().is_success() {
            return Err(http::status(&mut resp));
        }
        let bytes = http::body(&mut resp, FLEET_COORDINATOR_ANSWER_MAX_BYTES)?;
        let v: Value = serde_json::from_slice(&bytes).map_err(|e| bad(format!("JSON: {e}")))?;
        let token = v["token"]
            .as_str()
            .filter(|t| {
                !t.is_empty()
                    && t.len() <= TOKEN_MAX_BYTES
                    && t.bytes().all(|b| b.is_ascii_graphic())
            })
            .ok_or_else(|| bad("authenticate: no token (is authentication on in etcd?)"))?
            .to_string();
        user.hold(at, &token);
        Ok(token)
    }

    /// [`Coordinator::send`] as the user, where there is one: with the token member `at`
    /// issued, asked for first if none is held for it, and asked for again once if the member
    /// answers 401 (the token expired or the member restarted).
    fn send_as_user(
        &self,
        at: usize,
        path: &str,
        payload: &[u8],
    ) -> Result<ureq::http::Response<ureq::Body>, Failure> {
        let Some(user) = &self.user else {
            return self.send(at, path, payload, None, FLEET_COORDINATOR_TIMEOUT);
        };
        let token = match user.token_for(at) {
            Some(t) => t,
            None => self.token_from(at)?,
        };
        let resp = self.send(at, path, payload, Some(&token), FLEET_COORDINATOR_TIMEOUT)?;
        if resp.status().as_u16() != 401 {
            return Ok(resp);
        }
        let token = self.token_from(at)?;
        self.send(at, path, payload, Some(&token), FLEET_COORDINATOR_TIMEOUT)
    }

    fn owner_key(&self, object: &str) -> String {
        format!("{}owner/{object}", self.prefix)
    }

    fn head_key(&self, object: &str) -> String {
        format!("{}head/{object}", self.prefix)
    }

    fn snapshot_key(&self, object: &str) -> String {
        format!("{}snap/{object}", self.prefix)
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

    /// Claims `object` for `node` under `lease`: if nobody owns it, this node does from now
    /// on ([`Claim::Won`], with the fencing token); else who does ([`Claim::Held`]).
    pub fn claim(
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
        let v = self.call("claim", object, "/v3/kv/txn", &txn)?;
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
    pub fn owner(&self, object: &str) -> Result<Option<Owner>, CoordinatorError> {
        let v = self.call(
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

    /// Records `head` as `object`'s head if `token` is still its owner's fencing token; else
    /// changes nothing and answers [`Advance::Fenced`].
    pub fn advance_head(
        &self,
        object: &str,
        token: i64,
        head: Head,
    ) -> Result<Advance, CoordinatorError> {
        if token <= 0 {
            // No claim yields it (revisions start at 1), and etcd compares an absent key's
            // create_revision as 0: such a token would advance the head of an unowned object.
            return Ok(Advance::Fenced);
        }
        let txn = json!({
            "compare": [{
                "key": b64(&self.owner_key(object)),
                "target": "CREATE",
                "result": "EQUAL",
                "create_revision": token.to_string(),
            }],
            "success": [{ "request_put": { "key": b64(&self.head_key(object)), "value": b64(&head.encode()) } }],
            "failure": [],
        });
        let v = self.call("advance head", object, "/v3/kv/txn", &txn)?;
        Ok(if v["succeeded"].as_bool().unwrap_or(false) {
            Advance::Done
        } else {
            Advance::Fenced
        })
    }

    /// Gives back `object`'s claim made with `token` (its owner key deleted, if it is still
    /// that claim's): for an object never written, so nothing of it stays. [`Advance::Fenced`]
    /// when another claim holds it.
    pub fn release(&self, object: &str, token: i64) -> Result<Advance, CoordinatorError> {
        if token <= 0 {
            return Ok(Advance::Fenced);
        }
        let key = b64(&self.owner_key(object));
        let txn = json!({
            "compare": [{
                "key": key, "target": "CREATE", "result": "EQUAL",
                "create_revision": token.to_string(),
            }],
            "success": [{ "request_delete_range": { "key": key } }],
            "failure": [],
        });
        let v = self.call("release", object, "/v3/kv/txn", &txn)?;
        Ok(if v["succeeded"].as_bool().unwrap_or(false) {
            Advance::Done
        } else {
            Advance::Fenced
        })
    }

    /// Records `snapshot` (uploaded already) as the one `object`'s restores start from, if
    /// `writer` still owns the object: the same fence as [`Coordinator::advance_head`], so a
    /// stale owner's snapshot is never recorded, and so never read.
    pub fn record_snapshot(
        &self,
        object: &str,
        snapshot: Snapshot,
    ) -> Result<Advance, CoordinatorError> {
        if snapshot.writer <= 0 {
            return Ok(Advance::Fenced);
        }
        let txn = json!({
            "compare": [{
                "key": b64(&self.owner_key(object)),
                "target": "CREATE",
                "result": "EQUAL",
                "create_revision": snapshot.writer.to_string(),
            }],
            "success": [{ "request_put": {
                "key": b64(&self.snapshot_key(object)), "value": b64(&snapshot.encode()) } }],
            "failure": [],
        });
        let v = self.call("record snapshot", object, "/v3/kv/txn", &txn)?;
        Ok(if v["succeeded"].as_bool().unwrap_or(false) {
            Advance::Done
        } else {
            Advance::Fenced
        })
    }

    /// `object`'s head and its recorded snapshot, read together (one transaction, so at one
    /// revision).
    pub fn state(
        &self,
        object: &str,
    ) -> Result<(Option<Head>, Option<Snapshot>), CoordinatorError> {
        let txn = json!({
            "compare": [],
            "success": [
                { "request_range": { "key": b64(&self.head_key(object)) } },
                { "request_range": { "key": b64(&self.snapshot_key(object)) } },
            ],
            "failure": [],
        });
        let v = self.call("state", object, "/v3/kv/txn", &txn)?;
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
        Ok((head, snapshot))
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

    /// `object`'s head, if a segment of it was ever shipped.
    pub fn head(&self, object: &str) -> Result<Option<Head>, CoordinatorError> {
        let v = self.call(
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

/// What the keeper thread and its owner share.
#[derive(Debug)]
struct KeeperState {
    /// Until when the lease is surely alive (see the module doc).
    valid_until: Mutex<Instant>,
    /// The lease lapsed or a renewal was refused: it will not come back.
    lost: AtomicBool,
    /// Renewals that failed (the server unreachable, slow or refusing).
    renewals_failed: AtomicUsize,
}

/// Keeps one lease alive from a thread of its own, renewing it every TTL /
/// [`FLEET_KEEPALIVE_DIVISOR`]. Dropping it stops the thread (it does not revoke the lease).
#[derive(Debug)]
pub struct LeaseKeeper {
    lease: Lease,
    state: Arc<KeeperState>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl LeaseKeeper {
    /// Starts keeping `lease`, granted at `granted_at` (the instant the grant was sent), alive
    /// with `coordinator`.
    pub fn start(
        coordinator: Arc<Coordinator>,
        lease: Lease,
        granted_at: Instant,
    ) -> std::io::Result<LeaseKeeper> {
        let state = Arc::new(KeeperState {
            valid_until: Mutex::new(granted_at + lease.ttl),
            lost: AtomicBool::new(false),
            renewals_failed: AtomicUsize::new(0),
        });
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = Arc::clone(&state);
        let every = lease.ttl / FLEET_KEEPALIVE_DIVISOR;
        let thread = std::thread::Builder::new()
            .name("combd-lease".to_string())
            .spawn(move || loop {
                match stopped.recv_timeout(every) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
                let sent = Instant::now();
                match coordinator.keep_alive(&lease) {
                    Ok(ttl) => {
                        let mut until =
                            shared.valid_until.lock().unwrap_or_else(|p| p.into_inner());
                        *until = (*until).max(sent + ttl);
                    }
                    Err(e) => {
                        shared.renewals_failed.fetch_add(1, Ordering::Relaxed);
                        let expired = matches!(
                            e.failure,
                            Failure::Status {
                                code: LEASE_GONE,
                                ..
                            }
                        );
                        let until = *shared.valid_until.lock().unwrap_or_else(|p| p.into_inner());
                        if expired || Instant::now() >= until {
                            shared.lost.store(true, Ordering::Release);
                            return;
                        }
                    }
                }
            })?;
        Ok(LeaseKeeper {
            lease,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The lease kept.
    pub fn lease(&self) -> Lease {
        self.lease
    }

    /// Until when the lease is surely alive: the node may serve its objects before this
    /// instant and must not after it.
    pub fn valid_until(&self) -> Instant {
        *self
            .state
            .valid_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the node may still serve its objects at `now`.
    pub fn holds_at(&self, now: Instant) -> bool {
        !self.state.lost.load(Ordering::Acquire) && now < self.valid_until()
    }

    /// Whether the lease is gone for good (lapsed, or refused by etcd).
    pub fn lost(&self) -> bool {
        self.state.lost.load(Ordering::Acquire)
    }

    /// Renewals that failed so far.
    pub fn renewals_failed(&self) -> usize {
        self.state.renewals_failed.load(Ordering::Relaxed)
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
