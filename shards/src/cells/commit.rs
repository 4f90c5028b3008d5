//! The durable half of an object's pipeline: its commit task.
//!
//! The object's task runs batch after batch and hands each committed batch here. The commit
//! task takes every batch queued so far, makes the WAL durable for all of them with one sync
//! (group commit: batches that committed while the previous sync ran share the next one),
//! then answers them and applies their effects, in commit order. So while batch N's sync is
//! in flight, batch N+1 runs; nothing of N leaves before a sync that began after N committed
//! has returned. At most [`OBJECT_UNSYNCED_BATCHES`] batches wait between commit and answer;
//! past that the object's task waits, and its mailbox fills.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::{Poll, Waker};

use combd_fleet::segment::Segment;
use combd_kernel::limits::{
    FLEET_UNSHIPPED_BATCHES, FLEET_UPLOADS_IN_FLIGHT, OBJECT_UNSYNCED_BATCHES, WAL_SYNC_SLOW,
};
use tracing::warn;

use crate::app::{AppError, Effect, Output};
use crate::fleet::{Shipped, Shipping};
use crate::job::Reply;
use crate::state::blocking::Work;
use crate::state::ShardState;
use crate::stats::{ShardStats, Stage};
use combd_kernel::fair::ClientKey;

use super::store::Wal;
use super::{Cells, Refusal};

mod answer;
use answer::answer_group;

/// A batch that committed (its transaction is in the WAL), waiting to be made durable.
pub(super) struct Committed {
    pub replies: Vec<Reply>,
    pub outputs: Vec<Result<Output, AppError>>,
    pub effects: Vec<Effect>,
    /// The connection's WAL, to sync; none when nothing was ever written, and for a batch
    /// answered from an absent object's scratch database (it wrote nothing: no sync is owed
    /// before its answers, and none is made for it).
    pub wal: Option<Wal>,
    /// In a fleet: the WAL's length right after this batch committed (what its shipment may
    /// read up to).
    pub wal_len: u64,
    /// In a fleet, for a batch that set an alarm, queued a message or ran the node's inputs:
    /// when the object next has something due after it (`None` inside: nothing), for the
    /// fleet's wake index.
    pub due: Option<Option<u64>>,
    /// When the batch's first input arrived in the mailbox (none for a batch of no input).
    pub first_input_at: Option<std::time::Instant>,
    /// When the batch committed.
    pub committed_at: std::time::Instant,
}

/// What the commit task does between a commit and its answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SyncOrder {
    /// `COMBD_SQLITE_SYNC=full`: sync the WAL, then answer.
    SyncFirst,
    /// `COMBD_SQLITE_SYNC=normal`: answer at once (a crash of the process loses nothing; a
    /// power cut may lose the last answered writes).
    NoSync,
    /// The deliberately broken order for the power-cut test (`testing::ack_before_sync`):
    /// answer, then sync.
    AnswerFirst,
}

impl SyncOrder {
    /// What the node's settings (and the test-only switch) ask for.
    fn of(state: &crate::state::ShardState) -> SyncOrder {
        if crate::testing::ack_before_sync() {
            SyncOrder::AnswerFirst
        } else if state.settings().sqlite_sync_full {
            SyncOrder::SyncFirst
        } else {
            SyncOrder::NoSync
        }
    }
}

/// Whether the node syncs WALs itself: a batch then opens its [`Wal`] to hand it over.
pub(crate) fn syncs_wal(state: &crate::state::ShardState) -> bool {
    SyncOrder::of(state) != SyncOrder::NoSync
}

/// Committed batches between the object's task (the giver) and its commit task (the taker).
struct Pipe {
    /// The client the object's blocking threads' time is counted to (who made it live).
    client: ClientKey,
    queue: RefCell<VecDeque<Committed>>,
    /// Batches handed over and not answered yet (queued, or being synced and answered).
    unanswered: Cell<usize>,
    closed: Cell<bool>,
    /// A WAL sync failed: what committed after it may sit on a hole in the WAL, so nothing
    /// more is answered until the object reloads its database. In a fleet, also a shipment
    /// that failed: the groups after it are not answered either.
    failed: Cell<bool>,
    /// What the inputs after a failure are refused with (the failure's own refusal).
    refusal: Cell<Option<Refusal>>,
    /// In a fleet, what the object ships from (taken by a shipment while it runs).
    shipping: RefCell<Option<Shipping>>,
    taker: RefCell<Option<Waker>>,
    giver: RefCell<Option<Waker>>,
}

impl Pipe {
    fn new(client: ClientKey, shipping: Option<Shipping>) -> Pipe {
        Pipe {
            client,
            queue: RefCell::default(),
            unanswered: Cell::default(),
            closed: Cell::default(),
            failed: Cell::default(),
            refusal: Cell::default(),
            shipping: RefCell::new(shipping),
            taker: RefCell::default(),
            giver: RefCell::default(),
        }
    }

    fn wake(slot: &RefCell<Option<Waker>>) {
        if let Some(w) = slot.borrow_mut().take() {
            w.wake();
        }
    }

    /// Every queued batch, waiting for one; none once closed and empty.
    async fn take(&self) -> Option<Vec<Committed>> {
        futures_lite::future::poll_fn(|cx| {
            let mut q = self.queue.borrow_mut();
            if !q.is_empty() {
                return Poll::Ready(Some(q.drain(..).collect()));
            }
            if self.closed.get() {
                return Poll::Ready(None);
            }
            *self.taker.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// What an input after a failure is refused with: the failure's own refusal.
    fn after_failure(&self) -> Refusal {
        self.refusal.get().unwrap_or(Refusal::StorageUnavailable)
    }

    /// `n` batches were answered.
    fn answered(&self, n: usize) {
        self.unanswered.set(self.unanswered.get() - n);
        Pipe::wake(&self.giver);
    }
}

/// An object's commit task and the pipe to it.
pub(super) struct Pipeline {
    pipe: Rc<Pipe>,
    task: Option<glommio::Task<()>>,
    cells: Rc<Cells>,
    key: Rc<str>,
    durability: SyncOrder,
    /// Batches that may wait between commit and answer: [`OBJECT_UNSYNCED_BATCHES`], or in a
    /// fleet [`FLEET_UNSHIPPED_BATCHES`] (a shipment to the bucket takes tens of milliseconds,
    /// and everything committed meanwhile ships together).
    max_unanswered: usize,
}

impl Pipeline {
    /// Starts the commit task of the object `key` (in a fleet, with what it ships from), its
    /// syncs and shipments counted to `client`.
    pub fn start(
        cells: &Rc<Cells>,
        key: &str,
        client: ClientKey,
        shipping: Option<Shipping>,
    ) -> Pipeline {
        let durability = SyncOrder::of(&cells.state);
        let pipe = Rc::new(Pipe::new(client, shipping));
        let key: Rc<str> = key.into();
        let task = cells
            .state
            .spawn(release(
                cells.clone(),
                key.clone(),
                pipe.clone(),
                durability,
            ))
            .ok();
        let max_unanswered = if cells.state.node().fleet.is_some() {
            FLEET_UNSHIPPED_BATCHES
        } else {
            OBJECT_UNSYNCED_BATCHES
        };
        Pipeline {
            pipe,
            task,
            cells: cells.clone(),
            key,
            durability,
            max_unanswered,
        }
    }

    /// Hands a committed batch to the commit task, first waiting while
    /// [`OBJECT_UNSYNCED_BATCHES`] (in a fleet [`FLEET_UNSHIPPED_BATCHES`]) are unanswered. Without a commit task (the shard is past
    /// spawning) the batch is made durable and answered here.
    pub async fn push(&self, batch: Committed) {
        if self.task.is_none() {
            let (cells, pipe) = (&self.cells, &self.pipe);
            let started = start(cells, &self.key, pipe, vec![batch], self.durability).await;
            let released = finish(cells, &self.key, pipe, started, self.durability).await;
            pipe.failed.set(!released);
            return;
        }
        let pipe = &self.pipe;
        futures_lite::future::poll_fn(|cx| {
            if pipe.unanswered.get() < self.max_unanswered {
                return Poll::Ready(());
            }
            *pipe.giver.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        pipe.unanswered.set(pipe.unanswered.get() + 1);
        pipe.queue.borrow_mut().push_back(batch);
        Pipe::wake(&pipe.taker);
    }

    /// Whether a WAL sync failed: the object must reload its database (a new pipeline).
    pub fn failed(&self) -> bool {
        self.pipe.failed.get()
    }

    /// Waits until every batch handed over is answered (in a fleet: shipped), so what
    /// committed may be checkpointed.
    pub async fn idle(&self) {
        let pipe = &self.pipe;
        futures_lite::future::poll_fn(|cx| {
            if pipe.unanswered.get() == 0 {
                return Poll::Ready(());
            }
            *pipe.giver.borrow_mut() = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
    }

    /// What the object ships from, while no shipment runs (call after [`Pipeline::idle`]).
    pub fn shipping(&self) -> std::cell::RefMut<'_, Option<Shipping>> {
        self.pipe.shipping.borrow_mut()
    }

    /// Answers everything handed over and ends the commit task: after this no sync is in
    /// flight, so the connection may close. Returns what the object ships from, and whether a
    /// sync or a shipment failed (read once the last one is over: one still on its way when
    /// this was called may have failed since).
    pub async fn finish(mut self) -> (Option<Shipping>, bool) {
        self.pipe.closed.set(true);
        Pipe::wake(&self.pipe.taker);
        if let Some(task) = self.task.take() {
            task.await;
        }
        (
            self.pipe.shipping.borrow_mut().take(),
            self.pipe.failed.get(),
        )
    }
}

/// A group of batches synced (or refused) and, in a fleet, cut into segments on their way to
/// the bucket.
struct Started {
    group: Vec<Committed>,
    /// Why the group is refused already (its sync, or its shipment's start, failed).
    refusal: Option<Refusal>,
    /// In a fleet: its segments' upload, answered with the segments once they are in.
    upload: Option<async_channel::Receiver<Uploaded>>,
    /// The upload's answer, once received.
    uploaded: Option<Result<Uploaded, async_channel::RecvError>>,
    /// The answers the upload holds back (counted in `fleet_acks_waiting_upload`).
    answers: usize,
}

/// An upload's answer: the segments, uploaded.
type Uploaded = Result<Vec<Segment>, String>;

/// What the commit task does next.
enum Next {
    /// Start the groups that committed.
    Start(Vec<Committed>),
    /// Finish the oldest started group: its upload is in (what it answered), or it has none.
    Finish(Option<Result<Uploaded, async_channel::RecvError>>),
    /// The pipe is closed and everything is answered.
    Done,
}

/// The commit task: group after group, sync then answer (or as `durability` says). In a fleet
/// a group's segments upload while earlier groups' uploads are still on their way (at most
/// [`FLEET_UPLOADS_IN_FLIGHT`]); groups finish in commit order: each one's head advance, then
/// its answers, only after every group before it.
async fn release(cells: Rc<Cells>, key: Rc<str>, pipe: Rc<Pipe>, durability: SyncOrder) {
    let mut started: VecDeque<Started> = VecDeque::new();
    loop {
        let next = match started.front() {
            None => match pipe.take().await {
                Some(group) => Next::Start(group),
                None => Next::Done,
            },
            Some(front) => match &front.upload {
                None => Next::Finish(None),
                Some(upload) => {
                    let room = started.len() < FLEET_UPLOADS_IN_FLIGHT;
                    futures_lite::future::or(
                        // A receive dropped before it completes takes nothing from the channel.
                        async { Next::Finish(Some(upload.recv().await)) },
                        async {
                            match room {
                                true => match pipe.take().await {
                                    Some(group) => Next::Start(group),
                                    None => futures_lite::future::pending().await,
                                },
                                false => futures_lite::future::pending().await,
                            }
                        },
                    )
                    .await
                }
            },
        };
        match next {
            Next::Start(group) => {
                started.push_back(start(&cells, &key, &pipe, group, durability).await);
                if let Some(fleet) = &cells.state.node().fleet {
                    let uploading = started.iter().filter(|s| s.upload.is_some()).count();
                    fleet.stats.uploads_in_flight(uploading);
                }
            }
            Next::Finish(uploaded) => {
                let Some(mut s) = started.pop_front() else {
                    continue;
                };
                if let Some(uploaded) = uploaded {
                    s.uploaded = Some(uploaded);
                }
                let n = s.group.len();
                if !finish(&cells, &key, &pipe, s, durability).await {
                    pipe.failed.set(true);
                }
                pipe.answered(n);
            }
            Next::Done => break,
        }
    }
}

/// Makes a group durable with one sync (or finds it refused) and, in a fleet, cuts its
/// segments and starts their upload.
async fn start(
    cells: &Cells,
    key: &str,
    pipe: &Pipe,
    group: Vec<Committed>,
    durability: SyncOrder,
) -> Started {
    let wal = group.iter().rev().find_map(|c| c.wal.clone());
    let answers = group.iter().map(|c| c.replies.len()).sum();
    let stages = &cells.state.stats().stages;
    for c in &group {
        stages.record(Stage::CommitWait, c.committed_at.elapsed());
    }
    let mut started = Started {
        refusal: None,
        upload: None,
        uploaded: None,
        answers,
        group,
    };
    if pipe.failed.get() {
        // A group before this one failed: refused as it was (in a fleet, 503 `fleet
        // unavailable` for a lost lease, not 500 `object storage unavailable`).
        started.refusal = Some(pipe.after_failure());
        return started;
    }
    if durability == SyncOrder::SyncFirst
        && !sync(&cells.state, pipe.client, key, wal, started.group.len()).await
    {
        started.refusal = Some(Refusal::StorageUnavailable);
        return started;
    }
    let Some(fleet) = cells.state.node().fleet.clone() else {
        return started;
    };
    let wal_len = started.group.iter().map(|c| c.wal_len).max().unwrap_or(0);
    let cutter = fleet.clone();
    match on_shipping(&cells.state, key, pipe, move |s| cutter.cut(s, wal_len)).await {
        None => started.refusal = Some(Refusal::FleetUnavailable),
        Some(Ok(segments)) => started.upload = Some(fleet.upload(segments, answers)),
        Some(Err(e)) => {
            warn!(object = %key, "cannot read the WAL to ship it: {e}");
            fleet.ship_failed();
            started.refusal = Some(Refusal::FleetUnavailable);
        }
    }
    started
}

/// Finishes a started group: in a fleet, waits for its upload and makes it the head (fenced);
/// then answers it. False (and every input refused) if its sync or shipment failed, or one
/// failed before (`pipe.failed`).
async fn finish(
    cells: &Rc<Cells>,
    key: &str,
    pipe: &Pipe,
    started: Started,
    durability: SyncOrder,
) -> bool {
    let Started {
        group,
        mut refusal,
        upload,
        uploaded,
        answers,
    } = started;
    // Only a fleet node starts uploads.
    if let (Some(upload), Some(fleet)) = (upload, cells.state.node().fleet.clone()) {
        let uploaded = match uploaded {
            Some(u) => u,
            None => upload.recv().await,
        }
        .unwrap_or_else(|_| Err("the upload threads are gone".into()));
        refusal = match (refusal, pipe.failed.get(), uploaded) {
            (Some(r), ..) => Some(r),
            // A group before this one failed: its segments sit after a hole.
            (None, true, _) => Some(pipe.after_failure()),
            (None, false, Err(e)) => {
                warn!(object = %key, "cannot upload to the bucket: {e}");
                fleet.ship_failed();
                Some(Refusal::FleetUnavailable)
            }
            (None, false, Ok(segments)) => {
                let due = group.iter().rev().find_map(|c| c.due);
                advance(&cells.state, key, pipe, fleet.clone(), segments, due).await
            }
        };
        fleet.uploaded(answers);
    } else if refusal.is_none() && pipe.failed.get() {
        refusal = Some(pipe.after_failure());
    }
    if refusal.is_some() && pipe.refusal.get().is_none() {
        pipe.refusal.set(refusal);
    }
    answer_group(cells, (key, pipe.client), group, refusal, durability).await
}

/// Makes the group's last segment the head (on a blocking thread): the refusal its inputs get
/// if that failed.
async fn advance(
    state: &ShardState,
    key: &str,
    pipe: &Pipe,
    fleet: std::sync::Arc<crate::fleet::Fleet>,
    segments: Vec<Segment>,
    due: Option<Option<u64>>,
) -> Option<Refusal> {
    let advance = move |s: &mut Shipping| fleet.advance(s, &segments, due);
    let Some(shipped) = on_shipping(state, key, pipe, advance).await else {
        return Some(Refusal::FleetUnavailable);
    };
    match shipped {
        Shipped::Done => None,
        Shipped::Fenced => {
            warn!(object = %key, "another node owns the object now: nothing of this batch is answered");
            Some(Refusal::NotOwner)
        }
        Shipped::Failed(e) => {
            warn!(object = %key, "cannot ship to the fleet: {e}");
            Some(Refusal::FleetUnavailable)
        }
    }
}

/// Runs `f` on a blocking thread with what the object ships from (taken from the pipe for the
/// while, then put back). `None`, with a warning, if there is nothing to ship from: never so
/// (an owned object ships from the start), and its batches are refused rather than answered
/// unshipped.
async fn on_shipping<T: Send + 'static>(
    state: &ShardState,
    key: &str,
    pipe: &Pipe,
    f: impl FnOnce(&mut Shipping) -> T + Send + 'static,
) -> Option<T> {
    let Some(mut shipping) = pipe.shipping.borrow_mut().take() else {
        warn!(object = %key, "nothing to ship from: this batch is not answered");
        return None;
    };
    let (shipping, out) = state
        .on_thread(pipe.client, move || {
            let out = f(&mut shipping);
            (shipping, out)
        })
        .await;
    *pipe.shipping.borrow_mut() = Some(shipping);
    Some(out)
}

/// Syncs the WAL on a blocking thread; false if the disk refused.
async fn sync(
    state: &ShardState,
    client: ClientKey,
    key: &str,
    wal: Option<Wal>,
    batches: usize,
) -> bool {
    let Some(wal) = wal else {
        return true;
    };
    let stats = state.stats();
    let handed = std::time::Instant::now();
    let stages = [Stage::SyncToThread, Stage::Sync, Stage::SyncBack];
    let r = state
        .on_thread_timed((client, Work::Sync), stages, move || wal.sync())
        .await;
    let took = handed.elapsed();
    ShardStats::add(&stats.wal_syncs, 1);
    stats
        .wal_sync_max_us
        .fetch_max(took.as_micros() as u64, Ordering::Relaxed);
    if took > WAL_SYNC_SLOW {
        ShardStats::add(&stats.wal_syncs_slow, 1);
    }
    stats
        .sync_group_max
        .fetch_max(batches as u64, Ordering::Relaxed);
    match r {
        Ok(()) => true,
        Err(e) => {
            warn!(object = %key, "cannot sync the WAL: {e}");
            false
        }
    }
}
