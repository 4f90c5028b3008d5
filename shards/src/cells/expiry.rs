//! Expiry: an app may declare how long its objects may go unwritten ([`App::expiry`]); on a
//! node alone, shard 0 sweeps the apps that do, every tenth of the shortest expiry (at least a
//! second apart, at most [`OBJECT_EXPIRY_SWEEP_INTERVAL`]), and sends each object unwritten for
//! longer that is not live an expiry ([`Job::expire`]), one after the other, at most
//! [`OBJECT_EXPIRY_PER_SWEEP`] a sweep. The object's task deletes it as the operator's delete
//! does, unless it was written since or has alarms or messages pending (checked again there,
//! with the object open). `objects_expired` counts them, `objects_expiry_kept` those kept so.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::{OBJECT_EXPIRY_PER_SWEEP, OBJECT_EXPIRY_SWEEP_INTERVAL};

use crate::app::App;
use crate::job::Job;
use crate::object_files::FileFacts;
use crate::shared::NodeShared;
use crate::stats::ShardStats;

use super::Cells;

/// Shard 0's sweeps: whether one runs, and when the last began.
#[derive(Default)]
pub(super) struct Expiry {
    sweeping: Cell<bool>,
    last: Cell<Option<Instant>>,
}

/// How often the apps expiring after `shortest` are swept.
fn interval(shortest: Duration) -> Duration {
    (shortest / 10).clamp(Duration::from_secs(1), OBJECT_EXPIRY_SWEEP_INTERVAL)
}

impl Expiry {
    /// At a housekeeping tick: on shard 0 of a node alone, a sweep once one is due.
    pub fn tick(&self, cells: &Rc<Cells>) {
        let node = cells.state.node();
        if cells.state.id() != 0 || node.fleet.is_some() || self.sweeping.get() {
            return;
        }
        let apps: Vec<(Arc<dyn App>, Duration)> = node
            .apps
            .names()
            .into_iter()
            .filter_map(|n| node.apps.get(n))
            .filter_map(|a| a.expiry().map(|e| (a, e)))
            .collect();
        let Some(shortest) = apps.iter().map(|(_, e)| *e).min() else {
            return;
        };
        if self
            .last
            .get()
            .is_some_and(|t| t.elapsed() < interval(shortest))
        {
            return;
        }
        self.last.set(Some(Instant::now()));
        self.sweeping.set(true);
        let swept = cells.clone();
        match cells.state.spawn(async move { sweep(&swept, apps).await }) {
            Ok(task) => {
                task.detach();
            }
            Err(()) => self.sweeping.set(false),
        }
    }
}

/// One sweep: each expiring app's objects unwritten past its expiry, each sent its expiry in
/// turn.
async fn sweep(cells: &Rc<Cells>, apps: Vec<(Arc<dyn App>, Duration)>) {
    let state = &cells.state;
    let mut left = OBJECT_EXPIRY_PER_SWEEP;
    for (app, expiry) in apps {
        let cutoff = crate::alarms::now_ms().saturating_sub(expiry.as_millis() as u64);
        let (node, name) = (state.node().clone(), app.name());
        let expired = state
            .on_thread(ClientKey::Local, move || {
                unwritten(&node, name, cutoff, left)
            })
            .await;
        for object in expired {
            left -= 1;
            let (tx, answer) = async_channel::bounded(1);
            cells.submit(&app, &object, Job::expire(cutoff, tx));
            let stats = state.stats();
            match answer.recv().await.map(|r| r.status) {
                Ok(200) => ShardStats::add(&stats.objects_expired, 1),
                Ok(409) => ShardStats::add(&stats.objects_expiry_kept, 1),
                _ => {}
            }
        }
    }
    cells.expiry.sweeping.set(false);
}

/// The objects of `app` not live and unwritten since `cutoff`, at most `max`. Blocks.
fn unwritten(node: &NodeShared, app: &str, cutoff: u64, max: usize) -> Vec<String> {
    let data = &node.settings.data_dir;
    let Ok((names, _)) = crate::object_files::names(data, app, None, usize::MAX) else {
        return Vec::new();
    };
    names
        .into_iter()
        .filter(|name| {
            let path = crate::app::object_path(data, app, name);
            FileFacts::of(&path).is_some_and(|f| f.written_ms <= cutoff)
                && !node.live.is_live(&format!("{app}/{name}"))
        })
        .take(max)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sweeps_come_a_tenth_of_the_shortest_expiry_apart_within_bounds() {
        assert_eq!(interval(Duration::from_secs(2)), Duration::from_secs(1));
        assert_eq!(interval(Duration::from_secs(300)), Duration::from_secs(30));
        assert_eq!(
            interval(Duration::from_secs(30 * 86_400)),
            OBJECT_EXPIRY_SWEEP_INTERVAL
        );
    }
}
