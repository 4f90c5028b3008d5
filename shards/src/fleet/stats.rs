//! The fleet's figures: what [`FleetStats`] counts, and how `/stats` and `/metrics` show it
//! ([`figures`], over what the fleet shows now: [`FleetNow`]).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::stats::{Field, Kind};

/// The fleet's figures in `/stats` (all zero with the fleet off).
#[derive(Default)]
pub struct FleetStats {
    pub(super) objects_owned: AtomicU64,
    pub(super) claims_won: AtomicU64,
    pub(super) claims_lost: AtomicU64,
    pub(super) claims_released: AtomicU64,
    pub(super) objects_forgotten: AtomicU64,
    pub(super) forgets_finished: AtomicU64,
    pub(super) routed: AtomicU64,
    pub(super) lookups: AtomicU64,
    pub(super) segments_uploaded: AtomicU64,
    pub(super) upload_max_us: AtomicU64,
    pub(super) ship_fenced: AtomicU64,
    pub(super) ship_failed: AtomicU64,
    pub(super) acks_waiting_upload: AtomicU64,
    pub(super) restores: AtomicU64,
    pub(super) restores_skipped: AtomicU64,
    pub(super) snapshots_skipped: AtomicU64,
    pub(super) restore_max_ms: AtomicU64,
    pub(super) snapshots: AtomicU64,
    pub(super) forwarded: AtomicU64,
    pub(super) forward_failed: AtomicU64,
    pub(super) owner_skipped: AtomicU64,
    pub(super) ws_passed: AtomicU64,
    pub(super) ws_passing: AtomicU64,
    pub(super) ws_pass_failed: AtomicU64,
    pub(super) uploads_in_flight_max: AtomicU64,
    pub(super) pruned_keys: AtomicU64,
    pub(super) prune_failed: AtomicU64,
    pub(super) lease_grants: AtomicU64,
    pub(super) lease_grant_failed: AtomicU64,
    pub(super) auth_refused: AtomicU64,
    pub(super) auth_busy: AtomicU64,
    pub(super) owner_invalid: AtomicU64,
    pub(super) head_missing: AtomicU64,
    pub(super) restore_corrupt: AtomicU64,
    pub(super) wake_sweeps: AtomicU64,
    pub(super) wake_sweeps_failed: AtomicU64,
    pub(super) wakes_taken: AtomicU64,
    pub(super) messages_passed: AtomicU64,
    /// Uploads by how long they took, in [`upload_bucket`]s.
    upload_times: UploadTimes,
}

/// Counts of uploads by [`upload_bucket`].
struct UploadTimes([AtomicU64; UPLOAD_TIME_BUCKETS]);

impl Default for UploadTimes {
    fn default() -> Self {
        UploadTimes(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// Buckets per power of two of [`FleetStats::upload_times`] above the first ones: a time is
/// known to within 1/8 (12.5 %).
const SUB_BUCKETS: u64 = 8;
/// Powers of two counted in buckets: the last bucket holds everything from 2^36 µs (19 h).
const UPLOAD_TIME_POWERS: u64 = 36;
/// Buckets of [`FleetStats::upload_times`]: 0 to 7 µs one each, then 8 per power of two from
/// 2^3 to 2^35, then one for the rest (2,184 bytes).
const UPLOAD_TIME_BUCKETS: usize = (SUB_BUCKETS * (UPLOAD_TIME_POWERS - 2) + 1) as usize;

/// The bucket of a time of `us` microseconds: below 8 its own; else, with `e` its highest bit,
/// one of the 8 equal parts of [2^e, 2^(e+1)).
fn upload_bucket(us: u64) -> usize {
    if us < SUB_BUCKETS {
        return us as usize;
    }
    let e = u64::from(63 - us.leading_zeros());
    let sub = (us >> (e - 3)) & (SUB_BUCKETS - 1);
    ((SUB_BUCKETS + (e - 3) * SUB_BUCKETS + sub) as usize).min(UPLOAD_TIME_BUCKETS - 1)
}

/// The largest time in bucket `i` (in microseconds).
fn upload_bucket_top(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB_BUCKETS {
        return i;
    }
    let (e, sub) = (
        (i - SUB_BUCKETS) / SUB_BUCKETS + 3,
        (i - SUB_BUCKETS) % SUB_BUCKETS,
    );
    if i as usize == UPLOAD_TIME_BUCKETS - 1 {
        return u64::MAX;
    }
    ((SUB_BUCKETS + sub + 1) << (e - 3)) - 1
}

impl FleetStats {
    /// Counts an upload that took `us` microseconds.
    pub(super) fn upload_took(&self, us: u64) {
        self.upload_max_us.fetch_max(us, Ordering::Relaxed);
        self.upload_times.0[upload_bucket(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// The 99th percentile of the upload times since start, in microseconds: the largest time
    /// of the bucket it falls in (so at most 12.5 % above the true value); 0 before any upload.
    pub(super) fn upload_p99_us(&self) -> u64 {
        let counts: Vec<u64> = self
            .upload_times
            .0
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = total - total / 100;
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return upload_bucket_top(i);
            }
        }
        u64::MAX
    }

    /// A WebSocket is passed through to its owner until the guard is dropped.
    pub fn ws_passing(&self) -> impl Drop + '_ {
        self.ws_passed.fetch_add(1, Ordering::Relaxed);
        self.ws_passing.fetch_add(1, Ordering::Relaxed);
        crate::defer::Defer(move || {
            self.ws_passing.fetch_sub(1, Ordering::Relaxed);
        })
    }

    /// One object has `n` groups' uploads on their way at once.
    pub fn uploads_in_flight(&self, n: usize) {
        self.uploads_in_flight_max
            .fetch_max(n as u64, Ordering::Relaxed);
    }

    /// A WebSocket's owner could not be reached (answered 503).
    pub fn ws_pass_failed(&self) {
        self.ws_pass_failed.fetch_add(1, Ordering::Relaxed);
    }
}

/// What the fleet's figures read, as of now: its counters, and what they do not count.
pub struct FleetNow<'a> {
    pub(super) stats: &'a FleetStats,
    /// Whether this node's lease holds.
    pub(super) holds: bool,
    /// Signed requests remembered.
    pub(super) replays_held: u64,
    /// The bucket's retries.
    pub(super) bucket_retries: u64,
}

/// The fleet's figures for `/stats` and `/metrics`, in a fixed order (`None` on a node alone).
pub fn figures(fleet: Option<&FleetNow<'_>>) -> Vec<Field> {
    let mut all = lease_figures(fleet);
    all.extend(wake_figures(fleet));
    all.extend(ownership_figures(fleet));
    all.extend(shipping_figures(fleet));
    all.extend(restore_figures(fleet));
    all.extend(bucket_figures(fleet));
    all.extend(forwarding_figures(fleet));
    all
}

/// The node in the fleet: its lease, and the fleet key's checks of what other nodes send.
fn lease_figures(fleet: Option<&FleetNow<'_>>) -> Vec<Field> {
    use Kind::*;
    let g = |f: fn(&FleetStats) -> &AtomicU64| load(fleet, f);
    vec![
        (
            "fleet",
            "combd_fleet",
            Gauge,
            "1 when the node is in a fleet (COMBD_FLEET_ETCD).",
            fleet.is_some() as u64,
        ),
        (
            "fleet_lease_holds",
            "combd_fleet_lease_holds",
            Gauge,
            "1 while this node's lease holds.",
            fleet.is_some_and(|f| f.holds) as u64,
        ),
        (
            "fleet_lease_grants",
            "combd_fleet_lease_grants_total",
            Counter,
            "Leases granted to this node: 1 at start, and one more each time a lost lease \
                 was replaced.",
            g(|s| &s.lease_grants),
        ),
        (
            "fleet_lease_grant_failed",
            "combd_fleet_lease_grant_failed_total",
            Counter,
            "New leases asked for after this node's lease was lost, and not granted (at \
                 most one a fleet_lease_regrant_interval_ms).",
            g(|s| &s.lease_grant_failed),
        ),
        (
            "fleet_auth_refused",
            "combd_fleet_auth_refused_total",
            Counter,
            "Requests from the fleet (on the fleet listener, or marked forwarded) refused 401: \
                 unsigned, signed with another key or for another request or node, out of date \
                 by more than fleet_auth_skew_ms, or replayed.",
            g(|s| &s.auth_refused),
        ),
        (
            "fleet_auth_busy",
            "combd_fleet_auth_busy_total",
            Counter,
            "Signed requests from the fleet answered 503 because fleet_auth_replays_max were \
                 remembered already.",
            g(|s| &s.auth_busy),
        ),
        (
            "fleet_auth_replays_held",
            "combd_fleet_auth_replays_held",
            Gauge,
            "Signed requests from the fleet remembered to refuse a replay (at most \
                 fleet_auth_replays_max).",
            fleet.map_or(0, |f| f.replays_held),
        ),
    ]
}

/// Heads and owners that could not be read, and the alarms and messages this node passes on to other nodes' objects.
fn wake_figures(fleet: Option<&FleetNow<'_>>) -> Vec<Field> {
    use Kind::*;
    let g = |f: fn(&FleetStats) -> &AtomicU64| load(fleet, f);
    vec![
            (
                "fleet_owner_invalid",
                "combd_fleet_owner_invalid_total",
                Counter,
                "Objects whose owner the coordinator records as something not a fleet address \
                 (not ip:port, or public without COMBD_FLEET_NODE_PUBLIC=on): answered 503, \
                 never dialled.",
                g(|s| &s.owner_invalid),
            ),
            (
                "fleet_head_missing",
                "combd_fleet_head_missing_total",
                Counter,
                "Objects refused (503) because etcd records no head for them while the bucket \
                 holds their segments or snapshots (etcd lost its keys, or is another fleet's): \
                 never started empty.",
                g(|s| &s.head_missing),
            ),
            (
                "fleet_wake_sweeps",
                "combd_fleet_wake_sweeps_total",
                Counter,
                "Reads of the fleet's wake index for objects with an alarm or a message due                  and no owner (one a fleet_wake_sweep_interval_ms).",
                g(|s| &s.wake_sweeps),
            ),
            (
                "fleet_wake_sweeps_failed",
                "combd_fleet_wake_sweeps_failed_total",
                Counter,
                "Reads of the fleet's wake index that failed (etcd unreachable): read again at                  the next sweep.",
                g(|s| &s.wake_sweeps_failed),
            ),
            (
                "fleet_wakes_taken",
                "combd_fleet_wakes_taken_total",
                Counter,
                "Objects due without an owner (theirs died) that a sweep put in this node's                  alarm index: woken here, which claims and restores them.",
                g(|s| &s.wakes_taken),
            ),
            (
                "fleet_messages_passed",
                "combd_fleet_messages_passed_total",
                Counter,
                "Messages between objects passed on to the receiver's owner on another node                  (each sent until its receiver took it).",
                g(|s| &s.messages_passed),
            ),
        ]
}

/// The objects this node owns, its claims, and the owners it learned (routes and lookups).
fn ownership_figures(fleet: Option<&FleetNow<'_>>) -> Vec<Field> {
    use Kind::*;
    let g = |f: fn(&FleetStats) -> &AtomicU64| load(fleet, f);
    vec![
        (
            "fleet_objects_owned",
            "combd_fleet_objects_owned",
            Gauge,
            "Objects this node owns and has open.",
            g(|s| &s.objects_owned),
        ),
        (
            "fleet_claims_won",
            "combd_fleet_claims_won_total",
            Counter,
            "Objects claimed (owned from then on).",
            g(|s| &s.claims_won),
        ),
        (
            "fleet_claims_lost",
            "combd_fleet_claims_lost_total",
            Counter,
            "Objects asked for here that another node owned.",
            g(|s| &s.claims_lost),
        ),
        (
            "fleet_claims_released",
            "combd_fleet_claims_released_total",
            Counter,
            "Claims given back when an object never written was let go.",
            g(|s| &s.claims_released),
        ),
        (
            "fleet_objects_forgotten",
            "combd_fleet_objects_forgotten_total",
            Counter,
            "Deleted objects forgotten by the fleet: their etcd keys and bucket keys gone.",
            g(|s| &s.objects_forgotten),
        ),
        (
            "fleet_forgets_finished",
            "combd_fleet_forgets_finished_total",
            Counter,
            "Deletes a node died in the middle of, finished by the object's next owner (its tombstone found).",
            g(|s| &s.forgets_finished),
        ),
        (
            "fleet_routed",
            "combd_fleet_routed_total",
            Counter,
            "Requests and attaches passed on to their object's known owner without a cell.",
            g(|s| &s.routed),
        ),
        (
            "fleet_lookups",
            "combd_fleet_lookups_total",
            Counter,
            "Owners read from the coordinator before an object had a cell here (no claim).",
            g(|s| &s.lookups),
        ),
    ]
}

/// Committed batches shipped to the bucket before their answers leave.
fn shipping_figures(fleet: Option<&FleetNow<'_>>) -> Vec<Field> {
    use Kind::*;
    let g = |f: fn(&FleetStats) -> &AtomicU64| load(fleet, f);
    vec![
        (
            "fleet_segments_uploaded",
            "combd_fleet_segments_uploaded_total",
            Counter,
            "Segments uploaded to the bucket.",
            g(|s| &s.segments_uploaded),
        ),
        (
            "fleet_upload_max_us",
            "combd_fleet_upload_max_microseconds",
            Gauge,
            "The longest upload of one segment.",
            g(|s| &s.upload_max_us),
        ),
        (
            "fleet_upload_p99_us",
            "combd_fleet_upload_p99_microseconds",
            Gauge,
            "The 99th percentile of segment upload times since start (at most 12.5 % \
                 above it: the top of its bucket).",
            fleet.map_or(0, |f| f.stats.upload_p99_us()),
        ),
        (
            "fleet_uploads_in_flight_max",
            "combd_fleet_uploads_in_flight_max",
            Gauge,
            "The most groups of one object whose uploads were on their way at once.",
            g(|s| &s.uploads_in_flight_max),
        ),
        (
            "fleet_acks_waiting_upload",
            "combd_fleet_acks_waiting_upload",
            Gauge,
            "Answers waiting for their segments to be shipped.",
            g(|s| &s.acks_waiting_upload),
        ),
        (
            "fleet_ship_fenced",
            "combd_fleet_ship_fenced_total",
            Counter,
            "Shipments refused because another node owns the object now.",
            g(|s| &s.ship_fenced),
        ),
        (
            "fleet_ship_failed",
            "combd_fleet_ship_failed_total",
            Counter,
            "Shipments that failed (bucket, coordinator, lease).",
            g(|s| &s.ship_failed),
        ),
    ]
}

/// Objects restored from the bucket, and snapshots taken.
fn restore_figures(fleet: Option<&FleetNow<'_>>) -> Vec<Field> {
    use Kind::*;
    let g = |f: fn(&FleetStats) -> &AtomicU64| load(fleet, f);
    vec![
        (
            "fleet_restores",
            "combd_fleet_restores_total",
            Counter,
            "Objects written from the bucket when claimed.",
            g(|s| &s.restores),
        ),
        (
            "fleet_restore_corrupt",
            "combd_fleet_restore_corrupt_total",
            Counter,
            "Restores whose database failed PRAGMA quick_check: the object refused (503), an \
                 error logged.",
            g(|s| &s.restore_corrupt),
        ),
        (
            "fleet_restores_skipped",
            "combd_fleet_restores_skipped_total",
            Counter,
            "Objects claimed whose local file a clean close here left at the head etcd \
                 records: opened as they were, nothing read from the bucket.",
            g(|s| &s.restores_skipped),
        ),
        (
            "fleet_restore_max_ms",
            "combd_fleet_restore_max_milliseconds",
            Gauge,
            "The longest restore from the bucket.",
            g(|s| &s.restore_max_ms),
        ),
        (
            "fleet_snapshots",
            "combd_fleet_snapshots_total",
            Counter,
            "Snapshots uploaded.",
            g(|s| &s.snapshots),
        ),
        (
            "fleet_snapshots_skipped",
            "combd_fleet_snapshots_skipped_total",
            Counter,
            "Snapshots not uploaded because the bucket has one at the same head (nothing \
                 shipped since).",
            g(|s| &s.snapshots_skipped),
        ),
    ]
}

/// The bucket's retries, and the keys pruned after a snapshot.
fn bucket_figures(fleet: Option<&FleetNow<'_>>) -> Vec<Field> {
    use Kind::*;
    let g = |f: fn(&FleetStats) -> &AtomicU64| load(fleet, f);
    vec![
        (
            "fleet_bucket_retried",
            "combd_fleet_bucket_retried_total",
            Counter,
            "Bucket calls tried again after a server error (500, 502, 503, 504).",
            fleet.map_or(0, |f| f.bucket_retries),
        ),
        (
            "fleet_pruned_keys",
            "combd_fleet_pruned_keys_total",
            Counter,
            "Segments and snapshots deleted from the bucket once a newer snapshot replaced them.",
            g(|s| &s.pruned_keys),
        ),
        (
            "fleet_prune_failed",
            "combd_fleet_prune_failed_total",
            Counter,
            "Deletions of replaced segments that failed (retried at the next snapshot).",
            g(|s| &s.prune_failed),
        ),
    ]
}

/// Requests and WebSockets passed on to their object's owner.
fn forwarding_figures(fleet: Option<&FleetNow<'_>>) -> Vec<Field> {
    use Kind::*;
    let g = |f: fn(&FleetStats) -> &AtomicU64| load(fleet, f);
    vec![
        (
            "fleet_forwarded",
            "combd_fleet_forwarded_total",
            Counter,
            "Requests passed on to their object's owner and answered.",
            g(|s| &s.forwarded),
        ),
        (
            "fleet_forward_failed",
            "combd_fleet_forward_failed_total",
            Counter,
            "Requests whose object's owner could not be reached (answered 503).",
            g(|s| &s.forward_failed),
        ),
        (
            "fleet_owner_skipped",
            "combd_fleet_owner_skipped_total",
            Counter,
            "Requests and WebSockets answered 503 without trying their object's owner: it \
                 made a request wait in vain less than fleet_owner_retry_interval_ms ago, or \
                 another request was trying it again.",
            g(|s| &s.owner_skipped),
        ),
        (
            "fleet_ws_passed",
            "combd_fleet_ws_passed_total",
            Counter,
            "WebSockets passed through whole to their object's owner.",
            g(|s| &s.ws_passed),
        ),
        (
            "fleet_ws_passing",
            "combd_fleet_ws_passing",
            Gauge,
            "WebSockets being passed through to their object's owner now.",
            g(|s| &s.ws_passing),
        ),
        (
            "fleet_ws_pass_failed",
            "combd_fleet_ws_pass_failed_total",
            Counter,
            "WebSockets whose object's owner could not be reached (answered 503).",
            g(|s| &s.ws_pass_failed),
        ),
    ]
}

/// A counter of the fleet's, 0 on a node alone.
fn load(fleet: Option<&FleetNow<'_>>, f: fn(&FleetStats) -> &AtomicU64) -> u64 {
    fleet.map_or(0, |fl| f(fl.stats).load(Ordering::Relaxed))
}

#[cfg(test)]
mod tests {
    use super::{upload_bucket, upload_bucket_top, FleetStats, UPLOAD_TIME_BUCKETS};

    #[test]
    fn every_time_falls_in_a_bucket_whose_top_is_at_most_an_eighth_above_it() {
        let mut times: Vec<u64> = (0..5_000).collect();
        times.extend((13..64).flat_map(|e| [(1u64 << e) - 1, 1 << e, (1 << e) + 1, 3 << (e - 1)]));
        times.push(u64::MAX);
        for us in times {
            let i = upload_bucket(us);
            let top = upload_bucket_top(i);
            assert!(top >= us, "{us} in bucket {i} whose top is {top}");
            if i < UPLOAD_TIME_BUCKETS - 1 {
                assert!(top - us <= us / 8, "{us} in bucket {i} whose top is {top}");
                assert!(
                    i == 0 || upload_bucket_top(i - 1) < us,
                    "{us}: bucket {i} is not the first that holds it"
                );
            }
        }
        assert_eq!(upload_bucket_top(UPLOAD_TIME_BUCKETS - 1), u64::MAX);
        assert_eq!(upload_bucket(1 << 36), UPLOAD_TIME_BUCKETS - 1);
        assert_eq!(upload_bucket((1 << 36) - 1), UPLOAD_TIME_BUCKETS - 2);
    }

    #[test]
    fn the_upload_p99_is_the_top_of_the_bucket_of_the_99th_percentile() {
        let s = FleetStats::default();
        assert_eq!(s.upload_p99_us(), 0);
        for _ in 0..99 {
            s.upload_took(1_000); // in [960, 1023]
        }
        assert_eq!(s.upload_p99_us(), 1_023);
        s.upload_took(70_000);
        // 100 uploads: the 99th is still a 1 ms one.
        assert_eq!(s.upload_p99_us(), 1_023);
        for _ in 0..5 {
            s.upload_took(70_000);
        }
        // 105: the 104th is a 70 ms one, in [65,536, 73,727].
        assert_eq!(s.upload_p99_us(), 73_727);
        s.upload_took(0);
        s.upload_took(u64::MAX);
        assert_eq!(
            s.upload_max_us.load(std::sync::atomic::Ordering::Relaxed),
            u64::MAX
        );
    }
}
