//! One shard's run loop: the only place that accepts connections and spawns their tasks. It
//! owns the listeners (public, localhost, and with TLS their TLS twins), stops and resumes the
//! public ones as admission decides, answers what gets in late, carries the inbox from the
//! other shards to the cells, runs the housekeeping tick (lag, stalls, the ping sweep), and
//! drains on shutdown.

use std::cell::Cell;
use std::os::fd::{BorrowedFd, FromRawFd, IntoRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use combd_kernel::limits::{self, MEASURE_EVERY_ACCEPTS};
use combd_kernel::sys;
use futures_lite::AsyncReadExt;
use glommio::net::{TcpListener, TcpStream, UnixStream};
use tracing::{debug, info, warn};

use crate::addresses::{AddressKey, AddressRefusal};
use crate::cells::session::CloseWhy;
use crate::cells::Cells;
use crate::conn;
use crate::job::ShardMsg;
use crate::shared::{ConnKind, NodeShared};
use crate::state::slot::ConnSlot;
use crate::state::turn::Turn;
use crate::state::ShardState;
use crate::stats::ShardStats;

/// A listening socket handed to a shard: its fd, whether it is the localhost listener, and
/// whether it speaks TLS.
pub(crate) struct ListenerFd {
    pub fd: RawFd,
    pub local: bool,
    pub tls: bool,
    /// The fleet listener (`COMBD_FLEET_NODE`): the public routes, for the other nodes of the
    /// fleet passing requests on to this node's objects; never refused, like the localhost one.
    pub fleet: bool,
}

/// A listener and whether it listens. Each start of listening has a generation, so an accept
/// loop (or a queue drain) left over from before a stop or restart ends instead of acting.
struct Listener {
    socket: Rc<TcpListener>,
    /// `socket`'s descriptor (glommio's `TcpListener` does not expose it): see [`Listener::fd`].
    fd: RawFd,
    local: bool,
    tls: bool,
    fleet: bool,
    listening: Cell<bool>,
    generation: Cell<u64>,
}

impl Listener {
    /// The listening socket's descriptor, borrowed for one system call.
    fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: `socket` owns `fd` (it was made from it in `run`) and closes it only when
        // the last `Rc` is dropped; `self` holds one, so the descriptor outlives the borrow.
        unsafe { BorrowedFd::borrow_raw(self.fd) }
    }

    /// The localhost and fleet listeners serve whatever the admission state.
    fn never_refuses(&self) -> bool {
        self.local || self.fleet
    }

    /// The cap a connection from `peer` on this listener counts against: the localhost
    /// listener's only for the node's own machine (a loopback peer; one that reached 127.0.0.1
    /// through a NAT rule is a client like any other), the fleet listener's for other nodes.
    fn kind_for(&self, peer: std::net::IpAddr) -> ConnKind {
        conn_kind(self.local, self.fleet, peer)
    }

    /// The kind of a connection answered without looking at its peer (a stopping listener's
    /// queue, the node's drain).
    fn kind(&self) -> ConnKind {
        if self.fleet {
            ConnKind::Fleet
        } else if self.local {
            ConnKind::Local
        } else {
            ConnKind::Public
        }
    }
}

/// The cap a connection counts against, from its listener and its peer (see
/// [`Listener::kind_for`]).
fn conn_kind(local: bool, fleet: bool, peer: std::net::IpAddr) -> ConnKind {
    let loopback = match peer {
        std::net::IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
        ip => ip.is_loopback(),
    };
    if fleet {
        ConnKind::Fleet
    } else if local && loopback {
        ConnKind::Local
    } else {
        ConnKind::Public
    }
}

/// The run loop's own state: the shard's state, its cells, its listeners.
struct Shard {
    state: Rc<ShardState>,
    cells: Rc<Cells>,
    listeners: Vec<Listener>,
}

/// Runs a shard until the node drains. `ready` is called once every listener accepts.
pub(crate) async fn run(
    id: usize,
    node: Arc<NodeShared>,
    listener_fds: Vec<ListenerFd>,
    wake_fd: RawFd,
    inbox: async_channel::Receiver<ShardMsg>,
    ready: impl FnOnce(),
) {
    let listeners = listener_fds
        .into_iter()
        .map(|l| Listener {
            // SAFETY: the fd was made by `Node::start` for this shard alone and handed over
            // with its ownership; the listener owns and closes it.
            socket: Rc::new(unsafe { TcpListener::from_raw_fd(l.fd) }),
            fd: l.fd,
            local: l.local,
            tls: l.tls,
            fleet: l.fleet,
            listening: Cell::new(false),
            generation: Cell::new(0),
        })
        .collect();
    // SAFETY: as the listeners': `Node::start` made this end of the wake socket pair for this
    // shard alone; the stream owns and closes it.
    let wake = unsafe { UnixStream::from_raw_fd(wake_fd) };
    let state = Rc::new(ShardState::new(id, node));
    let shard = Rc::new(Shard {
        cells: Rc::new(Cells::new(state.clone())),
        state,
        listeners,
    });
    for idx in 0..shard.listeners.len() {
        shard.start_accepting(idx);
    }
    shard.apply_admission();
    glommio::spawn_local(tick(shard.cells.clone())).detach();
    glommio::spawn_local(carry_inbox(shard.cells.clone(), inbox)).detach();
    let wake_closed = Rc::new(Cell::new(false));
    glommio::spawn_local(read_wakes(shard.state.clone(), wake, wake_closed.clone())).detach();
    ready();
    debug!(shard = id, "accepting");

    // The control loop: the coordinator wakes the shard when the admission state changes or
    // the node drains; the wake queue when the shard becomes behind or catches up.
    while !shard.state.node().draining() && !wake_closed.get() {
        shard.state.wait_admission_changed().await;
        shard.apply_admission();
    }
    shard.drain().await;
    // What the shard's connections logged last goes to the writer with it.
    shard.state.tick_logs();
}

/// Reads the coordinator's wake socket and raises the shard's admission signal for each
/// wake. Marks `closed` when the socket closes or fails.
async fn read_wakes(state: Rc<ShardState>, mut wake: UnixStream, closed: Rc<Cell<bool>>) {
    let mut buf = [0u8; 64];
    loop {
        let r = wake.read(&mut buf).await;
        if !matches!(r, Ok(n) if n > 0) {
            closed.set(true);
        }
        state.admission_changed();
        if closed.get() || state.node().draining() {
            return;
        }
    }
}

/// Hands what the other shards sent to the cells, [`INBOX_PER_TURN`](limits::INBOX_PER_TURN)
/// messages a turn.
async fn carry_inbox(cells: Rc<Cells>, inbox: async_channel::Receiver<ShardMsg>) {
    let mut turn = Turn::new(cells.state().stats(), limits::INBOX_PER_TURN);
    // Broadcasts from other shards fan out within their own budget of deliveries a turn, kept
    // across messages (a budget per message would never be spent on small topics).
    let mut fanout = Turn::new(cells.state().stats(), limits::FANOUT_PER_TURN);
    loop {
        let msg = match inbox.try_recv() {
            Ok(msg) => msg,
            Err(async_channel::TryRecvError::Closed) => return,
            Err(async_channel::TryRecvError::Empty) => {
                turn.idle();
                fanout.idle();
                let Ok(msg) = inbox.recv().await else { return };
                turn.resume();
                fanout.resume();
                msg
            }
        };
        cells.receive(msg, &mut fanout).await;
        if turn.spend().await {
            cells.catch_up_missed();
        }
    }
}

/// Closes every session of the shard if this node's fleet lease was lost since it was `seen`
/// (it held then, and it holds no more, or a new one replaced it): the objects the sessions
/// are attached to may be other nodes' by now. Their clients reconnect (numbered ones with
/// their place) and are passed on to each object's owner. The lease as it is now.
fn close_if_lease_lost(
    cells: &Cells,
    fleet: &crate::fleet::Fleet,
    seen: Option<(i64, bool)>,
) -> (i64, bool) {
    let now = fleet.lease_now();
    if seen.is_some_and(|(id, held)| held && (!now.1 || now.0 != id)) {
        let closed = cells.sessions().close_all(CloseWhy::LeaseLost);
        ShardStats::add(&cells.state().stats().ws_lease_lost_closed, closed);
        if closed > 0 {
            warn!(
                shard = cells.state().id(),
                closed, "this node's fleet lease was lost: its sessions closed to move"
            );
        }
    }
    now
}

/// The housekeeping tick: measures how late the shard's timer fires (a loop that is busy or
/// blocked shows lag; past [`TURN_OVERRUN`](limits::TURN_OVERRUN) it counts as an overrun),
/// beats the heartbeat the watchdog checks, reads the shard's clock and wakes the waits whose
/// deadline passed (every connection timeout), refreshes the `Date` of responses, hands the
/// access log's lines to its writer, resyncs the sessions other shards could not reach, closes
/// the sessions of apps a reload removed, wakes the objects whose alarms are due, sweeps the
/// apps' expiries (shard 0), and runs the ping sweep. First, with backup on, it starts giving
/// every object a base in the backup (shard 0).
async fn tick(cells: Rc<Cells>) {
    let state = cells.state().clone();
    let mut last_ping = Instant::now();
    let apps = state.node().apps.clone();
    let mut apps_seen = apps.generation();
    let alarms = cells.alarm_wakes().clone();
    let fleet = state.node().fleet.clone();
    let mut lease_seen = fleet.as_ref().map(|f| f.lease_now());
    cells.backfill_backup();
    while !state.draining() {
        cells.catch_up_missed();
        alarms.tick(&cells);
        cells.sweep_expiries();
        if let Some(f) = &fleet {
            lease_seen = Some(close_if_lease_lost(&cells, f, lease_seen));
        }
        if apps.generation() != apps_seen {
            // A reload removed (or added) an app: close the sessions of one now gone.
            apps_seen = apps.generation();
            cells.sessions().close_removed_apps(|a| apps.contains(a));
        }
        if last_ping.elapsed() >= state.settings().ws_ping_interval {
            last_ping = Instant::now();
            ping_sweep(&state).await;
        }
        let start = Instant::now();
        glommio::timer::sleep(limits::SHARD_TICK).await;
        let late = start.elapsed().saturating_sub(limits::SHARD_TICK);
        state.refresh_clock();
        state.expire_deadlines();
        state.refresh_date();
        state.tick_logs();
        let stats = state.stats();
        stats
            .lag_ms
            .store(late.as_millis() as u64, Ordering::Relaxed);
        if late > limits::TURN_OVERRUN {
            ShardStats::add(&stats.turn_overruns, 1);
        }
        stats
            .heartbeat_ms
            .store(state.node().uptime_ms(), Ordering::Relaxed);
    }
}

/// A new ping epoch, and every waiting task woken to see it (WebSockets ping their client,
/// or close it if the last ping went unanswered),
/// [`PING_SWEEP_PER_TURN`](limits::PING_SWEEP_PER_TURN) a turn.
async fn ping_sweep(state: &ShardState) {
    state.next_ping_epoch();
    let mut turn = Turn::new(state.stats(), 1);
    let mut from = 0;
    while let Some(next) = state.wake_some(from, limits::PING_SWEEP_PER_TURN) {
        from = next;
        turn.yield_now().await;
    }
}

impl Shard {
    fn stats(&self) -> &ShardStats {
        self.state.stats()
    }

    /// Publishes whether every public listener listens.
    fn publish_listening(&self) {
        let all = self
            .listeners
            .iter()
            .filter(|l| !l.never_refuses())
            .all(|l| l.listening.get());
        self.stats().listening.store(all as u64, Ordering::Relaxed);
    }

    /// Brings the public listeners in line with the published admission state: they stop
    /// while the node is full, and also while this shard alone is behind, so the kernel steers
    /// new connections to its siblings (the node refuses only when all are behind).
    fn apply_admission(self: &Rc<Self>) {
        let refusing = self.state.node().admission.refusing() || self.state.is_behind();
        for (idx, l) in self.listeners.iter().enumerate() {
            if l.never_refuses() || refusing != l.listening.get() {
                continue;
            }
            if refusing {
                self.stop_accepting(idx);
                debug!(
                    shard = self.state.id(),
                    tls = l.tls,
                    "public listener stopped"
                );
            } else {
                self.resume_accepting(idx);
                debug!(
                    shard = self.state.id(),
                    tls = l.tls,
                    "public listener listening again"
                );
            }
        }
    }

    /// Starts (or restarts) the accept loop of a listener.
    fn start_accepting(self: &Rc<Self>, idx: usize) {
        let l = &self.listeners[idx];
        l.generation.set(l.generation.get() + 1);
        l.listening.set(true);
        self.publish_listening();
        glommio::spawn_local(self.clone().accept_loop(idx, l.generation.get())).detach();
    }

    /// Stops a listener: first answers what the kernel already completed (503 or close), so
    /// no completed connection is reset without an answer, then `shutdown(SHUT_RD)`: the
    /// kernel refuses new connections and the accept loop ends.
    ///
    /// This drain is one bounded turn (at most [`ACCEPT_DRAIN_MAX`](limits::ACCEPT_DRAIN_MAX)
    /// connections, each an `accept4` and a task spawned to answer it later), not a loop that
    /// yields between parts: while it yields the socket still listens, a flood keeps
    /// completing connections into the queue, and the node ends up answering every one of them
    /// 503 instead of refusing at TCP (measured with `bench/flood.sh 15000 5000`: 0 refused at
    /// TCP and 10,001 answered 503 with a drain of 64 a turn).
    fn stop_accepting(self: &Rc<Self>, idx: usize) {
        let Some(generation) = self.mark_stopped(idx) else {
            return;
        };
        let l = &self.listeners[idx];
        for _ in 0..limits::ACCEPT_DRAIN_MAX {
            use nix::sys::socket::{accept4, SockFlag};
            let Ok(fd) = accept4(l.fd(), SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK) else {
                break;
            };
            // SAFETY: `into_raw_fd` gives up the just-accepted socket's only owner, so the
            // stream becomes its one owner (glommio's `TcpStream` is made only from a raw fd).
            let stream = unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) };
            let (slot, _) = ConnSlot::reserve(&self.state, l.kind());
            self.refuse_late(slot, stream, l.tls);
        }
        debug_assert_eq!(l.generation.get(), generation);
        if let Err(e) = sys::stop_listening(&l.fd()) {
            warn!(
                shard = self.state.id(),
                local = l.local,
                "stop listening: {e}"
            );
        }
    }

    /// Marks a listener stopped; its generation if it was listening.
    fn mark_stopped(&self, idx: usize) -> Option<u64> {
        let l = &self.listeners[idx];
        if !l.listening.replace(false) {
            return None;
        }
        self.publish_listening();
        Some(l.generation.get())
    }

    fn resume_accepting(self: &Rc<Self>, idx: usize) {
        let l = &self.listeners[idx];
        if l.listening.get() {
            return;
        }
        match sys::resume_listening(&l.fd(), limits::LISTEN_BACKLOG) {
            Ok(()) => self.start_accepting(idx),
            Err(e) => warn!(
                shard = self.state.id(),
                local = l.local,
                "listen again: {e}"
            ),
        }
    }

    /// Counts a public connection under its address's share: false past it (closed at once,
    /// dropped with its slot, before anything is read or spawned for it; counted).
    fn admit_address(&self, slot: &mut ConnSlot, ip: std::net::IpAddr) -> bool {
        let key = AddressKey::of(ip);
        let stats = self.stats();
        match self.state.node().addresses.admit(key, Instant::now()) {
            Ok(()) => {
                slot.count_address(key);
                true
            }
            Err(why) => {
                let refused = match why {
                    AddressRefusal::Conns => &stats.address_conns_refused,
                    AddressRefusal::Rate => &stats.address_rate_refused,
                };
                ShardStats::add(refused, 1);
                false
            }
        }
    }

    /// Counts a connection on the fleet listener under its peer's share of it (as many as
    /// `COMBD_MAX_CONNS_PER_ADDRESS`, at any rate: a node passes each request on over a
    /// connection of its own); false past it (closed at once, `fleet_conns_refused`), so a host
    /// on the fleet's network that holds connections open holds its share, not the listener.
    fn admit_fleet_peer(&self, slot: &mut ConnSlot, ip: std::net::IpAddr) -> bool {
        let key = AddressKey::of(ip);
        if self
            .state
            .node()
            .fleet_peers
            .admit(key, Instant::now())
            .is_err()
        {
            ShardStats::add(&self.stats().fleet_conns_refused, 1);
            return false;
        }
        slot.count_address(key);
        true
    }

    /// Answers a connection that got in while the node is full: 503 for plain HTTP, closed
    /// for TLS (it cannot be answered before its handshake).
    fn refuse_late(&self, mut slot: ConnSlot, stream: TcpStream, tls: bool) {
        slot.open();
        ShardStats::add(&self.stats().refused_late, 1);
        if tls {
            return;
        }
        if let Ok(task) = self
            .state
            .spawn(conn::refuse(self.cells.clone(), slot, stream))
        {
            task.detach();
        }
    }

    async fn accept_loop(self: Rc<Self>, idx: usize, generation: u64) {
        let mut last_warn: Option<Instant> = None;
        let l = &self.listeners[idx];
        let listener = l.socket.clone();
        loop {
            let accepted = listener.accept().await;
            if l.generation.get() != generation || !l.listening.get() {
                // Stopped (or restarted) meanwhile: a connection accepted in the race is
                // answered.
                if let Ok(stream) = accepted {
                    let (slot, _) = ConnSlot::reserve(&self.state, l.kind());
                    self.refuse_late(slot, stream, l.tls);
                }
                return;
            }
            match accepted {
                Ok(stream) => self.admit(stream, l),
                Err(e) => {
                    ShardStats::add(&self.stats().accept_errors, 1);
                    // At most one line per interval, and a short pause so a persistent error
                    // (EMFILE) cannot spin the loop.
                    if last_warn.is_none_or(|t| t.elapsed() >= limits::ACCEPT_ERROR_LOG_EVERY) {
                        warn!(
                            shard = self.state.id(),
                            local = l.local,
                            "accept failed: {e}"
                        );
                        last_warn = Some(Instant::now());
                    }
                    glommio::timer::sleep(limits::ACCEPT_ERROR_PAUSE).await;
                }
            }
        }
    }

    /// A connection just accepted: counted against the cap first (reserve before use), then
    /// served, or, on the public listener while the node is full or past its connection cap,
    /// refused late; or, past its client address's share, closed at once. The localhost
    /// listener never refuses.
    fn admit(&self, stream: TcpStream, l: &Listener) {
        let node = self.state.node();
        let accepted_total = self.stats().accepted.load(Ordering::Relaxed) + 1;
        if accepted_total.is_multiple_of(MEASURE_EVERY_ACCEPTS) {
            node.wake_coordinator();
        }
        // A connection already gone has no peer: dropped.
        let Ok(peer) = stream.peer_addr() else {
            return;
        };
        let kind = l.kind_for(peer.ip());
        let (mut slot, conns) = ConnSlot::reserve(&self.state, kind);
        let stats = self.stats();
        if kind != ConnKind::Public && conns > node.conns_cap(kind) {
            // The localhost and fleet listeners are never stopped, but each has its own cap:
            // past it, closed at once.
            let refused = match kind {
                ConnKind::Fleet => &stats.fleet_conns_refused,
                _ => &stats.local_conns_refused,
            };
            return ShardStats::add(refused, 1);
        }
        if kind == ConnKind::Public {
            if conns >= node.max_conns_effective {
                node.wake_coordinator();
            }
            if node.admission.refusing() || conns > node.max_conns_effective {
                return self.refuse_late(slot, stream, l.tls);
            }
            if !self.admit_address(&mut slot, peer.ip()) {
                return;
            }
        }
        if kind == ConnKind::Fleet && !self.admit_fleet_peer(&mut slot, peer.ip()) {
            return;
        }
        slot.open();
        // `/stats` and `/metrics` answer only the node's own machine.
        let local = kind == ConnKind::Local;
        // A task that cannot start (the shard drains) drops its connection, and its slot.
        let cells = self.cells.clone();
        let task = if l.tls {
            self.state
                .spawn(conn::serve_tls(cells, slot, stream, local))
        } else {
            let conn = conn::serve(cells, slot, stream, local);
            if accepted_total == 1 {
                debug!(
                    shard = self.state.id(),
                    bytes = std::mem::size_of_val(&conn),
                    "connection task size"
                );
            }
            self.state.spawn(conn)
        };
        if let Ok(task) = task {
            task.detach();
        }
    }

    /// Drain: stop every listener (answering what is queued), wake every waiting task, and
    /// wait for the connection and object tasks within the deadline.
    async fn drain(self: &Rc<Self>) {
        let id = self.state.id();
        for idx in 0..self.listeners.len() {
            self.stop_accepting(idx);
        }
        self.state.start_drain();
        let deadline = self.state.settings().shutdown_timeout;
        let started = Instant::now();
        let closed = glommio::timer::timeout(deadline, async {
            self.state.tasks_ended().await;
            Ok(())
        })
        .await;
        match closed {
            Ok(()) => info!(
                shard = id,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "drained"
            ),
            Err(_) => warn!(
                shard = id,
                connections_left = self.stats().conns.load(Ordering::Relaxed),
                "drain deadline passed; closing the rest"
            ),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_a_loopback_peer_on_the_localhost_listener_is_the_nodes_own_machine() {
        let ip = |s: &str| s.parse().unwrap();
        assert_eq!(conn_kind(true, false, ip("127.0.0.1")), ConnKind::Local);
        assert_eq!(conn_kind(true, false, ip("127.9.9.9")), ConnKind::Local);
        assert_eq!(
            conn_kind(true, false, ip("::ffff:127.0.0.1")),
            ConnKind::Local
        );
        // 127.0.0.1 reached from outside (a NAT rule, route_localnet): a client like any other.
        assert_eq!(conn_kind(true, false, ip("203.0.113.7")), ConnKind::Public);
        assert_eq!(
            conn_kind(true, false, ip("::ffff:203.0.113.7")),
            ConnKind::Public
        );
        // On a public listener even a loopback peer is public (the tests' own clients).
        assert_eq!(conn_kind(false, false, ip("127.0.0.1")), ConnKind::Public);
        assert_eq!(conn_kind(false, true, ip("10.0.0.2")), ConnKind::Fleet);
    }
}
