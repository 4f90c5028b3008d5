//! In a fleet: routing before the cell. A request (or a WebSocket's attach) for an object with
//! no cell on this shard and no route first asks the coordinator who owns it: a read, not a
//! claim ([`Owners::look_up`]; the requests for it that arrive meanwhile wait for the same
//! read). Owned by another node, it is passed on there with no object cell, no restore slot
//! and no claim in etcd; unowned (or this node's, or unreadable), it goes to a cell, which
//! claims it. Once the owner answered a request passed on to it, the next requests for the
//! object are passed on to that owner at once, without asking again; a session's attach is
//! answered with the owner, for its WebSocket to be passed through.
//!
//! A route is kept for the node's lease TTL (`COMBD_FLEET_LEASE_TTL`) from when it was learned:
//! an owner's claim outlives its death by at most its lease, so a route learned before it died
//! ends no later than the claim does, and the next request asks etcd again. It is forgotten at
//! once when the owner answers 503 or cannot be reached (its object moved, or the owner is
//! gone), and when this node opens the object itself. At most [`FLEET_ROUTES_MAX`] per shard.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::FLEET_ROUTES_MAX;

use crate::app::App;
use crate::fair::{Ledger, Share};
use crate::fleet::Fleet;
use crate::job::{Attached, Job, Owned, Reply};
use crate::object_key::ObjectKey;
use crate::state::ShardState;
use crate::stats::ShardStats;

use super::{Cells, Refusal};

/// A shard's routing in a fleet: the owners it learned, and the reads of owners on their way.
/// Its work is done for the shard's [`Cells`], which hold it.
#[derive(Default)]
pub(super) struct Owners {
    /// The owners (other nodes) of objects asked for lately.
    routes: Routes,
    /// The reads of an owner on their way.
    lookups: Lookups,
}

/// The owners a shard knows, by object key.
#[derive(Default)]
pub(super) struct Routes {
    owners: RefCell<HashMap<String, Route>>,
}

struct Route {
    owner: String,
    learned: Instant,
}

impl Routes {
    /// The owner of `key` if a route to it is fresh at `now`.
    fn owner(&self, key: &str, now: Instant, ttl: std::time::Duration) -> Option<String> {
        let mut owners = self.owners.borrow_mut();
        match owners.get(key) {
            Some(r) if now.saturating_duration_since(r.learned) < ttl => Some(r.owner.clone()),
            Some(_) => {
                owners.remove(key);
                None
            }
            None => None,
        }
    }

    fn learn(&self, key: &str, owner: &str, now: Instant) {
        let mut owners = self.owners.borrow_mut();
        if owners.len() >= FLEET_ROUTES_MAX && !owners.contains_key(key) {
            // Forget the older half: they go through a cell again, once each.
            let mut ages: Vec<Instant> = owners.values().map(|r| r.learned).collect();
            ages.sort_unstable();
            let cut = ages[ages.len() / 2];
            owners.retain(|_, r| r.learned > cut);
        }
        owners.insert(
            key.to_string(),
            Route {
                owner: owner.to_string(),
                learned: now,
            },
        );
    }

    fn forget(&self, key: &str) {
        self.owners.borrow_mut().remove(key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.owners.borrow().len()
    }
}

/// The reads of an owner on their way, by object key, with the jobs that wait for each.
#[derive(Default)]
pub(super) struct Lookups {
    waiting: RefCell<HashMap<String, Vec<Job>>>,
}

impl Lookups {
    /// Starts a read for `key`, with `job` its first waiting job.
    fn start(&self, key: &str, job: Job, stats: &ShardStats) {
        let mut waiting = self.waiting.borrow_mut();
        waiting.insert(key.to_string(), vec![job]);
        Self::count(waiting.len(), stats);
    }

    /// Ends the read for `key`: the jobs that waited for it.
    fn end(&self, key: &str, stats: &ShardStats) -> Vec<Job> {
        let mut waiting = self.waiting.borrow_mut();
        let jobs = waiting.remove(key).unwrap_or_default();
        Self::count(waiting.len(), stats);
        jobs
    }

    fn count(len: usize, stats: &ShardStats) {
        let len = len as u64;
        stats.fleet_lookups_waiting.store(len, Ordering::Relaxed);
        stats
            .fleet_lookups_waiting_max
            .fetch_max(len, Ordering::Relaxed);
    }
}

/// Whether `job` may be passed on to another node: an HTTP request no node passed on yet, or
/// an attach whose WebSocket may be passed through.
fn passable(job: &Job) -> bool {
    matches!(
        (&job.input, &job.reply),
        (
            Owned::Http {
                forwarded: false,
                ..
            },
            Reply::Http(_)
        ) | (Owned::Attach { .. }, Reply::Attach { may_pass: true, .. })
    )
}

impl Owners {
    /// In a fleet, a job for an object with no cell here and no fresh route: unless another
    /// node passed it on (it is for this node to serve or refuse), it waits for a read of the
    /// object's owner, shared with the jobs for the object that come meanwhile (as many as its
    /// mailbox holds; past that refused like a full mailbox), then goes to the owner or, if
    /// there is none, to a cell. The job back when it goes to a cell now.
    pub(super) fn look_up(
        &self,
        cells: &Rc<Cells>,
        app: &Arc<dyn App>,
        key: &ObjectKey,
        job: Job,
    ) -> Option<Job> {
        let Some(fleet) = cells.state.node().fleet.clone() else {
            return Some(job);
        };
        if !passable(&job) {
            return Some(job);
        }
        {
            let mut waiting = self.lookups.waiting.borrow_mut();
            if let Some(jobs) = waiting.get_mut(key.as_str()) {
                if jobs.len() >= app.mailbox() {
                    drop(waiting);
                    ShardStats::add(&cells.state.stats().mailbox_refused, 1);
                    cells.refuse(job, Refusal::MailboxFull { cap: app.mailbox() });
                } else {
                    jobs.push(job);
                }
                return None;
            }
        }
        // A lookup slot of the shard's (`FLEET_LOOKUPS_MAX`), within the asker's share of them;
        // past either, a spray of names goes to a cell, bounded by the asker's share of the
        // node's live objects.
        let lookups = &cells.state.node().pools.lookups[cells.state.id()];
        let Ok(slot) = lookups.take(job.asker, 1) else {
            ShardStats::add(&cells.state.stats().fleet_lookups_overflowed, 1);
            return Some(job);
        };
        let asker = job.asker;
        self.lookups.start(key, job, cells.state.stats());
        let what = (app.clone(), key.clone());
        let task = cells
            .state
            .spawn(read_owner(cells.clone(), fleet, what, asker, slot));
        match task {
            Ok(t) => {
                t.detach();
            }
            // A shard that drains takes no task: the dropped replies answer the connections.
            Err(_) => {
                self.lookups.end(key, cells.state.stats());
            }
        }
        None
    }

    /// Passes the HTTP requests and messages from other objects of `jobs` on to `owner` (all
    /// at once, each on its own connection and within its own deadline, answered with the
    /// owner's answer), answers an alarm wake that the owner fires the object's alarms, tells a
    /// WebSocket attaching that its connection is to be passed through to `owner`, and refuses
    /// the rest with `refusal`: a session's message (its connection is attached here, to an
    /// object this node no longer serves), or a request or WebSocket another node already
    /// passed on; with no owner, refuses them all. An owner that answered (not 503) is
    /// remembered as the object's route.
    pub(super) async fn pass_on(
        &self,
        cells: &Cells,
        key: &str,
        jobs: Vec<Job>,
        refusal: Refusal,
        owner: Option<String>,
    ) {
        let fleet = cells.state.node().fleet.clone();
        let mut passing = Vec::new();
        for job in jobs {
            match (job.input, job.reply, &owner, &fleet) {
                (
                    input @ Owned::Http {
                        forwarded: false, ..
                    },
                    Reply::Http(reply),
                    Some(_),
                    Some(_),
                ) => passing.push(Passing::new(
                    &cells.state,
                    Pass::request(input),
                    reply,
                    job.hold,
                    job.asker,
                )),
                (
                    Owned::FromObject {
                        app,
                        name,
                        id,
                        body,
                        passed: false,
                    },
                    Reply::Http(reply),
                    Some(_),
                    Some(_),
                ) => {
                    let from = format!("{app}/{name}");
                    let what = Pass::Message { from, id, body };
                    passing.push(Passing::new(&cells.state, what, reply, job.hold, job.asker));
                }
                (Owned::Alarms, Reply::Http(reply), Some(owner), Some(_)) => {
                    // Its owner fires its alarms: this node's alarm index lets it go.
                    let _ = reply.try_send(crate::http::Response::json(
                        200,
                        &serde_json::json!({ "elsewhere": owner }),
                    ));
                }
                (
                    Owned::Attach { .. },
                    Reply::Attach {
                        reply,
                        may_pass: true,
                    },
                    Some(owner),
                    Some(_),
                ) => {
                    let _ = reply.try_send(Attached::Owner(owner.clone()));
                }
                (_, reply, _, _) => cells.refuse_job_reply(reply, refusal),
            }
        }
        if let (Some(owner), Some(fleet)) = (owner, fleet) {
            self.pass_all(cells, key, &owner, &fleet, passing).await;
        }
    }

    /// Passes each of `passing` on to `owner` at once and waits for them; an owner that
    /// answered one (not 503) is remembered as `key`'s route.
    async fn pass_all(
        &self,
        cells: &Cells,
        key: &str,
        owner: &str,
        fleet: &Arc<crate::fleet::Fleet>,
        passing: Vec<Passing>,
    ) {
        let forwards = passing.into_iter().map(|p| {
            let (fleet, owner, key) = (fleet.clone(), owner.to_string(), key.to_string());
            cells
                .state
                .spawn(async move { p.go(&fleet, &owner, &key).await != 503 })
        });
        let mut served = false;
        for task in forwards.collect::<Vec<_>>().into_iter().flatten() {
            served |= task.await;
        }
        if served {
            // The owner serves it: the next requests for the object go there without a cell (not
            // an owner that could not be reached: those ask etcd again, so the first one after
            // its lease lapsed claims the object).
            self.route_to(key, owner);
        }
    }

    /// Remembers that `owner` (another node's fleet address) owns `key`.
    pub(super) fn route_to(&self, key: &str, owner: &str) {
        self.routes.learn(key, owner, Instant::now());
    }

    /// Forgets the route to `key`'s owner (this node opened it, or the owner did not serve it).
    pub(super) fn forget_route(&self, key: &str) {
        self.routes.forget(key);
    }

    /// Passes `job` on to the owner this shard knows for `key`, without a cell: an HTTP request
    /// no node passed on yet, or an attach whose WebSocket may be passed through. The job back
    /// when there is no fresh route, or it is of another kind (it goes to a cell).
    pub(super) fn route(&self, cells: &Rc<Cells>, key: &str, job: Job) -> Option<Job> {
        let Some(fleet) = cells.state.node().fleet.clone() else {
            return Some(job);
        };
        let Some(ttl) = cells.state.settings().fleet.as_ref().map(|f| f.lease_ttl) else {
            return Some(job);
        };
        let Some(owner) = self.routes.owner(key, Instant::now(), ttl) else {
            return Some(job);
        };
        match job {
            Job {
                input:
                    input @ Owned::Http {
                        forwarded: false, ..
                    },
                reply: Reply::Http(reply),
                hold,
                asker,
            } => {
                fleet.count_routed();
                let (mine, key) = (cells.clone(), key.to_string());
                let p = Passing::new(&cells.state, Pass::request(input), reply, hold, asker);
                let task = cells.state.spawn(async move {
                    let cells = mine;
                    if p.go(&fleet, &owner, &key).await == 503 {
                        cells.owners.forget_route(&key);
                    }
                });
                // A shard that drains takes no task: the dropped reply answers the connection.
                if let Ok(t) = task {
                    t.detach();
                }
                None
            }
            Job {
                input: Owned::Attach { .. },
                reply:
                    Reply::Attach {
                        reply,
                        may_pass: true,
                    },
                ..
            } => {
                fleet.count_routed();
                let _ = reply.try_send(Attached::Owner(owner));
                None
            }
            job => Some(job),
        }
    }
}

/// Reads the owner of `object` (of `app`) on a blocking thread for `asker`,
/// holding its lookup `slot` until then; then passes the jobs that waited for the read on to
/// the owner, or, with none, gives them to the object's cell.
async fn read_owner(
    cells: Rc<Cells>,
    fleet: Arc<Fleet>,
    (app, object): (Arc<dyn App>, ObjectKey),
    asker: ClientKey,
    slot: Share,
) {
    let asked = object.to_string();
    let owner = cells
        .state
        .on_thread(asker, move || fleet.lookup(&asked))
        .await;
    drop(slot);
    let jobs = cells.owners.lookups.end(&object, cells.state.stats());
    match owner {
        Some(owner) => {
            cells
                .owners
                .pass_on(&cells, &object, jobs, Refusal::NotOwner, Some(owner))
                .await
        }
        None => {
            for job in jobs {
                cells.to_cell(&app, object.name(), object.clone(), job);
            }
        }
    }
}

/// An HTTP request or a message from another object on its way to its object's owner on
/// another node, with where its answer goes and its bytes held against its connection's
/// inbound budget.
struct Passing {
    what: Pass,
    reply: async_channel::Sender<crate::http::Response>,
    hold: Option<crate::inbound::Hold>,
    /// Who asked: the owner's answer is reserved in its share of the node's answer pool.
    asker: ClientKey,
    answers: Arc<Ledger>,
}

/// What is passed on.
enum Pass {
    /// A client's HTTP request.
    Request {
        method: String,
        query: Option<String>,
        body: Vec<u8>,
        client: Option<Arc<crate::auth::Client>>,
        caller: Arc<crate::app::Caller>,
    },
    /// Message `id` of object `from`'s outbox (`app/name`).
    Message {
        from: String,
        id: i64,
        body: Vec<u8>,
    },
}

impl Pass {
    /// What passes on a client's HTTP request (`input` is one).
    fn request(input: Owned) -> Pass {
        match input {
            Owned::Http {
                method,
                query,
                body,
                client,
                caller,
                ..
            } => Pass::Request {
                method,
                query,
                body,
                client,
                caller,
            },
            _ => unreachable!("only an HTTP request is passed on as one"),
        }
    }
}

impl Passing {
    /// `what` to pass on, answered on `reply`, its input's bytes held by `hold` until then, its
    /// answer reserved for `asker` in the node's answer pool (`state`'s node's).
    fn new(
        state: &ShardState,
        what: Pass,
        reply: async_channel::Sender<crate::http::Response>,
        hold: Option<crate::inbound::Hold>,
        asker: ClientKey,
    ) -> Passing {
        let answers = state.node().pools.answers.clone();
        Passing {
            what,
            reply,
            hold,
            asker,
            answers,
        }
    }

    /// Passes it on to `owner` and answers it with the owner's answer (its bytes released once
    /// that came), reserved for the client that asked (past its share of the node's answer
    /// pool: 503 `overloaded`, the owner's answer dropped at once): the answer's status.
    async fn go(self, fleet: &crate::fleet::Fleet, owner: &str, key: &str) -> u16 {
        let Passing {
            what,
            reply,
            hold,
            asker,
            answers,
        } = self;
        let (resp, read) = match what {
            Pass::Request {
                method,
                query,
                body,
                client,
                caller,
            } => {
                let token = client.as_deref().map(crate::auth::Client::token);
                let resp = fleet
                    .pass_on
                    .forward(owner, key, &method, query.as_deref(), &body, token, &caller)
                    .await;
                (resp, method == "GET" || method == "HEAD")
            }
            Pass::Message { from, id, body } => {
                let resp = fleet
                    .pass_on
                    .pass_message(owner, key, &from, id, &body)
                    .await;
                (resp, false)
            }
        };
        drop(hold);
        let status = resp.status;
        // Only a read's answer may be refused now: another's effect is committed at the owner
        // (a 503 would have it done again), so its bytes are counted past the share.
        let bytes = resp.body.len() as u64;
        let resp = match answers.take(asker, bytes) {
            Ok(share) => resp.reserved_by(share),
            Err(_) if !read => resp.reserved_by(answers.force(asker, bytes)),
            Err(_) => Refusal::AnswersHeld.response(),
        };
        let _ = reply.try_send(resp);
        status
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_route_lasts_its_ttl_and_the_table_stays_bounded() {
        let routes = Routes::default();
        let t0 = Instant::now();
        let ttl = Duration::from_secs(2);
        routes.learn("counter/a", "10.0.0.2:7946", t0);
        assert_eq!(
            routes.owner("counter/a", t0 + Duration::from_millis(1999), ttl),
            Some("10.0.0.2:7946".to_string())
        );
        assert_eq!(routes.owner("counter/a", t0 + ttl, ttl), None);
        assert_eq!(routes.len(), 0, "an expired route is dropped");
        routes.learn("counter/b", "10.0.0.3:7946", t0);
        routes.forget("counter/b");
        assert_eq!(routes.owner("counter/b", t0, ttl), None);
        for i in 0..FLEET_ROUTES_MAX {
            routes.learn(
                &format!("counter/{i}"),
                "10.0.0.2:7946",
                t0 + Duration::from_nanos(i as u64),
            );
        }
        assert_eq!(routes.len(), FLEET_ROUTES_MAX);
        routes.learn("counter/new", "10.0.0.2:7946", t0 + Duration::from_secs(1));
        assert!(routes.len() <= FLEET_ROUTES_MAX / 2 + 1, "{}", routes.len());
        assert!(routes
            .owner("counter/new", t0 + Duration::from_secs(1), ttl)
            .is_some());
    }
}
