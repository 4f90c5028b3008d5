//! What the settings table shows that is not one setting's own value: the limits computed
//! from a setting, and the values in force of settings that have none when their group is off.

use super::*;

/// The limits `/stats` shows that no one setting is, but that are computed from one.
pub const DERIVED_LIMITS: &[Limit] = &[Limit {
    name: "object_create_burst",
    value: |s, _| {
        s.object_create_rate
            .saturating_mul(limits::OBJECT_CREATE_BURST_SECONDS)
    },
}];

/// A budget's value as `--check-config` prints it: the bytes set, else where it comes from.
pub(super) fn given_or(value: &Option<u64>, derived: &str) -> String {
    value.map_or(derived.to_string(), |b| b.to_string())
}

/// The fleet's lease TTL in force, or the default when the fleet is off.
pub(super) fn lease_ttl(s: &Settings) -> Duration {
    s.fleet
        .as_ref()
        .map_or(limits::FLEET_LEASE_TTL_DEFAULT, |f| f.lease_ttl)
}

pub(super) fn fleet_object_idle(s: &Settings) -> Duration {
    s.fleet
        .as_ref()
        .map_or(limits::FLEET_OBJECT_IDLE_DEFAULT, |f| f.object_idle)
}

/// A fleet setting's value as `--check-config` prints it: `none` with the fleet off, or the
/// setting not given.
pub(super) fn fleet_shown(
    s: &Settings,
    value: impl Fn(&FleetSettings) -> Option<String>,
) -> String {
    s.fleet
        .as_ref()
        .and_then(value)
        .unwrap_or_else(|| "none".into())
}
