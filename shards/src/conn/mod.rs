//! One connection: an I/O core ([`Conn`]: its stream, input buffer, waker, slot, input
//! budget and access-log figures; how it waits for input, writes and closes) and the two
//! protocols over it, each a type that borrows the core for as long as it runs:
//! [`http_conn::HttpConn`] (the HTTP/1.1 loop and its pipeline; where a request goes is
//! [`routes::Router`], a WebSocket upgrade is [`upgrade::Upgrade`], a WebSocket passed on to
//! another node is [`pass_through::PassThrough`]), then, if it upgraded,
//! [`ws_conn::WsConn`] (the WebSocket loop, owning its session's outbound side). Before
//! either, the TLS hand-off ([`tls_handoff`]); instead of either, the late refusal
//! ([`refuse`]) of a connection that got in while the node is full. What each tells the access
//! log is [`access::ConnLog`]'s.
//!
//! Memory: a connection waiting for input holds no buffer. Reads go into the shard's scratch
//! buffer inside a poll; only the bytes of an incomplete request or frame are copied into the
//! connection's own `inbuf`, which is freed as soon as it is consumed. Responses are built in a
//! `Vec` that is dropped once written.

mod access;
mod addressee;
mod caller;
mod http_conn;
mod message;
mod mux;
mod pass_through;
mod refuse;
mod relay;
mod routes;
mod tls_handoff;
mod upgrade;
mod ws_conn;

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use combd_kernel::fair::ClientKey;
use combd_kernel::limits;
use futures_lite::io::AsyncWriteExt;
use futures_lite::AsyncRead;
use glommio::net::TcpStream;

use crate::cells::session::SessionOut;
use crate::cells::Cells;
use crate::http::{self, Response};
use crate::inbound::{ConnInbound, Hold};
use crate::state::slot::{ConnSlot, WakerSlot};
use crate::state::ShardState;
use crate::stats::ShardStats;
use crate::tls::Stream;

use access::{Asked, ConnLog};
use http_conn::HttpConn;
pub(crate) use refuse::refuse;
use routes::Router;
use ws_conn::WsConn;

/// What a wait for input ended with.
enum Woke {
    /// Bytes were appended to `inbuf`.
    Data,
    /// The client closed its side.
    Eof,
    /// Its input waiting in mailboxes went back under its bound: it may be read again.
    Room,
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

struct Conn {
    cells: Rc<Cells>,
    stream: Stream,
    /// Bytes read but not yet consumed: an incomplete request or frame. Empty (and
    /// unallocated) while the connection is idle.
    inbuf: Vec<u8>,
    /// Where the task parks while it waits.
    waker: WakerSlot,
    /// The connection's place in the node's count, released when the connection is dropped.
    slot: ConnSlot,
    local: bool,
    /// Its input waiting in mailboxes and inboxes, made at its first job.
    inbound: std::cell::OnceCell<Arc<ConnInbound>>,
    /// Its figures for the access log, only while the log is on.
    log: Option<Box<ConnLog>>,
}

/// What else ends a WebSocket's wait for input, beside input, its deadline and a drain: its
/// session's mail, and a new ping epoch on the shard. While it waits to read, its session may
/// be written by the fan-out ([`SessionOut::wait_reading`]). An HTTP connection's waits watch
/// nothing else (`None`).
struct Watch {
    /// Its session's outbound side, while it is a session attached to an object.
    session: Option<Rc<SessionOut>>,
    /// The shard's ping epoch it last pinged in.
    ping_epoch: u64,
}

impl Watch {
    /// The task polls: the session's socket is its own from here on.
    fn polled(&self) {
        if let Some(s) = &self.session {
            s.stop_reading();
        }
    }

    /// What ends the wait before a read: the session has mail, or a ping is due.
    fn due(&self, state: &ShardState) -> Option<Woke> {
        if self.session.as_ref().is_some_and(|s| s.has_mail()) {
            return Some(Woke::Mail);
        }
        (self.ping_epoch != state.ping_epoch()).then_some(Woke::PingDue)
    }

    /// The task parks: nothing of its own is being written, so the fan-out may write.
    fn parked(&self) {
        if let Some(s) = &self.session {
            s.wait_reading();
        }
    }
}

/// Sets the socket options a connection the node made itself gets (a fleet forward's socket to
/// the owner): no Nagle delay, TCP keepalive (so the kernel finds half-open peers), and a write
/// stall timeout. An accepted connection inherits the first two from its listener
/// (`combd_kernel::sys::bind_listener`) and gets only the timeout ([`set_write_stall`]).
fn set_socket_options(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let _ = combd_kernel::sys::set_keepalive(
        &crate::tls::tcp_fd(stream),
        limits::TCP_KEEPIDLE_SECS,
        limits::TCP_KEEPINTVL_SECS,
        limits::TCP_KEEPCNT,
    );
    set_write_stall(stream);
}

/// The write stall timeout ([`limits::WRITE_STALL_TIMEOUT`]): glommio's own, no system call.
fn set_write_stall(stream: &TcpStream) {
    let _ = stream.set_write_timeout(Some(limits::WRITE_STALL_TIMEOUT));
}

/// The task of one accepted plain connection, until it closes. `slot` is its place in the
/// connection count, already open.
///
/// Not an `async fn`: the connection is built here, before the task, and moved into an
/// `async move` block that uses it in place. An `async fn` keeps each argument twice (as the
/// argument and as the local it moves into) — the socket was held three times, 240 bytes of
/// every connection's task (measured with `-Zprint-type-sizes`).
pub(crate) fn serve(
    cells: Rc<Cells>,
    slot: ConnSlot,
    stream: TcpStream,
    local: bool,
) -> impl std::future::Future<Output = ()> + 'static {
    set_write_stall(&stream);
    let mut conn = Conn::new(cells, slot, Stream::Plain(stream), local);
    async move { conn.run().await }
}

/// The task of one accepted TLS connection: its ClientHello and handshake (see
/// [`tls_handoff`]), then as [`serve`].
pub(crate) fn serve_tls(
    cells: Rc<Cells>,
    slot: ConnSlot,
    stream: TcpStream,
    local: bool,
) -> impl std::future::Future<Output = ()> + 'static {
    set_write_stall(&stream);
    let own_machine = slot.kind() == crate::shared::ConnKind::Local;
    let asker = ClientKey::of_peer(own_machine, stream.peer_addr().ok().map(|a| a.ip()));
    async move {
        let state = cells.state().clone();
        // Boxed: the hand-off's state would otherwise size the task for its whole life.
        let Some(stream) = Box::pin(tls_handoff::handshake(&state, stream, asker)).await else {
            return;
        };
        let mut conn = Conn::new(cells, slot, stream, local);
        conn.run().await
    }
}

impl Conn {
    /// The HTTP loop, then the WebSocket loop if the connection upgraded: one after the
    /// other, not one inside the other, and the HTTP loop's state (624 bytes) boxed for as
    /// long as it runs, so an idle WebSocket's task holds only the WebSocket loop's state.
    async fn run(&mut self) {
        // The upgrade is taken apart before the WebSocket loop's wait: kept in scope across
        // it, it would size every idle WebSocket's task (16 bytes, measured).
        let mut ws = match Box::pin(HttpConn::new(self).run()).await {
            Some(up) => WsConn::new(self, up),
            None => return,
        };
        ws.run().await;
    }

    fn new(cells: Rc<Cells>, slot: ConnSlot, stream: Stream, local: bool) -> Conn {
        let log = cells.state().access_log().map(|_| {
            let unknown = std::net::SocketAddr::from(([0, 0, 0, 0], 0));
            ConnLog::new(stream.tcp().peer_addr().unwrap_or(unknown))
        });
        Conn {
            log,
            waker: WakerSlot::new(cells.state()),
            cells,
            stream,
            inbuf: Vec::new(),
            slot,
            local,
            inbound: std::cell::OnceCell::new(),
        }
    }

    /// Reserves `bytes` of this connection's input for a job; `None` past the shard's inbound
    /// budget (counted).
    fn hold_input(&self, bytes: u64) -> Option<Hold> {
        self.inbound
            .get_or_init(|| self.new_inbound())
            .reserve(bytes)
    }

    /// Reserves a body of `bytes` about to be read, on the shard's inbound account; `None`
    /// past its budget (counted).
    fn hold_reading(&self, bytes: u64) -> Option<Hold> {
        self.inbound
            .get_or_init(|| self.new_inbound())
            .reserve_reading(bytes)
    }

    /// Its account of input waiting, on its shard's, as its client (its peer's address; the
    /// node's own machine on the localhost listener).
    fn new_inbound(&self) -> Arc<ConnInbound> {
        let local = self.slot.kind() == crate::shared::ConnKind::Local;
        let peer = self.stream.tcp().peer_addr().ok().map(|a| a.ip());
        let client = ClientKey::of_peer(local, peer);
        ConnInbound::new(self.state().inbound(), client)
    }

    /// Whether the connection may be read: its input waiting is under its bound.
    fn has_room(&self) -> bool {
        self.inbound.get().is_none_or(|ib| ib.has_room())
    }

    fn state(&self) -> &Rc<ShardState> {
        self.waker.state()
    }

    /// Who asks, for the pools a job takes from: the verified identity its token named, if
    /// any, else its address ([`Router::address_key`]; the node's own machine stays itself either
    /// way).
    fn asker(
        &self,
        caller: &crate::app::Caller,
        client: Option<&crate::auth::Client>,
    ) -> ClientKey {
        match (self.routes().address_key(caller), client) {
            (key @ ClientKey::Local, _) | (key, None) => key,
            (_, Some(c)) => ClientKey::identity(&c.subject),
        }
    }

    /// Whether the connection came in on the fleet listener (from another node, or claiming
    /// to be one).
    fn on_fleet_listener(&self) -> bool {
        self.slot.kind() == crate::shared::ConnKind::Fleet
    }

    fn stats(&self) -> &ShardStats {
        self.state().stats()
    }

    /// Waits for input and appends it to `inbuf`. `deadline` (on the shard's clock, see
    /// [`ShardState::now_ms`]) bounds the wait: the tick's sweep wakes the task once it passed;
    /// `drain_ok` lets a node drain interrupt it (false while a request is in progress, so it
    /// finishes). Not an `async fn`: a wrapper's future would hold [`Conn::fill_with`]'s
    /// and its own arguments again, 32 bytes of every idle WebSocket's task.
    fn fill(
        &mut self,
        deadline: Option<u64>,
        drain_ok: bool,
    ) -> impl std::future::Future<Output = Woke> + '_ {
        self.fill_with(deadline, drain_ok, false, None)
    }

    /// As [`Conn::fill`], for a WebSocket: its [`Watch`] ends the wait too.
    fn fill_watching<'a>(
        &'a mut self,
        drain_ok: bool,
        watch: &'a Watch,
    ) -> impl std::future::Future<Output = Woke> + 'a {
        self.fill_with(None, drain_ok, false, Some(watch))
    }

    /// As [`Conn::fill`]; `discarding`: the bytes are thrown away (a closing connection's
    /// linger), so the connection is read whatever its input waiting.
    async fn fill_with(
        &mut self,
        deadline: Option<u64>,
        drain_ok: bool,
        discarding: bool,
        watch: Option<&Watch>,
    ) -> Woke {
        let slot = self.waker.index();
        if let Some(d) = deadline {
            self.state().set_deadline(slot, d);
        }
        if !discarding && !self.has_room() {
            ShardStats::add(&self.stats().inbound_waits, 1);
        }
        let input = futures_lite::future::poll_fn(|cx| {
            self.poll_fill(cx, (deadline, drain_ok, discarding), watch)
        })
        .await;
        if deadline.is_some() {
            self.state().set_deadline(slot, 0);
        }
        input
    }

    /// One poll of [`Conn::fill_with`]'s wait (`deadline`, `drain_ok`, `discarding` as its).
    fn poll_fill(
        &mut self,
        cx: &mut Context<'_>,
        (deadline, drain_ok, discarding): (Option<u64>, bool, bool),
        watch: Option<&Watch>,
    ) -> Poll<Woke> {
        let state = self.waker.state();
        if let Some(w) = watch {
            w.polled();
        }
        if drain_ok && state.draining() {
            return Poll::Ready(Woke::Drain);
        }
        if let Some(input) = watch.and_then(|w| w.due(state)) {
            return Poll::Ready(input);
        }
        if let Some(ib) = self
            .inbound
            .get()
            .filter(|ib| !discarding && !ib.has_room())
        {
            // Back-pressure: not read while its input waits; woken when some of it ran.
            if ib.poll_room(cx).is_ready() {
                return Poll::Ready(Woke::Room);
            }
        } else {
            let mut scratch = state.scratch();
            match Pin::new(&mut self.stream).poll_read(cx, &mut scratch[..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Woke::Eof),
                Poll::Ready(Ok(n)) => {
                    if let Some(log) = &self.log {
                        log.on_read(n, self.inbuf.is_empty());
                    }
                    self.inbuf.extend_from_slice(&scratch[..n]);
                    ShardStats::add(&state.stats().bytes_in, n as u64);
                    return Poll::Ready(Woke::Data);
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Woke::Failed),
                Poll::Pending => {}
            }
        }
        if deadline.is_some_and(|d| state.now_ms() >= d) {
            return Poll::Ready(Woke::Timeout);
        }
        state.park(self.waker.index(), cx.waker());
        if let Some(w) = watch {
            w.parked();
        }
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
            ShardStats::add(&self.stats().bytes_out, out.len() as u64);
            if let Some(log) = &self.log {
                log.on_written(out.len());
            }
        }
        *out = Vec::new();
        r
    }

    /// Closes our side and reads (discarding) until the client closes or
    /// [`limits::CLOSE_LINGER`] passes, so unread client bytes cannot turn our close into a
    /// reset that destroys the last response.
    async fn linger_close(&mut self) {
        // Closes the write side (TLS sends its close_notify first).
        let _ = futures_lite::AsyncWriteExt::close(&mut self.stream).await;
        let deadline = self.state().deadline_after(limits::CLOSE_LINGER);
        let mut discarded = 0;
        loop {
            discarded += self.inbuf.len();
            self.inbuf = Vec::new();
            if discarded > limits::CLOSE_LINGER_DISCARD_MAX_BYTES {
                // A client that keeps sending after the node's close (a flood of frames past
                // a 1009) is read no more: its writes wait on the kernels' buffers, costing
                // the shard nothing, while what the node wrote last waits to be read, until
                // the linger ends.
                let left = deadline.saturating_sub(self.state().now_ms());
                Box::pin(glommio::timer::sleep(Duration::from_millis(left))).await;
                break;
            }
            if !matches!(
                self.fill_with(Some(deadline), false, true, None).await,
                Woke::Data
            ) {
                break;
            }
        }
    }

    /// Writes what `out` holds, then closes with a linger.
    async fn flush_and_close(&mut self, out: &mut Vec<u8>) {
        if self.flush(out).await.is_ok() {
            Box::pin(self.linger_close()).await;
        }
    }

    /// Writes a final response to the request `asked` and closes the connection.
    async fn fail(&mut self, out: &mut Vec<u8>, status: u16, message: &str, asked: Asked<'_>) {
        self.respond(out, &Response::error(status, message), false, false, asked);
        self.flush_and_close(out).await;
    }

    /// Appends the response to the request `asked` to `out`, counted (and logged, while the
    /// access log is on).
    fn respond(
        &self,
        out: &mut Vec<u8>,
        resp: &Response,
        keep_alive: bool,
        head_only: bool,
        asked: Asked<'_>,
    ) {
        self.count_status(resp.status);
        let before = out.len();
        http::write_response(out, resp, keep_alive, head_only, &self.state().date());
        if let Some(log) = &self.log {
            let bytes = (out.len() - before) as u64;
            log.http(self.state(), &self.inbuf, asked, resp.status, bytes);
        }
    }

    /// The bytes of `inbuf`, as the request whose response is being written read them.
    fn asked_inbuf(&self) -> Asked<'static> {
        Asked::Inbuf(self.inbuf.len() as u64)
    }

    /// What routing knows of this connection.
    fn routes(&self) -> Router<'_> {
        Router {
            state: self.state(),
            local: self.local,
            listener: self.slot.kind(),
            stream: &self.stream,
            log: self.log.as_deref(),
        }
    }

    fn count_status(&self, status: u16) {
        let stats = self.stats();
        ShardStats::add(&stats.requests, 1);
        match status {
            400..=499 => ShardStats::add(&stats.responses_4xx, 1),
            500..=599 => ShardStats::add(&stats.responses_5xx, 1),
            _ => {}
        }
    }
}
