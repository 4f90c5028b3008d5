//! A Rust app module as a user builds it on today's stable Rust: the Cargo project
//! `examples/wasm/rust-app/` (depending on the guest crate, `guest/`) built with `cargo build
//! --release --target wasm32-unknown-unknown`, deployed into a node's apps directory, and asked:
//! its query parameters arrive percent-decoded (`combd_guest::query`), its JSON is escaped
//! (`json_string`), and a panic fails the input (the message goes to the call's log through
//! `log_panic`). Skipped, with one line, where the wasm32 target is not installed (`rustup
//! target add wasm32-unknown-unknown`; `.ci/run` adds it).

#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;

use support::*;

#[test]
fn the_cargo_example_builds_on_stable_and_serves() {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("wasm32-unknown-unknown"));
    if !installed {
        support::skipped(
            "the wasm32-unknown-unknown target is not installed: the Cargo example is not built",
        );
        return;
    }
    let project = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/wasm/rust-app");
    let target = std::env::temp_dir().join(format!("combd-guest-cargo-{}", std::process::id()));
    let out = run_to_exit(
        Command::new(env!("CARGO"))
            .args([
                "build",
                "--release",
                "--offline",
                "--target",
                "wasm32-unknown-unknown",
            ])
            .current_dir(&project)
            .env("CARGO_TARGET_DIR", &target)
            // The node's own build's settings are not the module's.
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS"),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wasm = std::fs::read(target.join("wasm32-unknown-unknown/release/greet.wasm")).unwrap();
    let dir = apps_dir(&[]);
    std::fs::write(dir.join("greet.wasm"), wasm).unwrap();
    let node = TestNode::start(&[("COMBD_APPS_DIR", dir.to_str().unwrap())]);
    let r = post(&node, "/o/greet/a?who=Ada+L%C3%B3pez%22&who=second", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        serde_json::json!({ "hello": "Ada López\"", "visits": 1 })
    );
    let r = post(&node, "/o/greet/a", "");
    assert_eq!(
        r.json(),
        serde_json::json!({ "hello": "world", "visits": 2 })
    );
    let long = "x".repeat(70);
    let r = post(&node, &format!("/o/greet/a?who={long}"), "");
    assert_eq!(error(&r), (500, "the module trapped on this input".into()));
    let r = request(
        node.public(),
        b"GET /o/greet/a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(
        r.json(),
        serde_json::json!({ "visits": 2 }),
        "the panic wrote nothing"
    );
    let _ = std::fs::remove_dir_all(&target);
}
