//! The fleet settings' tests.

use super::*;

fn fleet_with(
    changes: &[(&'static str, Option<&'static str>)],
) -> Vec<(&'static str, &'static str)> {
    let mut env: Vec<(&str, &str)> = FLEET.to_vec();
    for (name, value) in changes {
        env.retain(|(k, _)| k != name);
        if let Some(v) = value {
            env.push((name, v));
        }
    }
    env
}

#[test]
fn the_fleet_is_off_by_default_and_its_ttl_default_is_the_limits_file() {
    let s = load(&[], &[]).unwrap();
    assert_eq!(s.fleet, None);
    let described = s.describe();
    let value = |name: &str| {
        described
            .iter()
            .find(|(n, _, _)| *n == name)
            .unwrap()
            .1
            .clone()
    };
    assert_eq!(value("COMBD_FLEET_ETCD"), "off");
    assert_eq!(value("COMBD_FLEET_NODE"), "none");
    // The table's default text parses to the limits file's default.
    let default = SETTINGS
        .iter()
        .find(|s| s.env == "COMBD_FLEET_LEASE_TTL")
        .unwrap()
        .default_text();
    assert_eq!(
        parse_lease_ttl(&default),
        Ok(limits::FLEET_LEASE_TTL_DEFAULT)
    );
    let on = load(FLEET, &[]).unwrap().fleet.unwrap();
    assert_eq!(on.lease_ttl, limits::FLEET_LEASE_TTL_DEFAULT);
    assert_eq!(on.object_idle, limits::FLEET_OBJECT_IDLE_DEFAULT);
    let idle = SETTINGS
        .iter()
        .find(|s| s.env == "COMBD_FLEET_OBJECT_IDLE")
        .unwrap()
        .default_text();
    assert_eq!(
        parse_object_idle(&idle),
        Ok(limits::FLEET_OBJECT_IDLE_DEFAULT)
    );
}

#[test]
fn the_fleet_on_reads_every_setting() {
    let s = load(&fleet_with(&[("COMBD_FLEET_LEASE_TTL", Some("5s"))]), &[]).unwrap();
    let region = load(
        &fleet_with(&[("COMBD_FLEET_BUCKET_REGION", Some("us-east-1"))]),
        &[],
    );
    assert_eq!(region.unwrap().fleet.unwrap().bucket_region, "us-east-1");
    let f = s.fleet.clone().unwrap();
    assert_eq!(f.etcd, ["http://127.0.0.1:2379", "http://127.0.0.2:2379"]);
    assert_eq!(f.bucket_url, "http://127.0.0.1:3900");
    assert_eq!(f.bucket, "combd-objects");
    assert_eq!(f.bucket_region, "garage", "the default region");
    assert_eq!(f.access_key, "GK0123");
    assert_eq!(f.secret_key_file, PathBuf::from("/etc/combd/bucket.secret"));
    assert_eq!(f.node.to_string(), "10.0.0.2:7946");
    assert_eq!(f.lease_ttl, Duration::from_secs(5));
    assert_eq!(s.sources["COMBD_FLEET_ETCD"], Source::Env);
    // A flag works as for every setting, and wins.
    let s = load(FLEET, &["--fleet-lease-ttl", "7s"]).unwrap();
    assert_eq!(s.fleet.unwrap().lease_ttl, Duration::from_secs(7));
    assert_eq!(s.sources["COMBD_FLEET_LEASE_TTL"], Source::Flag);
    // --check-config shows the secret's file, never a secret.
    let described = load(FLEET, &[]).unwrap().describe();
    assert!(described
        .iter()
        .any(|(n, v, _)| *n == "COMBD_FLEET_SECRET_KEY_FILE" && v == "/etc/combd/bucket.secret"));
}

#[test]
fn a_half_configured_fleet_fails_naming_what_is_missing_or_stray() {
    for name in fleet::REQUIRED_WITH_ETCD {
        let e = load(&fleet_with(&[(name, None)]), &[]).unwrap_err();
        assert_eq!(e.setting, *name, "{e}");
        assert!(e.message.contains("required with COMBD_FLEET_ETCD"), "{e}");
        // Blank is missing too.
        let e = load(&fleet_with(&[(name, Some("  "))]), &[]).unwrap_err();
        assert_eq!(e.setting, *name, "{e}");
    }
    // Without the coordinator, any other fleet setting is refused rather than ignored.
    for name in fleet::REQUIRED_WITH_ETCD
        .iter()
        .chain(fleet::OPTIONAL_WITH_ETCD)
    {
        let e = load(&[(name, "10s")], &[]).unwrap_err();
        assert_eq!(e.setting, *name, "{e}");
        assert!(e.message.contains("COMBD_FLEET_ETCD is not"), "{e}");
    }
}

#[test]
fn fleet_values_are_validated_naming_the_setting() {
    // The fleet listener needs a port of its own: on COMBD_LISTEN's, its address's public
    // connections would be served past admission.
    let e = load(
        &fleet_with(&[("COMBD_FLEET_NODE", Some("10.0.0.2:8080"))]),
        &[],
    )
    .unwrap_err();
    assert_eq!(e.setting, "COMBD_FLEET_NODE", "{e}");
    assert!(e.message.contains("port of its own"), "{e}");
    for (name, bad) in [
        ("COMBD_FLEET_ETCD", ""),
        ("COMBD_FLEET_ETCD", "127.0.0.1:2379,"),
        ("COMBD_FLEET_ETCD", "127.0.0.1:2379,http://127.0.0.1:2379"),
        ("COMBD_FLEET_ETCD", "127.0.0.1"),
        ("COMBD_FLEET_ETCD", "127.0.0.1:0"),
        ("COMBD_FLEET_ETCD", "unix:///run/etcd.sock"),
        ("COMBD_FLEET_BUCKET_URL", "ftp://s3.example:21"),
        (
            "COMBD_FLEET_ETCD",
            "https://127.0.0.1:2379,http://127.0.0.2:2379",
        ),
        ("COMBD_FLEET_BUCKET_URL", "http://127.0.0.1:3900/path"),
        ("COMBD_FLEET_BUCKET_URL", "127.0.0.1:3900"),
        ("COMBD_FLEET_BUCKET_URL", "http://127.0.0.1:99999"),
        ("COMBD_FLEET_BUCKET", "ab"),
        ("COMBD_FLEET_BUCKET", "Objects"),
        ("COMBD_FLEET_BUCKET", "-objects"),
        ("COMBD_FLEET_BUCKET", "objects_1"),
        ("COMBD_FLEET_ACCESS_KEY", "GK 0123"),
        ("COMBD_FLEET_NODE", "0.0.0.0:8080"),
        ("COMBD_FLEET_NODE", "10.0.0.2:0"),
        ("COMBD_FLEET_NODE", "node-a:8080"),
        ("COMBD_FLEET_LEASE_TTL", "0s"),
        ("COMBD_FLEET_LEASE_TTL", "1500ms"),
        ("COMBD_FLEET_LEASE_TTL", "soon"),
        ("COMBD_FLEET_OBJECT_IDLE", "0s"),
        ("COMBD_FLEET_OBJECT_IDLE", "999ms"),
        ("COMBD_FLEET_OBJECT_IDLE", "2h"),
        ("COMBD_FLEET_OBJECT_IDLE", "a while"),
        ("COMBD_FLEET_BUCKET_REGION", "US East"),
        ("COMBD_FLEET_BUCKET_REGION", ""),
    ] {
        let e = load(&fleet_with(&[(name, Some(bad))]), &[]).unwrap_err();
        assert_eq!(e.setting, name, "{bad:?}: {e}");
    }
}

#[test]
fn tls_and_etcd_users_need_https_and_come_in_pairs() {
    let https: &[(&str, Option<&str>)] = &[
        (
            "COMBD_FLEET_ETCD",
            Some("https://127.0.0.1:2379,https://127.0.0.2:2379"),
        ),
        ("COMBD_FLEET_BUCKET_URL", Some("https://s3.example:443")),
    ];
    let with = |more: &[(&'static str, Option<&'static str>)]| {
        let mut all = https.to_vec();
        all.extend_from_slice(more);
        load(&fleet_with(&all), &[])
    };
    // Plain HTTP with none of them, as before.
    let plain = load(FLEET, &[]).unwrap().fleet.unwrap();
    assert_eq!(
        (plain.etcd_client_cert, plain.etcd_user, plain.ca_file),
        (None, None, None)
    );
    let f = with(&[
        ("COMBD_FLEET_ETCD_CERT_FILE", Some("/etc/combd/etcd.pem")),
        ("COMBD_FLEET_ETCD_KEY_FILE", Some("/etc/combd/etcd.key")),
        ("COMBD_FLEET_ETCD_USER", Some("combd")),
        (
            "COMBD_FLEET_ETCD_PASSWORD_FILE",
            Some("/etc/combd/etcd.password"),
        ),
        ("COMBD_FLEET_CA_FILE", Some("/etc/combd/ca.pem")),
    ])
    .unwrap()
    .fleet
    .unwrap();
    assert_eq!(f.etcd, ["https://127.0.0.1:2379", "https://127.0.0.2:2379"]);
    assert_eq!(f.bucket_url, "https://s3.example:443");
    assert_eq!(
        f.etcd_client_cert,
        Some(("/etc/combd/etcd.pem".into(), "/etc/combd/etcd.key".into()))
    );
    assert_eq!(
        f.etcd_user,
        Some(("combd".into(), "/etc/combd/etcd.password".into()))
    );
    assert_eq!(f.ca_file, Some("/etc/combd/ca.pem".into()));
    // One of a pair without the other names the missing one.
    for (given, missing) in [
        ("COMBD_FLEET_ETCD_CERT_FILE", "COMBD_FLEET_ETCD_KEY_FILE"),
        ("COMBD_FLEET_ETCD_KEY_FILE", "COMBD_FLEET_ETCD_CERT_FILE"),
        ("COMBD_FLEET_ETCD_USER", "COMBD_FLEET_ETCD_PASSWORD_FILE"),
        ("COMBD_FLEET_ETCD_PASSWORD_FILE", "COMBD_FLEET_ETCD_USER"),
    ] {
        let e = with(&[(given, Some("x"))]).unwrap_err();
        assert_eq!(e.setting, missing, "{e}");
        assert!(e.message.contains("required with"), "{e}");
    }
    // Over plain HTTP a password would cross the network readable, a client certificate
    // would never be shown: refused, not ignored.
    let e = load(
        &fleet_with(&[
            ("COMBD_FLEET_ETCD_USER", Some("combd")),
            ("COMBD_FLEET_ETCD_PASSWORD_FILE", Some("/p")),
        ]),
        &[],
    )
    .unwrap_err();
    assert_eq!(e.setting, "COMBD_FLEET_ETCD_USER", "{e}");
    assert!(e.message.contains("https://"), "{e}");
    let e = load(
        &fleet_with(&[
            ("COMBD_FLEET_ETCD_CERT_FILE", Some("/c")),
            ("COMBD_FLEET_ETCD_KEY_FILE", Some("/k")),
        ]),
        &[],
    )
    .unwrap_err();
    assert_eq!(e.setting, "COMBD_FLEET_ETCD_CERT_FILE", "{e}");
    let e = load(&fleet_with(&[("COMBD_FLEET_CA_FILE", Some("/ca"))]), &[]).unwrap_err();
    assert_eq!(e.setting, "COMBD_FLEET_CA_FILE", "{e}");
    // A bucket over https alone is reason enough for a CA file.
    let bucket_only = load(
        &fleet_with(&[
            ("COMBD_FLEET_BUCKET_URL", Some("https://127.0.0.1:3901")),
            ("COMBD_FLEET_CA_FILE", Some("/ca")),
        ]),
        &[],
    );
    assert_eq!(
        bucket_only.unwrap().fleet.unwrap().ca_file,
        Some("/ca".into())
    );
    let e = with(&[
        ("COMBD_FLEET_ETCD_USER", Some("com bd")),
        ("COMBD_FLEET_ETCD_PASSWORD_FILE", Some("/p")),
    ])
    .unwrap_err();
    assert_eq!(e.setting, "COMBD_FLEET_ETCD_USER", "{e}");
}

#[test]
fn the_lease_ttl_bounds_hold_at_min_and_max() {
    let secs = |n: u64| format!("{n}s");
    let min = limits::FLEET_LEASE_TTL_MIN.as_secs();
    let max = limits::FLEET_LEASE_TTL_MAX.as_secs();
    assert!(parse_lease_ttl(&secs(min - 1))
        .unwrap_err()
        .contains("out of range"));
    assert_eq!(parse_lease_ttl(&secs(min)), Ok(limits::FLEET_LEASE_TTL_MIN));
    assert_eq!(
        parse_lease_ttl(&secs(min + 1)),
        Ok(Duration::from_secs(min + 1))
    );
    assert_eq!(
        parse_lease_ttl(&secs(max - 1)),
        Ok(Duration::from_secs(max - 1))
    );
    assert_eq!(parse_lease_ttl(&secs(max)), Ok(limits::FLEET_LEASE_TTL_MAX));
    assert!(parse_lease_ttl(&secs(max + 1))
        .unwrap_err()
        .contains("out of range"));
    assert_eq!(parse_lease_ttl("1m"), Ok(Duration::from_secs(60)));
}

#[test]
fn etcd_endpoints_are_bounded() {
    let list = |n: usize| {
        (1..=n)
            .map(|i| format!("127.0.0.{i}:2379"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let max = limits::FLEET_ETCD_ENDPOINTS_MAX;
    assert_eq!(parse_etcd_endpoints(&list(max - 1)).unwrap().len(), max - 1);
    assert_eq!(parse_etcd_endpoints(&list(max)).unwrap().len(), max);
    assert!(parse_etcd_endpoints(&list(max + 1))
        .unwrap_err()
        .contains(&format!("at most {max}")));
}

#[test]
fn a_public_fleet_address_is_refused_unless_asked_for() {
    for public in [
        "8.8.8.8:7946",
        "[2001:db8::1]:7946",
        "[::ffff:8.8.8.8]:7946",
        "100.128.0.1:7946",
        "198.20.0.1:7946",
    ] {
        let e = load(&fleet_with(&[("COMBD_FLEET_NODE", Some(public))]), &[]).unwrap_err();
        assert_eq!(e.setting, "COMBD_FLEET_NODE", "{public}: {e}");
        assert!(e.message.contains("COMBD_FLEET_NODE_PUBLIC=on"), "{e}");
        let on = fleet_with(&[
            ("COMBD_FLEET_NODE", Some(public)),
            ("COMBD_FLEET_NODE_PUBLIC", Some("on")),
        ]);
        let f = load(&on, &[]).unwrap().fleet.unwrap();
        assert!(f.node_public, "{public}");
    }
    for private in [
        "127.0.0.2:7946",
        "10.1.2.3:7946",
        "172.31.0.1:7946",
        "192.168.1.1:7946",
        "100.64.0.1:7946",
        "169.254.1.1:7946",
        "198.19.255.1:7946",
        "[::1]:7946",
        "[fd00::1]:7946",
        "[fe80::1]:7946",
        "[::ffff:10.0.0.1]:7946",
    ] {
        let f = load(&fleet_with(&[("COMBD_FLEET_NODE", Some(private))]), &[]);
        assert!(!f.unwrap().fleet.unwrap().node_public, "{private}");
    }
    let e = load(
        &fleet_with(&[("COMBD_FLEET_NODE_PUBLIC", Some("yes please"))]),
        &[],
    )
    .unwrap_err();
    assert_eq!(e.setting, "COMBD_FLEET_NODE_PUBLIC", "{e}");
}

#[test]
fn a_fleet_node_refuses_a_database_bound_past_what_it_restores() {
    let past = (limits::FLEET_DB_MAX_BYTES + 1).to_string();
    let env: Vec<(&str, &str)> = FLEET
        .iter()
        .copied()
        .chain([("COMBD_DB_MAX", past.as_str())])
        .collect();
    let e = load(&env, &[]).unwrap_err();
    assert_eq!(e.setting, "COMBD_DB_MAX", "{e}");
    assert!(e.message.contains("fleet_db_max_bytes"), "{e}");
    // Alone, the same bound is fine; in a fleet, the most it restores is.
    assert!(load(&[("COMBD_DB_MAX", past.as_str())], &[]).is_ok());
    let at = limits::FLEET_DB_MAX_BYTES.to_string();
    let env: Vec<(&str, &str)> = FLEET
        .iter()
        .copied()
        .chain([("COMBD_DB_MAX", at.as_str())])
        .collect();
    assert!(load(&env, &[]).is_ok());
}

/// `COMBD_BACKUP` is a node alone's: refused beside a fleet, and inside the data directory it
/// must outlive; its retention is at least a minute, and takes days.
#[test]
fn backup_is_for_a_node_alone_outside_its_data_with_a_retention_of_a_minute_or_more() {
    let s = load(&[], &[]).unwrap();
    assert_eq!(
        (s.backup.clone(), s.backup_retention),
        (None, limits::BACKUP_RETENTION_DEFAULT)
    );
    let s = load(
        &[
            ("COMBD_BACKUP", "/srv/backup"),
            ("COMBD_BACKUP_RETENTION", "30d"),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(
        s.backup,
        Some(BackupTarget::Dir(std::path::PathBuf::from("/srv/backup")))
    );
    assert_eq!(s.backup_retention, Duration::from_secs(30 * 86_400));
    let refused = |env: &[(&str, &str)]| load(env, &[]).unwrap_err();
    let e = refused(&[("COMBD_BACKUP_RETENTION", "59s")]);
    assert_eq!(e.setting, "COMBD_BACKUP_RETENTION", "{e}");
    let e = refused(&[
        ("COMBD_DATA", "/srv/data"),
        ("COMBD_BACKUP", "/srv/data/backup"),
    ]);
    assert!(
        e.setting == "COMBD_BACKUP" && e.message.contains("inside COMBD_DATA"),
        "{e}"
    );
    assert_eq!(refused(&[("COMBD_BACKUP", "")]).setting, "COMBD_BACKUP");
    let mut fleet = fleet_with(&[]);
    fleet.push(("COMBD_BACKUP", "/srv/backup"));
    let e = refused(&fleet);
    assert!(
        e.setting == "COMBD_BACKUP" && e.message.contains("fleet"),
        "{e}"
    );
}

/// An `s3://` backup names a bucket and a prefix, and needs the `COMBD_BACKUP_S3_*` settings and
/// the key that seals what it stores; those mean nothing without it.
#[test]
fn an_s3_backup_needs_its_bucket_settings_and_they_need_it() {
    let s3 = [
        ("COMBD_BACKUP", "s3://combd-backups/node-1/"),
        ("COMBD_BACKUP_S3_URL", "http://127.0.0.1:3900"),
        ("COMBD_BACKUP_S3_ACCESS_KEY", "GK123"),
        ("COMBD_BACKUP_S3_SECRET_KEY_FILE", "/etc/combd/s3.secret"),
        ("COMBD_BACKUP_KEY_FILE", "/etc/combd/backup.key"),
    ];
    let s = load(&s3, &[]).unwrap();
    assert_eq!(
        s.backup,
        Some(BackupTarget::Bucket {
            bucket: "combd-backups".into(),
            prefix: "node-1/".into()
        })
    );
    let b = s.backup_s3.clone().unwrap();
    assert_eq!(
        (b.url.as_str(), b.region.as_str(), b.access_key.as_str()),
        (
            "http://127.0.0.1:3900",
            limits::FLEET_BUCKET_REGION_DEFAULT,
            "GK123"
        )
    );
    let with = |name: &str, value: Option<&str>| -> Vec<(&str, String)> {
        let mut env: Vec<(&str, String)> = s3
            .iter()
            .filter(|(n, _)| *n != name)
            .map(|(n, v)| (*n, v.to_string()))
            .collect();
        if let Some(v) = value {
            env.push((
                s3.iter().find(|(n, _)| *n == name).unwrap().0,
                v.to_string(),
            ));
        }
        env
    };
    let refused = |env: Vec<(&str, String)>| {
        let env: Vec<(&str, &str)> = env.iter().map(|(n, v)| (*n, v.as_str())).collect();
        load(&env, &[]).unwrap_err()
    };
    for (name, value, blamed) in [
        ("COMBD_BACKUP", Some("s3://ab"), "COMBD_BACKUP"),
        (
            "COMBD_BACKUP",
            Some("s3://combd-backups/a//b"),
            "COMBD_BACKUP",
        ),
        (
            "COMBD_BACKUP",
            Some("s3://combd-backups/../x"),
            "COMBD_BACKUP",
        ),
        ("COMBD_BACKUP", Some("/srv/backup"), "COMBD_BACKUP_S3_URL"),
        ("COMBD_BACKUP_S3_URL", None, "COMBD_BACKUP_S3_ACCESS_KEY"),
        (
            "COMBD_BACKUP_S3_URL",
            Some("s3.example:9000"),
            "COMBD_BACKUP_S3_URL",
        ),
        ("COMBD_BACKUP_KEY_FILE", None, "COMBD_BACKUP_KEY_FILE"),
        (
            "COMBD_BACKUP_S3_ACCESS_KEY",
            Some("a b"),
            "COMBD_BACKUP_S3_ACCESS_KEY",
        ),
    ] {
        let e = refused(with(name, value));
        assert_eq!(e.setting, blamed, "{name}={value:?}: {e}");
    }
    let e = refused(vec![("COMBD_BACKUP", "s3://combd-backups".to_string())]);
    assert!(
        e.setting == "COMBD_BACKUP" && e.message.contains("COMBD_BACKUP_S3_URL"),
        "{e}"
    );
}
