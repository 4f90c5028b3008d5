//! The life of one object on its home shard: restored (its database opened) within the
//! shard's restore cap; then, while it has mail, a batch at a time under an awake slot, run on
//! a blocking thread and handed to its commit task ([`super::commit`]), which answers it and
//! applies its effects once it is durable; let go when idle.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use combd_kernel::limits::{OBJECT_IDLE, OBJECT_IDLE_UNDER_PRESSURE};
use glommio::timer::Timer;
use tracing::warn;

use crate::app::{object_path, App};
use crate::job::{Job, Owned, Reply};
use crate::state::slot::WakerSlot;
use crate::state::ShardState;
use crate::stats::ShardStats;

use super::call::{run_batch, BatchResult, CallLimits};
use super::commit::{Committed, Pipeline};
use super::store::{self, StoreConfig, Wal};
use super::{Cells, Refusal};

/// A job waiting in an object's mailbox, and since when.
struct Queued {
    job: Job,
    at: Instant,
}

/// A live object on its home shard.
pub(super) struct ObjectCell {
    key: String,
    app: Arc<dyn App>,
    name: String,
    mailbox: RefCell<VecDeque<Queued>>,
    /// Where the object's task parks while it waits for mail.
    slot: WakerSlot,
}

impl ObjectCell {
    pub fn new(state: &Rc<ShardState>, key: String, app: Arc<dyn App>, name: &str) -> ObjectCell {
        ObjectCell {
            key,
            app,
            name: name.to_string(),
            mailbox: RefCell::new(VecDeque::new()),
            slot: WakerSlot::new(state),
        }
    }

    /// Puts a job in the mailbox and wakes the object; a full mailbox refuses it (a detach
    /// is never refused).
    pub fn post(&self, job: Job) -> Result<(), (Job, Refusal)> {
        {
            let mut mb = self.mailbox.borrow_mut();
            let cap = self.app.mailbox();
            if !job.is_detach() && mb.len() >= cap {
                return Err((job, Refusal::MailboxFull { cap }));
            }
            mb.push_back(Queued {
                job,
                at: Instant::now(),
            });
        }
        self.slot.state().wake_slot(self.slot.index());
        Ok(())
    }

    fn store_config(&self, state: &ShardState) -> (std::path::PathBuf, StoreConfig) {
        let s = state.settings();
        let path = object_path(&s.data_dir, self.app.name(), &self.name);
        let config = StoreConfig {
            db_max_bytes: s.db_max_bytes,
            schema: self.app.schema(),
        };
        (path, config)
    }
}

/// The life of one object.
pub(super) async fn run(cells: Rc<Cells>, cell: Rc<ObjectCell>) {
    let state = cells.state.clone();
    let mut db = restore(&state, &cell).await;
    let mut pipeline = Pipeline::start(&cells, &cell.key);
    loop {
        if !wait_for_mail(&state, &cell).await {
            // Idle (or draining with nothing queued): let the object go. It leaves the map in
            // this turn, so new mail makes a fresh cell. Its connection closes only once
            // every batch is durable and answered.
            cells.let_go(&cell.key);
            pipeline.finish().await;
            if let Some(db) = db.take() {
                glommio::executor().spawn_blocking(move || drop(db)).await;
            }
            return;
        }
        if pipeline.failed() {
            // A WAL sync failed since the last batch: reload before running more.
            db = reload(&cells, &cell, &mut pipeline, db.take()).await;
        }
        let Some(conn) = db.take() else {
            // The database could not be opened: answer everything queued, and let go.
            let queued: Vec<Queued> = cell.mailbox.borrow_mut().drain(..).collect();
            for q in queued {
                cells.refuse(q.job, Refusal::StorageUnavailable);
            }
            continue;
        };
        let permit = state.acquire_awake().await;
        let (conn, committed, killed) = run_one_batch(&cells, &cell, conn).await;
        drop(permit);
        pipeline.push(committed).await;
        db = if killed || pipeline.failed() {
            reload(&cells, &cell, &mut pipeline, Some(conn)).await
        } else {
            Some(conn)
        };
        if cell.app.retired() && cell.mailbox.borrow().is_empty() {
            // A reload replaced the module's version: let go as when idle; the next mail
            // restores the object on the version in force.
            cells.let_go(&cell.key);
            pipeline.finish().await;
            if let Some(db) = db.take() {
                glommio::executor().spawn_blocking(move || drop(db)).await;
            }
            return;
        }
    }
}

/// After a killed call or a failed WAL sync: answers what was handed over (a failed sync
/// answers 500), then reloads the object from its database with a new commit task.
async fn reload(
    cells: &Rc<Cells>,
    cell: &ObjectCell,
    pipeline: &mut Pipeline,
    conn: Option<rusqlite::Connection>,
) -> Option<rusqlite::Connection> {
    let old = std::mem::replace(pipeline, Pipeline::start(cells, &cell.key));
    old.finish().await;
    match conn {
        Some(conn) => reopen(&cells.state, cell, conn).await,
        None => None,
    }
}

/// Opens the object's database, within the shard's restore cap, in order.
async fn restore(state: &Rc<ShardState>, cell: &ObjectCell) -> Option<rusqlite::Connection> {
    let permit = state.acquire_restore().await;
    let (path, config) = cell.store_config(state);
    let opened = glommio::executor()
        .spawn_blocking(move || store::open(&path, config))
        .await;
    drop(permit);
    opened
        .map_err(|e| warn!(object = %cell.key, "cannot open: {e}"))
        .ok()
}

/// Waits for mail; false when the object has been idle long enough (longer under memory
/// pressure) or the node drains with nothing queued.
async fn wait_for_mail(state: &ShardState, cell: &ObjectCell) -> bool {
    let idle = if state.node().admission.pressure.load(Ordering::Relaxed) >= 1 {
        OBJECT_IDLE_UNDER_PRESSURE
    } else {
        OBJECT_IDLE
    };
    let mut timer = Timer::new(idle);
    futures_lite::future::poll_fn(|cx| {
        if !cell.mailbox.borrow().is_empty() {
            return Poll::Ready(true);
        }
        if state.draining()
            || std::future::Future::poll(std::pin::Pin::new(&mut timer), cx).is_ready()
        {
            return Poll::Ready(false);
        }
        state.park(cell.slot.index(), cx.waker());
        Poll::Pending
    })
    .await
}

/// Takes a batch from the mailbox and runs it on a blocking thread. Returns the connection,
/// the committed batch (its answers and effects, to leave once it is durable), and whether a
/// call was killed (the object must be reloaded).
async fn run_one_batch(
    cells: &Rc<Cells>,
    cell: &Rc<ObjectCell>,
    conn: rusqlite::Connection,
) -> (rusqlite::Connection, Committed, bool) {
    let state = &cells.state;
    let stats = state.stats();
    let n = if cell.app.handles_batch() {
        cell.app.batch().max(1)
    } else {
        1
    };
    let jobs: Vec<Queued> = {
        let mut mb = cell.mailbox.borrow_mut();
        let k = n.min(mb.len());
        mb.drain(..k).collect()
    };
    if let Some(oldest) = jobs.first() {
        let age = oldest.at.elapsed().as_millis() as u64;
        stats
            .mailbox_oldest_age_ms
            .fetch_max(age, Ordering::Relaxed);
    }
    let (inputs, replies): (Vec<Owned>, Vec<Reply>) =
        jobs.into_iter().map(|q| (q.job.input, q.job.reply)).unzip();
    let count = inputs.len() as u64;
    let app = cell.app.clone();
    let limits = CallLimits {
        ticks: state.settings().cpu_limit_ticks,
        memory_bytes: app.memory_kb().map(|kb| kb * 1024),
    };
    let (conn, result, wal) = glommio::executor()
        .spawn_blocking(move || {
            let mut conn = conn;
            let r = run_batch(app.as_ref(), &mut conn, &inputs, limits);
            let wal = Wal::of(&conn);
            (conn, r, wal)
        })
        .await;
    file_result(state, &cell.key, &result);
    ShardStats::add(&stats.batches, 1);
    stats.batch_max.fetch_max(count, Ordering::Relaxed);
    let committed = Committed {
        replies,
        outputs: result.outputs,
        effects: result.effects,
        wal,
    };
    (conn, committed, result.killed)
}

/// Logs a batch's output and counts its slow calls and tripped limits.
fn file_result(state: &ShardState, key: &str, result: &BatchResult) {
    for line in result.logs.lines() {
        tracing::info!(object = %key, "{line}");
    }
    let stats = state.stats();
    ShardStats::add(&stats.slow_calls, result.slow_calls);
    for l in &result.limits {
        ShardStats::add(l.counter(stats), 1);
    }
}

/// A killed call: reload the object from its database, so nothing of the call survives
/// anywhere (its transaction was rolled back).
async fn reopen(
    state: &ShardState,
    cell: &ObjectCell,
    conn: rusqlite::Connection,
) -> Option<rusqlite::Connection> {
    ShardStats::add(&state.stats().reloads, 1);
    let (path, config) = cell.store_config(state);
    glommio::executor()
        .spawn_blocking(move || {
            drop(conn);
            store::open(&path, config)
        })
        .await
        .map_err(|e| warn!(object = %cell.key, "cannot reopen: {e}"))
        .ok()
}
