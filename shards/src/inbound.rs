//! The inbound budget: bytes of clients' input the node holds in mailboxes and inboxes (request
//! bodies for objects, WebSocket messages for sessions' objects), reserved before a job is
//! queued and released once, when the job has run or was refused (moving a job from a mailbox
//! into a batch does not release it: its bytes are held until the batch ran).
//!
//! Two bounds, each with its own answer:
//! - **A connection's** input waiting: past [`INBOUND_CONN_QUEUED_MAX_BYTES`] the connection
//!   stops being read (back-pressure) until some of it has run; it is not refused, and what it
//!   sends waits in the kernel, not in the node.
//! - **A shard's**, every connection together: past `COMBD_INBOUND_BUDGET` new input is refused
//!   explicitly (503 `overloaded`, or `{"error":"overloaded"}` to a session) and counted
//!   (`inbound_refused`). A connection with less than [`INBOUND_CONN_FLOOR_BYTES`] waiting may
//!   always queue a small input, so clients sending clicks are never refused because others
//!   hold the budget with large ones: the floor costs at most that much per connection.
//!
//! - **A client's** (its address, `crate::fair`): what is held past a connection's floor is
//!   also taken from the client's share of the shard's budget (pool `inbound_bytes`), so one
//!   address trickling a thousand declared megabyte bodies holds its share, not the budget;
//!   past it, the same explicit refusal.
//!
//! Releases happen wherever a job ends (the object's shard, a blocking thread), so the counts
//! are atomics and a connection waiting for room is woken through its waker from any thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::{
    INBOUND_CONN_FLOOR_BYTES, INBOUND_CONN_QUEUED_MAX_BYTES, INBOUND_MEASURE_STEPS,
};

use crate::fair::{Ledger, Share};
use crate::stats::ShardStats;

/// What a connection's account needs of its shard: its counters, its pool of input held past
/// connections' floors, its budget, and the coordinator to wake at a burst. The node's shared
/// state provides one per shard (`crate::shared::ShardInbound`); this module needs nothing
/// else of the node.
pub(crate) trait InboundShard: Send + Sync {
    /// The shard's counters.
    fn stats(&self) -> &ShardStats;
    /// The shard's pool of input held past connections' floors (`inbound_bytes`).
    fn pool(&self) -> &Arc<Ledger>;
    /// `COMBD_INBOUND_BUDGET`.
    fn budget(&self) -> u64;
    /// Wakes the coordinator to measure now.
    fn wake_coordinator(&self);
}

/// Whether `n` more bytes of a connection's input may be queued: within the connection's
/// floor always, else within the shard's budget.
pub fn admits(conn_queued: u64, shard_held: u64, budget: u64, n: u64) -> bool {
    conn_queued.saturating_add(n) <= INBOUND_CONN_FLOOR_BYTES
        || shard_held.saturating_add(n) <= budget
}

/// One connection's input waiting in mailboxes and inboxes, on its shard's account.
pub(crate) struct ConnInbound {
    shard: Arc<dyn InboundShard>,
    /// Who the connection is, for its share of the shard's budget.
    client: ClientKey,
    queued: AtomicU64,
    /// The connection's waker while it waits for room.
    waiter: Mutex<Option<Waker>>,
}

/// Bytes of one job's input, held until the job is dropped.
pub(crate) struct Hold {
    conn: Arc<ConnInbound>,
    bytes: u64,
    /// Counted in the connection's input waiting (a job's), or only on the shard's account
    /// (a body being read, which the connection must be read to receive).
    queued: bool,
    /// Its part of the client's share, for what is held past the connection's floor.
    _share: Option<Share>,
}

impl ConnInbound {
    pub fn new(shard: Arc<dyn InboundShard>, client: ClientKey) -> Arc<ConnInbound> {
        Arc::new(ConnInbound {
            shard,
            client,
            queued: AtomicU64::new(0),
            waiter: Mutex::new(None),
        })
    }

    fn stats(&self) -> &ShardStats {
        self.shard.stats()
    }

    /// Reserves `n` bytes for a job, or `None` past the shard's budget (counted in
    /// `inbound_refused`).
    pub fn reserve(self: &Arc<Self>, n: u64) -> Option<Hold> {
        self.hold(n, true)
    }

    /// Reserves `n` bytes of a request body about to be read, on the shard's account only, or
    /// `None` past its budget (counted): a client that sends bodies slowly holds what it
    /// declared against the budget, not on top of it.
    pub fn reserve_reading(self: &Arc<Self>, n: u64) -> Option<Hold> {
        self.hold(n, false)
    }

    fn hold(self: &Arc<Self>, n: u64, queued: bool) -> Option<Hold> {
        let stats = self.stats();
        let held = stats.inbound_bytes.load(Ordering::Relaxed);
        let budget = self.shard.budget();
        let queued_now = self.queued.load(Ordering::Relaxed);
        if !admits(queued_now, held, budget, n) {
            ShardStats::add(&stats.inbound_refused, 1);
            return None;
        }
        // Past the connection's floor, the bytes come from the client's share too.
        let share = match queued_now.saturating_add(n) <= INBOUND_CONN_FLOOR_BYTES {
            true => None,
            false => match self.shard.pool().take(self.client, n) {
                Ok(share) => Some(share),
                Err(_) => {
                    ShardStats::add(&stats.inbound_refused, 1);
                    return None;
                }
            },
        };
        if queued {
            self.queued.fetch_add(n, Ordering::Relaxed);
        }
        let now = stats.inbound_bytes.fetch_add(n, Ordering::Relaxed) + n;
        stats.inbound_bytes_max.fetch_max(now, Ordering::Relaxed);
        // A burst is measured when it happens, not at the next second's sample: the
        // coordinator is woken each time the shard's input held reaches a sixteenth of its
        // budget it had not reached since it last fell below it (a hold let go and taken again
        // at the same level wakes nobody).
        let step = (budget / INBOUND_MEASURE_STEPS).max(1);
        let level = now / step;
        if level > stats.inbound_wake_level.fetch_max(level, Ordering::Relaxed) {
            self.shard.wake_coordinator();
        }
        Some(Hold {
            conn: self.clone(),
            bytes: n,
            queued,
            _share: share,
        })
    }

    /// Whether the connection may be read: less than [`INBOUND_CONN_QUEUED_MAX_BYTES`] of its
    /// input waits.
    pub fn has_room(&self) -> bool {
        self.queued.load(Ordering::Acquire) < INBOUND_CONN_QUEUED_MAX_BYTES
    }

    /// Ready once the connection has room; else the waker is kept, and woken when a release
    /// makes room.
    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.has_room() {
            return Poll::Ready(());
        }
        *self.waiter.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
        // A release between the check and the waker's store would be missed: check again.
        if self.has_room() {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

impl Hold {
    /// The bytes held.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let c = &self.conn;
        let stats = c.stats();
        let held = stats.inbound_bytes.fetch_sub(self.bytes, Ordering::Relaxed) - self.bytes;
        let step = (c.shard.budget() / INBOUND_MEASURE_STEPS).max(1);
        stats
            .inbound_wake_level
            .fetch_min(held / step, Ordering::Relaxed);
        if !self.queued {
            return;
        }
        let before = c.queued.fetch_sub(self.bytes, Ordering::AcqRel);
        let after = before.saturating_sub(self.bytes);
        if before >= INBOUND_CONN_QUEUED_MAX_BYTES && after < INBOUND_CONN_QUEUED_MAX_BYTES {
            let waker = c.waiter.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_always_admits_and_the_budget_bounds_the_rest() {
        let floor = INBOUND_CONN_FLOOR_BYTES;
        // A small input of a connection with little waiting: whatever the shard holds.
        assert!(admits(0, 10_000, 1_000, 100));
        assert!(admits(floor - 100, u64::MAX, 1_000, 100));
        // Past the floor, the shard's budget decides.
        assert!(!admits(floor - 99, 1_000, 1_000, 100));
        assert!(admits(floor, 900, 1_000, 100));
        assert!(!admits(floor, 901, 1_000, 100));
        // A large input is never within the floor.
        assert!(!admits(0, 0, 1_000, floor + 1_000));
        assert!(admits(0, 0, floor + 1_000, floor + 1_000));
    }
}
