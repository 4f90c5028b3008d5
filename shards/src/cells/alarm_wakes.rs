//! Waking the objects whose alarms are due (`crate::alarms`): at each housekeeping tick (100
//! ms), and at the earliest time one of its objects has something due before the next tick (a
//! timer, [`ALARM_READ_GAP_MS`] at least after the last read), a shard reads from the node's
//! alarm index the objects of its own that may have one due, and sends each a wake through its
//! mailbox, like any input; once the wake's batch is durable, its answer (what remains)
//! settles the object's entry in the index, and arms the timer for what the object has next.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use std::time::Instant;

use combd_kernel::limits::{
    ALARM_READ_GAP_MS, ALARM_WAKES_PER_TICK, FLEET_WAKE_SWEEP_INTERVAL, SHARD_TICK,
};

use combd_kernel::fair::ClientKey;

use crate::alarms;
use crate::job::Job;
use crate::object_key::ObjectKey;
use crate::state::ShardState;
use crate::stats::ShardStats;

use super::Cells;

/// The objects a shard is waking, and whether it is reading the index now (a handle: its
/// clones are the same).
#[derive(Default, Clone)]
pub(crate) struct AlarmWakes {
    /// `app/name` of each object woken whose answer has not come back.
    waking: Rc<RefCell<HashSet<ObjectKey>>>,
    reading: Rc<Cell<bool>>,
    /// When the last read of the index began (milliseconds since the epoch).
    read_at: Rc<Cell<u64>>,
    /// When the timer armed for the next read fires, if one is armed.
    armed: Rc<Cell<Option<u64>>>,
    /// In a fleet, on shard 0: a sweep of the fleet's wake index is under way, and when the
    /// last one began (`crate::fleet` `wakes`).
    sweeping: Rc<Cell<bool>>,
    swept: Rc<Cell<Option<Instant>>>,
}

/// When to read the index for something due at `at`, the last read having begun at `read_at`
/// (all in milliseconds since the epoch; `now` is now): not before [`ALARM_READ_GAP_MS`] after
/// that read, and not at all if the shard's next tick (`SHARD_TICK` from now at the latest)
/// reads by then.
fn timer_at(now: u64, at: u64, read_at: u64) -> Option<u64> {
    let at = at.max(read_at.saturating_add(ALARM_READ_GAP_MS)).max(now);
    (at < now.saturating_add(SHARD_TICK.as_millis() as u64)).then_some(at)
}

/// Copies the shard's alarm index's count of syncs into its stats (`alarm_index_syncs`).
fn publish_index_syncs(cells: &Cells) {
    let syncs = cells.state.node().alarms.syncs(cells.state.id());
    let stats = cells.state.stats();
    stats.alarm_index_syncs.store(syncs, Ordering::Relaxed);
}

impl AlarmWakes {
    /// Reads the index for what is due on this shard (unless a read is under way, or
    /// [`ALARM_WAKES_PER_TICK`] objects are being woken) and wakes each object found.
    pub fn tick(&self, cells: &Rc<Cells>) {
        self.sweep(cells);
        publish_index_syncs(cells);
        let room = ALARM_WAKES_PER_TICK.saturating_sub(self.waking.borrow().len());
        if self.reading.get() || room == 0 {
            return;
        }
        self.reading.set(true);
        self.read_at.set(alarms::now_ms());
        let (wakes, for_task) = (self.clone(), cells.clone());
        let task = cells
            .state
            .spawn(async move { wakes.read_and_wake(&for_task, room).await });
        match task {
            Ok(t) => {
                t.detach();
            }
            Err(()) => self.reading.set(false),
        }
    }

    /// Reads (on a blocking thread) up to `room` objects of this shard that are due and not
    /// being woken already, arms the next read for the index's next entry, and wakes each.
    async fn read_and_wake(&self, cells: &Rc<Cells>, room: usize) {
        let node = cells.state.node();
        let index = node.alarms.clone();
        let apps = node.apps.clone();
        let shard = cells.state.id();
        let skip = self.waking.borrow().clone();
        let due = cells
            .state
            .on_thread(ClientKey::Local, move || {
                let now = alarms::now_ms();
                let due = index.due(shard, now, room, |app, name| {
                    // An app a reload removed keeps its objects' alarms for its return.
                    !apps.contains(app) || skip.contains(&ObjectKey::new(app, name))
                })?;
                Ok::<_, rusqlite::Error>((due, index.next_after(shard, now)?))
            })
            .await;
        self.reading.set(false);
        match due {
            Ok((due, next)) => {
                if let Some(next) = next {
                    self.arm(cells, next);
                }
                for w in due {
                    self.wake(cells, w);
                }
            }
            Err(e) => tracing::warn!("cannot read the alarm index: {e}"),
        }
    }

    /// Wakes the object `w` names with its alarms' job, then settles its entry by the answer
    /// (or postpones it, refused).
    fn wake(&self, cells: &Rc<Cells>, w: alarms::Wake) {
        let node = cells.state.node();
        let Some(app) = node.apps.get(&w.app) else {
            return;
        };
        let key = ObjectKey::new(&w.app, &w.name);
        self.waking.borrow_mut().insert(key.clone());
        // Taken before the wake: a refused wake postpones the entry only if no call lowered it
        // since.
        let mark = node.alarms.mark(cells.state.id());
        let (tx, rx) = async_channel::bounded(1);
        cells.submit(&app, &w.name, Job::alarms(tx));
        ShardStats::add(&cells.state.stats().alarm_wakes, 1);
        let (cells, wakes) = (cells.clone(), self.clone());
        let answered = cells.clone().state.spawn(async move {
            match rx.recv().await {
                Ok(resp) if resp.status == 200 => {
                    let next = settle_alarms(&cells.state, &w.app, &w.name, &resp, mark).await;
                    if let Some(next) = next {
                        wakes.arm(&cells, next);
                    }
                }
                _ => postpone_alarms(&cells.state, &w.app, &w.name, mark).await,
            }
            wakes.waking.borrow_mut().remove(&key);
        });
        if let Ok(t) = answered {
            t.detach();
        }
    }
}

impl AlarmWakes {
    /// Arms a timer to read the index for what is due at `at` (milliseconds since the epoch),
    /// when that is before the next tick and no timer already reads by then ([`timer_at`]).
    pub fn arm(&self, cells: &Rc<Cells>, at: u64) {
        let now = alarms::now_ms();
        let Some(at) = timer_at(now, at, self.read_at.get()) else {
            return;
        };
        if self.armed.get().is_some_and(|armed| armed <= at) {
            return;
        }
        self.armed.set(Some(at));
        let (wakes, cells) = (self.clone(), cells.clone());
        let task = cells.clone().state.spawn(async move {
            glommio::timer::sleep(std::time::Duration::from_millis(at - now)).await;
            // A timer an earlier one replaced reads nothing: that one read, and armed what
            // the index had next.
            if wakes.armed.get() == Some(at) {
                wakes.armed.set(None);
                wakes.tick(&cells);
            }
        });
        match task {
            Ok(t) => {
                t.detach();
            }
            Err(()) => self.armed.set(None),
        }
    }

    /// In a fleet, on shard 0, once a [`FLEET_WAKE_SWEEP_INTERVAL`]: reads the fleet's wake
    /// index for objects due whose owner died, into the node's alarm index (the ticks wake
    /// them).
    fn sweep(&self, cells: &Rc<Cells>) {
        let node = cells.state.node();
        let Some(fleet) = node.fleet.clone() else {
            return;
        };
        let now = Instant::now();
        if cells.state.id() != 0
            || self.sweeping.get()
            || self
                .swept
                .get()
                .is_some_and(|at| now.duration_since(at) < FLEET_WAKE_SWEEP_INTERVAL)
        {
            return;
        }
        self.swept.set(Some(now));
        self.sweeping.set(true);
        let sweeping = self.sweeping.clone();
        let (index, apps, shards) = (node.alarms.clone(), node.apps.clone(), node.stats.len());
        let state = cells.state.clone();
        let task = cells.state.spawn(async move {
            state
                .on_thread(ClientKey::Local, move || {
                    fleet.wakes.sweep(&index, &apps, shards, alarms::now_ms());
                })
                .await;
            sweeping.set(false);
        });
        match task {
            Ok(t) => {
                t.detach();
            }
            Err(()) => self.sweeping.set(false),
        }
    }
}

/// A wake refused (or never answered): the object is woken again after
/// [`ALARM_WAKE_RETRY_MS`](combd_kernel::limits::ALARM_WAKE_RETRY_MS).
async fn postpone_alarms(state: &ShardState, app: &str, name: &str, mark: u64) {
    ShardStats::add(&state.stats().alarm_wakes_refused, 1);
    let index = state.node().alarms.clone();
    let (app, name, shard) = (app.to_string(), name.to_string(), state.id());
    let until = alarms::now_ms() + combd_kernel::limits::ALARM_WAKE_RETRY_MS;
    let r = state
        .on_thread(ClientKey::Local, move || {
            index.postpone(&app, &name, shard, until, mark)
        })
        .await;
    if let Err(e) = r {
        tracing::warn!("cannot update the alarm index: {e}");
    }
}

/// A wake's answer, once its batch is durable: counts what it fired, and settles the
/// object's entry in the index to what remains (taken when the batch read it); when the
/// object next has something due. In a fleet, an object another node owns answers
/// `{"elsewhere":…}`: its owner fires it, and the entry goes (unless a call lowered it
/// since the wake's `mark`).
async fn settle_alarms(
    state: &ShardState,
    app: &str,
    name: &str,
    resp: &crate::http::Response,
    mark: u64,
) -> Option<u64> {
    let Ok(said) = serde_json::from_slice::<serde_json::Value>(&resp.body) else {
        return None;
    };
    let stats = state.stats();
    let n = |k: &str| said[k].as_u64().unwrap_or(0);
    ShardStats::add(&stats.alarms_fired, n("fired"));
    ShardStats::add(&stats.alarms_failed, n("failed"));
    stats
        .alarm_late_ms_max
        .fetch_max(n("late_ms_max"), Ordering::Relaxed);
    let next = said["next_ms"].as_u64();
    let (count, mark) = (n("count"), said["mark"].as_u64().unwrap_or(mark));
    let index = state.node().alarms.clone();
    let (app, name, shard) = (app.to_string(), name.to_string(), state.id());
    let settled = state
        .on_thread(ClientKey::Local, move || {
            index.settle(&app, &name, shard, next, count, mark)
        })
        .await;
    if let Err(e) = settled {
        tracing::warn!("cannot update the alarm index: {e}");
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_for_an_alarm_waits_the_gap_after_the_last_and_leaves_the_rest_to_the_tick() {
        let tick = SHARD_TICK.as_millis() as u64;
        let (now, read_at) = (1_000_000, 999_950);
        // Due in 20 ms, the last read 50 ms ago: read then.
        assert_eq!(timer_at(now, now + 20, read_at), Some(now + 20));
        // Due at once, the last read 1 ms ago: not before the gap is over.
        let gap = ALARM_READ_GAP_MS;
        assert_eq!(timer_at(now, now, now - 1), Some(now - 1 + gap));
        assert_eq!(timer_at(now, now + gap, now - 1), Some(now + gap));
        // Due long ago (a late answer): now.
        assert_eq!(timer_at(now, now - 500, read_at), Some(now));
        // Due after the next tick: the tick reads it.
        assert_eq!(timer_at(now, now + tick, read_at), None);
        assert_eq!(timer_at(now, now + tick - 1, read_at), Some(now + tick - 1));
    }
}
