//! The node's admission state as the coordinator publishes it: levels in atomics, read by the
//! shards without locks (they re-read it when the coordinator wakes them, and on every accept).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};

use combd_kernel::admission::FullReasons;

/// What the coordinator measured and decided. Written by the coordinator only.
#[derive(Debug, Default)]
pub struct Admission {
    /// 1 while the node refuses at TCP (`tcp_refusing`).
    pub refusing: AtomicBool,
    /// The reasons the node would be full now ([`FullReasons`] bits).
    pub full_reasons: AtomicU8,
    /// Memory pressure, 0, 1 or 2.
    pub pressure: AtomicU8,
    /// What combd counts as its own memory.
    pub memory_own_bytes: AtomicU64,
    /// The process's resident set.
    pub memory_rss_bytes: AtomicU64,
    /// Own memory as a percentage of the budget.
    pub memory_own_percent: AtomicU64,
    /// The memory budget.
    pub memory_budget_bytes: AtomicU64,
    /// `MemTotal`.
    pub machine_total_bytes: AtomicU64,
    /// `MemAvailable`.
    pub machine_available_bytes: AtomicU64,
    /// The machine's used memory as a percentage of the machine less its tenth.
    pub machine_percent: AtomicU64,
    /// The kernel's TCP buffer memory (machine-wide, `/proc/net/sockstat`).
    pub tcp_kernel_bytes: AtomicU64,
    /// Times the node stopped listening.
    pub listen_stops: AtomicU64,
    /// 1 while the data disk is low.
    pub disk_low: AtomicBool,
    /// Free bytes on the data disk.
    pub disk_free_bytes: AtomicU64,
    /// Measurements taken.
    pub measurements: AtomicU64,
}

impl Admission {
    /// Whether the node refuses new public connections.
    #[inline]
    pub fn refusing(&self) -> bool {
        self.refusing.load(Ordering::Relaxed)
    }

    /// Whether the data disk is low (new objects get 507).
    #[inline]
    pub fn disk_low(&self) -> bool {
        self.disk_low.load(Ordering::Relaxed)
    }

    /// `full_reason` as text.
    pub fn full_reason(&self) -> String {
        FullReasons(self.full_reasons.load(Ordering::Relaxed)).describe()
    }
}
