//! `combd new <app> [--lang wat|rust|c] [--dir <dir>]`: a working app module to start from, in a
//! new directory (default `./<app>`): its source, a build script where it needs one, a README
//! saying how to build, run and ask it; the built module goes to `<dir>/apps/`, which a node
//! serves with `COMBD_APPS_DIR=apps`.
//!
//! - `wat` (the default): `apps/<app>.wat`, which the node reads as it is (no toolchain);
//! - `rust`: a Cargo project on stable Rust with a copy of the guest crate beside it
//!   (`combd-guest/`), and `build.sh` (`rustup target add wasm32-unknown-unknown` first);
//! - `c`: `<app>.c` and `combd.h` (the ABI as C declarations), and `build.sh` (clang and
//!   wasi-libc).
//!
//! Exit status 0 when written, 1 when the directory exists and is not empty (or cannot be
//! written), 2 for a usage error.

use std::path::{Path, PathBuf};

const USE: &str = "use: combd new <app> [--lang wat|rust|c] [--dir <dir>]   (app: 1 to 63 of a-z 0-9 _ -, a letter or digit first)";

const WAT: &str = include_str!("new/hello.wat");
const README: &str = include_str!("new/README.md.in");
const RUST_CARGO: &str = include_str!("new/Cargo.toml.in");
const RUST_LIB: &str = include_str!("../examples/wasm/rust-app/src/lib.rs");
const RUST_BUILD: &str = include_str!("new/build-rust.sh");
const GUEST_CARGO: &str = include_str!("new/guest-Cargo.toml.in");
const GUEST_LIB: &str = include_str!("../guest/src/lib.rs");
const C_SOURCE: &str = include_str!("../examples/wasm/counter.c");
const C_HEADER: &str = include_str!("../examples/wasm/combd.h");
const C_BUILD: &str = include_str!("new/build-c.sh");

/// The languages a module can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lang {
    Wat,
    Rust,
    C,
}

/// Whether `name` may be an app's name: what a module's file name gives it, and a URL path
/// segment as it is.
fn valid_app(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase() | b[0].is_ascii_digit()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

/// Reads the arguments; `None` after a usage error.
fn parse(args: &[String]) -> Option<(String, Lang, PathBuf)> {
    let (mut name, mut lang, mut dir) = (None, Lang::Wat, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--lang" => {
                lang = match it.next()?.as_str() {
                    "wat" => Lang::Wat,
                    "rust" => Lang::Rust,
                    "c" => Lang::C,
                    _ => return None,
                }
            }
            "--dir" => dir = Some(PathBuf::from(it.next()?)),
            n if !n.starts_with('-') && name.is_none() => name = Some(n.to_string()),
            _ => return None,
        }
    }
    let name = name.filter(|n| valid_app(n))?;
    let dir = dir.unwrap_or_else(|| PathBuf::from(&name));
    Some((name, lang, dir))
}

/// The files of app `name` in `lang`, each a path under its directory and its text.
fn files(name: &str, lang: Lang) -> Vec<(String, String)> {
    let crate_name = name.replace('-', "_");
    let fill = |t: &str| {
        t.replace("__NAME__", name)
            .replace("__CRATE__", &crate_name)
    };
    let readme = |lang: &str, build: &str, ask: &str| {
        fill(README)
            .replace("__LANG__", lang)
            .replace("__BUILD__", build)
            .replace("__TRY__", ask)
    };
    let at = format!("localhost:8080/o/{name}/a");
    match lang {
        Lang::Wat => vec![
            (format!("apps/{name}.wat"), fill(WAT)),
            ("README.md".into(), readme("wat", "The module is `apps/{name}.wat`: the node reads it as it is, no build.\n".replace("{name}", name).as_str(), &at)),
        ],
        Lang::Rust => vec![
            ("Cargo.toml".into(), fill(RUST_CARGO)),
            ("src/lib.rs".into(), RUST_LIB.to_string()),
            ("build.sh".into(), fill(RUST_BUILD)),
            ("combd-guest/Cargo.toml".into(), GUEST_CARGO.to_string()),
            ("combd-guest/src/lib.rs".into(), GUEST_LIB.to_string()),
            ("README.md".into(), readme("rust", "Build it with stable Rust:\n\n    rustup target add wasm32-unknown-unknown\n    sh build.sh\n", &format!("{at}?who=you"))),
        ],
        Lang::C => vec![
            (format!("{name}.c"), C_SOURCE.to_string()),
            ("combd.h".into(), C_HEADER.to_string()),
            ("build.sh".into(), fill(C_BUILD)),
            ("README.md".into(), readme("c", "Build it with clang and wasi-libc:\n\n    sh build.sh\n", &at)),
        ],
    }
}

/// Writes the files into `dir`, which must not exist or be empty.
fn write(dir: &Path, files: &[(String, String)]) -> Result<(), String> {
    let at = |e: std::io::Error, p: &Path| format!("{}: {e}", p.display());
    if std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(format!(
            "{} exists and is not empty: choose another --dir",
            dir.display()
        ));
    }
    for (rel, text) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| at(e, parent))?;
        }
        std::fs::write(&path, text).map_err(|e| at(e, &path))?;
    }
    std::fs::create_dir_all(dir.join("apps")).map_err(|e| at(e, dir))
}

/// Runs `combd new`; its exit status.
pub fn run(args: &[String]) -> i32 {
    let Some((name, lang, dir)) = parse(args) else {
        eprintln!("{USE}");
        return 2;
    };
    match write(&dir, &files(&name, lang)) {
        Ok(()) => {
            println!(
                "wrote app {name} in {}: see its README.md (then COMBD_APPS_DIR={}/apps combd)",
                dir.display(),
                dir.display()
            );
            0
        }
        Err(e) => {
            eprintln!("combd new: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Option<(String, Lang, PathBuf)> {
        parse(&s.split(' ').map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn an_app_is_named_as_a_module_file_names_it() {
        assert_eq!(
            args("hello"),
            Some(("hello".into(), Lang::Wat, "hello".into()))
        );
        assert_eq!(
            args("my-app --lang rust --dir /tmp/x").map(|(_, l, d)| (l, d)),
            Some((Lang::Rust, "/tmp/x".into()))
        );
        for bad in [
            "Hello",
            "-x",
            "a/b",
            "hello --lang go",
            "hello --dir",
            "",
            "a b",
        ] {
            assert_eq!(args(bad), None, "{bad:?}");
        }
        let files = files("my-app", Lang::Rust);
        let cargo = &files.iter().find(|(p, _)| p == "Cargo.toml").unwrap().1;
        assert!(cargo.contains("name = \"my_app\""), "{cargo}");
        assert!(
            files.iter().all(|(_, t)| !t.contains("__")),
            "a placeholder left"
        );
    }
}
