//! Owners this node could not reach a moment ago: requests for their objects are answered 503
//! at once instead of each waiting out a connect or forward timeout again, and one at a time
//! tries the owner again every `FLEET_OWNER_RETRY_INTERVAL` (a circuit breaker, half-open with
//! one probe). An owner cut off from the fleet is then not waited for, and once its lease lapses
//! the next request claims its object here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use combd_kernel::limits::{
    FLEET_CONNECT_TIMEOUT, FLEET_FORWARD_TIMEOUT, FLEET_OWNER_RETRY_INTERVAL, FLEET_UNREACHABLE_MAX,
};

/// A node that could not be reached.
#[derive(Debug, Clone, Copy)]
struct Mark {
    /// When it last failed.
    failed_at: Instant,
    /// When the try going on now began, if one is.
    trying_since: Option<Instant>,
}

/// The longest one try can take: a try that has not reported by then is taken as lost (so a
/// try that never reports does not keep the owner skipped forever).
const TRY_MAX: Duration = FLEET_CONNECT_TIMEOUT.saturating_add(FLEET_FORWARD_TIMEOUT);

/// Owners (fleet addresses) that failed, and when.
#[derive(Debug, Default)]
pub struct Unreachable {
    marks: Mutex<HashMap<String, Mark>>,
}

impl Unreachable {
    fn marks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Mark>> {
        self.marks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether to try `owner` now (`at` is now): yes unless it failed less than the retry
    /// interval ago, or another try of it is on its way. A yes must be followed by
    /// [`Unreachable::reached`] or [`Unreachable::failed`].
    pub fn may_try(&self, owner: &str, at: Instant) -> bool {
        let mut marks = self.marks();
        let Some(m) = marks.get_mut(owner) else {
            return true;
        };
        let trying = m
            .trying_since
            .is_some_and(|since| at.saturating_duration_since(since) < TRY_MAX);
        if trying || at.saturating_duration_since(m.failed_at) < FLEET_OWNER_RETRY_INTERVAL {
            return false;
        }
        m.trying_since = Some(at);
        true
    }

    /// `owner` answered: its requests go to it again.
    pub fn reached(&self, owner: &str) {
        let mut marks = self.marks();
        if !marks.is_empty() {
            marks.remove(owner);
        }
    }

    /// `owner` could not be reached (at `at`).
    pub fn failed(&self, owner: &str, at: Instant) {
        let mut marks = self.marks();
        if marks.len() >= FLEET_UNREACHABLE_MAX && !marks.contains_key(owner) {
            marks.retain(|_, m| {
                at.saturating_duration_since(m.failed_at) < FLEET_OWNER_RETRY_INTERVAL
            });
            if marks.len() >= FLEET_UNREACHABLE_MAX {
                return;
            }
        }
        marks.insert(
            owner.to_string(),
            Mark {
                failed_at: at,
                trying_since: None,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "10.0.0.1:8081";
    const B: &str = "10.0.0.2:8081";

    #[test]
    fn a_failed_owner_is_skipped_for_the_interval_then_tried_once_at_a_time() {
        let u = Unreachable::default();
        let t0 = Instant::now();
        assert!(u.may_try(A, t0));
        u.failed(A, t0);
        let just_before = t0 + FLEET_OWNER_RETRY_INTERVAL - Duration::from_millis(1);
        assert!(!u.may_try(A, just_before), "skipped within the interval");
        assert!(u.may_try(B, just_before), "another owner is not");
        let after = t0 + FLEET_OWNER_RETRY_INTERVAL;
        assert!(u.may_try(A, after), "one try once the interval is over");
        assert!(!u.may_try(A, after), "and only one at a time");
        // That try fails: skipped for another interval from then.
        u.failed(A, after);
        assert!(!u.may_try(A, after + Duration::from_millis(1)));
        let later = after + FLEET_OWNER_RETRY_INTERVAL;
        assert!(u.may_try(A, later));
        u.reached(A);
        assert!(u.may_try(A, later), "reached: tried again by everyone");
        assert!(u.may_try(A, later));
    }

    #[test]
    fn a_try_that_never_reports_is_over_after_the_longest_call() {
        let u = Unreachable::default();
        let t0 = Instant::now();
        u.failed(A, t0);
        let t1 = t0 + FLEET_OWNER_RETRY_INTERVAL;
        assert!(u.may_try(A, t1));
        assert!(!u.may_try(A, t1 + TRY_MAX - Duration::from_millis(1)));
        assert!(u.may_try(A, t1 + TRY_MAX));
    }

    #[test]
    fn marks_are_bounded() {
        let u = Unreachable::default();
        let t0 = Instant::now();
        for i in 0..FLEET_UNREACHABLE_MAX {
            u.failed(&format!("10.1.{}.{}:1", i / 256, i % 256), t0);
        }
        // Full of fresh marks: a new one is not kept (that owner is simply tried).
        u.failed(A, t0);
        assert!(u.may_try(A, t0));
        assert_eq!(u.marks().len(), FLEET_UNREACHABLE_MAX);
        // Once they are older than the interval they make room.
        let later = t0 + FLEET_OWNER_RETRY_INTERVAL;
        u.failed(A, later);
        assert_eq!(u.marks().len(), 1);
        assert!(!u.may_try(A, later));
    }
}
