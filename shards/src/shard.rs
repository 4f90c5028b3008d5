//! One shard: a glommio executor pinned to a core, with a public and a localhost listener,
//! its connections, a read scratch buffer and a housekeeping tick.

use std::cell::{Cell, RefCell};
use std::os::fd::{FromRawFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use combd_kernel::limits;
use combd_kernel::sys;
use glommio::net::TcpListener;
use glommio::sync::Gate;
use slab::Slab;
use tracing::{debug, info, warn};

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

    /// Runs the shard until the node drains. `ready` is called once both listeners accept.
    pub async fn run(
        id: usize,
        node: Arc<NodeShared>,
        public_fd: RawFd,
        local_fd: RawFd,
        ready: impl FnOnce(),
    ) -> Result<(), String> {
        let shard = Rc::new(Shard {
            id,
            node,
            draining: Cell::new(false),
            wakers: RefCell::new(Slab::new()),
            scratch: RefCell::new(vec![0u8; limits::READ_SCRATCH_BYTES].into_boxed_slice()),
            gate: Gate::new(),
        });
        // SAFETY: the fds are listening sockets bound by `Node::start` and handed to this
        // shard alone; the listeners own and close them.
        let public = Rc::new(unsafe { TcpListener::from_raw_fd(public_fd) });
        let local = Rc::new(unsafe { TcpListener::from_raw_fd(local_fd) });
        let accept_public = glommio::spawn_local(accept_loop(shard.clone(), public.clone(), false));
        let accept_local = glommio::spawn_local(accept_loop(shard.clone(), local.clone(), true));
        ready();
        debug!(shard = id, "accepting");

        while !shard.node.draining() {
            glommio::timer::sleep(limits::SHARD_TICK).await;
        }

        // Drain: stop both listeners (a pending accept fails and its loop ends), wake every
        // waiting connection, and wait for the gate within the deadline.
        shard.draining.set(true);
        for fd in [public_fd, local_fd] {
            if let Err(e) = sys::stop_listening(&BorrowedFd(fd)) {
                warn!(shard = id, "stop listening: {e}");
            }
        }
        accept_public.await;
        accept_local.await;
        shard.wake_all();
        let deadline = shard.node.settings.shutdown_timeout;
        let started = Instant::now();
        let closed = glommio::timer::timeout(deadline, async {
            let _ = shard.gate.close().await;
            Ok(())
        })
        .await;
        let left = shard
            .stats()
            .conns
            .load(std::sync::atomic::Ordering::Relaxed);
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
        drop((public, local));
        Ok(())
    }
}

/// A raw fd borrowed for one system call.
struct BorrowedFd(RawFd);

impl std::os::fd::AsRawFd for BorrowedFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

async fn accept_loop(shard: Rc<Shard>, listener: Rc<TcpListener>, local: bool) {
    let mut last_warn: Option<Instant> = None;
    loop {
        match listener.accept().await {
            Ok(stream) => {
                if shard.draining.get() {
                    break;
                }
                let stats = shard.stats();
                ShardStats::add(&stats.accepted, 1);
                ShardStats::add(&stats.conns, 1);
                let conn = crate::conn::serve(shard.clone(), stream, local);
                if stats.accepted.load(std::sync::atomic::Ordering::Relaxed) == 1 {
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
                    Err(_) => ShardStats::sub(&stats.conns, 1),
                }
            }
            Err(e) => {
                if shard.draining.get() {
                    break;
                }
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
