//! What the settings table says of one setting ([`SettingSpec`]), and the small traits that turn
//! a setting's value into the text `--check-config` prints and the number `/stats` shows.

use super::*;

/// One setting: its variable, its flag, its default, its unit, its name under `/stats`
/// `limits`, what it means, and how its value in force is read. Every field is written by the
/// table in `table.rs`; nothing else lists settings.
#[derive(Clone, Copy)]
pub struct SettingSpec {
    /// The environment variable, e.g. `COMBD_LISTEN`.
    pub env: &'static str,
    /// The command-line flag, e.g. `--listen`.
    pub flag: &'static str,
    /// What the setting is when it is not given.
    pub default: DefaultValue,
    /// What kind of number it is, or [`Unit::Text`] when it is not a number.
    pub unit: Unit,
    /// Its name and value under `limits` in `/stats`: every number is a limit there; a text
    /// setting (an address, a path, a name, a switch) is not.
    pub limit: Option<Limit>,
    /// One line on what it does.
    pub meaning: &'static str,
    /// Its effective value as `--check-config` prints it.
    pub value: fn(&Settings) -> String,
}

impl fmt::Debug for SettingSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SettingSpec")
            .field("env", &self.env)
            .field("flag", &self.flag)
            .field("default", &self.default_text())
            .field("unit", &self.unit)
            .field("limit", &self.limit.map(|l| l.name))
            .finish_non_exhaustive()
    }
}

impl SettingSpec {
    /// The default as `--help` and README.md write it: a value in the form the setting takes
    /// (`1M`, `10s`, `0.0.0.0:8080`), or how it is found when it is not a fixed value.
    pub fn default_text(&self) -> String {
        match self.default {
            DefaultValue::Value(text) => text(),
            DefaultValue::Described(text) => text.to_string(),
        }
    }
}

/// What a setting is when it is not given.
#[derive(Clone, Copy)]
pub enum DefaultValue {
    /// A fixed value (a constant of [`limits`] where there is one), written as the setting
    /// takes it: the value in force when the setting is not given.
    Value(fn() -> String),
    /// Computed at start-up, or off: how, in words.
    Described(&'static str),
}

/// What kind of number a setting is; it decides how its default is written and that its
/// `/stats` name says its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Bytes: written with K, M, G or T where exact; its `/stats` name ends in `_bytes`.
    Bytes,
    /// A duration: `/stats` shows milliseconds and its name ends in `_ms`.
    Duration,
    /// A plain count or rate.
    Count,
    /// Not a number: an address, a path, a name, a switch. Not a limit in `/stats`.
    Text,
}

impl Unit {
    /// A number of this unit (milliseconds for a duration) as a setting takes it: `1M` for
    /// 1048576 bytes, `10s` for 10000 ms, `2500ms` for 2500 ms.
    pub fn human(self, n: u64) -> String {
        match self {
            Unit::Bytes => ["T", "G", "M", "K"]
                .iter()
                .zip([40, 30, 20, 10])
                .find(|(_, shift)| n != 0 && n.is_multiple_of(1u64 << shift))
                .map_or(n.to_string(), |(suffix, shift)| {
                    format!("{}{suffix}", n >> shift)
                }),
            Unit::Duration if n.is_multiple_of(1000) => format!("{}s", n / 1000),
            Unit::Duration => format!("{n}ms"),
            Unit::Count | Unit::Text => n.to_string(),
        }
    }
}

/// A setting's name and value under `limits` in `/stats`.
#[derive(Debug, Clone, Copy)]
pub struct Limit {
    /// Its name there (and in `/metrics`' `combd_limit` labels).
    pub name: &'static str,
    /// Its value in force: what was set, or what the node derived at start-up (a connection
    /// cap clamped to the descriptors, a budget computed from memory).
    pub value: fn(&Settings, &InForce) -> u64,
}

/// The values a node derives at start-up from its settings and its machine, which some
/// limits show instead of what was set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InForce {
    /// The public connection cap: `COMBD_MAX_CONNS` clamped ([`Settings::max_conns_effective`]).
    pub max_conns: u64,
    /// The memory budget: `COMBD_MEMORY_BUDGET`, else the cgroup's limit, else RAM.
    pub memory_budget_bytes: u64,
    /// The outbound budget of each shard ([`limits::outbound_budget_per_shard`]).
    pub outbound_budget_bytes: u64,
    /// The inbound budget of each shard ([`limits::inbound_budget_per_shard`]).
    pub inbound_budget_bytes: u64,
}

/// What computing a setting may need to know of the machine.
#[derive(Debug, Clone, Copy)]
pub struct Context {
    /// How many CPUs this process may run on.
    pub allowed_cpus: usize,
}

/// A setting's value as `--check-config` prints it.
pub trait Show {
    /// The value as text: durations in milliseconds, sizes in bytes.
    fn show(&self) -> String;
}

impl Show for Duration {
    fn show(&self) -> String {
        format!("{}ms", self.as_millis())
    }
}

impl Show for PathBuf {
    fn show(&self) -> String {
        self.display().to_string()
    }
}

/// A backup target that may be `off` (`COMBD_BACKUP`).
impl Show for Option<super::BackupTarget> {
    fn show(&self) -> String {
        self.as_ref().map_or("off".to_string(), |t| t.to_string())
    }
}

macro_rules! show_by_display {
    ($($t:ty),*) => {
        $(impl Show for $t {
            fn show(&self) -> String {
                self.to_string()
            }
        })*
    };
}
show_by_display!(u64, u32, usize, String, SocketAddr);

/// A number setting's value as `/stats` shows it.
pub trait AsLimit {
    /// The value as a number: durations in milliseconds.
    fn as_limit(&self) -> u64;
}

impl AsLimit for Duration {
    fn as_limit(&self) -> u64 {
        u64::try_from(self.as_millis()).unwrap_or(u64::MAX)
    }
}

impl AsLimit for u64 {
    fn as_limit(&self) -> u64 {
        *self
    }
}

impl AsLimit for u32 {
    fn as_limit(&self) -> u64 {
        u64::from(*self)
    }
}

impl AsLimit for usize {
    fn as_limit(&self) -> u64 {
        *self as u64
    }
}
