//! What full token checks a client may make a shard do: a token bucket per client per shard of
//! [`AUTH_VERIFY_RATE_PER_CLIENT`] signature checks a second (as many at once), taken only by a
//! token the shard's cache does not know (`cache`). A client sending a new forged token with
//! every request is held to that, and its requests past it are answered as a busy node's, not
//! checked; a client's valid token is checked once and then answered from the cache.
//!
//! Per shard (a thread-local: no lock), at most [`AUTH_VERIFY_CLIENTS_MAX`] clients: past it,
//! the clients whose bucket has refilled are forgotten (they lose nothing), and if none has, a
//! new client waits for one (its check is refused as busy): the table never grows past its
//! bound.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Instant;

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::{AUTH_VERIFY_CLIENTS_MAX, AUTH_VERIFY_RATE_PER_CLIENT};

/// One client's bucket of full checks.
#[derive(Debug, Clone, Copy)]
struct TokenBucket {
    tokens: f64,
    at: Instant,
}

/// The buckets of a shard's clients.
pub(super) struct VerifyBudget {
    buckets: HashMap<ClientKey, TokenBucket>,
    cap: usize,
}

impl VerifyBudget {
    fn new(cap: usize) -> VerifyBudget {
        VerifyBudget {
            buckets: HashMap::new(),
            cap,
        }
    }

    /// Takes one full check for `client` at `now`; false (nothing taken) past its rate. The
    /// node's own machine is never held to one.
    pub fn spend(&mut self, client: ClientKey, now: Instant) -> bool {
        if !client.is_shared() {
            return true;
        }
        let burst = AUTH_VERIFY_RATE_PER_CLIENT as f64;
        if !self.buckets.contains_key(&client) && self.buckets.len() >= self.cap {
            self.forget_refilled(now);
            if self.buckets.len() >= self.cap {
                return false;
            }
        }
        let b = self.buckets.entry(client).or_insert(TokenBucket {
            tokens: burst,
            at: now,
        });
        let since = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + since * burst).min(burst);
        b.at = now;
        if b.tokens < 1.0 {
            return false;
        }
        b.tokens -= 1.0;
        true
    }

    /// Forgets the clients whose bucket is full again by `now`.
    fn forget_refilled(&mut self, now: Instant) {
        let burst = AUTH_VERIFY_RATE_PER_CLIENT as f64;
        self.buckets.retain(|_, b| {
            let since = now.saturating_duration_since(b.at).as_secs_f64();
            b.tokens + since * burst < burst
        });
    }
}

thread_local! {
    static BUDGET: RefCell<VerifyBudget> = RefCell::new(VerifyBudget::new(AUTH_VERIFY_CLIENTS_MAX));
}

/// Takes one full check for `client` from this thread's (shard's) budget.
pub(super) fn spend(client: ClientKey) -> bool {
    BUDGET.with(|b| b.borrow_mut().spend(client, Instant::now()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_client_is_held_to_its_rate_and_the_table_to_its_bound() {
        let mut b = VerifyBudget::new(2);
        let t = Instant::now();
        let (a, c, d) = (ClientKey::V4(1), ClientKey::V4(2), ClientKey::V4(3));
        for _ in 0..AUTH_VERIFY_RATE_PER_CLIENT {
            assert!(b.spend(a, t));
        }
        assert!(!b.spend(a, t), "past the burst");
        assert!(b.spend(c, t), "another client has its own");
        assert!(
            !b.spend(d, t),
            "the table is full and no bucket has refilled"
        );
        assert!(
            b.spend(ClientKey::Local, t),
            "the node's own machine is never held"
        );
        // A second later both have refilled: the third client takes a forgotten one's place.
        let later = t + Duration::from_secs(1);
        assert!(b.spend(d, later));
        assert!(b.buckets.len() <= 2);
        // Half a burst's time refills half the burst.
        let mut b = VerifyBudget::new(2);
        for _ in 0..AUTH_VERIFY_RATE_PER_CLIENT {
            b.spend(a, t);
        }
        let half = t + Duration::from_millis(500);
        let n = (0..AUTH_VERIFY_RATE_PER_CLIENT)
            .filter(|_| b.spend(a, half))
            .count() as u64;
        assert_eq!(n, AUTH_VERIFY_RATE_PER_CLIENT / 2);
    }
}
