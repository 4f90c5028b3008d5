//! The node's lease, kept alive on a thread of its own (see the module above, "Leases").

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use combd_kernel::limits::FLEET_KEEPALIVE_DIVISOR;

use super::{Coordinator, Lease, LEASE_GONE};
use crate::http::Failure;

/// What the keeper thread and its owner share.
#[derive(Debug)]
struct KeeperState {
    /// Until when the lease is surely alive (see the module doc).
    valid_until: Mutex<Instant>,
    /// The lease lapsed or a renewal was refused: it will not come back.
    lost: AtomicBool,
    /// Renewals that failed (the server unreachable, slow or refusing).
    renewals_failed: AtomicUsize,
}

/// Keeps one lease alive from a thread of its own, renewing it every TTL /
/// [`FLEET_KEEPALIVE_DIVISOR`]. Dropping it stops the thread (it does not revoke the lease).
#[derive(Debug)]
pub struct LeaseKeeper {
    lease: Lease,
    state: Arc<KeeperState>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl LeaseKeeper {
    /// Starts keeping `lease`, granted at `granted_at` (the instant the grant was sent), alive
    /// with `coordinator`.
    pub fn start(
        coordinator: Arc<Coordinator>,
        lease: Lease,
        granted_at: Instant,
    ) -> std::io::Result<LeaseKeeper> {
        let state = Arc::new(KeeperState {
            valid_until: Mutex::new(granted_at + lease.ttl),
            lost: AtomicBool::new(false),
            renewals_failed: AtomicUsize::new(0),
        });
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = Arc::clone(&state);
        let every = lease.ttl / FLEET_KEEPALIVE_DIVISOR;
        let thread = std::thread::Builder::new()
            .name("combd-lease".to_string())
            .spawn(move || loop {
                match stopped.recv_timeout(every) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
                let sent = Instant::now();
                match coordinator.keep_alive(&lease) {
                    Ok(ttl) => {
                        let mut until =
                            shared.valid_until.lock().unwrap_or_else(|p| p.into_inner());
                        *until = (*until).max(sent + ttl);
                    }
                    Err(e) => {
                        shared.renewals_failed.fetch_add(1, Ordering::Relaxed);
                        let expired = matches!(
                            e.failure,
                            Failure::Status {
                                code: LEASE_GONE,
                                ..
                            }
                        );
                        let until = *shared.valid_until.lock().unwrap_or_else(|p| p.into_inner());
                        if expired || Instant::now() >= until {
                            shared.lost.store(true, Ordering::Release);
                            return;
                        }
                    }
                }
            })?;
        Ok(LeaseKeeper {
            lease,
            state,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The lease kept.
    pub fn lease(&self) -> Lease {
        self.lease
    }

    /// Until when the lease is surely alive: the node may serve its objects before this
    /// instant and must not after it.
    pub fn valid_until(&self) -> Instant {
        *self
            .state
            .valid_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the node may still serve its objects at `now`.
    pub fn holds_at(&self, now: Instant) -> bool {
        !self.state.lost.load(Ordering::Acquire) && now < self.valid_until()
    }

    /// Whether the lease is gone for good (lapsed, or refused by etcd).
    pub fn lost(&self) -> bool {
        self.state.lost.load(Ordering::Acquire)
    }

    /// Renewals that failed so far.
    pub fn renewals_failed(&self) -> usize {
        self.state.renewals_failed.load(Ordering::Relaxed)
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
