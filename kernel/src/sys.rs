//! What combd asks the Linux kernel: allowed CPUs, the file-descriptor limit, listener sockets.
//!
//! Each function is a thin wrapper over one or two system calls; the decisions built on them
//! live elsewhere and take plain values.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use socket2::{Domain, Protocol, Socket, Type};

/// The CPUs this process may run on (`sched_getaffinity`), in ascending order. `taskset -c 0`
/// gives `[0]`, so the node runs one shard.
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let max = libc::CPU_SETSIZE as usize;
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit and returns the new soft limit.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim = raised;
    }
    Ok(lim.rlim_cur)
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
    sock.bind(&addr.into())?;
    sock.listen(backlog)?;
    // Non-blocking, so a shard can empty the accept queue before it stops listening without
    // ever blocking its loop (io_uring's accept works on non-blocking sockets too).
    sock.set_nonblocking(true)?;
    Ok(sock)
}

/// Stops a listening socket from taking new connections: after `shutdown(fd, SHUT_RD)` the
/// kernel answers new SYNs with a reset, and a pending accept on it fails. The socket stays
/// bound; [`resume_listening`] turns it back on.
pub fn stop_listening(sock: &impl AsRawFd) -> io::Result<()> {
    // SAFETY: shutdown on a descriptor we own.
    if unsafe { libc::shutdown(sock.as_raw_fd(), libc::SHUT_RD) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Makes a socket stopped by [`stop_listening`] listen again with `backlog`.
pub fn resume_listening(sock: &impl AsRawFd, backlog: i32) -> io::Result<()> {
    // SAFETY: listen on a descriptor we own.
    if unsafe { libc::listen(sock.as_raw_fd(), backlog) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets a socket's kernel send buffer (`SO_SNDBUF`; Linux doubles the value for its own
/// bookkeeping). A fixed buffer also stops the kernel from growing it towards `tcp_wmem`'s
/// maximum for a peer that does not read.
pub fn set_send_buffer(sock: &impl AsRawFd, bytes: usize) -> io::Result<()> {
    let value = i32::try_from(bytes).unwrap_or(i32::MAX);
    // SAFETY: setsockopt with a pointer to an i32 and its size.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            &value as *const i32 as *const libc::c_void,
            std::mem::size_of::<i32>() as u32,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns on TCP keepalive on a connected socket with the given idle time, probe interval and
/// probe count, so the kernel resets a connection whose peer vanished without a FIN.
pub fn set_keepalive(
    sock: &impl AsRawFd,
    idle_secs: i32,
    interval_secs: i32,
    count: i32,
) -> io::Result<()> {
    let fd = sock.as_raw_fd();
    let set = |level: i32, name: i32, value: i32| -> io::Result<()> {
        // SAFETY: setsockopt with a pointer to an i32 and its size.
        let rc = unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                &value as *const i32 as *const libc::c_void,
                std::mem::size_of::<i32>() as u32,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, idle_secs)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, interval_secs)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, count)
}

/// Free bytes (for unprivileged users) and total bytes of the filesystem holding `path`.
pub fn disk_space(path: &std::path::Path) -> io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path has a NUL byte"))?;
    // SAFETY: statvfs writes one struct; c is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
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

/// Opens (creating) `path` and takes an exclusive `flock` on it without waiting, then writes
/// this process's id in it. The lock lasts while the returned file is open, and the kernel
/// drops it when the process dies. Another process holding it gives `ErrorKind::WouldBlock`;
/// [`lock_holder`] reads its id.
pub fn lock_file(path: &std::path::Path) -> io::Result<std::fs::File> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    file.set_len(0)?;
    writeln!(file, "{}", std::process::id())?;
    Ok(file)
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
        let soft = raise_nofile_limit().expect("setrlimit");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(soft, lim.rlim_max);
    }

    #[test]
    fn stop_refuses_and_resume_accepts_again() {
        let l = bind_listener("127.0.0.2:0".parse().unwrap(), 16).expect("bind");
        let addr = l.local_addr().unwrap().as_socket().unwrap();
        TcpStream::connect(addr).expect("listening: connect succeeds");
        stop_listening(&l).expect("shutdown");
        let e = TcpStream::connect(addr).expect_err("stopped: connect refused");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
        resume_listening(&l, 16).expect("listen");
        TcpStream::connect(addr).expect("resumed: connect succeeds");
    }

    #[test]
    fn keepalive_is_set() {
        let l = bind_listener("127.0.0.2:0".parse().unwrap(), 16).unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap().as_socket().unwrap()).unwrap();
        set_keepalive(&c, 60, 10, 3).unwrap();
        let s = socket2::SockRef::from(&c);
        assert!(s.keepalive().unwrap());
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
