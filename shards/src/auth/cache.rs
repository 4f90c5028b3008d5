//! Tokens a shard has verified, and tokens it has refused, remembered by their SHA-256 digest
//! (never the token itself), so a token seen again costs a lookup and not a signature check.
//!
//! - **Per shard**: a thread-local; each shard is one thread, so no lock and no sharing.
//! - **Bounded**: at most [`limits::AUTH_TOKEN_CACHE_ENTRIES`] verified and as many refused;
//!   past the bound the oldest put in is forgotten. The two are apart, so a flood of bad
//!   tokens cannot push out the good ones.
//! - **A verified token until its `exp`** (and [`limits::AUTH_LEEWAY_SECONDS`]): past it, it
//!   is refused from here, and remembered as refused.
//! - **A refused token for as long as it stays refused**: a bad signature, a bad claim, an
//!   `exp` passed. A token refused only for an `nbf` still ahead is not remembered: it will be
//!   good.
//! - **Until the key changes**: every key read (start-up, each SIGHUP reload) has a generation
//!   of its own; a shard that sees a new one forgets everything first.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use combd_kernel::limits;

/// A token's SHA-256.
pub(super) type Digest = [u8; 32];

/// The SHA-256 of `token`.
pub(super) fn digest(token: &[u8]) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Longest refusal remembered, in bytes: a library's message may quote the token.
const REASON_MAX_BYTES: usize = 96;

/// What a verified token names, less the token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Named {
    pub subject: String,
    pub name: Option<String>,
    pub expires_at: u64,
    /// The apps its `aud` names it for, or `None`: every app.
    pub apps: Option<Box<[String]>>,
}

impl Named {
    /// The client it names, with the token it came in.
    pub(super) fn client(self, token: &str) -> super::Client {
        super::Client {
            subject: self.subject,
            name: self.name,
            token: token.into(),
            expires_at: self.expires_at,
            apps: self.apps,
        }
    }
}

/// What the cache knows of a token.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Known {
    /// Verified, and not expired.
    Verified(Named),
    /// Refused, and why.
    Refused(String),
    /// Not seen under this key (or forgotten).
    Unseen,
}

/// A map of at most `cap` entries; past it the oldest put in goes.
struct Bounded<V> {
    cap: usize,
    /// Each entry with the number it was put in with.
    map: HashMap<Digest, (u64, V)>,
    /// Keys in the order put in, with their numbers: a number the map no longer has for its
    /// key is of an entry gone (removed, or put in again since).
    order: VecDeque<(Digest, u64)>,
    next: u64,
}

impl<V> Bounded<V> {
    fn new(cap: usize) -> Self {
        Bounded {
            cap,
            map: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
        }
    }

    fn get(&self, key: &Digest) -> Option<&V> {
        self.map.get(key).map(|(_, v)| v)
    }

    fn remove(&mut self, key: &Digest) {
        self.map.remove(key);
    }

    fn insert(&mut self, key: Digest, value: V) {
        if self.cap == 0 {
            return;
        }
        self.map.remove(&key);
        while self.map.len() >= self.cap {
            self.evict_oldest();
        }
        let n = self.next;
        self.next += 1;
        self.map.insert(key, (n, value));
        self.order.push_back((key, n));
        // Entries removed leave their keys in `order`: past twice the bound, sweep them.
        if self.order.len() > 2 * self.cap {
            let map = &self.map;
            self.order
                .retain(|(k, n)| map.get(k).is_some_and(|(m, _)| m == n));
        }
    }

    fn evict_oldest(&mut self) {
        while let Some((k, n)) = self.order.pop_front() {
            if self.map.get(&k).is_some_and(|(m, _)| *m == n) {
                self.map.remove(&k);
                return;
            }
        }
    }

    fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// One shard's tokens, verified and refused, under one key generation.
pub(super) struct TokenCache {
    generation: u64,
    verified: Bounded<Named>,
    refused: Bounded<Box<str>>,
}

impl TokenCache {
    /// A cache of at most `cap` verified tokens and `cap` refused.
    pub(super) fn new(cap: usize) -> Self {
        TokenCache {
            generation: 0,
            verified: Bounded::new(cap),
            refused: Bounded::new(cap),
        }
    }

    /// What is known of the token `d` under key `generation` at `now` (Unix seconds); a new
    /// generation forgets everything first.
    pub(super) fn look(&mut self, generation: u64, d: &Digest, now: u64) -> Known {
        if generation != self.generation {
            self.verified.clear();
            self.refused.clear();
            self.generation = generation;
        }
        if let Some(named) = self.verified.get(d) {
            if now <= named.expires_at.saturating_add(limits::AUTH_LEEWAY_SECONDS) {
                return Known::Verified(named.clone());
            }
            self.verified.remove(d);
            self.refused.insert(*d, "expired".into());
            return Known::Refused("expired".into());
        }
        match self.refused.get(d) {
            Some(why) => Known::Refused(why.to_string()),
            None => Known::Unseen,
        }
    }

    /// Remembers `d` as verified under `generation` (if still the cache's).
    pub(super) fn verified(&mut self, generation: u64, d: Digest, named: Named) {
        if generation == self.generation {
            self.refused.remove(&d);
            self.verified.insert(d, named);
        }
    }

    /// Remembers `d` as refused under `generation` (if still the cache's), for `why`.
    pub(super) fn refused(&mut self, generation: u64, d: Digest, why: &str) {
        if generation == self.generation {
            let mut end = why.len().min(REASON_MAX_BYTES);
            while !why.is_char_boundary(end) {
                end -= 1;
            }
            self.verified.remove(&d);
            self.refused.insert(d, why[..end].into());
        }
    }

    /// How many verified and refused tokens it holds.
    #[cfg(test)]
    pub(super) fn len(&self) -> (usize, usize) {
        (self.verified.len(), self.refused.len())
    }

    /// How many keys its two orders hold (removed ones included).
    #[cfg(test)]
    pub(super) fn order_len(&self) -> (usize, usize) {
        (self.verified.order.len(), self.refused.order.len())
    }
}

thread_local! {
    static CACHE: RefCell<TokenCache> =
        RefCell::new(TokenCache::new(limits::AUTH_TOKEN_CACHE_ENTRIES));
}

/// This thread's (shard's) cache.
pub(super) fn with<R>(f: impl FnOnce(&mut TokenCache) -> R) -> R {
    CACHE.with(|c| f(&mut c.borrow_mut()))
}
