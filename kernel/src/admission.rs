//! The admission decisions, as pure functions over measured values: memory pressure, whether
//! the node is full (and why), the one-second hold that keeps it from flapping, and whether
//! the data disk is low. Their thresholds live in [`crate::limits`].

use crate::limits::{
    DISK_LOW_DIVISOR, DISK_LOW_MAX_BYTES, MACHINE_RESERVE_DIVISOR, PRESSURE_1_PERCENT,
    PRESSURE_2_PERCENT, STATE_HOLD,
};

/// The memory measures, in percent, and the level they give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pressure {
    /// Own memory as a percentage of the budget.
    pub own_percent: u64,
    /// The machine's used memory as a percentage of the machine less its reserve.
    pub machine_percent: u64,
    /// 0, 1 or 2: the level of the higher measure.
    pub level: u8,
}

/// Memory pressure from own memory against the budget and the machine's used memory against
/// the machine less a tenth ([`MACHINE_RESERVE_DIVISOR`]); the higher measure wins: level 1 at
/// [`PRESSURE_1_PERCENT`], 2 at [`PRESSURE_2_PERCENT`].
pub fn pressure(
    own_bytes: u64,
    budget_bytes: u64,
    machine_total_bytes: u64,
    machine_available_bytes: u64,
) -> Pressure {
    let pct = |part: u64, whole: u64| {
        if whole == 0 {
            100
        } else {
            (part as u128 * 100 / whole as u128).min(u64::MAX as u128) as u64
        }
    };
    let own_percent = pct(own_bytes, budget_bytes);
    let usable = machine_total_bytes - machine_total_bytes / MACHINE_RESERVE_DIVISOR;
    let used = machine_total_bytes.saturating_sub(machine_available_bytes);
    let machine_percent = pct(used, usable);
    let top = own_percent.max(machine_percent);
    let level = if top >= PRESSURE_2_PERCENT {
        2
    } else if top >= PRESSURE_1_PERCENT {
        1
    } else {
        0
    };
    Pressure {
        own_percent,
        machine_percent,
        level,
    }
}

/// Why a node is full: a set of reasons.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FullReasons(pub u8);

impl FullReasons {
    /// Memory pressure 2.
    pub const MEMORY: u8 = 1;
    /// `COMBD_MAX_CONNS` connections open.
    pub const CONNS: u8 = 2;
    /// Every shard behind.
    pub const BEHIND: u8 = 4;

    /// Whether any reason holds.
    pub fn any(self) -> bool {
        self.0 != 0
    }

    /// `full_reason` in `/stats`: `none`, or the reasons joined by `+`.
    pub fn describe(self) -> String {
        let names: Vec<&str> = [
            (Self::MEMORY, "memory"),
            (Self::CONNS, "conns"),
            (Self::BEHIND, "behind"),
        ]
        .iter()
        .filter(|(bit, _)| self.0 & bit != 0)
        .map(|(_, n)| *n)
        .collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join("+")
        }
    }
}

/// What the coordinator measured, as plain values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Measurements {
    /// Memory pressure level.
    pub pressure: u8,
    /// Open connections, every shard and listener.
    pub conns: u64,
    /// `COMBD_MAX_CONNS` in force.
    pub max_conns: u64,
    /// Shards that are behind.
    pub shards_behind: usize,
    /// Shards in all.
    pub shards: usize,
}

/// Why the node would be full right now (before the hold).
pub fn full_reasons(m: &Measurements) -> FullReasons {
    let mut r = 0;
    if m.pressure >= 2 {
        r |= FullReasons::MEMORY;
    }
    if m.conns >= m.max_conns {
        r |= FullReasons::CONNS;
    }
    if m.shards > 0 && m.shards_behind >= m.shards {
        r |= FullReasons::BEHIND;
    }
    FullReasons(r)
}

/// The published admission state with its hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionState {
    /// Whether the node is full (refusing at TCP).
    pub full: bool,
    /// When the state last changed (ms on the caller's clock); `None` before the first decision.
    pub since_ms: Option<u64>,
}

impl AdmissionState {
    /// The state before any measurement: not full, and free to change at once.
    pub const START: AdmissionState = AdmissionState {
        full: false,
        since_ms: None,
    };

    /// Applies one decision at `now_ms`. The state changes only once it has held for
    /// [`STATE_HOLD`] since the last change (the first change applies at once: the state the
    /// node starts in was not decided, so a burst right after start is not held back).
    /// Returns whether it changed.
    pub fn decide(&mut self, want_full: bool, now_ms: u64) -> bool {
        if want_full == self.full {
            // The state the node starts in was never decided: it holds nothing back.
            return false;
        }
        let held = match self.since_ms {
            None => true,
            Some(t) => now_ms.saturating_sub(t) >= STATE_HOLD.as_millis() as u64,
        };
        if held {
            self.full = want_full;
            self.since_ms = Some(now_ms);
        }
        held
    }
}

/// Whether the data disk is low: free space below the lesser of a tenth of the filesystem
/// ([`DISK_LOW_DIVISOR`]) and [`DISK_LOW_MAX_BYTES`].
pub fn disk_low(free_bytes: u64, total_bytes: u64) -> bool {
    free_bytes < (total_bytes / DISK_LOW_DIVISOR).min(DISK_LOW_MAX_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    #[test]
    fn pressure_levels_and_the_higher_measure_wins() {
        // Own memory alone.
        assert_eq!(pressure(79, 100, 100 * G, 100 * G).level, 0);
        assert_eq!(pressure(80, 100, 100 * G, 100 * G).level, 1);
        assert_eq!(pressure(89, 100, 100 * G, 100 * G).level, 1);
        assert_eq!(pressure(90, 100, 100 * G, 100 * G).level, 2);
        assert_eq!(
            pressure(2 << 20, 1 << 20, 100 * G, 100 * G).own_percent,
            200
        );
        // The machine alone: 10 GiB total, 9 GiB usable; 8.2 GiB used is 91 %.
        let p = pressure(0, 100, 10 * G, 10 * G - (82 * G / 10));
        assert_eq!((p.machine_percent, p.level), (91, 2));
        let p = pressure(0, 100, 10 * G, 10 * G - 7 * G);
        assert_eq!((p.machine_percent, p.level), (77, 0));
        // Both: the higher wins.
        assert_eq!(pressure(85, 100, 10 * G, 10 * G - (82 * G / 10)).level, 2);
        // A zero budget can only be full.
        assert_eq!(pressure(1, 0, 10 * G, 10 * G).level, 2);
    }

    #[test]
    fn full_reasons_cross_each_bound() {
        let m = Measurements {
            pressure: 1,
            conns: 49,
            max_conns: 50,
            shards_behind: 1,
            shards: 2,
        };
        assert!(!full_reasons(&m).any());
        assert_eq!(
            full_reasons(&Measurements { conns: 50, ..m }).describe(),
            "conns"
        );
        assert_eq!(
            full_reasons(&Measurements { conns: 51, ..m }).describe(),
            "conns"
        );
        assert_eq!(
            full_reasons(&Measurements { pressure: 2, ..m }).describe(),
            "memory"
        );
        assert_eq!(
            full_reasons(&Measurements {
                shards_behind: 2,
                ..m
            })
            .describe(),
            "behind"
        );
        assert_eq!(
            full_reasons(&Measurements {
                pressure: 2,
                conns: 50,
                shards_behind: 2,
                ..m
            })
            .describe(),
            "memory+conns+behind"
        );
        assert_eq!(FullReasons::default().describe(), "none");
    }

    #[test]
    fn each_state_holds_a_second() {
        let mut h = AdmissionState::START;
        // The first decision applies at once.
        assert!(h.decide(true, 10_000));
        assert!(h.full);
        // Wanting out 999 ms later is not enough...
        assert!(!h.decide(false, 10_999));
        assert!(h.full);
        // ...1000 ms is.
        assert!(h.decide(false, 11_000));
        assert!(!h.full);
        // Flapping inputs give at most one change a second.
        let mut changes = 0;
        for t in 0..50 {
            changes += h.decide(t % 2 == 0, 11_000 + t * 100) as u32;
        }
        assert!(changes <= 5, "{changes} changes in 5 s");
        // The starting state holds nothing back: a node full 500 ms after start refuses then.
        let mut h = AdmissionState::START;
        assert!(!h.decide(false, 0));
        assert!(h.decide(true, 500));
        assert!(!h.decide(false, 1499));
        assert!(h.decide(false, 1500));
    }

    #[test]
    fn disk_low_is_the_lesser_of_a_tenth_and_2_gib() {
        // Small disk: a tenth rules.
        assert!(disk_low(99, 1000));
        assert!(!disk_low(100, 1000));
        // Large disk: 2 GiB rules.
        assert!(disk_low(2 * G - 1, 1000 * G));
        assert!(!disk_low(2 * G, 1000 * G));
    }
}
