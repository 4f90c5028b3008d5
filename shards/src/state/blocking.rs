//! The shard's blocking threads, shared per client: every job handed to them (a batch, a WAL
//! sync, a restore, a creation, a fleet lookup or shipment, the alarm index) first takes one
//! of [`BLOCKING_THREADS_PER_SHARD`] slots in a [`Line`], for the client it works for. One
//! client holds at most [`BLOCKING_THREADS_PER_CLIENT`] (all but one), and a freed slot goes to
//! the waiting client holding the fewest. Before this, glommio's pool took jobs first in, first
//! out: beside a client reading a thousand absent names, an honest object's batch and sync
//! waited behind its scratch restores.
//!
//! The line is bounded by the tasks that can wait in it: every job is an object's, a
//! connection's or one of the node's own tasks, each waiting for one slot at a time.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::{BLOCKING_THREADS_PER_CLIENT, BLOCKING_THREADS_PER_SHARD};
use combd_kernel::settings::Settings;

use crate::line::Line;
use crate::stats::ShardStats;
use crate::stats::Stage;

use super::ShardState;

/// The slots of the shard's blocking threads.
pub(crate) struct BlockingThreads {
    line: Rc<Line>,
}

impl BlockingThreads {
    pub fn new(settings: &Settings, max_conns: u64) -> BlockingThreads {
        let tasks = (max_conns as usize).saturating_mul(2);
        let line_max = tasks.saturating_add(settings.max_open_objects as usize * 2);
        BlockingThreads {
            line: Rc::new(Line::with_client_cap(
                BLOCKING_THREADS_PER_SHARD,
                BLOCKING_THREADS_PER_CLIENT,
                line_max,
            )),
        }
    }

    fn publish(&self, stats: &ShardStats) {
        let l = &self.line;
        let set = |a: &std::sync::atomic::AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set(&stats.blocking_busy, l.used() as u64);
        set(&stats.blocking_busy_max, l.used_max.get() as u64);
        set(&stats.blocking_waiting, l.waiting() as u64);
        set(&stats.blocking_waited, l.waited.get());
        set(&stats.blocking_waited_share, l.waited_share.get());
    }
}

/// A slot held: given back when dropped, also when the job's future is dropped mid-way.
struct Held<'a> {
    state: &'a ShardState,
    client: ClientKey,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let b = &self.state.blocking;
        b.line.release(self.client);
        b.publish(self.state.stats());
    }
}

impl ShardState {
    /// Runs `f` on one of the shard's blocking threads once `client` has its turn for one.
    pub async fn on_thread<T: Send + 'static>(
        &self,
        client: ClientKey,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let _held = self.hold_thread(client).await;
        glommio::executor().spawn_blocking(f).await
    }

    /// [`ShardState::on_thread`], timing the hand-off to the thread (its turn included), the
    /// run there and the way back as the three `stages`.
    pub async fn on_thread_timed<T: Send + 'static>(
        &self,
        client: ClientKey,
        stages: [Stage; 3],
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let handed = Instant::now();
        let held = self.hold_thread(client).await;
        let (started, done, out) = glommio::executor()
            .spawn_blocking(move || {
                let started = Instant::now();
                let out = f();
                (started, Instant::now(), out)
            })
            .await;
        drop(held);
        let times = &self.stats().stages;
        let [to, run, back] = stages;
        times.record(to, started.saturating_duration_since(handed));
        times.record(run, done.saturating_duration_since(started));
        times.record(back, done.elapsed());
        out
    }

    async fn hold_thread(&self, client: ClientKey) -> Held<'_> {
        let b = &self.blocking;
        b.line
            .acquire_observed(client, || b.publish(self.stats()))
            .await;
        Held {
            state: self,
            client,
        }
    }
}
