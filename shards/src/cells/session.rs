//! Sessions: the cells of WebSocket connections attached to an object, and the topics they are
//! subscribed to. Each session's outbound side (its mail, what it holds, why it closes, and the
//! fan-out's own writes to it) is its [`SessionOut`], shared by this table, its topic's list of
//! subscribers and its connection: a fan-out walks its topic's list, with no lookup by id per
//! viewer; a send to one session, or one from another shard, finds it by id.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use combd_kernel::fair::ClientKey;

use crate::app::SessionId;
use crate::defer::Defer;
use crate::job::ShardMsg;
use crate::state::turn::Turn;
use crate::state::ShardState;
use crate::stats::ShardStats;
use crate::ws::OutFrame;

pub(crate) mod out;
pub(crate) mod tally;

use out::Joined;
pub(crate) use out::{Attach, CloseWhy, DirectSocket, SessionOut};
use tally::ClientTallies;

/// An object's key and one of its topics.
type TopicKey = (String, String);

/// The sessions of one shard, and the topics they are subscribed to.
pub(crate) struct Sessions {
    state: Rc<ShardState>,
    map: RefCell<HashMap<u64, Rc<SessionOut>>>,
    /// Each topic's sessions, in no order; each knows its place ([`SessionOut::place`]).
    topics: RefCell<HashMap<Rc<TopicKey>, Vec<Rc<SessionOut>>>>,
    next: Cell<u64>,
    /// What each client's sessions have waiting, against its share of the outbound budget.
    tallies: RefCell<ClientTallies>,
    /// Each numbered session's place in its topic's log, as far as its connection has taken
    /// frames to write: where it resumes if it misses frames (`crate::ws::numbered`). Kept
    /// here, not in every session: a plain viewer carries none of it.
    places: RefCell<HashMap<u64, (u64, u64)>>,
}

impl Sessions {
    pub fn new(state: Rc<ShardState>) -> Sessions {
        Sessions {
            state,
            map: RefCell::new(HashMap::new()),
            topics: RefCell::new(HashMap::new()),
            next: Cell::new(0),
            tallies: RefCell::new(ClientTallies::default()),
            places: RefCell::new(HashMap::new()),
        }
    }

    /// A numbered session's connection took frames that bring it to `place`.
    pub fn set_place(&self, s: &SessionOut, place: (u64, u64)) {
        if self.map.borrow().contains_key(&s.id()) {
            self.places.borrow_mut().insert(s.id(), place);
        }
    }

    /// A numbered session's place, if its connection took any frame that sets one.
    pub fn place(&self, s: &SessionOut) -> Option<(u64, u64)> {
        self.places.borrow().get(&s.id()).copied()
    }

    /// A new session of the connection parked in `slot` (of the client `asker`), attached
    /// to object `key` as `who` and subscribed to `topic`.
    pub fn open(
        &self,
        (slot, asker): (usize, ClientKey),
        key: String,
        topic: String,
        who: Attach,
    ) -> Rc<SessionOut> {
        let id = self.next.get() + 1;
        self.next.set(id);
        let tally = self.tallies.borrow_mut().of(asker);
        let mut topics = self.topics.borrow_mut();
        let k = (key, topic);
        let shared = match topics.get_key_value(&k) {
            Some((shared, _)) => shared.clone(),
            None => Rc::new(k),
        };
        let s = Rc::new(SessionOut::new(
            (id, slot),
            self.state.clone(),
            shared.clone(),
            Some(tally),
            who,
        ));
        let list = topics.entry(shared).or_default();
        s.set_place(list.len());
        list.push(s.clone());
        self.map.borrow_mut().insert(id, s.clone());
        ShardStats::add(&self.state.stats().sessions, 1);
        s
    }

    /// Forgets a session (its connection closes): after this nothing reaches it, and the
    /// fan-out does not write to its socket.
    pub fn end(&self, s: &SessionOut) {
        if self.map.borrow_mut().remove(&s.id()).is_none() {
            return;
        }
        ShardStats::sub(&self.state.stats().sessions, 1);
        self.places.borrow_mut().remove(&s.id());
        if let Some(tally) = s.end() {
            self.tallies.borrow_mut().session_ended(tally);
        }
        let mut topics = self.topics.borrow_mut();
        if let Some(list) = topics.get_mut(&**s.topic()) {
            let place = s.place();
            list.swap_remove(place);
            if let Some(moved) = list.get(place) {
                moved.set_place(place);
            }
            if list.is_empty() {
                topics.remove(&**s.topic());
            }
        }
    }

    /// Marks a session as having missed frames: what waits is dropped (counted), and its
    /// connection is woken to resync it.
    pub fn missed(&self, id: u64) {
        let s = self.map.borrow().get(&id).cloned();
        if let Some(s) = s {
            self.state.wake_slot(s.missed());
        }
    }

    /// Closes every session whose app `registered` no longer has (1001, `app removed`):
    /// their mail is dropped and each connection closes when it next runs. Returns how many.
    pub fn close_removed_apps(&self, registered: impl Fn(&str) -> bool) -> u64 {
        let slots: Vec<usize> = self
            .map
            .borrow()
            .values()
            .filter(|s| !registered(s.topic().0.split('/').next().unwrap_or("")))
            .filter_map(|s| s.close_for(CloseWhy::AppRemoved))
            .collect();
        for &slot in &slots {
            self.state.wake_slot(slot);
        }
        ShardStats::add(
            &self.state.stats().ws_app_removed_closed,
            slots.len() as u64,
        );
        slots.len() as u64
    }

    /// Closes every session of the shard (1013, `lease lost`): in a fleet, this node's lease
    /// was lost, so any object its sessions are attached to may be another node's by now (it
    /// claims objects again under a new lease). Their mail is dropped and each connection
    /// closes when it next runs; their clients reconnect, numbered ones with their place, and
    /// are passed on to each object's owner. Returns how many.
    pub fn close_all(&self, why: CloseWhy) -> u64 {
        let slots: Vec<usize> = self
            .map
            .borrow()
            .values()
            .filter_map(|s| s.close_for(why))
            .collect();
        for &slot in &slots {
            self.state.wake_slot(slot);
        }
        slots.len() as u64
    }

    /// Closes every session of the shard attached to object `key` for `why` (deleted: 4404,
    /// each writing what waits for it first; restored: 1012). Returns how many.
    pub fn close_object(&self, key: &str, gone: crate::job::ObjectGone) -> u64 {
        let why = match gone {
            crate::job::ObjectGone::Deleted => CloseWhy::ObjectDeleted,
            crate::job::ObjectGone::Restored => CloseWhy::ObjectRestored,
        };
        let slots: Vec<usize> = self
            .map
            .borrow()
            .values()
            .filter(|s| s.topic().0 == key)
            .filter_map(|s| s.close_for(why))
            .collect();
        for &slot in &slots {
            self.state.wake_slot(slot);
        }
        let counter = match why {
            CloseWhy::ObjectRestored => &self.state.stats().ws_object_restored_closed,
            _ => &self.state.stats().ws_object_deleted_closed,
        };
        ShardStats::add(counter, slots.len() as u64);
        slots.len() as u64
    }

    /// The local sessions of object `key` subscribed to `topic`, now.
    fn subscribers(&self, key: &str, topic: &str) -> Vec<Rc<SessionOut>> {
        self.topics
            .borrow()
            .get(&(key.to_string(), topic.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// Marks every local session of object `key` subscribed to `topic` as having missed a
    /// frame (a broadcast that could not cross to this shard).
    pub fn topic_missed(&self, key: &str, topic: &str) {
        for s in self.subscribers(key, topic) {
            self.state.wake_slot(s.missed());
        }
    }

    /// Puts a frame in a local session's mailbox and wakes its connection, as
    /// [`out::decide`] says.
    /// `from`: the object whose app sent the frame (`None`: the node's own message).
    pub fn deliver_local(&self, from: Option<&str>, id: u64, frame: Arc<OutFrame>) {
        let Some(s) = self.map.borrow().get(&id).cloned() else {
            return;
        };
        // An object reaches its own sessions only: session ids are small and sequential,
        // so an app could otherwise write into another app's WebSockets.
        if from.is_some_and(|key| s.topic().0 != key) {
            ShardStats::add(&self.state.stats().sends_foreign_dropped, 1);
            return;
        }
        if let Some(slot) = s.queue(frame) {
            self.state.wake_slot(slot);
        }
    }

    /// Delivers a frame to a session on any shard.
    pub fn deliver(&self, from: Option<&str>, to: SessionId, frame: Arc<OutFrame>) {
        if to.life != SessionId::this_life() {
            // A session of another life of the node (an id an object kept from before a
            // restart, or from another owner): gone, and never a session of this one.
            ShardStats::add(&self.state.stats().sends_to_other_lives, 1);
            return;
        }
        if to.shard as usize == self.state.id() {
            self.deliver_local(from, to.id, frame);
            return;
        }
        let Some(inbox) = self.state.node().inboxes.get(to.shard as usize) else {
            return;
        };
        let msg = ShardMsg::Deliver {
            from: from.map(str::to_string),
            session: to.id,
            frame,
        };
        if inbox.try_send(msg).is_err() {
            ShardStats::add(&self.state.stats().cross_shard_dropped, 1);
            self.state.node().missed[to.shard as usize].session(to.id);
        }
    }

    /// Delivers frames to every local session of object `key` subscribed to `topic`, all of
    /// them to one session before the next (so they go out in one send), spending `turn`:
    /// the caller's budget of [`FANOUT_PER_TURN`](combd_kernel::limits::FANOUT_PER_TURN)
    /// deliveries a turn, shared by every topic of a run of broadcasts (a budget per topic
    /// would never be spent when a run goes to many small topics: 245 pages of 41 viewers
    /// each held the shard for a whole 10,000-viewer fan-out, measured).
    pub async fn fan_out(
        &self,
        key: &str,
        topic: &str,
        frames: &[Arc<OutFrame>],
        turn: &mut Turn<'_>,
    ) {
        let subscribers = self.subscribers(key, topic);
        if subscribers.is_empty() {
            return;
        }
        let stats = self.state.stats();
        ShardStats::add(&stats.fanouts_in_progress, 1);
        let _done = Defer(|| ShardStats::sub(&stats.fanouts_in_progress, 1));
        let joined = Joined::new(frames);
        for s in subscribers {
            if let Some(slot) = s.fan_out(frames, &joined) {
                self.state.wake_slot(slot);
            }
            turn.spend_many(frames.len()).await;
        }
    }
}
