//! The operator's surface: `combd top`, `/metrics` read by a Prometheus parser, the systemd
//! unit, the notify protocol (READY=1 after listening, WATCHDOG=1, STOPPING=1), and
//! `--check-config`.

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::process::Command;

use nix::fcntl::OFlag;
use nix::sys::termios::LocalFlags;

use support::*;

fn combd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_combd"))
}

#[test]
fn top_once_prints_every_shard() {
    let node = TestNode::start(&[("COMBD_SHARDS", "2")]);
    let out = combd()
        .args(["top", "--once", "--port", &node.port.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("accepting"), "{text}");
    assert!(text.lines().any(|l| l.trim_start().starts_with("shard")));
    for shard in ["0", "1"] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().next() == Some(shard)),
            "no row for shard {shard}: {text}"
        );
    }
    let out = combd()
        .args(["top", "--once", "--json", "--port", &node.port.to_string()])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["shards"].as_array().unwrap().len(), 2);
    // Nothing listening: a clear error and a failing status.
    let out = combd()
        .args(["top", "--once", "--port", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot reach"));
}

#[test]
fn top_shows_refusing_at_tcp() {
    let node = TestNode::start(&[("COMBD_MEMORY_BUDGET", "1M")]);
    wait_stats(&node, "refusing", |s| s["tcp_refusing"] == 1);
    let out = combd()
        .args(["top", "--once", "--port", &node.port.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("REFUSING AT TCP (memory)"), "{text}");
}

#[test]
fn metrics_parse_and_agree_with_stats() {
    let node = TestNode::start(&[("COMBD_SHARDS", "2")]);
    // Something stable to compare: an open WebSocket.
    let stream = connect(node.public());
    let url = format!("ws://127.0.0.2:{}/o/echo/m", node.port);
    let (_ws, _) = tungstenite::client(url.as_str(), stream).unwrap();
    let stats = wait_stats(&node, "the WebSocket to be open", |s| s["ws_open"] == 1);
    let text = request(node.local(), b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").text();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).expect("Prometheus text format");
    let value = |name: &str, shard: Option<&str>| -> f64 {
        let s = scrape
            .samples
            .iter()
            .find(|s| s.metric == name && shard.is_none_or(|sh| s.labels.get("shard") == Some(sh)))
            .unwrap_or_else(|| panic!("no sample {name} {shard:?}"));
        match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => panic!("{name} is not a number"),
        }
    };
    assert_eq!(
        value("combd_max_conns_effective", None) as u64,
        stats["max_conns_effective"].as_u64().unwrap()
    );
    assert_eq!(
        value("combd_memory_budget_bytes", None) as u64,
        stats["memory_budget_bytes"].as_u64().unwrap()
    );
    let ws: f64 = ["0", "1"]
        .iter()
        .map(|sh| value("combd_ws_open", Some(sh)))
        .sum();
    assert_eq!(ws as u64, 1);
    for (i, sh) in stats["shards"].as_array().unwrap().iter().enumerate() {
        let id = i.to_string();
        assert_eq!(
            value("combd_ws_open", Some(&id)) as u64,
            sh["ws_open"].as_u64().unwrap()
        );
        assert_eq!(
            value("combd_listening", Some(&id)) as u64,
            sh["listening"].as_u64().unwrap()
        );
    }
    // Every family has HELP and TYPE (a summary's _sum and _count are its family's);
    // counters end in _total.
    let docs: HashMap<_, _> = scrape.docs.iter().collect();
    for s in &scrape.samples {
        let family = ["_sum", "_count"]
            .iter()
            .find_map(|end| s.metric.strip_suffix(end))
            .filter(|f| docs.contains_key(&f.to_string()))
            .unwrap_or(&s.metric);
        assert!(
            docs.contains_key(&family.to_string()),
            "{} has no HELP",
            s.metric
        );
        if let prometheus_parse::Value::Counter(_) = s.value {
            assert!(s.metric.ends_with("_total"), "{}", s.metric);
        }
    }
}

/// The unit's text, if `systemd-analyze` is installed (else the test says it skips).
fn unit_if_analyzable() -> Option<String> {
    let Ok(which) = Command::new("systemd-analyze").arg("--version").output() else {
        support::skipped("systemd-analyze is not installed");
        return None;
    };
    assert!(which.status.success());
    Some(
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tools/combd.service"))
            .unwrap(),
    )
}

/// Runs `systemd-analyze <args> <unit>` on the unit as installed, with the binary this test
/// built in place of /usr/local/bin.
fn analyze(unit: &str, tag: &str, args: &[&str]) -> std::process::Output {
    let dir = std::env::temp_dir().join(format!("combd-unit-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("combd.service");
    std::fs::write(
        &path,
        unit.replace("/usr/local/bin/combd", env!("CARGO_BIN_EXE_combd")),
    )
    .unwrap();
    let out = Command::new("systemd-analyze")
        .args(args)
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    out
}

#[test]
fn the_systemd_unit_verifies() {
    let Some(unit) = unit_if_analyzable() else {
        return;
    };
    for line in [
        "Type=notify",
        "LimitNOFILE=1048576",
        "Restart=on-failure",
        "RestartPreventExitStatus=78",
        "#MemoryMax=",
    ] {
        assert!(unit.contains(line), "the unit lacks {line}");
    }
    let out = analyze(&unit, "verify", &["verify"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The unit runs unprivileged and confined: `systemd-analyze security` (offline, on the file)
/// rates its exposure at most 2.0 of 10 ("OK"; the unit as it was, run as root with nothing
/// confined, rated 9.6 "UNSAFE").
#[test]
fn the_systemd_unit_runs_unprivileged_and_confined() {
    let Some(unit) = unit_if_analyzable() else {
        return;
    };
    for line in [
        "DynamicUser=yes",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectHome=yes",
        "RestrictAddressFamilies=",
        "SystemCallFilter=@system-service io_uring_setup",
        "ExecReload=",
        "EnvironmentFile=-/etc/combd/env",
    ] {
        assert!(unit.contains(line), "the unit lacks {line}");
    }
    let out = analyze(&unit, "security", &["security", "--offline=yes"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("unrecognized option") || stderr.contains("Unknown command") {
        // `--offline` came with systemd 250.
        support::skipped(&format!(
            "this systemd-analyze cannot rate a unit file offline: {stderr}"
        ));
        return;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(score) = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for").nth(1))
        .and_then(|rest| rest.split(':').nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
    else {
        panic!(
            "no exposure level in: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    assert!(score <= 2.0, "exposure {score}: {text}");
}

#[test]
fn ready_after_listening_then_watchdog_then_stopping() {
    let path = std::env::temp_dir().join(format!("combd-notify-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let mut node = TestNode::start(&[
        ("NOTIFY_SOCKET", path.to_str().unwrap()),
        ("WATCHDOG_USEC", "200000"),
    ]);
    let mut buf = [0u8; 512];
    let mut next = || {
        let n = sock
            .recv(&mut buf)
            .expect("timed out waiting for a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let first = next();
    assert!(first.starts_with("READY=1"), "{first}");
    // READY came only once every shard listens: a connection succeeds right away.
    assert_eq!(
        request(node.public(), b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").status,
        200
    );
    let msg = next();
    assert_eq!(msg, "WATCHDOG=1");
    node.sigterm();
    loop {
        let m = next();
        if m == "STOPPING=1" {
            break;
        }
        assert_eq!(m, "WATCHDOG=1");
    }
    assert_eq!(node.wait_exit().code(), Some(0));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn check_config_prints_every_limit_and_its_source() {
    let out = combd()
        .arg("--check-config")
        .args(["--max-awake", "7"])
        .env("COMBD_MAX_BODY", "2K")
        .env(
            "COMBD_DATA",
            std::env::temp_dir().join("combd-check-config"),
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing: {text}"))
            .to_string()
    };
    assert!(row("COMBD_MAX_BODY")
        .split_whitespace()
        .eq(["COMBD_MAX_BODY", "2048", "env"]));
    assert!(row("COMBD_MAX_AWAKE")
        .split_whitespace()
        .eq(["COMBD_MAX_AWAKE", "7", "flag"]));
    assert!(row("COMBD_SHUTDOWN_TIMEOUT").ends_with("default"));
    // Every setting has its row: its name, its value, where it came from.
    for s in combd_kernel::settings::SETTINGS {
        let words: Vec<&str> = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(s.env))
            .unwrap_or_else(|| panic!("{} missing: {text}", s.env))
            .split_whitespace()
            .collect();
        assert!(
            words.len() >= 3 && ["default", "env", "flag"].contains(&words[words.len() - 1]),
            "{}'s row: {words:?}",
            s.env
        );
    }
    assert!(row("memory_budget_bytes")
        .split_whitespace()
        .last()
        .is_some_and(|src| ["cgroup1", "cgroup2", "ram"].contains(&src)));
    // And a bad setting fails it the same way as a start.
    let out = combd()
        .arg("--check-config")
        .env("COMBD_WS_RATE", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("COMBD_WS_RATE"));
}

/// A pipe whose reading end is already closed: every write to it fails with EPIPE.
fn closed_pipe() -> std::process::Stdio {
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).expect("pipe2");
    drop(read);
    write.into()
}

#[test]
fn output_stops_quietly_when_its_reader_goes_away() {
    let data = std::env::temp_dir().join(format!("combd-epipe-{}", std::process::id()));
    for arg in ["--check-config", "--help", "--version"] {
        // The reader is gone before the first line: `combd --check-config | head -0`.
        let mut cmd = combd();
        cmd.arg(arg)
            .env("COMBD_DATA", &data)
            .stdin(std::process::Stdio::null())
            .stdout(closed_pipe());
        // A panic on the closed pipe would be status 101 (its message goes to the test's stderr).
        assert_eq!(exit_within(cmd.spawn().unwrap()).code(), Some(0), "{arg}");
    }
    // `combd --check-config | head -1`: one line read, then the reader closes.
    let mut child = combd()
        .arg("--check-config")
        .env("COMBD_DATA", &data)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(child.stdout.take().unwrap());
    assert!(wait_line(&out, "the settings are valid").starts_with("combd "));
    drop(out);
    let status = exit_within(child);
    assert_eq!(status.code(), Some(0));
    let _ = std::fs::remove_dir_all(&data);
}

#[test]
fn top_json_ends_when_its_reader_goes_away() {
    let node = TestNode::start(&[]);
    let mut top = combd()
        .args(["top", "--json", "--port", &node.port.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = std::io::BufReader::new(top.stdout.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
    let v: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(v["pid"], node.pid());
    // `| head -1` closes the pipe: the next snapshot's write fails and top ends.
    drop(stdout);
    assert_eq!(exit_within(top).code(), Some(0));
}

#[test]
fn top_keeps_retrying_while_no_node_answers() {
    let port = free_port().to_string();
    let mut top = combd()
        .args(["top", "--port", &port])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(top.stdout.take().unwrap());
    let line = wait_line(&out, "node unreachable");
    assert!(line.ends_with("retrying"), "{line}");
    wait_line(&out, "node unreachable");
    assert!(top.try_wait().unwrap().is_none(), "top gave up");
    top.kill().unwrap();
    top.wait().unwrap();
}

#[test]
fn top_watches_a_restart() {
    let node = TestNode::start(&[]);
    let port = node.port.to_string();
    let mut top = combd()
        .args(["top", "--port", &port])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(top.stdout.take().unwrap());
    wait_line(&out, &format!("pid {}", node.pid()));
    let data = node.kill9();
    wait_line(&out, "node unreachable");
    let addr = format!("127.0.0.2:{port}");
    let again = TestNode::start_in(data, &[("COMBD_LISTEN", addr.as_str())]);
    wait_line(&out, &format!("pid {}", again.pid()));
    assert!(top.try_wait().unwrap().is_none());
    top.kill().unwrap();
    top.wait().unwrap();
}

/// A pseudo-terminal: the master end, and the path of the terminal end.
fn open_pty() -> (std::fs::File, std::path::PathBuf) {
    use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
    let master =
        posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC).expect("posix_openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let path = ptsname_r(&master).expect("ptsname_r");
    let fd = std::os::fd::OwnedFd::from(master);
    (std::fs::File::from(fd), path.into())
}

fn lflag(terminal: &std::fs::File) -> LocalFlags {
    nix::sys::termios::tcgetattr(terminal)
        .expect("tcgetattr")
        .local_flags
}

#[test]
fn q_quits_top_and_restores_the_terminal() {
    let (mut master, path) = open_pty();
    let terminal = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    assert!(
        lflag(&terminal).contains(LocalFlags::ICANON),
        "a new terminal is canonical"
    );
    let port = free_port().to_string();
    let mut top = combd()
        .args(["top", "--port", &port])
        .stdin(terminal.try_clone().unwrap())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = lines(top.stdout.take().unwrap());
    wait_line(&out, "node unreachable");
    // Raw before its first line: keys arrive one by one, unechoed.
    let raw = lflag(&terminal);
    assert!(
        !raw.intersects(LocalFlags::ICANON | LocalFlags::ECHO),
        "stdin not in raw mode"
    );
    std::io::Write::write_all(&mut master, b"q").unwrap();
    assert_eq!(exit_within(top).code(), Some(0));
    let restored = lflag(&terminal);
    assert!(
        restored.contains(LocalFlags::ICANON | LocalFlags::ECHO),
        "the terminal was not restored"
    );
}

/// `--check-config` creates nothing and logs nothing of its own: not the data directory, not
/// the compiled-module cache, not the access log's file, not a "module deployed" line; it
/// still checks each module. Its
/// columns line up, whatever the names' lengths.
#[test]
fn check_config_is_dry_and_aligned() {
    let base = std::env::temp_dir().join(format!("combd-check-dry-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let apps = base.join("apps");
    std::fs::create_dir_all(&apps).unwrap();
    std::fs::write(
        apps.join("hi.wat"),
        r#"(module (memory (export "memory") 1) (func (export "handle") (result i32) (i32.const 0)))"#,
    )
    .unwrap();
    let data = base.join("data");
    let run = || {
        combd()
            .arg("--check-config")
            .current_dir(&base)
            .env("COMBD_LOG", "info")
            .env("COMBD_DATA", &data)
            .env("COMBD_APPS_DIR", &apps)
            .env("COMBD_ACCESS_LOG", base.join("access.log"))
            .output()
            .unwrap()
    };
    let out = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.is_empty(), "logged: {stderr}");
    assert!(!data.exists(), "the data directory was created");
    let mut made: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    made.sort();
    assert_eq!(made, ["apps"], "created beside the apps");
    let text = String::from_utf8_lossy(&out.stdout);
    let settings: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("setting"))
        .take_while(|l| !l.is_empty())
        .collect();
    let value_at = |l: &str| {
        l.find(char::is_whitespace)
            .map(|i| i + l[i..].find(|c: char| !c.is_whitespace()).unwrap())
    };
    let first = value_at(settings[0]);
    assert!(settings.len() > 30);
    for l in &settings {
        assert_eq!(value_at(l), first, "misaligned: {l:?}");
    }
    assert!(
        settings.iter().any(|l| l.split_whitespace().eq([
            "COMBD_FLEET_BUCKET_REGION",
            "garage",
            "default"
        ])),
        "the region's default"
    );
    assert!(
        !text.contains("kernel/src/limits.rs"),
        "a file that does not exist"
    );
    // A module that does not load fails the check, as it fails a start.
    std::fs::write(apps.join("bad.wat"), "(module (func").unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.wat"));
    let _ = std::fs::remove_dir_all(&base);
}

/// The release binary ships without debug info (140 MB with line tables, 25 MB without), and a
/// profiling profile keeps them for `perf`: both as the README says.
#[test]
fn the_release_profile_strips_debug_info_and_the_profiling_one_keeps_it() {
    let cargo = include_str!("../Cargo.toml");
    let profile = |name: &str| -> Vec<String> {
        cargo
            .split(&format!("[profile.{name}]\n"))
            .nth(1)
            .unwrap_or_else(|| panic!("no [profile.{name}]"))
            .lines()
            .take_while(|l| !l.starts_with('['))
            .map(|l| l.replace(' ', ""))
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    };
    let release = profile("release");
    assert!(release.contains(&"debug=false".to_string()), "{release:?}");
    assert!(
        release.contains(&"strip=\"debuginfo\"".to_string()),
        "{release:?}"
    );
    let profiling = profile("profiling");
    assert!(
        profiling.contains(&"inherits=\"release\"".to_string()),
        "{profiling:?}"
    );
    assert!(profiling.contains(&"debug=1".to_string()), "{profiling:?}");
    let readme = include_str!("../README.md");
    assert!(readme.contains("cargo build --profile profiling"));
}
