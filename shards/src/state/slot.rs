//! Connection slots: a connection counts against the node-wide cap from the moment it is
//! accepted (reserved, before anything else is decided), counts as open on its shard once a
//! task serves it, and is released exactly once, when its slot is dropped, whatever path the
//! connection took (served, refused late, failed handshake, task not spawned).

use std::rc::Rc;

use crate::addresses::AddressKey;
use crate::shared::ConnKind;
use crate::stats::ShardStats;

use super::ShardState;

/// One connection's place in the node's connection count.
pub(crate) struct ConnSlot {
    state: Rc<ShardState>,
    open: bool,
    kind: ConnKind,
    /// The client address it is counted under (public connections), given back with it.
    address: Option<AddressKey>,
}

impl ConnSlot {
    /// Reserves a connection of a kind node-wide; also returns how many of it are open with it.
    pub fn reserve(state: &Rc<ShardState>, kind: ConnKind) -> (ConnSlot, u64) {
        let open = state.node().reserve_conn(kind);
        (
            ConnSlot {
                state: state.clone(),
                open: false,
                kind,
                address: None,
            },
            open,
        )
    }

    /// The cap it counts against.
    pub fn kind(&self) -> ConnKind {
        self.kind
    }

    /// Counts the connection under its client address's share, given back when the slot is
    /// dropped.
    pub fn count_address(&mut self, key: AddressKey) {
        self.address = Some(key);
    }

    /// Counts the connection as accepted and open on this shard.
    pub fn open(&mut self) {
        if !self.open {
            self.open = true;
            let stats = self.state.stats();
            ShardStats::add(&stats.accepted, 1);
            ShardStats::add(&stats.conns, 1);
        }
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        if self.open {
            ShardStats::sub(&self.state.stats().conns, 1);
        }
        self.state.node().release_conn(self.kind);
        if let Some(key) = self.address {
            let node = self.state.node();
            match self.kind {
                ConnKind::Fleet => node.fleet_peers.release(key),
                _ => node.addresses.release(key),
            }
        }
    }
}

/// A waker slot in the shard's slab, given back when dropped.
pub(crate) struct WakerSlot {
    state: Rc<ShardState>,
    slot: usize,
}

impl WakerSlot {
    pub fn new(state: &Rc<ShardState>) -> WakerSlot {
        WakerSlot {
            state: state.clone(),
            slot: state.register(),
        }
    }

    /// The slot's index, for [`ShardState::wake_slot`].
    pub fn index(&self) -> usize {
        self.slot
    }

    /// The shard's state.
    pub fn state(&self) -> &Rc<ShardState> {
        &self.state
    }
}

impl Drop for WakerSlot {
    fn drop(&mut self) {
        self.state.unregister(self.slot);
    }
}
