//! The limits one call of a cell can trip, typed: what each answers, whether it kills the
//! call, and the counter it is filed under. Nothing matches a limit by its name.

use std::sync::atomic::AtomicU64;

use crate::stats::ShardStats;

/// A limit a call of a cell tripped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `COMBD_CPU_LIMIT_TICKS`: the call counted too many ticks.
    Cpu,
    /// The call's host calls (SQL) took more than `HOST_TIME_LIMIT` in all.
    HostTime,
    /// One SQL statement ran past `SQL_STATEMENT_LIMIT`.
    SqlTimeout,
    /// A SQL value past `SQL_VALUE_MAX_BYTES` (SQLite refused the statement).
    TooBig,
    /// The database reached `COMBD_DB_MAX` (SQLite refused the write).
    DbFull,
    /// The call held more than its app's `memory_kb`.
    Memory,
    /// The call queued more than `SENDS_MAX_BYTES` of sends.
    Send,
    /// The call's SQL ran a statement the node does not allow apps (`cells/sandbox.rs`).
    SqlDenied,
}

impl Limit {
    /// Every kind, for tests and documentation.
    pub const ALL: [Limit; 8] = [
        Limit::Cpu,
        Limit::HostTime,
        Limit::SqlTimeout,
        Limit::TooBig,
        Limit::DbFull,
        Limit::Memory,
        Limit::Send,
        Limit::SqlDenied,
    ];

    /// The error message a client sees (`{"error": "<this>"}`).
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Cpu => "cpu_limit",
            Limit::HostTime => "host_time",
            Limit::SqlTimeout => "sql_timeout",
            Limit::TooBig => "too_big",
            Limit::DbFull => "db_full",
            Limit::Memory => "memory_limit",
            Limit::Send => "send_limit",
            Limit::SqlDenied => "sql_denied",
        }
    }

    /// The HTTP status the call answers with.
    pub fn status(self) -> u16 {
        match self {
            Limit::TooBig => 413,
            Limit::DbFull => 507,
            _ => 500,
        }
    }

    /// Whether tripping it kills the call: its object is reloaded from its database so nothing
    /// of the call survives. The others are refusals the app saw as an error and survived.
    pub fn kills(self) -> bool {
        matches!(
            self,
            Limit::Cpu | Limit::HostTime | Limit::SqlTimeout | Limit::Memory
        )
    }

    /// The counter in `/stats` a trip is filed under.
    pub fn counter(self, stats: &ShardStats) -> &AtomicU64 {
        match self {
            Limit::Cpu => &stats.cpu_limit_killed,
            Limit::HostTime => &stats.host_time_killed,
            Limit::SqlTimeout => &stats.sql_timeouts,
            Limit::TooBig => &stats.sql_too_big,
            Limit::DbFull => &stats.db_full,
            Limit::Memory => &stats.memory_limit_killed,
            Limit::Send => &stats.send_limit_refused,
            Limit::SqlDenied => &stats.sql_denied,
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_limit_has_its_own_counter_and_name() {
        let stats = ShardStats::default();
        for (i, a) in Limit::ALL.iter().enumerate() {
            for b in &Limit::ALL[i + 1..] {
                assert_ne!(a.as_str(), b.as_str());
                assert!(!std::ptr::eq(a.counter(&stats), b.counter(&stats)));
            }
        }
        assert_eq!(Limit::TooBig.status(), 413);
        assert_eq!(Limit::DbFull.status(), 507);
        assert!(Limit::Cpu.kills() && !Limit::Send.kills() && !Limit::DbFull.kills());
    }
}
