//! The settings table's own tests: what each row declares is consistent with what the node
//! does with it.

use super::*;

#[test]
fn every_number_is_a_limit_named_with_its_unit_and_text_is_not() {
    let fixed: Vec<&str> = limits::FIXED.iter().map(|f| f.name).collect();
    let mut names = Vec::new();
    for s in SETTINGS {
        match (s.unit, s.limit) {
            (Unit::Text, None) => {}
            (Unit::Text, Some(l)) => panic!("{}: text, yet /stats limit {}", s.env, l.name),
            (unit, None) => panic!("{}: a number ({unit:?}) missing from /stats limits", s.env),
            (unit, Some(l)) => {
                let suffix = match unit {
                    Unit::Bytes => Some("_bytes"),
                    Unit::Duration => Some("_ms"),
                    Unit::Count | Unit::Text => None,
                };
                if let Some(suffix) = suffix {
                    assert!(
                        l.name.ends_with(suffix),
                        "{}: {} needs {suffix}",
                        s.env,
                        l.name
                    );
                }
                names.push(l.name);
            }
        }
    }
    names.extend(DERIVED_LIMITS.iter().map(|l| l.name));
    for n in &names {
        assert!(!fixed.contains(n), "{n} is also a fixed limit");
    }
    let count = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), count, "a /stats limit name twice");
}

#[test]
fn every_flag_is_its_variable_in_lower_case() {
    let mut envs: Vec<&str> = SETTINGS.iter().map(|s| s.env).collect();
    for s in SETTINGS {
        let rest = s.env.strip_prefix("COMBD_").expect("a COMBD_ variable");
        assert_eq!(
            s.flag,
            format!("--{}", rest.to_ascii_lowercase().replace('_', "-")),
            "{}",
            s.env
        );
    }
    envs.sort_unstable();
    envs.dedup();
    assert_eq!(envs.len(), SETTINGS.len(), "a setting twice");
}

/// The fleet's settings on (or an `s3://` backup's, for its own), so that a group's members
/// with defaults may be given too.
fn group_on(extra: Option<(&'static str, &str)>) -> Settings {
    let backup = extra.is_some_and(|(e, _)| e.starts_with("COMBD_BACKUP_S3_"));
    let mut env: Vec<(&str, &str)> = if backup { BACKUP_S3 } else { FLEET }.to_vec();
    env.extend(extra);
    load(&env, &[]).unwrap_or_else(|e| panic!("{extra:?}: {e}"))
}

#[test]
fn a_default_as_help_writes_it_is_the_value_used_when_not_given() {
    let values = |s: &Settings| -> Vec<String> { s.describe().into_iter().map(|d| d.1).collect() };
    let fleet_defaults = values(&group_on(None));
    let backup_defaults = values(&load(BACKUP_S3, &[]).unwrap());
    let mut checked = 0;
    for s in SETTINGS {
        let DefaultValue::Value(text) = s.default else {
            continue;
        };
        let text = text();
        let given = group_on(Some((s.env, &text)));
        assert_eq!(given.sources[s.env], Source::Env);
        let defaults = match s.env.starts_with("COMBD_BACKUP_S3_") {
            true => &backup_defaults,
            false => &fleet_defaults,
        };
        assert_eq!(&values(&given), defaults, "{}: --help says {text}", s.env);
        checked += 1;
    }
    assert!(checked >= 30, "{checked} defaults checked");
}

#[test]
fn a_computed_default_is_none_until_start_up_derives_it() {
    let s = load(&[], &[]).unwrap();
    for env in [
        "COMBD_MEMORY_BUDGET",
        "COMBD_OUTBOUND_BUDGET",
        "COMBD_INBOUND_BUDGET",
    ] {
        let spec = SETTINGS.iter().find(|s| s.env == env).unwrap();
        assert!(matches!(spec.default, DefaultValue::Described(_)), "{env}");
        assert!((spec.value)(&s).starts_with("(from"), "{env}");
    }
    assert_eq!(
        (
            s.memory_budget_bytes,
            s.inbound_budget_bytes,
            s.outbound_budget_bytes
        ),
        (None, None, None)
    );
}

#[test]
fn limits_show_every_number_setting_in_force() {
    let s = load(
        &[("COMBD_MAX_BODY", "2K"), ("COMBD_HEADER_TIMEOUT", "1500ms")],
        &["--object-create-rate", "7", "--max-conns", "900"],
    )
    .unwrap();
    let in_force = InForce {
        max_conns: 123,
        memory_budget_bytes: 4 << 30,
        outbound_budget_bytes: 5,
        inbound_budget_bytes: 6,
    };
    let limits: BTreeMap<&str, u64> = s.limits(&in_force).into_iter().collect();
    let wanted = SETTINGS.iter().filter(|s| s.limit.is_some()).count() + DERIVED_LIMITS.len();
    assert_eq!(limits.len(), wanted);
    assert_eq!(limits["max_body_bytes"], 2048);
    assert_eq!(limits["header_timeout_ms"], 1500);
    assert_eq!(limits["object_create_rate"], 7);
    assert_eq!(
        limits["object_create_burst"],
        7 * limits::OBJECT_CREATE_BURST_SECONDS
    );
    assert_eq!(limits["max_conns_per_address"], 1024);
    assert_eq!(limits["shards"], 2);
    assert_eq!(
        limits["fleet_lease_ttl_ms"],
        limits::FLEET_LEASE_TTL_DEFAULT.as_limit()
    );
    // What the node derived, not what was set.
    assert_eq!(limits["max_conns"], 123);
    assert_eq!(limits["memory_budget_bytes"], 4 << 30);
    assert_eq!(limits["outbound_budget_bytes"], 5);
    assert_eq!(limits["inbound_budget_bytes"], 6);
}

#[test]
fn defaults_are_written_as_the_setting_takes_them() {
    assert_eq!(Unit::Bytes.human(1 << 20), "1M");
    assert_eq!(Unit::Bytes.human(3 << 30), "3G");
    assert_eq!(Unit::Bytes.human(1536), "1536");
    assert_eq!(Unit::Bytes.human(1), "1");
    assert_eq!(Unit::Duration.human(10_000), "10s");
    assert_eq!(Unit::Duration.human(2_500), "2500ms");
    assert_eq!(Unit::Count.human(200_000), "200000");
    let help = help_text();
    for s in SETTINGS {
        let line = format!(
            "{:<22} {:<22} default: {}\n",
            s.flag,
            s.env,
            s.default_text()
        );
        assert!(help.contains(&line), "--help lacks {line:?}");
    }
}
