//! The ledger of one shared pool: what each client holds of it, each unit taken against the
//! client's share ([`combd_kernel::fair::Shares`]) before it is held, and given back once, when
//! its [`Share`] is dropped. Every pool the node shares between clients is one of these
//! ([`Pool`] names them), so a pool that does not know who asks cannot be made.
//!
//! A ledger is a lock around a map of the clients holding some of it (an entry goes when its
//! client holds nothing, so the map is bounded by what the pool holds), taken once to take and
//! once to give back; a [`Share`] can be given back from any thread (an object's answer is
//! built on a blocking thread and written by its connection's shard).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use combd_kernel::fair::{Admit, ClientKey, PoolLevel, Shares};
use combd_kernel::limits::FLEET_LOOKUPS_MAX;

use crate::stats::{Field, Kind};

/// The pools shared between clients, with the names their figures have in `/stats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// Live objects on the node (`COMBD_MAX_OPEN_OBJECTS`), each counted to the client whose
    /// request made it live.
    Objects,
    /// TLS handshakes in progress on a shard (`TLS_HANDSHAKES_MAX`).
    Handshakes,
    /// Bytes of objects' HTTP answers built and not yet written (the shard's outbound budget,
    /// node-wide): reserved as an answer is made, given back once it is written.
    Answers,
    /// Object databases a shard may create in its burst (`COMBD_OBJECT_CREATE_RATE` ×
    /// `OBJECT_CREATE_BURST_SECONDS`): each creation holds its unit for a burst's length.
    Creations,
    /// Bytes of clients' input held on a shard past each connection's floor (the shard's
    /// inbound budget, `crate::inbound`): bodies being read and inputs waiting to run.
    Inbound,
    /// In a fleet: a shard's reads of an object's owner in etcd on their way
    /// (`FLEET_LOOKUPS_MAX`), each counted to the client whose request started it.
    Lookups,
    /// Members listed in the presence of the node's topics (`COMBD_PRESENCE_MAX`), each
    /// counted to the client whose session made it a member.
    Presence,
    /// Subscriptions of the node's multiplexed WebSockets (`COMBD_SUBSCRIPTIONS_MAX`), each
    /// counted to the client whose socket subscribed.
    Subscriptions,
}

impl Pool {
    /// Every pool, in the order `/stats` lists them.
    pub const ALL: [Pool; 8] = [
        Pool::Objects,
        Pool::Handshakes,
        Pool::Answers,
        Pool::Creations,
        Pool::Inbound,
        Pool::Lookups,
        Pool::Presence,
        Pool::Subscriptions,
    ];

    /// Its name in its figures' names: `fair_<name>_<figure>` in `/stats`,
    /// `combd_fair_<name>_<figure>` in `/metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Pool::Objects => "objects",
            Pool::Handshakes => "tls_handshakes",
            Pool::Answers => "answer_bytes",
            Pool::Creations => "object_creations",
            Pool::Inbound => "inbound_bytes",
            Pool::Lookups => "fleet_lookups",
            Pool::Presence => "presence",
            Pool::Subscriptions => "subscriptions",
        }
    }
}

/// Why a client could not take from a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolRefusal {
    /// The client (or its IPv6 prefix) holds its share.
    OverShare,
    /// The pool is full, the client under its share.
    Full,
}

/// One pool's ledger.
pub struct Ledger {
    pool: Pool,
    capacity: u64,
    shares: Shares,
    held: Mutex<Held>,
    /// Its figures, read by `/stats` without the lock.
    figures: PoolFigures,
}

#[derive(Default)]
struct Held {
    total: u64,
    /// Clients (and the IPv6 prefixes above them) holding some, with what they hold.
    by: HashMap<ClientKey, u64>,
    /// Clients held to a share that hold some (prefixes not counted).
    clients: u64,
}

/// A pool's figures as `/stats` shows them.
#[derive(Default)]
pub struct PoolFigures {
    /// Units held now.
    pub held: AtomicU64,
    /// The most units held at once.
    pub held_max: AtomicU64,
    /// Clients holding some now.
    pub clients: AtomicU64,
    /// The most one client held at once.
    pub client_max: AtomicU64,
    /// Takes refused because the client held its share.
    pub refused_share: AtomicU64,
    /// Takes refused because the pool was full.
    pub refused_full: AtomicU64,
}

/// Units of a pool held by a client, given back when dropped.
pub struct Share {
    ledger: Arc<Ledger>,
    key: ClientKey,
    units: u64,
}

impl std::fmt::Debug for Share {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Share({} {} of {})",
            self.units,
            self.key,
            self.ledger.pool.name()
        )
    }
}

impl Ledger {
    /// An empty ledger of `pool`, `capacity` units, every client held to `shares`.
    pub fn new(pool: Pool, capacity: u64, shares: Shares) -> Arc<Ledger> {
        Arc::new(Ledger {
            pool,
            capacity,
            shares,
            held: Mutex::new(Held::default()),
            figures: PoolFigures::default(),
        })
    }

    /// Which pool it is.
    pub fn pool(&self) -> Pool {
        self.pool
    }

    /// Its size.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Its figures.
    pub fn figures(&self) -> &PoolFigures {
        &self.figures
    }

    /// Takes `units` for `key`, or says why not (counted). The node's own machine is held to
    /// no share, only to the pool's capacity.
    pub fn take(self: &Arc<Self>, key: ClientKey, units: u64) -> Result<Share, PoolRefusal> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(refusal) = self.admits(&held, key, units) {
            self.count_refusal(refusal);
            return Err(refusal);
        }
        Ok(self.hold(&mut held, key, units))
    }

    fn count_refusal(&self, refusal: PoolRefusal) {
        let counter = match refusal {
            PoolRefusal::OverShare => &self.figures.refused_share,
            PoolRefusal::Full => &self.figures.refused_full,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts `units` held by `key` in `held` (locked), for the share returned.
    fn hold(self: &Arc<Self>, held: &mut Held, key: ClientKey, units: u64) -> Share {
        held.total += units;
        let mine = held.by.entry(key).or_insert(0);
        let first = *mine == 0;
        *mine += units;
        let client_now = *mine;
        if first && key.is_shared() {
            held.clients += 1;
        }
        for (prefix, _) in key.prefixes().into_iter().flatten() {
            *held.by.entry(prefix).or_insert(0) += units;
        }
        self.publish(held, key.is_shared().then_some(client_now));
        Share {
            ledger: self.clone(),
            key,
            units,
        }
    }

    /// Whether `key` may take `units` more: within its share (and its prefixes' shares),
    /// then within the pool's capacity; the node's own machine, within the capacity only.
    fn admits(&self, held: &Held, key: ClientKey, units: u64) -> Result<(), PoolRefusal> {
        if !key.is_shared() {
            return match held.total.saturating_add(units) > self.capacity {
                true => Err(PoolRefusal::Full),
                false => Ok(()),
            };
        }
        let mine = held.by.get(&key).copied().unwrap_or(0);
        let level = PoolLevel {
            capacity: self.capacity,
            held: held.total,
            active: held.clients + u64::from(mine == 0),
        };
        let prefixes = key.prefixes().into_iter().flatten();
        let mut answer = Ok(());
        for (k, shares) in std::iter::once((key, 1)).chain(prefixes) {
            let theirs = held.by.get(&k).copied().unwrap_or(0);
            match self.shares.admits(level, theirs, shares, units) {
                Admit::OverShare => return Err(PoolRefusal::OverShare),
                Admit::Full => answer = Err(PoolRefusal::Full),
                Admit::Yes => {}
            }
        }
        answer
    }

    /// Gives back what `key` held of `units`.
    fn give_back(&self, key: ClientKey, units: u64) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.total = held.total.saturating_sub(units);
        let keys = std::iter::once(key).chain(key.prefixes().into_iter().flatten().map(|p| p.0));
        for k in keys {
            if let Some(mine) = held.by.get_mut(&k) {
                *mine = mine.saturating_sub(units);
                if *mine == 0 {
                    held.by.remove(&k);
                    if k == key && key.is_shared() {
                        held.clients = held.clients.saturating_sub(1);
                    }
                }
            }
        }
        self.publish(&held, None);
    }

    fn publish(&self, held: &Held, client: Option<u64>) {
        let f = &self.figures;
        f.held.store(held.total, Ordering::Relaxed);
        f.held_max.fetch_max(held.total, Ordering::Relaxed);
        f.clients.store(held.clients, Ordering::Relaxed);
        if let Some(c) = client {
            f.client_max.fetch_max(c, Ordering::Relaxed);
        }
    }

    /// Takes `units` for `key` whatever its share and the pool's room (counted as held, and
    /// in `refused_*` as the refusal [`Ledger::take`] would have given): for bytes the node
    /// holds already and may not refuse, e.g. the answer of a write that has committed.
    pub fn force(self: &Arc<Self>, key: ClientKey, units: u64) -> Share {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(refusal) = self.admits(&held, key, units) {
            self.count_refusal(refusal);
        }
        self.hold(&mut held, key, units)
    }

    /// Whether `key` holds its share already (one unit more would be refused for it).
    pub fn over_share(&self, key: ClientKey) -> bool {
        if !key.is_shared() {
            return false;
        }
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        self.admits(&held, key, 1) == Err(PoolRefusal::OverShare)
    }

    /// What `key` holds now.
    pub fn held_by(&self, key: ClientKey) -> u64 {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.by.get(&key).copied().unwrap_or(0)
    }
}

impl Share {
    /// The units it holds.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// The client holding it.
    pub fn key(&self) -> ClientKey {
        self.key
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.ledger.give_back(self.key, self.units);
    }
}

/// The node's shared pools: node-wide ([`Pool::Objects`], [`Pool::Answers`]) or one ledger a
/// shard ([`Pool::Handshakes`], [`Pool::Creations`]).
pub struct Pools {
    /// Live objects (`COMBD_MAX_OPEN_OBJECTS`).
    pub objects: Arc<Ledger>,
    /// Bytes of object answers not yet written (the outbound budget of a shard, node-wide).
    pub answers: Arc<Ledger>,
    /// Per shard: TLS handshakes in progress (`TLS_HANDSHAKES_MAX`).
    pub handshakes: Vec<Arc<Ledger>>,
    /// Per shard: object creations of the last `OBJECT_CREATE_BURST_SECONDS`.
    pub creations: Vec<Arc<Ledger>>,
    /// Per shard: clients' input held past their connections' floors (the inbound budget).
    pub inbound: Vec<Arc<Ledger>>,
    /// Per shard, in a fleet: reads of an object's owner on their way.
    pub lookups: Vec<Arc<Ledger>>,
    /// Members listed in presence (`COMBD_PRESENCE_MAX`), node-wide.
    pub presence: Arc<Ledger>,
    /// Subscriptions of multiplexed WebSockets (`COMBD_SUBSCRIPTIONS_MAX`), node-wide.
    pub subscriptions: Arc<Ledger>,
}

/// The sizes of the pools.
pub struct PoolSizes {
    /// `COMBD_MAX_OPEN_OBJECTS`.
    pub objects: u64,
    /// The outbound budget of a shard.
    pub answer_bytes: u64,
    /// A shard's `TLS_HANDSHAKES_MAX`.
    pub handshakes: u64,
    /// A shard's creation burst.
    pub creations: u64,
    /// A shard's inbound budget.
    pub inbound_bytes: u64,
    /// `COMBD_PRESENCE_MAX`.
    pub presence: u64,
    /// `COMBD_SUBSCRIPTIONS_MAX`.
    pub subscriptions: u64,
}

impl Pools {
    /// Empty pools of these sizes for `shards` shards, every client held to `shares`.
    pub fn new(sizes: PoolSizes, shares: Shares, shards: usize) -> Pools {
        let each = |pool, capacity| {
            (0..shards)
                .map(|_| Ledger::new(pool, capacity, shares))
                .collect()
        };
        Pools {
            objects: Ledger::new(Pool::Objects, sizes.objects, shares),
            answers: Ledger::new(Pool::Answers, sizes.answer_bytes, shares),
            handshakes: each(Pool::Handshakes, sizes.handshakes),
            creations: each(Pool::Creations, sizes.creations),
            inbound: each(Pool::Inbound, sizes.inbound_bytes),
            lookups: each(Pool::Lookups, FLEET_LOOKUPS_MAX as u64),
            presence: Ledger::new(Pool::Presence, sizes.presence, shares),
            subscriptions: Ledger::new(Pool::Subscriptions, sizes.subscriptions, shares),
        }
    }

    /// Every pool's figures for `/stats` (`fair_<pool>_<figure>`), a shard's pools summed (the
    /// most one client held: the most on any shard).
    pub fn figures(&self) -> Vec<Field> {
        let mut all = Vec::new();
        for pool in Pool::ALL {
            let ledgers: &[Arc<Ledger>] = match pool {
                Pool::Objects => std::slice::from_ref(&self.objects),
                Pool::Answers => std::slice::from_ref(&self.answers),
                Pool::Handshakes => &self.handshakes,
                Pool::Creations => &self.creations,
                Pool::Inbound => &self.inbound,
                Pool::Lookups => &self.lookups,
                Pool::Presence => std::slice::from_ref(&self.presence),
                Pool::Subscriptions => std::slice::from_ref(&self.subscriptions),
            };
            let sum = |f: fn(&PoolFigures) -> &AtomicU64| -> u64 {
                ledgers
                    .iter()
                    .map(|l| f(l.figures()).load(Ordering::Relaxed))
                    .sum()
            };
            let most = ledgers
                .iter()
                .map(|l| l.figures().client_max.load(Ordering::Relaxed))
                .max()
                .unwrap_or(0);
            let values = [
                ledgers.iter().map(|l| l.capacity()).sum(),
                sum(|f| &f.held),
                sum(|f| &f.held_max),
                sum(|f| &f.clients),
                most,
                sum(|f| &f.refused_share),
                sum(|f| &f.refused_full),
            ];
            let names = pool.fields();
            all.extend(
                names
                    .into_iter()
                    .zip(values)
                    .map(|((name, metric, kind, help), v)| (name, metric, kind, help, v)),
            );
        }
        all
    }
}

/// A pool's figures' names, metric names, kinds and help, in [`Pools::figures`]' order.
macro_rules! pool_fields {
    ($p:literal, $units:literal) => {
        [
            (
                concat!("fair_", $p, "_capacity"),
                concat!("combd_fair_", $p, "_capacity"),
                Kind::Gauge,
                concat!("The pool's size, in ", $units, "."),
            ),
            (
                concat!("fair_", $p, "_held"),
                concat!("combd_fair_", $p, "_held"),
                Kind::Gauge,
                concat!("Held of the pool now, in ", $units, "."),
            ),
            (
                concat!("fair_", $p, "_held_max"),
                concat!("combd_fair_", $p, "_held_max"),
                Kind::Gauge,
                concat!("The most held of the pool at once, in ", $units, "."),
            ),
            (
                concat!("fair_", $p, "_clients"),
                concat!("combd_fair_", $p, "_clients"),
                Kind::Gauge,
                "Clients holding some of the pool now (the node's own machine not counted).",
            ),
            (
                concat!("fair_", $p, "_client_max"),
                concat!("combd_fair_", $p, "_client_max"),
                Kind::Gauge,
                concat!(
                    "The most one client held of the pool at once, in ",
                    $units,
                    "."
                ),
            ),
            (
                concat!("fair_", $p, "_refused_share"),
                concat!("combd_fair_", $p, "_refused_share_total"),
                Kind::Counter,
                "Takes refused because the client held its share of the pool.",
            ),
            (
                concat!("fair_", $p, "_refused_full"),
                concat!("combd_fair_", $p, "_refused_full_total"),
                Kind::Counter,
                "Takes refused because the pool was full (the client under its share).",
            ),
        ]
    };
}

type FieldName = (&'static str, &'static str, Kind, &'static str);

impl Pool {
    /// Its figures' names in `/stats` and `/metrics`.
    #[rustfmt::skip]
    fn fields(self) -> [FieldName; 7] {
        match self {
            Pool::Objects => pool_fields!("objects", "objects"),
            Pool::Handshakes => pool_fields!("tls_handshakes", "handshakes"),
            Pool::Answers => pool_fields!("answer_bytes", "bytes"),
            Pool::Creations => pool_fields!("object_creations", "creations"),
            Pool::Inbound => pool_fields!("inbound_bytes", "bytes"),
            Pool::Lookups => pool_fields!("fleet_lookups", "lookups"),
            Pool::Presence => pool_fields!("presence", "members"),
            Pool::Subscriptions => pool_fields!("subscriptions", "subscriptions"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SHARES: Shares = Shares {
        min_percent: 1,
        max_percent: 10,
    };

    fn key(s: &str) -> ClientKey {
        ClientKey::of(s.parse().unwrap())
    }

    #[test]
    fn one_client_is_held_to_its_cap_and_another_is_served() {
        let l = Ledger::new(Pool::Objects, 100, SHARES);
        let mine: Vec<Share> = (0..10)
            .map(|_| l.take(key("10.0.0.1"), 1).unwrap())
            .collect();
        assert_eq!(
            l.take(key("10.0.0.1"), 1).unwrap_err(),
            PoolRefusal::OverShare
        );
        let other = l.take(key("10.0.0.2"), 1).unwrap();
        assert_eq!(l.figures().clients.load(Ordering::Relaxed), 2);
        assert_eq!(l.figures().refused_share.load(Ordering::Relaxed), 1);
        drop(mine);
        assert_eq!(l.held_by(key("10.0.0.1")), 0);
        assert_eq!(l.figures().held.load(Ordering::Relaxed), 1);
        assert_eq!(l.figures().client_max.load(Ordering::Relaxed), 10);
        drop(other);
        assert_eq!(l.figures().clients.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn what_may_not_be_refused_is_counted_past_the_share() {
        let l = Ledger::new(Pool::Answers, 100, SHARES);
        let a = l.take(key("10.0.0.1"), 10).unwrap();
        let forced = l.force(key("10.0.0.1"), 50);
        assert_eq!(l.held_by(key("10.0.0.1")), 60);
        assert_eq!(l.figures().refused_share.load(Ordering::Relaxed), 1);
        // Past its share now, the client is refused before its next request runs.
        assert!(l.over_share(key("10.0.0.1")));
        drop((a, forced));
        assert!(!l.over_share(key("10.0.0.1")));
        assert_eq!(l.figures().held.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_local_machine_is_held_only_to_the_capacity() {
        let l = Ledger::new(Pool::Handshakes, 20, SHARES);
        let all: Vec<Share> = (0..20)
            .map(|_| l.take(ClientKey::Local, 1).unwrap())
            .collect();
        assert_eq!(l.take(key("10.0.0.2"), 1).unwrap_err(), PoolRefusal::Full);
        assert_eq!(l.figures().clients.load(Ordering::Relaxed), 0);
        drop(all);
        assert!(l.take(key("10.0.0.2"), 1).is_ok());
    }

    #[test]
    fn the_64s_of_one_56_are_held_to_the_56s_shares() {
        let l = Ledger::new(Pool::Answers, 1000, SHARES);
        // 100 a /64 (the cap); the /56 may hold 4 × 100.
        let mut held = Vec::new();
        for i in 0..4 {
            held.push(l.take(key(&format!("2001:db8:0:{i}::1")), 100).unwrap());
        }
        let fifth = l.take(key("2001:db8:0:4::1"), 100);
        assert_eq!(fifth.unwrap_err(), PoolRefusal::OverShare);
        // Another /56 is not held by this one's.
        assert!(l.take(key("2001:db8:0:100::1"), 100).is_ok());
        drop(held);
        assert!(l.take(key("2001:db8:0:4::1"), 100).is_ok());
    }

    #[test]
    fn shares_shrink_as_clients_arrive() {
        let l = Ledger::new(
            Pool::Objects,
            100,
            Shares {
                min_percent: 1,
                max_percent: 100,
            },
        );
        // Alone: all of it.
        let a: Vec<Share> = (0..50)
            .map(|_| l.take(key("10.0.0.1"), 1).unwrap())
            .collect();
        // A second client: each may hold half; the first is at it, the second under it.
        let b: Vec<Share> = (0..40)
            .map(|_| l.take(key("10.0.0.2"), 1).unwrap())
            .collect();
        assert_eq!(
            l.take(key("10.0.0.1"), 1).unwrap_err(),
            PoolRefusal::OverShare
        );
        let more = l.take(key("10.0.0.2"), 10).unwrap();
        // The pool is full now: under its share, a third is refused for that.
        assert_eq!(l.take(key("10.0.0.3"), 1).unwrap_err(), PoolRefusal::Full);
        drop((a, b, more));
    }
}
