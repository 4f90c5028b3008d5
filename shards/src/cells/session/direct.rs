//! The fan-out's own writes: a session whose connection waits in its read gets its frames
//! from the fan-out in one send, without its connection being woken, and what such a write
//! cuts short is finished by the connection before anything else.

use std::collections::VecDeque;
use std::time::Instant;

use super::Sessions;
use crate::stats::ShardStats;
use crate::ws::OutFrame;

impl Sessions {
    /// Lets the fan-out write a session's mail to `fd` itself while its connection waits to
    /// read (see [`Sessions::write_direct`]).
    pub fn set_direct(&self, id: u64, fd: i32) {
        if let Some(s) = self.map.borrow_mut().get_mut(&id) {
            s.fd = fd;
        }
    }

    /// Whether a frame written in part by the fan-out still has its rest waiting: then the
    /// connection may write nothing but that rest, and closes without a close frame.
    pub fn is_cut(&self, id: u64) -> bool {
        self.map.borrow().get(&id).is_some_and(|s| s.cut)
    }

    /// The connection takes the rest of a cut frame (at the head of the mail it takes next):
    /// true if there was one.
    pub fn take_cut(&self, id: u64) -> bool {
        self.map
            .borrow_mut()
            .get_mut(&id)
            .is_some_and(|s| std::mem::take(&mut s.cut))
    }

    /// Writes a session's mail from the fan-out, without waking its connection, when the
    /// connection waits in its read (nothing else of it is being written), the socket is one
    /// the fan-out may write to, and the shard is not behind. A write the kernel takes part of leaves the rest at the
    /// head of the mail, marked cut. False: the connection is to be woken to write the mail.
    pub(super) fn write_direct(&self, id: u64, slot: usize) -> bool {
        // While the shard is behind, connections wait their turn to be awake (`max_awake`):
        // one written here would go before those already waiting.
        if self.state.is_behind() || !self.state.is_reading(slot) {
            return false;
        }
        let mut map = self.map.borrow_mut();
        let Some(s) = map.get_mut(&id) else {
            return true;
        };
        if s.fd < 0 || s.cut || s.closing.is_some() || s.missed || s.mail.is_empty() {
            return false;
        }
        let joined;
        let bytes: &[u8] = if s.mail.len() == 1 {
            s.mail[0].plain()
        } else {
            joined = s.mail.iter().fold(Vec::new(), |mut v, f| {
                v.extend_from_slice(f.plain());
                v
            });
            &joined
        };
        use nix::sys::socket::{send, MsgFlags};
        let n = match send(s.fd, bytes, MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL) {
            Ok(n) if n > 0 => n,
            // Full, or failing: the connection finds out as it writes.
            _ => return false,
        };
        let stats = self.state.stats();
        ShardStats::add(&stats.ws_sends, 1);
        ShardStats::add(&stats.ws_direct_sends, 1);
        ShardStats::add(&stats.bytes_out, n as u64);
        s.release_waiting(&self.state, n as u64);
        s.stuck_since = (s.waiting_bytes > 0).then(Instant::now);
        // Off the mail: what was sent whole, counted as messages; a frame sent in part becomes
        // its rest.
        let mut left = n;
        while let Some(f) = s.mail.front() {
            let len = f.plain().len();
            if left < len {
                if left > 0 {
                    let rest = OutFrame::rest(&f.plain()[left..]);
                    if !f.is_rest() {
                        ShardStats::add(&stats.ws_messages_out, 1);
                    }
                    s.mail[0] = rest;
                    s.cut = true;
                    ShardStats::add(&stats.ws_direct_cut, 1);
                }
                break;
            }
            if !f.is_rest() {
                ShardStats::add(&stats.ws_messages_out, 1);
            }
            left -= len;
            s.mail.pop_front();
        }
        if s.mail.is_empty() {
            s.mail = VecDeque::new();
            true
        } else {
            false
        }
    }
}
