//! Where io_uring is blocked (Docker's default seccomp profile, gVisor, the
//! `kernel.io_uring_disabled` sysctl), the node stops at once with exit 78 and one line naming
//! io_uring and what to do, instead of panicking in its shards and living on holding its ports.
//! The block is real: the node runs under a seccomp filter, installed in the child before it
//! executes the binary, that makes `io_uring_setup` fail with the errno a blocker returns.
//! A shard that fails at any time ends the process with 70 (`stall`'s `panic=1` panics its
//! shard's loop, as a bug in a native app or in the node would).

#![allow(clippy::unwrap_used)]

mod support;

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use support::*;

/// The bound the issue sets for a node where io_uring is blocked to be gone.
const GONE_WITHIN: Duration = Duration::from_secs(5);

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

fn stmt(code: u32, k: u32) -> nix::libc::sock_filter {
    nix::libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> nix::libc::sock_filter {
    nix::libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// Makes the command's process fail `io_uring_setup` with `errno`, everything else allowed.
fn block_io_uring(cmd: &mut Command, errno: i32) {
    use nix::libc::{BPF_ABS, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let filter = [
        // seccomp_data.arch, at offset 4: another architecture's numbers mean other calls.
        stmt(BPF_LD | BPF_W | BPF_ABS, 4),
        jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET | BPF_K, nix::libc::SECCOMP_RET_ALLOW),
        // seccomp_data.nr, at offset 0.
        stmt(BPF_LD | BPF_W | BPF_ABS, 0),
        jump(
            BPF_JMP | BPF_JEQ | BPF_K,
            nix::libc::SYS_io_uring_setup as u32,
            0,
            1,
        ),
        stmt(BPF_RET | BPF_K, nix::libc::SECCOMP_RET_ERRNO | errno as u32),
        stmt(BPF_RET | BPF_K, nix::libc::SECCOMP_RET_ALLOW),
    ];
    // SAFETY: runs in the child between fork and exec, and makes only two prctl calls (async-
    // signal-safe system calls) on a program that outlives them (`filter` is moved in).
    unsafe {
        cmd.pre_exec(move || {
            let prog = nix::libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut nix::libc::sock_filter,
            };
            if nix::libc::prctl(nix::libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || nix::libc::prctl(
                    nix::libc::PR_SET_SECCOMP,
                    nix::libc::SECCOMP_MODE_FILTER,
                    &prog as *const nix::libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Runs `cmd` to its end, killing it (and failing) if it lives past [`GONE_WITHIN`].
fn gone_within_bound(cmd: &mut Command) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(GONE_WITHIN) {
        Ok(out) => out.unwrap(),
        Err(_) => {
            // SAFETY: kill on our own child's pid, not yet reaped (the waiter holds it).
            unsafe { nix::libc::kill(pid, nix::libc::SIGKILL) };
            panic!("the node still runs {GONE_WITHIN:?} after starting where io_uring is blocked");
        }
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn data_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("combd-uring-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

#[test]
fn blocked_by_seccomp_the_node_exits_78_naming_io_uring() {
    let data = data_dir("eperm");
    let mut cmd = combd_command(&data, &[]);
    block_io_uring(&mut cmd, nix::libc::EPERM);
    let out = gone_within_bound(&mut cmd);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("io_uring is blocked"), "{err}");
    assert!(err.contains("seccomp"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.stdout.is_empty(), "never ready: {:?}", out.stdout);
}

#[test]
fn without_io_uring_in_the_kernel_the_node_exits_78_naming_the_kernel() {
    let data = data_dir("enosys");
    let mut cmd = combd_command(&data, &[]);
    block_io_uring(&mut cmd, nix::libc::ENOSYS);
    let out = gone_within_bound(&mut cmd);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "stderr: {err}");
    assert!(err.contains("io_uring is not available"), "{err}");
    assert!(err.contains("5.8"), "{err}");
}

#[test]
fn check_config_fails_where_io_uring_is_blocked() {
    let data = data_dir("check");
    let mut cmd = combd_command(&data, &[]);
    cmd.arg("--check-config");
    block_io_uring(&mut cmd, nix::libc::EPERM);
    let out = gone_within_bound(&mut cmd);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "stderr: {err}");
    assert!(err.contains("io_uring"), "{err}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("valid"),
        "a check that passes a node that cannot start"
    );
}

/// A shard that panics while serving ends the process with 70 once the other shards drained
/// (bounded by `COMBD_SHUTDOWN_TIMEOUT` and a second; `wait_exit` fails the test past 20 s);
/// its ports go with it.
#[test]
fn a_shard_that_fails_while_serving_ends_the_process_with_70() {
    let mut node = TestNode::start(&[TEST_APPS, ("COMBD_SHUTDOWN_TIMEOUT", "2s")]);
    assert_eq!(post(&node, "/o/counter/a", "").status, 200);
    // The request's connection dies with its shard: no answer is expected.
    let mut s = connect(node.public());
    s.write_all(b"POST /o/stall/x?panic=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        .unwrap();
    let _ = s.read_to_end(&mut Vec::new());
    assert_eq!(node.wait_exit().code(), Some(70));
    // The kernel tears a dead process's rings down after it is reaped, and a listener with a
    // pending accept on one lingers until then: it is refused within the wait.
    let deadline = std::time::Instant::now() + WAIT;
    while std::net::TcpStream::connect(node.public()).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the port still accepts"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
