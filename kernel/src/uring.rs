//! Whether this process may use io_uring as the shards need it, asked once before they start.
//!
//! glommio, under every shard, sets up three rings per shard and checks a list of opcodes; where
//! io_uring is refused it panics inside each shard thread (with a message about an old kernel,
//! whatever the cause) and leaves the process alive holding its ports. [`probe`] asks the same
//! questions first: it sets up a two-entry ring, asks the kernel which opcodes it supports
//! (`IORING_REGISTER_PROBE`), and closes it. A refusal comes back as one line naming the cause
//! and what to do about it ([`Unusable`]).
//!
//! The causes, from the `errno` of `io_uring_setup`:
//! - `EPERM`: blocked by a seccomp filter (Docker's and podman's default profiles, since 2023)
//!   or by the `kernel.io_uring_disabled` sysctl (2: for everyone; 1: for processes outside
//!   `kernel.io_uring_group`);
//! - `ENOSYS`: a kernel without io_uring (before 5.1, built without `CONFIG_IO_URING`, or a
//!   sandbox such as gVisor that does not implement it);
//! - `ENOMEM`: the locked-memory limit (`RLIMIT_MEMLOCK`) too small for a ring (kernels before
//!   5.12 charge rings to it);
//! - anything else, named.

use std::fmt;

/// The io_uring opcodes glommio 0.9 checks for at start (`GLOMMIO_URING_OPS`), by number
/// (`include/uapi/linux/io_uring.h`) and name.
pub const NEEDED_OPS: &[(u8, &str)] = &[
    (0, "NOP"),
    (1, "READV"),
    (2, "WRITEV"),
    (3, "FSYNC"),
    (4, "READ_FIXED"),
    (5, "WRITE_FIXED"),
    (6, "POLL_ADD"),
    (7, "POLL_REMOVE"),
    (9, "SENDMSG"),
    (10, "RECVMSG"),
    (11, "TIMEOUT"),
    (12, "TIMEOUT_REMOVE"),
    (13, "ACCEPT"),
    (15, "LINK_TIMEOUT"),
    (16, "CONNECT"),
    (17, "FALLOCATE"),
    (18, "OPENAT"),
    (19, "CLOSE"),
    (21, "STATX"),
    (22, "READ"),
    (23, "WRITE"),
    (26, "SEND"),
    (27, "RECV"),
];

/// Why io_uring cannot serve the shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unusable {
    /// `io_uring_setup` failed.
    Setup {
        /// Its `errno`.
        errno: i32,
        /// The `kernel.io_uring_disabled` sysctl, where the kernel has it.
        disabled: Option<u8>,
    },
    /// The ring was set up but could not be probed (`IORING_REGISTER_PROBE`, 5.6+).
    Probe {
        /// Its `errno`.
        errno: i32,
    },
    /// The kernel lacks opcodes glommio needs (kernels before 5.8).
    MissingOps(Vec<&'static str>),
}

impl fmt::Display for Unusable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let errno = |e: i32| std::io::Error::from_raw_os_error(e);
        match self {
            Unusable::Setup {
                errno: nix::libc::EPERM,
                disabled: Some(d @ 1..),
            } => write!(
                f,
                "io_uring is disabled by the kernel.io_uring_disabled sysctl ({d}): \
                 set it to 0 (sysctl -w kernel.io_uring_disabled=0){}",
                if *d == 1 {
                    ", or run combd in kernel.io_uring_group"
                } else {
                    ""
                }
            ),
            Unusable::Setup {
                errno: nix::libc::EPERM,
                ..
            } => f.write_str(
                "io_uring is blocked (io_uring_setup: EPERM), most likely by a seccomp filter: \
                 Docker's and podman's default profiles block it; run the container with a \
                 profile that allows io_uring_setup, io_uring_enter and io_uring_register \
                 (--security-opt seccomp=<profile.json>, or seccomp=unconfined)",
            ),
            Unusable::Setup {
                errno: nix::libc::ENOSYS,
                ..
            } => f.write_str(
                "io_uring is not available (io_uring_setup: ENOSYS): the kernel is older than \
                 5.8 or built without CONFIG_IO_URING, or a sandbox (gVisor) does not \
                 implement it; combd needs Linux 5.8 or later with io_uring",
            ),
            Unusable::Setup {
                errno: nix::libc::ENOMEM,
                ..
            } => f.write_str(
                "io_uring cannot set up a ring (io_uring_setup: ENOMEM): raise the \
                 locked-memory limit (ulimit -l, LimitMEMLOCK= in the unit), which kernels \
                 before 5.12 charge rings to",
            ),
            Unusable::Setup { errno: e, .. } => {
                write!(
                    f,
                    "io_uring cannot be set up (io_uring_setup: {})",
                    errno(*e)
                )
            }
            Unusable::Probe { errno: e } => write!(
                f,
                "io_uring cannot be probed (IORING_REGISTER_PROBE: {}): combd needs Linux 5.8 \
                 or later",
                errno(*e)
            ),
            Unusable::MissingOps(ops) => write!(
                f,
                "the kernel's io_uring lacks {}: combd needs Linux 5.8 or later",
                ops.join(", ")
            ),
        }
    }
}

/// The opcodes of [`NEEDED_OPS`] a probe's answer does not mark supported. `probe` is the
/// kernel's `struct io_uring_probe`: a 16-byte header (`last_op`, `ops_len`, reserved) and
/// `ops_len` entries of 8 bytes (`op`, reserved, `flags`, reserved).
pub fn missing_ops(probe: &[u8]) -> Vec<&'static str> {
    const SUPPORTED: u16 = 1; // IO_URING_OP_SUPPORTED
    let ops_len = probe.get(1).copied().unwrap_or(0) as usize;
    let supported = |op: u8| {
        (0..ops_len).any(|i| {
            let e = 16 + i * 8;
            probe.get(e..e + 8).is_some_and(|entry| {
                entry[0] == op && u16::from_ne_bytes([entry[2], entry[3]]) & SUPPORTED != 0
            })
        })
    };
    NEEDED_OPS
        .iter()
        .filter(|(op, _)| !supported(*op))
        .map(|(_, name)| *name)
        .collect()
}

/// The `kernel.io_uring_disabled` sysctl, where the kernel has it (6.6+).
fn disabled_sysctl() -> Option<u8> {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Asks the kernel whether this process may use io_uring with every opcode glommio needs.
pub fn probe() -> Result<(), Unusable> {
    // struct io_uring_params: 120 bytes, zeroed (no flags).
    let mut params = [0u32; 30];
    // SAFETY: io_uring_setup reads and writes the 120-byte params buffer it is given.
    let fd =
        unsafe { nix::libc::syscall(nix::libc::SYS_io_uring_setup, 2u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(Unusable::Setup {
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            disabled: disabled_sysctl(),
        });
    }
    // SAFETY: the descriptor was just returned to us and nothing else owns it.
    let ring = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    const IORING_REGISTER_PROBE: u32 = 8;
    const PROBE_OPS: usize = 256;
    let mut probe = vec![0u8; 16 + PROBE_OPS * 8];
    // SAFETY: the probe buffer has room for its header and PROBE_OPS entries, as nr_args says.
    let rc = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_io_uring_register,
            std::os::fd::AsRawFd::as_raw_fd(&ring),
            IORING_REGISTER_PROBE,
            probe.as_mut_ptr(),
            PROBE_OPS as u32,
        )
    };
    if rc < 0 {
        return Err(Unusable::Probe {
            errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        });
    }
    let missing = missing_ops(&probe);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Unusable::MissingOps(missing))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe_answer(ops: &[(u8, u16)]) -> Vec<u8> {
        let mut p = vec![0u8; 16];
        p[0] = ops.iter().map(|o| o.0).max().unwrap_or(0);
        p[1] = ops.len() as u8;
        for &(op, flags) in ops {
            let mut e = [0u8; 8];
            e[0] = op;
            e[2..4].copy_from_slice(&flags.to_ne_bytes());
            p.extend_from_slice(&e);
        }
        p
    }

    #[test]
    fn a_probe_answer_names_the_opcodes_it_lacks() {
        let all: Vec<(u8, u16)> = (0..=40).map(|op| (op, 1)).collect();
        assert!(missing_ops(&probe_answer(&all)).is_empty());
        // A 5.6 kernel: no SEND/RECV... as not supported; one entry's flag off.
        let old: Vec<(u8, u16)> = (0..=25)
            .map(|op| (op, if op == 21 { 0 } else { 1 }))
            .collect();
        assert_eq!(missing_ops(&probe_answer(&old)), ["STATX", "SEND", "RECV"]);
        assert_eq!(missing_ops(&[]).len(), NEEDED_OPS.len(), "an empty answer");
        assert_eq!(
            missing_ops(&[0, 200]).len(),
            NEEDED_OPS.len(),
            "a cut answer"
        );
    }

    #[test]
    fn each_cause_says_what_to_do() {
        let setup = |errno, disabled| Unusable::Setup { errno, disabled }.to_string();
        assert!(setup(nix::libc::EPERM, None).contains("seccomp"));
        assert!(setup(nix::libc::EPERM, Some(0)).contains("seccomp"));
        assert!(setup(nix::libc::EPERM, Some(2)).contains("kernel.io_uring_disabled=0"));
        assert!(setup(nix::libc::EPERM, Some(1)).contains("io_uring_group"));
        assert!(setup(nix::libc::ENOSYS, None).contains("5.8"));
        assert!(setup(nix::libc::ENOMEM, None).contains("ulimit -l"));
        assert!(setup(nix::libc::EINVAL, None).contains("io_uring_setup"));
        assert!(Unusable::MissingOps(vec!["SEND"])
            .to_string()
            .contains("lacks SEND"));
    }

    #[test]
    fn this_machine_has_io_uring() {
        assert_eq!(probe(), Ok(()));
    }
}
