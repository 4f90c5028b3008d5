//! A connection once upgraded (`upgrade.rs`): [`WsConn`], the WebSocket loop over the
//! connection's I/O core. It decodes frames and hands messages to the app (called right here
//! for a stateless app, sent to the object's mailbox for a session), writes its session's mail
//! while holding an awake slot, keeps the client's message rate, pings it every
//! `COMBD_WS_PING_INTERVAL`, and closes with the code the reason calls for. Every close goes
//! through [`WsConn::close_with`]. It owns its session's outbound side ([`SessionOut`]): the
//! session ends when the loop does, before the connection's socket closes.

use std::time::Instant;

use combd_kernel::limits;
use combd_kernel::settings::Settings;

use crate::app::{Effect, Input as AppInput, Message, SessionId};
use crate::cells::session::{CloseWhy, DirectSocket, SessionOut};
use crate::defer::Defer;
use crate::inbound::Hold;
use crate::job::Job;
use crate::state::ShardState;
use crate::stats::ShardStats;
use crate::ws::deflate::Framing;
use crate::ws::{self, close, Decoder, WsEvent};

use super::addressee::{closing, Addressee, Close};
use super::mux::Mux;
use super::routes::call_stateless;
use super::upgrade::{ForLoop, Upgraded};
use super::{Conn, Watch, Woke};

/// A failed write of a session's output, and whether it cut a frame short (some of it was
/// written, not all).
struct Cut {
    e: std::io::Error,
    cut: bool,
}

/// The longest header of a frame the node sends (unmasked, a 64-bit length: RFC 6455, 5.2).
const FRAME_HEADER_MAX: usize = 10;

/// Where a WebSocket's messages go: one object, or each subscription's of a multiplexed
/// socket (boxed: most sockets are of one object, and the box keeps this as large as that).
enum To {
    One(Addressee),
    Many(Box<Mux>),
}

/// What the loop knows of its WebSocket.
struct Ws {
    to: To,
    decoder: Decoder,
    /// A ping was sent and nothing has come back since.
    awaiting_pong: bool,
    /// The bytes of an incomplete frame and of a message under reassembly, held against the
    /// shard's inbound budget once past a connection's floor. Boxed: a hold (with its
    /// client's share) is 56 bytes that every idle WebSocket's task would carry for none.
    partial: Option<Box<Hold>>,
}

impl Ws {
    /// The loop's state for an upgrade (`up`, taken apart: [`Upgrade::into_loop`]).
    fn new(up: ForLoop, settings: &Settings) -> Ws {
        let ForLoop {
            app,
            object,
            deflate,
            numbered,
            ..
        } = up;
        // The app's own bound on its inputs, within the node's.
        let max_message = app
            .max_input_bytes()
            .map_or(settings.ws_max_message_bytes, |m| {
                m.min(settings.ws_max_message_bytes)
            });
        Ws {
            decoder: Decoder::new(max_message).with_deflate(deflate.is_some()),
            to: To::One(Addressee {
                app,
                object,
                deflate,
                numbered,
            }),
            awaiting_pong: false,
            partial: None,
        }
    }

    /// The loop's state for a multiplexed socket: messages up to the node's bound, never
    /// compressed.
    fn mux(mux: Mux, settings: &Settings) -> Ws {
        Ws {
            decoder: Decoder::new(settings.ws_max_message_bytes),
            to: To::Many(Box::new(mux)),
            awaiting_pong: false,
            partial: None,
        }
    }
}

/// The message rate: a token bucket of `COMBD_WS_BURST` tokens refilled at `COMBD_WS_RATE` a
/// second; each message and ping takes one. Beside it the bytes its compressed messages may
/// decompress to: a bucket of the largest message or a second of `COMBD_WS_INFLATE_RATE`,
/// whichever is more, refilled at that rate. (The rates and sizes are read from the settings
/// when tokens are taken: an idle WebSocket keeps only these three fields.)
struct Rate {
    tokens: f64,
    inflate: f64,
    refilled: Instant,
}

impl Rate {
    fn new(settings: &Settings) -> Rate {
        Rate {
            tokens: settings.ws_burst as f64,
            inflate: inflate_burst(settings),
            refilled: Instant::now(),
        }
    }

    /// Adds what both buckets earned since they were last refilled.
    fn refill(&mut self, settings: &Settings) {
        let now = Instant::now();
        let secs = now.duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + secs * settings.ws_rate as f64).min(settings.ws_burst as f64);
        self.inflate = (self.inflate + secs * settings.ws_inflate_rate_bytes as f64)
            .min(inflate_burst(settings));
        self.refilled = now;
    }

    /// Takes a token; false when none is left.
    fn take(&mut self, settings: &Settings) -> bool {
        self.refill(settings);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }

    /// The bytes its compressed messages may decompress to now.
    fn inflate_allowed(&mut self, settings: &Settings) -> u64 {
        self.refill(settings);
        self.inflate as u64
    }

    /// Its compressed messages decompressed to `bytes`.
    fn inflated(&mut self, bytes: u64) {
        self.inflate = (self.inflate - bytes as f64).max(0.0);
    }
}

/// The bucket of decompressed bytes: a second of `COMBD_WS_INFLATE_RATE`, or the largest
/// message, so that one message of the largest size always passes a full bucket.
fn inflate_burst(settings: &Settings) -> f64 {
    settings
        .ws_inflate_rate_bytes
        .max(settings.ws_max_message_bytes) as f64
}

/// What a decoding of a connection's input ended with.
enum Decoded {
    /// All its complete frames were handled.
    Done,
    /// It handed on [`WS_DECODE_BYTES_PER_TURN`](limits::WS_DECODE_BYTES_PER_TURN), or built
    /// as many bytes of answers: complete frames wait in `inbuf` until what it built is written
    /// and the shard's loop has had a turn.
    Paused,
    /// The WebSocket is to close.
    Close(Close),
}

/// How a decoding of a connection's input ended, before it is said as a [`Decoded`].
struct Ended {
    /// A message or ping past the connection's rate.
    over_rate: bool,
    /// A message's handling closes the WebSocket.
    closing: Option<Close>,
    /// The client's close frame, with its code.
    client_close: Option<Option<u16>>,
    /// The input did not decode.
    error: Option<ws::WsError>,
}

impl Ended {
    /// What the loop does next (`paused`: a turn's worth was handed on and more waits).
    fn decoded(self, stats: &ShardStats, paused: bool) -> Decoded {
        if self.over_rate {
            ShardStats::add(&stats.ws_rate_closed, 1);
            return Decoded::Close(Close::Frame(Some(close::POLICY), "message rate exceeded"));
        }
        if let Some(close) = self.closing {
            return Decoded::Close(close);
        }
        if let Some(code) = self.client_close {
            // Answer the close with the client's code (RFC 6455, 5.5.1), then close.
            return Decoded::Close(Close::Answer(code));
        }
        match self.error {
            Some(e) => Decoded::Close(decode_failed(stats, e)),
            None if paused => Decoded::Paused,
            None => Decoded::Done,
        }
    }
}

/// A connection speaking WebSocket: the loop over its I/O core, with its frames, its rate and
/// its session's outbound side.
pub(super) struct WsConn<'c> {
    conn: &'c mut Conn,
    ws: Ws,
    rate: Rate,
    /// Its session, and what ends its waits beside input.
    watch: Watch,
}

impl Drop for WsConn<'_> {
    /// The session ends with the loop, whatever ended it: from here the fan-out writes to
    /// its socket no more (the connection's stream, which the loop borrowed, outlives it).
    /// Its object is told the session left, as by a close: a task dropped mid-run (its shard
    /// drains) leaves nothing kept for the session behind either.
    fn drop(&mut self) {
        self.leave();
    }
}

impl<'c> WsConn<'c> {
    /// The WebSocket of an upgrade, and its connection set for it. The upgrade's box is freed
    /// here, with what the loop does not need (its accept key, query, replay), not kept for the
    /// WebSocket's life; nothing here sizes the loop's future.
    pub(super) fn new(conn: &'c mut Conn, up: Upgraded) -> WsConn<'c> {
        let state = conn.state().clone();
        let settings = state.settings();
        let (ws, session) = match up {
            Upgraded::One(up) => {
                let mut up = up.into_loop();
                let session = up.session.take();
                (Ws::new(up, settings), session)
            }
            Upgraded::Many(up, hub) => {
                let asker = conn.asker(&up.caller, up.client.as_deref());
                (Ws::mux(Mux::new(asker), settings), Some(hub))
            }
        };
        let _ = combd_kernel::sys::set_send_buffer(&conn.stream, limits::WS_SEND_BUFFER_BYTES);
        if let To::One(to) = &ws.to {
            if to.deflate.is_some() {
                ShardStats::add(&state.stats().ws_deflate_opened, 1);
            }
            // A plain WebSocket without permessage-deflate or access log: while it waits to
            // read, the fan-out writes its frames itself rather than waking it
            // (`SessionOut::fan_out`).
            if let (Some(s), crate::tls::Stream::Plain(tcp), None, None, false) =
                (&session, &conn.stream, &to.deflate, &conn.log, to.numbered)
            {
                s.set_socket(DirectSocket::of(tcp));
            }
        }
        // A write that the client takes none of for COMBD_WS_SLOW_TIMEOUT fails then, not at
        // the HTTP write stall timeout: both mean a slow reader, and end it the same way.
        let _ = conn
            .stream
            .tcp()
            .set_write_timeout(Some(settings.ws_slow_timeout));
        WsConn {
            conn,
            ws,
            rate: Rate::new(settings),
            // Liveness: a ping every COMBD_WS_PING_INTERVAL; anything received answers it.
            watch: Watch {
                session,
                ping_epoch: state.ping_epoch(),
            },
        }
    }

    /// The WebSocket loop, until the connection closes.
    pub(super) async fn run(&mut self) {
        let state = self.conn.state().clone();
        let stats = state.stats();
        ShardStats::add(&stats.ws_open, 1);
        let _open = Defer(|| ShardStats::sub(&stats.ws_open, 1));
        let mut out: Vec<u8> = Vec::new();
        let close = loop {
            let paused = match self.take_input(&mut out) {
                Ok(paused) => paused,
                Err(close) => break close,
            };
            if let (To::Many(mux), Some(hub)) = (&mut self.ws.to, &self.watch.session) {
                if mux.has_pending() {
                    // Boxed: waits that only a multiplexed socket has.
                    Box::pin(mux.attach_pending(self.conn, hub, &mut out)).await;
                }
            }
            if !out.is_empty() {
                ShardStats::add(&stats.ws_sends, 1);
            }
            if let Err(e) = self.flush_counted(&mut out).await {
                // How much of it the kernel took is not known: no frame after it.
                break self.write_failed(&e, true);
            }
            if paused {
                // The rest of the read waits for the shard's other tasks and its I/O: no
                // read is more than a turn of work, however much it decompresses to.
                crate::state::turn::Turn::new(stats, 1).yield_now().await;
                continue;
            }
            let drain_ok = !self.ws.decoder.in_message();
            match self.conn.fill_watching(drain_ok, &self.watch).await {
                Woke::Data => self.ws.awaiting_pong = false,
                Woke::Room => {}
                Woke::PingDue => {
                    if let Some(close) = self.ping(&mut out) {
                        break close;
                    }
                }
                Woke::Mail => {
                    // Boxed: the largest of the loop's waits (184 bytes), which would size
                    // every idle WebSocket's task; an allocation a write of mail.
                    let close = match self.ws.to {
                        To::One(_) => Box::pin(self.write_mail()).await,
                        To::Many(_) => Box::pin(self.write_mux_mail()).await,
                    };
                    if let Some(close) = close {
                        break close;
                    }
                }
                Woke::Eof | Woke::Failed | Woke::Timeout => break Close::Drop,
                Woke::Drain => break Close::Frame(Some(close::GOING_AWAY), "server shutting down"),
            }
        };
        // What it had of a message is let go before the linger.
        self.ws.partial = None;
        // Boxed: a rare path whose state would otherwise size every idle WebSocket's task.
        Box::pin(self.close_with(close, out)).await;
    }

    /// Decodes what the client sent, while its input waiting is under its bound
    /// (back-pressure: what it sent meanwhile waits in `inbuf` and the kernel), and holds what
    /// is left of an incomplete frame or message. Whether the decoding paused for a turn;
    /// `Err`: the WebSocket is to close.
    fn take_input(&mut self, out: &mut Vec<u8>) -> Result<bool, Close> {
        let mut paused = false;
        if !self.conn.inbuf.is_empty() && self.conn.has_room() {
            // What is decoded moves into jobs, which hold it themselves; the rest is held
            // again below.
            self.ws.partial = None;
            match self.decode_input(out) {
                Decoded::Done => {}
                Decoded::Paused => paused = true,
                Decoded::Close(close) => return Err(close),
            }
        }
        match self.hold_partial() {
            Some(close) => Err(close),
            None => Ok(paused),
        }
    }

    /// Holds what the connection has of an incomplete frame or message (its `inbuf` and the
    /// decoder's reassembly) against the shard's inbound budget, once it is past a
    /// connection's floor (below it nothing is held: clicks cost nothing here). `Some`: the
    /// budget cannot hold it, and the WebSocket closes with 1013 (a client sending a large
    /// message slowly, or never finishing it, cannot hold more than the budget).
    fn hold_partial(&mut self) -> Option<Close> {
        let ws = &mut self.ws;
        let pending = (self.conn.inbuf.len() + ws.decoder.partial_len()) as u64;
        if pending == ws.partial.as_ref().map_or(0, |h| h.bytes()) {
            return None;
        }
        ws.partial = None;
        if pending < limits::INBOUND_CONN_FLOOR_BYTES {
            return None;
        }
        match self.conn.hold_reading(pending) {
            Some(hold) => {
                ws.partial = Some(Box::new(hold));
                None
            }
            None => Some(Close::Frame(Some(close::TRY_AGAIN_LATER), "overloaded")),
        }
    }

    /// Decodes what `inbuf` holds and handles each event, until a turn's worth
    /// ([`WS_DECODE_BYTES_PER_TURN`](limits::WS_DECODE_BYTES_PER_TURN)) of messages or of
    /// answers; compressed messages decompress within what its rate allows.
    fn decode_input(&mut self, out: &mut Vec<u8>) -> Decoded {
        let state = self.conn.state().clone();
        let stats = state.stats();
        let mut inbuf = std::mem::take(&mut self.conn.inbuf);
        let mut client_close: Option<Option<u16>> = None;
        let mut over_rate = false;
        let mut closing = None;
        // Message bytes handed on in this turn, and whether they (or the answers) reached a
        // turn's worth.
        let mut handed = 0;
        let mut turn_spent = false;
        let (conn, ws, rate) = (&*self.conn, &mut self.ws, &mut self.rate);
        let (session, to) = (self.watch.session.as_deref(), &mut ws.to);
        let mut message = |text: bool, payload: &[u8], out: &mut Vec<u8>| {
            handed += payload.len();
            closing = match to {
                To::One(to) => on_message(conn, session, to, (text, payload), out),
                To::Many(mux) => mux.on_message(conn, text, payload, out).err(),
            };
            turn_spent = handed.max(out.len()) >= limits::WS_DECODE_BYTES_PER_TURN;
            closing.is_none() && !turn_spent
        };
        let allowed = rate.inflate_allowed(state.settings());
        ws.decoder.allow_inflate(allowed);
        let decoded = ws.decoder.decode(&mut inbuf, |ev| match ev {
            WsEvent::Text(_) | WsEvent::Binary(_) | WsEvent::Ping(_)
                if !rate.take(state.settings()) =>
            {
                over_rate = true;
                false
            }
            WsEvent::Text(t) => message(true, t.as_bytes(), out),
            WsEvent::Binary(b) => message(false, b, out),
            WsEvent::Ping(p) => {
                ws::encode_pong(out, p);
                true
            }
            WsEvent::Pong => true,
            WsEvent::Close(code, _) => {
                client_close = Some(code);
                false
            }
        });
        rate.inflated(allowed - ws.decoder.inflate_left());
        ShardStats::add(&stats.ws_inflated_in, u64::from(ws.decoder.take_inflated()));
        let error = match decoded {
            Ok(used) => {
                inbuf.drain(..used);
                None
            }
            Err(e) => Some(e),
        };
        let more = !inbuf.is_empty();
        if more {
            self.conn.inbuf = inbuf;
        }
        let ended = Ended {
            over_rate,
            closing,
            client_close,
            error,
        };
        ended.decoded(stats, more && turn_spent)
    }

    /// Writes the loop's own output (a stateless app's answers, pongs, pings, a close) and
    /// frees it, counted in the shard's outbound bytes until the kernel has taken it or it is
    /// dropped: a client that does not read holds it in sight of the budget. It is built and
    /// written with no wait between (its budget checked as it is built, [`outbound_room`]), so
    /// the count is right whenever another task looks.
    async fn flush_counted(&mut self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let bytes = out.len() as u64;
        if bytes == 0 {
            return Ok(());
        }
        let state = self.conn.state().clone();
        state.add_outbound(bytes);
        let _written = Defer(|| state.release_outbound(bytes));
        self.conn.flush(out).await
    }

    /// A ping is due: send one, or close a client that did not answer the last.
    fn ping(&mut self, out: &mut Vec<u8>) -> Option<Close> {
        let state = self.conn.state();
        self.watch.ping_epoch = state.ping_epoch();
        // A connection not read (its own input waiting, back-pressure) may have answered: its
        // pong would be in the kernel. It is not closed for it; it is pinged again.
        if self.ws.awaiting_pong && self.conn.has_room() {
            ShardStats::add(&state.stats().ws_ping_timeouts, 1);
            return Some(Close::Frame(Some(close::GOING_AWAY), "ping timeout"));
        }
        // A session's verified client whose token expired since: closed, to come back with a
        // new one (the JavaScript client asks for it: `unauthorized`).
        if let Some(s) = &self.watch.session {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if s.client().is_some_and(|c| c.expired(now)) {
                ShardStats::add(&state.stats().auth_expired_closed, 1);
                return Some(Close::Frame(Some(close::UNAUTHORIZED), "token expired"));
            }
        }
        self.ws.awaiting_pong = true;
        ws::encode_ping(out);
        None
    }

    /// Writes the session's mail while holding an awake slot (a sleeping session with mail
    /// waits its turn), after resyncing it if it missed messages. `Some`: the session is to
    /// close.
    async fn write_mail(&mut self) -> Option<Close> {
        let session = self.watch.session.clone()?;
        let state = self.conn.state().clone();
        if let Some(why) = session
            .closing()
            .filter(|why| !why.writes_mail_first() || !session.mail_waiting())
        {
            // It reads too slowly, the shard's outbound budget is spent, or its object went.
            tracing::debug!(
                shard = state.id(),
                session = session.id(),
                ?why,
                "closing a session"
            );
            return Some(closing(why));
        }
        let To::One(to) = &self.ws.to else {
            return None;
        };
        if session.take_missed() {
            ShardStats::add(&state.stats().session_resyncs, 1);
            if let Some(close) = to.resync(self.conn, &session) {
                return Some(close);
            }
        }
        let framing = Framing::of(to.deflate, to.numbered);
        let permit = state.acquire_awake().await;
        let mut w = session.take_for_write(framing);
        if let Some(place) = w.place {
            self.conn.cells.sessions().set_place(&session, place);
        }
        if let Some(log) = &self.conn.log {
            (0..w.messages).for_each(|_| log.on_message(false));
        }
        let written = self
            .write_session(&session, &mut w.bytes, |n| session.written(n))
            .await;
        drop(permit);
        let Cut { e, cut } = written.err()?;
        // A failed write after a cut may have left that frame short too.
        let cut = cut || w.after_cut;
        Some(match session.closing() {
            // The node decided to close it while the write waited; a close frame after a frame
            // cut short would be read as that frame's payload: then it is dropped.
            Some(why) if !cut => closing(why),
            Some(_) => Close::Drop,
            None => self.write_failed(&e, cut),
        })
    }

    /// Writes the mail of a multiplexed socket's subscriptions while holding an awake slot,
    /// each frame headed with its channel, after ending the subscriptions the node closed and
    /// resyncing those that missed frames ([`Mux::take_mail`]). `Some`: the socket is to close.
    async fn write_mux_mail(&mut self) -> Option<Close> {
        let hub = self.watch.session.clone()?;
        if let Some(why) = hub.closing() {
            return Some(closing(why));
        }
        hub.take_missed();
        let To::Many(mux) = &mut self.ws.to else {
            return None;
        };
        let mut mail = match mux.take_mail(self.conn) {
            Ok(mail) => mail,
            Err(close) => return Some(close),
        };
        if mail.bytes.is_empty() {
            return None;
        }
        if let Some(log) = &self.conn.log {
            (0..mail.messages).for_each(|_| log.on_message(false));
        }
        let state = self.conn.state().clone();
        let own = mail.own_bytes;
        state.add_outbound(own);
        let _own = Defer(|| state.release_outbound(own));
        let permit = state.acquire_awake().await;
        let mut bytes = std::mem::take(&mut mail.bytes);
        let written = self
            .write_session(&hub, &mut bytes, |n| mail.written(n))
            .await;
        drop(permit);
        let Cut { e, cut } = written.err()?;
        Some(match hub.closing() {
            Some(why) if !cut => closing(why),
            Some(_) => Close::Drop,
            None => self.write_failed(&e, cut),
        })
    }

    /// How a WebSocket whose write failed ends: one that took nothing for the write stall
    /// timeout is a slow reader like one past `COMBD_WS_SLOW_TIMEOUT` (whichever of the two
    /// fires first, counted in `ws_slow_closed`), closed with 1008 `slow` unless the write cut
    /// a frame short (`cut`: a close frame would then be read as its payload, so the connection
    /// is dropped); any other failure means the client is gone.
    fn write_failed(&self, e: &std::io::Error, cut: bool) -> Close {
        if e.kind() != std::io::ErrorKind::TimedOut {
            return Close::Drop;
        }
        ShardStats::add(&self.conn.stats().ws_slow_closed, 1);
        if cut {
            Close::Drop
        } else {
            closing(CloseWhy::Slow)
        }
    }

    /// Writes a session's output and frees it, telling `written` (the session's accounts) as
    /// the kernel takes each part. Unlike [`Conn::flush`], the wait for the socket to take it
    /// ends as soon as the node decides to close the session (a client that stopped reading
    /// cannot hold the task until the write stall timeout).
    async fn write_session(
        &mut self,
        session: &SessionOut,
        out: &mut Vec<u8>,
        mut written: impl FnMut(u64),
    ) -> Result<(), Cut> {
        use futures_lite::AsyncWrite;
        use std::pin::Pin;
        use std::task::Poll;
        let conn = &mut *self.conn;
        let mut pos = 0;
        let r = futures_lite::future::poll_fn(|cx| loop {
            if session.closing().is_some() {
                return Poll::Ready(Err(std::io::Error::other("session closing")));
            }
            if pos >= out.len() {
                return Pin::new(&mut conn.stream).poll_flush(cx);
            }
            match Pin::new(&mut conn.stream).poll_write(cx, &out[pos..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => {
                    pos += n;
                    let stats = conn.waker.state().stats();
                    ShardStats::add(&stats.ws_sends, 1);
                    ShardStats::add(&stats.bytes_out, n as u64);
                    if let Some(log) = &conn.log {
                        log.on_written(n);
                    }
                    written(n as u64);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    conn.waker.state().park(conn.waker.index(), cx.waker());
                    return Poll::Pending;
                }
            }
        })
        .await;
        let cut = pos > 0 && pos < out.len();
        *out = Vec::new();
        r.map_err(|e| Cut { e, cut })
    }

    /// Tells the object the session left, and ends the session: from here the fan-out writes
    /// to its socket no more. Once; nothing after the first.
    fn leave(&mut self) {
        let Some(s) = self.watch.session.take() else {
            return;
        };
        match &mut self.ws.to {
            To::One(to) => {
                let job = Job::detach(s.session_id());
                self.conn.cells.submit(&to.app, &to.object, job);
                self.conn.cells.sessions().end(&s);
            }
            // The hub is in no table: its subscriptions are.
            To::Many(mux) => mux.leave(self.conn),
        }
    }

    /// Ends the WebSocket: tells the object the session left, then closes the connection the
    /// way `close` says, and logs the close (while the access log is on). The close frame gets
    /// [`CLOSE_LINGER`](limits::CLOSE_LINGER) to be written and answered: a client that does
    /// not read cannot hold the connection longer.
    async fn close_with(&mut self, close: Close, mut out: Vec<u8>) {
        // After a frame cut short, a close frame would be read as its payload.
        let close = match &self.watch.session {
            Some(s) if s.is_cut() => Close::Drop,
            _ => close,
        };
        self.leave();
        let frame = match close {
            Close::Frame(code, reason) => Some((code, reason)),
            Close::Answer(code) => Some((code, "")),
            Close::Drop => None,
        };
        if let Some((code, reason)) = frame {
            ws::encode_close(&mut out, code, reason);
            // Counted while it is written, as in the loop (`flush_counted`).
            let state = self.conn.state().clone();
            let bytes = out.len() as u64;
            state.add_outbound(bytes);
            let _written = Defer(|| state.release_outbound(bytes));
            let bound = 2 * limits::CLOSE_LINGER;
            let conn = &mut *self.conn;
            let _ = glommio::timer::timeout(bound, async {
                conn.flush_and_close(&mut out).await;
                Ok(())
            })
            .await;
        }
        if let Some(log) = &self.conn.log {
            log.ws_close(self.conn.state(), close.end());
        }
    }
}

/// A message from the client, on the connection `conn` of `session` (none: a stateless
/// app's): to the session's object, or to a stateless app right here (its sends and errors go
/// straight back into `out`). `Some`: the WebSocket is to close.
fn on_message(
    conn: &Conn,
    session: Option<&SessionOut>,
    to: &Addressee,
    (text, payload): (bool, &[u8]),
    out: &mut Vec<u8>,
) -> Option<Close> {
    let stats = conn.stats();
    ShardStats::add(&stats.ws_messages_in, 1);
    if let Some(log) = &conn.log {
        log.on_message(true);
    }
    if let Some(s) = session {
        // Its bytes are held against the connection's and the shard's inbound budget
        // until the object has run it; past the shard's, refused like a full mailbox.
        let Some(hold) = conn.hold_input(payload.len() as u64) else {
            ws::encode_error(out, "overloaded");
            return None;
        };
        let job = Job::message(s.session_id(), s.client().cloned(), text, payload.to_vec());
        let job = job.held(hold);
        conn.cells.submit(&to.app, &to.object, job);
        return None;
    }
    let msg = if text {
        // The decoder checked the UTF-8.
        Message::Text(std::str::from_utf8(payload).unwrap_or_default())
    } else {
        Message::Binary(payload)
    };
    let state = conn.state();
    let session = SessionId::new(state.id() as u32, 0);
    let client = None;
    let (result, effects) = call_stateless(
        state,
        to.app.as_ref(),
        &AppInput::Message {
            session,
            client,
            msg,
        },
    );
    if let Err(e) = result {
        ws::encode_error(out, &e.message);
    }
    for e in effects {
        if let Effect::Send { text, payload, .. } = e {
            if !outbound_room(state, out.len() + payload.len() + FRAME_HEADER_MAX) {
                ShardStats::add(&stats.outbound_budget_closed, 1);
                return Some(closing(CloseWhy::OutboundBudget));
            }
            ShardStats::add(&stats.ws_messages_out, 1);
            if let Some(log) = &conn.log {
                log.on_message(false);
            }
            if ws::deflate::encode_message(out, text, &payload, to.deflate) {
                ShardStats::add(&stats.ws_deflated_out, 1);
            }
        }
    }
    None
}

/// Whether the shard's outbound budget has room for `bytes` more of a loop's output (what it
/// built and has not written is counted in the shard's outbound bytes only while it is
/// written: [`WsConn::flush_counted`]).
fn outbound_room(state: &ShardState, bytes: usize) -> bool {
    state.outbound() + bytes as u64 <= state.node().outbound_budget_bytes
}

/// How a WebSocket whose input failed to decode closes, counted by why.
fn decode_failed(stats: &ShardStats, e: ws::WsError) -> Close {
    ShardStats::add(
        match e {
            ws::WsError::Ratio => &stats.ws_inflate_ratio_closed,
            ws::WsError::InflateRate => &stats.ws_inflate_rate_closed,
            _ => &stats.ws_protocol_closed,
        },
        1,
    );
    Close::Frame(Some(e.code()), e.reason())
}
