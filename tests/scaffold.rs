//! `combd new`: a module to start from, as a new user gets it, built (where it needs a build)
//! and served by a real node from its `apps/` directory: the text-format one as it is, the Rust
//! one with `sh build.sh` on stable Rust (skipped, with one line, without the wasm32 target),
//! the C one with clang and wasi-libc (skipped without them). And its refusals.

#![allow(clippy::unwrap_used)]

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("combd-new-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn new(args: &[&str]) -> std::process::Output {
    run_to_exit(
        Command::new(env!("CARGO_BIN_EXE_combd"))
            .arg("new")
            .args(args),
    )
}

/// Serves `dir/apps` and POSTs to `path`: the answer.
fn served(dir: &Path, path: &str) -> Resp {
    let apps = dir.join("apps");
    let node = TestNode::start(&[("COMBD_APPS_DIR", apps.to_str().unwrap())]);
    post(&node, path, "")
}

#[test]
fn a_new_wat_app_is_served_as_written_and_a_taken_directory_is_refused() {
    let dir = scratch("wat");
    let out = new(&["hello", "--dir", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.join("README.md").is_file());
    let r = served(&dir, "/o/hello/a");
    assert_eq!(r.json(), serde_json::json!({ "seen": 1 }), "{}", r.text());
    // Not over what is there; a bad name or language is a usage error.
    let out = new(&["hello", "--dir", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));
    for bad in [&["Hello"][..], &["hello", "--lang", "go"], &[]] {
        assert_eq!(new(bad).status.code(), Some(2), "{bad:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_new_rust_app_builds_on_stable_and_is_served() {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("wasm32-unknown-unknown"));
    if !installed {
        support::skipped("the wasm32-unknown-unknown target is not installed: combd new --lang rust is not built");
        return;
    }
    let dir = scratch("rust");
    let out = new(&["my-app", "--lang", "rust", "--dir", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = run_to_exit(
        Command::new("sh")
            .args(["build.sh", "--offline"])
            .current_dir(&dir)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_TARGET_DIR"),
    );
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let r = served(&dir, "/o/my-app/a?who=you");
    assert_eq!(
        r.json(),
        serde_json::json!({ "hello": "you", "visits": 1 }),
        "{}",
        r.text()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_new_c_app_builds_with_clang_and_is_served() {
    let has = |bin: &str| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    // Debian's wasi-libc puts its headers under /usr/include/wasm32-wasi; others a sysroot.
    let libc = ["/usr/include/wasm32-wasi", "/usr/share/wasi-sysroot"]
        .iter()
        .any(|d| Path::new(d).is_dir());
    if !(has("clang-14") || has("clang")) || !libc {
        support::skipped("clang or wasi-libc is not installed: combd new --lang c is not built");
        return;
    }
    let dir = scratch("c");
    let out = new(&["tally", "--lang", "c", "--dir", dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let built = run_to_exit(Command::new("sh").arg("build.sh").current_dir(&dir));
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let r = served(&dir, "/o/tally/a");
    assert_eq!(r.json(), serde_json::json!({ "value": 1 }), "{}", r.text());
    let _ = std::fs::remove_dir_all(&dir);
}
