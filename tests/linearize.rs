#![allow(clippy::unwrap_used)]
//! The linearizability checker (`tools/linearize`, todc-utils' WGL checker on the counter's
//! specification) on the histories committed in `tools/linearize/testdata` (each must get the
//! verdict its name says), on a real kill-loop history with one read planted lower (caught),
//! and, where etcd and Garage are installed (`tools/fleet-env/install`), on the history of a
//! short real kill loop run here (3 kills), which must check clean.
//!
//! The checker is a Cargo workspace of its own (its dependency stays out of the node's lock
//! file): the test builds it with cargo, into `target/linearize`.

#[path = "support/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The checker's binary, built once for every test here.
fn checker() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo().join("target"))
            .join("linearize");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args([
                "build",
                "--release",
                "--locked",
                "--quiet",
                "--manifest-path",
            ])
            .arg(repo().join("tools/linearize/Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target)
            .status()
            .expect("run cargo to build tools/linearize");
        assert!(
            status.success(),
            "building tools/linearize failed: {status}"
        );
        target.join("release/linearize")
    })
}

/// The checker's exit status and what it printed, on `history`.
fn check(history: &Path) -> (i32, String) {
    let out = Command::new(checker())
        .arg(history)
        .args(["--timeout", "120"])
        .output()
        .expect("run the checker");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn every_committed_history_gets_the_verdict_its_name_says() {
    let dir = repo().join("tools/linearize/testdata");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".jsonl") {
            continue;
        }
        let want = if name.starts_with("ok-") {
            0
        } else if name.starts_with("bad-") {
            1
        } else {
            panic!("{name}: a history here is named ok-* or bad-*");
        };
        let (code, text) = check(&path);
        assert_eq!(code, want, "{name}: the checker said\n{text}");
        let verdict = if want == 0 {
            "verdict: linearizable"
        } else {
            "verdict: NOT linearizable"
        };
        assert!(text.contains(verdict), "{name}:\n{text}");
        seen += 1;
    }
    assert!(seen >= 5, "only {seen} histories in {}", dir.display());
}

#[test]
fn a_read_planted_lower_in_a_real_history_is_caught() {
    // The last read of a real kill loop's history (the fresh node's restore) answered one
    // less than it did: an acknowledged write lost.
    let real = repo().join("tools/linearize/testdata/ok-killloop-3-rounds.jsonl");
    let text = std::fs::read_to_string(&real).unwrap();
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last_read = lines
        .iter_mut()
        .rev()
        .find(|e| e["type"] == "ok" && e["f"] == "read")
        .unwrap();
    let v = last_read["value"].as_i64().unwrap();
    last_read["value"] = (v - 1).into();
    let dir = TempDir::new("planted");
    let planted = dir.path().join("planted.jsonl");
    let body: String = lines.iter().map(|e| format!("{e}\n")).collect();
    std::fs::write(&planted, body).unwrap();
    let (code, out) = check(&planted);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("verdict: NOT linearizable"), "{out}");
    // ... and the same history as recorded passes.
    let (code, out) = check(&real);
    assert_eq!(code, 0, "{out}");
}

/// A directory of this test's own under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("combd-linearize-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_short_real_kill_loop_history_is_linearizable() {
    if !skip::fleet_servers_installed() {
        skip::skipped("no etcd or Garage (tools/fleet-env/install)");
        return;
    }
    if !skip::have("python3", "--version") {
        skip::skipped("no python3 (tools/fleet-killloop)");
        return;
    }
    let dir = TempDir::new("killloop");
    let history = dir.path().join("history.jsonl");
    // A setup that failed (the servers or a node slow to start on a machine busy with the
    // rest of the suite: exit 2, "setup failed") says nothing of the history: tried again, at
    // most three times in all.
    let mut attempt = 0;
    let out = loop {
        attempt += 1;
        let out = run_killloop(&history, &dir.path().join(format!("evidence-{attempt}")));
        let setup_failed = out.status.code() == Some(2)
            && String::from_utf8_lossy(&out.stdout).contains("setup failed");
        if !setup_failed || attempt == 3 {
            break out;
        }
    };
    let log = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tools/fleet-killloop failed ({}):\n{log}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(log.contains("RESULT: PASS"), "{log}");
    let (code, text) = check(&history);
    assert_eq!(code, 0, "the kill loop's history:\n{text}");
    assert!(text.contains("verdict: linearizable"), "{text}");
}

/// A 3-round kill loop recording its history at `history`; its output once it ended (within 180
/// s, else the test fails).
fn run_killloop(history: &Path, evidence: &Path) -> std::process::Output {
    let started = Instant::now();
    let mut child = Command::new("python3")
        .arg(repo().join("tools/fleet-killloop"))
        .args(["--rounds", "3", "--base-port", "28500", "--seed", "27"])
        .args(["--combd", env!("CARGO_BIN_EXE_combd")])
        .arg("--history")
        .arg(history)
        .arg("--evidence")
        .arg(evidence)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tools/fleet-killloop");
    let deadline = Duration::from_secs(180);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("tools/fleet-killloop did not finish within {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    child.wait_with_output().unwrap()
}

/// The checker's own unit tests (handmade histories; its reductions against the unreduced
/// search on 20,000 random ones), run here so the README's test command covers them: the
/// checker is a Cargo workspace of its own, which `cargo test --workspace` does not reach.
#[test]
fn the_checkers_own_tests_pass() {
    checker(); // built first, so the two cargo runs do not wait on one another's lock
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
        .join("linearize");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["test", "--release", "--locked", "--manifest-path"])
        .arg(repo().join("tools/linearize/Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .expect("run cargo test on tools/linearize");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tools/linearize's tests failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("test result: ok"), "{text}");
}
