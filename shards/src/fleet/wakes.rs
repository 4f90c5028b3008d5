//! Taking up a dead owner's alarms ([`WakeSweep`]): every [`FLEET_WAKE_SWEEP_INTERVAL`] one shard of each node
//! reads the fleet's wake index (`combd_fleet::coordinator`, `wakes`: the objects whose shipped
//! state has an alarm or a message due, written with their heads) for objects due now that no
//! node owns, and puts each in this node's own alarm index (`crate::alarms`), due then: the
//! shard's next tick wakes it, and the wake claims it (the first node to claim it owns it;
//! another that loses the race drops its entry, as for any object owned elsewhere), restores
//! it from the bucket and fires what is due. An object whose owner lives is left to the owner,
//! whose own index knows it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use combd_fleet::coordinator::Coordinator;
use combd_kernel::limits::FLEET_WAKE_SWEEP_MAX;

use crate::alarms::AlarmIndex;
use crate::app::{home_shard, valid_object_name, Apps};
use crate::object_key::ObjectKey;

use super::FleetStats;

/// The sweeps of the fleet's wake index: where the next one starts, and what they read and
/// count with.
pub struct WakeSweep {
    coordinator: Arc<Coordinator>,
    /// Where the next sweep starts: after the last object of the sweep before when its page
    /// was full, else from the earliest.
    cursor: Mutex<Option<(String, u64)>>,
    stats: Arc<FleetStats>,
}

impl WakeSweep {
    /// Sweeps start from the earliest.
    pub(super) fn new(coordinator: Arc<Coordinator>, stats: Arc<FleetStats>) -> WakeSweep {
        WakeSweep {
            coordinator,
            cursor: Mutex::new(None),
            stats,
        }
    }

    /// One sweep of the fleet's wake index at `now` (milliseconds since the epoch): the objects
    /// due without an owner, of an app this node serves, go in `index` (for a node of `shards`
    /// shards). How many went in; a coordinator that failed is counted and logged (the next
    /// sweep reads again). Blocking.
    pub fn sweep(&self, index: &AlarmIndex, apps: &Apps, shards: usize, now: u64) -> usize {
        self.stats.wake_sweeps.fetch_add(1, Ordering::Relaxed);
        // A sweep goes on after the last one's page when that was full: objects due that stay
        // so (an owner whose app is gone keeps them) cannot hide the ones after them.
        let after = self.cursor.lock().unwrap_or_else(|p| p.into_inner()).take();
        let swept = self
            .coordinator
            .due_wakes(now, FLEET_WAKE_SWEEP_MAX, after.as_ref())
            .and_then(|due| {
                if due.len() == FLEET_WAKE_SWEEP_MAX {
                    *self.cursor.lock().unwrap_or_else(|p| p.into_inner()) = due.last().cloned();
                }
                let objects: Vec<String> = due.iter().map(|(o, _)| o.clone()).collect();
                let owned = self.coordinator.owned(&objects)?;
                Ok(due.into_iter().zip(owned))
            });
        let due = match swept {
            Ok(due) => due,
            Err(e) => {
                self.stats
                    .wake_sweeps_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!("cannot read the fleet's wake index: {e}");
                return 0;
            }
        };
        let mut taken = 0;
        for ((object, at), owned) in due {
            if owned {
                continue;
            }
            // What etcd holds is checked like any input: an app this node serves, a name an
            // object may have.
            let Some(key) = ObjectKey::parse(&object) else {
                continue;
            };
            let (app, name) = (key.app(), key.name());
            if !apps.contains(app) || !valid_object_name(name) {
                continue;
            }
            match index.ensure(app, name, home_shard(app, name, shards), at, 0) {
                Ok(()) => taken += 1,
                Err(e) => tracing::warn!(%object, "cannot update the alarm index: {e}"),
            }
        }
        self.stats
            .wakes_taken
            .fetch_add(taken as u64, Ordering::Relaxed);
        taken
    }
}
