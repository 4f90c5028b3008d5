//! The multiplexed WebSocket (`GET /ws`, its envelope in [`crate::ws::mux`]): many
//! subscriptions on one socket, each a session of its own attached to an object of any app on
//! any shard, with its own place in its topic's log and its own presence ([`Sub`]). The
//! socket's outbound side is a hub ([`SessionOut::hub`]): every subscription's waiting bytes
//! count in it against one budget (a slow reader is slow for all of them and is closed
//! whole), and a subscription's wake marks it, so the connection waits on one thing.
//!
//! Bounds: `COMBD_WS_SUBSCRIPTIONS` on one socket, and `COMBD_SUBSCRIPTIONS_MAX` on the node,
//! a shared pool each client holds its share of (`fair_subscriptions_*`). A refused subscribe
//! is answered on its channel; the socket's other subscriptions go on.

use std::rc::Rc;
use std::sync::Arc;

use combd_kernel::fair::ClientKey;

use crate::auth::Client;
use crate::cells::session::{Attach, CloseWhy, SessionOut};
use crate::fair::Share;
use crate::http::Response;
use crate::job::{Attached, Job};
use crate::object_key::ObjectKey;
use crate::stats::ShardStats;
use crate::ws::deflate::Framing;
use crate::ws::mux::{self, Envelope};
use crate::ws::numbered::Resume;

use super::addressee::{Addressee, Close};
use super::relay;
use super::upgrade::Attaching;
use super::Conn;

/// One subscription: its channel, its object, its session and its unit of the node's pool.
struct Sub {
    ch: u32,
    to: Addressee,
    session: Rc<SessionOut>,
    /// In a fleet: the relay to its object's owner, when another node owns it.
    remote: Option<relay::Remote>,
    _share: Share,
}

/// A subscribe read from the client, to be attached once the read's messages are handed on.
struct Pending {
    ch: u32,
    app: String,
    object: String,
    query: Option<String>,
}

/// The mail of a socket's subscriptions, taken to be written: its bytes, and whose they are
/// in order (`None`: the node's own frames about a subscription), so each session is told as
/// the kernel takes its part.
pub(super) struct MuxMail {
    pub bytes: Vec<u8>,
    parts: Vec<(Option<Rc<SessionOut>>, u64)>,
    /// Messages of the subscriptions in it.
    pub messages: usize,
    /// Bytes of the node's own frames in it (counted in the shard's outbound bytes while
    /// they are written).
    pub own_bytes: u64,
}

impl MuxMail {
    /// The kernel took `n` more bytes: told to the sessions whose they were, in order.
    pub fn written(&mut self, mut n: u64) {
        while n > 0 {
            let Some((session, left)) = self.parts.first_mut() else {
                return;
            };
            let took = n.min(*left);
            if let Some(s) = session {
                s.written(took);
            }
            *left -= took;
            n -= took;
            if *left == 0 {
                self.parts.remove(0);
            }
        }
    }
}

/// The subscriptions of a multiplexed WebSocket.
pub(super) struct Mux {
    subs: Vec<Sub>,
    pending: Vec<Pending>,
    /// Who asks, for the shares of the pools its subscriptions take.
    asker: ClientKey,
}

impl Mux {
    pub(super) fn new(asker: ClientKey) -> Mux {
        Mux {
            subs: Vec::new(),
            pending: Vec::new(),
            asker,
        }
    }

    /// Whether subscribes wait to be attached.
    pub(super) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    fn is_open(&self, ch: u32) -> bool {
        self.subs.iter().any(|s| s.ch == ch) || self.pending.iter().any(|p| p.ch == ch)
    }

    /// A message from the client (`text` or binary): a subscribe (attached once the read's
    /// messages are handed on: [`Mux::attach_pending`]), an unsubscribe, or a message to a
    /// channel's object. Answers go into `out`; `Err`: the socket is to close (1008).
    pub(super) fn on_message(
        &mut self,
        conn: &Conn,
        text: bool,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), Close> {
        let policy = |why| Close::Frame(Some(crate::ws::close::POLICY), why);
        let envelope = mux::parse(payload).map_err(|e| {
            tracing::debug!("bad envelope: {e}");
            ShardStats::add(&conn.stats().ws_protocol_closed, 1);
            policy("bad envelope")
        })?;
        match envelope {
            Envelope::Subscribe {
                ch,
                app,
                object,
                query,
            } => {
                if self.is_open(ch) {
                    return Err(policy("channel in use"));
                }
                let max = conn.state().settings().ws_subscriptions;
                if (self.subs.len() + self.pending.len()) as u64 >= max {
                    ShardStats::add(&conn.stats().ws_subscriptions_refused, 1);
                    mux::ended(out, ch, &mux::refusal(429, "too many subscriptions"));
                    return Ok(());
                }
                self.pending.push(Pending {
                    ch,
                    app: app.to_string(),
                    object: object.to_string(),
                    query: query.map(str::to_string),
                });
            }
            Envelope::Unsubscribe { ch } => match self.subs.iter().position(|s| s.ch == ch) {
                Some(i) => {
                    let sub = self.subs.swap_remove(i);
                    leave(conn, &sub);
                    mux::ended(out, ch, "");
                }
                None => no_such(out, ch),
            },
            Envelope::Message { ch, payload } => match self.subs.iter().find(|s| s.ch == ch) {
                Some(sub) => send(conn, sub, text, payload, out),
                None => no_such(out, ch),
            },
        }
        Ok(())
    }

    /// Attaches each subscribe waiting, in the order sent, for the socket of `hub`: the
    /// channel is answered `+<ch>|` once its object took it, or `-<ch>|` with why not.
    pub(super) async fn attach_pending(
        &mut self,
        conn: &Conn,
        hub: &Rc<SessionOut>,
        out: &mut Vec<u8>,
    ) {
        for p in std::mem::take(&mut self.pending) {
            match self.attach(conn, hub, &p).await {
                Ok(sub) => {
                    mux::subscribed(out, p.ch);
                    ShardStats::add(&conn.stats().ws_subscriptions, 1);
                    // Room for this one only: a socket's list is as long as its subscriptions,
                    // with no doubling's spare room (RESULTS.md, "Many subscriptions on one
                    // socket").
                    self.subs.reserve_exact(1);
                    self.subs.push(sub);
                }
                Err(why) => {
                    ShardStats::add(&conn.stats().ws_subscriptions_refused, 1);
                    mux::ended(out, p.ch, &why);
                }
            }
        }
    }

    /// Attaches one subscribe: checked as an upgrade of `/o/<app>/<name>` is, a unit of the
    /// node's pool taken for its client, its session opened and its object asked. `Err`: why
    /// not, as `-<ch>|` tells it.
    async fn attach(&self, conn: &Conn, hub: &Rc<SessionOut>, p: &Pending) -> Result<Sub, String> {
        let refused = |resp: Response| Err(refusal_of(&resp));
        let node = conn.state().node();
        let Some(app) = node.apps.get(&p.app) else {
            return refused(Response::error(404, "no such app"));
        };
        if app.stateless() {
            return refused(Response::error(
                400,
                "a stateless app has no object to subscribe to",
            ));
        }
        if let Err(resp) =
            super::routes::object_and_rest(&p.object).and_then(|(_, rest)| match rest {
                Some(_) => Err(Response::error(
                    400,
                    "a subscription names an object, no path under it",
                )),
                None => Ok(()),
            })
        {
            return refused(resp);
        }
        let client = hub.client().filter(|c| c.for_app(app.name())).cloned();
        if client.is_none() && app.identified() {
            return refused(Response::error(401, "unauthorized"));
        }
        let query = p.query.as_deref();
        let resume = Resume::from_query(query).map_err(|e| mux::refusal(400, &e))?;
        let topic = app
            .topic(query)
            .map_err(|e| mux::refusal(e.status, &e.message))?;
        let Ok(share) = node.pools.subscriptions.take(self.asker, 1) else {
            return refused(Response::overloaded());
        };
        let mut to = Addressee {
            app,
            object: p.object.clone(),
            deflate: None,
            numbered: resume.is_some(),
        };
        let (session, remote) = self
            .open(conn, hub, &to, (topic, query, client), resume)
            .await?;
        // A relayed subscription's frames come numbered by its owner: written as they are.
        to.numbered &= remote.is_none();
        Ok(Sub {
            ch: p.ch,
            to,
            session,
            remote,
            _share: share,
        })
    }

    /// Opens a subscription's session (to `to`, its topic, query and client as `who`) and asks
    /// its object to take it; in a fleet, an object another node owns is carried there
    /// ([`relay`]).
    async fn open(
        &self,
        conn: &Conn,
        hub: &Rc<SessionOut>,
        to: &Addressee,
        (topic, query, client): (String, Option<&str>, Option<Arc<Client>>),
        resume: Option<Resume>,
    ) -> Result<(Rc<SessionOut>, Option<relay::Remote>), String> {
        let sessions = conn.cells.sessions();
        let who = Attach {
            query: query.map(str::to_string),
            client: client.clone(),
            caller: hub.caller().clone(),
            numbered: to.numbered,
            hub: Some(hub.clone()),
        };
        let key = ObjectKey::new(to.app.name(), &to.object);
        let job_topic = (to.numbered || to.app.presence()).then(|| topic.clone());
        let opened = sessions.open((conn.waker.index(), self.asker), key.into(), topic, who);
        let session = opened.session_id();
        let attaching = Attaching::new(sessions, opened);
        let (tx, rx) = async_channel::bounded(1);
        let token = client.as_ref().map(|c| c.token().to_string());
        // In a fleet the object's owner may be another node: the answer says which.
        let may_pass = conn.state().node().fleet.is_some();
        let (q, caller) = (query.map(str::to_string), hub.caller().clone());
        let job = Job::attach(session, q, client, caller, tx, may_pass).on_topic(
            job_topic.as_deref().unwrap_or(""),
            resume,
            to.app.presence(),
        );
        conn.cells
            .submit(&to.app, &to.object, job.asked_by(self.asker));
        let overloaded = || mux::refusal(503, "overloaded");
        match rx.recv().await {
            Ok(Attached::Yes) => attaching.keep().map(|s| (s, None)).ok_or_else(overloaded),
            Ok(Attached::Refused(resp)) => Err(refusal_of(&resp)),
            Ok(Attached::Owner(owner)) => {
                let target = match query {
                    Some(q) => format!("/o/{}/{}?{q}", to.app.name(), to.object),
                    None => format!("/o/{}/{}", to.app.name(), to.object),
                };
                let opening = relay::Opening {
                    owner: &owner,
                    target,
                    token: token.as_deref(),
                    origin: hub.caller().origin.as_deref(),
                    addr: hub.caller().addr,
                };
                let remote = carry(conn, &opening, attaching).await?;
                Ok((remote.0, Some(remote.1)))
            }
            Err(_) => Err(overloaded()),
        }
    }

    /// Takes the mail of every subscription that has some, after ending those the node closed
    /// (an app removed, a resume its object could not serve: `-<ch>|{"code":…}`) and resyncing
    /// those that missed frames. `Err`: the socket is to close (a subscription's reader is
    /// slow, or the outbound budget is spent: the socket's one budget).
    pub(super) fn take_mail(&mut self, conn: &Conn) -> Result<MuxMail, Close> {
        let mut mail = MuxMail {
            bytes: Vec::new(),
            parts: Vec::new(),
            messages: 0,
            own_bytes: 0,
        };
        let mut i = 0;
        while i < self.subs.len() {
            let sub = &self.subs[i];
            let ended = match sub.session.closing() {
                Some(why @ (CloseWhy::Slow | CloseWhy::OutboundBudget)) => {
                    return Err(super::addressee::closing(why))
                }
                Some(why) => Some(why_ended(why)),
                // A relayed one is resynced by its client, subscribing again with its place.
                None if sub.remote.is_some() && sub.session.take_missed() => Some(mux::end(
                    crate::ws::close::TRY_AGAIN_LATER,
                    "missed messages: resubscribe",
                )),
                None if sub.session.take_missed() => sub.to.resync(conn, &sub.session).map(|_| {
                    mux::end(
                        crate::ws::close::TRY_AGAIN_LATER,
                        "missed messages: resubscribe",
                    )
                }),
                None => None,
            };
            if let Some(json) = ended {
                let sub = self.subs.swap_remove(i);
                leave(conn, &sub);
                let before = mail.bytes.len();
                mux::ended(&mut mail.bytes, sub.ch, &json);
                let own = (mail.bytes.len() - before) as u64;
                mail.own_bytes += own;
                mail.parts.push((None, own));
                continue;
            }
            if sub.session.has_mail() {
                let framing = Framing::Mux {
                    ch: sub.ch,
                    numbered: sub.to.numbered,
                };
                let w = sub.session.take_for_write(framing);
                if let Some(place) = w.place {
                    conn.cells.sessions().set_place(&sub.session, place);
                }
                mail.messages += w.messages;
                mail.parts
                    .push((Some(sub.session.clone()), w.bytes.len() as u64));
                mail.bytes.extend_from_slice(&w.bytes);
            }
            i += 1;
        }
        Ok(mail)
    }

    /// The socket closes: every subscription's object is told its session left, and each
    /// session ends.
    pub(super) fn leave(&mut self, conn: &Conn) {
        for sub in std::mem::take(&mut self.subs) {
            leave(conn, &sub);
        }
        self.pending.clear();
    }
}

/// Carries a subscription whose object another node owns to that owner (`opening`): its
/// session (`attaching`, kept once the owner took it) and the relay.
async fn carry(
    conn: &Conn,
    opening: &relay::Opening<'_>,
    attaching: Attaching<'_>,
) -> Result<(Rc<SessionOut>, relay::Remote), String> {
    let overloaded = || mux::refusal(503, "overloaded");
    let fleet = conn.state().node().fleet.clone().ok_or_else(overloaded)?;
    let up = relay::open(&fleet, opening).await?;
    let session = attaching.keep().ok_or_else(overloaded)?;
    let remote = relay::start(conn.state(), fleet, session.clone(), up);
    match remote {
        Some(remote) => Ok((session, remote)),
        None => {
            conn.cells.sessions().end(&session);
            Err(overloaded())
        }
    }
}

/// Tells a subscription's object its session left, and ends the session.
fn leave(conn: &Conn, sub: &Sub) {
    // A relayed one's owner sees its connection close as the subscription is dropped.
    if sub.remote.is_none() {
        let job = Job::detach(sub.session.session_id());
        conn.cells.submit(&sub.to.app, &sub.to.object, job);
    }
    conn.cells.sessions().end(&sub.session);
    ShardStats::sub(&conn.stats().ws_subscriptions, 1);
}

/// A message to a subscription's object, held against the connection's and the shard's
/// inbound budget until the object ran it (past it, `-`-less: the channel is told
/// `overloaded` and the message dropped, as the one-object route answers an error).
fn send(conn: &Conn, sub: &Sub, text: bool, payload: &[u8], out: &mut Vec<u8>) {
    let s = &sub.session;
    if let Some(remote) = &sub.remote {
        if !remote.send(text, payload) {
            let mut frame = Vec::new();
            crate::ws::encode_error(&mut frame, "overloaded");
            mux::rewrap(out, sub.ch, &frame);
        }
        return;
    }
    let Some(hold) = conn.hold_input(payload.len() as u64) else {
        let mut frame = Vec::new();
        crate::ws::encode_error(&mut frame, "overloaded");
        mux::rewrap(out, sub.ch, &frame);
        return;
    };
    let job = Job::message(s.session_id(), s.client().cloned(), text, payload.to_vec());
    conn.cells
        .submit(&sub.to.app, &sub.to.object, job.held(hold));
}

/// `-<ch>|{"status":404,…}`: the client named a channel it has not subscribed.
fn no_such(out: &mut Vec<u8>, ch: u32) {
    mux::ended(out, ch, &mux::refusal(404, "no such subscription"));
}

/// Why a subscription the node closed ended, as the one-object socket would have closed.
fn why_ended(why: CloseWhy) -> String {
    match super::addressee::closing(why) {
        Close::Frame(code, reason) => mux::end(code.unwrap_or(1005), reason),
        _ => mux::end(1006, ""),
    }
}

/// A refusal's JSON from the response the upgrade would have had: its body's fields with its
/// status.
fn refusal_of(resp: &Response) -> String {
    let mut body = serde_json::from_slice::<serde_json::Value>(&resp.body)
        .ok()
        .filter(serde_json::Value::is_object)
        .unwrap_or_else(|| serde_json::json!({ "error": "refused" }));
    body["status"] = resp.status.into();
    body.to_string()
}
