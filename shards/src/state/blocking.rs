//! The shard's blocking threads, shared per client: every job handed to them (a batch, a WAL
//! sync, a restore, a creation, a fleet lookup or shipment, the alarm index) first takes one
//! of [`BLOCKING_THREADS_PER_SHARD`] slots in a [`Line`], for the client it works for. A freed
//! slot goes to the waiting client holding the fewest. One client holds at most
//! [`BLOCKING_THREADS_PER_CLIENT`] (all but one); and while another client is active (handed a
//! job within [`BLOCKING_CLIENT_ACTIVE_WINDOW`]), at most
//! [`BLOCKING_COMPUTE_SHARED_PER_CLIENT`] of its jobs that compute (every job but a WAL sync,
//! which waits on the disk) at once: the threads share the shard's CPU, so a client's second
//! job computing at once only slows the others'. Before this, glommio's pool took jobs first
//! in, first out: beside a client reading a thousand absent names, an honest object's batch
//! and sync waited behind its scratch restores; and with three of the attacker's jobs
//! computing beside it, the honest one had a fifth of the CPU (`bench/hostile.py object-fill`:
//! the honest p99 6.3–6.5 ms with three of its jobs at once, 3.8–4.0 with one).
//!
//! The line is bounded by the tasks that can wait in it: every job is an object's, a
//! connection's or one of the node's own tasks, each waiting for one slot at a time.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::{
    BLOCKING_CLIENT_ACTIVE_WINDOW, BLOCKING_COMPUTE_SHARED_PER_CLIENT, BLOCKING_THREADS_PER_CLIENT,
    BLOCKING_THREADS_PER_SHARD,
};
use combd_kernel::settings::Settings;

use crate::line::Line;
use crate::stats::ShardStats;
use crate::stats::Stage;

/// The clients that handed a job to the threads lately (not the node's own).
#[derive(Default)]
struct Running {
    /// Each client's latest job, in milliseconds of the shard's clock.
    last: HashMap<ClientKey, u64>,
    /// (client, when) of every job in the window, oldest first: what expires next.
    seen: VecDeque<(ClientKey, u64)>,
}

impl Running {
    /// Notes a job of `client` (if any) at `now_ms`, forgets the clients idle for the window,
    /// and gives how many are active.
    fn note(&mut self, client: Option<ClientKey>, now_ms: u64) -> usize {
        let window = BLOCKING_CLIENT_ACTIVE_WINDOW.as_millis() as u64;
        while let Some(&(c, at)) = self.seen.front() {
            if at + window > now_ms {
                break;
            }
            self.seen.pop_front();
            if self.last.get(&c) == Some(&at) {
                self.last.remove(&c);
            }
        }
        if let Some(client) = client.filter(|c| *c != ClientKey::Local) {
            if self.last.insert(client, now_ms) != Some(now_ms) {
                self.seen.push_back((client, now_ms));
            }
        }
        self.last.len()
    }
}

/// The most computing jobs one client may have on the threads with `active` clients.
fn share(active: usize) -> usize {
    if active <= 1 {
        BLOCKING_THREADS_PER_CLIENT
    } else {
        BLOCKING_COMPUTE_SHARED_PER_CLIENT
    }
}

/// The slots of the shard's blocking threads.
pub(crate) struct BlockingThreads {
    line: Rc<Line>,
    active: RefCell<Running>,
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
            active: RefCell::default(),
        }
    }

    /// Notes a job of `client` (if any: a job's end notes none) and sets every client's share
    /// from the clients active now.
    fn note(&self, client: Option<ClientKey>, now_ms: u64) {
        let active = self.active.borrow_mut().note(client, now_ms);
        self.line.set_share(share(active));
    }

    fn publish(&self, stats: &ShardStats) {
        let l = &self.line;
        let set = |a: &std::sync::atomic::AtomicU64, v: u64| a.store(v, Ordering::Relaxed);
        set(&stats.blocking_busy, l.used() as u64);
        set(&stats.blocking_busy_max, l.used_max.get() as u64);
        set(&stats.blocking_waiting, l.waiting() as u64);
        set(&stats.blocking_waited, l.waited.get());
        set(&stats.blocking_waited_share, l.waited_share.get());
        set(&stats.blocking_client_share, l.share() as u64);
    }
}

/// What the slots read of their shard: its clock (milliseconds, as of the last tick) and its
/// figures.
#[derive(Clone, Copy)]
pub(crate) struct ShardSide<'a> {
    pub(super) clock_ms: &'a Cell<u64>,
    pub(super) stats: &'a ShardStats,
}

/// A slot held: given back when dropped, also when the job's future is dropped mid-way.
struct SlotHeld<'a> {
    threads: &'a BlockingThreads,
    shard: ShardSide<'a>,
    client: ClientKey,
}

impl Drop for SlotHeld<'_> {
    fn drop(&mut self) {
        let b = self.threads;
        b.line.release(self.client);
        b.note(None, self.shard.clock_ms.get());
        b.publish(self.shard.stats);
    }
}

/// What a job does on its thread: compute (held to its client's share while other clients
/// are active), or wait on a device (a WAL sync: held only to `client_cap`, so one client's
/// syncs still overlap each other).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Work {
    Compute,
    Sync,
}

impl BlockingThreads {
    /// Runs `f` (computing) on one of the threads once `client` has its turn for one.
    pub(super) async fn on_thread<T: Send + 'static>(
        &self,
        shard: ShardSide<'_>,
        client: ClientKey,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let _held = self.hold(shard, client, Work::Compute).await;
        glommio::executor().spawn_blocking(f).await
    }

    /// Runs `f` (doing `work`) as [`BlockingThreads::on_thread`] does, timing the hand-off to
    /// the thread (its turn included), the run there and the way back as the three `stages`.
    pub(super) async fn on_thread_timed<T: Send + 'static>(
        &self,
        shard: ShardSide<'_>,
        (client, work): (ClientKey, Work),
        stages: [Stage; 3],
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let handed = Instant::now();
        let held = self.hold(shard, client, work).await;
        let (started, done, out) = glommio::executor()
            .spawn_blocking(move || {
                let started = Instant::now();
                let out = f();
                (started, Instant::now(), out)
            })
            .await;
        drop(held);
        let times = &shard.stats.stages;
        let [to, run, back] = stages;
        times.record(to, started.saturating_duration_since(handed));
        times.record(run, done.saturating_duration_since(started));
        times.record(back, done.elapsed());
        out
    }

    async fn hold<'a>(
        &'a self,
        shard: ShardSide<'a>,
        client: ClientKey,
        work: Work,
    ) -> SlotHeld<'a> {
        self.note(Some(client), shard.clock_ms.get());
        let io = work == Work::Sync;
        self.line
            .acquire_observed(client, io, || self.publish(shard.stats))
            .await;
        SlotHeld {
            threads: self,
            shard,
            client,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ONE: ClientKey = ClientKey::V4(1);
    const TWO: ClientKey = ClientKey::V4(2);

    #[test]
    fn clients_count_while_their_last_job_is_in_the_window() {
        let window = BLOCKING_CLIENT_ACTIVE_WINDOW.as_millis() as u64;
        let mut a = Running::default();
        assert_eq!(a.note(Some(ONE), 10), 1);
        assert_eq!(a.note(Some(TWO), 20), 2);
        let local = Some(ClientKey::Local);
        assert_eq!(a.note(local, 30), 2, "the node's own is not a client");
        assert_eq!(
            a.note(Some(ONE), 10 + window - 1),
            2,
            "ONE again, TWO still in"
        );
        assert_eq!(a.note(Some(ONE), 20 + window), 1, "TWO idle for the window");
        assert_eq!(a.note(Some(ONE), 20 + window), 1);
        assert_eq!(a.seen.len(), 2, "one entry per client and time");
        assert_eq!(
            a.note(None, 20 + 2 * window),
            0,
            "a job's end: ONE idle too"
        );
        assert_eq!(a.note(Some(TWO), 30 + 3 * window), 1);
    }

    #[test]
    fn a_client_alone_computes_on_all_but_one_thread_and_one_among_others() {
        assert_eq!(share(0), BLOCKING_THREADS_PER_CLIENT);
        assert_eq!(share(1), BLOCKING_THREADS_PER_CLIENT);
        assert_eq!(share(2), BLOCKING_COMPUTE_SHARED_PER_CLIENT);
        assert_eq!(share(100), BLOCKING_COMPUTE_SHARED_PER_CLIENT);
    }
}
