//! The budget per turn. A loop whose work grows with load (a broadcast's fan-out, the inbox
//! from the other shards, the ping sweep, the accept-queue drain) does at most a fixed amount
//! of work, then yields the shard's loop so that I/O is polled and every other ready task
//! runs before it goes on. Without it, one broadcast to 20,000 viewers would hold every other
//! connection of the shard for the whole fan-out.
//!
//! Each forced yield is counted (`turn_yields`), and so is a turn that took longer than
//! [`TURN_OVERRUN`](combd_kernel::limits::TURN_OVERRUN) (`turn_overruns`): a budget too large
//! for the work, or work that blocks.

use std::time::Instant;

use combd_kernel::limits::TURN_OVERRUN;

use crate::stats::ShardStats;

/// A loop's budget for the current turn.
pub(crate) struct Turn<'a> {
    stats: &'a ShardStats,
    per_turn: usize,
    left: usize,
    started: Instant,
}

impl<'a> Turn<'a> {
    /// `per_turn` units of work a turn (at least one).
    pub fn new(stats: &'a ShardStats, per_turn: usize) -> Turn<'a> {
        let per_turn = per_turn.max(1);
        Turn {
            stats,
            per_turn,
            left: per_turn,
            started: Instant::now(),
        }
    }

    /// Counts one unit of work done; once the turn's budget is spent, yields the shard's loop
    /// (other tasks and I/O run first) and starts a new turn. True when it yielded.
    pub async fn spend(&mut self) -> bool {
        self.left -= 1;
        if self.left == 0 {
            self.yield_now().await;
            return true;
        }
        false
    }

    /// Counts `n` units of work done at once (a fan-out's frames to one session): yields as
    /// [`Turn::spend`] once the turn's budget is spent. True when it yielded.
    pub async fn spend_many(&mut self, n: usize) -> bool {
        self.left = self.left.saturating_sub(n.max(1));
        if self.left == 0 {
            self.yield_now().await;
            return true;
        }
        false
    }

    /// Ends this turn now: yields the shard's loop, counted as a forced yield.
    pub async fn yield_now(&mut self) {
        self.end_turn();
        ShardStats::add(&self.stats.turn_yields, 1);
        // A timer, so the reactor polls I/O before the next turn (see TURN_YIELD_PAUSE).
        glommio::timer::sleep(combd_kernel::limits::TURN_YIELD_PAUSE).await;
        self.left = self.per_turn;
        self.started = Instant::now();
    }

    /// The loop ran out of work and waits on its own (no forced yield): the turn ends here,
    /// and the next one starts with a full budget.
    pub fn idle(&mut self) {
        if self.left != self.per_turn {
            self.end_turn();
        }
        self.left = self.per_turn;
    }

    /// Starts the clock of a turn that begins after a wait.
    pub fn resume(&mut self) {
        self.started = Instant::now();
    }

    /// Checks the turn just ended against the overrun threshold.
    fn end_turn(&self) {
        if self.started.elapsed() > TURN_OVERRUN {
            ShardStats::add(&self.stats.turn_overruns, 1);
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        // The loop's last turn (it ended without spending its whole budget).
        if self.left != self.per_turn {
            self.end_turn();
        }
    }
}
