//! The settings' tests, on fixture environments and arguments.

use super::*;

fn load(env: &[(&str, &str)], args: &[&str]) -> Result<Settings, ConfigError> {
    let env: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    Settings::load(|k| env.get(k).cloned(), &args, 2).map(|(_, s)| s)
}

#[test]
fn defaults_match_the_limits_file() {
    let s = load(&[], &[]).expect("defaults are valid");
    assert_eq!(s.listen.to_string(), limits::LISTEN_DEFAULT);
    assert_eq!(s.max_body_bytes, limits::MAX_BODY_DEFAULT_BYTES);
    assert_eq!(s.header_timeout, limits::HEADER_TIMEOUT_DEFAULT);
    assert_eq!(s.body_timeout, limits::BODY_TIMEOUT_DEFAULT);
    assert_eq!(s.idle_timeout, limits::IDLE_TIMEOUT_DEFAULT);
    assert_eq!(s.ws_max_message_bytes, limits::WS_MAX_MESSAGE_DEFAULT_BYTES);
    assert_eq!(s.shutdown_timeout, limits::SHUTDOWN_TIMEOUT_DEFAULT);
    assert_eq!(s.max_conns, limits::MAX_CONNS_DEFAULT);
    assert_eq!(s.max_awake, limits::MAX_AWAKE_DEFAULT);
    assert_eq!(s.max_open_objects, limits::MAX_OPEN_OBJECTS_DEFAULT);
    assert_eq!(
        u64::from(s.max_conns_per_address),
        limits::MAX_CONNS_PER_ADDRESS_DEFAULT
    );
    assert_eq!(
        u64::from(s.accept_rate_per_address),
        limits::ACCEPT_RATE_PER_ADDRESS_DEFAULT
    );
    assert_eq!(s.restores_at_once, limits::RESTORES_AT_ONCE_DEFAULT);
    assert!(s.sqlite_sync_full);
    assert_eq!(s.cpu_limit_ticks, limits::CPU_LIMIT_TICKS_DEFAULT);
    assert_eq!(s.db_max_bytes, limits::DB_MAX_BYTES);
    assert_eq!(s.max_objects_per_app, limits::MAX_OBJECTS_PER_APP_DEFAULT);
    assert_eq!(s.object_create_rate, limits::OBJECT_CREATE_RATE_DEFAULT);
    assert_eq!(s.ws_rate, limits::WS_RATE_DEFAULT);
    assert_eq!(s.ws_burst, limits::WS_BURST_DEFAULT);
    assert_eq!(
        s.tls_handshake_timeout,
        limits::TLS_HANDSHAKE_TIMEOUT_DEFAULT
    );
    assert_eq!(s.tls_hello_timeout, limits::TLS_HELLO_TIMEOUT_DEFAULT);
    assert_eq!(s.ws_ping_interval, limits::WS_PING_INTERVAL_DEFAULT);
    assert_eq!(s.ws_slow_timeout, limits::WS_SLOW_TIMEOUT_DEFAULT);
    assert_eq!(s.shards, 2);
    assert_eq!(s.log, limits::LOG_DEFAULT);
    assert!(s.sources.values().all(|s| *s == Source::Default));
}

#[test]
fn the_inbound_budget_is_the_setting_else_a_quarter_of_memory_split_over_shards() {
    let s = load(&[("COMBD_INBOUND_BUDGET", "3M")], &[]).unwrap();
    assert_eq!(s.inbound_budget_bytes, Some(3 << 20));
    assert_eq!(
        limits::inbound_budget_per_shard(s.inbound_budget_bytes, 8 << 30, 4),
        3 << 20
    );
    assert_eq!(
        limits::inbound_budget_per_shard(None, 8 << 30, 4),
        512 << 20
    );
    assert_eq!(limits::inbound_budget_per_shard(None, 0, 0), 1);
}

#[test]
fn the_table_text_matches_the_limits_file() {
    // The table's meanings quote fixed limits as text; they must say what the limits are.
    let meaning = |env: &str| SETTINGS.iter().find(|s| s.env == env).unwrap().meaning;
    assert!(meaning("COMBD_MEMORY_BUDGET").contains(&format!(
        "pressure 1 at {} %, 2 (refusing at TCP) at {} %",
        limits::PRESSURE_1_PERCENT,
        limits::PRESSURE_2_PERCENT
    )));
    assert!(
        meaning("COMBD_MAX_CONNS").contains(&format!("less a reserve of {}", limits::FD_RESERVE))
    );
    assert!(meaning("COMBD_INBOUND_BUDGET").contains(&format!(
        "less than {} KiB waiting",
        limits::INBOUND_CONN_FLOOR_BYTES / 1024
    )));
    assert!(meaning("COMBD_MAX_CONNS").contains(&format!(
        "localhost listener's own {}",
        limits::LOCAL_CONNS_MAX
    )));
    assert!(meaning("COMBD_CPU_LIMIT_TICKS").contains(&format!(
        "each host call counts {}",
        limits::HOST_CALL_TICKS
    )));
}

#[test]
fn flag_wins_over_env() {
    let s = load(&[("COMBD_MAX_BODY", "2M")], &["--max-body", "3M"]).unwrap();
    assert_eq!(s.max_body_bytes, 3 << 20);
    assert_eq!(s.sources["COMBD_MAX_BODY"], Source::Flag);
    let s = load(&[("COMBD_MAX_BODY", "2M")], &["--listen=127.0.0.2:0"]).unwrap();
    assert_eq!(s.max_body_bytes, 2 << 20);
    assert_eq!(s.sources["COMBD_MAX_BODY"], Source::Env);
    assert_eq!(s.listen.to_string(), "127.0.0.2:0");
}

#[test]
fn zero_and_garbage_fail_naming_the_setting() {
    for (name, bad) in [
        ("COMBD_MAX_BODY", "0"),
        ("COMBD_MAX_BODY", "12Q"),
        ("COMBD_MAX_BODY", "-1"),
        ("COMBD_MAX_OPEN_OBJECTS", "0"),
        ("COMBD_MAX_CONNS_PER_ADDRESS", "0"),
        ("COMBD_MAX_CONNS_PER_ADDRESS", "4294967296"),
        ("COMBD_ACCEPT_RATE_PER_ADDRESS", "0"),
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "0"),
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "101"),
        ("COMBD_CLIENT_SHARE_MAX_PERCENT", "ten"),
        ("COMBD_CLIENT_SHARE_MIN_PERCENT", "0"),
        ("COMBD_CLIENT_SHARE_MIN_PERCENT", "1.5"),
        ("COMBD_HEADER_TIMEOUT", "0s"),
        ("COMBD_HEADER_TIMEOUT", "soon"),
        ("COMBD_IDLE_TIMEOUT", "5 parsecs"),
        ("COMBD_WS_MAX_MESSAGE", "0K"),
        ("COMBD_SHUTDOWN_TIMEOUT", "0"),
        ("COMBD_MAX_CONNS", "0"),
        ("COMBD_MAX_CONNS", "many"),
        ("COMBD_MEMORY_BUDGET", "0"),
        ("COMBD_MEMORY_BUDGET", "lots"),
        ("COMBD_MEMORY_BUDGET", "1.5G"),
        ("COMBD_MAX_AWAKE", "0"),
        ("COMBD_RESTORES_AT_ONCE", "0"),
        ("COMBD_SQLITE_SYNC", "off"),
        ("COMBD_CPU_LIMIT_TICKS", "0"),
        ("COMBD_DB_MAX", "0"),
        ("COMBD_MAX_OBJECTS_PER_APP", "0"),
        ("COMBD_MAX_OBJECTS_PER_APP", "lots"),
        ("COMBD_OBJECT_CREATE_RATE", "0"),
        ("COMBD_OBJECT_CREATE_RATE", "1.5"),
        ("COMBD_TLS_HANDSHAKE_TIMEOUT", "0"),
        ("COMBD_TLS_HELLO_TIMEOUT", "0"),
        ("COMBD_TLS_HELLO_TIMEOUT", "0ms"),
        ("COMBD_TLS_HELLO_TIMEOUT", "soon"),
        ("COMBD_WS_PING_INTERVAL", "0s"),
        ("COMBD_WS_SLOW_TIMEOUT", "0"),
        ("COMBD_TLS_LISTEN", "nowhere"),
        ("COMBD_TLS_CERT", "/x.pem"),
        ("COMBD_TLS_KEY", "/x.pem"),
        ("COMBD_WS_RATE", "0"),
        ("COMBD_WS_BURST", "-5"),
        ("COMBD_OUTBOUND_BUDGET", "0"),
        ("COMBD_INBOUND_BUDGET", "0"),
        ("COMBD_INBOUND_BUDGET", "a lot"),
        ("COMBD_SHARDS", "0"),
        ("COMBD_SHARDS", "3"),
        ("COMBD_LISTEN", "80800"),
        ("COMBD_LISTEN", ":http"),
        ("COMBD_LISTEN", "127.0.0.1:8080"),
        ("COMBD_LOG", " "),
        ("COMBD_DATA", ""),
        ("COMBD_ALLOWED_ORIGINS", ""),
        ("COMBD_ALLOWED_ORIGINS", "app.example.com"),
        ("COMBD_ALLOWED_ORIGINS", "https://app.example.com/"),
        (
            "COMBD_ALLOWED_ORIGINS",
            "https://a.example,,https://b.example",
        ),
        ("COMBD_ALLOWED_ORIGINS", "https://a.example,*"),
    ] {
        let e = load(&[(name, bad)], &[]).expect_err(&format!("{name}={bad:?} must fail"));
        assert_eq!(e.setting, name, "{name}={bad:?}: {e}");
        assert!(e.to_string().starts_with(name));
    }
}

#[test]
fn the_object_bounds_are_counts_and_zero_is_refused_naming_them() {
    let s = load(
        &[("COMBD_MAX_OBJECTS_PER_APP", "3")],
        &["--object-create-rate", "1"],
    )
    .unwrap();
    assert_eq!((s.max_objects_per_app, s.object_create_rate), (3, 1));
    assert_eq!(s.sources["COMBD_MAX_OBJECTS_PER_APP"], Source::Env);
    assert_eq!(s.sources["COMBD_OBJECT_CREATE_RATE"], Source::Flag);
    for name in ["COMBD_MAX_OBJECTS_PER_APP", "COMBD_OBJECT_CREATE_RATE"] {
        let e = load(&[(name, "0")], &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{name}: must be at least 1 (zero does not mean unlimited)")
        );
    }
    let e = load(&[], &["--max-objects-per-app", "0"]).unwrap_err();
    assert_eq!(e.setting, "COMBD_MAX_OBJECTS_PER_APP");
    // The table's meaning quotes the bucket's size: it must say what the limits file says.
    let meaning = SETTINGS
        .iter()
        .find(|s| s.env == "COMBD_OBJECT_CREATE_RATE")
        .unwrap()
        .meaning;
    assert!(meaning.contains(&format!(
        "holding {} s of it",
        limits::OBJECT_CREATE_BURST_SECONDS
    )));
}

#[test]
fn a_clients_share_is_in_percent_and_its_floor_is_at_most_its_cap() {
    let s = load(&[], &[]).unwrap();
    assert_eq!(
        s.shares().max_percent,
        limits::CLIENT_SHARE_MAX_PERCENT_DEFAULT
    );
    assert_eq!(
        s.shares().min_percent,
        limits::CLIENT_SHARE_MIN_PERCENT_DEFAULT
    );
    let s = load(&[("COMBD_CLIENT_SHARE_MAX_PERCENT", "100%")], &[]).unwrap();
    assert_eq!(s.client_share_max_percent, 100);
    let s = load(&[], &["--client-share-min-percent", "10"]).unwrap();
    assert_eq!(s.client_share_min_percent, 10);
    let e = load(&[("COMBD_CLIENT_SHARE_MIN_PERCENT", "11")], &[]).unwrap_err();
    assert_eq!(e.setting, "COMBD_CLIENT_SHARE_MIN_PERCENT", "{e}");
    assert!(
        e.message.contains("COMBD_CLIENT_SHARE_MAX_PERCENT is 10"),
        "{e}"
    );
}

#[test]
fn the_tls_hello_timeout_may_not_exceed_the_handshake_timeout() {
    // Larger than the default handshake timeout, and than one set lower.
    for (env, args) in [
        (vec![("COMBD_TLS_HELLO_TIMEOUT", "11s")], vec![]),
        (vec![("COMBD_TLS_HANDSHAKE_TIMEOUT", "300ms")], vec![]),
        (
            vec![("COMBD_TLS_HANDSHAKE_TIMEOUT", "1s")],
            vec!["--tls-hello-timeout", "1001ms"],
        ),
    ] {
        let e = load(&env, &args).expect_err(&format!("{env:?} {args:?} must fail"));
        assert_eq!(e.setting, "COMBD_TLS_HELLO_TIMEOUT", "{e}");
        assert!(e.message.contains("COMBD_TLS_HANDSHAKE_TIMEOUT"), "{e}");
    }
    // A handshake timeout set below the hello's default says so.
    let e = load(&[("COMBD_TLS_HANDSHAKE_TIMEOUT", "300ms")], &[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "COMBD_TLS_HELLO_TIMEOUT: 2000ms (the default) is longer than \
         COMBD_TLS_HANDSHAKE_TIMEOUT (300ms): both run from the accept, and the ClientHello is \
         part of the handshake; set it to at most 300ms"
    );
    // Equal or shorter is fine, and the flag is read like every other.
    let s = load(
        &[("COMBD_TLS_HANDSHAKE_TIMEOUT", "300ms")],
        &["--tls-hello-timeout", "300ms"],
    )
    .unwrap();
    assert_eq!(s.tls_hello_timeout, Duration::from_millis(300));
    assert_eq!(s.sources["COMBD_TLS_HELLO_TIMEOUT"], Source::Flag);
    let s = load(&[("COMBD_TLS_HELLO_TIMEOUT", "500ms")], &[]).unwrap();
    assert_eq!(s.tls_hello_timeout, Duration::from_millis(500));
    assert_eq!(
        s.tls_handshake_timeout,
        limits::TLS_HANDSHAKE_TIMEOUT_DEFAULT
    );
}

#[test]
fn unknown_flag_and_missing_value_fail() {
    assert_eq!(load(&[], &["--nope"]).unwrap_err().setting, "--nope");
    assert_eq!(
        load(&[], &["--max-body"]).unwrap_err().setting,
        "COMBD_MAX_BODY"
    );
}

#[test]
fn memory_budget_takes_units() {
    assert_eq!(load(&[], &[]).unwrap().memory_budget_bytes, None);
    let s = load(&[("COMBD_MEMORY_BUDGET", "512M")], &[]).unwrap();
    assert_eq!(s.memory_budget_bytes, Some(512 << 20));
    let s = load(&[], &["--memory-budget", "4G"]).unwrap();
    assert_eq!(s.memory_budget_bytes, Some(4 << 30));
}

#[test]
fn tls_needs_its_listener_cert_and_key() {
    assert_eq!(load(&[], &[]).unwrap().tls, None);
    let e = load(&[("COMBD_TLS_LISTEN", "0.0.0.0:8443")], &[]).unwrap_err();
    assert_eq!(e.setting, "COMBD_TLS_CERT");
    let e = load(
        &[
            ("COMBD_TLS_LISTEN", "0.0.0.0:8443"),
            ("COMBD_TLS_CERT", "/c.pem"),
        ],
        &[],
    )
    .unwrap_err();
    assert_eq!(e.setting, "COMBD_TLS_KEY");
    let s = load(
        &[
            ("COMBD_TLS_LISTEN", "0.0.0.0:8443"),
            ("COMBD_TLS_CERT", "/c.pem"),
            ("COMBD_TLS_KEY", "/k.pem"),
        ],
        &[],
    )
    .unwrap();
    assert_eq!(s.tls.unwrap().listen.port(), 8443);
}

#[test]
fn tls_may_not_share_the_listen_port() {
    let tls = |listen: &str, tls: &str| {
        load(
            &[
                ("COMBD_LISTEN", listen),
                ("COMBD_TLS_LISTEN", tls),
                ("COMBD_TLS_CERT", "/c.pem"),
                ("COMBD_TLS_KEY", "/k.pem"),
            ],
            &[],
        )
    };
    let e = tls("0.0.0.0:8080", "0.0.0.0:8080").unwrap_err();
    assert_eq!(e.setting, "COMBD_TLS_LISTEN");
    assert!(e.message.contains("port of COMBD_LISTEN"), "{e}");
    // Another address on the same port still shares the localhost listener 127.0.0.1:port.
    let e = tls("127.0.0.2:8080", "127.0.0.3:8080").unwrap_err();
    assert_eq!(e.setting, "COMBD_TLS_LISTEN");
    tls("0.0.0.0:8080", "0.0.0.0:8443").expect("distinct ports");
    tls("127.0.0.2:0", "127.0.0.2:0").expect("port 0 picks two free ports");
}

#[test]
fn log_takes_levels_and_target_level_directives_only() {
    for good in [
        "info",
        "WARN",
        "off",
        "warn,combd_shards=debug",
        "combd_shards::conn=trace, info",
    ] {
        parse_log(good).unwrap_or_else(|e| panic!("{good:?}: {e}"));
    }
    assert_eq!(
        parse_log(" Warn , combd_shards::conn=DEBUG ").unwrap(),
        "warn,combd_shards::conn=debug"
    );
    for bad in [
        "verbose",
        "",
        "info,",
        "combd_shards",
        "combd_shards=loud",
        "=debug",
        "a b=info",
        "[span]=info",
        "3",
    ] {
        assert!(parse_log(bad).is_err(), "{bad:?} must be refused");
    }
    assert!(parse_log("verbose")
        .unwrap_err()
        .contains("\"verbose\" is not a log level"));
    assert_eq!(
        load(&[("COMBD_LOG", "verbose")], &[]).unwrap_err().setting,
        "COMBD_LOG"
    );
}

#[test]
fn the_access_log_is_off_stderr_or_a_path() {
    assert_eq!(load(&[], &[]).unwrap().access_log, AccessLogSink::Off);
    for (text, sink) in [
        ("off", AccessLogSink::Off),
        ("stderr", AccessLogSink::Stderr),
        (
            "/var/log/combd/access.log",
            AccessLogSink::File("/var/log/combd/access.log".into()),
        ),
        ("access.log", AccessLogSink::File("access.log".into())),
    ] {
        let s = load(&[("COMBD_ACCESS_LOG", text)], &[]).unwrap();
        assert_eq!(s.access_log, sink, "{text}");
        assert_eq!(s.access_log.show(), text);
    }
    for bad in ["", " access.log", "access.log\n"] {
        let e = load(&[("COMBD_ACCESS_LOG", bad)], &[]).unwrap_err();
        assert_eq!(e.setting, "COMBD_ACCESS_LOG", "{bad:?}");
    }
}

#[test]
fn an_unknown_setting_names_the_closest_known_one() {
    let known = ["PATH", "HOME", "COMBD_MAX_AWAKE", "COMBD_LISTEN", "COMBDX"];
    check_env_names(known).expect("settings and other variables pass");
    for (typo, meant) in [
        ("COMBD_MAX_AWAK", "COMBD_MAX_AWAKE"),
        ("COMBD_LISTN", "COMBD_LISTEN"),
        ("COMBD_max_awake", "COMBD_MAX_AWAKE"),
        ("COMBD_TLS_CRT", "COMBD_TLS_CERT"),
        ("COMBD_SHARD", "COMBD_SHARDS"),
        ("COMBD_MAXBODY", "COMBD_MAX_BODY"),
        ("COMBD_WS_RATES", "COMBD_WS_RATE"),
    ] {
        let e = check_env_names(["PATH", typo]).unwrap_err();
        assert_eq!(e.setting, typo);
        assert_eq!(
            e.message,
            format!("is not a setting; did you mean {meant}?")
        );
    }
    let e = check_env_names(["COMBD_FROBNICATE"]).unwrap_err();
    assert_eq!(e.setting, "COMBD_FROBNICATE");
    assert_eq!(
        e.message,
        "is not a setting; see combd --help for the settings"
    );
    // Several: the first in sorted order, whatever the environment's order.
    let e = check_env_names(["COMBD_ZZ", "COMBD_LISTN"]).unwrap_err();
    assert_eq!(e.setting, "COMBD_LISTN");
}

#[test]
fn an_unknown_flag_names_the_closest_known_one() {
    let e = load(&[], &["--max-awak", "5"]).unwrap_err();
    assert_eq!(e.setting, "--max-awak");
    assert!(e.message.contains("did you mean --max-awake?"), "{e}");
    let e = load(&[], &["--frobnicate"]).unwrap_err();
    assert_eq!(e.message, "unknown argument (see --help)");
}

#[test]
fn byte_sizes() {
    assert_eq!(parse_bytes("1"), Ok(1));
    assert_eq!(parse_bytes("512M"), Ok(512 << 20));
    assert_eq!(parse_bytes("4G"), Ok(4 << 30));
    assert_eq!(parse_bytes("4g"), Ok(4 << 30));
    assert_eq!(parse_bytes("16KiB"), Ok(16 << 10));
    assert_eq!(parse_bytes("1T"), Ok(1 << 40));
    assert!(parse_bytes("99999999999T").is_err());
    assert!(parse_bytes("M").is_err());
    assert!(parse_bytes("1.5G").is_err());
}

#[test]
fn durations() {
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert!(parse_duration("0ms").is_err());
    assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
    assert!(parse_duration("1w").is_err());
}

#[test]
fn max_conns_is_clamped_to_the_fd_limit() {
    let s = load(&[], &[]).unwrap();
    assert_eq!(
        s.max_conns_effective(20_000),
        20_000
            - limits::FD_RESERVE
            - limits::LOCAL_CONNS_MAX
            - limits::MAX_OPEN_OBJECTS_DEFAULT * limits::OBJECT_FDS
    );
    assert_eq!(s.max_conns_effective(1_048_576), limits::MAX_CONNS_DEFAULT);
    let s = load(&[("COMBD_MAX_CONNS", "50")], &[]).unwrap();
    assert_eq!(s.max_conns_effective(20_000), 50);
    // Nothing left after the reserve and the localhost listener's cap: one, never zero.
    assert_eq!(s.max_conns_effective(100), 1);
}

#[test]
fn describe_covers_every_setting() {
    let s = load(&[("COMBD_MAX_BODY", "2K")], &["--check-config"]).unwrap();
    let d = s.describe();
    assert_eq!(d.len(), SETTINGS.len());
    assert!(d.iter().all(|(_, v, _)| v != "?"));
    assert!(d.contains(&("COMBD_MAX_BODY", "2048".to_string(), Source::Env)));
}

#[test]
fn help_lists_every_setting() {
    let h = help_text();
    for s in SETTINGS {
        assert!(
            h.contains(s.env) && h.contains(s.flag),
            "{} missing from --help",
            s.env
        );
    }
}

/// The fleet settings every fleet test starts from: all of them, valid.
const FLEET: &[(&str, &str)] = &[
    ("COMBD_FLEET_ETCD", "127.0.0.1:2379, http://127.0.0.2:2379"),
    ("COMBD_FLEET_BUCKET_URL", "http://127.0.0.1:3900/"),
    ("COMBD_FLEET_BUCKET", "combd-objects"),
    ("COMBD_FLEET_ACCESS_KEY", "GK0123"),
    ("COMBD_FLEET_SECRET_KEY_FILE", "/etc/combd/bucket.secret"),
    ("COMBD_FLEET_KEY_FILE", "/etc/combd/fleet.key"),
    ("COMBD_FLEET_NODE", "10.0.0.2:7946"),
];

/// An `s3://` backup's settings, all given.
const BACKUP_S3: &[(&str, &str)] = &[
    ("COMBD_BACKUP", "s3://combd-backups/node-1"),
    ("COMBD_BACKUP_S3_URL", "http://127.0.0.1:3900"),
    ("COMBD_BACKUP_S3_ACCESS_KEY", "GK0123"),
    (
        "COMBD_BACKUP_S3_SECRET_KEY_FILE",
        "/etc/combd/backup-s3.secret",
    ),
    ("COMBD_BACKUP_KEY_FILE", "/etc/combd/backup.key"),
];

mod fleet_settings;

mod table;

#[test]
fn allowed_origins_default_to_the_requests_own_host_and_take_a_list_or_star() {
    use crate::origins::AllowedOrigins;
    assert_eq!(
        load(&[], &[]).unwrap().allowed_origins,
        AllowedOrigins::SameHost
    );
    assert_eq!(
        load(&[("COMBD_ALLOWED_ORIGINS", "*")], &[])
            .unwrap()
            .allowed_origins,
        AllowedOrigins::Any
    );
    let s = load(
        &[],
        &[
            "--allowed-origins",
            "https://App.example:443,http://localhost:3000",
        ],
    )
    .unwrap();
    assert_eq!(
        s.allowed_origins,
        AllowedOrigins::List(vec![
            "https://app.example".to_string(),
            "http://localhost:3000".to_string()
        ])
    );
}

/// `:8080` and `8080`, as Caddy and nginx take a listen address: every IPv4 address.
#[test]
fn a_listen_port_alone_is_every_address() {
    for given in [":8080", "8080", " 8080 ", "0.0.0.0:8080"] {
        let s = load(&[("COMBD_LISTEN", given)], &[]).unwrap();
        assert_eq!(s.listen.to_string(), "0.0.0.0:8080", "{given:?}");
    }
    let s = load(&[], &["--listen", ":9090"]).unwrap();
    assert_eq!(s.listen.to_string(), "0.0.0.0:9090");
}
