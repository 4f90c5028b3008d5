//! systemd's notify protocol, by hand: one datagram to `$NOTIFY_SOCKET` per state
//! (`READY=1`, `STOPPING=1`, `WATCHDOG=1`, `STATUS=...`). Without `$NOTIFY_SOCKET` (not under
//! systemd) every call does nothing.

use std::os::unix::net::UnixDatagram;
use std::time::Duration;

/// Sends one notification; errors are ignored (systemd may not be listening).
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    let _ = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        match std::os::unix::net::SocketAddr::from_abstract_name(name) {
            Ok(addr) => sock.send_to_addr(state.as_bytes(), &addr),
            Err(e) => Err(e),
        }
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
}

/// How often to send `WATCHDOG=1`: half of `$WATCHDOG_USEC`, if systemd asked for pings (and
/// `$WATCHDOG_PID`, if set, is this process).
pub fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok()? != std::process::id() {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}
