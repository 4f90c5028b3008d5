//! The JavaScript client (`clients/js/`) tested with Node's test runner against a live node:
//! this test starts the node (with a token key), mints two users' tokens, and runs
//! `node --experimental-websocket --test clients/js/test/` with the node's address in
//! `COMBD_URL`. Without Node.js it prints one line and skips.

#![allow(clippy::unwrap_used)]

mod support;

use std::process::Command;

use support::*;

const SECRET: &str = "combd-js-client-test-secret-0123456789abcdef";

#[test]
fn the_javascript_client_passes_its_tests_against_a_live_node() {
    // Node.js 20.10 or newer: its WebSocket (behind --experimental-websocket before 22).
    let version = Command::new("node")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let new_enough = version.as_deref().is_some_and(|v| {
        let mut n = v
            .trim_start_matches('v')
            .split('.')
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (n.next().unwrap_or(0), n.next().unwrap_or(0));
        major > 20 || (major == 20 && minor >= 10)
    });
    if !new_enough {
        support::skipped(&format!(
            "Node.js {} is not 20.10 or newer: the JavaScript client is not tested",
            version.as_deref().unwrap_or("(none)")
        ));
        return;
    }
    let key = support::auth::key_file("js", SECRET);
    let node = TestNode::start(&[("COMBD_AUTH_JWT_KEY_FILE", key.to_str().unwrap())]);
    let token = |sub: &str| support::auth::token(SECRET, sub, None);
    let out = run_to_exit(
        Command::new("node")
            .args(["--experimental-websocket", "--test", "clients/js/test/"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("COMBD_URL", format!("http://127.0.0.2:{}/", node.port))
            .env("COMBD_TOKEN_ALICE", token("alice"))
            .env("COMBD_TOKEN_BOB", token("bob")),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("# fail 0"), "{text}");
    assert!(text.contains("# pass 9"), "every test ran: {text}");
}
