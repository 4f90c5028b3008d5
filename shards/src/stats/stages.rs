//! How long an object's inputs spend in each stage of its pipeline, as histograms: where a
//! click's time goes between its arrival at the object and its answer (`"stages"` in `/stats`).
//!
//! A stage's times fall into buckets a quarter of an octave wide (each bound 2^¼ ≈ 1.19 times
//! the one before, from 1 µs to past an hour), so a quantile read from them is at most 19 %
//! above the true one, and recording one is a clock read and one relaxed add. Shards' histograms
//! add up bucket by bucket.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The stages, in the order an input goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// An input's wait in its object's mailbox, until a batch takes it.
    Mailbox,
    /// A batch handed to a blocking thread, until the thread starts it.
    BatchToThread,
    /// A batch run and committed on its blocking thread.
    BatchRun,
    /// A batch done on its thread, until the object's task goes on with it.
    BatchBack,
    /// A committed batch, until the sync that covers it starts (the sync before it still
    /// running).
    CommitWait,
    /// A WAL sync handed to a blocking thread, until the thread starts it.
    SyncToThread,
    /// The WAL sync itself (`fdatasync`).
    Sync,
    /// A sync done, until the object's commit task goes on with it.
    SyncBack,
    /// A group of batches' answers, sends and broadcasts handed to sessions and other shards.
    Fanout,
    /// A batch's first input from its arrival in the mailbox to its answer.
    InputToAnswer,
}

/// Each stage's name in `/stats` and `/metrics`, in [`Stage`]'s order.
pub const STAGE_NAMES: [&str; STAGES] = [
    "mailbox",
    "batch_to_thread",
    "batch_run",
    "batch_back",
    "commit_wait",
    "sync_to_thread",
    "sync",
    "sync_back",
    "fanout",
    "input_to_answer",
];

/// How many stages there are.
pub const STAGES: usize = 10;

/// Buckets a stage has: four an octave, 1 µs to 2^32 µs (71 minutes), the last one open.
pub const BUCKETS: usize = 4 * 32 + 1;

/// One shard's stage histograms.
#[derive(Debug)]
pub struct StageTimes {
    counts: [[AtomicU64; BUCKETS]; STAGES],
    sum_us: [AtomicU64; STAGES],
}

impl Default for StageTimes {
    fn default() -> StageTimes {
        StageTimes {
            counts: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            sum_us: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// Each bucket's upper bound in microseconds, 2^((b+1)/4) rounded down; the last is open.
static BOUNDS: std::sync::LazyLock<[u64; BUCKETS]> = std::sync::LazyLock::new(|| {
    std::array::from_fn(|b| match b {
        b if b == BUCKETS - 1 => u64::MAX,
        b => 2f64.powf((b as f64 + 1.0) / 4.0).floor() as u64,
    })
});

/// The bucket of `us` microseconds: the first whose upper bound holds it.
pub(crate) fn bucket(us: u64) -> usize {
    BOUNDS.partition_point(|&bound| bound < us)
}

/// The upper bound of bucket `b` in microseconds; the last bucket's is infinite.
pub fn upper_bound_us(b: usize) -> f64 {
    match BOUNDS.get(b) {
        Some(&bound) if b < BUCKETS - 1 => bound as f64,
        _ => f64::INFINITY,
    }
}

/// A stage's histogram added up over shards.
#[derive(Debug, Clone)]
pub struct Histogram {
    /// Times recorded in each bucket.
    pub counts: Vec<u64>,
    /// Every time recorded, added up, in microseconds.
    pub sum_us: u64,
}

impl Histogram {
    /// How many times were recorded.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `q` quantile (0 < q ≤ 1) as its bucket's upper bound in microseconds, 0 if nothing
    /// was recorded; a time in the open last bucket reads as the last finite bound.
    pub fn quantile_us(&self, q: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (b, n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return upper_bound_us(b.min(BUCKETS - 2)) as u64;
            }
        }
        upper_bound_us(BUCKETS - 2) as u64
    }
}

impl StageTimes {
    /// Records that `stage` took `took`.
    pub fn record(&self, stage: Stage, took: Duration) {
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        let i = stage as usize;
        self.counts[i][bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.sum_us[i].fetch_add(us, Ordering::Relaxed);
    }

    /// Each stage's histogram, added up over `shards`.
    pub fn merged<'a>(shards: impl IntoIterator<Item = &'a StageTimes>) -> Vec<Histogram> {
        let mut out: Vec<Histogram> = (0..STAGES)
            .map(|_| Histogram {
                counts: vec![0; BUCKETS],
                sum_us: 0,
            })
            .collect();
        for s in shards {
            for (i, h) in out.iter_mut().enumerate() {
                for (b, c) in h.counts.iter_mut().enumerate() {
                    *c += s.counts[i][b].load(Ordering::Relaxed);
                }
                h.sum_us += s.sum_us[i].load(Ordering::Relaxed);
            }
        }
        out
    }
}

/// `/stats`' `"stages"`: for each stage its count, mean, p50, p90 and p99 in microseconds.
pub fn stages_json(hists: &[Histogram]) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (name, h) in STAGE_NAMES.iter().zip(hists) {
        let count = h.count();
        m.insert(
            (*name).into(),
            serde_json::json!({
                "count": count,
                "mean_us": h.sum_us.checked_div(count).unwrap_or(0),
                "p50_us": h.quantile_us(0.50),
                "p90_us": h.quantile_us(0.90),
                "p99_us": h.quantile_us(0.99),
            }),
        );
    }
    serde_json::Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_falls_in_the_first_bucket_whose_bound_holds_it() {
        for us in [
            0,
            1,
            2,
            3,
            5,
            7,
            100,
            283,
            1000,
            4096,
            10_000,
            1 << 20,
            1 << 31,
        ] {
            let b = bucket(us);
            assert!(upper_bound_us(b) >= us as f64, "{us} in {b}");
            if b > 0 {
                assert!(upper_bound_us(b - 1) < us as f64, "{us} fits below {b}");
            }
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_read_within_a_quarter_octave() {
        let t = StageTimes::default();
        // 90 times of 100 µs and 10 of 5,000 µs.
        for _ in 0..90 {
            t.record(Stage::Sync, Duration::from_micros(100));
        }
        for _ in 0..10 {
            t.record(Stage::Sync, Duration::from_micros(5000));
        }
        let h = &StageTimes::merged([&t])[Stage::Sync as usize];
        assert_eq!(h.count(), 100);
        assert_eq!(h.sum_us, 90 * 100 + 10 * 5000);
        let p50 = h.quantile_us(0.5);
        assert!((100..=119).contains(&p50), "{p50}");
        let p99 = h.quantile_us(0.99);
        assert!((5000..=5950).contains(&p99), "{p99}");
        assert_eq!(
            StageTimes::merged([&t])[Stage::Mailbox as usize].quantile_us(0.5),
            0
        );
    }

    #[test]
    fn shards_add_up() {
        let (a, b) = (StageTimes::default(), StageTimes::default());
        a.record(Stage::Fanout, Duration::from_micros(10));
        b.record(Stage::Fanout, Duration::from_micros(10));
        b.record(Stage::Fanout, Duration::from_micros(30));
        let h = &StageTimes::merged([&a, &b])[Stage::Fanout as usize];
        assert_eq!((h.count(), h.sum_us), (3, 50));
    }
}
