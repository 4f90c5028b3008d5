//! Owners this node could not reach a moment ago: requests for their objects are answered 503
//! at once instead of each waiting out a connect or forward timeout again, and one at a time
//! tries the owner again every `FLEET_OWNER_RETRY_INTERVAL` (a circuit breaker, half-open with
//! one probe). An owner cut off from the fleet is then not waited for, and once its lease lapses
//! the next request claims its object here.
//!
//! Only an owner that made a request wait in vain is marked: a connect or an answer that timed
//! out, with nothing else answered by that owner since the request was sent (an owner that
//! answers other requests meanwhile is slow for this one, not gone). A failure that comes at
//! once (refused, reset) costs the next request no wait, so it marks nothing; it only keeps an
//! owner already marked so.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use combd_kernel::limits::{
    FLEET_CONNECT_TIMEOUT, FLEET_FORWARD_TIMEOUT, FLEET_OWNER_RETRY_INTERVAL,
    FLEET_PROBE_CONNECT_TIMEOUT, FLEET_UNREACHABLE_MAX,
};

/// What is known of one owner.
#[derive(Debug, Clone, Copy, Default)]
struct UnreachableOwner {
    /// When it last made a request wait in vain, while it is marked.
    failed_at: Option<Instant>,
    /// When the try of it going on now began, if one is.
    trying_since: Option<Instant>,
    /// When it last answered.
    answered_at: Option<Instant>,
}

/// The longest one try can take: a try that has not reported by then is taken as lost (so a
/// try that never reports does not keep the owner skipped forever).
const TRY_MAX: Duration = FLEET_CONNECT_TIMEOUT.saturating_add(FLEET_FORWARD_TIMEOUT);

/// A try of an owner that [`Unreachable::may_try`] allowed: reported with
/// [`Unreachable::reached`] or [`Unreachable::failed`].
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    /// When it began.
    at: Instant,
    /// Whether it is the one try of a marked owner.
    probe: bool,
}

impl Attempt {
    /// How long its connect may wait: the probe of a marked owner
    /// [`FLEET_PROBE_CONNECT_TIMEOUT`], any other [`FLEET_CONNECT_TIMEOUT`].
    pub fn connect_within(&self) -> Duration {
        if self.probe {
            FLEET_PROBE_CONNECT_TIMEOUT
        } else {
            FLEET_CONNECT_TIMEOUT
        }
    }

    /// An attempt begun at `at` that is not a probe (for the tests).
    #[cfg(test)]
    fn at(at: Instant) -> Attempt {
        Attempt { at, probe: false }
    }
}

/// How a try of an owner failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failed {
    /// At once: refused, reset, closed before answering.
    AtOnce,
    /// It made the request wait in vain: a connect or an answer timed out.
    Waited,
}

/// Owners (fleet addresses) that failed, and when.
#[derive(Debug, Default)]
pub struct Unreachable {
    owners: Mutex<HashMap<String, UnreachableOwner>>,
}

impl Unreachable {
    fn owners(&self) -> std::sync::MutexGuard<'_, HashMap<String, UnreachableOwner>> {
        self.owners.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether to try `owner` now (`at` is now): yes unless it made a request wait in vain less
    /// than the retry interval ago, or another try of it is on its way.
    pub fn may_try(&self, owner: &str, at: Instant) -> Option<Attempt> {
        let mut owners = self.owners();
        let Some(o) = owners.get_mut(owner) else {
            return Some(Attempt { at, probe: false });
        };
        let Some(failed_at) = o.failed_at else {
            return Some(Attempt { at, probe: false });
        };
        let trying = o
            .trying_since
            .is_some_and(|since| at.saturating_duration_since(since) < TRY_MAX);
        if trying || at.saturating_duration_since(failed_at) < FLEET_OWNER_RETRY_INTERVAL {
            return None;
        }
        o.trying_since = Some(at);
        Some(Attempt { at, probe: true })
    }

    /// `owner` answered (at `at`): its requests go to it again.
    pub fn reached(&self, owner: &str, at: Instant) {
        let answered = UnreachableOwner {
            answered_at: Some(at),
            ..UnreachableOwner::default()
        };
        let mut owners = self.owners();
        if let Some(o) = owners.get_mut(owner) {
            *o = answered;
        } else if room(&mut owners, at) {
            owners.insert(owner.to_string(), answered);
        }
    }

    /// `attempt` of `owner` failed `how` (at `at`).
    pub fn failed(&self, owner: &str, attempt: Attempt, how: Failed, at: Instant) {
        let mut owners = self.owners();
        if !owners.contains_key(owner) && (how == Failed::AtOnce || !room(&mut owners, at)) {
            return;
        }
        let o = owners.entry(owner.to_string()).or_default();
        if attempt.probe {
            o.trying_since = None;
        }
        let answered_since = o.answered_at.is_some_and(|a| a >= attempt.at);
        let waited_in_vain = how == Failed::Waited && !answered_since;
        if waited_in_vain || o.failed_at.is_some() {
            o.failed_at = Some(at);
        }
    }
}

/// Whether one more owner may be remembered: past `FLEET_UNREACHABLE_MAX`, owners neither
/// marked nor answered within the longest try are forgotten first.
fn room(owners: &mut HashMap<String, UnreachableOwner>, at: Instant) -> bool {
    if owners.len() < FLEET_UNREACHABLE_MAX {
        return true;
    }
    let recent = |t: Option<Instant>, within: Duration| {
        t.is_some_and(|t| at.saturating_duration_since(t) < within)
    };
    owners.retain(|_, o| {
        recent(o.failed_at, FLEET_OWNER_RETRY_INTERVAL) || recent(o.answered_at, TRY_MAX)
    });
    owners.len() < FLEET_UNREACHABLE_MAX
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "10.0.0.1:8081";
    const B: &str = "10.0.0.2:8081";

    #[test]
    fn an_owner_that_made_a_request_wait_is_skipped_for_the_interval_then_tried_once_at_a_time() {
        let u = Unreachable::default();
        let t0 = Instant::now();
        let first = u.may_try(A, t0).unwrap();
        u.failed(A, first, Failed::Waited, t0 + FLEET_FORWARD_TIMEOUT);
        let t1 = t0 + FLEET_FORWARD_TIMEOUT;
        let just_before = t1 + FLEET_OWNER_RETRY_INTERVAL - Duration::from_millis(1);
        assert!(
            u.may_try(A, just_before).is_none(),
            "skipped within the interval"
        );
        assert!(u.may_try(B, just_before).is_some(), "another owner is not");
        let after = t1 + FLEET_OWNER_RETRY_INTERVAL;
        let probe = u
            .may_try(A, after)
            .expect("one try once the interval is over");
        assert!(u.may_try(A, after).is_none(), "and only one at a time");
        // A request sent before the mark fails meanwhile: the probe is still the only try.
        u.failed(A, Attempt::at(t0), Failed::Waited, after);
        assert!(u.may_try(A, after + FLEET_OWNER_RETRY_INTERVAL).is_none());
        // The probe fails: skipped for another interval from then, then tried again.
        let t2 = after + Duration::from_millis(10);
        u.failed(A, probe, Failed::AtOnce, t2);
        assert!(u.may_try(A, t2 + Duration::from_millis(1)).is_none());
        let t3 = t2 + FLEET_OWNER_RETRY_INTERVAL;
        assert!(u.may_try(A, t3).is_some_and(|a| a.probe));
        u.reached(A, t3);
        assert!(
            u.may_try(A, t3).is_some_and(|a| !a.probe),
            "reached: tried by everyone"
        );
        assert!(u.may_try(A, t3).is_some());
    }

    #[test]
    fn failures_at_once_and_waits_while_the_owner_answered_others_mark_nothing() {
        let u = Unreachable::default();
        let t0 = Instant::now();
        // Refused at once: the next request loses nothing by trying.
        let a = u.may_try(A, t0).unwrap();
        u.failed(A, a, Failed::AtOnce, t0);
        assert!(u.may_try(A, t0).is_some());
        // A slow answer for one request while the owner answered another meanwhile.
        let slow = u.may_try(A, t0).unwrap();
        u.reached(A, t0 + Duration::from_millis(100));
        u.failed(A, slow, Failed::Waited, t0 + FLEET_FORWARD_TIMEOUT);
        assert!(u.may_try(A, t0 + FLEET_FORWARD_TIMEOUT).is_some());
        // Nothing answered since it was sent: marked.
        let t1 = t0 + FLEET_FORWARD_TIMEOUT;
        let lost = u.may_try(A, t1).unwrap();
        u.failed(A, lost, Failed::Waited, t1 + FLEET_FORWARD_TIMEOUT);
        assert!(u.may_try(A, t1 + FLEET_FORWARD_TIMEOUT).is_none());
    }

    #[test]
    fn a_try_that_never_reports_is_over_after_the_longest_call() {
        let u = Unreachable::default();
        let t0 = Instant::now();
        u.failed(A, Attempt::at(t0), Failed::Waited, t0);
        let t1 = t0 + FLEET_OWNER_RETRY_INTERVAL;
        assert!(u.may_try(A, t1).is_some_and(|a| a.probe));
        assert!(u
            .may_try(A, t1 + TRY_MAX - Duration::from_millis(1))
            .is_none());
        assert!(u.may_try(A, t1 + TRY_MAX).is_some());
    }

    #[test]
    fn owners_remembered_are_bounded() {
        let u = Unreachable::default();
        let t0 = Instant::now();
        for i in 0..FLEET_UNREACHABLE_MAX {
            let o = format!("10.1.{}.{}:1", i / 256, i % 256);
            u.failed(&o, Attempt::at(t0), Failed::Waited, t0);
        }
        // Full of fresh marks: a new one is not kept (that owner is simply tried).
        u.failed(A, Attempt::at(t0), Failed::Waited, t0);
        u.reached(B, t0);
        assert!(u.may_try(A, t0).is_some());
        assert_eq!(u.owners().len(), FLEET_UNREACHABLE_MAX);
        // Once they are older than the interval they make room.
        let later = t0 + FLEET_OWNER_RETRY_INTERVAL;
        u.failed(A, Attempt::at(later), Failed::Waited, later);
        assert_eq!(u.owners().len(), 1);
        assert!(u.may_try(A, later).is_none());
    }
}
