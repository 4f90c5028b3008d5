//! One connection: the HTTP/1.1 loop (keep-alive, pipelining, limits, timeouts), routing, and
//! the WebSocket loop after an upgrade.
//!
//! Memory: a connection waiting for input holds no buffer. Reads go into the shard's scratch
//! buffer inside a poll; only the bytes of an incomplete request or frame are copied into the
//! connection's own `inbuf`, which is freed as soon as it is consumed. Responses are built in a
//! `Vec` that is dropped once written.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use combd_kernel::limits;
use futures_lite::io::AsyncWriteExt;
use futures_lite::AsyncRead;
use glommio::net::TcpStream;
use glommio::timer::Timer;

use crate::app::CallBudget;
use crate::app::{
    valid_object_name, App, Cx, Effect, Input as AppInput, Message, Output, SessionId,
};
use crate::cells::Job;
use crate::http::{self, Head, Parsed, Request, Response};
use crate::shard::Shard;
use crate::stats::ShardStats;
use crate::tls::Stream;
use crate::ws::{self, Decoder, WsEvent};

/// What a wait for input ended with.
enum Input {
    /// Bytes were appended to `inbuf`.
    Data,
    /// The client closed its side.
    Eof,
    /// The deadline passed.
    Timeout,
    /// The node is draining (only reported when the caller allows it).
    Drain,
    /// The socket failed.
    Failed,
    /// The session has mail to write.
    Mail,
    /// A WebSocket's ping is due (a new ping epoch on the shard).
    PingDue,
}

/// What the HTTP loop does after answering a request.
enum Next {
    Continue,
    Close,
    Upgrade(Upgrade),
    /// A request for an object: it goes to the object's mailbox; the loop awaits the reply.
    Object {
        app: Arc<dyn App>,
        object: String,
        method: String,
        query: Option<String>,
        body: Vec<u8>,
        head_only: bool,
    },
}

/// A WebSocket upgrade that passed its checks.
struct Upgrade {
    app: Arc<dyn App>,
    object: String,
    accept: String,
    query: Option<String>,
}

/// Where a request goes.
enum Routed {
    Respond(Response),
    Upgrade(Upgrade),
    Object { app: Arc<dyn App>, object: String },
}

struct Conn {
    shard: Rc<Shard>,
    stream: Stream,
    /// Bytes read but not yet consumed: an incomplete request or frame. Empty (and
    /// unallocated) while the connection is idle.
    inbuf: Vec<u8>,
    slot: usize,
    local: bool,
    /// The session id while this connection is a session attached to an object.
    session: Option<u64>,
    /// An upgrade the HTTP loop completed: the WebSocket loop runs next.
    upgraded: Option<Box<Upgrade>>,
    /// For a WebSocket: the shard's ping epoch it last pinged in.
    ping_epoch: Option<u64>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(id) = self.session.take() {
            self.shard.end_session(id);
        }
        self.shard.unregister(self.slot);
        ShardStats::sub(&self.shard.stats().conns, 1);
        self.shard.node.release_conn();
    }
}

/// Serves one accepted connection until it closes.
pub(crate) async fn serve(shard: Rc<Shard>, stream: TcpStream, local: bool, tls: bool) {
    let _ = stream.set_nodelay(true);
    let _ = combd_kernel::sys::set_keepalive(
        &stream,
        limits::TCP_KEEPIDLE_SECS,
        limits::TCP_KEEPINTVL_SECS,
        limits::TCP_KEEPCNT,
    );
    let _ = stream.set_write_timeout(Some(limits::WRITE_STALL_TIMEOUT));
    let stream = if tls {
        match handshake(&shard, stream).await {
            Some(s) => s,
            None => {
                // The connection was counted open by the accept loop.
                ShardStats::sub(&shard.stats().conns, 1);
                shard.node.release_conn();
                return;
            }
        }
    } else {
        Stream::Plain(stream)
    };
    let slot = shard.register();
    let mut conn = Conn {
        shard,
        stream,
        inbuf: Vec::new(),
        slot,
        local,
        session: None,
        upgraded: None,
        ping_epoch: None,
    };
    // The HTTP loop and the WebSocket loop run one after the other, not one inside the
    // other, so an idle WebSocket's task holds only the WebSocket loop's state.
    conn.http().await;
    if let Some(up) = conn.upgraded.take() {
        conn.websocket(*up).await;
    }
}

impl Conn {
    /// Waits for input and appends it to `inbuf`. `deadline` bounds the wait; `drain_ok`
    /// lets a node drain interrupt it (false while a request is in progress, so it finishes).
    async fn fill(&mut self, deadline: Option<Instant>, drain_ok: bool) -> Input {
        let mut timer = match deadline {
            Some(d) => {
                let now = Instant::now();
                if d <= now {
                    return Input::Timeout;
                }
                Some(Timer::new(d - now))
            }
            None => None,
        };
        futures_lite::future::poll_fn(|cx| self.poll_fill(cx, timer.as_mut(), drain_ok)).await
    }

    fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        timer: Option<&mut Timer>,
        drain_ok: bool,
    ) -> Poll<Input> {
        if drain_ok && self.shard.draining.get() {
            return Poll::Ready(Input::Drain);
        }
        if let Some(id) = self.session {
            if self.shard.has_mail(id) {
                return Poll::Ready(Input::Mail);
            }
        }
        if self
            .ping_epoch
            .is_some_and(|e| e != self.shard.ping_epoch.get())
        {
            return Poll::Ready(Input::PingDue);
        }
        {
            let mut scratch = self.shard.scratch.borrow_mut();
            match Pin::new(&mut self.stream).poll_read(cx, &mut scratch[..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Input::Eof),
                Poll::Ready(Ok(n)) => {
                    self.inbuf.extend_from_slice(&scratch[..n]);
                    ShardStats::add(&self.shard.stats().bytes_in, n as u64);
                    return Poll::Ready(Input::Data);
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Input::Failed),
                Poll::Pending => {}
            }
        }
        if let Some(t) = timer {
            if Pin::new(t).poll(cx).is_ready() {
                return Poll::Ready(Input::Timeout);
            }
        }
        self.shard.park(self.slot, cx.waker());
        Poll::Pending
    }

    /// Writes `out` and frees it.
    async fn flush(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        let mut r = self.stream.write_all(out).await;
        if r.is_ok() {
            // TLS keeps records until flushed; plain TCP has nothing to flush.
            r = self.stream.flush().await;
        }
        if r.is_ok() {
            ShardStats::add(&self.shard.stats().bytes_out, out.len() as u64);
        }
        *out = Vec::new();
        r
    }

    /// Writes a session's output and frees it. Unlike [`Conn::flush`], the wait for the
    /// socket to take it ends as soon as the node decides to close the session (a client that
    /// stopped reading cannot hold the task until the write stall timeout).
    async fn write_session(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        let mut pos = 0;
        let r = futures_lite::future::poll_fn(|cx| loop {
            if self
                .session
                .is_some_and(|id| self.shard.closing(id).is_some())
            {
                return Poll::Ready(Err(io::Error::other("session closing")));
            }
            if pos >= out.len() {
                return futures_lite::AsyncWrite::poll_flush(Pin::new(&mut self.stream), cx);
            }
            match futures_lite::AsyncWrite::poll_write(Pin::new(&mut self.stream), cx, &out[pos..])
            {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    pos += n;
                    ShardStats::add(&self.shard.stats().bytes_out, n as u64);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => {
                    self.shard.park(self.slot, cx.waker());
                    return Poll::Pending;
                }
            }
        })
        .await;
        *out = Vec::new();
        r
    }

    /// Closes our side and reads (discarding) until the client closes or
    /// [`limits::CLOSE_LINGER`] passes, so unread client bytes cannot turn our close into a
    /// reset that destroys the last response.
    async fn linger_close(&mut self) {
        // Closes the write side (TLS sends its close_notify first).
        let _ = futures_lite::AsyncWriteExt::close(&mut self.stream).await;
        let deadline = Instant::now() + limits::CLOSE_LINGER;
        loop {
            self.inbuf = Vec::new();
            if !matches!(self.fill(Some(deadline), false).await, Input::Data) {
                break;
            }
        }
    }

    /// Writes a final response and closes the connection.
    async fn fail(&mut self, out: &mut Vec<u8>, status: u16, message: &str) {
        self.count_status(status);
        http::write_response(out, &Response::error(status, message), false, false);
        if self.flush(out).await.is_ok() {
            Box::pin(self.linger_close()).await;
        }
    }

    fn count_status(&self, status: u16) {
        let stats = self.shard.stats();
        ShardStats::add(&stats.requests, 1);
        match status {
            400..=499 => ShardStats::add(&stats.responses_4xx, 1),
            500..=599 => ShardStats::add(&stats.responses_5xx, 1),
            _ => {}
        }
    }

    /// The HTTP/1.1 loop: one request after another, pipelined requests answered in order.
    async fn http(&mut self) {
        let settings = &self.shard.node.settings;
        let (header_timeout, body_timeout, idle_timeout) = (
            settings.header_timeout,
            settings.body_timeout,
            settings.idle_timeout,
        );
        let max_body = settings.max_body_bytes;
        let mut out: Vec<u8> = Vec::new();
        // When the request being read started (a new connection: its accept), and when the
        // connection last became idle.
        let mut request_started: Option<Instant> = Some(Instant::now());
        let mut idle_since = Instant::now();
        loop {
            // 1. A complete head.
            let head: Head = loop {
                if !self.inbuf.is_empty() {
                    request_started.get_or_insert_with(Instant::now);
                    match http::parse_head(&self.inbuf) {
                        Ok(Parsed::Complete(h)) => break h,
                        Ok(Parsed::Partial) => {}
                        Err(e) => return self.fail(&mut out, e.status, e.message).await,
                    }
                }
                if self.flush(&mut out).await.is_err() {
                    return;
                }
                let (deadline, idle) = match request_started {
                    Some(t) => (t + header_timeout, false),
                    None => (idle_since + idle_timeout, true),
                };
                match self.fill(Some(deadline), self.inbuf.is_empty()).await {
                    Input::Data | Input::Mail | Input::PingDue => {}
                    Input::Eof | Input::Failed | Input::Drain => return,
                    Input::Timeout if idle => {
                        ShardStats::add(&self.shard.stats().idle_closed, 1);
                        return;
                    }
                    Input::Timeout => {
                        ShardStats::add(&self.shard.stats().request_timeouts, 1);
                        return self
                            .fail(&mut out, 408, "request head not received in time")
                            .await;
                    }
                }
            };

            // 2. Its body.
            if head.body_len > max_body {
                return self.fail(&mut out, 413, "request body too large").await;
            }
            let total = head.len + head.body_len as usize;
            if self.inbuf.len() < total {
                if head.expect_continue {
                    out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                }
                if self.flush(&mut out).await.is_err() {
                    return;
                }
                let deadline = Instant::now() + body_timeout;
                while self.inbuf.len() < total {
                    match self.fill(Some(deadline), false).await {
                        Input::Data | Input::Mail | Input::PingDue => {}
                        Input::Eof | Input::Failed | Input::Drain => return,
                        Input::Timeout => {
                            ShardStats::add(&self.shard.stats().request_timeouts, 1);
                            return self
                                .fail(&mut out, 408, "request body not received in time")
                                .await;
                        }
                    }
                }
            }

            // 3. Route and answer.
            let keep_alive = head.keep_alive && !self.shard.draining.get();
            let next = self.answer(&head, keep_alive, &mut out);
            self.inbuf.drain(..total);
            if self.inbuf.is_empty() {
                self.inbuf = Vec::new();
                request_started = None;
            } else {
                request_started = Some(Instant::now());
            }
            match next {
                Next::Continue => {}
                Next::Close => {
                    if self.flush(&mut out).await.is_ok() {
                        Box::pin(self.linger_close()).await;
                    }
                    return;
                }
                Next::Object {
                    app,
                    object,
                    method,
                    query,
                    body,
                    head_only,
                } => {
                    let (tx, rx) = async_channel::bounded(1);
                    self.shard
                        .submit(&app, &object, Job::http(method, query, body, tx));
                    let resp = rx
                        .recv()
                        .await
                        .unwrap_or_else(|_| Response::error(503, "overloaded"));
                    self.count_status(resp.status);
                    http::write_response(&mut out, &resp, keep_alive, head_only);
                }
                Next::Upgrade(up) => {
                    self.upgraded = Box::pin(self.upgrade(up, out)).await.map(Box::new);
                    return;
                }
            }
            if !keep_alive {
                if self.flush(&mut out).await.is_ok() {
                    Box::pin(self.linger_close()).await;
                }
                return;
            }
            if out.len() >= limits::PIPELINE_FLUSH_BYTES && self.flush(&mut out).await.is_err() {
                return;
            }
            idle_since = Instant::now();
        }
    }

    /// Routes the complete request at the start of `inbuf` and appends its response to `out`.
    /// A plain function, not async: the header array lives on this frame only, never in the
    /// connection's future (which every idle connection keeps).
    fn answer(&mut self, head: &Head, keep_alive: bool, out: &mut Vec<u8>) -> Next {
        let mut headers = [httparse::EMPTY_HEADER; limits::HEADER_COUNT_MAX];
        let Some(req) = http::borrow_request(&self.inbuf, head, &mut headers) else {
            self.count_status(400);
            http::write_response(
                out,
                &Response::error(400, "malformed request"),
                false,
                false,
            );
            return Next::Close;
        };
        match self.route(&req, head) {
            Routed::Respond(resp) => {
                self.count_status(resp.status);
                http::write_response(out, &resp, keep_alive, req.method == "HEAD");
                Next::Continue
            }
            Routed::Upgrade(up) => Next::Upgrade(up),
            Routed::Object { app, object } => Next::Object {
                app,
                object,
                method: req.method.to_string(),
                query: req.query.map(str::to_string),
                body: req.body.to_vec(),
                head_only: req.method == "HEAD",
            },
        }
    }

    fn route(&self, req: &Request<'_>, head: &Head) -> Routed {
        let node = &self.shard.node;
        let get = matches!(req.method, "GET" | "HEAD");
        let resp = match req.path {
            "/healthz" if get => Response::json(200, &serde_json::json!({ "status": "ok" })),
            "/stats" if self.local && get => {
                Response::bytes(200, "application/json", node.stats_json().into_bytes())
            }
            "/metrics" if self.local && get => Response::bytes(
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                node.metrics_text().into_bytes(),
            ),
            "/healthz" => Response::error(405, "method not allowed").with_header("allow", "GET, HEAD"),
            "/stats" | "/metrics" if self.local => {
                Response::error(405, "method not allowed").with_header("allow", "GET, HEAD")
            }
            path => match path.strip_prefix("/o/").and_then(|rest| rest.split_once('/')) {
                None => match node.apps.pages().iter().find(|(p, _)| *p == path) {
                    Some((_, page)) if get => Response::bytes(200, "text/html; charset=utf-8", page.as_bytes().to_vec()),
                    Some(_) => Response::error(405, "method not allowed").with_header("allow", "GET, HEAD"),
                    None => Response::error(404, "not found"),
                },
                Some((app_name, object)) => match node.apps.get(app_name) {
                    None => Response::error(404, "no such app"),
                    Some(_) if !valid_object_name(object) => Response::error(
                        400,
                        "invalid object name: 1 to 64 of A-Z a-z 0-9 _ . -, not starting with a dot",
                    ),
                    Some(app) if head.upgrade_websocket => match websocket_accept(req, head) {
                        Ok(accept) => {
                            return Routed::Upgrade(Upgrade {
                                app: app.clone(),
                                object: object.to_string(),
                                accept,
                                query: req.query.map(str::to_string),
                            })
                        }
                        Err(resp) => resp,
                    },
                    Some(app) if app.stateless() => {
                        let mut effects = Vec::new();
                        let input = AppInput::Http { method: req.method, query: req.query, body: req.body };
                        match app.handle(&mut Cx::new(None, &mut effects, &mut CallBudget::new(node_ticks(&self.shard))), &input) {
                            Ok(Output::Http(resp)) => resp,
                            Ok(Output::None) => Response::bytes(204, "application/json", Vec::new()),
                            Err(e) => Response::error(e.status, &e.message),
                        }
                    }
                    Some(app) => return Routed::Object { app: app.clone(), object: object.to_string() },
                },
            },
        };
        Routed::Respond(resp)
    }

    /// Completes a WebSocket upgrade. A stateful app's session attaches to its object first;
    /// the object may refuse it (503 `overloaded`, 507 `disk_low`, or the app's own error),
    /// and then no upgrade happens.
    /// Answers an upgrade: `Some` once the 101 is written and the WebSocket loop may start.
    async fn upgrade(&mut self, up: Upgrade, mut out: Vec<u8>) -> Option<Upgrade> {
        if !up.app.stateless() {
            let topic = match up.app.topic(up.query.as_deref()) {
                Ok(t) => t,
                Err(e) => {
                    self.fail(&mut out, e.status, &e.message).await;
                    return None;
                }
            };
            let key = format!("{}/{}", up.app.name(), up.object);
            let session = self.shard.new_session(self.slot, key, topic);
            self.session = Some(session.id);
            let (tx, rx) = async_channel::bounded(1);
            let job = Job::attach(session, up.query.clone(), tx);
            self.shard.submit(&up.app, &up.object, job);
            match rx.recv().await {
                Ok(Ok(())) => {}
                Ok(Err(resp)) => {
                    if let Some(id) = self.session.take() {
                        self.shard.end_session(id);
                    }
                    self.count_status(resp.status);
                    http::write_response(&mut out, &resp, false, false);
                    if self.flush(&mut out).await.is_ok() {
                        Box::pin(self.linger_close()).await;
                    }
                    return None;
                }
                Err(_) => return None,
            }
        }
        self.count_status(101);
        out.extend_from_slice(
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {}\r\n\r\n",
                up.accept
            )
            .as_bytes(),
        );
        if self.flush(&mut out).await.is_err() {
            return None;
        }
        Some(up)
    }

    /// The WebSocket loop: decode frames, hand messages to the app (inline for a stateless
    /// app, to the object's mailbox for a session), write the session's mail while holding
    /// an awake slot, answer pings, close with the code an error calls for, or 1001 when the
    /// node drains.
    async fn websocket(&mut self, up: Upgrade) {
        let Upgrade {
            app,
            object,
            accept,
            query,
        } = up;
        drop((accept, query));
        let shard = self.shard.clone();
        let stats = shard.stats();
        ShardStats::add(&stats.ws_open, 1);
        let _open = scopeguard(|| ShardStats::sub(&stats.ws_open, 1));
        let session = self.session.map(|id| SessionId {
            shard: shard.id as u32,
            id,
        });
        let inline_id = SessionId {
            shard: shard.id as u32,
            id: 0,
        };
        let mut decoder = Decoder::new(shard.node.settings.ws_max_message_bytes);
        // The message rate: a token bucket of COMBD_WS_BURST tokens refilled at COMBD_WS_RATE
        // a second; each message and ping takes one.
        let (rate, burst) = (
            shard.node.settings.ws_rate as f64,
            shard.node.settings.ws_burst as f64,
        );
        let mut tokens = burst;
        let mut refilled = Instant::now();
        // Liveness: a ping every COMBD_WS_PING_INTERVAL; anything received answers it.
        self.ping_epoch = Some(shard.ping_epoch.get());
        let mut awaiting_pong = false;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let mut client_close: Option<Option<u16>> = None;
            let mut over_rate = false;
            let mut error = None;
            if !self.inbuf.is_empty() {
                let on_message = |text: bool, payload: &[u8], out: &mut Vec<u8>| {
                    ShardStats::add(&stats.ws_messages_in, 1);
                    match session {
                        Some(s) => {
                            let job = Job::message(s, text, payload.to_vec());
                            shard.submit(&app, &object, job);
                        }
                        None => {
                            let mut effects = Vec::new();
                            let msg = if text {
                                // The decoder checked the UTF-8.
                                Message::Text(std::str::from_utf8(payload).unwrap_or_default())
                            } else {
                                Message::Binary(payload)
                            };
                            let input = AppInput::Message {
                                session: inline_id,
                                msg,
                            };
                            if let Err(e) = app.handle(
                                &mut Cx::new(
                                    None,
                                    &mut effects,
                                    &mut CallBudget::new(node_ticks(&self.shard)),
                                ),
                                &input,
                            ) {
                                ws::encode_text(
                                    out,
                                    &serde_json::json!({ "error": e.message }).to_string(),
                                );
                            }
                            for e in effects {
                                if let Effect::Send { text, payload, .. } = e {
                                    ShardStats::add(&stats.ws_messages_out, 1);
                                    if text {
                                        ws::encode(
                                            out,
                                            tungstenite::protocol::frame::coding::OpCode::Data(
                                                tungstenite::protocol::frame::coding::Data::Text,
                                            ),
                                            &payload,
                                        );
                                    } else {
                                        ws::encode_binary(out, &payload);
                                    }
                                }
                            }
                        }
                    }
                };
                let mut take_token = || {
                    let now = Instant::now();
                    tokens =
                        (tokens + now.duration_since(refilled).as_secs_f64() * rate).min(burst);
                    refilled = now;
                    if tokens < 1.0 {
                        return false;
                    }
                    tokens -= 1.0;
                    true
                };
                let decoded = decoder.decode(&mut self.inbuf, |ev| match ev {
                    WsEvent::Text(_) | WsEvent::Binary(_) | WsEvent::Ping(_) if !take_token() => {
                        over_rate = true;
                        false
                    }
                    WsEvent::Text(t) => {
                        on_message(true, t.as_bytes(), &mut out);
                        true
                    }
                    WsEvent::Binary(b) => {
                        on_message(false, b, &mut out);
                        true
                    }
                    WsEvent::Ping(p) => {
                        ws::encode_pong(&mut out, p);
                        true
                    }
                    WsEvent::Pong => true,
                    WsEvent::Close(code, _) => {
                        client_close = Some(code);
                        false
                    }
                });
                match decoded {
                    Ok(used) => {
                        self.inbuf.drain(..used);
                    }
                    Err(e) => error = Some(e),
                }
                if self.inbuf.is_empty() {
                    self.inbuf = Vec::new();
                }
            }
            if over_rate {
                ShardStats::add(&stats.ws_rate_closed, 1);
                ws::encode_close(&mut out, Some(ws::close::POLICY), "message rate exceeded");
                self.detach(&app, &object, session);
                if self.flush(&mut out).await.is_ok() {
                    Box::pin(self.linger_close()).await;
                }
                return;
            }
            if let Some(code) = client_close {
                // Answer the close with the client's code (RFC 6455, 5.5.1), then close.
                ws::encode_close(&mut out, code, "");
                self.detach(&app, &object, session);
                if self.flush(&mut out).await.is_ok() {
                    Box::pin(self.linger_close()).await;
                }
                return;
            }
            if let Some(e) = error {
                ShardStats::add(&stats.ws_protocol_closed, 1);
                ws::encode_close(&mut out, Some(e.code()), e.reason());
                self.detach(&app, &object, session);
                if self.flush(&mut out).await.is_ok() {
                    Box::pin(self.linger_close()).await;
                }
                return;
            }
            if self.flush(&mut out).await.is_err() {
                self.detach(&app, &object, session);
                return;
            }
            match self.fill(None, !decoder.in_message()).await {
                Input::Data => awaiting_pong = false,
                Input::PingDue => {
                    self.ping_epoch = Some(shard.ping_epoch.get());
                    if awaiting_pong {
                        ShardStats::add(&stats.ws_ping_timeouts, 1);
                        ws::encode_close(&mut out, Some(ws::close::GOING_AWAY), "ping timeout");
                        self.detach(&app, &object, session);
                        if self.flush(&mut out).await.is_ok() {
                            Box::pin(self.linger_close()).await;
                        }
                        return;
                    }
                    awaiting_pong = true;
                    ws::encode(
                        &mut out,
                        tungstenite::protocol::frame::coding::OpCode::Control(
                            tungstenite::protocol::frame::coding::Control::Ping,
                        ),
                        b"",
                    );
                    if self.flush(&mut out).await.is_err() {
                        self.detach(&app, &object, session);
                        return;
                    }
                }
                Input::Mail => {
                    let Some(id) = self.session else { continue };
                    if let Some(why) = shard.closing(id) {
                        // It reads too slowly, or the shard's outbound budget is spent: close
                        // the connection (no close frame: it is not reading).
                        tracing::debug!(shard = shard.id, session = id, why, "closing a session");
                        self.detach(&app, &object, session);
                        return;
                    }
                    // A sleeping session with mail waits its turn for an awake slot.
                    let permit = shard.acquire_awake().await;
                    let mut taken = 0u64;
                    for frame in shard.take_mail(id) {
                        ShardStats::add(&stats.ws_messages_out, 1);
                        taken += frame.len() as u64;
                        out.extend_from_slice(&frame);
                    }
                    let written = self.write_session(&mut out).await;
                    shard.written(id, taken);
                    drop(permit);
                    if written.is_err() {
                        self.detach(&app, &object, session);
                        return;
                    }
                }
                Input::Eof | Input::Failed | Input::Timeout => {
                    self.detach(&app, &object, session);
                    return;
                }
                Input::Drain => {
                    ws::encode_close(
                        &mut out,
                        Some(ws::close::GOING_AWAY),
                        "server shutting down",
                    );
                    self.detach(&app, &object, session);
                    if self.flush(&mut out).await.is_ok() {
                        Box::pin(self.linger_close()).await;
                    }
                    return;
                }
            }
        }
    }

    /// Tells the object a session left, and forgets the session here.
    fn detach(&mut self, app: &Arc<dyn App>, object: &str, session: Option<SessionId>) {
        if let Some(s) = session {
            self.shard.submit(app, object, Job::detach(s));
        }
        if let Some(id) = self.session.take() {
            self.shard.end_session(id);
        }
    }
}

/// The tick limit of one call.
fn node_ticks(shard: &Shard) -> u64 {
    shard.node.settings.cpu_limit_ticks
}

/// Checks a WebSocket upgrade request (RFC 6455, 4.2.1) and computes `Sec-WebSocket-Accept`.
fn websocket_accept(req: &Request<'_>, head: &Head) -> Result<String, Response> {
    if req.method != "GET" {
        return Err(Response::error(405, "websocket upgrade needs GET").with_header("allow", "GET"));
    }
    if head.body_len != 0 {
        return Err(Response::error(400, "websocket upgrade with a body"));
    }
    let connection_upgrade = req.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("connection")
            && h.value
                .split(|&b| b == b',')
                .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade"))
    });
    if !connection_upgrade {
        return Err(Response::error(
            400,
            "websocket upgrade needs connection: upgrade",
        ));
    }
    if req.header("sec-websocket-version").map(|v| v.trim_ascii()) != Some(b"13") {
        return Err(Response::error(426, "websocket version 13 required")
            .with_header("sec-websocket-version", "13"));
    }
    match req.header("sec-websocket-key").map(|v| v.trim_ascii()) {
        Some(key) if key.len() == 24 => Ok(tungstenite::handshake::derive_accept_key(key)),
        _ => Err(Response::error(400, "missing or invalid sec-websocket-key")),
    }
}

/// Runs `f` when dropped.
fn scopeguard<F: FnOnce()>(f: F) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// The answer to a connection that got in while the node is full: `503` with
/// `retry-after: 1` and `{"error":"overloaded"}`, written before reading anything (a WebSocket
/// upgrade gets it before upgrading), then a lingering close.
pub(crate) async fn refuse(shard: Rc<Shard>, stream: TcpStream) {
    let _ = stream.set_write_timeout(Some(limits::WRITE_STALL_TIMEOUT));
    let slot = shard.register();
    let mut conn = Conn {
        shard,
        stream: Stream::Plain(stream),
        inbuf: Vec::new(),
        slot,
        local: false,
        session: None,
        upgraded: None,
        ping_epoch: None,
    };
    let mut out = Vec::new();
    conn.count_status(503);
    http::write_response(
        &mut out,
        &Response::error(503, "overloaded").with_header("retry-after", "1"),
        false,
        false,
    );
    if conn.flush(&mut out).await.is_ok() {
        conn.linger_close().await;
    }
}

/// The TLS handshake of a new connection, within the shard's cap on handshakes in progress
/// and `COMBD_TLS_HANDSHAKE_TIMEOUT`. `None`: refused, failed or timed out (counted).
async fn handshake(shard: &Rc<Shard>, tcp: TcpStream) -> Option<Stream> {
    let stats = shard.stats();
    let tls = shard.node.tls.as_ref()?;
    if shard.tls_in_progress.get() >= limits::TLS_HANDSHAKES_MAX {
        ShardStats::add(&stats.tls_handshakes_refused, 1);
        return None;
    }
    shard.tls_in_progress.set(shard.tls_in_progress.get() + 1);
    stats.tls_handshakes_in_progress.store(
        shard.tls_in_progress.get() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    let acceptor = futures_rustls::TlsAcceptor::from(tls.current());
    let timeout = shard.node.settings.tls_handshake_timeout;
    let result = glommio::timer::timeout(timeout, async {
        acceptor
            .accept(tcp)
            .await
            .map_err(glommio::GlommioError::IoError)
    })
    .await;
    shard.tls_in_progress.set(shard.tls_in_progress.get() - 1);
    stats.tls_handshakes_in_progress.store(
        shard.tls_in_progress.get() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    match result {
        Ok(s) => {
            ShardStats::add(&stats.tls_handshakes, 1);
            Some(Stream::Tls(Box::new(s)))
        }
        Err(_) => {
            ShardStats::add(&stats.tls_handshake_failures, 1);
            None
        }
    }
}
