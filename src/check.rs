//! `--check-config`: every check a start makes but those only a running node can fail (its
//! data directory's lock, its ports), and a report of what the node would run with. Dry: it
//! creates nothing (no data directory, no compiled-module cache) and logs nothing of its own
//! beyond the report.

use std::io::Write;
use std::path::Path;

use combd_kernel::limits;
use combd_kernel::memory::MemoryProbe;
use combd_kernel::settings::{AccessLogSink, Settings, Source};

use crate::failure::Failure;

/// Checks that the node could use `dir` as its data directory without creating it: an
/// existing one must be a directory whose `objects/` (or, missing, itself) the process may
/// write; a missing one needs its nearest existing parent to be a writable directory.
pub fn data_dir(dir: &Path) -> Result<(), Failure> {
    let config = |m: String| Failure::Config(format!("COMBD_DATA: {m}"));
    if let Ok(meta) = std::fs::metadata(dir) {
        if !meta.is_dir() {
            return Err(config(format!("{} is not a directory", dir.display())));
        }
        let objects = dir.join("objects");
        let target = if objects.is_dir() {
            objects
        } else {
            dir.to_path_buf()
        };
        return if writable(&target) {
            Ok(())
        } else {
            Err(config(format!("cannot write in {}", target.display())))
        };
    }
    // `./data` has the parent "" (the current directory).
    let mut parent = dir.parent();
    while let Some(p) = parent {
        let p = if p.as_os_str().is_empty() {
            Path::new(".")
        } else {
            p
        };
        if let Ok(meta) = std::fs::metadata(p) {
            return if meta.is_dir() && writable(p) {
                Ok(())
            } else {
                Err(config(format!(
                    "cannot create {}: {} is not a writable directory",
                    dir.display(),
                    p.display()
                )))
            };
        }
        parent = p.parent();
    }
    Err(config(format!("cannot create {}", dir.display())))
}

/// Checks that the node could open `COMBD_ACCESS_LOG` for append without creating it: an
/// existing file is opened (and closed, unchanged); a missing one needs its directory to be
/// writable.
pub fn access_log(sink: &AccessLogSink) -> Result<(), Failure> {
    let AccessLogSink::File(path) = sink else {
        return Ok(());
    };
    let fail = |e: String| {
        Failure::Config(format!(
            "COMBD_ACCESS_LOG: cannot open {} for append: {e}",
            path.display()
        ))
    };
    if path.exists() {
        return std::fs::OpenOptions::new()
            .append(true)
            .open(path)
            .map(drop)
            .map_err(|e| fail(e.to_string()));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if dir.is_dir() && writable(dir) {
        Ok(())
    } else {
        Err(fail(format!(
            "{} is not a writable directory",
            dir.display()
        )))
    }
}

fn writable(d: &Path) -> bool {
    use nix::unistd::{access, AccessFlags};
    access(d, AccessFlags::W_OK | AccessFlags::X_OK).is_ok()
}

/// Writes rows of columns, each column as wide as its widest cell (a last column unpadded).
fn table(out: &mut impl Write, rows: &[[String; 3]]) -> std::io::Result<()> {
    let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
    let (a, b) = (width(0), width(1));
    for [name, value, from] in rows {
        writeln!(
            out,
            "{}",
            format!("{name:<a$}  {value:<b$}  {from}").trim_end()
        )?;
    }
    Ok(())
}

/// The report: every setting's effective value and where it came from, then what was derived
/// from the machine, then the fixed limits. Stops at the first write that fails (a reader that
/// went away).
pub fn report(
    out: &mut impl Write,
    settings: &Settings,
    probe: &MemoryProbe,
    nofile: u64,
    max_conns: u64,
    shards: usize,
) -> std::io::Result<()> {
    writeln!(
        out,
        "combd {}: the settings are valid.\n",
        env!("CARGO_PKG_VERSION")
    )?;
    let mut rows = vec![["setting".into(), "value".into(), "source".into()]];
    for (name, value, source) in settings.describe() {
        let source = match source {
            Source::Default => "default",
            Source::Env => "env",
            Source::Flag => "flag",
        };
        rows.push([name.to_string(), value, source.to_string()]);
    }
    table(out, &rows)?;
    writeln!(out, "\nin force:")?;
    table(out, &in_force(settings, probe, nofile, max_conns, shards))?;
    writeln!(
        out,
        "\nfixed limits (kernel/src/limits/, each with its reason there; durations in ms, or µs for a name ending in _us):"
    )?;
    let rows: Vec<[String; 3]> = limits::FIXED
        .iter()
        .map(|f| [f.name.to_string(), f.value.to_string(), String::new()])
        .collect();
    table(out, &rows)
}

/// The limits start-up works out from the settings and the machine, each with where it came
/// from: the connection cap, the memory budget, and each shard's outbound and inbound budget.
fn in_force(
    settings: &Settings,
    probe: &MemoryProbe,
    nofile: u64,
    max_conns: u64,
    shards: usize,
) -> [[String; 3]; 4] {
    let clamp = if max_conns < settings.max_conns {
        format!(
            "clamped to RLIMIT_NOFILE {nofile} less {}",
            limits::FD_RESERVE
        )
    } else {
        "COMBD_MAX_CONNS".to_string()
    };
    let from = |set: bool, name: &str| {
        if set {
            name.to_string()
        } else {
            "memory budget / 4 / shards".to_string()
        }
    };
    let outbound = limits::outbound_budget_per_shard(
        settings.outbound_budget_bytes,
        probe.budget_bytes,
        shards,
    );
    let inbound =
        limits::inbound_budget_per_shard(settings.inbound_budget_bytes, probe.budget_bytes, shards);
    [
        ["max_conns".into(), max_conns.to_string(), clamp],
        [
            "memory_budget_bytes".into(),
            probe.budget_bytes.to_string(),
            probe.budget_source.as_str().into(),
        ],
        [
            "outbound_budget_bytes".into(),
            outbound.to_string(),
            from(
                settings.outbound_budget_bytes.is_some(),
                "COMBD_OUTBOUND_BUDGET",
            ),
        ],
        [
            "inbound_budget_bytes".into(),
            inbound.to_string(),
            from(
                settings.inbound_budget_bytes.is_some(),
                "COMBD_INBOUND_BUDGET",
            ),
        ],
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_as_wide_as_their_widest_cell() {
        let mut out = Vec::new();
        let row = |a: &str, b: &str, c: &str| [a.to_string(), b.to_string(), c.to_string()];
        table(
            &mut out,
            &[
                row("COMBD_ACCEPT_RATE_PER_ADDRESS", "256", "default"),
                row("COMBD_LOG", "info", "env"),
            ],
        )
        .unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "COMBD_ACCEPT_RATE_PER_ADDRESS  256   default\nCOMBD_LOG                      info  env\n"
        );
    }

    #[test]
    fn a_data_directory_is_checked_without_being_created() {
        let base = std::env::temp_dir().join(format!("combd-check-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).unwrap();
        let missing = base.join("a/b/data");
        assert!(data_dir(&missing).is_ok());
        assert!(!base.join("a").exists(), "nothing created");
        let file = base.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(data_dir(&file).is_err(), "a file");
        assert!(data_dir(&file.join("data")).is_err(), "under a file");
        assert!(data_dir(&base).is_ok());
        let _ = std::fs::remove_dir_all(&base);
    }
}
