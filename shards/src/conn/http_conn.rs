//! The HTTP/1.1 loop: one request after another on a connection, pipelined requests answered
//! in order, within the header, body and idle timeouts and the size limits. Pipelined requests
//! for objects go to their mailboxes together (at most `HTTP_OBJECT_PIPELINE` a connection), so
//! one connection's burst is one batch, not one batch a request.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use combd_kernel::fair::ClientKey;
use combd_kernel::limits;

use crate::app::App;
use crate::cells::session::{Attach, SessionOut, Sessions};
use crate::http::{self, Head, ParsedRequest, Request, Reserved, Response};
use crate::job::{Attached, Job};
use crate::object_key::ObjectKey;
use crate::stats::ShardStats;

use super::access::KeptRequest;
use super::caller::AllowOrigin;

use super::pass_through::PassThrough;
use super::routes::Routed;
use super::upgrade::{Attaching, MuxUpgrade, Upgrade, Upgraded};
use super::{Asked, Conn, Woke};

/// What the loop does after a request was answered (or handed on).
enum AfterRequest {
    Continue,
    Close,
    Upgrade(Upgrade),
    /// The multiplexed WebSocket's upgrade.
    Mux(Box<MuxUpgrade>),
    /// A request for an object: it goes to the object's mailbox; its answer joins the pipeline.
    Object(Box<ObjectRequest>),
    /// The operator's look into objects: answered on a blocking thread (a delete, through the
    /// object's mailbox); its answer joins the pipeline.
    Inspect(Box<InspectRequest>),
}

/// The operator's request under `/objects` (`crate::inspect`), owned so it can wait.
struct InspectRequest {
    ask: crate::inspect::Ask,
    head_only: bool,
    entry: Option<Box<KeptRequest>>,
}

/// A request answered from its one parse: what the loop does next, and whether the response
/// kept the connection alive.
type Answered = (AfterRequest, bool);

/// A request for an object, owned so it can wait for its answer.
struct ObjectRequest {
    app: Arc<dyn App>,
    object: String,
    method: String,
    query: Option<String>,
    body: Vec<u8>,
    head_only: bool,
    /// Passed on by another node of the fleet.
    forwarded: bool,
    /// Then, its signature: its answer is signed for it.
    fleet_auth: Option<String>,
    /// The client its token named, if any.
    client: Option<Arc<crate::auth::Client>>,
    /// What else the node saw of it.
    caller: Arc<crate::app::Caller>,
    /// The app's CORS policy lets the request's origin read the answer.
    cors: Option<AllowOrigin>,
    /// A message from another object passed on by the fleet: its sender and outbox id.
    message: Option<(ObjectKey, i64)>,
    /// What the access log keeps of it, while the log is on.
    entry: Option<Box<KeptRequest>>,
}

/// Answers owed on this connection, in request order: the answers of requests sent to objects
/// and, behind the first of them, the responses of the requests that followed (written, kept
/// here until the answers before them are in). Empty whenever the loop waits for input.
#[derive(Default)]
struct AnswersOwed {
    owed: VecDeque<Owed>,
    /// Requests in `owed` waiting for an object.
    objects: usize,
    /// Bytes of the responses in `owed`, written and waiting for the answers before them.
    written: usize,
    /// The reservations of the answers in the connection's `out`, given back once it is
    /// written (a client that reads nothing keeps holding its share, and no more).
    reserved: Vec<Reserved>,
}

enum Owed {
    Object {
        answer: async_channel::Receiver<Response>,
        keep_alive: bool,
        head_only: bool,
        cors: Option<AllowOrigin>,
        entry: Option<Box<KeptRequest>>,
        /// From the fleet: the request's signature, its answer signed for it.
        fleet_auth: Option<String>,
    },
    Written(Vec<u8>),
}

impl AnswersOwed {
    /// Moves what was written to `out` past `mark` behind the answers still owed, if any.
    fn keep_order(&mut self, out: &mut Vec<u8>, mark: usize) {
        if !self.owed.is_empty() && out.len() > mark {
            self.written += out.len() - mark;
            self.owed.push_back(Owed::Written(out.split_off(mark)));
        }
    }
}

/// When (on the shard's clock, in milliseconds) the request being read started (a new
/// connection: its accept), or, with none in progress, when the connection became idle.
enum Clock {
    Request(u64),
    Idle(u64),
}

impl Clock {
    /// When the wait it times ends: the request's head timeout, or the idle timeout.
    fn deadline(&self, header_timeout: Duration, idle_timeout: Duration) -> u64 {
        match *self {
            Clock::Request(t) => t.saturating_add(header_timeout.as_millis() as u64),
            Clock::Idle(t) => t.saturating_add(idle_timeout.as_millis() as u64),
        }
    }
}

/// A connection speaking HTTP/1.1: the loop over its I/O core, until it closes or upgrades.
pub(super) struct HttpConn<'c> {
    conn: &'c mut Conn,
}

impl<'c> HttpConn<'c> {
    pub(super) fn new(conn: &'c mut Conn) -> HttpConn<'c> {
        HttpConn { conn }
    }

    /// The HTTP/1.1 loop. Returns when the connection is to close (`None`), or after an
    /// upgrade, with the upgrade for the WebSocket loop.
    pub(super) async fn run(mut self) -> Option<Upgraded> {
        let mut out: Vec<u8> = Vec::new();
        let mut pipeline = AnswersOwed::default();
        let mut clock = Clock::Request(self.conn.state().now_ms());
        loop {
            let (head, answered) = self.read_head(&mut out, &mut clock, &mut pipeline).await?;
            let (next, keep_alive) = match answered {
                Some(answered) => answered,
                // The body was not all here: read it, then parse the head again to answer.
                None => {
                    self.settle(&mut pipeline, &mut out).await;
                    if !self.read_body(&mut out, &head).await {
                        return None;
                    }
                    let keep_alive = head.keep_alive && !self.conn.state().draining();
                    (self.answer(&head, keep_alive, &mut out), keep_alive)
                }
            };
            self.conn.inbuf.drain(..head.len + head.body_len as usize);
            // A pipelined request's head timeout runs from now; else the connection is idle
            // once this request is answered.
            let pipelined = !self.conn.inbuf.is_empty();
            if let Some(log) = &self.conn.log {
                log.request_done(pipelined);
            }
            if pipelined {
                clock = Clock::Request(self.conn.state().now_ms());
            } else {
                self.conn.inbuf = Vec::new();
            }
            match next {
                AfterRequest::Continue => {}
                AfterRequest::Close => {
                    self.settle(&mut pipeline, &mut out).await;
                    self.conn.flush_and_close(&mut out).await;
                    return None;
                }
                AfterRequest::Object(req) => {
                    self.ask_object(*req, keep_alive, &mut pipeline);
                    if pipeline.objects >= limits::HTTP_OBJECT_PIPELINE {
                        self.settle(&mut pipeline, &mut out).await;
                    }
                }
                AfterRequest::Inspect(req) => {
                    self.inspect(*req, keep_alive, &mut pipeline);
                    self.settle(&mut pipeline, &mut out).await;
                }
                AfterRequest::Upgrade(up) => {
                    self.settle(&mut pipeline, &mut out).await;
                    let up = Box::pin(self.upgrade(up, out)).await;
                    return up.map(|up| Upgraded::One(Box::new(up)));
                }
                AfterRequest::Mux(up) => {
                    self.settle(&mut pipeline, &mut out).await;
                    return self.upgrade_mux(up, out).await;
                }
            }
            if !keep_alive {
                self.settle(&mut pipeline, &mut out).await;
                self.conn.flush_and_close(&mut out).await;
                return None;
            }
            if self.hold_back(&mut pipeline, &mut out).await.is_err() {
                return None;
            }
            if !pipelined {
                clock = Clock::Idle(self.conn.state().now_ms());
            }
        }
    }

    /// Back-pressure: past the bytes of responses a connection may hold, the ones owed are
    /// waited for and everything is written before the next request is answered. A client that
    /// reads nothing then stops the loop here, holding at most that. `Err`: the write failed.
    async fn hold_back(&mut self, pipeline: &mut AnswersOwed, out: &mut Vec<u8>) -> Result<(), ()> {
        let held = out.len() + pipeline.written;
        self.note_held(held);
        if held >= limits::PIPELINE_HELD_MAX_BYTES {
            ShardStats::add(&self.conn.stats().pipeline_held_waits, 1);
            self.settle(pipeline, out).await;
            self.conn.flush(out).await.map_err(|_| ())?;
            pipeline.reserved.clear();
        }
        Ok(())
    }

    /// Reads until a complete head is in `inbuf`, settling the pipeline and writing what `out`
    /// holds before it waits; a request whose body is here too is answered from that one parse
    /// (`Some((next, keep_alive))`, keep_alive as written in the response; the response kept in
    /// the pipeline while answers before it are owed).
    /// `None`: the connection is done (closed, timed out, failed: answered if it could be).
    async fn read_head(
        &mut self,
        out: &mut Vec<u8>,
        clock: &mut Clock,
        pipeline: &mut AnswersOwed,
    ) -> Option<(Head, Option<Answered>)> {
        let settings = self.conn.state().settings();
        let (header_timeout, idle_timeout) = (settings.header_timeout, settings.idle_timeout);
        // How much of `inbuf` the last parse saw ([`HttpConn::parse_if_grown`]).
        let mut seen = 0;
        loop {
            if !self.conn.inbuf.is_empty() {
                if let Clock::Idle(_) = clock {
                    *clock = Clock::Request(self.conn.state().now_ms());
                }
                let mark = out.len();
                match self.parse_if_grown(out, &mut seen) {
                    Ok(Some(got)) => {
                        pipeline.keep_order(out, mark);
                        return Some(got);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        self.settle(pipeline, out).await;
                        let asked = self.conn.asked_inbuf();
                        self.conn.fail(out, e.status, e.message, asked).await;
                        return None;
                    }
                }
            }
            // Answers owed are written before waiting for more input; the connection is idle
            // from when they are.
            if self.settle(pipeline, out).await {
                if let Clock::Idle(_) = clock {
                    *clock = Clock::Idle(self.conn.state().now_ms());
                }
            }
            if self.conn.flush(out).await.is_err() {
                return None;
            }
            pipeline.reserved.clear();
            let deadline = clock.deadline(header_timeout, idle_timeout);
            if let (Clock::Request(started), false) = (&*clock, self.conn.inbuf.is_empty()) {
                self.pace_if_slow(*started, true, deadline).await;
            }
            match self
                .conn
                .fill(Some(deadline), self.conn.inbuf.is_empty())
                .await
            {
                Woke::Data | Woke::Mail | Woke::PingDue | Woke::Room => {}
                Woke::Eof | Woke::Failed | Woke::Drain => return None,
                Woke::Timeout => {
                    if let Clock::Idle(_) = clock {
                        ShardStats::add(&self.conn.stats().idle_closed, 1);
                    } else {
                        ShardStats::add(&self.conn.stats().request_timeouts, 1);
                        let asked = self.conn.asked_inbuf();
                        self.conn
                            .fail(out, 408, "request head not received in time", asked)
                            .await;
                    }
                    return None;
                }
            }
        }
    }

    /// [`HttpConn::parse_and_answer`], if a line of the head in `inbuf` ended since the last parse
    /// (which saw `seen` bytes of it; updated) or the head passed its limit; else `Ok(None)`. A
    /// head is not parsed again for every byte a slow client trickles (2,000 clients sending a
    /// header a byte at a time made the node parse their growing heads 20,000 times a second:
    /// an honest client's p99 went from 3 to 28 ms).
    fn parse_if_grown(
        &self,
        out: &mut Vec<u8>,
        seen: &mut usize,
    ) -> Result<Option<(Head, Option<Answered>)>, http::HeadError> {
        let line_ended = self.conn.inbuf[(*seen).min(self.conn.inbuf.len())..].contains(&b'\n');
        let over = self.conn.inbuf.len() > limits::HEADER_SECTION_MAX_BYTES;
        *seen = self.conn.inbuf.len();
        if line_ended || over {
            self.parse_and_answer(out)
        } else {
            Ok(None)
        }
    }

    /// Reads the body of `head` into `inbuf` (answering `Expect: 100-continue`), within the
    /// body limit and timeout. False: the connection is done.
    async fn read_body(&mut self, out: &mut Vec<u8>, head: &Head) -> bool {
        let settings = self.conn.state().settings();
        let (max_body, body_timeout) = (settings.max_body_bytes, settings.body_timeout);
        if head.body_len > max_body {
            let asked = self.conn.asked_inbuf();
            self.conn
                .fail(out, 413, "request body too large", asked)
                .await;
            return false;
        }
        let total = head.len + head.body_len as usize;
        if self.conn.inbuf.len() >= total {
            return true;
        }
        // The body is held while it arrives: reserved first, against the shard's inbound
        // budget, so bodies that arrive slowly (or never) cannot hold more than it. Past it:
        // 503 and close, nothing read of it.
        let Some(_reading) = self.conn.hold_reading(head.body_len) else {
            let busy = Response::overloaded();
            self.conn
                .respond(out, &busy, false, false, self.conn.asked_inbuf());
            self.conn.flush_and_close(out).await;
            return false;
        };
        if head.expect_continue {
            out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        if self.conn.flush(out).await.is_err() {
            return false;
        }
        let deadline = self.conn.state().deadline_after(body_timeout);
        let started = self.conn.state().now_ms();
        // Bytes the last read brought (none read yet: not a small read).
        let mut last_read = usize::MAX;
        while self.conn.inbuf.len() < total {
            let small = last_read < limits::SLOW_READ_MIN_BYTES;
            self.pace_if_slow(started, small, deadline).await;
            let before = self.conn.inbuf.len();
            last_read = usize::MAX;
            match self.conn.fill(Some(deadline), false).await {
                Woke::Data => last_read = self.conn.inbuf.len() - before,
                Woke::Mail | Woke::PingDue | Woke::Room => {}
                Woke::Eof | Woke::Failed | Woke::Drain => return false,
                Woke::Timeout => {
                    ShardStats::add(&self.conn.stats().request_timeouts, 1);
                    let asked = self.conn.asked_inbuf();
                    self.conn
                        .fail(out, 408, "request body not received in time", asked)
                        .await;
                    return false;
                }
            }
        }
        true
    }

    /// Pauses a slow request's reading before its next read (see [`limits::SLOW_READ_INTERVAL`]):
    /// the request started at `started` (on the shard's clock) and is still incomplete; `small`
    /// when its last read brought little. Returns at once for a request that is not slow, and
    /// never waits past `deadline`, so the request's timeout fires on time.
    async fn pace_if_slow(&self, started: u64, small: bool, deadline: u64) {
        let now = self.conn.state().now_ms();
        let after = limits::SLOW_REQUEST_AFTER.as_millis() as u64;
        if !small || now.saturating_sub(started) < after {
            return;
        }
        let interval = limits::SLOW_READ_INTERVAL.as_millis() as u64;
        // A phase of its own: slow clients that send together are not read together.
        let phase = (self.conn.waker.index() as u64).wrapping_mul(7_919) % interval;
        let pause = (interval + phase).min(deadline.saturating_sub(now));
        if pause == 0 {
            return;
        }
        ShardStats::add(&self.conn.stats().slow_reads_paced, 1);
        // Boxed: the timer is held only while pausing, not in every connection's future.
        Box::pin(glommio::timer::sleep(Duration::from_millis(pause))).await;
    }

    /// Parses the request at the start of `inbuf` once and, when its body is here too, routes
    /// it and appends its response to `out`. `Ok(None)`: the head is not complete yet. A plain
    /// function, not async: the header array lives on this frame only, never in the
    /// connection's future (which every idle connection keeps).
    fn parse_and_answer(
        &self,
        out: &mut Vec<u8>,
    ) -> Result<Option<(Head, Option<Answered>)>, http::HeadError> {
        let mut headers = [httparse::EMPTY_HEADER; limits::HEADER_COUNT_MAX];
        Ok(match http::parse_request(&self.conn.inbuf, &mut headers)? {
            ParsedRequest::Partial => None,
            ParsedRequest::Head(head) => Some((head, None)),
            // Past the body limit: the body check refuses it (413).
            ParsedRequest::Complete(head, _)
                if head.body_len > self.conn.state().settings().max_body_bytes =>
            {
                Some((head, None))
            }
            ParsedRequest::Complete(head, req) => {
                let keep_alive = head.keep_alive && !self.conn.state().draining();
                let next = self.answer_request(&req, &head, keep_alive, out);
                Some((head, Some((next, keep_alive))))
            }
        })
    }

    /// Answers the request at the start of `inbuf` once its body is here (the head parsed
    /// again: the rare path of a body that came after its head).
    fn answer(&self, head: &Head, keep_alive: bool, out: &mut Vec<u8>) -> AfterRequest {
        let mut headers = [httparse::EMPTY_HEADER; limits::HEADER_COUNT_MAX];
        let Some(req) = http::borrow_request(&self.conn.inbuf, head, &mut headers) else {
            self.conn.respond(
                out,
                &Response::error(400, "malformed request"),
                false,
                false,
                self.conn.asked_inbuf(),
            );
            return AfterRequest::Close;
        };
        self.answer_request(&req, head, keep_alive, out)
    }

    /// Router a complete request and appends its response to `out`, or says where it goes.
    fn answer_request(
        &self,
        req: &Request<'_>,
        head: &Head,
        keep_alive: bool,
        out: &mut Vec<u8>,
    ) -> AfterRequest {
        let head_only = req.method == "HEAD";
        let bytes_in = head.len as u64 + head.body_len;
        let fleet_auth = match self.from_fleet(req) {
            Ok(fleet_auth) => fleet_auth,
            Err(resp) => {
                let asked = Asked::Parsed(req.method, req.path, bytes_in);
                self.conn.respond(out, &resp, keep_alive, head_only, asked);
                return AfterRequest::Continue;
            }
        };
        let from_fleet = fleet_auth.is_some();
        // A browser's page of another site may not open a WebSocket or change state in the
        // user's name (`combd_kernel::origins`); what the fleet passes on was checked where the
        // client connected.
        if !from_fleet && !self.origin_allowed(req, head) {
            ShardStats::add(&self.conn.stats().origin_refused, 1);
            let resp = Response::error(403, "origin not allowed");
            let asked = Asked::Parsed(req.method, req.path, bytes_in);
            self.conn.respond(out, &resp, keep_alive, head_only, asked);
            return AfterRequest::Continue;
        }
        match self.conn.routes().route(req, head, from_fleet) {
            Routed::Respond(resp) => {
                let resp = self.signed_for_fleet(resp, fleet_auth.as_deref());
                let asked = Asked::Parsed(req.method, req.path, bytes_in);
                self.conn.respond(out, &resp, keep_alive, head_only, asked);
                AfterRequest::Continue
            }
            Routed::Upgrade(up) => AfterRequest::Upgrade(up),
            Routed::Mux(up) => AfterRequest::Mux(Box::new(up)),
            Routed::Inspect(ask) => AfterRequest::Inspect(Box::new(InspectRequest {
                ask,
                head_only,
                entry: (self.conn.log.as_deref()).map(|l| l.kept(req.method, req.path, bytes_in)),
            })),
            Routed::Object {
                app,
                object,
                client,
                caller,
                cors,
                message,
            } => AfterRequest::Object(Box::new(ObjectRequest {
                app,
                object,
                method: req.method.to_string(),
                query: req.query.map(str::to_string),
                body: req.body.to_vec(),
                head_only,
                forwarded: from_fleet,
                fleet_auth,
                client,
                caller,
                cors,
                message,
                entry: (self.conn.log.as_deref()).map(|l| l.kept(req.method, req.path, bytes_in)),
            })),
        }
    }

    /// Whether the request comes from the fleet: what does (the fleet listener takes nothing
    /// else, and the mark that a request was passed on is believed only so) is signed with the
    /// fleet key, within the sending node's share of the signed requests remembered. `Some`:
    /// its signature (its answer is signed for it, [`HttpConn::signed_for_fleet`]); `Err`: the
    /// refusal to answer it with.
    fn from_fleet(&self, req: &Request<'_>) -> Result<Option<String>, Response> {
        let Some(fleet) = &self.conn.state().node().fleet else {
            return Ok(None);
        };
        let forwarded = req.header(combd_fleet::forward::FORWARDED_HEADER).is_some();
        if !self.conn.on_fleet_listener() && !forwarded {
            return Ok(None);
        }
        let signature = req.header(combd_fleet::auth::AUTH_HEADER);
        let client = req
            .header(combd_fleet::forward::CLIENT_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok())
            .unwrap_or("");
        let peer = self.conn.stream.tcp().peer_addr().ok().map(|a| a.ip());
        let peer = ClientKey::of_peer(false, peer);
        let target = req.target();
        let fields = req.headers.iter().map(|h| (h.name, h.value));
        let client = combd_fleet::forward::covered(client, fields);
        fleet
            .trust
            .authenticate(peer, signature, req.method, &target, &client, req.body)
            .map(|()| signature.map(|s| String::from_utf8_lossy(s).into_owned()))
            .map_err(crate::fleet::auth_refused)
    }

    /// `resp` signed for the fleet request whose signature was `fleet_auth`, if it was one
    /// (`combd_fleet::auth::ANSWER_HEADER`): the node passing it on takes it only so.
    fn signed_for_fleet(&self, resp: Response, fleet_auth: Option<&str>) -> Response {
        let (Some(request), Some(fleet)) = (fleet_auth, &self.conn.state().node().fleet) else {
            return resp;
        };
        let fields = combd_fleet::forward::answer_fields(
            Some(&resp.content_type),
            resp.headers.iter().map(|(n, v)| (*n, v.as_str())),
            crate::fleet::kept_in_answer,
        );
        let mac = fleet
            .trust
            .sign_answer(request, resp.status, &fields, &resp.body);
        resp.with_header(combd_fleet::auth::ANSWER_HEADER, mac)
    }

    /// Whether the request's `Origin` may make it: checked for a WebSocket upgrade and for
    /// any method but `GET`, `HEAD` and `OPTIONS` (RFC 9110's safe methods a page may send
    /// anywhere; CORS keeps their answers from the page). An HTTP request to an app whose CORS
    /// policy takes the origin may make it too.
    fn origin_allowed(&self, req: &Request<'_>, head: &Head) -> bool {
        let checked = head.upgrade_websocket || !matches!(req.method, "GET" | "HEAD" | "OPTIONS");
        !checked
            || self.conn.state().settings().allowed_origins.allows(
                req.header("origin"),
                req.header("host"),
                matches!(self.conn.stream, crate::tls::Stream::Tls(_)),
            )
            || (!head.upgrade_websocket && self.app_takes_origin(req))
    }

    /// Whether the app of `/o/<app>/...` lets the request's origin call it (its CORS policy).
    fn app_takes_origin(&self, req: &Request<'_>) -> bool {
        let app = req
            .path
            .strip_prefix("/o/")
            .and_then(|rest| rest.split_once('/'))
            .and_then(|(app, _)| self.conn.state().node().apps.get(app));
        app.is_some_and(|app| super::caller::cors_of(req, app.as_ref()).is_some())
    }

    /// Sends a request to its object's mailbox, its body held against the connection's and
    /// the shard's inbound budget (past the shard's: 503 `overloaded`, nothing queued); its
    /// answer is owed in the pipeline.
    fn ask_object(&self, req: ObjectRequest, keep_alive: bool, pipeline: &mut AnswersOwed) {
        let (tx, answer) = async_channel::bounded(1);
        let asker = self.conn.asker(&req.caller, req.client.as_deref());
        match self.conn.hold_input(req.body.len() as u64) {
            Some(hold) => {
                let job = match req.message {
                    Some((from, id)) => {
                        let (app, name) = (from.app().to_string(), from.name().to_string());
                        let sender = (app, name, id);
                        Job::from_object(sender, req.body, true, tx)
                    }
                    None => Job::http(
                        req.method,
                        req.query,
                        req.body,
                        req.forwarded,
                        req.client,
                        req.caller,
                        tx,
                    ),
                };
                let job = job.held(hold).asked_by(asker);
                self.conn.cells.submit(&req.app, &req.object, job);
            }
            None => {
                let _ = tx.try_send(Response::overloaded());
            }
        }
        pipeline.owed.push_back(Owed::Object {
            answer,
            keep_alive,
            head_only: req.head_only,
            cors: req.cors,
            entry: req.entry,
            fleet_auth: req.fleet_auth,
        });
        pipeline.objects += 1;
    }

    /// Answers the operator's request under `/objects` on a blocking thread (a delete through
    /// the object's mailbox, as `cx.delete()`); its answer is owed in the pipeline.
    fn inspect(&self, req: InspectRequest, keep_alive: bool, pipeline: &mut AnswersOwed) {
        use crate::inspect::Ask;
        let (tx, answer) = async_channel::bounded(1);
        let cells = self.conn.cells.clone();
        let node = cells.state().node().clone();
        match req.ask {
            Ask::Delete { app, name } => match node.apps.get(&app) {
                Some(app) => cells.submit(&app, &name, Job::delete(tx)),
                None => {
                    let _ = tx.try_send(Response::error(404, "no such app"));
                }
            },
            Ask::Restore {
                app,
                name,
                at,
                into,
            } => match (node.apps.get(&app), &node.fleet) {
                (_, Some(_)) => {
                    let e = "restoring an object in a fleet is not built yet";
                    let _ = tx.try_send(Response::error(501, e));
                }
                (Some(app), None) => {
                    let from = ObjectKey::new(app.name(), &name);
                    cells.submit(&app, &into, Job::restore(from, at, tx));
                }
                (None, None) => {
                    let _ = tx.try_send(Response::error(404, "no such app"));
                }
            },
            ask => {
                let state = cells.state().clone();
                let task = state.clone().spawn(async move {
                    let resp = state
                        .on_thread(ClientKey::Local, move || crate::inspect::answer(&node, ask))
                        .await;
                    let _ = tx.try_send(resp);
                });
                if let Ok(task) = task {
                    task.detach();
                }
            }
        }
        pipeline.owed.push_back(Owed::Object {
            answer,
            keep_alive,
            head_only: req.head_only,
            cors: None,
            entry: req.entry,
            fleet_auth: None,
        });
        pipeline.objects += 1;
    }

    /// Waits for every answer owed and appends them, and the responses kept behind them, to
    /// `out` in request order, writing `out` whenever it holds
    /// [`limits::PIPELINE_HELD_MAX_BYTES`] (a large answer is written before the next is
    /// appended; a write that fails drops the rest). True if anything was owed.
    async fn settle(&mut self, pipeline: &mut AnswersOwed, out: &mut Vec<u8>) -> bool {
        if pipeline.owed.is_empty() {
            return false;
        }
        while let Some(owed) = pipeline.owed.pop_front() {
            if out.len() >= limits::PIPELINE_HELD_MAX_BYTES {
                if self.conn.flush(out).await.is_err() {
                    pipeline.owed.clear();
                    break;
                }
                pipeline.reserved.clear();
            }
            match owed {
                Owed::Written(bytes) => out.extend_from_slice(&bytes),
                Owed::Object {
                    answer,
                    keep_alive,
                    head_only,
                    cors,
                    entry,
                    fleet_auth,
                } => {
                    let mut resp = answer
                        .recv()
                        .await
                        .unwrap_or_else(|_| Response::overloaded());
                    if let Some(cors) = &cors {
                        cors.apply(&mut resp);
                    }
                    let resp = self.signed_for_fleet(resp, fleet_auth.as_deref());
                    let asked = Asked::Kept(entry.as_deref());
                    self.conn.respond(out, &resp, keep_alive, head_only, asked);
                    pipeline.reserved.push(resp.reserved);
                }
            }
        }
        pipeline.objects = 0;
        pipeline.written = 0;
        self.note_held(out.len());
        true
    }

    /// Answers an upgrade: `Some` once the 101 is written and the WebSocket loop may start.
    /// A stateful app's session attaches to its object first ([`HttpConn::attach`]).
    async fn upgrade(&mut self, mut up: Upgrade, mut out: Vec<u8>) -> Option<Upgrade> {
        let cells = self.conn.cells.clone();
        // Its session, kept only once the 101 is written.
        let attaching = match up.app.stateless() {
            true => None,
            false => Some(self.attach(cells.sessions(), &mut up, &mut out).await?),
        };
        self.conn.count_status(101);
        up.write_101(&mut out, &self.conn.state().date());
        if self.conn.flush(&mut out).await.is_err() {
            return None;
        }
        if let Some(log) = &self.conn.log {
            log.ws_open(self.conn.state());
        }
        up.session = attaching.and_then(Attaching::keep);
        Some(up)
    }

    /// Answers the multiplexed WebSocket's upgrade: its hub, once the 101 is written.
    async fn upgrade_mux(&mut self, up: Box<MuxUpgrade>, mut out: Vec<u8>) -> Option<Upgraded> {
        self.conn.count_status(101);
        let date = self.conn.state().date();
        super::upgrade::write_101(&mut out, &date, (&up.accept, up.protocol, None));
        self.conn.flush(&mut out).await.ok()?;
        if let Some(log) = &self.conn.log {
            log.ws_open(self.conn.state());
        }
        let hub = SessionOut::hub(
            self.conn.waker.index(),
            self.conn.state().clone(),
            up.client.clone(),
            up.caller.clone(),
        );
        Some(Upgraded::Many(up, Rc::new(hub)))
    }

    /// Opens the upgrade's session (of `sessions`) and asks its object to take it. The object
    /// may refuse it (503 `overloaded`, 507 `disk_low`, or the app's own error: answered here),
    /// or say another node owns it (the whole WebSocket passes through to it): then `None`,
    /// the session ended, and no upgrade happens.
    async fn attach<'s>(
        &mut self,
        sessions: &'s Sessions,
        up: &mut Upgrade,
        out: &mut Vec<u8>,
    ) -> Option<Attaching<'s>> {
        let topic = match up.app.topic(up.query.as_deref()) {
            Ok(t) => t,
            Err(e) => {
                self.conn
                    .fail(out, e.status, &e.message, Asked::Upgrade)
                    .await;
                return None;
            }
        };
        let (slot, asker) = (
            self.conn.waker.index(),
            self.conn.asker(&up.caller, up.client.as_deref()),
        );
        let who = Attach {
            query: up.query.clone(),
            client: up.client.clone(),
            caller: up.caller.clone(),
            numbered: up.resume.is_some(),
            hub: None,
        };
        let job_topic = (up.resume.is_some() || up.app.presence()).then(|| topic.clone());
        let opened = sessions.open((slot, asker), up.object_key().into(), topic, who);
        let session = opened.session_id();
        let attaching = Attaching::new(sessions, opened);
        let (tx, rx) = async_channel::bounded(1);
        let (query, client, caller) = (up.query.clone(), up.client.clone(), up.caller.clone());
        let job = Job::attach(session, query, client, caller, tx, up.replay.is_some()).on_topic(
            job_topic.as_deref().unwrap_or(""),
            up.resume,
            up.app.presence(),
        );
        self.conn
            .cells
            .submit(&up.app, &up.object, job.asked_by(asker));
        match rx.recv().await {
            Ok(Attached::Yes) => return Some(attaching),
            Ok(Attached::Refused(resp)) => {
                drop(attaching);
                self.conn.respond(out, &resp, false, false, Asked::Upgrade);
                self.conn.flush_and_close(out).await;
            }
            Ok(Attached::Owner(owner)) => {
                // Another node owns the object: the whole WebSocket goes through to it.
                drop(attaching);
                if let Some(replay) = up.replay.take() {
                    let pass = PassThrough {
                        conn: &mut *self.conn,
                        owner: &owner,
                        object: &up.object,
                    };
                    Box::pin(pass.run(replay)).await;
                }
            }
            Err(_) => {}
        }
        None
    }

    /// Records `bytes` of responses held by this connection in the shard's high-water mark
    /// (`pipeline_held_bytes_max`).
    fn note_held(&self, bytes: usize) {
        self.conn
            .stats()
            .pipeline_held_bytes_max
            .fetch_max(bytes as u64, std::sync::atomic::Ordering::Relaxed);
    }
}
