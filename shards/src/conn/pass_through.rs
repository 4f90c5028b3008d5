//! A WebSocket passed through whole to its object's owner (in a fleet): browsers do not follow
//! redirects on an upgrade, so a node asked for an object another node owns opens a connection
//! to the owner's fleet address, sends it the client's upgrade request (marked forwarded, so
//! the owner never passes it on again), and from then on copies bytes both ways. The owner
//! answers the upgrade, runs the session and pings the client; this node only carries bytes.
//!
//! Memory: nothing is buffered while both sides are idle. Reads go into the shard's scratch
//! buffer and are written on at once; only what the other side cannot take yet is kept.
//!
//! It ends when both sides have closed (each side's end is passed on as a half close, and the
//! other side then has `CLOSE_LINGER` to end), when either side fails, or when the node drains (both connections are closed: the client
//! reconnects, as after any close of its WebSocket).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use combd_kernel::limits;
use futures_lite::io::AsyncWriteExt;
use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;

use crate::fleet::{Attempt, Failed, Fleet};
use crate::state::ShardState;
use crate::stats::ShardStats;

use super::Conn;

/// One direction of the copy.
#[derive(Default)]
struct OneWay {
    /// Read but not yet written on (empty and unallocated while it keeps up).
    pending: Vec<u8>,
    /// Written but maybe not flushed (TLS keeps records until flushed).
    unflushed: bool,
    /// The reading side closed.
    eof: bool,
    /// The end was passed on (the writing side shut down).
    shut: bool,
    /// Bytes read so far.
    moved: u64,
    /// The owner's side: an end before any byte is not passed on (the client is answered
    /// 503 instead).
    must_answer: bool,
}

impl OneWay {
    /// Copies from `from` to `to` until `from` would block; `Ready(Ok)` once `from` ended
    /// and its end was passed on (not passed on if nothing was read and `must_answer`: the
    /// caller answers instead). `count` adds the bytes read.
    fn poll_copy(
        &mut self,
        cx: &mut Context<'_>,
        state: &ShardState,
        mut from: Pin<&mut impl AsyncRead>,
        mut to: Pin<&mut impl AsyncWrite>,
        count: &dyn Fn(u64),
    ) -> Poll<io::Result<()>> {
        loop {
            while !self.pending.is_empty() {
                match to.as_mut().poll_write(cx, &self.pending) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(n)) => {
                        self.pending.drain(..n);
                        self.unflushed = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            self.pending = Vec::new();
            if self.unflushed {
                match to.as_mut().poll_flush(cx) {
                    Poll::Ready(Ok(())) => self.unflushed = false,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => return Poll::Pending,
                }
            }
            if self.eof {
                if !self.shut && (self.moved > 0 || !self.must_answer) {
                    match to.as_mut().poll_close(cx) {
                        Poll::Ready(r) => {
                            self.shut = true;
                            r?;
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                }
                return Poll::Ready(Ok(()));
            }
            let mut scratch = state.scratch();
            let n = match from.as_mut().poll_read(cx, &mut scratch[..]) {
                Poll::Ready(Ok(0)) => {
                    self.eof = true;
                    continue;
                }
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            count(n as u64);
            self.moved += n as u64;
            // Written on at once; only what the other side cannot take now is kept.
            match to.as_mut().poll_write(cx, &scratch[..n]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(m)) => {
                    self.unflushed = true;
                    self.pending.extend_from_slice(&scratch[m..n]);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => self.pending.extend_from_slice(&scratch[..n]),
            }
        }
    }
}

/// How a pass-through ended.
#[derive(Debug, PartialEq, Eq)]
enum End {
    /// Both sides closed.
    Closed,
    /// A side failed.
    Failed,
    /// The node drains.
    Drain,
    /// One side ended and the other did not within the linger.
    Lingered,
    /// The owner closed without answering the upgrade.
    NoAnswer,
    /// The owner did not answer the upgrade within `FLEET_FORWARD_TIMEOUT` (frozen, or cut
    /// off after the connect).
    NoAnswerInTime,
}

/// A WebSocket upgrade passed through to its object's owner, `owner` (a fleet address), over
/// the client's connection `conn`.
pub(super) struct PassThrough<'a> {
    pub conn: &'a mut Conn,
    pub owner: &'a str,
    /// The object, for the log.
    pub object: &'a str,
}

impl PassThrough<'_> {
    /// Answers the upgrade 503 (retry-after 1): its object's owner cannot be reached.
    async fn owner_unreachable(&mut self) {
        let resp = crate::fleet::owner_unreachable();
        let mut out = Vec::new();
        self.conn
            .respond(&mut out, &resp, false, false, super::Asked::Upgrade);
        self.conn.flush_and_close(&mut out).await;
    }

    /// The pass-through failed before the owner answered (`how`, `why`): counted, the owner
    /// reported, and the client answered 503.
    async fn failed(&mut self, fleet: &Fleet, attempt: Attempt, how: Failed, why: &str) {
        let (owner, object) = (self.owner, self.object);
        fleet.owner_failed(owner, attempt, how);
        fleet.stats.ws_pass_failed();
        tracing::warn!(object, %owner, "cannot pass the WebSocket on to the owner: {why}");
        self.owner_unreachable().await;
    }

    /// Passes the connection through, starting with `replay` (the client's upgrade request,
    /// marked forwarded and signed for the owner) and what the client sent after it.
    /// Answers 503 (retry-after 1) if the owner cannot be reached.
    pub(super) async fn run(mut self, replay: super::upgrade::Replay) {
        let Some(fleet) = self.conn.state().node().fleet.clone() else {
            return;
        };
        let Some(attempt) = fleet.may_try(self.owner) else {
            // It made a request wait in vain a moment ago: answered at once, not after a
            // timeout.
            self.owner_unreachable().await;
            return;
        };
        let connected = connect_owner(self.owner, attempt.connect_within()).await;
        // The owner counts as reached only once it answers (a frozen node's kernel still
        // accepts connections).
        let mut upstream = match connected {
            Ok(s) => s,
            Err((how, e)) => return self.failed(&fleet, attempt, how, &e).await,
        };
        super::set_socket_options(&upstream);
        let _passing = fleet.stats.ws_passing();
        // What the client sent after its request (frames it did not wait to send) follows it.
        let mut first = replay.signed(&fleet, self.owner);
        first.append(&mut self.conn.inbuf);
        self.conn.inbuf = Vec::new();
        if let Err(e) = upstream.write_all(&first).await {
            let why = format!("sending the upgrade: {e}");
            return self.failed(&fleet, attempt, Failed::AtOnce, &why).await;
        }
        drop(first);
        let end = self.relay(&mut upstream, &fleet).await;
        let state = self.conn.state();
        state.set_deadline(self.conn.waker.index(), 0);
        drop(upstream);
        let failed = match end {
            End::NoAnswer => Some((Failed::AtOnce, "it closed without answering")),
            End::NoAnswerInTime => Some((Failed::Waited, "it did not answer in time")),
            _ => None,
        };
        if let Some((how, why)) = failed {
            return self.failed(&fleet, attempt, how, why).await;
        }
        let (owner, object) = (self.owner, self.object);
        tracing::debug!(object, %owner, ?end, "WebSocket passed through to its owner ended");
    }

    /// Copies bytes both ways between the client and the owner until one side ends (and the
    /// other's linger), the owner fails to answer in time, or the shard drains.
    async fn relay(&mut self, upstream: &mut TcpStream, fleet: &Fleet) -> End {
        let conn = &mut *self.conn;
        let owner = self.owner;
        let state = conn.state().clone();
        let stats = state.stats();
        let mut up = OneWay::default();
        let mut down = OneWay {
            must_answer: true,
            ..OneWay::default()
        };
        let slot = conn.waker.index();
        // The owner answers the upgrade within `FLEET_FORWARD_TIMEOUT`, as it would a request
        // passed on.
        let answer_by = state.deadline_after(limits::FLEET_FORWARD_TIMEOUT);
        state.set_deadline(slot, answer_by);
        let mut answered = false;
        // Once one side has ended, the other gets `CLOSE_LINGER` to end too (a client that
        // keeps its socket open after the close handshake does not keep this forever).
        let mut linger: Option<u64> = None;
        futures_lite::future::poll_fn(|cx| {
            let waiting = (!answered && down.moved == 0).then_some(answer_by);
            if let Some(end) = ended_by_time(&state, linger, waiting) {
                return Poll::Ready(end);
            }
            let to_owner = up.poll_copy(
                cx,
                &state,
                Pin::new(&mut conn.stream),
                Pin::new(&mut *upstream),
                &|n| ShardStats::add(&stats.bytes_in, n),
            );
            let to_client = down.poll_copy(
                cx,
                &state,
                Pin::new(&mut *upstream),
                Pin::new(&mut conn.stream),
                &|n| ShardStats::add(&stats.bytes_out, n),
            );
            if !answered && down.moved > 0 {
                answered = true;
                fleet.owner_reached(owner);
                if linger.is_none() {
                    state.set_deadline(slot, 0);
                }
            }
            match (to_owner, to_client) {
                // The owner ended or failed before answering (a node that just died: its
                // listening socket can outlive it a moment and accept).
                (_, Poll::Ready(_)) if down.moved == 0 => Poll::Ready(End::NoAnswer),
                (Poll::Ready(Err(_)), _) | (_, Poll::Ready(Err(_))) => Poll::Ready(End::Failed),
                (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => Poll::Ready(End::Closed),
                (to_owner, _) => {
                    if linger.is_none() && (to_owner.is_ready() || down.shut) {
                        let d = state.deadline_after(limits::CLOSE_LINGER);
                        state.set_deadline(slot, d);
                        linger = Some(d);
                    }
                    // A drain wakes the task through its slot.
                    state.park(slot, cx.waker());
                    Poll::Pending
                }
            }
        })
        .await
    }
}

/// Connects to `owner` (a fleet address) within `within`; how and why it failed if it did.
pub(super) async fn connect_owner(
    owner: &str,
    within: std::time::Duration,
) -> Result<TcpStream, (Failed, String)> {
    match owner.parse::<SocketAddr>() {
        Ok(addr) => TcpStream::connect_timeout(addr, within).await.map_err(|e| {
            let e = io::Error::from(e);
            let how = match e.kind() {
                io::ErrorKind::TimedOut => Failed::Waited,
                _ => Failed::AtOnce,
            };
            (how, e.to_string())
        }),
        Err(e) => Err((Failed::AtOnce, format!("{owner:?} is not an address: {e}"))),
    }
}

/// How a relay ends before any bytes move: the shard drains, the linger after one side ended
/// is over, or the owner has not answered by `answer_by` (while it has not).
fn ended_by_time(state: &ShardState, linger: Option<u64>, answer_by: Option<u64>) -> Option<End> {
    let now = state.now_ms();
    if state.draining() {
        Some(End::Drain)
    } else if linger.is_some_and(|d| now >= d) {
        Some(End::Lingered)
    } else if answer_by.is_some_and(|d| now >= d) {
        Some(End::NoAnswerInTime)
    } else {
        None
    }
}
