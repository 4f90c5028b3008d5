//! Start-up refusals against the real binary: a second node on a port or a data directory
//! already served, a data directory that cannot be written, TLS on the plain listener's port,
//! `--check-config` running the same checks as a start, a log filter or a setting name with a
//! typo, and plain (uncoloured) logs when stderr is not a terminal. Each refusal is exit 78 and
//! one line naming the setting.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use support::*;

fn tmpdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("combd-startup-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A certificate and its key (and a key of another pair) in `dir`, for the TLS settings.
fn tls_files(dir: &Path) -> [(&'static str, String); 3] {
    std::fs::create_dir_all(dir).unwrap();
    let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key, wrong) = (
        dir.join("cert.pem"),
        dir.join("key.pem"),
        dir.join("other-key.pem"),
    );
    std::fs::write(&cert, pair.cert.pem()).unwrap();
    std::fs::write(&key, pair.key_pair.serialize_pem()).unwrap();
    std::fs::write(&wrong, other.key_pair.serialize_pem()).unwrap();
    let s = |p: PathBuf| p.to_str().unwrap().to_string();
    [("cert", s(cert)), ("key", s(key)), ("other-key", s(wrong))]
}

#[test]
fn a_second_node_on_a_served_port_or_data_directory_is_refused() {
    let first = TestNode::start(&[]);
    let port = first.port.to_string();
    let other_data = tmpdir("second");

    // The same address and port: SO_REUSEPORT would let it in and split the connections.
    let same = format!("127.0.0.2:{port}");
    let err = refused(&mut combd_command(&other_data, &[("COMBD_LISTEN", &same)]));
    assert!(err.starts_with("combd: COMBD_LISTEN: "), "{err}");
    assert!(
        err.contains(&format!("port {port} is already served")),
        "{err}"
    );
    // Another address on the port: the localhost listener 127.0.0.1:port would be shared.
    let other = format!("127.0.0.3:{port}");
    let err = refused(&mut combd_command(&other_data, &[("COMBD_LISTEN", &other)]));
    assert!(err.contains(&format!("COMBD_LISTEN: port {port}")), "{err}");

    // The same data directory on another port.
    let err = refused(&mut combd_command(&first.data_dir, &[]));
    assert!(err.starts_with("combd: COMBD_DATA: "), "{err}");
    assert!(
        err.contains(&format!(
            "{} is in use by another combd (pid {})",
            first.data_dir.display(),
            first.pid()
        )),
        "{err}"
    );

    // The first node kept its port and data to itself, and serves.
    for _ in 0..8 {
        let r = request(first.public(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(r.status, 200);
    }
    assert_eq!(first.stats()["pid"], first.pid());
    let _ = std::fs::remove_dir_all(&other_data);

    // Its death frees both (the kernel drops the locks): a restart on them starts.
    let data = first.kill9();
    let again = TestNode::start_in(data, &[("COMBD_LISTEN", &same)]);
    assert_eq!(again.port.to_string(), port);
}

#[test]
fn a_second_node_on_a_served_tls_port_is_refused() {
    let dir = tmpdir("tls-port");
    let [(_, cert), (_, key), _] = tls_files(&dir);
    let tls = [
        ("COMBD_TLS_LISTEN", "127.0.0.2:0"),
        ("COMBD_TLS_CERT", cert.as_str()),
        ("COMBD_TLS_KEY", key.as_str()),
    ];
    let first = TestNode::start(&tls);
    let taken = format!("127.0.0.2:{}", first.tls_port.unwrap());
    let err = refused(&mut combd_command(
        &dir.join("data"),
        &[
            ("COMBD_TLS_LISTEN", taken.as_str()),
            ("COMBD_TLS_CERT", cert.as_str()),
            ("COMBD_TLS_KEY", key.as_str()),
        ],
    ));
    assert!(err.starts_with("combd: COMBD_TLS_LISTEN: port "), "{err}");
    assert_eq!(
        request(first.local(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status,
        200
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tls_on_the_listen_port_is_refused() {
    let dir = tmpdir("tls-same");
    let [(_, cert), (_, key), _] = tls_files(&dir);
    let addr = format!("127.0.0.2:{}", free_port());
    let env = [
        ("COMBD_LISTEN", addr.as_str()),
        ("COMBD_TLS_LISTEN", addr.as_str()),
        ("COMBD_TLS_CERT", cert.as_str()),
        ("COMBD_TLS_KEY", key.as_str()),
    ];
    let err = refused(&mut combd_command(&dir.join("data"), &env));
    assert!(err.starts_with("combd: COMBD_TLS_LISTEN: "), "{err}");
    assert!(err.contains("port of COMBD_LISTEN"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_data_path_that_is_a_file_is_not_a_directory() {
    let dir = tmpdir("file");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("data");
    std::fs::write(&file, b"not a directory").unwrap();
    let err = refused(&mut combd_command(&file, &[]));
    assert_eq!(
        err.trim(),
        format!("combd: COMBD_DATA: {} is not a directory", file.display())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unwritable_data_directory_is_refused() {
    // Root writes through any mode bits; a read-only filesystem stops it too.
    let Some(disk) = SmallDisk::mount("1m") else {
        return;
    };
    let data = disk.data_dir();
    std::fs::create_dir_all(data.join("objects")).unwrap();
    let fresh = disk.0.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    disk.remount_read_only();

    // Its objects directory exists but takes no file.
    let err = refused(&mut combd_command(&data, &[]));
    assert!(
        err.starts_with(&format!(
            "combd: COMBD_DATA: cannot write in {}",
            data.join("objects").display()
        )),
        "{err}"
    );
    assert!(err.contains("Read-only file system"), "{err}");
    // A directory whose objects directory cannot be created.
    let err = refused(&mut combd_command(&fresh, &[]));
    assert!(
        err.starts_with(&format!(
            "combd: COMBD_DATA: cannot create {}",
            fresh.join("objects").display()
        )),
        "{err}"
    );
    // --check-config runs the same check.
    let err = refused(combd_command(&data, &[]).arg("--check-config"));
    assert!(
        err.starts_with("combd: COMBD_DATA: cannot write in"),
        "{err}"
    );
}

#[test]
fn check_config_runs_the_checks_of_a_start() {
    let dir = tmpdir("check");
    let [(_, cert), (_, key), (_, other_key)] = tls_files(&dir);
    let data = dir.join("data");
    let check = |env: &[(&str, &str)]| {
        let mut cmd = combd_command(&data, env);
        cmd.arg("--check-config");
        cmd
    };
    let missing = dir.join("missing.pem");
    let missing = missing.to_str().unwrap();
    let tls = |listen: &'static str, cert: &str, key: &str| {
        vec![
            ("COMBD_TLS_LISTEN", listen.to_string()),
            ("COMBD_TLS_CERT", cert.to_string()),
            ("COMBD_TLS_KEY", key.to_string()),
        ]
    };
    for (env, expect) in [
        (
            tls("127.0.0.2:8443", missing, &key),
            format!("combd: COMBD_TLS_CERT: cannot read {missing}"),
        ),
        (
            tls("127.0.0.2:8443", &cert, missing),
            format!("combd: COMBD_TLS_KEY: cannot read {missing}"),
        ),
        (
            tls("127.0.0.2:8443", &cert, &other_key),
            "combd: COMBD_TLS_KEY: the key does not match the certificate".to_string(),
        ),
        (
            {
                let mut e = tls("127.0.0.2:8080", &cert, &key);
                e.push(("COMBD_LISTEN", "127.0.0.2:8080".to_string()));
                e
            },
            "combd: COMBD_TLS_LISTEN: 127.0.0.2:8080 has the port of COMBD_LISTEN".to_string(),
        ),
        (
            vec![("COMBD_MAX_AWAK", "5".to_string())],
            "combd: COMBD_MAX_AWAK: is not a setting; did you mean COMBD_MAX_AWAKE?".to_string(),
        ),
    ] {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let err = refused(&mut check(&env));
        assert!(err.starts_with(&expect), "expected {expect:?}, got {err:?}");
    }
    // The same files, matching, on their own port: valid.
    let env = tls("127.0.0.2:8443", &cert, &key);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let out = run_to_exit(&mut check(&env));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("the settings are valid"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_log_level_typo_is_refused() {
    let dir = tmpdir("log");
    let err = refused(&mut combd_command(&dir, &[("COMBD_LOG", "verbose")]));
    assert!(
        err.starts_with("combd: COMBD_LOG: \"verbose\" is not a log level"),
        "{err}"
    );
    let err = refused(&mut combd_command(&dir, &[("COMBD_LOG", "combd_shards")]));
    assert!(err.starts_with("combd: COMBD_LOG: "), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_setting_is_refused_naming_the_closest() {
    let dir = tmpdir("unknown");
    let err = refused(&mut combd_command(&dir, &[("COMBD_MAX_AWAK", "5")]));
    assert_eq!(
        err.trim(),
        "combd: COMBD_MAX_AWAK: is not a setting; did you mean COMBD_MAX_AWAKE?"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn logs_to_a_file_have_no_colour_codes() {
    let dir = tmpdir("colour");
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("stderr.log");
    let file = std::fs::File::create(&log).unwrap();
    let node = TestNode::start_with(
        dir.join("data"),
        &[("COMBD_LOG", "info"), ("NO_COLOR", "")],
        Stdio::from(file),
    );
    // The "serving" line is written before the ready line the start waited for.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("serving"), "{text}");
    assert!(!text.contains('\x1b'), "colour codes in a file: {text:?}");
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
