//! The README's set-up section stays true of the repository: what it needs (the Rust version
//! it names is the workspace's `rust-version`), where the binary is, no link that leaves the
//! repository.

#![allow(clippy::unwrap_used)]

const README: &str = include_str!("../README.md");
const CARGO: &str = include_str!("../Cargo.toml");

#[test]
fn the_readme_names_what_a_new_machine_needs() {
    let rust = CARGO
        .lines()
        .find_map(|l| l.strip_prefix("rust-version = "))
        .unwrap()
        .trim_matches('"');
    assert!(
        README.contains(&format!("Rust {rust} or")),
        "the README names Rust {rust}, the workspace's rust-version"
    );
    assert!(README.contains("C compiler"));
    assert!(README.contains("target/release/combd"));
    assert!(README.contains("second terminal"));
    assert!(README.contains("    cargo run --release\n"));
    assert!(README.contains("    cargo test --workspace --locked\n"));
}

#[test]
fn no_link_in_the_readme_leaves_the_repository() {
    for (i, line) in README.lines().enumerate() {
        assert!(
            !line.contains("../"),
            "README line {}: {line:?} points outside the repository",
            i + 1
        );
    }
}

const RESULTS: &str = include_str!("../RESULTS.md");

/// The top directories of a Linux filesystem: a path that starts with one of them (or with
/// `~/`) is absolute, one that does not (`/stats`, `/o/counter/x`) is a URL's.
const ROOTS: &[&str] = &[
    "bin", "boot", "dev", "etc", "home", "lib", "lib64", "media", "mnt", "nix", "opt", "proc",
    "root", "run", "sbin", "snap", "srv", "sys", "tmp", "usr", "var", "work",
];

/// Absolute paths the README and RESULTS.md may name, because they are part of the
/// instructions as they stand on any Linux machine: what the node reads from the kernel
/// (`/proc`, the cgroup tree), where the systemd unit, the sysctl file and the node's state go,
/// and where the tools the README names install themselves. Anything else absolute (a
/// developer's `/work/...` wrapper, a build left in `/tmp`, a home directory) names a file the
/// reader does not have.
const SYSTEM_PATHS: &[&str] = &[
    "/proc",
    "/sys/fs/cgroup",
    "/dev/shm",
    "/etc/combd/",
    "/etc/hosts",
    "/etc/systemd/system/",
    "/etc/sysctl.d/60-combd.conf",
    "/var/lib/combd",
    "/usr/bin/",
    "/usr/local/bin/",
    "~/.cache/combd/", // tools/autobahn.sh's venv
    "~/.cargo/bin",    // where `cargo install` puts a tool
];

/// The absolute paths `text` names that are not system paths: `(line, path)`.
fn paths_outside_the_repository(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        for start in 0..chars.len() {
            let begins =
                chars[start] == '/' || (chars[start] == '~' && chars.get(start + 1) == Some(&'/'));
            // A path begins a word: not `src/lib.rs`, `./data`, `<dir>/x`, `$DIR/x` or a URL.
            let after_word = start > 0
                && (chars[start - 1].is_alphanumeric() || "_.~$}>/:-".contains(chars[start - 1]));
            if !begins || after_word {
                continue;
            }
            let path: String = chars[start..]
                .iter()
                .take_while(|c| !c.is_whitespace() && !"`\"'()|,;[]".contains(**c))
                .collect();
            let top = path.trim_start_matches('~').trim_start_matches('/');
            let top = top.split('/').next().unwrap_or_default();
            let absolute = path.starts_with("~/") || ROOTS.contains(&top);
            if absolute && !SYSTEM_PATHS.iter().any(|p| path.starts_with(p)) {
                found.push((i + 1, path));
            }
        }
    }
    found
}

#[test]
fn the_readme_and_results_name_no_path_outside_the_repository() {
    for (name, text) in [("README.md", README), ("RESULTS.md", RESULTS)] {
        let found = paths_outside_the_repository(text);
        assert!(
            found.is_empty(),
            "{name} names paths a reader does not have (say what they are, or add a system \
             path to SYSTEM_PATHS): {found:?}"
        );
    }
}

/// The check above can fail: lines RESULTS.md had before it was written are caught, and the
/// paths that are not a machine's (URLs, relative paths, system paths) are not.
#[test]
fn the_path_check_catches_a_developers_machine() {
    let old = "rows below, alternated, on the 2-core machine through `/work/quiet`:\n\
        \x20   /work/quiet tools/fleet-killloop --combd /tmp/combd-fleet-743edae --rounds 110\n\
        a build in /home/dev/combd/target, or ~/src/combd";
    let found: Vec<String> = paths_outside_the_repository(old)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        found,
        [
            "/work/quiet",
            "/work/quiet",
            "/tmp/combd-fleet-743edae",
            "/home/dev/combd/target",
            "~/src/combd"
        ]
    );
    let fine = "`GET /stats`, `/o/counter/x`, http://127.0.0.2:8080/healthz, `src/lib.rs`, \
        `fuzz/work/http_conn`, `<COMBD_DATA>/objects/`, `$CARGO_HOME/bin`, `./data`, \
        `/proc/<pid>/exe`, `/var/lib/combd/apps`, `/sys/fs/cgroup/memory.max`, /64";
    assert_eq!(paths_outside_the_repository(fine), []);
}
