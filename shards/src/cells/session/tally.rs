//! What one client's sessions on a shard have waiting for it, against its share of the shard's
//! outbound budget (`crate::fair`'s rule, kept shard-local: a fan-out to thousands of viewers
//! adds to a counter its sessions share, with no lock and no lookup per frame).

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use combd_kernel::fair::{Admit, ClientKey, PoolLevel, Shares};

/// One client's bytes waiting in its sessions on this shard; shared by its sessions.
pub(crate) struct ClientTally {
    key: ClientKey,
    bytes: Cell<u64>,
    /// The shard's count of clients with bytes waiting.
    active: Rc<Active>,
}

/// A shard's count of clients with bytes waiting, and the floor of a client's share of its
/// budget (worked out once).
#[derive(Default)]
pub(crate) struct Active {
    count: Cell<u64>,
    floor: Cell<Option<u64>>,
}

impl Active {
    fn get(&self) -> u64 {
        self.count.get()
    }

    fn set(&self, n: u64) {
        self.count.set(n);
    }

    /// The least share of `budget` a client has however many hold some (the settings and
    /// the budget are fixed for the node's life).
    fn floor(&self, shares: Shares, budget: u64) -> u64 {
        if let Some(f) = self.floor.get() {
            return f;
        }
        let f = shares.of(budget, u64::MAX);
        self.floor.set(Some(f));
        f
    }
}

impl ClientTally {
    /// Counts `n` more bytes waiting for the client.
    pub fn add(&self, n: u64) {
        if self.bytes.get() == 0 && n > 0 && self.key.is_shared() {
            self.active.set(self.active.get() + 1);
        }
        self.bytes.set(self.bytes.get() + n);
    }

    /// `n` bytes of the client's were written or dropped.
    pub fn release(&self, n: u64) {
        let was = self.bytes.get();
        let now = was - n.min(was);
        self.bytes.set(now);
        if was > 0 && now == 0 && self.key.is_shared() {
            self.active.set(self.active.get().saturating_sub(1));
        }
    }

    /// Whether `len` more bytes for the client keep it within its share of a shard budget of
    /// `budget` bytes, of which `held` wait (the node's own machine is held to none). Within
    /// the share's floor it is, at the cost of an addition (the fan-out asks for every frame).
    pub fn admits(&self, shares: Shares, held: u64, budget: u64, len: u64) -> bool {
        let mine = self.bytes.get();
        if !self.key.is_shared() || mine + len <= self.active.floor(shares, budget) {
            return true;
        }
        let level = PoolLevel {
            capacity: budget,
            held,
            active: self.active.get() + u64::from(mine == 0),
        };
        shares.admits(level, mine, 1, len) != Admit::OverShare
    }
}

/// The tallies of a shard's clients with sessions.
#[derive(Default)]
pub(crate) struct ClientTallies {
    by: HashMap<ClientKey, Weak<ClientTally>>,
    active: Rc<Active>,
}

impl ClientTallies {
    /// The tally of `key`'s sessions, made at its first.
    pub fn of(&mut self, key: ClientKey) -> Rc<ClientTally> {
        if let Some(t) = self.by.get(&key).and_then(Weak::upgrade) {
            return t;
        }
        let t = Rc::new(ClientTally {
            key,
            bytes: Cell::new(0),
            active: self.active.clone(),
        });
        self.by.insert(key, Rc::downgrade(&t));
        t
    }

    /// Forgets `tally`'s entry once its last session is gone (`tally` is that session's).
    pub fn session_ended(&mut self, tally: Rc<ClientTally>) {
        if Rc::strong_count(&tally) == 1 {
            self.by.remove(&tally.key);
        }
    }

    /// Clients with sessions on the shard now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARES: Shares = Shares {
        min_percent: 1,
        max_percent: 10,
    };

    #[test]
    fn a_client_is_held_to_its_share_and_the_local_machine_is_not() {
        let mut all = ClientTallies::default();
        let a = all.of(ClientKey::V4(1));
        let a2 = all.of(ClientKey::V4(1));
        assert!(Rc::ptr_eq(&a, &a2), "one tally for the client's sessions");
        a.add(90);
        assert!(a.admits(SHARES, 90, 1000, 10));
        assert!(!a.admits(SHARES, 90, 1000, 11));
        // Another client is under its share.
        let b = all.of(ClientKey::V4(2));
        assert!(b.admits(SHARES, 90, 1000, 100));
        let local = all.of(ClientKey::Local);
        local.add(900);
        assert!(local.admits(SHARES, 990, 1000, 1000));
        assert_eq!(
            all.active.get(),
            1,
            "the local machine is not a client held to shares"
        );
        a.release(1000);
        assert_eq!(all.active.get(), 0);
        drop(a2);
        all.session_ended(a);
        assert_eq!(all.len(), 2, "the gone client's entry went");
    }
}
