//! A shard's own state, at the bottom of the shard: what its cells, connections and run loop
//! share, behind small accessors. Single-threaded (`Rc`, `Cell`, `RefCell`); nothing here
//! spawns a connection or runs a cell.
//!
//! - the node's shared state ([`NodeShared`]) and this shard's id, stats and drain flag;
//! - the waker slots: every task that waits for input (a connection, an object) parks its
//!   waker in a slot, so a delivery, a drain or the ping sweep can wake it, with the deadline
//!   of its wait if it has one;
//! - the shard's clock: milliseconds read once a tick ([`SHARD_TICK`](limits::SHARD_TICK)),
//!   which every connection's timeouts are taken from and checked against by one sweep a tick
//!   (no clock read and no timer armed per request: both showed in the profile);
//! - the read scratch buffer (borrowed only inside a poll, never across an await);
//! - the gate every connection and object task is spawned through, so a drain can wait for
//!   them;
//! - the wake queue ([`wake_queue`]): the awake and restore slots with their ready lines;
//! - the blocking threads' slots ([`blocking`]), taken per client by every job handed to them;
//! - connection slots ([`slot`]): reserve → open → release, once;
//! - the per-turn budget ([`turn`]) every loop that grows with load spends;
//! - the shard's outbound bytes, TLS handshakes in progress and ping epoch;
//! - the shard's end of the access log, when it is on, and the budget of its warnings about
//!   apps' failed calls ([`log_budget`]).

pub(crate) mod blocking;
pub(crate) mod log_budget;
pub(crate) mod slot;
pub(crate) mod turn;
pub(crate) mod wake_queue;

use std::cell::{Cell, RefCell, RefMut};
use std::future::Future;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use combd_kernel::fair::ClientKey;
use combd_kernel::limits;
use combd_kernel::settings::Settings;
use glommio::sync::Gate;
use slab::Slab;

use crate::access_log::ShardLog;
use crate::fair::Share;
use crate::http::{http_date, HttpDate};
use crate::shared::{NodeShared, ShardInbound};
use crate::stats::{ShardStats, Stage};
use blocking::{BlockingThreads, Work};
use log_budget::LogBudget;
use wake_queue::{AwakePermit, RestorePermit, WakeQueue};

pin_project_lite::pin_project! {
    /// A task's future with the gate pass that lets a drain wait for it; the pass is dropped
    /// with the future, when the task ends.
    struct WithPass<F> {
        #[pin]
        fut: F,
        _pass: glommio::sync::Pass,
    }
}

impl<F: Future> Future for WithPass<F> {
    type Output = F::Output;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        self.project().fut.poll(cx)
    }
}

/// A task waiting in a waker slot: its waker while parked, and the shard-clock millisecond
/// its wait ends at (0: none), which the tick's sweep wakes it at.
#[derive(Default)]
struct Parked {
    waker: Option<Waker>,
    deadline_ms: u64,
}

/// A shard's state, shared by its tasks.
pub(crate) struct ShardState {
    id: usize,
    node: Arc<NodeShared>,
    /// This shard's side of the node for its connections' input accounts.
    inbound: Arc<ShardInbound>,
    /// Set once the node drains; tasks see it when they next wait.
    draining: Cell<bool>,
    /// The waker of each task waiting for input, and its deadline.
    wakers: RefCell<Slab<Parked>>,
    /// When the shard's clock started, and its reading in milliseconds since (refreshed by
    /// the housekeeping tick; never 0, which means "no deadline").
    epoch: Instant,
    clock_ms: Cell<u64>,
    scratch: RefCell<Box<[u8]>>,
    /// Every connection and object task holds a pass; the drain waits for the gate to close.
    gate: Gate,
    wake_queue: WakeQueue,
    /// The slots of the shard's blocking threads, per client.
    blocking: BlockingThreads,
    /// Bytes waiting to be written on this shard, every session together.
    outbound: Cell<u64>,
    tls_in_progress: Cell<usize>,
    /// Incremented every `COMBD_WS_PING_INTERVAL`: WebSockets ping when it changes.
    ping_epoch: Cell<u64>,
    /// Raised when the listeners may need to stop or resume: the coordinator woke the shard,
    /// or the shard became behind or caught up.
    admission_changed: Signal,
    /// The `Date` of responses, formatted once a second by the housekeeping tick.
    date: Cell<(u64, HttpDate)>,
    /// The shard's end of the access log, when `COMBD_ACCESS_LOG` is not off.
    access_log: Option<ShardLog>,
    /// The warnings about apps' failed calls this window.
    app_errors: LogBudget,
}

impl ShardState {
    pub fn new(id: usize, node: Arc<NodeShared>) -> ShardState {
        let wake_queue = WakeQueue::new(&node.settings, node.max_conns_effective);
        let blocking = BlockingThreads::new(&node.settings, node.max_conns_effective);
        let access_log = node.access_log.as_ref().map(|l| l.shard(id));
        let window_ms = limits::APP_ERROR_LOG_WINDOW.as_millis() as u64;
        let inbound = Arc::new(ShardInbound::new(node.clone(), id));
        ShardState {
            access_log,
            app_errors: LogBudget::new(limits::APP_ERROR_LOGS_PER_WINDOW, window_ms),
            id,
            node,
            inbound,
            draining: Cell::new(false),
            wakers: RefCell::new(Slab::new()),
            epoch: Instant::now(),
            clock_ms: Cell::new(1),
            scratch: RefCell::new(vec![0u8; limits::READ_SCRATCH_BYTES].into_boxed_slice()),
            gate: Gate::new(),
            wake_queue,
            blocking,
            outbound: Cell::new(0),
            tls_in_progress: Cell::new(0),
            ping_epoch: Cell::new(0),
            admission_changed: Signal::default(),
            date: Cell::new((0, [b' '; 29])),
        }
        .with_date()
    }

    fn with_date(self) -> ShardState {
        self.refresh_date();
        self
    }

    /// The `Date` field value of responses now.
    pub fn date(&self) -> HttpDate {
        self.date.get().1
    }

    /// Formats the `Date` again if the second changed (the housekeeping tick calls it).
    pub fn refresh_date(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if self.date.get().0 != now {
            self.date.set((now, http_date(now)));
        }
    }

    pub fn id(&self) -> usize {
        self.id
    }

    pub fn node(&self) -> &Arc<NodeShared> {
        &self.node
    }

    /// This shard's side of the node, for a connection's input account.
    pub fn inbound(&self) -> Arc<ShardInbound> {
        self.inbound.clone()
    }

    pub fn settings(&self) -> &Settings {
        &self.node.settings
    }

    pub fn stats(&self) -> &ShardStats {
        &self.node.stats[self.id]
    }

    pub fn draining(&self) -> bool {
        self.draining.get()
    }

    /// The shard's end of the access log, when it is on.
    pub fn access_log(&self) -> Option<&ShardLog> {
        self.access_log.as_ref()
    }

    /// The budget of the shard's warnings about apps' failed calls.
    pub fn app_errors(&self) -> &LogBudget {
        &self.app_errors
    }

    /// The housekeeping tick's part of the shard's logs: hands the access log's chunk to its
    /// writer (a line is written within a tick), and says how many warnings the last window
    /// did not log, if it is over.
    pub fn tick_logs(&self) {
        if let Some(log) = &self.access_log {
            log.hand_over();
        }
        let suppressed = self.app_errors.roll(self.now_ms());
        if suppressed > 0 {
            log_budget::warn_app_errors_suppressed(self.id, suppressed);
        }
    }

    /// Marks the shard draining and wakes every waiting task to see it.
    pub fn start_drain(&self) {
        self.draining.set(true);
        self.wake_all();
    }

    /// The read scratch buffer. Borrow it only inside a poll, never across an await.
    pub fn scratch(&self) -> RefMut<'_, Box<[u8]>> {
        self.scratch.borrow_mut()
    }

    /// Spawns a task the drain waits for; `Err` once the gate is closing.
    pub fn spawn<T: 'static>(
        &self,
        fut: impl Future<Output = T> + 'static,
    ) -> Result<glommio::Task<T>, ()> {
        // Not `Gate::spawn`: its `async move { fut.await }` wrapper keeps the future twice
        // (once as the block's capture, once as the awaited state), which doubled every
        // connection's task (2,208 bytes for a 1,096-byte future, measured).
        // Scheduled, not run at once (`spawn_local` would poll it inside the caller's turn:
        // the accept loop then took 1.1 s from full to refusing a flood, measured).
        let pass = self.gate.enter().map_err(|_| ())?;
        let queue = glommio::executor().current_task_queue();
        glommio::spawn_local_into(WithPass { fut, _pass: pass }, queue).map_err(|_| ())
    }

    /// Waits until every task spawned through [`ShardState::spawn`] has ended.
    pub async fn tasks_ended(&self) {
        let _ = self.gate.close().await;
    }

    // --- Waker slots and deadlines ---

    /// A slot for a waiting task's waker.
    pub fn register(&self) -> usize {
        self.wakers.borrow_mut().insert(Parked::default())
    }

    pub fn unregister(&self, slot: usize) {
        self.wakers.borrow_mut().try_remove(slot);
    }

    /// Remembers the waker of a task about to wait.
    pub fn park(&self, slot: usize, waker: &Waker) {
        if let Some(p) = self.wakers.borrow_mut().get_mut(slot) {
            if !p.waker.as_ref().is_some_and(|w| w.will_wake(waker)) {
                p.waker = Some(waker.clone());
            }
        }
    }

    /// Wakes the task parked in a slot.
    pub fn wake_slot(&self, slot: usize) {
        let w = self
            .wakers
            .borrow_mut()
            .get_mut(slot)
            .and_then(|p| p.waker.take());
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Wakes every parked task (the drain).
    fn wake_all(&self) {
        let mut next = 0;
        while let Some(n) = self.wake_some(next, usize::MAX) {
            next = n;
        }
    }

    /// Wakes at most `n` parked tasks from slot `from` on; returns where to go on from, or
    /// `None` when the last slot was reached. The ping sweep wakes the shard a slice a turn.
    pub fn wake_some(&self, from: usize, n: usize) -> Option<usize> {
        let mut woken = Vec::new();
        let mut next = None;
        {
            let mut wakers = self.wakers.borrow_mut();
            let end = wakers.capacity();
            let mut slot = from;
            while slot < end {
                if woken.len() == n {
                    next = Some(slot);
                    break;
                }
                if let Some(w) = wakers.get_mut(slot).and_then(|p| p.waker.take()) {
                    woken.push(w);
                }
                slot += 1;
            }
        }
        woken.into_iter().for_each(Waker::wake);
        next
    }

    /// The shard's clock: milliseconds since the shard started, as of the last tick.
    pub fn now_ms(&self) -> u64 {
        self.clock_ms.get()
    }

    /// The shard-clock millisecond `after` from now.
    pub fn deadline_after(&self, after: Duration) -> u64 {
        self.now_ms()
            .saturating_add(u64::try_from(after.as_millis()).unwrap_or(u64::MAX))
    }

    /// Reads the clock (the housekeeping tick, once a [`SHARD_TICK`](limits::SHARD_TICK)).
    pub fn refresh_clock(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.clock_ms.set(ms.max(1));
    }

    /// Sets (or with 0 clears) the deadline of the wait in `slot`.
    pub fn set_deadline(&self, slot: usize, deadline_ms: u64) {
        if let Some(p) = self.wakers.borrow_mut().get_mut(slot) {
            p.deadline_ms = deadline_ms;
        }
    }

    /// Wakes every parked task whose deadline has passed on the shard's clock (the tick's
    /// sweep, after [`refresh_clock`](Self::refresh_clock)); returns how many.
    pub fn expire_deadlines(&self) -> usize {
        let now = self.now_ms();
        let woken: Vec<Waker> = self
            .wakers
            .borrow_mut()
            .iter_mut()
            .filter(|(_, p)| p.deadline_ms != 0 && p.deadline_ms <= now)
            .filter_map(|(_, p)| p.waker.take())
            .collect();
        let n = woken.len();
        woken.into_iter().for_each(Waker::wake);
        n
    }

    // --- The ping epoch ---

    pub fn ping_epoch(&self) -> u64 {
        self.ping_epoch.get()
    }

    /// Starts a new ping epoch: WebSockets woken after this ping their client.
    pub fn next_ping_epoch(&self) {
        self.ping_epoch.set(self.ping_epoch.get() + 1);
    }

    // --- TLS handshakes in progress ---

    /// Counts a handshake in progress for `asker` while the guard lives; `None` past
    /// [`TLS_HANDSHAKES_MAX`](limits::TLS_HANDSHAKES_MAX) or past the asker's share of them
    /// (the shard's `tls_handshakes` pool, `crate::fair`).
    pub fn begin_handshake(&self, asker: ClientKey) -> Option<HandshakeGuard<'_>> {
        let share = self.node.pools.handshakes[self.id].take(asker, 1).ok()?;
        self.set_handshakes(self.tls_in_progress.get() + 1);
        Some(HandshakeGuard {
            state: self,
            _share: share,
        })
    }

    fn set_handshakes(&self, n: usize) {
        self.tls_in_progress.set(n);
        self.stats()
            .tls_handshakes_in_progress
            .store(n as u64, Ordering::Relaxed);
    }

    // --- Outbound bytes ---

    /// Bytes waiting to be written on this shard.
    pub fn outbound(&self) -> u64 {
        self.outbound.get()
    }

    /// Counts `bytes` more waiting to be written.
    pub fn add_outbound(&self, bytes: u64) {
        let now = self.outbound.get() + bytes;
        self.outbound.set(now);
        let stats = self.stats();
        stats.outbound_bytes.store(now, Ordering::Relaxed);
        stats.outbound_bytes_max.fetch_max(now, Ordering::Relaxed);
    }

    /// `bytes` were written (or dropped).
    pub fn release_outbound(&self, bytes: u64) {
        let now = self.outbound.get().saturating_sub(bytes);
        self.outbound.set(now);
        self.stats().outbound_bytes.store(now, Ordering::Relaxed);
    }

    // --- The blocking threads ---

    /// Runs `f` (computing) on one of the shard's blocking threads once `client` has its turn
    /// for one ([`blocking`]).
    pub async fn on_thread<T: Send + 'static>(
        &self,
        client: ClientKey,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        self.blocking.on_thread(self.side(), client, f).await
    }

    /// Runs `f` (doing `work`) as [`ShardState::on_thread`] does, timing the hand-off to the
    /// thread (its turn included), the run there and the way back as the three `stages`.
    pub async fn on_thread_timed<T: Send + 'static>(
        &self,
        job: (ClientKey, Work),
        stages: [Stage; 3],
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        self.blocking
            .on_thread_timed(self.side(), job, stages, f)
            .await
    }

    /// What the blocking threads' slots read of this shard.
    fn side(&self) -> blocking::ShardSide<'_> {
        blocking::ShardSide {
            clock_ms: &self.clock_ms,
            stats: self.stats(),
        }
    }

    // --- The wake queue ---

    /// Whether the ready line is as long as the awake cap.
    pub fn is_behind(&self) -> bool {
        self.wake_queue.is_behind()
    }

    /// Waits (in FIFO order, asleep) for an awake slot ([`wake_queue`]).
    pub async fn acquire_awake(self: &Rc<Self>) -> AwakePermit {
        AwakePermit::acquire(self).await
    }

    /// Waits for a restore slot for an object `client` made live: in order among that client's
    /// restores, the clients taking turns ([`Line`](crate::line::Line)).
    pub async fn acquire_restore(self: &Rc<Self>, client: ClientKey) -> RestorePermit {
        RestorePermit::acquire(self, client).await
    }

    // --- Admission ---

    /// Tells the run loop to bring the listeners in line with the admission state.
    pub fn admission_changed(&self) {
        self.admission_changed.raise();
    }

    /// Waits until [`ShardState::admission_changed`] was called since the last wait.
    pub async fn wait_admission_changed(&self) {
        self.admission_changed.wait().await
    }
}

/// A TLS handshake in progress; counted down (and its share given back) when dropped.
pub(crate) struct HandshakeGuard<'a> {
    state: &'a ShardState,
    _share: Share,
}

impl Drop for HandshakeGuard<'_> {
    fn drop(&mut self) {
        self.state
            .set_handshakes(self.state.tls_in_progress.get() - 1);
    }
}

/// A one-waiter event: raised any number of times, seen once by the next wait.
#[derive(Default)]
struct Signal {
    raised: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Signal {
    fn raise(&self) {
        self.raised.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    async fn wait(&self) {
        futures_lite::future::poll_fn(|cx| {
            if self.raised.replace(false) {
                return Poll::Ready(());
            }
            *self.waker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }
}
