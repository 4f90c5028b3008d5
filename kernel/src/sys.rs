//! What combd asks the Linux kernel: allowed CPUs, the file-descriptor limit, listener sockets.
//!
//! Each function is a thin wrapper over one or two system calls (through `nix` and `socket2`,
//! so no `unsafe` here); the decisions built on them live elsewhere and take plain values.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use nix::sys::socket::{self as nixsock, sockopt, Backlog};
use socket2::{Domain, Protocol, Socket, TcpKeepalive, Type};

use crate::limits;

/// The CPUs this process may run on (`sched_getaffinity`), in ascending order. `taskset -c 0`
/// gives `[0]`, so the node runs one shard.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    use nix::sched::{sched_getaffinity, CpuSet};
    let set = sched_getaffinity(nix::unistd::Pid::from_raw(0))?;
    // is_set fails only for an index past the set's size, which the range never reaches.
    Ok((0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the new soft limit.
pub fn raise_nofile_limit() -> io::Result<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
        return Ok(hard);
    }
    Ok(soft)
}

fn reuseport_socket(addr: SocketAddr) -> io::Result<Socket> {
    let domain = if addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let sock = Socket::new(domain, Type::STREAM.cloexec(), Some(Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    sock.set_reuse_port(true)?;
    Ok(sock)
}

/// Binds a TCP listener with `SO_REUSEPORT` (so every shard binds the same address and the
/// kernel spreads connections over them) and `SO_REUSEADDR`, and starts listening with
/// `backlog`.
///
/// The socket is always bound to an explicit port. A port of 0 is first resolved by binding a
/// throwaway socket: a socket bound to port 0 does not keep its port through
/// [`stop_listening`] (the kernel releases an automatically chosen port when the listener
/// stops, and `listen` would then pick a new one).
pub fn bind_listener(addr: SocketAddr, backlog: i32) -> io::Result<Socket> {
    let mut addr = addr;
    let _probe = if addr.port() == 0 {
        let probe = reuseport_socket(addr)?;
        probe.bind(&addr.into())?;
        let port = probe.local_addr()?.as_socket().map_or(0, |a| a.port());
        addr.set_port(port);
        Some(probe)
    } else {
        None
    };
    let sock = reuseport_socket(addr)?;
    set_inherited_options(&sock)?;
    sock.bind(&addr.into())?;
    // The backlog through the same check as [`resume_listening`]'s, so one it would refuse fails
    // here, at start-up, and not at the first resume after the node was full. (socket2 0.4's
    // `Socket` has no `AsFd`, so this listen is socket2's.)
    sock.listen(i32::from(Backlog::new(backlog)?))?;
    // Non-blocking, so a shard can empty the accept queue before it stops listening without
    // ever blocking its loop (io_uring's accept works on non-blocking sockets too).
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// Sets on a listener what every connection it accepts gets: no Nagle delay, and TCP keepalive
/// ([`limits::TCP_KEEPIDLE_SECS`], probing every [`limits::TCP_KEEPINTVL_SECS`],
/// [`limits::TCP_KEEPCNT`] times) so the kernel finds half-open peers. Linux copies a listening
/// socket into each connection it accepts, these options with it, so no connection makes the
/// five `setsockopt` calls of its own: they were 11 % of a shard's time while it accepted a
/// burst of 2,000 connections (`perf`, `bench/hostile.py slowloris`, the droplet). A test below
/// checks the inheritance on the running kernel.
fn set_inherited_options(sock: &Socket) -> io::Result<()> {
    sock.set_nodelay(true)?;
    let secs = |s: u32| std::time::Duration::from_secs(u64::from(s));
    sock.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(secs(limits::TCP_KEEPIDLE_SECS))
            .with_interval(secs(limits::TCP_KEEPINTVL_SECS))
            .with_retries(limits::TCP_KEEPCNT),
    )
}

/// Stops a listening socket from taking new connections: after `shutdown(fd, SHUT_RD)` the
/// kernel answers new SYNs with a reset, and a pending accept on it fails. The socket stays
/// bound; [`resume_listening`] turns it back on.
pub fn stop_listening(sock: &impl AsFd) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    Ok(nixsock::shutdown(
        sock.as_fd().as_raw_fd(),
        nixsock::Shutdown::Read,
    )?)
}

/// Makes a socket stopped by [`stop_listening`] listen again with `backlog`. A backlog over
/// `SOMAXCONN` (4096 with glibc) is refused with `EINVAL` (nix's `Backlog`; the kernel itself
/// would cap it at `net.core.somaxconn`); [`bind_listener`] refuses it the same way.
pub fn resume_listening(sock: &impl AsFd, backlog: i32) -> io::Result<()> {
    Ok(nixsock::listen(sock, Backlog::new(backlog)?)?)
}

/// Sets a socket's kernel send buffer (`SO_SNDBUF`; Linux doubles the value for its own
/// bookkeeping). A fixed buffer also stops the kernel from growing it towards `tcp_wmem`'s
/// maximum for a peer that does not read.
pub fn set_send_buffer(sock: &impl AsFd, bytes: usize) -> io::Result<()> {
    // The option is a C int (nix casts, which would wrap a larger value): saturate instead.
    let value = bytes.min(i32::MAX as usize);
    Ok(nixsock::setsockopt(sock, sockopt::SndBuf, &value)?)
}

/// Turns on TCP keepalive on a connected socket with the given idle time, probe interval and
/// probe count, so the kernel resets a connection whose peer vanished without a FIN.
pub fn set_keepalive(
    sock: &impl AsFd,
    idle_secs: u32,
    interval_secs: u32,
    count: u32,
) -> io::Result<()> {
    nixsock::setsockopt(sock, sockopt::KeepAlive, &true)?;
    nixsock::setsockopt(sock, sockopt::TcpKeepIdle, &idle_secs)?;
    nixsock::setsockopt(sock, sockopt::TcpKeepInterval, &interval_secs)?;
    Ok(nixsock::setsockopt(sock, sockopt::TcpKeepCount, &count)?)
}

/// Free bytes (for unprivileged users) and total bytes of the filesystem holding `path`.
pub fn disk_space(path: &std::path::Path) -> io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    // nix would say EINVAL; this says which.
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path has a NUL byte",
        ));
    }
    let st = nix::sys::statvfs::statvfs(path)?;
    let frsize = st.fragment_size() as u64;
    Ok((
        st.blocks_available() as u64 * frsize,
        st.blocks() as u64 * frsize,
    ))
}

/// A TCP port held by this process among combd processes, for the node's life: an
/// abstract-namespace unix socket `\0combd-port-<port>` bound by nobody else. The kernel frees
/// it when the process dies, however it dies. `SO_REUSEPORT` lets a second node bind the same
/// TCP port and silently split its connections; this lock is what refuses it.
#[derive(Debug)]
pub struct PortLock {
    _held: std::os::unix::net::UnixDatagram,
}

/// Takes the lock on `port` (see [`PortLock`]). Another process holding it gives
/// `ErrorKind::AddrInUse`. The abstract namespace is per network namespace, as ports are.
pub fn lock_port(port: u16) -> io::Result<PortLock> {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("combd-port-{port}");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
    std::os::unix::net::UnixDatagram::bind_addr(&addr).map(|held| PortLock { _held: held })
}

/// An exclusive `flock` on a file, held by this process while this lives (see [`lock_file`]).
#[derive(Debug)]
pub struct FileLock {
    _held: nix::fcntl::Flock<std::fs::File>,
}

/// Opens (creating) `path` and takes an exclusive `flock` on it without waiting, then writes
/// this process's id in it. The lock lasts while the returned [`FileLock`] lives, and the
/// kernel drops it when the process dies. Another process holding it gives
/// `ErrorKind::WouldBlock`; [`lock_holder`] reads its id.
pub fn lock_file(path: &std::path::Path) -> io::Result<FileLock> {
    use nix::fcntl::{Flock, FlockArg};
    use std::io::Write as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let mut file = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| e)?;
    file.set_len(0)?;
    writeln!(file, "{}", std::process::id())?;
    Ok(FileLock { _held: file })
}

/// The process id written in a lock file by [`lock_file`], if it can be read.
pub fn lock_holder(path: &std::path::Path) -> Option<u32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::net::TcpStream;

    #[test]
    fn allowed_cpus_is_not_empty() {
        let cpus = allowed_cpus().expect("sched_getaffinity");
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn raise_nofile_reaches_the_hard_limit() {
        use nix::sys::resource::{getrlimit, Resource};
        let soft = raise_nofile_limit().expect("setrlimit");
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
        assert_eq!(soft, hard);
    }

    #[test]
    fn stop_refuses_and_resume_accepts_again() {
        let l = std::net::TcpListener::from(
            bind_listener("127.0.0.2:0".parse().unwrap(), 16).expect("bind"),
        );
        let addr = l.local_addr().unwrap();
        TcpStream::connect(addr).expect("listening: connect succeeds");
        stop_listening(&l).expect("shutdown");
        let e = TcpStream::connect(addr).expect_err("stopped: connect refused");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        resume_listening(&l, 16).expect("listen");
        TcpStream::connect(addr).expect("resumed: connect succeeds");
    }

    #[test]
    fn an_accepted_connection_inherits_the_listeners_options() {
        let l = std::net::TcpListener::from(
            bind_listener("127.0.0.2:0".parse().unwrap(), 16).expect("bind"),
        );
        let _c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (a, _) = l.accept().unwrap();
        let s = socket2::SockRef::from(&a);
        assert!(s.nodelay().unwrap());
        assert!(s.keepalive().unwrap());
        let secs = |d: std::time::Duration| d.as_secs();
        assert_eq!(
            secs(s.keepalive_time().unwrap()),
            u64::from(limits::TCP_KEEPIDLE_SECS)
        );
        assert_eq!(
            secs(s.keepalive_interval().unwrap()),
            u64::from(limits::TCP_KEEPINTVL_SECS)
        );
        assert_eq!(s.keepalive_retries().unwrap(), limits::TCP_KEEPCNT);
    }

    #[test]
    fn keepalive_is_set() {
        let l = bind_listener("127.0.0.2:0".parse().unwrap(), 16).unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap().as_socket().unwrap()).unwrap();
        set_keepalive(&c, 60, 10, 3).unwrap();
        let s = socket2::SockRef::from(&c);
        assert!(s.keepalive().unwrap());
        assert_eq!(s.keepalive_time().unwrap().as_secs(), 60);
        assert_eq!(s.keepalive_interval().unwrap().as_secs(), 10);
        assert_eq!(s.keepalive_retries().unwrap(), 3);
    }

    #[test]
    fn send_buffer_is_set_and_saturates() {
        let l = bind_listener("127.0.0.2:0".parse().unwrap(), 16).unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap().as_socket().unwrap()).unwrap();
        set_send_buffer(&c, 64 * 1024).unwrap();
        // Linux doubles the value for its bookkeeping.
        let s = socket2::SockRef::from(&c);
        assert_eq!(s.send_buffer_size().unwrap(), 2 * 64 * 1024);
        // More than a C int holds is the most it holds (the kernel caps it at wmem_max).
        set_send_buffer(&c, usize::MAX).expect("saturated, not wrapped");
        assert!(s.send_buffer_size().unwrap() >= 2 * 64 * 1024);
    }

    #[test]
    fn a_backlog_over_somaxconn_is_refused_at_bind() {
        let e = bind_listener("127.0.0.2:0".parse().unwrap(), nix::libc::SOMAXCONN + 1)
            .expect_err("nix's Backlog refuses it");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        bind_listener("127.0.0.2:0".parse().unwrap(), nix::libc::SOMAXCONN).expect("at the max");
    }

    #[test]
    fn disk_space_of_a_directory() {
        let (free, total) = disk_space(&std::env::temp_dir()).expect("statvfs");
        assert!(total > 0 && free <= total, "free {free} of {total}");
        let e = disk_space(std::path::Path::new("a\0b")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let e = disk_space(std::path::Path::new("/no/such/combd/dir")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn two_listeners_share_a_port() {
        let a = bind_listener("127.0.0.2:0".parse().unwrap(), 16).unwrap();
        let addr = a.local_addr().unwrap().as_socket().unwrap();
        let _b = bind_listener(addr, 16).expect("SO_REUSEPORT lets a second shard bind");
        let local: SocketAddr = format!("127.0.0.1:{}", addr.port()).parse().unwrap();
        let _c = bind_listener(local, 16).expect("localhost listener on the same port");
    }

    #[test]
    fn a_port_lock_is_held_once_and_freed_on_drop() {
        // A port number no test node uses (they take ports from the kernel's ephemeral range).
        let lock = lock_port(7).expect("free");
        assert_eq!(lock_port(7).unwrap_err().kind(), io::ErrorKind::AddrInUse);
        drop(lock);
        lock_port(7).expect("free again after drop");
    }

    #[test]
    fn a_file_lock_is_exclusive_and_names_its_holder() {
        let path = std::env::temp_dir().join(format!("combd-lock-{}", std::process::id()));
        let held = lock_file(&path).expect("free");
        // flock locks belong to the open file: a second open, even in this process, is refused.
        assert_eq!(
            lock_file(&path).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!(lock_holder(&path), Some(std::process::id()));
        drop(held);
        drop(lock_file(&path).expect("free again after drop"));
        let _ = std::fs::remove_file(&path);
    }
}
