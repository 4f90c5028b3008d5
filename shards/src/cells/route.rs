//! In a fleet: routing before the cell. Once a shard learned that another node owns an object
//! (its cell found it claimed elsewhere, and the owner answered a request passed on to it), the
//! next requests for it are passed on to that owner
//! at once, with no object cell, no restore slot and no claim in etcd; a session's attach is
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
use std::time::Instant;

use combd_kernel::limits::FLEET_ROUTES_MAX;

use crate::job::{Attached, Job, Owned, Reply};

use super::Cells;

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

impl Cells {
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
    pub(super) fn route(self: &Rc<Self>, key: &str, job: Job) -> Option<Job> {
        let Some(fleet) = self.state.node().fleet.clone() else {
            return Some(job);
        };
        let Some(ttl) = self.state.settings().fleet.as_ref().map(|f| f.lease_ttl) else {
            return Some(job);
        };
        let Some(owner) = self.routes.owner(key, Instant::now(), ttl) else {
            return Some(job);
        };
        match job {
            Job {
                input:
                    Owned::Http {
                        method,
                        query,
                        body,
                        forwarded: false,
                    },
                reply: Reply::Http(reply),
                hold,
            } => {
                fleet.count_routed();
                let (cells, key) = (self.clone(), key.to_string());
                let task = self.state.spawn(async move {
                    let resp = fleet
                        .forward(&owner, &key, &method, query.as_deref(), &body)
                        .await;
                    drop(hold);
                    if resp.status == 503 {
                        cells.forget_route(&key);
                    }
                    let _ = reply.try_send(resp);
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
