//! Fairness per client address: no one address may hold more than its share of the node's
//! connections (`COMBD_MAX_CONNS_PER_ADDRESS`), nor open them faster than
//! `COMBD_ACCEPT_RATE_PER_ADDRESS` a second once it has spent its burst. A connection cannot be
//! refused at TCP per address (the listener refuses everyone or no one), so one past either is
//! closed at once after the accept, before anything is read from it, and counted.
//!
//! An address is an IPv4 address (/32) or an IPv6 /64 (one subscriber's prefix; an IPv4
//! address mapped into IPv6 counts as the IPv4 address). The table is node-wide (the shards
//! share one port): a lock taken once per accept and once per close, never on a request.
//! Its entries are bounded: one per address with connections open (at most the connection
//! cap), and those with none open whose rate bucket is still refilling (so that opening and
//! closing at once does not reset an address's rate), which [`Addresses::sweep`] removes once
//! full (the coordinator calls it every second); an address's last connection closing while
//! [`ADDRESS_IDLE_ENTRIES_MAX`] entries are kept takes its entry with it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

use combd_kernel::limits::ADDRESS_IDLE_ENTRIES_MAX;

/// The share of the connection cap an address is counted under: IPv4 /32, IPv6 /64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddressKey(u128);

impl AddressKey {
    /// The key of a peer's address.
    pub fn of(ip: IpAddr) -> AddressKey {
        match ip {
            IpAddr::V4(v4) => AddressKey(u128::from(u32::from(v4))),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => AddressKey(u128::from(u32::from(v4))),
                // The /64, marked so that it can never equal an IPv4 key.
                None => AddressKey((u128::from(v6) & !u128::from(u64::MAX)) | 1),
            },
        }
    }
}

/// Why a connection from an address was closed at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressRefusal {
    /// The address holds `COMBD_MAX_CONNS_PER_ADDRESS` connections already.
    Conns,
    /// The address spent its burst of new connections and opens them faster than the rate.
    Rate,
}

/// One address: its open connections and its bucket of new ones.
#[derive(Debug, Clone, Copy)]
struct Entry {
    open: u32,
    tokens: f64,
    refilled: Instant,
}

/// The per-address limits in force.
#[derive(Debug, Clone, Copy)]
pub struct AddressLimits {
    /// `COMBD_MAX_CONNS_PER_ADDRESS`; also the bucket's burst.
    pub max_conns: u32,
    /// `COMBD_ACCEPT_RATE_PER_ADDRESS`, new connections a second.
    pub rate: u32,
}

/// Every address with connections open or a bucket refilling.
pub struct Addresses {
    limits: AddressLimits,
    table: Mutex<HashMap<AddressKey, Entry>>,
}

impl Addresses {
    /// An empty table under `limits`.
    pub fn new(limits: AddressLimits) -> Addresses {
        Addresses {
            limits,
            table: Mutex::new(HashMap::new()),
        }
    }

    /// Counts a new connection from `key` at `now`, or says why it is refused (then nothing
    /// is counted but the refusal). Each admitted connection is given back once with
    /// [`Addresses::release`].
    pub fn admit(&self, key: AddressKey, now: Instant) -> Result<(), AddressRefusal> {
        let AddressLimits { max_conns, rate } = self.limits;
        let burst = f64::from(max_conns);
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let e = table.entry(key).or_insert(Entry {
            open: 0,
            tokens: burst,
            refilled: now,
        });
        let refill = now.saturating_duration_since(e.refilled).as_secs_f64() * f64::from(rate);
        e.tokens = (e.tokens + refill).min(burst);
        e.refilled = now;
        if e.open >= max_conns {
            return Err(AddressRefusal::Conns);
        }
        if e.tokens < 1.0 {
            return Err(AddressRefusal::Rate);
        }
        e.open += 1;
        e.tokens -= 1.0;
        Ok(())
    }

    /// Gives back a connection admitted from `key`.
    pub fn release(&self, key: AddressKey) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = table.get_mut(&key) {
            e.open = e.open.saturating_sub(1);
            let full = e.tokens >= f64::from(self.limits.max_conns);
            if e.open == 0 && (full || table.len() > ADDRESS_IDLE_ENTRIES_MAX) {
                table.remove(&key);
            }
        }
    }

    /// Removes the addresses with no connection open whose bucket has refilled by `now`.
    pub fn sweep(&self, now: Instant) {
        let AddressLimits { max_conns, rate } = self.limits;
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.retain(|_, e| {
            let refill = now.saturating_duration_since(e.refilled).as_secs_f64() * f64::from(rate);
            e.open > 0 || e.tokens + refill < f64::from(max_conns)
        });
    }

    /// Addresses in the table now (connections open or a bucket refilling).
    pub fn tracked(&self) -> usize {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The most connections any one address holds now.
    pub fn most_open(&self) -> u32 {
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.values().map(|e| e.open).max().unwrap_or(0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn key(s: &str) -> AddressKey {
        AddressKey::of(s.parse().unwrap())
    }

    #[test]
    fn ipv4_is_its_own_share_and_ipv6_goes_by_its_64() {
        assert_eq!(key("10.0.0.1"), key("::ffff:10.0.0.1"));
        assert_ne!(key("10.0.0.1"), key("10.0.0.2"));
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        // No IPv6 /64 ever equals an IPv4 key.
        assert_ne!(key("::"), key("0.0.0.0"));
        assert_ne!(key("::a00:1"), key("10.0.0.1"));
    }

    #[test]
    fn an_address_at_its_cap_is_refused_and_others_are_not() {
        let a = Addresses::new(AddressLimits {
            max_conns: 3,
            rate: 1000,
        });
        let t = Instant::now();
        for _ in 0..3 {
            a.admit(key("10.0.0.1"), t).unwrap();
        }
        assert_eq!(a.admit(key("10.0.0.1"), t), Err(AddressRefusal::Conns));
        assert_eq!(a.admit(key("10.0.0.2"), t), Ok(()));
        a.release(key("10.0.0.1"));
        assert_eq!(a.admit(key("10.0.0.1"), t + Duration::from_secs(1)), Ok(()));
        assert_eq!(a.most_open(), 3);
    }

    #[test]
    fn the_rate_refuses_past_the_burst_and_refills() {
        let a = Addresses::new(AddressLimits {
            max_conns: 4,
            rate: 2,
        });
        let t = Instant::now();
        // Open and close at once: the burst (4) is spent, the count never reaches the cap.
        for _ in 0..4 {
            a.admit(key("10.0.0.1"), t).unwrap();
            a.release(key("10.0.0.1"));
        }
        assert_eq!(a.admit(key("10.0.0.1"), t), Err(AddressRefusal::Rate));
        // Half a second at 2 a second is one more.
        let later = t + Duration::from_millis(500);
        assert_eq!(a.admit(key("10.0.0.1"), later), Ok(()));
        assert_eq!(a.admit(key("10.0.0.1"), later), Err(AddressRefusal::Rate));
    }

    #[test]
    fn entries_go_once_idle_and_refilled() {
        let a = Addresses::new(AddressLimits {
            max_conns: 4,
            rate: 4,
        });
        let t = Instant::now();
        a.admit(key("10.0.0.1"), t).unwrap();
        a.admit(key("10.0.0.2"), t).unwrap();
        a.release(key("10.0.0.1"));
        // Its bucket is still refilling: kept, so closing does not reset its rate.
        assert_eq!(a.tracked(), 2);
        a.sweep(t + Duration::from_millis(100));
        assert_eq!(a.tracked(), 2);
        a.sweep(t + Duration::from_secs(1));
        assert_eq!(
            a.tracked(),
            1,
            "the idle, refilled address went; the open one stays"
        );
    }
}
