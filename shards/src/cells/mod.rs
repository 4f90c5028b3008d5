//! Cells: durable objects and sessions, their mailboxes, and the routes between shards.
//!
//! - An **object** (`app/name`) lives on shard [`home_shard`]`(app, name)`. Its cell owns a
//!   bounded mailbox and a task ([`object`]) that restores its database ([`store`]) within the
//!   shard's restore cap, then takes its mail one input at a time, or a batch at once for apps
//!   that handle batches, in one transaction on a blocking thread ([`call`]), while holding
//!   an awake slot. Its commit task ([`commit`]) makes committed batches durable, several
//!   with one WAL sync while the next batch runs; replies and effects (sends, broadcasts)
//!   leave only after that sync. On a node alone, an object whose database does not exist
//!   runs on a scratch database ([`store::Store::Absent`]) until a batch writes; that batch
//!   creates its database, within the bounds of [`create`].
//! - A **session** ([`session`]) is a WebSocket attached to an object. It lives on its
//!   connection's shard; its outbound side (its mailbox of frames to write, what it holds,
//!   why it closes) is its [`session::SessionOut`], which its connection holds too.
//! - Between shards, each shard has one bounded inbox: jobs for its objects, deliveries to its
//!   sessions, and broadcasts, which cross to each shard once and fan out there.
//!
//! - Between objects, a message from one's outbox goes through the other's mailbox
//!   (`Cells::deliver_to_object`).
//! - In a fleet, a shard's [`route::Owners`] passes the jobs for objects other nodes own on
//!   to them, and the objects whose alarms are due are woken by its [`AlarmWakes`].
//!
//! Connections reach cells only by [`Cells::submit`]ting a job and through their session.

mod alarm_wakes;
mod backfill;
mod call;
mod commit;
mod create;
mod expiry;
mod fire;
mod migrate;
mod object;
mod presence;
mod route;
pub(crate) use alarm_wakes::AlarmWakes;
pub(crate) mod session;
mod store;
mod topic_log;
/// The hook that tells the sandbox each statement's start, for its tests.
#[cfg(test)]
pub(crate) use store::watch;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::{CROSS_SHARD_QUEUE, FANOUT_PER_TURN};

use crate::app::{home_shard, App, AppError, Effect};
use crate::http::Response;
use crate::job::{Attached, Job, Reply, ShardMsg};
use crate::object_key::ObjectKey;
use crate::state::turn::Turn;
use crate::state::ShardState;
use crate::stats::ShardStats;
use crate::ws::{self, OutFrame};
use object::ObjectCell;
use presence::Presence;
pub(crate) use presence::PresenceView;
use session::Sessions;

/// The cells of one shard.
pub(crate) struct Cells {
    state: Rc<ShardState>,
    objects: RefCell<HashMap<ObjectKey, Rc<ObjectCell>>>,
    /// In a fleet: objects let go whose cell is still closing (shipping what committed,
    /// snapshotting). A new cell of the object waits until the receiver reports closed: its
    /// restore replaces the database files, and its shipments would number segments from a
    /// head the closing cell has not finished advancing.
    closing: RefCell<HashMap<String, async_channel::Receiver<()>>>,
    sessions: Sessions,
    /// Who is attached to the topics of the objects living here, for apps that keep presence.
    presence: Presence,
    /// The shard's `COMBD_OBJECT_CREATE_RATE`.
    create_rate: create::CreateRate,
    /// In a fleet: the owners of objects asked for lately, and the reads of owners on their
    /// way.
    owners: route::Owners,
    /// The objects whose alarms are due, being woken (`alarm_wakes`).
    alarm_wakes: AlarmWakes,
    /// On shard 0: the sweeps of the apps' expiries (`expiry`).
    expiry: expiry::Expiry,
}

/// A let-go object's cell that is still closing; dropped when it has closed.
struct Closing<'a> {
    cells: &'a Cells,
    key: String,
    _tx: async_channel::Sender<()>,
}

impl Drop for Closing<'_> {
    fn drop(&mut self) {
        self.cells.closing.borrow_mut().remove(&self.key);
    }
}

/// Why a job is answered without running, with the numbers that decided it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The object's mailbox holds `cap` inputs already.
    MailboxFull { cap: usize },
    /// The home shard's inbox holds `cap` messages already.
    InboxFull { cap: usize },
    /// A new object while the node has `COMBD_MAX_OPEN_OBJECTS` live, or its asker holds its
    /// share of them.
    ObjectsOpen,
    /// An answer for a client that holds its share of the node's answer pool (answers made
    /// and not yet written: a client that reads nothing), refused before it is made.
    AnswersHeld,
    /// A new object while the shard drains (no task would run it).
    ShuttingDown,
    /// A write to a new object while the data disk is low.
    DiskLow,
    /// A write to a new object of an app that has `COMBD_MAX_OBJECTS_PER_APP` databases.
    TooManyObjects,
    /// A write to a new object past the shard's `COMBD_OBJECT_CREATE_RATE`.
    CreateRate,
    /// No app of that name on the receiving shard.
    NoSuchApp,
    /// The object's database could not be opened.
    StorageUnavailable,
    /// The object could not be brought to its app's version (`migrate`): it stays as it was.
    MigrationFailed,
    /// In a fleet: another node owns the object (or took it over).
    NotOwner,
    /// In a fleet: the coordinator or the bucket could not be reached, or this node's lease
    /// is gone, so nothing can be made durable in the fleet.
    FleetUnavailable,
}

impl Refusal {
    /// What the client sees: the refusal as an error (see [`Refusal::app_error`]).
    pub fn response(self) -> Response {
        self.app_error().response()
    }

    /// The refusal as the error an input is answered with: its status and message, and
    /// `retry-after: 1` for a refusal of load (one that may pass a second later).
    pub fn app_error(self) -> AppError {
        let (status, again) = match self {
            Refusal::MailboxFull { .. }
            | Refusal::InboxFull { .. }
            | Refusal::ObjectsOpen
            | Refusal::AnswersHeld => (503, true),
            Refusal::ShuttingDown => (503, true),
            Refusal::DiskLow | Refusal::TooManyObjects => (507, false),
            Refusal::CreateRate => (429, true),
            Refusal::NoSuchApp => (404, false),
            Refusal::StorageUnavailable => (500, false),
            Refusal::MigrationFailed => (503, false),
            Refusal::NotOwner | Refusal::FleetUnavailable => (503, true),
        };
        let e = AppError::new(status, self.message());
        if again {
            e.retry_after()
        } else {
            e
        }
    }

    /// The message a session sees as `{"error": ...}`.
    fn message(self) -> &'static str {
        match self {
            Refusal::MailboxFull { .. }
            | Refusal::InboxFull { .. }
            | Refusal::ObjectsOpen
            | Refusal::AnswersHeld => "overloaded",
            Refusal::ShuttingDown => "shutting down",
            Refusal::DiskLow => "disk_low",
            Refusal::TooManyObjects => "too many objects",
            Refusal::CreateRate => "object creation rate",
            Refusal::NoSuchApp => "no such app",
            Refusal::StorageUnavailable => "object storage unavailable",
            Refusal::MigrationFailed => "migration failed",
            Refusal::NotOwner => "object owned by another node",
            Refusal::FleetUnavailable => "fleet unavailable",
        }
    }
}

impl Cells {
    pub fn new(state: Rc<ShardState>) -> Cells {
        Cells {
            create_rate: create::CreateRate::new(state.settings().object_create_rate),
            sessions: Sessions::new(state.clone()),
            presence: Presence::new(state.clone()),
            state,
            objects: RefCell::new(HashMap::new()),
            closing: RefCell::new(HashMap::new()),
            owners: route::Owners::default(),
            alarm_wakes: AlarmWakes::default(),
            expiry: expiry::Expiry::default(),
        }
    }

    /// The shard's waking of objects whose alarms are due.
    pub(crate) fn alarm_wakes(&self) -> &AlarmWakes {
        &self.alarm_wakes
    }

    /// The shard's state.
    pub fn state(&self) -> &Rc<ShardState> {
        &self.state
    }

    /// Once after start, with backup on: every object with no base in the backup yet opened
    /// in turn, so each gets one (shard 0, `backfill`).
    pub fn backfill_backup(self: &Rc<Self>) {
        if let Ok(task) = self.state.spawn(backfill::run(self.clone())) {
            task.detach();
        }
    }

    /// At a housekeeping tick: the apps' expiries swept when one is due (shard 0).
    pub fn sweep_expiries(self: &Rc<Self>) {
        self.expiry.tick(self);
    }

    /// The shard's sessions.
    pub fn sessions(&self) -> &Sessions {
        &self.sessions
    }

    /// Sends a job to its object, wherever it lives. A job that cannot be queued is answered
    /// at once (503 `overloaded`; in a fleet, 507 `disk_low` for a new object).
    pub fn submit(self: &Rc<Self>, app: &Arc<dyn App>, name: &str, job: Job) {
        let node = self.state.node();
        let home = home_shard(app.name(), name, node.stats.len());
        if home == self.state.id() {
            self.submit_local(app, name, job);
            return;
        }
        let msg = ShardMsg::Job {
            app: app.name().to_string(),
            name: name.to_string(),
            job,
        };
        if let Err(e) = node.inboxes[home].try_send(msg) {
            ShardStats::add(&self.state.stats().mailbox_refused, 1);
            if let ShardMsg::Job { job, .. } = e.into_inner() {
                self.refuse(
                    job,
                    Refusal::InboxFull {
                        cap: CROSS_SHARD_QUEUE,
                    },
                );
            }
        }
    }

    fn submit_local(self: &Rc<Self>, app: &Arc<dyn App>, name: &str, job: Job) {
        let key = ObjectKey::new(app.name(), name);
        let has_cell = self.objects.borrow().contains_key(&key);
        let job = match has_cell {
            true => job,
            // A detach for an object let go while its sessions stayed attached (idle, or under
            // pressure) opens it again: what it keeps for the session (a presence row, say) is
            // freed, never left behind as a ghost. One that does not exist runs on a scratch
            // database and creates nothing.
            //
            // In a fleet, an object another node owns goes there without a cell: at once to an
            // owner this shard knows, else once the coordinator said who owns it.
            false => match self
                .owners
                .route(self, &key, job)
                .and_then(|job| self.owners.look_up(self, app, &key, job))
            {
                Some(job) => job,
                None => return,
            },
        };
        self.to_cell(app, name, key, job);
    }

    /// Sends `job` to `key`'s cell, made if there is none (once the coordinator said no other
    /// node owns the object).
    fn to_cell(self: &Rc<Self>, app: &Arc<dyn App>, name: &str, key: ObjectKey, job: Job) {
        let existing = self.objects.borrow().get(&key).cloned();
        let cell = match existing {
            Some(c) => c,
            None => match self.new_object(app, name, key, job.asker) {
                Ok(cell) => cell,
                Err(refusal) => return self.refuse(job, refusal),
            },
        };
        self.post(cell, job);
    }

    /// Puts `job` in `cell`'s mailbox, or refuses it.
    fn post(&self, cell: Rc<ObjectCell>, job: Job) {
        if let Err(refused) = cell.post(job) {
            let (job, refusal) = *refused;
            ShardStats::add(&self.state.stats().mailbox_refused, 1);
            self.refuse(job, refusal);
        }
    }

    /// A new live object and its task, its place among the node's live objects counted to
    /// `asker` (the client whose job makes it live). Nothing is refused here but the node's
    /// cap on live objects and the asker's share of them: an object whose database does not exist (in a fleet: was never shipped) runs on
    /// a scratch database until a write creates it, and the creation is what is bounded (disk
    /// low, objects per app, creation rate: see [`create`]).
    fn new_object(
        self: &Rc<Self>,
        app: &Arc<dyn App>,
        name: &str,
        key: ObjectKey,
        asker: ClientKey,
    ) -> Result<Rc<ObjectCell>, Refusal> {
        let node = self.state.node();
        // Its place among the node's live objects (their descriptors are held back from the
        // connection cap), held by its task until it ends.
        let place = node.reserve_object(asker).map_err(|_| {
            ShardStats::add(&self.state.stats().objects_open_refused, 1);
            Refusal::ObjectsOpen
        })?;
        // A deployed module's object runs on the version in force when it is restored.
        let app = app.pinned().unwrap_or_else(|| app.clone());
        let cell = Rc::new(ObjectCell::new(&self.state, key.clone(), app, name, asker));
        self.objects.borrow_mut().insert(key.clone(), cell.clone());
        ShardStats::add(&self.state.stats().objects_live, 1);
        node.live.opened(self.state.id(), &key);
        let life = object::run(self.clone(), cell.clone());
        match self.state.spawn(async move {
            let _place = place;
            life.await
        }) {
            Ok(task) => {
                task.detach();
                Ok(cell)
            }
            Err(()) => {
                // The shard drains: no task would ever run this cell's mail.
                self.let_go(&key);
                Err(Refusal::ShuttingDown)
            }
        }
    }

    /// Gives the mail of a cell let go to a fresh cell of the object, in order: on the app's
    /// version in force (the registry's app; `app` is the retired version the cell ran). An
    /// app removed meanwhile answers it `no such app`.
    fn hand_over(self: &Rc<Self>, app: &Arc<dyn App>, name: &str, mail: Vec<object::Queued>) {
        let Some(current) = self.state.node().apps.get(app.name()) else {
            for queued in mail {
                self.refuse(queued.job, Refusal::NoSuchApp);
            }
            return;
        };
        for queued in mail {
            self.submit_local(&current, name, queued.job);
        }
    }

    /// Forgets a live object (its task ends); new mail for it makes a fresh cell.
    fn let_go(&self, key: &str) {
        if self.objects.borrow_mut().remove(key).is_some() {
            ShardStats::sub(&self.state.stats().objects_live, 1);
            self.state.node().live.closed(self.state.id(), key);
        }
    }

    /// Lets the object go while its cell still closes: a new cell of it waits (in
    /// [`Cells::wait_closed`]) until the returned guard is dropped.
    fn let_go_closing(&self, key: &str) -> Closing<'_> {
        self.let_go(key);
        let (tx, rx) = async_channel::bounded(1);
        self.closing.borrow_mut().insert(key.to_string(), rx);
        Closing {
            cells: self,
            key: key.to_string(),
            _tx: tx,
        }
    }

    /// Waits until no earlier cell of `key` is closing.
    async fn wait_closed(&self, key: &str) {
        loop {
            let Some(rx) = self.closing.borrow().get(key).cloned() else {
                return;
            };
            // Closed (an error) when the closing cell's guard is dropped.
            let _ = rx.recv().await;
        }
    }

    /// Answers a job that will not run, the way its kind calls for.
    fn refuse(&self, job: Job, refusal: Refusal) {
        self.refuse_job_reply(job.reply, refusal);
    }

    /// Answers a job's reply with a refusal.
    fn refuse_job_reply(&self, reply: Reply, refusal: Refusal) {
        tracing::trace!(shard = self.state.id(), ?refusal, "refused");
        match reply {
            Reply::Http(reply) => {
                let _ = reply.try_send(refusal.response());
            }
            Reply::Attach { reply, .. } => {
                let _ = reply.try_send(Attached::Refused(refusal.response()));
            }
            Reply::Session(session) => {
                let text = ws::error_text(refusal.message());
                let frame = OutFrame::message(true, text.as_bytes());
                self.sessions.deliver(None, session, frame);
            }
            Reply::None => {}
        }
    }

    /// Marks the sessions that other shards could not reach (their inbox to this shard was
    /// full) as having missed messages, so each is resynced.
    pub fn catch_up_missed(&self) {
        let Some(list) = self.state.node().missed[self.state.id()].take() else {
            return;
        };
        for id in list.sessions {
            self.sessions.missed(id);
        }
        for (key, topic) in list.topics {
            self.sessions.topic_missed(&key, &topic);
        }
        for (key, why) in list.closed {
            self.sessions.close_object(&key, why);
        }
    }

    /// Handles what another shard sent. A broadcast fans out within the shard's per-turn
    /// budget, so this may take several turns.
    pub async fn receive(self: &Rc<Self>, msg: ShardMsg, fanout: &mut Turn<'_>) {
        match msg {
            ShardMsg::Job { app, name, job } => match self.state.node().apps.get(&app) {
                Some(app) => self.submit_local(&app, &name, job),
                None => self.refuse(job, Refusal::NoSuchApp),
            },
            ShardMsg::Deliver {
                from,
                session,
                frame,
            } => self.sessions.deliver_local(from.as_deref(), session, frame),
            ShardMsg::CloseObject { key, why } => {
                self.sessions.close_object(&key, why);
            }
            ShardMsg::Broadcast { key, topic, frame } => {
                self.sessions
                    .fan_out(&key, &topic, std::slice::from_ref(&frame), fanout)
                    .await
            }
        }
    }

    /// Applies an object's effects after their transactions committed: sends, and broadcasts,
    /// which cross to every other shard once and fan out here within the per-turn budget.
    ///
    /// The broadcasts between two sends (or before the first, after the last) go out topic by
    /// topic, each topic's frames in their order: a subscriber gets all of its topic's frames
    /// at once, so its connection writes them in one send (frame by frame, 5,000 viewers got
    /// one send per frame: measured), and the effects of several batches cost one fan-out, not
    /// one each. A session sees one topic, so only the order between topics changes, which no
    /// session can see; a send stays after every broadcast before it and before every one after.
    async fn apply_effects(self: &Rc<Self>, key: &str, effects: Vec<Effect>) {
        let mut run = TopicRun::default();
        for e in effects {
            match e {
                Effect::ToObject {
                    app,
                    name,
                    id,
                    body,
                } => self.deliver_to_object(key, app, name, id, body),
                Effect::Send { to, text, payload } => {
                    self.broadcast_run(key, &mut run).await;
                    self.sessions
                        .deliver(Some(key), to, OutFrame::message(text, &payload))
                }
                Effect::Broadcast {
                    topic,
                    text,
                    payload,
                    seq,
                    epoch,
                } => run.push(topic, OutFrame::logged(text, &payload, seq, epoch)),
                Effect::Resume { to, frames, place } => {
                    self.broadcast_run(key, &mut run).await;
                    self.sessions
                        .deliver(Some(key), to, OutFrame::node(frames, place))
                }
                Effect::TryAgain { to } => {
                    self.broadcast_run(key, &mut run).await;
                    self.sessions.deliver(Some(key), to, OutFrame::try_again())
                }
                Effect::Presence {
                    topic,
                    to: None,
                    payload,
                } => run.push(topic, OutFrame::presence(&payload)),
                Effect::Presence {
                    to: Some(to),
                    payload,
                    ..
                } => {
                    self.broadcast_run(key, &mut run).await;
                    self.sessions
                        .deliver(Some(key), to, OutFrame::presence(&payload))
                }
                // The object's task deletes it once the batch is answered.
                Effect::Delete => {}
            }
        }
        self.broadcast_run(key, &mut run).await;
    }

    /// Sends message `id` of `from`'s outbox (`app/name`) to object `name` of `app`.
    ///
    /// A message between objects (`Cx::send_to_object`) leaves its sender's outbox once the
    /// commit that queued it is durable, goes through the receiver's mailbox like any input,
    /// and once the receiver's batch that took it is durable, the sender is told and drops it
    /// from its outbox (and sends the next one for that receiver). A receiver that is not
    /// there, refuses (a full mailbox) or fails leaves it in the outbox: sent again after a
    /// backoff, never dropped; one taken twice (sent again before its acknowledgement came
    /// back) is recognised by the receiver and not applied again.
    fn deliver_to_object(
        self: &Rc<Self>,
        from: &str,
        app: String,
        name: String,
        id: i64,
        body: Vec<u8>,
    ) {
        let node = self.state.node();
        // The outbox is the sender's database: checked again here, never trusted.
        if !crate::app::valid_object_name(&name) {
            tracing::warn!(object = %from, "an outbox message to an invalid object name: not sent");
            return;
        }
        let (Some(to), Some(from_key)) = (node.apps.get(&app), ObjectKey::parse(from)) else {
            // No such app now (a module removed): the sender sends it again later.
            return;
        };
        let Some(sender) = node.apps.get(from_key.app()) else {
            return;
        };
        let (from_app, from_name) = (from_key.app().to_string(), from_key.name().to_string());
        let (tx, rx) = async_channel::bounded(1);
        self.submit(
            &to,
            &name,
            Job::from_object((from_app.clone(), from_name.clone(), id), body, false, tx),
        );
        ShardStats::add(&self.state.stats().object_messages_sent, 1);
        let cells = self.clone();
        let told = self.state.spawn(async move {
            let Ok(resp) = rx.recv().await else { return };
            if resp.status != 200 {
                return;
            }
            let stats = cells.state.stats();
            match serde_json::from_slice::<serde_json::Value>(&resp.body) {
                Ok(v) if v["taken"] == true => ShardStats::add(&stats.object_messages_taken, 1),
                _ => ShardStats::add(&stats.object_messages_taken_again, 1),
            }
            cells.submit(&sender, &from_name, Job::delivered(app, name, id));
        });
        if let Ok(t) = told {
            t.detach();
        }
    }

    /// Closes the sessions of object `key` (deleted or restored: `why`) on every shard: through
    /// the other shards' inboxes (or, when one is full, the list of what its sessions missed),
    /// and here.
    fn close_object_sessions(&self, key: &str, why: crate::job::ObjectGone) {
        let node = self.state.node();
        for (shard, inbox) in node.inboxes.iter().enumerate() {
            if shard == self.state.id() {
                continue;
            }
            let msg = ShardMsg::CloseObject {
                key: key.to_string(),
                why,
            };
            if inbox.try_send(msg).is_err() {
                ShardStats::add(&self.state.stats().cross_shard_dropped, 1);
                node.missed[shard].closed(key, why);
            }
        }
        self.sessions.close_object(key, why);
    }

    /// Broadcasts a run's frames, topic by topic, within one fan-out budget a turn, and
    /// empties it.
    async fn broadcast_run(&self, key: &str, run: &mut TopicRun) {
        run.index.clear();
        let mut turn = Turn::new(self.state.stats(), FANOUT_PER_TURN);
        for (topic, frames) in run.topics.drain(..) {
            self.broadcast(key, &topic, &frames, &mut turn).await;
        }
    }

    /// Sends `frames` to every session of object `key` subscribed to `topic`: through the
    /// other shards' inboxes, and here.
    async fn broadcast(
        &self,
        key: &str,
        topic: &str,
        frames: &[Arc<OutFrame>],
        turn: &mut Turn<'_>,
    ) {
        let node = self.state.node();
        for (shard, inbox) in node.inboxes.iter().enumerate() {
            if shard == self.state.id() {
                continue;
            }
            for frame in frames {
                let msg = ShardMsg::Broadcast {
                    key: key.to_string(),
                    topic: topic.to_string(),
                    frame: frame.clone(),
                };
                if inbox.try_send(msg).is_err() {
                    ShardStats::add(&self.state.stats().cross_shard_dropped, 1);
                    node.missed[shard].topic(key, topic);
                }
            }
        }
        self.sessions.fan_out(key, topic, frames, turn).await;
    }
}

/// Broadcasts waiting to go out, by topic in the order topics first appeared.
#[derive(Default)]
struct TopicRun {
    topics: Vec<(String, Vec<Arc<OutFrame>>)>,
    index: HashMap<String, usize>,
}

impl TopicRun {
    fn push(&mut self, topic: String, frame: Arc<OutFrame>) {
        match self.index.get(&topic) {
            Some(&i) => self.topics[i].1.push(frame),
            None => {
                self.index.insert(topic.clone(), self.topics.len());
                self.topics.push((topic, vec![frame]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_keeps_each_topics_frames_in_order_and_topics_in_first_order() {
        let f = |b: u8| OutFrame::message(false, &[b]);
        let mut run = TopicRun::default();
        for (topic, b) in [("p1", 1), ("p2", 2), ("p1", 3), ("p3", 4), ("p2", 5)] {
            run.push(topic.to_string(), f(b));
        }
        let got: Vec<(&str, Vec<u8>)> = run
            .topics
            .iter()
            .map(|(t, frames)| (t.as_str(), frames.iter().map(|x| x.plain()[2]).collect()))
            .collect();
        assert_eq!(
            got,
            vec![("p1", vec![1, 3]), ("p2", vec![2, 5]), ("p3", vec![4])]
        );
    }
}
