//! Creating an object's database, on a node alone: the first write to an object whose database
//! does not exist creates it (reads and attaches that write nothing run on a scratch database
//! and create nothing, see [`super::object`]). Creating is bounded, in this order:
//!
//! 1. the data disk must not be low (`disk_low`): 507 `disk_low`;
//! 2. the app must have fewer than `COMBD_MAX_OBJECTS_PER_APP` databases on the node (a place
//!    is reserved in the node-wide count, given back if no database was made): 507
//!    `too many objects`, counted in `objects_refused_count`;
//! 3. the client that made the object live must be within its share of the shard's creations
//!    of the last [`OBJECT_CREATE_BURST_SECONDS`] (`crate::fair`, pool `object_creations`), and
//!    the shard must have a token of `COMBD_OBJECT_CREATE_RATE` ([`CreateRate`]): else 429
//!    `object creation rate` with `retry-after: 1`, counted in `objects_refused_rate`. So one
//!    client spraying new names spends its share of the burst, not everyone's.
//!
//! Then the database is opened (created) like a restore: within the shard's restore cap, on a
//! blocking thread. `objects_created` counts the databases made.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::OBJECT_CREATE_BURST_SECONDS;
use tracing::warn;

use crate::fair::{Ledger, Share};
use crate::stats::ShardStats;

use super::object::ObjectCell;
use super::store::{self, StoreConfig};
use super::{Cells, Refusal};

/// A shard's creation rate: a token bucket of [`OBJECT_CREATE_BURST_SECONDS`] seconds of
/// `COMBD_OBJECT_CREATE_RATE`, full at start, refilled at the rate; each creation takes one.
/// Beside it, each creation of the last burst's length, counted to the client it was made for
/// (the shard's `object_creations` pool), so no client takes more than its share of a burst.
pub(super) struct CreateRate {
    per_second: f64,
    burst: f64,
    tokens: Cell<f64>,
    at: Cell<Instant>,
    recent: RefCell<VecDeque<(Instant, Share)>>,
}

impl CreateRate {
    /// A full bucket for `per_second` creations a second.
    pub fn new(per_second: u64) -> CreateRate {
        let burst = per_second.saturating_mul(OBJECT_CREATE_BURST_SECONDS) as f64;
        CreateRate {
            per_second: per_second as f64,
            burst,
            tokens: Cell::new(burst),
            at: Cell::new(Instant::now()),
            recent: RefCell::new(VecDeque::new()),
        }
    }

    /// Takes a creation for `asker` at `now`: its share of the shard's creations of the last
    /// burst (from `pool`), then a token. False (nothing taken) when either is refused.
    fn take_for(&self, pool: &Arc<Ledger>, asker: ClientKey, now: Instant) -> bool {
        let window = Duration::from_secs(OBJECT_CREATE_BURST_SECONDS);
        let mut recent = self.recent.borrow_mut();
        while recent
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) >= window)
        {
            recent.pop_front();
        }
        let Ok(share) = pool.take(asker, 1) else {
            return false;
        };
        if !self.take(now) {
            return false;
        }
        recent.push_back((now, share));
        true
    }

    /// Takes a token at `now`; false (and nothing taken) when there is none.
    fn take(&self, now: Instant) -> bool {
        let since = now.saturating_duration_since(self.at.get()).as_secs_f64();
        let tokens = (self.tokens.get() + since * self.per_second).min(self.burst);
        self.at.set(now.max(self.at.get()));
        let taken = tokens >= 1.0;
        self.tokens.set(if taken { tokens - 1.0 } else { tokens });
        taken
    }
}

/// Creates the database of an object of `app` at `path` (which did not exist when the object
/// was restored), if the bounds above allow it; opens it if it exists after all.
pub(super) async fn create(
    cells: &Cells,
    cell: &ObjectCell,
    path: PathBuf,
    config: StoreConfig,
) -> Result<rusqlite::Connection, Refusal> {
    let (app, key) = (cell.app_name(), cell.key());
    let state = &cells.state;
    let node = state.node().clone();
    let stats = state.stats();
    if node.admission.disk_low() {
        return Err(Refusal::DiskLow);
    }
    if !node.objects.reserve(app) {
        return Err(Refusal::TooManyObjects);
    }
    let pool = &node.pools.creations[state.id()];
    if !cells
        .create_rate
        .take_for(pool, cell.opened_by(), Instant::now())
    {
        node.objects.release(app);
        return Err(Refusal::CreateRate);
    }
    let permit = state.acquire_restore(cell.opened_by()).await;
    let counts = node.clone();
    let (opened, created) = state
        .on_thread(cell.opened_by(), move || {
            let existed = matches!(path.try_exists(), Ok(true));
            let opened = store::open(&path, config);
            // Counted once there is a file, even if opening it failed after making it.
            let created = !existed && matches!(path.try_exists(), Ok(true));
            if !created {
                counts.objects.release(app);
            }
            (opened, created)
        })
        .await;
    drop(permit);
    if created {
        ShardStats::add(&stats.objects_created, 1);
    }
    opened.map_err(|e| match e.is_migration() {
        // Logged where it failed, naming the app, the object and the step.
        true => Refusal::MigrationFailed,
        false => {
            warn!(object = %key, "cannot create: {e}");
            Refusal::StorageUnavailable
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_holds_its_burst_then_refills_at_the_rate() {
        let bucket = CreateRate::new(2);
        let t0 = bucket.at.get();
        let burst = 2 * OBJECT_CREATE_BURST_SECONDS;
        for i in 0..burst {
            assert!(bucket.take(t0), "token {i} of the burst");
        }
        assert!(!bucket.take(t0), "past the burst");
        // Half a second at 2 a second is one token, taken once.
        let t1 = t0 + Duration::from_millis(500);
        assert!(bucket.take(t1));
        assert!(!bucket.take(t1));
        // A long pause fills the bucket, never past its burst.
        let t2 = t1 + Duration::from_secs(3600);
        let taken = (0..burst + 5).filter(|_| bucket.take(t2)).count() as u64;
        assert_eq!(taken, burst);
    }
}
