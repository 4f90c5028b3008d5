//! Waking the objects whose alarms are due (`crate::alarms`): at each housekeeping tick a
//! shard reads from the node's alarm index the objects of its own that may have one due, and
//! sends each a wake through its mailbox, like any input; once the wake's batch is durable,
//! its answer (what remains) settles the object's entry in the index.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use std::time::Instant;

use combd_kernel::limits::{ALARM_WAKES_PER_TICK, FLEET_WAKE_SWEEP_INTERVAL};

use crate::alarms;
use crate::job::Job;
use crate::stats::ShardStats;

use super::Cells;

/// The objects a shard is waking, and whether it is reading the index now.
#[derive(Default)]
pub(crate) struct AlarmWakes {
    /// `app/name` of each object woken whose answer has not come back.
    waking: Rc<RefCell<HashSet<String>>>,
    reading: Rc<Cell<bool>>,
    /// In a fleet, on shard 0: a sweep of the fleet's wake index is under way, and when the
    /// last one began (`crate::fleet` `wakes`).
    sweeping: Rc<Cell<bool>>,
    swept: Cell<Option<Instant>>,
}

impl AlarmWakes {
    /// Reads the index for what is due on this shard (unless a read is under way, or
    /// [`ALARM_WAKES_PER_TICK`] objects are being woken) and wakes each object found.
    pub fn tick(&self, cells: &Rc<Cells>) {
        self.sweep(cells);
        let room = ALARM_WAKES_PER_TICK.saturating_sub(self.waking.borrow().len());
        if self.reading.get() || room == 0 {
            return;
        }
        self.reading.set(true);
        let (cells, waking, reading) = (cells.clone(), self.waking.clone(), self.reading.clone());
        let task = cells.clone().state.spawn(async move {
            let node = cells.state.node();
            let index = node.alarms.clone();
            let apps = node.apps.clone();
            let shard = cells.state.id();
            let skip = waking.borrow().clone();
            let due = glommio::executor()
                .spawn_blocking(move || {
                    index.due(shard, alarms::now_ms(), room, |app, name| {
                        // An app a reload removed keeps its objects' alarms for its return.
                        !apps.contains(app) || skip.contains(&format!("{app}/{name}"))
                    })
                })
                .await;
            reading.set(false);
            let due = match due {
                Ok(due) => due,
                Err(e) => {
                    tracing::warn!("cannot read the alarm index: {e}");
                    return;
                }
            };
            for w in due {
                let Some(app) = node.apps.get(&w.app) else {
                    continue;
                };
                let key = format!("{}/{}", w.app, w.name);
                waking.borrow_mut().insert(key.clone());
                // Taken before the wake: a refused wake postpones the entry only if no call
                // lowered it since.
                let mark = node.alarms.mark();
                let (tx, rx) = async_channel::bounded(1);
                cells.submit(&app, &w.name, Job::alarms(tx));
                ShardStats::add(&cells.state.stats().alarm_wakes, 1);
                let (cells, waking) = (cells.clone(), waking.clone());
                let answered = cells.clone().state.spawn(async move {
                    match rx.recv().await {
                        Ok(resp) if resp.status == 200 => {
                            cells.settle_alarms(&w.app, &w.name, &resp, mark).await
                        }
                        _ => cells.postpone_alarms(&w.app, &w.name, mark).await,
                    }
                    waking.borrow_mut().remove(&key);
                });
                if let Ok(t) = answered {
                    t.detach();
                }
            }
        });
        match task {
            Ok(t) => {
                t.detach();
            }
            Err(()) => self.reading.set(false),
        }
    }
}

impl AlarmWakes {
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
        let task = cells.state.spawn(async move {
            glommio::executor()
                .spawn_blocking(move || {
                    fleet.sweep_wakes(&index, &apps, shards, alarms::now_ms());
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

impl Cells {
    /// A wake refused (or never answered): the object is woken again after
    /// [`ALARM_WAKE_RETRY_MS`](combd_kernel::limits::ALARM_WAKE_RETRY_MS).
    async fn postpone_alarms(&self, app: &str, name: &str, mark: u64) {
        ShardStats::add(&self.state.stats().alarm_wakes_refused, 1);
        let index = self.state.node().alarms.clone();
        let (app, name) = (app.to_string(), name.to_string());
        let until = alarms::now_ms() + combd_kernel::limits::ALARM_WAKE_RETRY_MS;
        let r = glommio::executor()
            .spawn_blocking(move || index.postpone(&app, &name, until, mark))
            .await;
        if let Err(e) = r {
            tracing::warn!("cannot update the alarm index: {e}");
        }
    }

    /// A wake's answer, once its batch is durable: counts what it fired, and settles the
    /// object's entry in the index to what remains (taken when the batch read it). In a fleet,
    /// an object another node owns answers `{"elsewhere":…}`: its owner fires it, and the
    /// entry goes (unless a call lowered it since the wake's `mark`).
    async fn settle_alarms(&self, app: &str, name: &str, resp: &crate::http::Response, mark: u64) {
        let Ok(said) = serde_json::from_slice::<serde_json::Value>(&resp.body) else {
            return;
        };
        let stats = self.state.stats();
        let n = |k: &str| said[k].as_u64().unwrap_or(0);
        ShardStats::add(&stats.alarms_fired, n("fired"));
        ShardStats::add(&stats.alarms_failed, n("failed"));
        stats
            .alarm_late_ms_max
            .fetch_max(n("late_ms_max"), Ordering::Relaxed);
        let next = said["next_ms"].as_u64();
        let (count, mark) = (n("count"), said["mark"].as_u64().unwrap_or(mark));
        let index = self.state.node().alarms.clone();
        let (app, name) = (app.to_string(), name.to_string());
        let settled = glommio::executor()
            .spawn_blocking(move || index.settle(&app, &name, next, count, mark))
            .await;
        if let Err(e) = settled {
            tracing::warn!("cannot update the alarm index: {e}");
        }
    }
}
