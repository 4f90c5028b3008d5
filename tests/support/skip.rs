//! A test that cannot run here says so: one line on stderr (which `cargo test` shows only for a
//! failing test) and, when `SKIPPED_TESTS_FILE` names a file (`.ci/run` sets it), the same line
//! appended to that file with the test's name, so the run's closing line counts the skips and
//! names them: a test that returns early is never taken for one that passed.

/// Reports that the running test is skipped, and why.
pub fn skipped(why: &str) {
    eprintln!("skipped: {why}");
    if let Some(path) = std::env::var_os("SKIPPED_TESTS_FILE") {
        use std::io::Write;
        let test = std::thread::current()
            .name()
            .unwrap_or("a test")
            .to_string();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{test}: {why}");
        }
    }
}

/// Whether `cmd arg` runs and succeeds here (a tool a test needs is installed).
#[allow(dead_code)]
pub fn have(cmd: &str, arg: &str) -> bool {
    std::process::Command::new(cmd)
        .arg(arg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether etcd and Garage are installed (`tools/fleet-env/install`: Garage into
/// `$CARGO_HOME/bin`, which may not be on `PATH`).
#[allow(dead_code)]
pub fn fleet_servers_installed() -> bool {
    let garage = std::env::var("CARGO_HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| {
            std::path::Path::new(&std::env::var("HOME").unwrap_or_default()).join(".cargo")
        })
        .join("bin/garage");
    have("etcd", "--version") && (have("garage", "--version") || garage.exists())
}
