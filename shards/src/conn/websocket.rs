//! The WebSocket side of a connection, once upgraded (`upgrade.rs`): the loop: decode frames and hand messages to the app (called right
//! here for a stateless app, sent to the object's mailbox for a session), write the session's
//! mail while holding an awake slot, keep the client's message rate, ping it every
//! `COMBD_WS_PING_INTERVAL`, and close with the code the reason calls for. Every close goes
//! through [`Conn::close_with`].

use std::sync::Arc;
use std::time::Instant;

use combd_kernel::limits;
use combd_kernel::settings::Settings;

use crate::app::{App, Effect, Input as AppInput, Message, Resync, SessionId};
use crate::cells::session::{CloseWhy, DirectSocket};
use crate::defer::Defer;
use crate::inbound::Hold;
use crate::job::Job;
use crate::stats::ShardStats;
use crate::ws::{self, close, Decoder, WsEvent};

use super::access::WsEnd;
use super::upgrade::Upgrade;
use super::{Conn, Input};

/// A failed write of a session's output, and whether it cut a frame short (some of it was
/// written, not all).
struct Cut {
    e: std::io::Error,
    cut: bool,
}

/// The longest header of a frame the node sends (unmasked, a 64-bit length: RFC 6455, 5.2).
const FRAME_HEADER_MAX: usize = 10;

/// The close of a session the node decided to close.
fn closing(why: CloseWhy) -> Close {
    match why {
        CloseWhy::Slow => Close::Frame(Some(close::POLICY), "slow"),
        CloseWhy::OutboundBudget => Close::Frame(Some(close::TRY_AGAIN_LATER), "outbound budget"),
        CloseWhy::AppRemoved => Close::Frame(Some(close::GOING_AWAY), "app removed"),
    }
}

/// How the node ends a WebSocket.
#[derive(Debug, Clone, Copy)]
enum Close {
    /// With a close frame of its own, then a linger.
    Frame(Option<u16>, &'static str),
    /// Answering the client's close frame with its code (none: an empty close), then a linger.
    Answer(Option<u16>),
    /// Without one: the client is gone, or it is not reading.
    Drop,
}

impl Close {
    /// The close as the access log records it: a close without a code as 1005, one without
    /// a close frame as 1006 (RFC 6455, 7.1.5).
    fn end(self) -> WsEnd {
        match self {
            Close::Frame(code, reason) => WsEnd {
                code: code.unwrap_or(1005),
                by: "node",
                reason: Some(reason),
            },
            Close::Answer(code) => WsEnd {
                code: code.unwrap_or(1005),
                by: "client",
                reason: None,
            },
            Close::Drop => WsEnd {
                code: 1006,
                by: "connection",
                reason: None,
            },
        }
    }
}

/// Where a WebSocket's messages go.
struct Target {
    app: Arc<dyn App>,
    object: String,
    /// permessage-deflate as negotiated.
    deflate: Option<ws::deflate::Negotiated>,
}

/// What the loop knows of its WebSocket.
struct Ws {
    to: Target,
    decoder: Decoder,
    /// A ping was sent and nothing has come back since.
    awaiting_pong: bool,
    /// The bytes of an incomplete frame and of a message under reassembly, held against the
    /// shard's inbound budget once past a connection's floor. Boxed: a hold (with its
    /// client's share) is 56 bytes that every idle WebSocket's task would carry for none.
    partial: Option<Box<Hold>>,
}

impl Ws {
    /// The loop's state for an upgrade, built outside the loop's future: a local the future
    /// borrowed before moving it (the app, to ask its bound) would be kept in every idle
    /// WebSocket's task. The upgrade's box is freed here, with what the loop does not need
    /// (its accept key, query, replay), not kept for the WebSocket's life.
    fn new(up: Box<Upgrade>, settings: &Settings) -> Ws {
        let (app, object, deflate) = up.into_loop();
        // The app's own bound on its inputs, within the node's.
        let max_message = app
            .max_input_bytes()
            .map_or(settings.ws_max_message_bytes, |m| {
                m.min(settings.ws_max_message_bytes)
            });
        Ws {
            decoder: Decoder::new(max_message).with_deflate(deflate.is_some()),
            to: Target {
                app,
                object,
                deflate,
            },
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

impl Conn {
    /// The WebSocket loop, until the connection closes.
    pub(super) async fn websocket(&mut self, up: Box<Upgrade>) {
        let state = self.state().clone();
        let stats = state.stats();
        ShardStats::add(&stats.ws_open, 1);
        let _open = Defer(|| ShardStats::sub(&stats.ws_open, 1));
        let (mut ws, mut rate) = self.start_websocket(up);
        let mut out: Vec<u8> = Vec::new();
        let close = loop {
            let mut paused = false;
            // Decoded only while its input waiting is under its bound (back-pressure): what it
            // sent meanwhile waits in `inbuf` and the kernel.
            if !self.inbuf.is_empty() && self.has_room() {
                // What is decoded moves into jobs, which hold it themselves; the rest is held
                // again below.
                ws.partial = None;
                match self.decode_input(&mut ws, &mut rate, &mut out) {
                    Decoded::Done => {}
                    Decoded::Paused => paused = true,
                    Decoded::Close(close) => break close,
                }
            }
            if let Some(close) = self.hold_partial(&mut ws) {
                break close;
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
            match self.fill(None, !ws.decoder.in_message()).await {
                Input::Data => ws.awaiting_pong = false,
                Input::Room => {}
                Input::PingDue => {
                    if let Some(close) = self.ping(&mut ws, &mut out) {
                        break close;
                    }
                }
                Input::Mail => {
                    // Boxed: the largest of the loop's waits (184 bytes), which would size
                    // every idle WebSocket's task; an allocation a write of mail.
                    if let Some(close) = Box::pin(self.write_mail(&ws.to)).await {
                        break close;
                    }
                }
                Input::Eof | Input::Failed | Input::Timeout => break Close::Drop,
                Input::Drain => {
                    break Close::Frame(Some(close::GOING_AWAY), "server shutting down")
                }
            }
        };
        // What it had of a message is let go before the linger.
        ws.partial = None;
        // Boxed: a rare path whose state would otherwise size every idle WebSocket's task.
        Box::pin(self.close_with(&ws, close, out)).await;
    }

    /// The WebSocket's state at its start, and its connection set for it. Not an `async fn`:
    /// nothing here sizes the loop's future.
    fn start_websocket(&mut self, up: Box<Upgrade>) -> (Ws, Rate) {
        let state = self.state().clone();
        let settings = state.settings();
        let ws = Ws::new(up, settings);
        if ws.to.deflate.is_some() {
            ShardStats::add(&state.stats().ws_deflate_opened, 1);
        }
        let rate = Rate::new(settings);
        let _ = combd_kernel::sys::set_send_buffer(&self.stream, limits::WS_SEND_BUFFER_BYTES);
        // A plain WebSocket without permessage-deflate or access log: while it waits to read,
        // the fan-out writes its frames itself rather than waking it (`SessionOut::fan_out`).
        if let (Some(s), crate::tls::Stream::Plain(tcp), None, None) =
            (&self.session, &self.stream, &ws.to.deflate, &self.log)
        {
            s.set_socket(DirectSocket::of(tcp));
        }
        // A write that the client takes none of for COMBD_WS_SLOW_TIMEOUT fails then, not at
        // the HTTP write stall timeout: both mean a slow reader, and end it the same way.
        let _ = self
            .stream
            .tcp()
            .set_write_timeout(Some(settings.ws_slow_timeout));
        // Liveness: a ping every COMBD_WS_PING_INTERVAL; anything received answers it.
        self.ping_epoch = Some(state.ping_epoch());
        (ws, rate)
    }

    /// Holds what the connection has of an incomplete frame or message (its `inbuf` and the
    /// decoder's reassembly) against the shard's inbound budget, once it is past a
    /// connection's floor (below it nothing is held: clicks cost nothing here). `Some`: the
    /// budget cannot hold it, and the WebSocket closes with 1013 (a client sending a large
    /// message slowly, or never finishing it, cannot hold more than the budget).
    fn hold_partial(&self, ws: &mut Ws) -> Option<Close> {
        let pending = (self.inbuf.len() + ws.decoder.partial_len()) as u64;
        if pending == ws.partial.as_ref().map_or(0, |h| h.bytes()) {
            return None;
        }
        ws.partial = None;
        if pending < limits::INBOUND_CONN_FLOOR_BYTES {
            return None;
        }
        match self.hold_reading(pending) {
            Some(hold) => {
                ws.partial = Some(Box::new(hold));
                None
            }
            None => Some(Close::Frame(Some(close::TRY_AGAIN_LATER), "overloaded")),
        }
    }

    /// Decodes what `inbuf` holds and handles each event, until a turn's worth
    /// ([`WS_DECODE_BYTES_PER_TURN`](limits::WS_DECODE_BYTES_PER_TURN)) of messages or of
    /// answers; compressed messages decompress within what `rate` allows.
    fn decode_input(&mut self, ws: &mut Ws, rate: &mut Rate, out: &mut Vec<u8>) -> Decoded {
        let state = self.state().clone();
        let stats = state.stats();
        let mut inbuf = std::mem::take(&mut self.inbuf);
        let mut client_close: Option<Option<u16>> = None;
        let mut over_rate = false;
        let mut closing = None;
        // Message bytes handed on in this turn, and whether they (or the answers) reached a
        // turn's worth.
        let mut handed = 0;
        let mut turn_spent = false;
        let to = &ws.to;
        let mut message = |text: bool, payload: &[u8], out: &mut Vec<u8>| {
            handed += payload.len();
            closing = self.on_message(to, text, payload, out);
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
            self.inbuf = inbuf;
        }
        if over_rate {
            ShardStats::add(&stats.ws_rate_closed, 1);
            return Decoded::Close(Close::Frame(Some(close::POLICY), "message rate exceeded"));
        }
        if let Some(close) = closing {
            return Decoded::Close(close);
        }
        if let Some(code) = client_close {
            // Answer the close with the client's code (RFC 6455, 5.5.1), then close.
            return Decoded::Close(Close::Answer(code));
        }
        match error {
            Some(e) => Decoded::Close(self.decode_failed(e)),
            None if more && turn_spent => Decoded::Paused,
            None => Decoded::Done,
        }
    }

    /// How a WebSocket whose input failed to decode closes, counted by why.
    fn decode_failed(&self, e: ws::WsError) -> Close {
        let stats = self.stats();
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

    /// A message from the client: to the session's object, or to a stateless app right here
    /// (its sends and errors go straight back into `out`). `Some`: the WebSocket is to close.
    fn on_message(
        &self,
        to: &Target,
        text: bool,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Option<Close> {
        ShardStats::add(&self.stats().ws_messages_in, 1);
        if let Some(log) = &self.log {
            log.on_message(true);
        }
        if let Some(s) = self.session_id() {
            // Its bytes are held against the connection's and the shard's inbound budget
            // until the object has run it; past the shard's, refused like a full mailbox.
            let Some(hold) = self.hold_input(payload.len() as u64) else {
                ws::encode_error(out, "overloaded");
                return None;
            };
            let job = Job::message(s, text, payload.to_vec()).held(hold);
            self.cells.submit(&to.app, &to.object, job);
            return None;
        }
        let msg = if text {
            // The decoder checked the UTF-8.
            Message::Text(std::str::from_utf8(payload).unwrap_or_default())
        } else {
            Message::Binary(payload)
        };
        let session = SessionId::new(self.state().id() as u32, 0);
        let (result, effects) =
            self.call_stateless(to.app.as_ref(), &AppInput::Message { session, msg });
        if let Err(e) = result {
            ws::encode_error(out, &e.message);
        }
        for e in effects {
            if let Effect::Send { text, payload, .. } = e {
                if !self.outbound_room(out.len() + payload.len() + FRAME_HEADER_MAX) {
                    ShardStats::add(&self.stats().outbound_budget_closed, 1);
                    return Some(closing(CloseWhy::OutboundBudget));
                }
                ShardStats::add(&self.stats().ws_messages_out, 1);
                if let Some(log) = &self.log {
                    log.on_message(false);
                }
                if ws::deflate::encode_message(out, text, &payload, to.deflate) {
                    ShardStats::add(&self.stats().ws_deflated_out, 1);
                }
            }
        }
        None
    }

    /// Whether the shard's outbound budget has room for `bytes` more of this loop's output
    /// (what it built and has not written is counted in the shard's outbound bytes only while
    /// it is written: [`Conn::flush_counted`]).
    fn outbound_room(&self, bytes: usize) -> bool {
        let state = self.state();
        state.outbound() + bytes as u64 <= state.node().outbound_budget_bytes
    }

    /// Writes the loop's own output (a stateless app's answers, pongs, pings, a close) and
    /// frees it, counted in the shard's outbound bytes until the kernel has taken it or it is
    /// dropped: a client that does not read holds it in sight of the budget. It is built and
    /// written with no wait between (its budget checked as it is built,
    /// [`Conn::outbound_room`]), so the count is right whenever another task looks.
    async fn flush_counted(&mut self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let bytes = out.len() as u64;
        if bytes == 0 {
            return Ok(());
        }
        let state = self.state().clone();
        state.add_outbound(bytes);
        let _written = Defer(|| state.release_outbound(bytes));
        self.flush(out).await
    }

    /// A ping is due: send one, or close a client that did not answer the last.
    fn ping(&mut self, ws: &mut Ws, out: &mut Vec<u8>) -> Option<Close> {
        self.ping_epoch = Some(self.state().ping_epoch());
        // A connection not read (its own input waiting, back-pressure) may have answered: its
        // pong would be in the kernel. It is not closed for it; it is pinged again.
        if ws.awaiting_pong && self.has_room() {
            ShardStats::add(&self.stats().ws_ping_timeouts, 1);
            return Some(Close::Frame(Some(close::GOING_AWAY), "ping timeout"));
        }
        // A session's verified client whose token expired since: closed, to come back with a
        // new one (the JavaScript client asks for it: `unauthorized`).
        if let Some(s) = &self.session {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if s.client().is_some_and(|c| c.expired(now)) {
                ShardStats::add(&self.stats().auth_expired_closed, 1);
                return Some(Close::Frame(Some(close::UNAUTHORIZED), "token expired"));
            }
        }
        ws.awaiting_pong = true;
        ws::encode_ping(out);
        None
    }

    /// Writes the session's mail while holding an awake slot (a sleeping session with mail
    /// waits its turn), after resyncing it if it missed messages. `Some`: the session is to
    /// close.
    async fn write_mail(&mut self, to: &Target) -> Option<Close> {
        let session = self.session.clone()?;
        let state = self.state().clone();
        if let Some(why) = session.closing() {
            // It reads too slowly, or the shard's outbound budget is spent.
            tracing::debug!(
                shard = state.id(),
                session = session.id(),
                ?why,
                "closing a session"
            );
            return Some(closing(why));
        }
        if session.take_missed() {
            ShardStats::add(&state.stats().session_resyncs, 1);
            match to.app.resync() {
                Resync::Close => {
                    return Some(Close::Frame(
                        Some(close::TRY_AGAIN_LATER),
                        "missed messages: reconnect",
                    ))
                }
                Resync::Attach => {
                    let job = Job::reattach(
                        session.session_id(),
                        session.query().map(str::to_string),
                        session.client().cloned(),
                        session.caller().clone(),
                    );
                    self.cells.submit(&to.app, &to.object, job);
                }
            }
        }
        let permit = state.acquire_awake().await;
        let mut w = session.take_for_write(to.deflate);
        if let Some(log) = &self.log {
            (0..w.messages).for_each(|_| log.on_message(false));
        }
        let written = self.write_session(&mut w.bytes).await;
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

    /// How a WebSocket whose write failed ends: one that took nothing for the write stall
    /// timeout is a slow reader like one past `COMBD_WS_SLOW_TIMEOUT` (whichever of the two
    /// fires first, counted in `ws_slow_closed`), closed with 1008 `slow` unless the write cut
    /// a frame short (`cut`: a close frame would then be read as its payload, so the connection
    /// is dropped); any other failure means the client is gone.
    fn write_failed(&self, e: &std::io::Error, cut: bool) -> Close {
        if e.kind() != std::io::ErrorKind::TimedOut {
            return Close::Drop;
        }
        ShardStats::add(&self.stats().ws_slow_closed, 1);
        if cut {
            Close::Drop
        } else {
            closing(CloseWhy::Slow)
        }
    }

    /// Writes a session's output and frees it, telling the session's accounts as the kernel
    /// takes each part. Unlike [`Conn::flush`], the wait for the socket to take it ends as soon
    /// as the node decides to close the session (a client that stopped reading cannot hold the
    /// task until the write stall timeout).
    async fn write_session(&mut self, out: &mut Vec<u8>) -> Result<(), Cut> {
        use futures_lite::AsyncWrite;
        use std::pin::Pin;
        use std::task::Poll;
        let mut pos = 0;
        let r = futures_lite::future::poll_fn(|cx| loop {
            let closing = self.session.as_ref().is_some_and(|s| s.closing().is_some());
            if closing {
                return Poll::Ready(Err(std::io::Error::other("session closing")));
            }
            if pos >= out.len() {
                return Pin::new(&mut self.stream).poll_flush(cx);
            }
            match Pin::new(&mut self.stream).poll_write(cx, &out[pos..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => {
                    pos += n;
                    let stats = self.waker.state().stats();
                    ShardStats::add(&stats.ws_sends, 1);
                    ShardStats::add(&stats.bytes_out, n as u64);
                    if let Some(log) = &self.log {
                        log.on_written(n);
                    }
                    if let Some(s) = &self.session {
                        s.written(n as u64);
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    self.waker.state().park(self.waker.index(), cx.waker());
                    return Poll::Pending;
                }
            }
        })
        .await;
        let cut = pos > 0 && pos < out.len();
        *out = Vec::new();
        r.map_err(|e| Cut { e, cut })
    }

    /// Ends the WebSocket: tells the object the session left, then closes the connection the
    /// way `close` says, and logs the close (while the access log is on). The close frame gets
    /// [`CLOSE_LINGER`](limits::CLOSE_LINGER) to be written and answered: a client that does
    /// not read cannot hold the connection longer.
    async fn close_with(&mut self, ws: &Ws, close: Close, mut out: Vec<u8>) {
        // After a frame cut short, a close frame would be read as its payload.
        let close = match &self.session {
            Some(s) if s.is_cut() => Close::Drop,
            _ => close,
        };
        if let Some(s) = self.session_id() {
            self.cells.submit(&ws.to.app, &ws.to.object, Job::detach(s));
        }
        self.end_session();
        let frame = match close {
            Close::Frame(code, reason) => Some((code, reason)),
            Close::Answer(code) => Some((code, "")),
            Close::Drop => None,
        };
        if let Some((code, reason)) = frame {
            ws::encode_close(&mut out, code, reason);
            // Counted while it is written, as in the loop (`flush_counted`).
            let state = self.state().clone();
            let bytes = out.len() as u64;
            state.add_outbound(bytes);
            let _written = Defer(|| state.release_outbound(bytes));
            let bound = 2 * limits::CLOSE_LINGER;
            let _ = glommio::timer::timeout(bound, async {
                self.flush_and_close(&mut out).await;
                Ok(())
            })
            .await;
        }
        if self.log.is_some() {
            self.log_ws_close(close.end());
        }
    }

    /// The session of a stateful app's WebSocket, as objects name it.
    fn session_id(&self) -> Option<SessionId> {
        self.session.as_ref().map(|s| s.session_id())
    }

    /// Forgets this connection's session here.
    pub(super) fn end_session(&mut self) {
        if let Some(s) = self.session.take() {
            self.cells.sessions().end(&s);
        }
    }
}
