//! A session's outbound side, in one place: the mail waiting for its WebSocket, the bytes it
//! holds against its client's share and the shard's budget, whether it missed frames, why the
//! node closes it, a frame cut short, and whether its connection waits in its read (and may be
//! written by the fan-out itself).
//!
//! Two writers write a session's socket, never at once: the fan-out, only while the connection
//! waits in its read with nothing of its own being written ([`SessionOut::fan_out`]), and the
//! connection, which takes the mail when it runs ([`SessionOut::take_for_write`]). A write of
//! the fan-out that the kernel takes part of leaves the rest at the head of the mail, marked
//! cut: the connection writes that rest before anything else, and after it no close frame.
//!
//! Whether a frame is queued, makes the session resync, or closes it is one pure decision
//! ([`decide`]). Nothing for a session is dropped silently: a frame that cannot be queued drops
//! what waits and marks the session as having missed messages, and its connection asks its app
//! for a resync ([`App::resync`](crate::app::App::resync)) or closes it with 1013.
//!
//! The socket the fan-out writes is a [`DirectSocket`], made from the connection's own plain
//! stream, used only while the connection waits in its read, and forgotten when the session
//! ends ([`SessionOut::end`], which the connection calls before its stream is closed).

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use combd_kernel::limits::{SESSION_MAILBOX, SESSION_MAILBOX_BEHIND, WS_SLOW_CLOSE_BYTES};

use super::tally::ClientTally;
use super::TopicKey;
use crate::app::SessionId;
use crate::state::ShardState;
use crate::stats::ShardStats;
use crate::ws::deflate::Framing;
use crate::ws::OutFrame;

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
    /// A numbered session whose resume in place its object could not serve now: its client
    /// reconnects with its place.
    ResumeLater,
    /// In a fleet: this node's lease was lost, so the object the session is attached to may be
    /// another node's now; its client reconnects (numbered: with its place) and is passed on
    /// to whoever owns it.
    LeaseLost,
    /// Its object was deleted: what waits for it is written first, then it closes with 4404.
    ObjectDeleted,
    /// Its object was replaced by a restore: it closes with 1012, and its client reconnects to
    /// the object as restored.
    ObjectRestored,
}

impl CloseWhy {
    /// Whether the session's mail is written before it closes (the object's last words).
    pub fn writes_mail_first(self) -> bool {
        matches!(self, CloseWhy::ObjectDeleted)
    }
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

/// The plain TCP socket of a session's connection, which the fan-out writes to while the
/// connection waits in its read. Made only from the connection's own stream
/// ([`DirectSocket::of`]), and held by the session until it ends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DirectSocket(RawFd);

impl DirectSocket {
    pub fn of(tcp: &glommio::net::TcpStream) -> DirectSocket {
        DirectSocket(tcp.as_raw_fd())
    }

    /// Sends what the kernel takes now of `bytes`, without waiting; `None`: it took nothing
    /// (full, or failing: the connection finds out as it writes).
    fn send(self, bytes: &[u8]) -> Option<usize> {
        use nix::sys::socket::{send, MsgFlags};
        match send(
            self.0,
            bytes,
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
        ) {
            Ok(n) if n > 0 => Some(n),
            _ => None,
        }
    }
}

/// The frames of one fan-out, written one after the other: made once for every session the
/// fan-out writes itself (the same bytes go to each).
pub(crate) struct Joined<'a> {
    frames: &'a [Arc<OutFrame>],
    bytes: OnceCell<Vec<u8>>,
    len: u64,
    /// Some of them are a topic's presence, which only numbered sessions take.
    presence: bool,
}

impl<'a> Joined<'a> {
    pub fn new(frames: &'a [Arc<OutFrame>]) -> Joined<'a> {
        Joined {
            frames,
            bytes: OnceCell::new(),
            len: frames.iter().map(|f| f.plain().len() as u64).sum(),
            presence: frames.iter().any(|f| f.is_presence()),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self.frames {
            [one] => one.plain(),
            frames => self.bytes.get_or_init(|| join(frames.iter())),
        }
    }
}

/// Frames' plain bytes one after the other.
fn join<'f>(frames: impl Iterator<Item = &'f Arc<OutFrame>>) -> Vec<u8> {
    frames.fold(Vec::new(), |mut v, f| {
        v.extend_from_slice(f.plain());
        v
    })
}

/// What a session's connection writes when it runs ([`SessionOut::take_for_write`]).
pub(crate) struct ForWrite {
    pub bytes: Vec<u8>,
    /// Messages in it (the rest of a frame cut short is not one).
    pub messages: usize,
    /// It starts with the rest of a frame the fan-out cut short.
    pub after_cut: bool,
    /// Written numbered: the place in its topic's log the session is at once it has these
    /// bytes (the last broadcast's epoch and number, or the node's position), if they move it.
    pub place: Option<(u64, u64)>,
}

/// What changes as frames come and go.
struct Outbox {
    mail: VecDeque<Arc<OutFrame>>,
    /// Bytes waiting for the client: the mailbox's, and those being written, until the
    /// kernel has taken them.
    waiting_bytes: u64,
    /// Its client's bytes waiting on this shard, every session of it together; let go when
    /// the session ends (nothing is counted for it after).
    tally: Option<Rc<ClientTally>>,
    /// Why the node closes this session. Its mail is dropped at once; the connection closes
    /// when it next runs.
    closing: Option<CloseWhy>,
    /// It missed frames: its connection resyncs it when it next runs.
    missed: bool,
    /// Since when bytes have waited for the client with none taken.
    stuck_since: Option<Instant>,
    /// A write of the fan-out sent part of a frame: the rest is at the head of `mail`, and
    /// nothing else may be written to the connection before it (a close frame after it
    /// would be read as that frame's payload).
    cut: bool,
    /// The socket the fan-out may write to (a plain WebSocket without permessage-deflate or
    /// access log), until the session ends.
    socket: Option<DirectSocket>,
    /// The connection waits in its read: nothing of its own is being written.
    reading: bool,
    /// A numbered session resuming in place: broadcasts of its log are dropped until the
    /// node's frames of its resume come (they bring them, and those after come after).
    resuming: bool,
    /// Broadcasts dropped while resuming: past a mailbox of them the resume is taken as lost
    /// (refused on its way, a full mailbox at its object) and the session as having missed
    /// frames again, so its connection closes it (1013) and its client reconnects.
    resume_dropped: u16,
}

/// A session's outbound side (see the module's notes). Shared by the session table, its
/// topic's list of subscribers, and its connection.
pub(crate) struct SessionOut {
    id: u64,
    /// The connection's waker slot: a delivery wakes it.
    slot: usize,
    state: Rc<ShardState>,
    /// The object it is attached to and its topic: one allocation shared by every session of
    /// the topic on this shard.
    topic: Rc<TopicKey>,
    /// Its place in its topic's list of subscribers.
    place: Cell<usize>,
    /// The query it attached with (a resync attaches with it again).
    query: Option<String>,
    /// The client its token named, for its whole life (a resync attaches with it again).
    client: Option<Arc<crate::auth::Client>>,
    /// What the node saw of its upgrade, for its whole life (a resync attaches with it again).
    caller: Arc<crate::app::Caller>,
    /// Numbered (`crate::ws::numbered`): it takes its topic's presence.
    numbered: bool,
    /// The outbound side of its multiplexed WebSocket, if it is a subscription of one
    /// ([`SessionOut::hub`]): its bytes count there too, against one budget for the socket,
    /// and its wakes mark it.
    hub: Option<Rc<SessionOut>>,
    out: RefCell<Outbox>,
}

/// Where a session's waiting bytes are counted: its client's tally, the shard, and its
/// socket's hub (a subscription of a multiplexed WebSocket).
#[derive(Clone, Copy)]
struct Books<'a> {
    state: &'a ShardState,
    hub: Option<&'a SessionOut>,
}

/// Who a new session is: what [`SessionOut::new`] keeps for its life.
pub(crate) struct Attach {
    pub query: Option<String>,
    pub client: Option<Arc<crate::auth::Client>>,
    pub caller: Arc<crate::app::Caller>,
    /// Numbered (`crate::ws::numbered`).
    pub numbered: bool,
    /// The hub of its multiplexed WebSocket, if it is one of its subscriptions.
    pub hub: Option<Rc<SessionOut>>,
}

impl SessionOut {
    pub(super) fn new(
        (id, slot): (u64, usize),
        state: Rc<ShardState>,
        topic: Rc<TopicKey>,
        tally: Option<Rc<ClientTally>>,
        who: Attach,
    ) -> SessionOut {
        SessionOut {
            id,
            slot,
            state,
            topic,
            place: Cell::new(0),
            query: who.query,
            client: who.client,
            caller: who.caller,
            numbered: who.numbered,
            hub: who.hub,
            out: RefCell::new(Outbox {
                mail: VecDeque::new(),
                waiting_bytes: 0,
                tally,
                closing: None,
                missed: false,
                stuck_since: None,
                cut: false,
                socket: None,
                reading: false,
                resuming: false,
                resume_dropped: 0,
            }),
        }
    }

    /// The outbound side of a multiplexed WebSocket (`crate::ws::mux`) on the connection of
    /// waker `slot`, with its verified client and what the node saw of its upgrade: the
    /// connection waits on it ([`SessionOut::has_mail`] is true once any subscription wants
    /// it), and its subscriptions' waiting bytes add up in it, against one budget for the
    /// socket. In no table, attached to nothing; it queues nothing itself.
    pub fn hub(
        slot: usize,
        state: Rc<ShardState>,
        client: Option<Arc<crate::auth::Client>>,
        caller: Arc<crate::app::Caller>,
    ) -> SessionOut {
        let who = Attach {
            query: None,
            client,
            caller,
            numbered: false,
            hub: None,
        };
        let nothing = Rc::new((String::new(), String::new()));
        SessionOut::new((0, slot), state, nothing, None, who)
    }

    /// Books its bytes are counted in.
    fn books(&self) -> Books<'_> {
        Books {
            state: &self.state,
            hub: self.hub.as_deref(),
        }
    }

    /// Its connection's slot, to be woken; a subscription marks its hub first, so the
    /// connection knows to look at its subscriptions.
    fn wake(&self) -> usize {
        if let Some(h) = &self.hub {
            h.out.borrow_mut().missed = true;
        }
        self.slot
    }

    /// Its id on its shard.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Its id as objects name it.
    pub fn session_id(&self) -> SessionId {
        SessionId::new(self.state.id() as u32, self.id)
    }

    /// The topic it is subscribed to.
    pub fn topic_name(&self) -> &str {
        &self.topic.1
    }

    pub(super) fn topic(&self) -> &Rc<TopicKey> {
        &self.topic
    }

    pub(super) fn place(&self) -> usize {
        self.place.get()
    }

    pub(super) fn set_place(&self, place: usize) {
        self.place.set(place);
    }

    /// The query it attached with.
    pub fn query(&self) -> Option<&str> {
        self.query.as_deref()
    }

    /// The client its token named, if any.
    pub fn client(&self) -> Option<&Arc<crate::auth::Client>> {
        self.client.as_ref()
    }

    /// What the node saw of its upgrade.
    pub fn caller(&self) -> &Arc<crate::app::Caller> {
        &self.caller
    }

    /// Lets the fan-out write to `socket` while the connection waits in its read.
    pub fn set_socket(&self, socket: DirectSocket) {
        self.out.borrow_mut().socket = Some(socket);
    }

    /// The connection is about to wait in its read: nothing of its own is being written.
    pub fn wait_reading(&self) {
        self.out.borrow_mut().reading = true;
    }

    /// The connection runs again.
    pub fn stop_reading(&self) {
        self.out.borrow_mut().reading = false;
    }

    /// Whether frames wait in the session's mailbox.
    pub fn mail_waiting(&self) -> bool {
        !self.out.borrow().mail.is_empty()
    }

    /// Whether the connection has mail to write, or the session is to be closed or resynced.
    pub fn has_mail(&self) -> bool {
        let o = self.out.borrow();
        !o.mail.is_empty() || o.closing.is_some() || o.missed
    }

    /// Why the node is closing this session, if it is.
    pub fn closing(&self) -> Option<CloseWhy> {
        self.out.borrow().closing
    }

    /// Whether the session missed frames since it was last asked; the connection then
    /// resyncs it.
    pub fn take_missed(&self) -> bool {
        std::mem::take(&mut self.out.borrow_mut().missed)
    }

    /// Whether a frame written in part by the fan-out still has its rest waiting: then the
    /// connection may write nothing but that rest, and closes without a close frame.
    pub fn is_cut(&self) -> bool {
        self.out.borrow().cut
    }

    /// The kernel took `bytes` of the session's output.
    pub fn written(&self, bytes: u64) {
        let mut o = self.out.borrow_mut();
        o.release(self.books(), bytes);
        o.stuck_since = (o.waiting_bytes > 0).then(Instant::now);
    }

    /// The connection takes the mail to write it: each message as `framing` makes it, after
    /// the rest of a frame the fan-out cut short. Its bytes stay counted as waiting until
    /// [`SessionOut::written`] says the kernel took them (less what compressing saved, and
    /// with what numbering added).
    pub fn take_for_write(&self, framing: Framing) -> ForWrite {
        let stats = self.state.stats();
        let mut o = self.out.borrow_mut();
        let after_cut = std::mem::take(&mut o.cut);
        let mut w = ForWrite {
            bytes: Vec::new(),
            messages: 0,
            after_cut,
            place: None,
        };
        // Counted as waiting at their plain size; a compressed frame owes less, a numbered one
        // more (its number and `|`, and the position before a log's first frame).
        let (mut saved, mut added) = (0, 0);
        for frame in std::mem::take(&mut o.mail) {
            if frame.is_rest() {
                w.bytes.extend_from_slice(frame.plain());
                continue;
            }
            w.messages += 1;
            if let Framing::Numbered { .. } | Framing::Mux { numbered: true, .. } = framing {
                w.place = frame.place().or(w.place);
            }
            let (bytes, deflated) = frame.for_session(framing);
            if deflated {
                ShardStats::add(&stats.ws_deflated_out, 1);
            }
            let (plain, start) = (frame.plain().len(), w.bytes.len());
            match framing {
                Framing::Mux { ch, .. } => crate::ws::mux::rewrap(&mut w.bytes, ch, bytes),
                _ => w.bytes.extend_from_slice(bytes),
            }
            let made = w.bytes.len() - start;
            saved += plain.saturating_sub(made) as u64;
            added += made.saturating_sub(plain) as u64;
        }
        ShardStats::add(&stats.ws_messages_out, w.messages as u64);
        o.release(self.books(), saved);
        o.add(self.books(), added);
        w
    }

    /// Marks the session as having missed frames: what waits is dropped (counted). The slot
    /// to wake.
    pub(super) fn missed(&self) -> usize {
        let mut o = self.out.borrow_mut();
        let dropped = o.drop_mail(self.books());
        ShardStats::add(&self.state.stats().session_mailbox_dropped, dropped);
        o.missed = true;
        self.wake()
    }

    /// Closes the session for `why` unless it is closing already: its mail is dropped and
    /// its connection closes when it next runs. The slot to wake, if it was not closing.
    pub(super) fn close_for(&self, why: CloseWhy) -> Option<usize> {
        let mut o = self.out.borrow_mut();
        if o.closing.is_some() {
            return None;
        }
        if !why.writes_mail_first() {
            o.drop_mail(self.books());
        }
        o.closing = Some(why);
        Some(self.wake())
    }

    /// The session ends (its connection closes): what it holds is given back, its socket
    /// forgotten, and nothing is queued for it after. Its client's tally, to be let go.
    pub(super) fn end(&self) -> Option<Rc<ClientTally>> {
        let mut o = self.out.borrow_mut();
        let waiting = o.waiting_bytes;
        o.release(self.books(), waiting);
        o.mail = VecDeque::new();
        o.socket = None;
        o.reading = false;
        o.tally.take()
    }

    /// What decides a frame of `len` bytes for this session now.
    fn waiting(&self, o: &Outbox, len: u64) -> Waiting {
        let state = &self.state;
        let budget = state.node().outbound_budget_bytes;
        Waiting {
            frames: o.mail.len(),
            frames_max: if state.is_behind() {
                SESSION_MAILBOX_BEHIND
            } else {
                SESSION_MAILBOX
            },
            // A subscription's socket has one budget for all of them.
            session_bytes: self
                .hub
                .as_ref()
                .map_or(o.waiting_bytes, |h| h.out.borrow().waiting_bytes),
            shard_bytes: state.outbound(),
            shard_budget: budget,
            client_within_share: o.tally.as_ref().is_some_and(|t| {
                t.admits(state.settings().shares(), state.outbound(), budget, len)
            }),
            stuck_for: o.stuck_since.map_or(Duration::ZERO, |t| t.elapsed()),
            slow_timeout: state.settings().ws_slow_timeout,
        }
    }

    /// A frame the owner of a subscription's object sent (`conn/relay.rs`): queued as any
    /// frame. The slot to wake, if any.
    pub fn queue_relayed(&self, frame: Arc<OutFrame>) -> Option<usize> {
        self.queue(frame)
    }

    /// The owner of a relayed subscription's object closed or failed: the subscription ends
    /// with 1013 (its client subscribes again with its place). The slot to wake, if any.
    pub fn close_on_owner_end(&self) -> Option<usize> {
        self.close_for(CloseWhy::ResumeLater)
    }

    /// A numbered session that missed frames starts resuming in place: the broadcasts of its
    /// log waiting for it, and those that come until its resume does, are dropped (its resume
    /// brings them). False if it was resuming already: its resume did not reach it either.
    pub fn start_resume(&self) -> bool {
        let mut o = self.out.borrow_mut();
        if o.resuming {
            return false;
        }
        o.resuming = true;
        o.resume_dropped = 0;
        let (kept, logged): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut o.mail)
            .into_iter()
            .partition(|f| !f.is_logged());
        o.mail = kept;
        let bytes: u64 = logged.iter().map(|f| f.plain().len() as u64).sum();
        o.release(self.books(), bytes);
        ShardStats::add(
            &self.state.stats().session_mailbox_dropped,
            logged.len() as u64,
        );
        true
    }

    /// Puts a frame in the mailbox, as [`decide`] says. The slot to wake, if any.
    pub(super) fn queue(&self, frame: Arc<OutFrame>) -> Option<usize> {
        let len = frame.plain().len() as u64;
        let stats = self.state.stats();
        if frame.is_presence() && !self.numbered {
            return None;
        }
        if frame.is_try_again() {
            return self.close_for(CloseWhy::ResumeLater);
        }
        // A subscription of a socket that is closing whole takes nothing more.
        if self.hub.as_ref().is_some_and(|h| h.closing().is_some()) {
            return None;
        }
        let mut o = self.out.borrow_mut();
        if o.closing.is_some() || o.tally.is_none() {
            return None;
        }
        if o.resuming {
            if frame.is_logged() {
                ShardStats::add(&stats.session_mailbox_dropped, 1);
                o.resume_dropped = o.resume_dropped.saturating_add(1);
                if usize::from(o.resume_dropped) < SESSION_MAILBOX {
                    return None;
                }
                o.missed = true;
                return Some(self.wake());
            }
            o.resuming = !frame.is_node();
        }
        let waiting = self.waiting(&o, len);
        match decide(waiting, len) {
            Delivery::Queue => {
                o.mail.push_back(frame);
                o.add(self.books(), len);
                o.stuck_since.get_or_insert_with(Instant::now);
            }
            Delivery::Resync => {
                // The new frame is dropped with what waits.
                let dropped = 1 + o.drop_mail(self.books());
                ShardStats::add(&stats.session_mailbox_dropped, dropped);
                if !waiting.client_within_share {
                    ShardStats::add(&stats.session_share_resyncs, 1);
                }
                o.missed = true;
            }
            Delivery::Close(why) => {
                if self.closes_socket(why) {
                    ShardStats::add(closed_counter(stats, why), 1);
                }
                o.drop_mail(self.books());
                o.closing = Some(why);
            }
        }
        Some(self.wake())
    }

    /// A decision to close the session for `why`: a subscription's reader is its socket's, so
    /// its hub closes too, the socket whole. Whether this is the first close of the socket
    /// (counted once), always for a session of its own.
    fn closes_socket(&self, why: CloseWhy) -> bool {
        self.hub.as_ref().is_none_or(|h| {
            let mut h = h.out.borrow_mut();
            let first = h.closing.is_none();
            h.closing.get_or_insert(why);
            first
        })
    }

    /// A fan-out's frames for this session: written by the fan-out itself when the
    /// connection waits in its read with nothing waiting (what the kernel does not take now
    /// waits in the mail), else queued each as [`decide`] says and written from the mail if
    /// the connection still waits in its read. The slot to wake, if any.
    pub(super) fn fan_out(&self, frames: &[Arc<OutFrame>], joined: &Joined) -> Option<usize> {
        if joined.presence && !self.numbered {
            let app: Vec<_> = frames
                .iter()
                .filter(|f| !f.is_presence())
                .cloned()
                .collect();
            return match app.is_empty() {
                true => None,
                false => self.fan_out(&app, &Joined::new(&app)),
            };
        }
        if self.send_now(frames, joined) {
            return None;
        }
        let mut wake = None;
        for frame in frames {
            wake = self.queue(frame.clone()).or(wake);
        }
        match wake {
            Some(_) if self.write_mail_now() => None,
            wake => wake,
        }
    }

    /// Whether the fan-out may write to the socket itself now: the connection waits in its
    /// read, nothing else of it is being written, nothing waits before these frames, and the
    /// shard is not behind (while it is, connections wait their turn to be awake, and one
    /// written here would go before those already waiting).
    fn may_write(&self, o: &Outbox) -> Option<DirectSocket> {
        let free = o.reading && !o.cut && o.closing.is_none() && !o.missed && o.tally.is_some();
        o.socket.filter(|_| free && !self.state.is_behind())
    }

    /// Writes a fan-out's frames to a session with nothing waiting, if it may write
    /// ([`SessionOut::may_write`]) and [`decide`] would queue them all: true if it did (what
    /// the kernel did not take is in the mail, and its connection woken for it).
    fn send_now(&self, frames: &[Arc<OutFrame>], joined: &Joined) -> bool {
        let mut o = self.out.borrow_mut();
        let Some(socket) = self.may_write(&o).filter(|_| o.mail.is_empty()) else {
            return false;
        };
        let waiting = self.waiting(&o, joined.len);
        if frames.len() > waiting.frames_max || decide(waiting, joined.len) != Delivery::Queue {
            return false;
        }
        let Some(n) = socket.send(joined.bytes()) else {
            return false;
        };
        self.count_send(n);
        // What the kernel did not take waits, as the fan-out would have queued it.
        let mut left = n;
        for frame in frames {
            let len = frame.plain().len();
            if left >= len {
                left -= len;
                ShardStats::add(&self.state.stats().ws_messages_out, 1);
                continue;
            }
            let unsent = if left > 0 {
                self.cut_at(&mut o, frame, left)
            } else {
                frame.clone()
            };
            o.mail.push_back(unsent);
            o.add(self.books(), (len - left) as u64);
            left = 0;
        }
        if !o.mail.is_empty() {
            o.stuck_since = Some(Instant::now());
            drop(o);
            self.state.wake_slot(self.slot);
        }
        true
    }

    /// The rest of `frame` after the `sent` bytes a write took: the session is cut.
    fn cut_at(&self, o: &mut Outbox, frame: &OutFrame, sent: usize) -> Arc<OutFrame> {
        let stats = self.state.stats();
        if !frame.is_rest() {
            ShardStats::add(&stats.ws_messages_out, 1);
        }
        o.cut = true;
        ShardStats::add(&stats.ws_direct_cut, 1);
        OutFrame::rest(&frame.plain()[sent..])
    }

    /// A write of the fan-out's own: counted.
    fn count_send(&self, n: usize) {
        let stats = self.state.stats();
        ShardStats::add(&stats.ws_sends, 1);
        ShardStats::add(&stats.ws_direct_sends, 1);
        ShardStats::add(&stats.bytes_out, n as u64);
    }

    /// Writes the mail from the fan-out, without waking the connection, if it may
    /// ([`SessionOut::may_write`]). True if the kernel took all of it; false: the connection
    /// is to be woken to write what waits.
    fn write_mail_now(&self) -> bool {
        let mut o = self.out.borrow_mut();
        let Some(socket) = self.may_write(&o) else {
            return false;
        };
        if o.mail.is_empty() {
            return true;
        }
        let joined;
        let bytes = match o.mail.as_slices() {
            ([one], []) => one.plain(),
            _ => {
                joined = join(o.mail.iter());
                &joined
            }
        };
        let Some(n) = socket.send(bytes) else {
            return false;
        };
        self.count_send(n);
        o.release(self.books(), n as u64);
        o.stuck_since = (o.waiting_bytes > 0).then(Instant::now);
        // Off the mail: what was sent whole, counted as messages; a frame sent in part becomes
        // its rest.
        let mut left = n;
        while let Some(f) = o.mail.front().cloned() {
            let len = f.plain().len();
            if left < len {
                if left > 0 {
                    let rest = self.cut_at(&mut o, &f, left);
                    o.mail[0] = rest;
                }
                break;
            }
            if !f.is_rest() {
                ShardStats::add(&self.state.stats().ws_messages_out, 1);
            }
            left -= len;
            o.mail.pop_front();
        }
        if o.mail.is_empty() {
            o.mail = VecDeque::new();
        }
        o.mail.is_empty()
    }
}

/// The counter of sessions the node closed for `why`.
fn closed_counter(stats: &ShardStats, why: CloseWhy) -> &std::sync::atomic::AtomicU64 {
    match why {
        CloseWhy::Slow => &stats.ws_slow_closed,
        CloseWhy::OutboundBudget => &stats.outbound_budget_closed,
        CloseWhy::AppRemoved => &stats.ws_app_removed_closed,
        // Never decided by a delivery: a resume its object refused
        // (`topic_log_resumes_refused`), a lease lost.
        CloseWhy::ResumeLater => &stats.topic_log_resumes_refused,
        CloseWhy::LeaseLost => &stats.ws_lease_lost_closed,
        CloseWhy::ObjectDeleted => &stats.ws_object_deleted_closed,
        CloseWhy::ObjectRestored => &stats.ws_object_restored_closed,
    }
}

impl Outbox {
    /// Counts `n` more bytes waiting for the session's client: its own, its client's on the
    /// shard, and the shard's outbound bytes.
    fn add(&mut self, Books { state, hub }: Books, n: u64) {
        self.waiting_bytes += n;
        if let Some(h) = hub {
            h.out.borrow_mut().waiting_bytes += n;
        }
        if let Some(t) = &self.tally {
            t.add(n);
        }
        state.add_outbound(n);
    }

    /// `n` of the bytes waiting for the session were written or dropped (at most what
    /// waits), given back to its client's tally and the shard's outbound bytes.
    fn release(&mut self, Books { state, hub }: Books, n: u64) {
        let b = n.min(self.waiting_bytes);
        self.waiting_bytes -= b;
        if let Some(h) = hub {
            let mut h = h.out.borrow_mut();
            h.waiting_bytes = h.waiting_bytes.saturating_sub(b);
        }
        if let Some(t) = &self.tally {
            t.release(b);
        }
        state.release_outbound(b);
    }

    /// Drops what waits in the mailbox; what is being written is released as the
    /// connection writes it or closes. Returns how many frames were dropped.
    fn drop_mail(&mut self, books: Books) -> u64 {
        // The rest of a frame cut short stays: the connection writes it before anything else.
        let keep = usize::from(self.cut && !self.mail.is_empty());
        let dropped = (self.mail.len() - keep) as u64;
        let queued: u64 = self
            .mail
            .drain(keep..)
            .map(|f| f.plain().len() as u64)
            .sum();
        self.release(books, queued);
        dropped
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
