//! This node's lease in the coordinator ([`NodeLease`]): granted at start, kept alive by its
//! keeper thread, replaced by a new grant when it is lost, and given back when the node stops.
//! An object claimed under a lease serves only while that lease is this node's and holds.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use combd_fleet::coordinator::{Coordinator, Lease, LeaseKeeper};
use combd_kernel::limits::FLEET_LEASE_REGRANT_INTERVAL;

use super::FleetStats;

/// This node's lease: the one it holds now and what replacing a lost one needs.
pub(super) struct NodeLease {
    coordinator: Arc<Coordinator>,
    /// The lease this node holds now, kept alive by its keeper; a lost one is replaced by a
    /// new grant ([`NodeLease::regrant_if_lost`]).
    keeper: Mutex<LeaseKeeper>,
    /// The TTL asked for (`COMBD_FLEET_LEASE_TTL`).
    ttl: Duration,
    /// When a new lease was last asked for.
    last_grant: Mutex<Instant>,
    /// Counts the grants and the grants refused.
    stats: Arc<FleetStats>,
}

/// Grants a lease of `ttl` and starts keeping it alive.
fn grant(coordinator: &Arc<Coordinator>, ttl: Duration) -> Result<LeaseKeeper, String> {
    let sent = Instant::now();
    let lease = coordinator
        .grant_lease(ttl)
        .map_err(|e| format!("cannot grant this node's lease: {e}"))?;
    LeaseKeeper::start(coordinator.clone(), lease, sent)
        .map_err(|e| format!("cannot start the lease keeper: {e}"))
}

impl NodeLease {
    /// Grants this node's first lease of `ttl` and starts keeping it (counted in `stats`).
    pub(super) fn grant(
        coordinator: Arc<Coordinator>,
        ttl: Duration,
        stats: Arc<FleetStats>,
    ) -> Result<NodeLease, String> {
        let sent = Instant::now();
        let keeper = grant(&coordinator, ttl)?;
        stats.lease_grants.fetch_add(1, Ordering::Relaxed);
        Ok(NodeLease {
            coordinator,
            keeper: Mutex::new(keeper),
            ttl,
            last_grant: Mutex::new(sent),
            stats,
        })
    }

    fn keeper(&self) -> MutexGuard<'_, LeaseKeeper> {
        self.keeper.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lease this node holds now.
    pub(super) fn lease(&self) -> Lease {
        self.keeper().lease()
    }

    /// Whether this node's lease holds now.
    pub(super) fn holds(&self) -> bool {
        self.keeper().holds_at(Instant::now())
    }

    /// Whether lease `id` is this node's lease now and holds: what an object claimed under it
    /// may serve by.
    pub(super) fn holds_lease(&self, id: i64) -> bool {
        let k = self.keeper();
        k.lease().id == id && k.holds_at(Instant::now())
    }

    /// Gives this node's lease back. Blocking.
    pub(super) fn release(&self) {
        if let Err(e) = self.coordinator.revoke(&self.lease()) {
            tracing::warn!("cannot give the fleet lease back (it lapses after its TTL): {e}");
        }
    }

    /// A node whose lease is gone (etcd refused a renewal, or none got through for a TTL)
    /// asks for a new one, at most once every `FLEET_LEASE_REGRANT_INTERVAL`: its objects of
    /// the old lease stay refused (their tokens are fenced, and they serve by the old lease),
    /// and it claims objects again under the new one. Without this, a node cut off from etcd
    /// for longer than its TTL would refuse every object until restarted. Blocking.
    pub(super) fn regrant_if_lost(&self) {
        if !self.keeper().lost() {
            return;
        }
        {
            let mut last = self.last_grant.lock().unwrap_or_else(|p| p.into_inner());
            if last.elapsed() < FLEET_LEASE_REGRANT_INTERVAL {
                return;
            }
            *last = Instant::now();
        }
        match grant(&self.coordinator, self.ttl) {
            Ok(keeper) => {
                // The old keeper's thread has ended (its lease was lost): dropping it joins
                // at once.
                *self.keeper() = keeper;
                self.stats.lease_grants.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("this node's fleet lease was lost: granted a new one");
            }
            Err(e) => {
                self.stats
                    .lease_grant_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!("this node's fleet lease was lost; {e}")
            }
        }
    }
}
