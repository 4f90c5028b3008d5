//! Which objects are live on the node now (a cell on their home shard: their database, or
//! their scratch one, open), for the operator's listing (`/objects`). Each shard writes only
//! its own set (a lock no other shard takes but a listing), as its cells come and go.

use std::collections::HashSet;
use std::sync::Mutex;

/// The live objects of each shard, by key (`app/name`).
#[derive(Debug)]
pub(crate) struct LiveObjects {
    shards: Vec<Mutex<HashSet<String>>>,
}

impl LiveObjects {
    /// Empty sets for `shards` shards.
    pub fn new(shards: usize) -> LiveObjects {
        LiveObjects {
            shards: (0..shards).map(|_| Mutex::new(HashSet::new())).collect(),
        }
    }

    fn set(&self, shard: usize) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.shards[shard % self.shards.len().max(1)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Object `key` became live on `shard`.
    pub fn opened(&self, shard: usize, key: &str) {
        self.set(shard).insert(key.to_string());
    }

    /// Object `key` was let go on `shard`.
    pub fn closed(&self, shard: usize, key: &str) {
        self.set(shard).remove(key);
    }

    /// Whether object `key` is live on any shard.
    pub fn is_live(&self, key: &str) -> bool {
        (0..self.shards.len()).any(|k| self.set(k).contains(key))
    }
}

#[cfg(test)]
mod tests {
    use super::LiveObjects;

    #[test]
    fn objects_are_live_between_open_and_close() {
        let live = LiveObjects::new(2);
        live.opened(1, "a/x");
        assert!(live.is_live("a/x"));
        assert!(!live.is_live("a/y"));
        live.closed(1, "a/x");
        assert!(!live.is_live("a/x"));
    }
}
