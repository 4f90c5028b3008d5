//! A budget of log lines a window: at most so many in each, the rest counted and summed up
//! in one line once the window is over. The shard's warnings about apps' failed calls go
//! through one ([`APP_ERROR_LOGS_PER_WINDOW`](combd_kernel::limits::APP_ERROR_LOGS_PER_WINDOW)
//! a window), so that a module failing every request cannot flood stderr from the shard's
//! loop. Time is the caller's (the shard's clock, in milliseconds).

use std::cell::Cell;

use combd_kernel::limits;

/// Lines allowed a window, on one shard.
pub(crate) struct LogBudget {
    per_window: u32,
    window_ms: u64,
    /// When the window began, and the lines logged and not logged in it.
    began_ms: Cell<u64>,
    logged: Cell<u32>,
    suppressed: Cell<u64>,
}

impl LogBudget {
    pub fn new(per_window: u32, window_ms: u64) -> LogBudget {
        LogBudget {
            per_window,
            window_ms: window_ms.max(1),
            began_ms: Cell::new(0),
            logged: Cell::new(0),
            suppressed: Cell::new(0),
        }
    }

    /// A line wants to be logged at `now_ms`: whether it may be, and how many lines the
    /// window that ended before it did not log (to be said first; 0 when none, or when the
    /// window has not ended).
    pub fn take(&self, now_ms: u64) -> (bool, u64) {
        let ended = self.roll(now_ms);
        if self.logged.get() < self.per_window {
            self.logged.set(self.logged.get() + 1);
            (true, ended)
        } else {
            self.suppressed.set(self.suppressed.get() + 1);
            (false, ended)
        }
    }

    /// Starts a new window if the last one is over at `now_ms`; returns how many lines it
    /// did not log (the housekeeping tick calls it, so the count is said even when no line
    /// follows).
    pub fn roll(&self, now_ms: u64) -> u64 {
        if now_ms.saturating_sub(self.began_ms.get()) < self.window_ms {
            return 0;
        }
        self.began_ms.set(now_ms);
        self.logged.set(0);
        self.suppressed.replace(0)
    }
}

/// Says how many warnings of apps' failed calls a shard did not log in the window that ended.
pub(crate) fn warn_app_errors_suppressed(shard: usize, suppressed: u64) {
    tracing::warn!(
        shard,
        suppressed,
        "... and {suppressed} more calls failed in the last {} ms, not logged (at most {} a shard)",
        limits::APP_ERROR_LOG_WINDOW.as_millis(),
        limits::APP_ERROR_LOGS_PER_WINDOW
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_most_so_many_a_window_then_the_rest_are_summed_up() {
        let b = LogBudget::new(3, 1000);
        // max − 1, max: logged.
        assert_eq!(b.take(0), (true, 0));
        assert_eq!(b.take(10), (true, 0));
        assert_eq!(b.take(20), (true, 0));
        // max + 1 and on, in the same window: not logged, counted.
        assert_eq!(b.take(30), (false, 0));
        assert_eq!(b.take(999), (false, 0));
        // The next window: the count of the last is said, and lines are logged again.
        assert_eq!(b.take(1000), (true, 2));
        assert_eq!(b.take(1001), (true, 0));
        assert_eq!(b.take(1002), (true, 0));
        assert_eq!(b.take(1003), (false, 0));
        // The tick says it when no line follows; once.
        assert_eq!(b.roll(1500), 0, "the window is not over");
        assert_eq!(b.roll(2000), 1);
        assert_eq!(b.roll(3000), 0);
        assert_eq!(b.take(3001), (true, 0));
    }
}
