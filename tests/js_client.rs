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
    assert!(text.contains("# pass 10"), "every test ran: {text}");
}

/// `tsc` on PATH, or where `.ci/run` installs it (`${XDG_CACHE_HOME:-~/.cache}/combd/typescript`).
fn tsc() -> Option<std::path::PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")));
    let cached = cache.map(|c| c.join("combd/typescript/node_modules/.bin/tsc"));
    let on_path = Command::new("tsc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    match (on_path, cached) {
        (true, _) => Some("tsc".into()),
        (false, Some(c)) if c.is_file() => Some(c),
        _ => None,
    }
}

/// Runs `cmd` in `dir`; its output, failing the test (with it) unless it succeeded.
fn ran(cmd: &mut Command, dir: &std::path::Path) -> String {
    let out = run_to_exit(cmd.current_dir(dir));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?}: {text}");
    text
}

/// The package as npm makes it: `npm pack` of `clients/js` installs into an empty project
/// (offline: it has no dependencies), where it is imported as an ES module and required as
/// CommonJS, each connecting to a live node until it is live, and its types check with `tsc
/// --strict` (a wrong state's name is an error).
#[test]
fn the_packed_client_installs_imports_requires_and_type_checks() {
    let has = |bin: &str| {
        Command::new(bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !has("npm") || !has("node") {
        support::skipped("npm or node is not installed: the packed client is not tested");
        return;
    }
    let root = std::env::temp_dir().join(format!("combd-js-pack-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let app = root.join("app");
    std::fs::create_dir_all(&app).unwrap();
    let client = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/js");
    let packed = ran(
        Command::new("npm")
            .args(["pack", "--silent", "--pack-destination"])
            .arg(&root),
        &client,
    );
    let tarball = root.join(packed.trim().lines().last().unwrap());
    assert!(tarball.is_file(), "{packed}");
    let listed = ran(Command::new("tar").arg("tzf").arg(&tarball), &root);
    for file in [
        "combd-client.js",
        "combd-client.cjs",
        "combd-client.d.ts",
        "README.md",
    ] {
        assert!(
            listed.contains(&format!("package/{file}")),
            "{file}: {listed}"
        );
    }
    std::fs::write(
        app.join("package.json"),
        r#"{ "name": "scratch", "private": true, "type": "module" }"#,
    )
    .unwrap();
    ran(
        Command::new("npm")
            .args([
                "install",
                "--offline",
                "--no-audit",
                "--no-fund",
                "--silent",
            ])
            .arg(&tarball),
        &app,
    );
    let node = TestNode::start(&[]);
    let url = format!("ws://127.0.0.2:{}/o/million/pack?page=0", node.port);
    let live = |import: &str| {
        format!(
            "{import}\nconst c = connect({url:?}, {{ onState: (s) => {{ if (s === 'live') {{ \
             console.log('live'); c.close(); process.exit(0); }} }} }});\n\
             setTimeout(() => {{ console.log('not live:', c.state); process.exit(1); }}, 10000);\n"
        )
    };
    std::fs::write(
        app.join("esm.mjs"),
        live(r#"import { connect } from "combd-client";"#),
    )
    .unwrap();
    std::fs::write(
        app.join("cjs.cjs"),
        live(r#"const { connect } = require("combd-client");"#),
    )
    .unwrap();
    for script in ["esm.mjs", "cjs.cjs"] {
        let said = ran(
            Command::new("node").args(["--experimental-websocket", script]),
            &app,
        );
        assert!(said.contains("live"), "{script}: {said}");
    }
    let Some(tsc) = tsc() else {
        support::skipped("tsc is not installed: the client's types are not checked");
        return;
    };
    std::fs::write(
        app.join("check.ts"),
        r#"import { connect, multiplex, type Client, type State } from "combd-client";
const seen: State[] = [];
const c: Client = connect("/o/chat/lobby", {
  numbered: true,
  sendBuffer: { messages: 10, bytes: 4096 },
  onState: (state, why, info) => { seen.push(state); void why; void info.wait; },
  onMessage: (m, info) => { void m; void info?.seq; },
});
const sent: boolean = c.send({ t: "say", text: "hi" });
const kept: number = c.buffered + c.dropBuffered();
const hub = multiplex({ token: "t" });
const sub = hub.subscribe("chat", "lobby", { numbered: true });
void [sent, kept, sub.state];
// @ts-expect-error: not a state
const wrong: State = "online";
void wrong;
"#,
    )
    .unwrap();
    ran(
        Command::new(&tsc).args([
            "--noEmit",
            "--strict",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--target",
            "es2022",
            "--lib",
            "es2022,dom",
            "check.ts",
        ]),
        &app,
    );
    let _ = std::fs::remove_dir_all(&root);
}
