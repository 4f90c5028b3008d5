//! One shard: a glommio executor pinned to a core, with a public and a localhost listener,
//! its connections, a read scratch buffer, a housekeeping tick, and a control task that stops
//! and resumes the public listener as the coordinator decides.

use std::cell::{Cell, RefCell};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use combd_kernel::admission::MEASURE_EVERY_ACCEPTS;
use combd_kernel::limits;
use combd_kernel::sys;
use futures_lite::AsyncReadExt;
use glommio::net::{TcpListener, TcpStream, UnixStream};
use glommio::sync::Gate;
use slab::Slab;
use tracing::{debug, info, warn};

use crate::cells::{Cells, ShardMsg};
use crate::fifo::Fifo;
use crate::node::NodeShared;
use crate::stats::ShardStats;

/// A shard's state, shared by its tasks (single-threaded: `Rc`, `Cell`, `RefCell`).
pub(crate) struct Shard {
    pub id: usize,
    pub node: Arc<NodeShared>,
    /// Set once the node drains; connections see it when they next wait.
    pub draining: Cell<bool>,
    /// The waker of each connection waiting for input, so a drain can wake them all.
    wakers: RefCell<Slab<Option<Waker>>>,
    /// The read scratch buffer; borrowed only inside a poll, never across an await.
    pub scratch: RefCell<Box<[u8]>>,
    /// Every connection task holds a pass; the drain waits for the gate to close.
    gate: Gate,
    /// The listeners: public, localhost, and with TLS on, public TLS and localhost TLS.
    listeners: Vec<Listener>,
    /// Objects and sessions.
    pub cells: Cells,
    /// The awake slots (`COMBD_MAX_AWAKE`) and their ready line: the wake queue.
    pub awake: Rc<Fifo>,
    /// The restore slots (`COMBD_RESTORES_AT_ONCE`).
    pub restores: Rc<Fifo>,
    /// Bytes waiting to be written on this shard, every session together.
    pub outbound: Cell<u64>,
    /// TLS handshakes in progress.
    pub tls_in_progress: Cell<usize>,
    /// Incremented every `COMBD_WS_PING_INTERVAL`: WebSockets ping when it changes.
    pub ping_epoch: Cell<u64>,
}

/// An awake slot; given back (to the first in the ready line) when dropped.
pub(crate) struct AwakePermit(Rc<Shard>);

impl Drop for AwakePermit {
    fn drop(&mut self) {
        self.0.awake.release();
        self.0.update_behind();
    }
}

/// A listener and whether it listens. Each start of listening has a generation, so an accept
/// loop left over from before a stop ends instead of counting the stop as an error.
struct Listener {
    socket: Rc<TcpListener>,
    fd: RawFd,
    local: bool,
    tls: bool,
    listening: Cell<bool>,
    generation: Cell<u64>,
}

impl Shard {
    pub fn stats(&self) -> &ShardStats {
        &self.node.stats[self.id]
    }

    /// A slot for a connection's waker.
    pub fn register(&self) -> usize {
        self.wakers.borrow_mut().insert(None)
    }

    pub fn unregister(&self, slot: usize) {
        self.wakers.borrow_mut().try_remove(slot);
    }

    /// Remembers the waker of a connection about to wait.
    pub fn park(&self, slot: usize, waker: &Waker) {
        if let Some(w) = self.wakers.borrow_mut().get_mut(slot) {
            if !w.as_ref().is_some_and(|w| w.will_wake(waker)) {
                *w = Some(waker.clone());
            }
        }
    }

    /// Wakes the task parked in a slot.
    pub fn wake_slot(&self, slot: usize) {
        let w = self
            .wakers
            .borrow_mut()
            .get_mut(slot)
            .and_then(|w| w.take());
        if let Some(w) = w {
            w.wake();
        }
    }

    /// Spawns a task that the drain waits for.
    pub fn gate_spawn<T: 'static>(
        &self,
        fut: impl std::future::Future<Output = T> + 'static,
    ) -> Result<glommio::Task<T>, ()> {
        self.gate.spawn(fut).map_err(|_| ())
    }

    /// Whether the ready line is as long as the awake cap.
    pub fn is_behind(&self) -> bool {
        self.stats().behind.load(Ordering::Relaxed) != 0
    }

    /// Waits (in FIFO order, asleep) for an awake slot.
    pub async fn acquire_awake(self: &Rc<Self>) -> AwakePermit {
        self.awake.acquire_observed(|| self.update_behind()).await;
        AwakePermit(self.clone())
    }

    /// Publishes the wake queue's figures; a change of "behind" re-applies admission and
    /// tells the coordinator.
    pub fn update_behind(self: &Rc<Self>) {
        let stats = self.stats();
        stats
            .cells_awake
            .store(self.awake.used() as u64, Ordering::Relaxed);
        stats
            .cells_awake_max
            .store(self.awake.used_max.get() as u64, Ordering::Relaxed);
        stats
            .sessions_ready
            .store(self.awake.waiting() as u64, Ordering::Relaxed);
        stats
            .sessions_waited
            .store(self.awake.waited.get(), Ordering::Relaxed);
        let behind = self.awake.waiting() >= self.awake.cap();
        if behind != self.is_behind() {
            stats.behind.store(behind as u64, Ordering::Relaxed);
            self.apply_admission();
            self.node.wake_coordinator();
        }
    }

    fn wake_all(&self) {
        let wakers: Vec<Waker> = self
            .wakers
            .borrow_mut()
            .iter_mut()
            .filter_map(|(_, w)| w.take())
            .collect();
        for w in wakers {
            w.wake();
        }
    }

    fn listener(&self, idx: usize) -> &Listener {
        &self.listeners[idx]
    }

    /// Publishes whether every public listener listens.
    fn publish_listening(&self) {
        let all = self
            .listeners
            .iter()
            .filter(|l| !l.local)
            .all(|l| l.listening.get());
        self.stats().listening.store(all as u64, Ordering::Relaxed);
    }

    /// Starts (or restarts) the accept loop of a listener.
    fn start_accepting(self: &Rc<Self>, idx: usize) {
        let l = self.listener(idx);
        l.generation.set(l.generation.get() + 1);
        l.listening.set(true);
        self.publish_listening();
        glommio::spawn_local(accept_loop(self.clone(), idx, l.generation.get())).detach();
    }

    /// Stops a listener: first accepts what the kernel already completed and answers it
    /// (503 or close), so no completed connection is reset without an answer, then
    /// `shutdown(SHUT_RD)`: the kernel refuses new connections and the accept loop ends.
    fn stop_accepting(self: &Rc<Self>, idx: usize) {
        let l = self.listener(idx);
        let (local, tls) = (l.local, l.tls);
        if !l.listening.get() {
            return;
        }
        l.listening.set(false);
        self.publish_listening();
        loop {
            // SAFETY: accept4 on our listening socket; a returned fd is owned by the stream.
            let fd = unsafe {
                libc::accept4(
                    l.fd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                )
            };
            if fd < 0 {
                break;
            }
            let stream = unsafe { TcpStream::from_raw_fd(fd) };
            self.node.reserve_conn();
            self.refuse_late(stream, tls);
        }
        if let Err(e) = sys::stop_listening(&FdRef(l.fd)) {
            warn!(shard = self.id, local, "stop listening: {e}");
        }
    }

    fn resume_accepting(self: &Rc<Self>, idx: usize) {
        let l = self.listener(idx);
        if l.listening.get() {
            return;
        }
        match sys::resume_listening(&FdRef(l.fd), limits::LISTEN_BACKLOG) {
            Ok(()) => self.start_accepting(idx),
            Err(e) => warn!(shard = self.id, local = l.local, "listen again: {e}"),
        }
    }

    /// Counts a connection as open on this shard (its `Conn` releases it when dropped).
    fn open_conn(&self) {
        ShardStats::add(&self.stats().accepted, 1);
        ShardStats::add(&self.stats().conns, 1);
    }

    /// Undoes [`Shard::open_conn`] and the node-wide reservation for a connection whose task
    /// could not start.
    fn abandon_conn(&self) {
        ShardStats::sub(&self.stats().conns, 1);
        self.node.release_conn();
    }

    /// Answers a connection that got in while the node is full: 503 for plain HTTP, closed
    /// for TLS. Its node-wide reservation must already be taken.
    fn refuse_late(self: &Rc<Self>, stream: TcpStream, tls: bool) {
        self.open_conn();
        ShardStats::add(&self.stats().refused_late, 1);
        if tls {
            // A TLS connection cannot be answered before its handshake: it is closed.
            drop(stream);
            self.abandon_conn();
            return;
        }
        match self.gate.spawn(crate::conn::refuse(self.clone(), stream)) {
            Ok(task) => {
                task.detach();
            }
            Err(_) => self.abandon_conn(),
        }
    }

    /// Brings the public listener in line with the published admission state: it stops while
    /// the node is full, and also while this shard alone is behind, so the kernel steers new
    /// connections to its siblings (the node refuses only when all are behind).
    pub fn apply_admission(self: &Rc<Self>) {
        let behind = self.stats().behind.load(Ordering::Relaxed) != 0;
        let refusing = self.node.admission.refusing() || behind;
        for idx in 0..self.listeners.len() {
            let l = self.listener(idx);
            if l.local {
                continue;
            }
            if refusing && l.listening.get() {
                self.stop_accepting(idx);
                debug!(shard = self.id, tls = l.tls, "public listener stopped");
            } else if !refusing && !l.listening.get() {
                self.resume_accepting(idx);
                debug!(
                    shard = self.id,
                    tls = l.tls,
                    "public listener listening again"
                );
            }
        }
    }

    /// Runs the shard until the node drains. `ready` is called once both listeners accept.
    pub async fn run(
        id: usize,
        node: Arc<NodeShared>,
        listener_fds: Vec<ListenerFd>,
        wake_fd: RawFd,
        inbox: async_channel::Receiver<ShardMsg>,
        ready: impl FnOnce(),
    ) -> Result<(), String> {
        // SAFETY: the fds were made by `Node::start` for this shard alone; the listeners and
        // the wake stream own and close them.
        let listeners = listener_fds
            .into_iter()
            .map(|l| Listener {
                socket: Rc::new(unsafe { TcpListener::from_raw_fd(l.fd) }),
                fd: l.fd,
                local: l.local,
                tls: l.tls,
                listening: Cell::new(false),
                generation: Cell::new(0),
            })
            .collect();
        let mut wake = unsafe { UnixStream::from_raw_fd(wake_fd) };
        let (node_max_awake, node_restores) =
            (node.settings.max_awake, node.settings.restores_at_once);
        let shard = Rc::new(Shard {
            id,
            node,
            draining: Cell::new(false),
            wakers: RefCell::new(Slab::new()),
            scratch: RefCell::new(vec![0u8; limits::READ_SCRATCH_BYTES].into_boxed_slice()),
            gate: Gate::new(),
            listeners,
            cells: Cells::default(),
            awake: Rc::new(Fifo::new(node_max_awake)),
            restores: Rc::new(Fifo::new(node_restores)),
            outbound: Cell::new(0),
            tls_in_progress: Cell::new(0),
            ping_epoch: Cell::new(0),
        });
        for idx in 0..shard.listeners.len() {
            shard.start_accepting(idx);
        }
        shard.apply_admission();
        glommio::spawn_local(tick(shard.clone())).detach();
        let receiver = shard.clone();
        glommio::spawn_local(async move {
            while let Ok(msg) = inbox.recv().await {
                receiver.receive(msg);
            }
        })
        .detach();
        ready();
        debug!(shard = id, "accepting");

        // The control loop: the coordinator writes a byte to the wake socket when the
        // admission state changes or the node drains.
        let mut buf = [0u8; 64];
        while !shard.node.draining() {
            match wake.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => shard.apply_admission(),
            }
        }

        // Drain: stop both listeners (answering what is queued), wake every waiting
        // connection, and wait for the gate within the deadline.
        shard.draining.set(true);
        for idx in 0..shard.listeners.len() {
            shard.stop_accepting(idx);
        }
        shard.wake_all();
        let deadline = shard.node.settings.shutdown_timeout;
        let started = Instant::now();
        let closed = glommio::timer::timeout(deadline, async {
            let _ = shard.gate.close().await;
            Ok(())
        })
        .await;
        let left = shard.stats().conns.load(Ordering::Relaxed);
        match closed {
            Ok(()) => info!(
                shard = id,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "drained"
            ),
            Err(_) => warn!(
                shard = id,
                connections_left = left,
                "drain deadline passed; closing the rest"
            ),
        }
        Ok(())
    }
}

/// A listening socket handed to a shard: its fd, whether it is the localhost listener, and
/// whether it speaks TLS.
pub(crate) struct ListenerFd {
    pub fd: RawFd,
    pub local: bool,
    pub tls: bool,
}

/// A raw fd borrowed for one system call (glommio's `TcpListener` does not expose its fd, so
/// the shard keeps it beside the socket).
struct FdRef(RawFd);

impl AsRawFd for FdRef {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Measures how late the shard's timer fires: a loop that is busy or blocked shows lag.
async fn tick(shard: Rc<Shard>) {
    let mut last_ping = Instant::now();
    while !shard.draining.get() {
        // The ping sweep: a new epoch, and every waiting connection woken to see it
        // (WebSockets ping their client, or close it if the last ping went unanswered).
        if last_ping.elapsed() >= shard.node.settings.ws_ping_interval {
            last_ping = Instant::now();
            shard.ping_epoch.set(shard.ping_epoch.get() + 1);
            shard.wake_all();
        }
        let start = Instant::now();
        glommio::timer::sleep(limits::SHARD_TICK).await;
        let late = start.elapsed().saturating_sub(limits::SHARD_TICK);
        let stats = shard.stats();
        stats
            .lag_ms
            .store(late.as_millis() as u64, Ordering::Relaxed);
        stats
            .heartbeat_ms
            .store(shard.node.uptime_ms(), Ordering::Relaxed);
    }
}

async fn accept_loop(shard: Rc<Shard>, idx: usize, generation: u64) {
    let mut last_warn: Option<Instant> = None;
    let (listener, local, tls) = {
        let l = shard.listener(idx);
        (l.socket.clone(), l.local, l.tls)
    };
    loop {
        let accepted = listener.accept().await;
        let l = shard.listener(idx);
        if l.generation.get() != generation || !l.listening.get() {
            // Stopped (or restarted) meanwhile: a connection accepted in the race is answered.
            if let Ok(stream) = accepted {
                shard.node.reserve_conn();
                shard.refuse_late(stream, tls);
            }
            return;
        }
        match accepted {
            Ok(stream) => {
                let stats = shard.stats();
                let accepted_total = stats.accepted.load(Ordering::Relaxed) + 1;
                if accepted_total.is_multiple_of(MEASURE_EVERY_ACCEPTS) {
                    shard.node.wake_coordinator();
                }
                // Reserve before use: the connection counts from here. The public listener
                // turns away what gets in while the node is full or past its connection cap;
                // the localhost listener never refuses.
                let conns = shard.node.reserve_conn();
                if !local {
                    if conns >= shard.node.max_conns_effective {
                        shard.node.wake_coordinator();
                    }
                    if shard.node.admission.refusing() || conns > shard.node.max_conns_effective {
                        shard.refuse_late(stream, tls);
                        continue;
                    }
                }
                shard.open_conn();
                let conn = crate::conn::serve(shard.clone(), stream, local, tls);
                if accepted_total == 1 {
                    debug!(
                        shard = shard.id,
                        bytes = std::mem::size_of_val(&conn),
                        "connection task size"
                    );
                }
                match shard.gate.spawn(conn) {
                    Ok(task) => {
                        task.detach();
                    }
                    Err(_) => shard.abandon_conn(),
                }
            }
            Err(e) => {
                ShardStats::add(&shard.stats().accept_errors, 1);
                // At most one line a second, and a short pause so a persistent error (EMFILE)
                // cannot spin the loop.
                if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                    warn!(shard = shard.id, local, "accept failed: {e}");
                    last_warn = Some(Instant::now());
                }
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}
