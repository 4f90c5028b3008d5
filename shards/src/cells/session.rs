//! Sessions: the cells of WebSocket connections attached to an object. Each has a mailbox of
//! frames to write, the bytes waiting for its client, and the topic it is subscribed to.
//!
//! Whether a frame is queued, makes the session resync, or closes it is one pure decision
//! ([`decide`]); the registry applies it, counts it and wakes the connection. Nothing for a
//! session is dropped silently: a frame that cannot be queued drops what waits and marks the
//! session as having missed messages, and its connection asks its app for a resync
//! ([`App::resync`](crate::app::App::resync)) or closes it with 1013 when it next runs.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::{SESSION_MAILBOX, SESSION_MAILBOX_BEHIND, WS_SLOW_CLOSE_BYTES};

use crate::app::SessionId;
use crate::job::ShardMsg;
use crate::state::turn::Turn;
use crate::state::{Defer, ShardState};
use crate::stats::ShardStats;
use crate::ws::OutFrame;

mod direct;
pub(crate) mod tally;

use tally::{ClientTallies, ClientTally};

/// Why the node closes a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CloseWhy {
    /// [`WS_SLOW_CLOSE_BYTES`] would be waiting for it, or it has taken none of what waits
    /// for `COMBD_WS_SLOW_TIMEOUT`: it reads too slowly.
    Slow,
    /// The frame would take the shard past its outbound budget.
    OutboundBudget,
    /// Its app was removed (its module left the apps directory, and SIGHUP reloaded it).
    AppRemoved,
}

/// What to do with a frame for a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Put it in the session's mailbox.
    Queue,
    /// The mailbox is full: drop it and what waits, and resync the session (counted).
    Resync,
    /// Close the session (its mailbox is dropped).
    Close(CloseWhy),
}

/// What decides a delivery.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Waiting {
    /// Frames in the session's mailbox.
    pub frames: usize,
    /// The mailbox's limit now: [`SESSION_MAILBOX`], or [`SESSION_MAILBOX_BEHIND`] while the
    /// shard is behind.
    pub frames_max: usize,
    /// Bytes waiting for this session (mailbox and writes in progress).
    pub session_bytes: u64,
    /// Bytes waiting on the whole shard, and the shard's outbound budget.
    pub shard_bytes: u64,
    pub shard_budget: u64,
    /// The frame keeps the session's client within its share of the shard's outbound budget
    /// (every session of the client on the shard together).
    pub client_within_share: bool,
    /// How long the session has had bytes waiting with none taken, and
    /// `COMBD_WS_SLOW_TIMEOUT`.
    pub stuck_for: Duration,
    pub slow_timeout: Duration,
}

/// Decides what happens to a frame of `len` bytes: a session with too much waiting, or
/// waiting too long, is closed, never the node; a full mailbox, or a client past its share of
/// the shard's outbound budget (its sessions that do not read), makes the session resync.
pub(crate) fn decide(w: Waiting, len: u64) -> Delivery {
    if w.session_bytes + len > WS_SLOW_CLOSE_BYTES || w.stuck_for > w.slow_timeout {
        Delivery::Close(CloseWhy::Slow)
    } else if w.shard_bytes + len > w.shard_budget {
        Delivery::Close(CloseWhy::OutboundBudget)
    } else if w.frames >= w.frames_max || !w.client_within_share {
        Delivery::Resync
    } else {
        Delivery::Queue
    }
}

/// A session on its connection's shard.
struct SessionCell {
    /// The connection's waker slot: a delivery wakes it.
    slot: usize,
    mail: VecDeque<Arc<OutFrame>>,
    /// The object it is attached to and its topic: one allocation shared by every session of
    /// the topic on this shard (the key of [`Sessions::topics`]).
    topic: Rc<TopicKey>,
    /// The query it attached with (a resync attaches with it again).
    query: Option<String>,
    /// The client its token named, for its whole life (a resync attaches with it again).
    client: Option<Arc<crate::auth::Client>>,
    /// What the node saw of its upgrade, for its whole life (a resync attaches with it again).
    caller: Arc<crate::app::Caller>,
    /// Bytes waiting for the client: the mailbox's, and those being written, until the
    /// kernel has taken them ([`SessionCell::add_waiting`], [`SessionCell::release_waiting`]).
    waiting_bytes: u64,
    /// Its client's bytes waiting on this shard, every session of it together.
    tally: Rc<ClientTally>,
    /// Why the node closes this session. Its mail is dropped at once; the connection closes
    /// when it next runs.
    closing: Option<CloseWhy>,
    /// It missed frames: its connection resyncs it when it next runs.
    missed: bool,
    /// Since when bytes have waited for the client with none taken.
    stuck_since: Option<Instant>,
    /// The socket the fan-out writes to itself while the connection waits to read (a plain
    /// WebSocket without permessage-deflate or access log), -1 for none.
    fd: i32,
    /// A write of the fan-out sent part of a frame: the rest is at the head of `mail`, and
    /// nothing else may be written to the connection before it (a close frame after it
    /// would be read as that frame's payload).
    cut: bool,
}

impl SessionCell {
    /// Counts `n` more bytes waiting for the session's client: its own, its client's on the
    /// shard, and the shard's outbound bytes.
    fn add_waiting(&mut self, state: &ShardState, n: u64) {
        self.waiting_bytes += n;
        self.tally.add(n);
        state.add_outbound(n);
    }

    /// `n` of the bytes waiting for the session were written or dropped (at most what
    /// waits), given back to its client's tally and the shard's outbound bytes.
    fn release_waiting(&mut self, state: &ShardState, n: u64) {
        let b = n.min(self.waiting_bytes);
        self.waiting_bytes -= b;
        self.tally.release(b);
        state.release_outbound(b);
    }
}

/// An object's key and one of its topics.
type TopicKey = (String, String);

/// The sessions of one shard, and the topics they are subscribed to.
pub(crate) struct Sessions {
    state: Rc<ShardState>,
    /// Boxed: a table grows to twice what it holds, and its empty places are the size of an
    /// entry (a session's cell unboxed left ~90 bytes a session empty at 4,000 sessions).
    map: RefCell<HashMap<u64, Box<SessionCell>>>,
    topics: RefCell<HashMap<Rc<TopicKey>, HashSet<u64>>>,
    next: Cell<u64>,
    /// What each client's sessions have waiting, against its share of the outbound budget.
    tallies: RefCell<ClientTallies>,
}

impl Sessions {
    pub fn new(state: Rc<ShardState>) -> Sessions {
        Sessions {
            state,
            map: RefCell::new(HashMap::new()),
            topics: RefCell::new(HashMap::new()),
            next: Cell::new(0),
            tallies: RefCell::new(ClientTallies::default()),
        }
    }

    /// A new session of the connection parked in `slot` (of the client `asker`), attached
    /// to object `key` with `query` (and `client`, if its token named one) and subscribed to
    /// `topic`.
    #[allow(clippy::too_many_arguments)]
    pub fn open(
        &self,
        slot: usize,
        asker: ClientKey,
        key: String,
        topic: String,
        query: Option<String>,
        client: Option<Arc<crate::auth::Client>>,
        caller: Arc<crate::app::Caller>,
    ) -> SessionId {
        let id = self.next.get() + 1;
        self.next.set(id);
        let topic = {
            let mut topics = self.topics.borrow_mut();
            let k = (key, topic);
            let shared = match topics.get_key_value(&k) {
                Some((shared, _)) => shared.clone(),
                None => Rc::new(k),
            };
            topics.entry(shared.clone()).or_default().insert(id);
            shared
        };
        self.map.borrow_mut().insert(
            id,
            Box::new(SessionCell {
                slot,
                mail: VecDeque::new(),
                waiting_bytes: 0,
                tally: self.tallies.borrow_mut().of(asker),
                closing: None,
                missed: false,
                stuck_since: None,
                fd: -1,
                cut: false,
                topic,
                query,
                client,
                caller,
            }),
        );
        ShardStats::add(&self.state.stats().sessions, 1);
        SessionId::new(self.state.id() as u32, id)
    }

    /// Forgets a session (its connection closed).
    pub fn end(&self, id: u64) {
        let Some(s) = self.map.borrow_mut().remove(&id) else {
            return;
        };
        ShardStats::sub(&self.state.stats().sessions, 1);
        let mut s = s;
        s.release_waiting(&self.state, s.waiting_bytes);
        self.tallies.borrow_mut().session_ended(s.tally.clone());
        let mut topics = self.topics.borrow_mut();
        if let Some(set) = topics.get_mut(&*s.topic) {
            set.remove(&id);
            if set.is_empty() {
                topics.remove(&*s.topic);
            }
        }
    }

    /// Whether a session has mail to write, or is to be closed.
    pub fn has_mail(&self, id: u64) -> bool {
        self.map
            .borrow()
            .get(&id)
            .is_some_and(|s| !s.mail.is_empty() || s.closing.is_some() || s.missed)
    }

    /// The query the session attached with.
    pub fn query(&self, id: u64) -> Option<String> {
        self.map.borrow().get(&id).and_then(|s| s.query.clone())
    }

    /// The client the session's token named, if any, and what the node saw of its upgrade.
    pub fn client(
        &self,
        id: u64,
    ) -> (
        Option<Arc<crate::auth::Client>>,
        Option<Arc<crate::app::Caller>>,
    ) {
        self.map
            .borrow()
            .get(&id)
            .map_or((None, None), |s| (s.client.clone(), Some(s.caller.clone())))
    }

    /// Whether the session missed frames since it was last asked; the connection then
    /// resyncs it.
    pub fn take_missed(&self, id: u64) -> bool {
        self.map
            .borrow_mut()
            .get_mut(&id)
            .is_some_and(|s| std::mem::take(&mut s.missed))
    }

    /// Why the node is closing this session, if it is.
    pub fn closing(&self, id: u64) -> Option<CloseWhy> {
        self.map.borrow().get(&id).and_then(|s| s.closing)
    }

    /// Takes a session's mail; its bytes stay counted as waiting until [`Sessions::written`]
    /// says the kernel took them.
    pub fn take_mail(&self, id: u64) -> VecDeque<Arc<OutFrame>> {
        self.map
            .borrow_mut()
            .get_mut(&id)
            .map(|s| std::mem::take(&mut s.mail))
            .unwrap_or_default()
    }

    /// The kernel took `bytes` of a session's output.
    pub fn written(&self, id: u64, bytes: u64) {
        if let Some(s) = self.map.borrow_mut().get_mut(&id) {
            s.release_waiting(&self.state, bytes);
            s.stuck_since = (s.waiting_bytes > 0).then(Instant::now);
        }
    }

    /// Marks a session as having missed frames: what waits is dropped (counted), and its
    /// connection is woken to resync it.
    pub fn missed(&self, id: u64) {
        let slot = {
            let mut map = self.map.borrow_mut();
            let Some(s) = map.get_mut(&id) else {
                return;
            };
            let dropped = self.drop_mail(s);
            ShardStats::add(&self.state.stats().session_mailbox_dropped, dropped);
            s.missed = true;
            s.slot
        };
        self.state.wake_slot(slot);
    }

    /// Closes every session whose app `registered` no longer has (1001, `app removed`):
    /// their mail is dropped and each connection closes when it next runs. Returns how many.
    pub fn close_removed_apps(&self, registered: impl Fn(&str) -> bool) -> u64 {
        let mut slots = Vec::new();
        for s in self.map.borrow_mut().values_mut() {
            let app = s.topic.0.split('/').next().unwrap_or("");
            if s.closing.is_none() && !registered(app) {
                self.drop_mail(s);
                s.closing = Some(CloseWhy::AppRemoved);
                slots.push(s.slot);
            }
        }
        for &slot in &slots {
            self.state.wake_slot(slot);
        }
        ShardStats::add(
            &self.state.stats().ws_app_removed_closed,
            slots.len() as u64,
        );
        slots.len() as u64
    }

    /// The local sessions of object `key` subscribed to `topic`, now.
    fn subscribers(&self, key: &str, topic: &str) -> Vec<u64> {
        self.topics
            .borrow()
            .get(&(key.to_string(), topic.to_string()))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Marks every local session of object `key` subscribed to `topic` as having missed a
    /// frame (a broadcast that could not cross to this shard).
    pub fn topic_missed(&self, key: &str, topic: &str) {
        let ids = self.subscribers(key, topic);
        ids.into_iter().for_each(|id| self.missed(id));
    }

    /// Drops what waits in a session's mailbox; what is being written is released as the
    /// connection writes it or closes. Returns how many frames were dropped.
    fn drop_mail(&self, s: &mut SessionCell) -> u64 {
        // The rest of a frame cut short stays: the connection writes it before anything else.
        let keep = usize::from(s.cut && !s.mail.is_empty());
        let dropped = (s.mail.len() - keep) as u64;
        let queued: u64 = s.mail.drain(keep..).map(|f| f.plain().len() as u64).sum();
        s.release_waiting(&self.state, queued);
        dropped
    }

    /// Puts a frame in a local session's mailbox and wakes its connection, as [`decide`]
    /// says.
    /// `from`: the object whose app sent the frame (`None`: the node's own message).
    pub fn deliver_local(&self, from: Option<&str>, id: u64, frame: Arc<OutFrame>) {
        if let Some(slot) = self.queue_local(from, id, frame) {
            self.state.wake_slot(slot);
        }
    }

    /// Queues a frame for a session of this shard; the slot to wake, if any.
    fn queue_local(&self, from: Option<&str>, id: u64, frame: Arc<OutFrame>) -> Option<usize> {
        let len = frame.plain().len() as u64;
        let stats = self.state.stats();
        let slot = {
            let mut map = self.map.borrow_mut();
            let Some(s) = map.get_mut(&id) else {
                return None;
            };
            // An object reaches its own sessions only: session ids are small and sequential,
            // so an app could otherwise write into another app's WebSockets.
            if from.is_some_and(|key| s.topic.0 != key) {
                ShardStats::add(&stats.sends_foreign_dropped, 1);
                return None;
            }
            if s.closing.is_some() {
                return None;
            }
            let waiting = Waiting {
                frames: s.mail.len(),
                frames_max: if self.state.is_behind() {
                    SESSION_MAILBOX_BEHIND
                } else {
                    SESSION_MAILBOX
                },
                session_bytes: s.waiting_bytes,
                shard_bytes: self.state.outbound(),
                shard_budget: self.state.node().outbound_budget_bytes,
                client_within_share: s.tally.admits(
                    self.state.settings().shares(),
                    self.state.outbound(),
                    self.state.node().outbound_budget_bytes,
                    len,
                ),
                stuck_for: s.stuck_since.map_or(Duration::ZERO, |t| t.elapsed()),
                slow_timeout: self.state.settings().ws_slow_timeout,
            };
            match decide(waiting, len) {
                Delivery::Queue => {
                    s.mail.push_back(frame);
                    s.add_waiting(&self.state, len);
                    s.stuck_since.get_or_insert_with(Instant::now);
                }
                Delivery::Resync => {
                    // The new frame is dropped with what waits.
                    let dropped = 1 + self.drop_mail(s);
                    ShardStats::add(&stats.session_mailbox_dropped, dropped);
                    if !waiting.client_within_share {
                        ShardStats::add(&stats.session_share_resyncs, 1);
                    }
                    s.missed = true;
                }
                Delivery::Close(why) => {
                    ShardStats::add(
                        match why {
                            CloseWhy::Slow => &stats.ws_slow_closed,
                            CloseWhy::OutboundBudget => &stats.outbound_budget_closed,
                            CloseWhy::AppRemoved => &stats.ws_app_removed_closed,
                        },
                        1,
                    );
                    self.drop_mail(s);
                    s.closing = Some(why);
                }
            }
            s.slot
        };
        Some(slot)
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
    /// them to one session before the next (so its connection writes them in one send),
    /// spending `turn`: the caller's budget of [`FANOUT_PER_TURN`](combd_kernel::limits::FANOUT_PER_TURN) deliveries a turn, shared by
    /// every topic of a run of broadcasts (a budget per topic would never be spent when a run
    /// goes to many small topics: 245 pages of 41 viewers each held the shard for a whole
    /// 10,000-viewer fan-out, measured).
    pub async fn fan_out(
        &self,
        key: &str,
        topic: &str,
        frames: &[Arc<OutFrame>],
        turn: &mut Turn<'_>,
    ) {
        let ids = self.subscribers(key, topic);
        if ids.is_empty() {
            return;
        }
        let stats = self.state.stats();
        ShardStats::add(&stats.fanouts_in_progress, 1);
        let _done = Defer(|| ShardStats::sub(&stats.fanouts_in_progress, 1));
        for id in ids {
            let mut slot = None;
            for frame in frames {
                slot = self.queue_local(Some(key), id, frame.clone()).or(slot);
                turn.spend().await;
            }
            if let Some(slot) = slot {
                if !self.write_direct(id, slot) {
                    self.state.wake_slot(slot);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting() -> Waiting {
        Waiting {
            frames: 0,
            frames_max: SESSION_MAILBOX,
            session_bytes: 0,
            shard_bytes: 0,
            shard_budget: 1 << 30,
            client_within_share: true,
            stuck_for: Duration::ZERO,
            slow_timeout: Duration::from_secs(30),
        }
    }

    #[test]
    fn a_frame_is_queued_dropped_or_closes_the_session() {
        assert_eq!(decide(waiting(), 100), Delivery::Queue);
        let full = Waiting {
            frames: SESSION_MAILBOX,
            ..waiting()
        };
        assert_eq!(decide(full, 100), Delivery::Resync);
        let behind = Waiting {
            frames: SESSION_MAILBOX_BEHIND,
            frames_max: SESSION_MAILBOX_BEHIND,
            ..waiting()
        };
        assert_eq!(decide(behind, 1), Delivery::Resync);
        let stuck = Waiting {
            stuck_for: Duration::from_secs(31),
            ..waiting()
        };
        assert_eq!(decide(stuck, 1), Delivery::Close(CloseWhy::Slow));
        let slow = Waiting {
            session_bytes: WS_SLOW_CLOSE_BYTES - 10,
            ..waiting()
        };
        assert_eq!(decide(slow, 10), Delivery::Queue);
        assert_eq!(decide(slow, 11), Delivery::Close(CloseWhy::Slow));
        let spent = Waiting {
            shard_bytes: 1000,
            shard_budget: 1000,
            ..waiting()
        };
        assert_eq!(decide(spent, 1), Delivery::Close(CloseWhy::OutboundBudget));
        // A client past its share of the budget: its session resyncs, it is not closed.
        let hog = Waiting {
            client_within_share: false,
            ..waiting()
        };
        assert_eq!(decide(hog, 1), Delivery::Resync);
        // Closing wins over dropping: a slow reader with a full mailbox is closed.
        assert_eq!(
            decide(
                Waiting {
                    frames: SESSION_MAILBOX,
                    ..slow
                },
                11
            ),
            Delivery::Close(CloseWhy::Slow)
        );
    }
}
