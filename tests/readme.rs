//! The README stays true of the repository: what a new machine needs (the Rust version it
//! names is the workspace's `rust-version`), where the binary is, the quick start's commands
//! answer as it says against a real node, its contents list every section, and neither it nor
//! RESULTS.md points outside the repository.

#![allow(clippy::unwrap_used)]

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use support::*;

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
    "~/.local/bin",    // where `pipx install` puts a tool
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

/// The README's section under the heading `## {title}`, up to the next `## `.
fn section(title: &str) -> &'static str {
    let start = README
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("the README has no section {title:?}"));
    let body = &README[start + 1..];
    let end = body[3..].find("\n## ").map_or(body.len(), |e| e + 4);
    &body[..end]
}

/// The quick start's commands that show their answer: `(command, answer)` of each code line
/// `    command   # → answer`.
fn answered_commands() -> Vec<(&'static str, &'static str)> {
    section("Quick start (five minutes)")
        .lines()
        .filter_map(|l| l.strip_prefix("    "))
        .filter_map(|l| l.split_once("# → "))
        .map(|(command, answer)| (command.trim(), answer.trim()))
        .collect()
}

/// The words of a shell command line: split at spaces, quotes kept together and removed.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, ' ') => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

/// Whether `program` is on `PATH`.
fn installed(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path)
            .any(|dir| std::fs::metadata(dir.join(program)).is_ok_and(|m| m.is_file()))
    })
}

/// Runs `line` with `sh -c` and returns its stdout; fails if it does not end within the wait.
/// Its stderr (curl's progress meter, when its output is not a terminal) is shown only if it
/// fails.
fn run_shell(line: &str) -> String {
    let mut child = Command::new("sh")
        .args(["-c", line])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap());
    let err = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap());
    let status = exit_within(child);
    let err = err.join().unwrap();
    assert!(status.success(), "{line:?} exited with {status}: {err}");
    out.join().unwrap()
}

/// What `curl [-s] [-X METHOD] [-d BODY] URL` prints, by making the request it makes.
fn curl_by_hand(node: &TestNode, words: &[String]) -> String {
    let (mut method, mut body, mut url) = (None, None, None);
    let mut w = words[1..].iter();
    while let Some(word) = w.next() {
        match word.as_str() {
            "-s" => {}
            "-X" => method = w.next().cloned(),
            "-d" => body = w.next().cloned(),
            _ if word.starts_with("http://") => url = Some(word.clone()),
            _ => panic!("the quick start's curl takes an option this test does not know: {word}"),
        }
    }
    let url = url.expect("curl's URL");
    let path = &url[url[7..].find('/').unwrap() + 7..];
    let method = method.unwrap_or_else(|| if body.is_some() { "POST" } else { "GET" }.into());
    // As curl sends it: a body with its length and form type, none without.
    let framing = body.as_ref().map_or(String::new(), |b| {
        format!(
            "Content-Length: {}\r\nContent-Type: application/x-www-form-urlencoded\r\n",
            b.len()
        )
    });
    let raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.2:{}\r\nAccept: */*\r\n{framing}Connection: close\r\n\r\n{}",
        node.port,
        body.unwrap_or_default()
    );
    request(node.public(), raw.as_bytes()).text()
}

/// What `echo LINE | websocat URL` prints, by doing what it does: each line of its input a
/// text message, then a close, and every message received until the node's close, a line each.
fn websocat_by_hand(node: &TestNode, input: &str, url: &str) -> String {
    let path = &url[url[5..].find('/').unwrap() + 5..];
    let mut ws = open_ws(node, path);
    for line in input.lines() {
        ws.send(tungstenite::Message::text(line)).unwrap();
    }
    ws.close(None).unwrap();
    let mut out = String::new();
    loop {
        match ws.read() {
            Ok(tungstenite::Message::Text(t)) => out += &format!("{}\n", t.as_str()),
            Ok(_) => {}
            Err(tungstenite::Error::ConnectionClosed) => break,
            Err(e) => panic!("timed out waiting for the node's close: {e}"),
        }
    }
    out
}

/// Every command of the quick start that shows its answer (`# → ...`) answers exactly that on
/// a fresh node, in order: run as written (the port changed to the test node's) where the tool
/// is installed, else by making the same request here.
#[test]
fn the_quick_start_commands_answer_as_it_says() {
    let commands = answered_commands();
    assert!(commands.iter().any(|(c, _)| c.starts_with("curl ")));
    assert!(commands.iter().any(|(c, _)| c.contains("| websocat ")));
    let node = TestNode::start(&[]);
    for (command, answer) in commands {
        assert!(
            command.contains("127.0.0.2:8080/"),
            "{command}: not the public listener"
        );
        let here = command.replace(":8080/", &format!(":{}/", node.port));
        let stages: Vec<Vec<String>> = here.split(" | ").map(shell_words).collect();
        let tool = stages.last().unwrap()[0].as_str();
        let out = if installed(tool) {
            run_shell(&here)
        } else {
            println!("{tool} is not installed: making the request of {command:?} without it");
            match (tool, stages.as_slice()) {
                ("curl", [curl]) => curl_by_hand(&node, curl),
                ("websocat", [echo, websocat]) if echo[0] == "echo" => {
                    websocat_by_hand(&node, &format!("{}\n", echo[1..].join(" ")), &websocat[1])
                }
                _ => panic!("{command}: this test does not know how to make its request"),
            }
        };
        assert_eq!(out.trim_end(), answer, "{command}");
    }
}

/// The quick start's million session: the page's state first, then a click typed into it
/// comes back as the update the README shows (with websocat where it is installed).
#[test]
fn the_quick_start_million_session_answers_as_it_says() {
    let quick = section("Quick start (five minutes)");
    let command = "websocat 'ws://127.0.0.2:8080/o/million/main?page=0'";
    let click = r#"{"t":"click","i":5,"c":1}"#;
    assert!(quick.contains(&format!("\n    {command}\n")), "{command}");
    assert!(quick.contains(&format!("`{click}`")));
    assert!(quick.contains(r#"`{"t":"set","u":[[5,1,<session>,1]]}`"#));
    assert!(
        quick.contains(r#"`{"bits":"<1,024 hex digits>","p":0,"s":<your session>,"t":"page"}`"#)
    );
    let node = TestNode::start(&[]);
    let mut words = shell_words(command);
    words[1] = words[1].replace(":8080/", &format!(":{}/", node.port));
    let check_page = |line: &str| -> u64 {
        let page: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(
            (&page["t"], &page["p"]),
            (&"page".into(), &0.into()),
            "{line}"
        );
        let bits = page["bits"].as_str().unwrap();
        assert!(
            bits.len() == 1024 && bits.chars().all(|c| c == '0'),
            "{line}"
        );
        page["s"].as_u64().unwrap()
    };
    let check_set = |update: serde_json::Value, session: u64| {
        assert_eq!(
            update,
            serde_json::json!({"t": "set", "u": [[5, 1, session, 1]]})
        );
    };
    if installed("websocat") {
        let mut child = Command::new(&words[0])
            .arg(&words[1])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let out = lines(child.stdout.take().unwrap());
        let session = check_page(&wait_line(&out, r#""t":"page""#));
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{click}").unwrap();
        let set = wait_line(&out, r#""t":"set""#);
        check_set(serde_json::from_str(&set).unwrap(), session);
        drop(stdin); // websocat closes the WebSocket at the end of its input, and exits
        assert!(exit_within(child).success());
    } else {
        println!("websocat is not installed: viewing the page and clicking without it");
        let mut ws = open_ws(&node, "/o/million/main?page=0");
        let session = check_page(&read_json(&mut ws).to_string());
        ws.send(tungstenite::Message::text(click)).unwrap();
        check_set(read_json(&mut ws), session);
    }
}

/// The page the quick start opens: `/` redirects to `/million/`, which is the million page.
#[test]
fn the_quick_start_page_is_there() {
    let quick = section("Quick start (five minutes)");
    assert!(quick.contains("`http://127.0.0.2:8080/` in a browser"));
    let node = TestNode::start(&[]);
    let root = get(&node, "/");
    assert_eq!(
        (root.status, root.header("location")),
        (302, Some("/million/"))
    );
    let page = get(&node, "/million/");
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    assert!(
        page.text().contains("/o/million/"),
        "the page views a million board"
    );
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped (letters, digits,
/// `-` and `_` kept), each space a `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The README's contents link to every `##` and `###` section, in order, and every link to
/// an anchor in the README (`](#...)`) lands on a heading.
#[test]
fn the_contents_list_every_section() {
    let mut in_code = false;
    let mut headings = Vec::new();
    for line in README.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && (line.starts_with("## ") || line.starts_with("### ")) {
            let title = line.trim_start_matches('#').trim();
            if title != "Contents" {
                headings.push(anchor(title));
            }
        }
    }
    let contents: Vec<String> = section("Contents")
        .lines()
        .filter_map(|l| l.split_once("](#"))
        .map(|(_, rest)| rest.split(')').next().unwrap().to_string())
        .collect();
    assert_eq!(
        contents, headings,
        "the README's contents against its headings"
    );
    let mut rest = README;
    while let Some(at) = rest.find("](#") {
        let target = rest[at + 3..].split(')').next().unwrap();
        assert!(
            headings.iter().any(|h| h == target),
            "a link to #{target}: no such heading"
        );
        rest = &rest[at + 3..];
    }
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(
        anchor("Admission: refusing at TCP"),
        "admission-refusing-at-tcp"
    );
    assert_eq!(anchor("The ABI (version 2)"), "the-abi-version-2");
    assert_eq!(
        anchor("What a client sees, and what it should do"),
        "what-a-client-sees-and-what-it-should-do"
    );
}

/// combd is MIT or Apache-2.0, and every crate of it says so: the workspace's (which inherit
/// `[workspace.package]`'s license) and the fuzz crate (a workspace of its own).
#[test]
fn every_crate_is_mit_or_apache() {
    let root = env!("CARGO_MANIFEST_DIR");
    assert!(CARGO.contains("[workspace.package]"));
    assert!(CARGO.contains("\nlicense = \"MIT OR Apache-2.0\"\n"));
    let members = CARGO
        .split_once("members = [")
        .unwrap()
        .1
        .split_once(']')
        .unwrap()
        .0
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty());
    for member in members.filter(|m| *m != ".") {
        let toml = std::fs::read_to_string(format!("{root}/{member}/Cargo.toml")).unwrap();
        assert!(
            toml.contains("\nlicense.workspace = true\n"),
            "{member}/Cargo.toml"
        );
    }
    assert!(CARGO.contains("[package]") && CARGO.contains("\nlicense.workspace = true\n"));
    let fuzz = std::fs::read_to_string(format!("{root}/fuzz/Cargo.toml")).unwrap();
    assert!(
        fuzz.contains("\nlicense = \"MIT OR Apache-2.0\"\n"),
        "fuzz/Cargo.toml"
    );
    let mit = std::fs::read_to_string(format!("{root}/LICENSE-MIT")).unwrap();
    assert!(mit.contains("Copyright (c) 2026 The combd developers"));
    let apache = std::fs::read_to_string(format!("{root}/LICENSE-APACHE")).unwrap();
    assert!(apache.contains("Apache License\n                           Version 2.0, January 2004"));
    let license = section("License");
    assert!(license.contains("(LICENSE-APACHE)") && license.contains("(LICENSE-MIT)"));
    assert!(license.contains("cargo deny --workspace check licenses"));
}
