//! The wake queue: at most `COMBD_MAX_AWAKE` cells at work at once on a shard, the rest
//! waiting asleep in a first-in-first-out ready line; and the same for the objects being
//! restored (`COMBD_RESTORES_AT_ONCE`), except that there each client has a line of its own
//! and the clients take turns (the client that made the object live: one client's spray of
//! names waits behind itself, not in front of everyone). The queue publishes its own gauges,
//! and a change of "behind" (the ready line as long as the awake cap) raises the shard's
//! admission signal and wakes the coordinator.
//!
//! The queue's state is [`WakeQueue`], held by the shard's state; a slot is an
//! [`AwakePermit`] or a [`RestorePermit`], taken through the shard's state
//! (`ShardState::acquire_awake`, `acquire_restore`).
//!
//! The ready lines are bounded: each entry is a task waiting for one slot, and a task waits
//! for at most one at a time. The tasks are connection tasks (at most the connection cap) and
//! object tasks, each holding mail a connection sent; so a line never holds more than twice
//! the connection cap, which [`Line`] asserts.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use combd_kernel::settings::Settings;

use combd_kernel::fair::ClientKey;

use crate::line::Line;
use crate::stats::ShardStats;

use super::ShardState;

/// The awake and restore slots of a shard.
pub(crate) struct WakeQueue {
    awake: Rc<Line>,
    restores: Rc<Line>,
    /// The ready line is as long as the awake cap: the shard is behind. The shard's own state,
    /// which its decisions read (the `behind` gauge only shows it).
    behind: Cell<bool>,
}

impl WakeQueue {
    pub fn new(settings: &Settings, max_conns: u64) -> WakeQueue {
        let line_max = (max_conns as usize).saturating_mul(2);
        WakeQueue {
            awake: Rc::new(Line::new(settings.max_awake, line_max)),
            restores: Rc::new(Line::new(settings.restores_at_once, line_max)),
            behind: Cell::new(false),
        }
    }

    /// Whether the shard is behind: its ready line as long as the awake cap.
    pub fn is_behind(&self) -> bool {
        self.behind.get()
    }

    /// Publishes the awake line's figures; true when "behind" changed.
    fn publish_awake(&self, stats: &ShardStats) -> bool {
        let a = &self.awake;
        stats.cells_awake.store(a.used() as u64, Ordering::Relaxed);
        stats
            .cells_awake_max
            .store(a.used_max.get() as u64, Ordering::Relaxed);
        stats
            .sessions_ready
            .store(a.waiting() as u64, Ordering::Relaxed);
        stats
            .sessions_waited
            .store(a.waited.get(), Ordering::Relaxed);
        let behind = a.waiting() >= a.cap();
        stats.behind.store(behind as u64, Ordering::Relaxed);
        behind != self.behind.replace(behind)
    }

    fn publish_restores(&self, stats: &ShardStats) {
        let r = &self.restores;
        stats
            .restores_waiting
            .store(r.waiting() as u64, Ordering::Relaxed);
        stats
            .restores_active
            .store(r.used() as u64, Ordering::Relaxed);
        stats
            .restores_active_max
            .store(r.used_max.get() as u64, Ordering::Relaxed);
    }
}

/// Publishes `state`'s awake line; a change of "behind" raises the shard's admission signal
/// and wakes the coordinator.
fn publish_awake(state: &ShardState) {
    if state.wake_queue.publish_awake(state.stats()) {
        state.admission_changed();
        state.node().wake_coordinator();
    }
}

/// An awake slot; given back (to the first in the ready line) when dropped.
pub(crate) struct AwakePermit(Rc<ShardState>);

impl AwakePermit {
    /// Waits (in FIFO order, asleep) for one of `state`'s awake slots.
    pub(super) async fn acquire(state: &Rc<ShardState>) -> AwakePermit {
        let awake = state.wake_queue.awake.clone();
        // One line for the shard: the cells waiting to wake are let in in order.
        awake
            .acquire_observed(ClientKey::Local, false, || publish_awake(state))
            .await;
        AwakePermit(state.clone())
    }
}

impl Drop for AwakePermit {
    fn drop(&mut self) {
        self.0.wake_queue.awake.release(ClientKey::Local);
        publish_awake(&self.0);
    }
}

/// A restore slot; given back when dropped.
pub(crate) struct RestorePermit(Rc<ShardState>, ClientKey);

impl RestorePermit {
    /// Waits for one of `state`'s restore slots for an object `client` made live: in order
    /// among that client's restores, the clients taking turns ([`Line`]).
    pub(super) async fn acquire(state: &Rc<ShardState>, client: ClientKey) -> RestorePermit {
        let restores = state.wake_queue.restores.clone();
        restores
            .acquire_observed(client, false, || {
                state.wake_queue.publish_restores(state.stats())
            })
            .await;
        RestorePermit(state.clone(), client)
    }
}

impl Drop for RestorePermit {
    fn drop(&mut self) {
        let q = &self.0.wake_queue;
        q.restores.release(self.1);
        q.publish_restores(self.0.stats());
        ShardStats::add(&self.0.stats().restores, 1);
    }
}
