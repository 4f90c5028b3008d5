//! Who is asking, and how much of a shared pool they may hold: the decisions behind every pool
//! the node shares between clients (open objects, TLS handshakes in progress, object answers
//! waiting to be written, object creations).
//!
//! A **client** ([`ClientKey`]) is what the node can tell apart of who asks: a verified
//! identity where a request carries one, else an IPv4 address (/32), an IPv6 /64 (one
//! subscriber's prefix; an IPv4 address mapped into IPv6 is the IPv4 address), or the node's own
//! machine (its localhost listener, never held to a share, as it
//! is never refused at TCP). An IPv6 /64 also counts toward its /56 and its /48
//! ([`ClientKey::prefixes`]), which may hold [`PREFIX_56_SHARES`] and [`PREFIX_48_SHARES`]
//! shares: a routed /56 is 256 /64s, and without the prefixes it would be 256 clients.
//!
//! A client's **share** of a pool of `capacity` units ([`Shares::of`]) is the pool divided by
//! the clients that hold some of it (the one asking counted), never under the floor
//! (`COMBD_CLIENT_SHARE_MIN_PERCENT` of the pool) nor over the cap
//! (`COMBD_CLIENT_SHARE_MAX_PERCENT`). A client may take `n` more ([`Shares::admits`]) while
//! what it holds stays within its share and the pool within its capacity. So a client alone
//! holds at most the cap, a newcomer always finds room while the others are held to theirs,
//! and as more clients arrive each is held to less (max-min fairness over what is released:
//! a client over its share gets nothing more until it is back under it).

use std::net::IpAddr;

use crate::limits::{PREFIX_48_SHARES, PREFIX_56_SHARES};

/// One client of the node's shared pools (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ClientKey {
    /// The node's own machine: a connection on the localhost listener. Never held to a share.
    Local,
    /// An IPv4 address.
    V4(u32),
    /// An IPv6 prefix: `bits` (64, 56 or 48) leading bits of the address, the rest zero.
    V6 {
        /// The prefix's leading 64 bits (its host bits cleared): the rest of a /64 or wider
        /// prefix is zero, and a key of 16 bytes instead of 32 (a `u128`'s alignment) keeps
        /// every connection's and every held share's record smaller.
        net: u64,
        /// Its length.
        bits: u8,
    },
    /// A verified identity (a token's `sub`, as [`ClientKey::identity`] hashes it), where a
    /// request carries one: one client from every address it comes from, and not one with
    /// every other user behind its NAT.
    Identity(u64),
}

impl ClientKey {
    /// The client of a peer at `ip`: its IPv4 address, or its IPv6 /64.
    pub fn of(ip: IpAddr) -> ClientKey {
        match ip {
            IpAddr::V4(v4) => ClientKey::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => ClientKey::V4(u32::from(v4)),
                None => ClientKey::prefix(u128::from(v6), 64),
            },
        }
    }

    /// The client of a connection: `local` (the localhost listener) is the node's own machine,
    /// else the peer's address; no address known is the node's own too (nothing outside it
    /// can be held to a share it cannot be told apart by).
    pub fn of_peer(local: bool, ip: Option<IpAddr>) -> ClientKey {
        match ip {
            Some(ip) if !local => ClientKey::of(ip),
            _ => ClientKey::Local,
        }
    }

    /// The client a verified token's `sub` names.
    pub fn identity(subject: &str) -> ClientKey {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        subject.hash(&mut h);
        ClientKey::Identity(h.finish())
    }

    /// The prefix of `addr` `bits` long (at most 64).
    fn prefix(addr: u128, bits: u8) -> ClientKey {
        let mask = u64::MAX << (64 - u32::from(bits.min(64)));
        ClientKey::V6 {
            net: (addr >> 64) as u64 & mask,
            bits,
        }
    }

    /// Whether the client is held to shares (everyone but the node's own machine).
    pub fn is_shared(self) -> bool {
        self != ClientKey::Local
    }

    /// The wider prefixes an IPv6 /64 also counts toward, each with the shares it may hold:
    /// its /56 ([`PREFIX_56_SHARES`]) and its /48 ([`PREFIX_48_SHARES`]). None for others.
    pub fn prefixes(self) -> [Option<(ClientKey, u64)>; 2] {
        match self {
            ClientKey::V6 { net, bits: 64 } => [
                Some((
                    ClientKey::prefix(u128::from(net) << 64, 56),
                    PREFIX_56_SHARES,
                )),
                Some((
                    ClientKey::prefix(u128::from(net) << 64, 48),
                    PREFIX_48_SHARES,
                )),
            ],
            _ => [None, None],
        }
    }
}

impl std::fmt::Display for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            ClientKey::Local => f.write_str("local"),
            ClientKey::V4(a) => write!(f, "{}", std::net::Ipv4Addr::from(a)),
            ClientKey::V6 { net, bits } => {
                write!(
                    f,
                    "{}/{bits}",
                    std::net::Ipv6Addr::from(u128::from(net) << 64)
                )
            }
            ClientKey::Identity(h) => write!(f, "identity {h:016x}"),
        }
    }
}

/// The floor and the cap of every client's share, in percent of a pool
/// (`COMBD_CLIENT_SHARE_MIN_PERCENT`, `COMBD_CLIENT_SHARE_MAX_PERCENT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shares {
    /// The least share, in percent of the pool, however many clients hold some of it.
    pub min_percent: u64,
    /// The most one client may hold, in percent of the pool, even alone.
    pub max_percent: u64,
}

impl Shares {
    /// One client's share of a pool of `capacity` units that `active` clients hold some of
    /// (the asker counted): the pool split evenly, within the floor and the cap, and at least
    /// one unit.
    pub fn of(self, capacity: u64, active: u64) -> u64 {
        let part = |percent: u64| (u128::from(capacity) * u128::from(percent) / 100) as u64;
        let floor = part(self.min_percent).max(1);
        let cap = part(self.max_percent).max(floor);
        (capacity / active.max(1)).clamp(floor, cap)
    }

    /// Whether a client holding `held` of a pool (of which `pool.held` is held, by
    /// `pool.active` clients, the asker counted) may take `n` more, `shares` times the share
    /// (1 for a client, more for a prefix above it): over its share first, then the pool's
    /// capacity.
    pub fn admits(self, pool: PoolLevel, held: u64, shares: u64, n: u64) -> Admit {
        let share = self.of(pool.capacity, pool.active).saturating_mul(shares);
        if held.saturating_add(n) > share {
            Admit::OverShare
        } else if pool.held.saturating_add(n) > pool.capacity {
            Admit::Full
        } else {
            Admit::Yes
        }
    }
}

/// What a pool says to a client asking for more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Taken.
    Yes,
    /// The client (or its prefix) holds its share: refused, whatever room the pool has.
    OverShare,
    /// The client is under its share but the pool is full.
    Full,
}

/// A pool as a decision sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolLevel {
    /// Its size, in its units (bytes, objects, handshakes).
    pub capacity: u64,
    /// What is held of it now.
    pub held: u64,
    /// The clients that hold some of it, the one asking counted.
    pub active: u64,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn key(s: &str) -> ClientKey {
        ClientKey::of(s.parse().unwrap())
    }

    const SHARES: Shares = Shares {
        min_percent: 1,
        max_percent: 10,
    };

    #[test]
    fn a_client_is_an_ipv4_address_or_an_ipv6_64() {
        assert_eq!(key("10.0.0.1"), key("::ffff:10.0.0.1"));
        assert_ne!(key("10.0.0.1"), key("10.0.0.2"));
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_ne!(key("::a00:1"), key("10.0.0.1"));
        assert_eq!(ClientKey::identity("alice"), ClientKey::identity("alice"));
        assert_ne!(ClientKey::identity("alice"), ClientKey::identity("bob"));
        assert!(ClientKey::identity("alice").is_shared());
        assert_eq!(ClientKey::identity("alice").prefixes(), [None, None]);
        assert_eq!(key("2001:db8:1:2::1").to_string(), "2001:db8:1:2::/64");
        // Every connection's input account and every held share carries one.
        assert_eq!(std::mem::size_of::<ClientKey>(), 16);
        let local = ClientKey::of_peer(true, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(local, ClientKey::Local);
        assert!(!local.is_shared() && key("10.0.0.1").is_shared());
        assert_eq!(ClientKey::of_peer(false, None), ClientKey::Local);
    }

    #[test]
    fn an_ipv6_64_counts_toward_its_56_and_48() {
        let [a56, a48] = key("2001:db8:1:2::1").prefixes();
        let [b56, b48] = key("2001:db8:1:3::1").prefixes();
        let [c56, c48] = key("2001:db8:1:200::1").prefixes();
        // Two /64s of one /56 share their /56 and /48; another /56 of the /48 shares the /48.
        assert_eq!(a56, b56);
        assert_eq!(a48, b48);
        assert_ne!(a56, c56);
        assert_eq!(a48, c48);
        assert_eq!(a56.unwrap().1, PREFIX_56_SHARES);
        assert_eq!(a56.unwrap().0.to_string(), "2001:db8:1::/56");
        assert_eq!(key("10.0.0.1").prefixes(), [None, None]);
    }

    #[test]
    fn a_share_is_the_pool_split_within_floor_and_cap() {
        // Alone: the cap, not the whole pool.
        assert_eq!(SHARES.of(1000, 1), 100);
        // Twenty clients: a twentieth.
        assert_eq!(SHARES.of(1000, 20), 50);
        // A thousand: the floor.
        assert_eq!(SHARES.of(1000, 1000), 10);
        // A pool too small for percents still gives a unit.
        assert_eq!(SHARES.of(5, 3), 1);
        assert_eq!(SHARES.of(0, 1), 1);
    }

    #[test]
    fn a_client_over_its_share_is_refused_and_a_newcomer_is_not() {
        let pool = |held, active| PoolLevel {
            capacity: 1000,
            held,
            active,
        };
        // One client alone reaches the cap and no further.
        assert_eq!(SHARES.admits(pool(99, 1), 99, 1, 1), Admit::Yes);
        assert_eq!(SHARES.admits(pool(100, 1), 100, 1, 1), Admit::OverShare);
        // A newcomer beside it is under its share.
        assert_eq!(SHARES.admits(pool(100, 2), 0, 1, 1), Admit::Yes);
        // A prefix may hold its multiple of the share.
        assert_eq!(
            SHARES.admits(pool(100, 1), 100, PREFIX_56_SHARES, 1),
            Admit::Yes
        );
        // The pool's capacity binds a client under its share; one over it hears that first.
        assert_eq!(SHARES.admits(pool(1000, 2), 0, 1, 1), Admit::Full);
        assert_eq!(SHARES.admits(pool(1000, 2), 100, 1, 1), Admit::OverShare);
    }
}
