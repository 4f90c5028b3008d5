//! Memory: the budget, the process's memory cgroup (v2, else v1), `/proc/meminfo`, own RSS and
//! the kernel's TCP memory. Parsers take the text of one file; [`MemoryProbe`] does the reads.
//!
//! Cgroup discovery follows Seastar's: find the process's cgroup in `/proc/self/cgroup`, find
//! where that hierarchy is mounted in `/proc/self/mountinfo`, and walk up from the process's
//! cgroup to the nearest one that has the limit file. `max` (v2) or a number at or above
//! [`UNLIMITED_BYTES`] (v1 writes 9223372036854771712 for "no limit") means no limit.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// A cgroup limit at or above this is no limit (v1 reports `PAGE_COUNTER_MAX` pages).
pub const UNLIMITED_BYTES: u64 = 1 << 60;

/// Which cgroup hierarchy the memory controller was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// The unified hierarchy: `memory.max`, `memory.current`.
    V2,
    /// The v1 memory controller: `memory.limit_in_bytes`, `memory.usage_in_bytes`.
    V1,
}

/// Where the memory budget came from (`memory_budget_source` in `/stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetSource {
    /// `COMBD_MEMORY_BUDGET`.
    Env,
    /// The cgroup v2 `memory.max`.
    Cgroup2,
    /// The cgroup v1 `memory.limit_in_bytes`.
    Cgroup1,
    /// The machine's RAM (`MemTotal`).
    Ram,
}

impl BudgetSource {
    /// The name shown in `/stats`.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetSource::Env => "env",
            BudgetSource::Cgroup2 => "cgroup2",
            BudgetSource::Cgroup1 => "cgroup1",
            BudgetSource::Ram => "ram",
        }
    }
}

/// The process's cgroup paths from `/proc/self/cgroup`: the v2 path (line `0::/path`) and the
/// v1 memory controller's path (a line whose controller list contains `memory`).
pub fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let mut v2 = None;
    let mut v1 = None;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2 = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1 = Some(path.to_string());
        }
    }
    (v2, v1)
}

/// One line of `/proc/self/mountinfo`, the fields combd needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The root of the mount within its filesystem (field 4).
    pub root: String,
    /// Where it is mounted (field 5).
    pub mount_point: String,
    /// The filesystem type (after the ` - ` separator).
    pub fstype: String,
    /// The superblock options (last field), e.g. `rw,memory`.
    pub super_options: String,
}

/// Parses `/proc/self/mountinfo`. Lines that do not have the documented shape are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some(Mount {
                root: unescape_mount(l.get(3)?),
                mount_point: unescape_mount(l.get(4)?),
                fstype: r.first()?.to_string(),
                super_options: r.get(2).map_or(String::new(), |s| s.to_string()),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape_mount(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = u32::from(b[i + 1] - b'0') * 64
                + u32::from(b[i + 2] - b'0') * 8
                + u32::from(b[i + 3] - b'0');
            out.push(char::from_u32(v).unwrap_or('?'));
            i += 4;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The directories to look in for the memory controller's files, nearest first: the
/// process's cgroup, then each parent up to the mount's root. v2 candidates come first.
pub fn memory_cgroup_candidates(
    proc_cgroup: &str,
    mountinfo: &str,
) -> Vec<(CgroupVersion, PathBuf)> {
    let (v2, v1) = parse_proc_cgroup(proc_cgroup);
    let mounts = parse_mountinfo(mountinfo);
    let mut out = Vec::new();
    let mut add = |version, mount: &Mount, path: &str| {
        // The cgroup path is relative to the hierarchy's root; the mount shows `root` of it.
        let rel = if mount.root == "/" {
            path.to_string()
        } else if let Some(rest) = path.strip_prefix(mount.root.as_str()) {
            rest.to_string()
        } else {
            // Inside a cgroup namespace the path may already be relative to the mount.
            path.to_string()
        };
        let mut dir = PathBuf::from(&mount.mount_point);
        for part in rel.split('/').filter(|p| !p.is_empty() && *p != "..") {
            dir.push(part);
        }
        let top = PathBuf::from(&mount.mount_point);
        let mut d = dir.as_path();
        loop {
            out.push((version, d.to_path_buf()));
            if d == top {
                break;
            }
            match d.parent() {
                Some(p) if p.starts_with(&top) => d = p,
                _ => break,
            }
        }
    };
    if let Some(path) = v2 {
        if let Some(m) = mounts.iter().find(|m| m.fstype == "cgroup2") {
            add(CgroupVersion::V2, m, &path);
        }
    }
    if let Some(path) = v1 {
        if let Some(m) = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_options.split(',').any(|o| o == "memory"))
        {
            add(CgroupVersion::V1, m, &path);
        }
    }
    out
}

/// Parses a limit file: `max` or a number at or above [`UNLIMITED_BYTES`] is `None`.
pub fn parse_limit(text: &str) -> Result<Option<u64>, String> {
    let t = text.trim();
    if t == "max" {
        return Ok(None);
    }
    let n: u64 = t
        .parse()
        .map_err(|_| format!("{t:?} is not a memory limit"))?;
    Ok(if n >= UNLIMITED_BYTES { None } else { Some(n) })
}

/// Parses a whole number of bytes (`memory.current`, `memory.usage_in_bytes`).
pub fn parse_bytes_file(text: &str) -> Result<u64, String> {
    text.trim()
        .parse()
        .map_err(|_| format!("{:?} is not a byte count", text.trim()))
}

/// A field of `memory.stat` (`inactive_file 123`).
pub fn parse_memory_stat(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// What `/proc/meminfo` says of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    /// `MemTotal`, in bytes.
    pub total_bytes: u64,
    /// `MemAvailable`, in bytes.
    pub available_bytes: u64,
}

/// Parses `/proc/meminfo` (values in kB).
pub fn parse_meminfo(text: &str) -> Result<MemInfo, String> {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map(|kb| kb * 1024)
            .ok_or_else(|| format!("/proc/meminfo has no {name}"))
    };
    Ok(MemInfo {
        total_bytes: field("MemTotal")?,
        available_bytes: field("MemAvailable")?,
    })
}

/// Resident bytes from `/proc/self/statm` (second field, in pages).
pub fn parse_statm(text: &str, page_bytes: u64) -> Option<u64> {
    text.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|p| p * page_bytes)
}

/// The kernel's TCP buffer memory from `/proc/net/sockstat` (`TCP: ... mem N`), in pages.
pub fn parse_sockstat_tcp_pages(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("TCP:"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let i = words.iter().position(|w| *w == "mem")?;
    words.get(i + 1)?.parse().ok()
}

/// Chooses the budget: the setting, else the cgroup limit (at most RAM), else RAM.
pub fn choose_budget(
    env: Option<u64>,
    cgroup: Option<(CgroupVersion, u64)>,
    ram_bytes: u64,
) -> (u64, BudgetSource) {
    if let Some(b) = env {
        return (b, BudgetSource::Env);
    }
    match cgroup {
        Some((v, limit)) if limit < ram_bytes => (
            limit,
            if v == CgroupVersion::V2 {
                BudgetSource::Cgroup2
            } else {
                BudgetSource::Cgroup1
            },
        ),
        _ => (ram_bytes, BudgetSource::Ram),
    }
}

/// One measurement of memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemorySample {
    /// What combd counts as its own: RSS, or where the budget is the cgroup's limit, the
    /// cgroup's usage less its inactive file cache (which includes kernel socket memory).
    pub own_bytes: u64,
    /// The process's resident set.
    pub rss_bytes: u64,
    /// The cgroup's usage less inactive file cache, where a cgroup limit was found.
    pub cgroup_bytes: Option<u64>,
    /// `MemTotal`.
    pub machine_total_bytes: u64,
    /// `MemAvailable`.
    pub machine_available_bytes: u64,
    /// The kernel's TCP buffer memory (machine-wide).
    pub tcp_kernel_bytes: u64,
}

/// Reads the memory figures. Built once at start-up; [`MemoryProbe::sample`] reads a few small
/// files each time.
#[derive(Debug, Clone)]
pub struct MemoryProbe {
    /// The memory cgroup directory with a limit, if any.
    pub cgroup: Option<(CgroupVersion, PathBuf)>,
    /// The cgroup's limit, if any.
    pub cgroup_limit: Option<u64>,
    /// The budget in force.
    pub budget_bytes: u64,
    /// Where it came from.
    pub budget_source: BudgetSource,
    page_bytes: u64,
}

impl MemoryProbe {
    /// Finds the cgroup (from the files under `/proc/self`) and decides the budget.
    pub fn discover(env_budget: Option<u64>) -> io::Result<MemoryProbe> {
        let proc_cgroup = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Self::discover_in(
            env_budget,
            &proc_cgroup,
            &mountinfo,
            Path::new("/proc/meminfo"),
        )
    }

    /// [`MemoryProbe::discover`] on given texts (fixtures in tests).
    pub fn discover_in(
        env_budget: Option<u64>,
        proc_cgroup: &str,
        mountinfo: &str,
        meminfo: &Path,
    ) -> io::Result<MemoryProbe> {
        let mem = parse_meminfo(&fs::read_to_string(meminfo)?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut found = None;
        for (version, dir) in memory_cgroup_candidates(proc_cgroup, mountinfo) {
            let file = match version {
                CgroupVersion::V2 => "memory.max",
                CgroupVersion::V1 => "memory.limit_in_bytes",
            };
            let Ok(text) = fs::read_to_string(dir.join(file)) else {
                continue;
            };
            match parse_limit(&text) {
                Ok(Some(limit)) => {
                    found = Some((version, dir, limit));
                    break;
                }
                // No limit here: a parent may still have one.
                Ok(None) => continue,
                Err(e) => {
                    tracing_warn(&format!("ignoring {}: {e}", dir.join(file).display()));
                    continue;
                }
            }
        }
        let (budget_bytes, budget_source) = choose_budget(
            env_budget,
            found.as_ref().map(|(v, _, l)| (*v, *l)),
            mem.total_bytes,
        );
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .unwrap_or(0);
        Ok(MemoryProbe {
            cgroup_limit: found.as_ref().map(|(_, _, l)| *l),
            cgroup: found.map(|(v, d, _)| (v, d)),
            budget_bytes,
            budget_source,
            page_bytes: if page > 0 { page as u64 } else { 4096 },
        })
    }

    /// Reads the current figures.
    pub fn sample(&self) -> io::Result<MemorySample> {
        let mem = parse_meminfo(&fs::read_to_string("/proc/meminfo")?)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let rss =
            parse_statm(&fs::read_to_string("/proc/self/statm")?, self.page_bytes).unwrap_or(0);
        let cgroup_bytes = self.cgroup.as_ref().and_then(|(v, dir)| {
            let (usage_file, inactive_key) = match v {
                CgroupVersion::V2 => ("memory.current", "inactive_file"),
                CgroupVersion::V1 => ("memory.usage_in_bytes", "total_inactive_file"),
            };
            let usage = parse_bytes_file(&fs::read_to_string(dir.join(usage_file)).ok()?).ok()?;
            let inactive = fs::read_to_string(dir.join("memory.stat"))
                .ok()
                .and_then(|t| parse_memory_stat(&t, inactive_key))
                .unwrap_or(0);
            Some(usage.saturating_sub(inactive))
        });
        let counts_cgroup = matches!(
            self.budget_source,
            BudgetSource::Cgroup1 | BudgetSource::Cgroup2
        );
        let own = match cgroup_bytes {
            Some(c) if counts_cgroup => c.max(rss),
            _ => rss,
        };
        let tcp_pages = fs::read_to_string("/proc/net/sockstat")
            .ok()
            .and_then(|t| parse_sockstat_tcp_pages(&t))
            .unwrap_or(0);
        Ok(MemorySample {
            own_bytes: own,
            rss_bytes: rss,
            cgroup_bytes,
            machine_total_bytes: mem.total_bytes,
            machine_available_bytes: mem.available_bytes,
            tcp_kernel_bytes: tcp_pages * self.page_bytes,
        })
    }
}

/// The kernel crate has no logger; a malformed cgroup file is reported on stderr once at
/// start-up and otherwise ignored (as Seastar does: warn, don't crash).
fn tracing_warn(msg: &str) {
    eprintln!("combd: warning: {msg}");
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");

    fn fixture(name: &str) -> String {
        fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap()
    }

    #[test]
    fn proc_cgroup_v1_and_v2() {
        let (v2, v1) = parse_proc_cgroup(&fixture("v1/proc_self_cgroup"));
        assert_eq!(v2.as_deref(), Some("/"));
        assert_eq!(
            v1.as_deref(),
            Some("/process_api/f56757e664e9ce967a97fcef12e6035c")
        );
        let (v2, v1) = parse_proc_cgroup(&fixture("v2/proc_self_cgroup"));
        assert_eq!(v2.as_deref(), Some("/system.slice/combd.service"));
        assert_eq!(v1, None);
    }

    #[test]
    fn candidates_walk_up_from_the_process_cgroup() {
        let c = memory_cgroup_candidates(&fixture("v2/proc_self_cgroup"), &fixture("v2/mountinfo"));
        let dirs: Vec<String> = c.iter().map(|(_, d)| d.display().to_string()).collect();
        assert_eq!(
            dirs,
            [
                "/sys/fs/cgroup/system.slice/combd.service",
                "/sys/fs/cgroup/system.slice",
                "/sys/fs/cgroup"
            ]
        );
        assert!(c.iter().all(|(v, _)| *v == CgroupVersion::V2));

        // v1 machine: the v2 hierarchy (without the memory controller) comes first, then v1.
        let c = memory_cgroup_candidates(&fixture("v1/proc_self_cgroup"), &fixture("v1/mountinfo"));
        assert_eq!(
            c[0],
            (CgroupVersion::V2, PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            c[1],
            (
                CgroupVersion::V1,
                PathBuf::from("/sys/fs/cgroup/memory/process_api/f56757e664e9ce967a97fcef12e6035c")
            )
        );
        assert_eq!(
            c.last().unwrap(),
            &(CgroupVersion::V1, PathBuf::from("/sys/fs/cgroup/memory"))
        );
    }

    #[test]
    fn container_mount_root_is_stripped() {
        let proc = "0::/docker/abc\n";
        let mi = "30 20 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let c = memory_cgroup_candidates(proc, mi);
        assert_eq!(c, [(CgroupVersion::V2, PathBuf::from("/sys/fs/cgroup"))]);
    }

    #[test]
    fn mountinfo_escapes() {
        let m = parse_mountinfo("1 2 0:1 / /mnt/a\\040b rw - cgroup2 none rw\n1 2 0:1 /\\777 /x rw - t t rw\nshort line\n");
        assert_eq!(m[0].mount_point, "/mnt/a b");
        assert_eq!(m[1].root, "/\u{1ff}");
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn limits() {
        assert_eq!(parse_limit("max\n"), Ok(None));
        assert_eq!(parse_limit("9223372036854771712\n"), Ok(None));
        assert_eq!(parse_limit(&fixture("v2/memory.max")), Ok(Some(1 << 30)));
        assert_eq!(parse_limit(&fixture("v1/memory.limit_in_bytes")), Ok(None));
        assert!(parse_limit("lots").is_err());
        assert_eq!(
            parse_memory_stat(&fixture("v1/memory.stat"), "total_inactive_file"),
            Some(475160576)
        );
        assert_eq!(
            parse_memory_stat(&fixture("v2/memory.stat"), "inactive_file"),
            Some(1048576)
        );
        assert_eq!(parse_memory_stat("file 1\n", "inactive_file"), None);
    }

    #[test]
    fn meminfo_statm_sockstat() {
        let m = parse_meminfo(&fixture("meminfo")).unwrap();
        assert_eq!(m.total_bytes, 24_684_084 * 1024);
        assert_eq!(m.available_bytes, 24_337_020 * 1024);
        assert!(parse_meminfo("MemTotal: 1 kB\n").is_err());
        assert_eq!(
            parse_statm("5000 1200 300 10 0 800 0\n", 4096),
            Some(1200 * 4096)
        );
        assert_eq!(parse_sockstat_tcp_pages(&fixture("sockstat")), Some(59));
    }

    #[test]
    fn budget_choice() {
        let ram = 8 << 30;
        assert_eq!(
            choose_budget(Some(1 << 20), Some((CgroupVersion::V2, 1 << 30)), ram),
            (1 << 20, BudgetSource::Env)
        );
        assert_eq!(
            choose_budget(None, Some((CgroupVersion::V2, 1 << 30)), ram),
            (1 << 30, BudgetSource::Cgroup2)
        );
        assert_eq!(
            choose_budget(None, Some((CgroupVersion::V1, 1 << 30)), ram),
            (1 << 30, BudgetSource::Cgroup1)
        );
        assert_eq!(
            choose_budget(None, Some((CgroupVersion::V1, 16 << 30)), ram),
            (ram, BudgetSource::Ram)
        );
        assert_eq!(choose_budget(None, None, ram), (ram, BudgetSource::Ram));
    }

    #[test]
    fn discovery_on_a_fixture_tree() {
        // A v2 tree laid out under a temporary directory, with the limit on the parent.
        let root = std::env::temp_dir().join(format!("combd-cg-{}", std::process::id()));
        let leaf = root.join("system.slice/combd.service");
        fs::create_dir_all(&leaf).unwrap();
        fs::write(leaf.join("memory.max"), "max\n").unwrap();
        fs::write(
            root.join("system.slice/memory.max"),
            fixture("v2/memory.max"),
        )
        .unwrap();
        let mountinfo = format!("30 20 0:26 / {} rw - cgroup2 cgroup2 rw\n", root.display());
        let meminfo = Path::new(FIXTURES).join("meminfo");
        let p = MemoryProbe::discover_in(
            None,
            "0::/system.slice/combd.service\n",
            &mountinfo,
            &meminfo,
        )
        .unwrap();
        assert_eq!(p.budget_source, BudgetSource::Cgroup2);
        assert_eq!(p.budget_bytes, 1 << 30);
        assert_eq!(p.cgroup.as_ref().unwrap().1, root.join("system.slice"));
        let p = MemoryProbe::discover_in(
            Some(512 << 20),
            "0::/system.slice/combd.service\n",
            &mountinfo,
            &meminfo,
        )
        .unwrap();
        assert_eq!(
            (p.budget_bytes, p.budget_source),
            (512 << 20, BudgetSource::Env)
        );
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn sampling_this_process_works() {
        let p = MemoryProbe::discover(None).unwrap();
        let s = p.sample().unwrap();
        assert!(s.rss_bytes > 0 && s.own_bytes >= s.rss_bytes);
        assert!(s.machine_total_bytes >= s.machine_available_bytes);
    }
}
