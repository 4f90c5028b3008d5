//! The life of one object on its home shard: restored (its database opened) within the
//! shard's restore cap; then, while it has mail, a batch at a time under an awake slot, run on
//! a blocking thread ([`batch`]) and handed to its commit task ([`super::commit`]), which
//! answers it and applies its effects once it is durable; let go when idle.
//!
//! On a node alone an object whose database does not exist is restored on a scratch database
//! ([`Store::Absent`]): reads and attaches that write nothing are answered from it and create
//! no file; the first batch that writes creates the database ([`super::create`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use crate::object_key::ObjectKey;
use combd_kernel::fair::ClientKey;
use combd_kernel::limits::{OBJECT_IDLE, OBJECT_IDLE_UNDER_PRESSURE};
use glommio::timer::Timer;
use tracing::warn;

use crate::app::{object_path, App};
use crate::fleet::{OpenError, Shipping};
use crate::job::Job;
use crate::state::slot::WakerSlot;
use crate::state::ShardState;
use crate::stats::ShardStats;

use super::commit::Pipeline;
use super::store::{self, Store, StoreConfig};
use super::topic_log::TopicCache;
use super::{Cells, Refusal};

mod batch;
mod delete;
mod durability;
mod restore;

use durability::Durability;

/// A job waiting in an object's mailbox, and since when.
pub(super) struct Queued {
    pub job: Job,
    at: Instant,
}

/// A live object on its home shard.
pub(super) struct ObjectCell {
    key: ObjectKey,
    app: Arc<dyn App>,
    name: String,
    mailbox: RefCell<VecDeque<Queued>>,
    /// Where the object's task parks while it waits for mail.
    slot: WakerSlot,
    /// The client whose job made it live: its database's creation is counted to it.
    opened_by: ClientKey,
    /// What it knows of its topics' logs between batches (with its connection on a blocking
    /// thread while a batch runs); forgotten when its database is opened again.
    topics: std::cell::Cell<TopicCache>,
    /// Its backup, with backup on and its database present (with its connection on a blocking
    /// thread while a batch runs).
    backup: std::cell::Cell<Option<Box<crate::backup::object::ObjectBackup>>>,
}

impl ObjectCell {
    pub fn new(
        state: &Rc<ShardState>,
        key: ObjectKey,
        app: Arc<dyn App>,
        name: &str,
        opened_by: ClientKey,
    ) -> ObjectCell {
        ObjectCell {
            key,
            app,
            name: name.to_string(),
            mailbox: RefCell::new(VecDeque::new()),
            slot: WakerSlot::new(state),
            opened_by,
            topics: Default::default(),
            backup: Default::default(),
        }
    }

    /// Its key, `app/name`.
    pub fn key(&self) -> &ObjectKey {
        &self.key
    }

    /// Its app's name.
    pub fn app_name(&self) -> &'static str {
        self.app.name()
    }

    /// The client whose job made it live.
    pub fn opened_by(&self) -> ClientKey {
        self.opened_by
    }

    /// Puts a job in the mailbox and wakes the object; a full mailbox refuses it (a detach
    /// is never refused). The refused job comes back boxed: a rare path that would otherwise
    /// size every call's result.
    pub fn post(&self, job: Job) -> Result<(), Box<(Job, Refusal)>> {
        {
            let mut mb = self.mailbox.borrow_mut();
            let cap = self.app.mailbox();
            if !job.is_detach() && mb.len() >= cap {
                return Err(Box::new((job, Refusal::MailboxFull { cap })));
            }
            mb.push_back(Queued {
                job,
                at: Instant::now(),
            });
        }
        self.slot.state().wake_slot(self.slot.index());
        Ok(())
    }

    /// The operator's delete or restore (or an expiry), taken from the head of the mailbox if
    /// it is there (the batches before it have run): where its answer goes, and what it asks.
    fn take_lifecycle(&self) -> Option<(delete::Asked, crate::job::Owned)> {
        let mut mb = self.mailbox.borrow_mut();
        if !mb.front().is_some_and(|q| q.job.is_lifecycle()) {
            return None;
        }
        let job = mb.pop_front()?.job;
        match job.reply {
            crate::job::Reply::Http(reply) => Some((reply, job.input)),
            _ => None,
        }
    }

    /// Everything queued, taken out of the mailbox.
    fn take_mail(&self) -> Vec<Queued> {
        self.mailbox.borrow_mut().drain(..).collect()
    }

    fn store_config(&self, state: &ShardState) -> (std::path::PathBuf, StoreConfig) {
        let s = state.settings();
        let path = object_path(&s.data_dir, self.app.name(), &self.name);
        let config = StoreConfig {
            db_max_bytes: s.db_max_bytes,
            schema: self.app.schema(),
            fleet: s.fleet.is_some(),
            backup: state.node().backup.is_some(),
            migrate: Some(
                super::migrate::Migrating {
                    app: self.app.clone(),
                    name: self.name.clone(),
                    limits: super::call::CallLimits::of(state, self.app.as_ref()),
                    stats: (state.node().clone(), state.id()),
                }
                .hook(),
            ),
        };
        (path, config)
    }
}

/// The life of one object: restored, then a batch of its mail at a time until it goes. It
/// goes when idle, when its module's version was replaced (a reload: what waits and the next
/// mail restore it on the version in force), and, absent, as soon as nothing waits: its scratch
/// database with it, so a spray of names holds only the objects being answered at once (each
/// idle scratch database kept its second cost ~57 KB: 10,000 names took a 1 GB node to
/// 588 MB).
pub(super) async fn run(cells: Rc<Cells>, cell: Rc<ObjectCell>) {
    let state = cells.state.clone();
    let durability = Durability::of(&state, &cell);
    // An earlier cell of this object still closing (a fleet's, or one whose module version
    // was replaced while mail waited): this one restores only once it has closed.
    cells.wait_closed(&cell.key).await;
    let Some((opened, shipping)) = open_here(&cells, &cell, &durability).await else {
        return;
    };
    // Why mail is refused while the object has no database open.
    let unopened = opened.as_ref().err().copied();
    let mut db = opened.ok();
    let mut pipeline = Pipeline::start(&cells, &cell.key, cell.opened_by(), shipping);
    // In a fleet: the WAL's length after the last commit (what the next shipment reads up to,
    // and what decides a checkpoint).
    let mut wal_len = 0;
    loop {
        let absent = matches!(db, Some(Store::Absent(_)));
        if let Some(gone) = goes(&state, &cell, &durability, &pipeline, absent).await {
            return let_object_go(&cells, &cell, &durability, pipeline, db, gone).await;
        }
        if pipeline.failed() {
            // A WAL sync failed since the last batch: reload before running more.
            db = reload(&cells, &cell, &mut pipeline, db.take()).await;
            wal_len = 0;
        }
        let Some(mut store) = db.take() else {
            // The database could not be opened: answer everything queued, and let go.
            let why = unopened.unwrap_or(Refusal::StorageUnavailable);
            refuse_mail(&cells, &cell, why);
            continue;
        };
        if durability.wants_checkpoint(wal_len) {
            store = durability.checkpoint(&state, &cell, &pipeline, store).await;
        }
        if let Some((asked, what)) = cell.take_lifecycle() {
            match lifecycle(&cells, &cell, &durability, store, what).await {
                Ok(next) => return next.run(&cells, &cell, pipeline, asked).await,
                Err((store, answer)) => {
                    let _ = asked.try_send(answer);
                    db = Some(store);
                    continue;
                }
            }
        }
        let (store, committed, after) =
            batch::run_one(&cells, &cell, store, durability.wal()).await;
        wal_len = committed.wal_len;
        pipeline.push(committed).await;
        if after.deleted {
            return delete::run(&cells, &cell, pipeline, store, None).await;
        }
        db = if after.killed || (!durability.lets_go_on_failure() && pipeline.failed()) {
            wal_len = 0;
            reload(&cells, &cell, &mut pipeline, Some(store)).await
        } else {
            Some(store)
        };
    }
}

/// Waits for mail; `Some` when the object is to go instead: idle (or, absent, nothing waits),
/// its version retired, or in a fleet a shipment failed.
async fn goes(
    state: &ShardState,
    cell: &ObjectCell,
    durability: &Durability,
    pipeline: &Pipeline,
    absent: bool,
) -> Option<Gone> {
    // A version retired with no successor (its app removed) finishes what waits first.
    let succeeded = || state.node().apps.contains(cell.app.name());
    let go = (cell.app.retired() && (mail_is_empty(cell) || succeeded()))
        || (absent && mail_is_empty(cell))
        || !wait_for_mail(state, cell, durability).await;
    // Read again once the mail is here: a reload while the object waited for it reaches that
    // mail too (it goes to a fresh cell on the new version), instead of one more batch on the
    // old (found by the `host_imports` fuzz target).
    let retired = cell.app.retired();
    let go = go || (retired && succeeded());
    // In a fleet a failed shipment (or a sync) lets the object go: the next mail claims it
    // again and restores it from the bucket, or finds its new owner.
    let failed_in_fleet = durability.lets_go_on_failure() && pipeline.failed();
    (go || failed_in_fleet).then_some(Gone {
        retired,
        failed_in_fleet,
    })
}

/// Restores the object (see [`restore`]): its database, or none if it could not be opened, and
/// in a fleet what it ships from. `None` when a fleet says it is not served here: what waits is
/// passed on to its owner (HTTP requests not already passed on) or refused, and the cell let
/// go, so the next mail makes a fresh cell that asks again.
async fn open_here(
    cells: &Rc<Cells>,
    cell: &ObjectCell,
    durability: &Durability,
) -> Option<(Result<Store, Refusal>, Option<Shipping>)> {
    match restore(&cells.state, cell, durability).await {
        Opened::Db(db, shipping) => {
            // Served here now: no route sends its requests away once this cell is gone.
            cells.owners.forget_route(&cell.key);
            Some((db, shipping.map(|s| *s)))
        }
        Opened::NotHere(refusal, owner) => {
            cells.let_go(&cell.key);
            let mail = cell.take_mail().into_iter().map(|q| q.job).collect();
            cells
                .owners
                .pass_on(cells, &cell.key, mail, refusal, owner)
                .await;
            None
        }
    }
}

/// What the operator's delete or restore (or an expiry) goes on to, once it is decided.
enum Lifecycle {
    /// The object is marked deleted: its files go.
    Delete(Store),
    /// A rebuilt database is ready to replace the object's.
    Restore(Store, restore::Rebuilt),
}

impl Lifecycle {
    /// Carries it out (the object let go, what waits handed to its next cell) and answers.
    async fn run(
        self,
        cells: &Rc<Cells>,
        cell: &ObjectCell,
        pipeline: Pipeline,
        asked: delete::Asked,
    ) {
        match self {
            Lifecycle::Delete(store) => {
                delete::run(cells, cell, pipeline, store, Some(asked)).await
            }
            Lifecycle::Restore(store, rebuilt) => {
                restore::run(cells, cell, pipeline, store, rebuilt, asked).await
            }
        }
    }
}

/// Decides the operator's delete or restore (or an expiry) at the head of the mailbox: `Err`
/// with the store to go on with and the answer when it is refused.
async fn lifecycle(
    cells: &Rc<Cells>,
    cell: &ObjectCell,
    durability: &Durability,
    store: Store,
    what: crate::job::Owned,
) -> Result<Lifecycle, (Store, crate::http::Response)> {
    match what {
        crate::job::Owned::Restore { from, at } => {
            let rebuilt = restore::prepare(&cells.state, cell, durability, &store, (from, at));
            match rebuilt.await {
                Ok(rebuilt) => Ok(Lifecycle::Restore(store, rebuilt)),
                Err(answer) => Err((store, answer)),
            }
        }
        crate::job::Owned::Delete { idle_since } => {
            delete::mark(&cells.state, cell, store, idle_since)
                .await
                .map(Lifecycle::Delete)
        }
        _ => Err((
            store,
            crate::http::Response::error(500, "not a lifecycle job"),
        )),
    }
}

/// Why an object goes: its module's version replaced (`retired`), and whether a shipment or
/// sync failed in a fleet.
struct Gone {
    retired: bool,
    failed_in_fleet: bool,
}

/// Lets the object go: idle (or draining with nothing queued), its module's version replaced,
/// or in a fleet a failed shipment. It leaves the map in this turn, so new mail makes a fresh
/// cell. Its connection closes only once every batch is durable and answered; in a fleet the
/// fresh cell waits for that before it restores.
async fn let_object_go(
    cells: &Rc<Cells>,
    cell: &ObjectCell,
    durability: &Durability,
    pipeline: Pipeline,
    db: Option<Store>,
    gone: Gone,
) {
    let closing = if durability.closes_before_reopen(gone.retired) {
        Some(cells.let_go_closing(&cell.key))
    } else {
        cells.let_go(&cell.key);
        None
    };
    if gone.retired && !gone.failed_in_fleet {
        // Its version was replaced: what waits goes, in order and in this turn (before any
        // newer mail), to a fresh cell on the version in force, which restores once this one
        // has closed. A hot object whose mailbox is never empty gets the new version after its
        // current batch, not never.
        cells.hand_over(&cell.app, &cell.name, cell.take_mail());
    }
    // Whether a shipment failed is known only once the last one is over: one still on its way
    // may fail now, and then the database holds writes answered 503, which no snapshot may
    // bring back.
    let (shipping, failed_since) = pipeline.finish().await;
    let failed = gone.failed_in_fleet || (durability.lets_go_on_failure() && failed_since);
    let db = match (cell.backup.take(), db.map(Store::into_conn)) {
        // Its backup reads what is left and truncates the WAL if it holds all of it.
        (Some(ob), Some(conn)) => Some(
            cells
                .state
                .on_thread(cell.opened_by(), move || {
                    ob.close(&conn);
                    conn
                })
                .await,
        ),
        (_, db) => db,
    };
    durability
        .close(&cells.state, cell, db, shipping, failed)
        .await;
    drop(closing);
    if gone.failed_in_fleet {
        refuse_mail(cells, cell, Refusal::FleetUnavailable);
    }
}

/// Answers everything queued with `refusal`.
fn refuse_mail(cells: &Cells, cell: &ObjectCell, refusal: Refusal) {
    for q in cell.take_mail() {
        cells.refuse(q.job, refusal);
    }
}

fn mail_is_empty(cell: &ObjectCell) -> bool {
    cell.mailbox.borrow().is_empty()
}

/// After a killed call or a failed sync: a new commit task once the old one has answered
/// everything, and the object's database opened again (a scratch one anew).
async fn reload(
    cells: &Rc<Cells>,
    cell: &ObjectCell,
    pipeline: &mut Pipeline,
    store: Option<Store>,
) -> Option<Store> {
    let old = std::mem::replace(
        pipeline,
        Pipeline::start(cells, &cell.key, cell.opened_by(), None),
    );
    let (shipping, _) = old.finish().await;
    *pipeline.shipping() = shipping;
    // What it knew of its topics may be ahead of the database opened again.
    cell.topics.take();
    match store {
        Some(store) => reopen(&cells.state, cell, store).await,
        None => None,
    }
}

/// An object's database, opened; or why it is not served here.
enum Opened {
    /// Its database or its scratch one (or why it could not be opened), and in a fleet what
    /// it ships from.
    Db(Result<Store, Refusal>, Option<Box<Shipping>>),
    /// In a fleet: not served by this node; its owner's fleet address when another node owns
    /// it.
    NotHere(Refusal, Option<String>),
}

/// Opens the object's database, within the shard's restore cap, in order; on a node alone, its
/// scratch database if it has none. In a fleet the object is first claimed and, if this node
/// owns it, written from the bucket.
async fn restore(state: &Rc<ShardState>, cell: &ObjectCell, durability: &Durability) -> Opened {
    let permit = state.acquire_restore(cell.opened_by()).await;
    let (path, config) = cell.store_config(state);
    let here = Here {
        fleet: durability.fleet(),
        key: cell.key.clone(),
        alarms: state.node().alarms.clone(),
        shard: state.id(),
        backup: state.node().backup.clone(),
    };
    let opened = state
        .on_thread(cell.opened_by(), move || here.open(&path, config))
        .await;
    drop(permit);
    match opened {
        Ok(o) => {
            if o.deleted {
                delete::deleted(state, cell.app_name());
            }
            cell.backup.set(o.backup);
            Opened::Db(Ok(o.store), o.shipping.map(Box::new))
        }
        // Logged where it failed, naming the app, the object and the step.
        Err(Ok(e)) if e.is_migration() => Opened::Db(Err(Refusal::MigrationFailed), None),
        Err(Ok(e)) => {
            warn!(object = %cell.key, "cannot open: {e}");
            Opened::Db(Err(Refusal::StorageUnavailable), None)
        }
        Err(Err(OpenError::Elsewhere(owner))) => {
            tracing::debug!(object = %cell.key, %owner, "owned by another node");
            Opened::NotHere(Refusal::NotOwner, Some(owner))
        }
        Err(Err(OpenError::Unavailable(e))) => {
            warn!(object = %cell.key, "cannot claim or restore from the fleet: {e}");
            Opened::NotHere(Refusal::FleetUnavailable, None)
        }
    }
}

/// What opening an object on a blocking thread needs.
struct Here {
    fleet: Option<Arc<crate::fleet::Fleet>>,
    key: ObjectKey,
    alarms: Arc<crate::alarms::AlarmIndex>,
    shard: usize,
    backup: Option<Arc<crate::backup::Backup>>,
}

/// What opening an object made: its store, in a fleet what it ships from, whether a delete a
/// crash interrupted was finished, and its backup (with backup on, its database present).
struct OpenedHere {
    store: Store,
    shipping: Option<Shipping>,
    deleted: bool,
    backup: Option<Box<crate::backup::object::ObjectBackup>>,
}

impl Here {
    /// Claims the object in a fleet, opens its store ([`open_store`]), tells the alarm index
    /// what it has to do and starts its backup. Blocks.
    fn open(
        self,
        path: &std::path::Path,
        config: StoreConfig,
    ) -> Result<OpenedHere, Result<store::StoreError, OpenError>> {
        let (key, shard) = (&self.key, self.shard);
        let mut shipping = match &self.fleet {
            Some(fleet) => Some(fleet.open(key, path).map_err(Err)?),
            None => None,
        };
        let alarms = (&*self.alarms, self.backup.as_ref());
        let (opened, deleted) = open_store(path, config, alarms, (key, shard));
        if let (true, Some(fleet), Some(s)) = (deleted, &self.fleet, shipping.as_mut()) {
            // Restored marked deleted: its last owner died before the fleet forgot it.
            if let Err(e) = fleet.forget(s, false) {
                fleet.closed();
                return Err(Err(OpenError::Unavailable(format!(
                    "cannot finish deleting it in the fleet: {e}"
                ))));
            }
        }
        let store = match opened {
            Ok(store) => store,
            Err(e) => {
                if let (Some(fleet), Some(_)) = (&self.fleet, &shipping) {
                    fleet.closed();
                }
                return Err(Ok(e));
            }
        };
        let backup = match (&store, &self.backup) {
            (Store::Present(db), Some(b)) => {
                reconcile_alarms(&self.alarms, key, shard, db);
                let ob = crate::backup::object::ObjectBackup::open(b, key, path, db);
                Some(Box::new(ob))
            }
            (Store::Present(db), None) => {
                reconcile_alarms(&self.alarms, key, shard, db);
                None
            }
            (Store::Absent(_), _) => None,
        };
        Ok(OpenedHere {
            store,
            shipping,
            deleted,
            backup,
        })
    }
}

/// Opens the object's database, or its scratch one when it has none: on a node alone, none
/// was ever written; in a fleet, none was ever shipped (the open restored nothing, and removed
/// any stale local file). Its reads run on a scratch database and create nothing, in etcd or
/// the bucket either. A database marked deleted (its task died before it removed it) is
/// removed now, and the object opens as new: then the second value is true. Migrated (to its
/// app's version) only once it is known not to be deleted. Blocks.
fn open_store(
    path: &std::path::Path,
    config: StoreConfig,
    (alarms, backup): (
        &crate::alarms::AlarmIndex,
        Option<&Arc<crate::backup::Backup>>,
    ),
    (key, shard): (&ObjectKey, usize),
) -> (Result<Store, store::StoreError>, bool) {
    if matches!(path.try_exists(), Ok(false)) {
        return (store::open_scratch(path, config).map(Store::Absent), false);
    }
    let unmigrated = StoreConfig {
        migrate: None,
        ..config.clone()
    };
    let mut db = match store::open(path, unmigrated) {
        Ok(db) => db,
        Err(e) => return (Err(e), false),
    };
    let marked = {
        let _node = crate::sandbox::NodeSql::enter();
        crate::object_files::marked(&db).unwrap_or(false)
    };
    if !marked {
        let migrated = match &config.migrate {
            Some(migrate) => migrate(&mut db, path),
            None => Ok(()),
        };
        return (migrated.map(|()| Store::Present(db)), false);
    }
    drop(db);
    match delete::remove_files(path, (alarms, backup), key, shard) {
        Ok(found) => (store::open_scratch(path, config).map(Store::Absent), found),
        Err(e) => {
            warn!(object = %key, "cannot remove a deleted object's files: {e}");
            let e = store::StoreError::new("remove", path, &e);
            (Err(e), false)
        }
    }
}

/// Makes sure the node's alarm index knows what an object just opened has to do (its alarms,
/// its messages to send): in a fleet the object may have come from another owner, whose index
/// it was in; on a node alone, the index may have lost an entry (its file removed, or a power
/// cut on a disk that lied). A read of the object's own tables; a synced write only when it has
/// something. A failure is logged: the object serves all the same.
fn reconcile_alarms(
    alarms: &crate::alarms::AlarmIndex,
    key: &ObjectKey,
    shard: usize,
    db: &rusqlite::Connection,
) {
    let (app, name) = (key.app(), key.name());
    let r = crate::alarms::remaining(db).and_then(|(next, count)| match next {
        Some(next) => alarms.ensure(app, name, shard, next, count),
        None => Ok(()),
    });
    if let Err(e) = r {
        warn!(object = %key, "cannot tell the alarm index what the object has to do: {e}");
    }
}

/// Waits for mail; false when the object has been idle long enough (longer under memory
/// pressure, and in a fleet `COMBD_FLEET_OBJECT_IDLE`) or the node drains with nothing queued.
async fn wait_for_mail(state: &ShardState, cell: &ObjectCell, durability: &Durability) -> bool {
    let idle = durability.idle(
        if state.node().admission.pressure.load(Ordering::Relaxed) >= 1 {
            OBJECT_IDLE_UNDER_PRESSURE
        } else {
            OBJECT_IDLE
        },
    );
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

/// A killed call: reload the object from its database (a scratch database anew), so nothing
/// of the call survives anywhere (its transaction was rolled back).
async fn reopen(state: &ShardState, cell: &ObjectCell, store: Store) -> Option<Store> {
    ShardStats::add(&state.stats().reloads, 1);
    let (path, config) = cell.store_config(state);
    state
        .on_thread(cell.opened_by(), move || store.reopen(&path, config))
        .await
        .map_err(|e| warn!(object = %cell.key, "cannot reopen: {e}"))
        .ok()
}
