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
