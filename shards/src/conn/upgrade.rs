//! Answering a WebSocket upgrade that passed its checks (`routes.rs`): a stateful app's
//! session attaches to its object first, which may refuse it or say another node owns it
//! (then the whole WebSocket passes through); then the 101, with the subprotocol and the
//! compression negotiated.

use std::sync::Arc;

use crate::app::App;
use crate::cells::session::Attach;
use crate::http::Request;
use crate::job::{Attached, Job};
use crate::ws;

use super::{Asked, Conn};

/// A WebSocket upgrade that passed its checks.
pub(super) struct Upgrade {
    pub app: Arc<dyn App>,
    pub object: String,
    pub accept: String,
    /// permessage-deflate as negotiated: offered, acceptably, and `COMBD_WS_DEFLATE` is on.
    pub deflate: Option<ws::deflate::Negotiated>,
    /// The subprotocol the 101 answers, if any.
    pub protocol: Option<&'static str>,
    pub query: Option<String>,
    /// In a fleet: the request as it is sent on to the object's owner, if the object turns
    /// out to be another node's (none when another node passed it on here).
    pub replay: Option<Replay>,
    /// The client its token named, if any; the session keeps it.
    pub client: Option<Arc<crate::auth::Client>>,
    /// What else the node saw of the upgrade; the session keeps it.
    pub caller: Arc<crate::app::Caller>,
}

impl Upgrade {
    /// What the WebSocket loop keeps of an upgrade: its app, its object and the compression
    /// negotiated. The rest, and the box, are freed here (taken apart in place, a box is
    /// freed only when its binding goes, at the end of the loop).
    #[allow(clippy::boxed_local)] // taking the box is the point: it is freed here
    pub(super) fn into_loop(
        self: Box<Self>,
    ) -> (Arc<dyn App>, String, Option<ws::deflate::Negotiated>) {
        let Upgrade {
            app,
            object,
            deflate,
            ..
        } = *self;
        (app, object, deflate)
    }
}

impl Conn {
    /// Answers an upgrade: `Some` once the 101 is written and the WebSocket loop may start.
    /// A stateful app's session attaches to its object first; the object may refuse it (503
    /// `overloaded`, 507 `disk_low`, or the app's own error), and then no upgrade happens.
    pub(super) async fn upgrade(&mut self, up: Upgrade, mut out: Vec<u8>) -> Option<Upgrade> {
        if !up.app.stateless() {
            let topic = match up.app.topic(up.query.as_deref()) {
                Ok(t) => t,
                Err(e) => {
                    self.fail(&mut out, e.status, &e.message, Asked::Upgrade)
                        .await;
                    return None;
                }
            };
            let key = format!("{}/{}", up.app.name(), up.object);
            let (slot, asker) = (
                self.waker.index(),
                self.asker(&up.caller, up.client.as_deref()),
            );
            let who = Attach {
                query: up.query.clone(),
                client: up.client.clone(),
                caller: up.caller.clone(),
            };
            let opened = self.cells.sessions().open((slot, asker), key, topic, who);
            let session = opened.session_id();
            self.session = Some(opened);
            let (tx, rx) = async_channel::bounded(1);
            let job = Job::attach(
                session,
                up.query.clone(),
                up.client.clone(),
                up.caller.clone(),
                tx,
                up.replay.is_some(),
            )
            .asked_by(asker);
            self.cells.submit(&up.app, &up.object, job);
            match rx.recv().await {
                Ok(Attached::Yes) => {}
                Ok(Attached::Refused(resp)) => {
                    self.end_session();
                    self.respond(&mut out, &resp, false, false, Asked::Upgrade);
                    self.flush_and_close(&mut out).await;
                    return None;
                }
                Ok(Attached::Owner(owner)) => {
                    // Another node owns the object: the whole WebSocket goes through to it.
                    self.end_session();
                    if let Some(replay) = up.replay {
                        Box::pin(self.pass_through(&owner, replay, &up.object)).await;
                    }
                    return None;
                }
                Err(_) => return None,
            }
        }
        self.count_status(101);
        self.write_101(&up, &mut out);
        if self.flush(&mut out).await.is_err() {
            return None;
        }
        self.log_ws_open();
        Some(up)
    }

    /// Appends the 101 that answers `up` to `out`.
    fn write_101(&self, up: &Upgrade, out: &mut Vec<u8>) {
        out.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\ndate: ");
        out.extend_from_slice(&self.state().date());
        out.extend_from_slice(
            format!(
                "\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {}\r\n",
                up.accept
            )
            .as_bytes(),
        );
        if let Some(protocol) = &up.protocol {
            out.extend_from_slice(b"sec-websocket-protocol: ");
            out.extend_from_slice(protocol.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let Some(negotiated) = &up.deflate {
            out.extend_from_slice(b"sec-websocket-extensions: ");
            out.extend_from_slice(negotiated.response().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }
}

/// An upgrade request as it is sent on to the object's owner, but for its signature: its
/// request line and every header field as the client sent them but the fleet's own (a client
/// cannot speak for the fleet), and the fleet's forwarded header (so the owner never passes it
/// on again). The signature and the blank line that ends the head are added once the owner
/// is known ([`Replay::signed`]).
pub(super) struct Replay {
    head: Vec<u8>,
    /// The request target, as the signature covers it.
    target: String,
    /// The client's address and the head's fields, as the signature covers them
    /// (`combd_fleet::forward::covered`).
    covered: String,
}

impl Replay {
    /// The replay of the upgrade request `req` from `client`.
    pub(super) fn of(req: &Request<'_>, client: Option<std::net::IpAddr>) -> Replay {
        let mut out = Vec::with_capacity(256);
        let target = req.target();
        out.extend_from_slice(req.method.as_bytes());
        out.push(b' ');
        out.extend_from_slice(target.as_bytes());
        out.extend_from_slice(b" HTTP/1.1\r\n");
        for h in req.headers {
            if h.name
                .eq_ignore_ascii_case(combd_fleet::forward::FORWARDED_HEADER)
                || h.name.eq_ignore_ascii_case(combd_fleet::auth::AUTH_HEADER)
                || h.name
                    .eq_ignore_ascii_case(combd_fleet::forward::CLIENT_HEADER)
            {
                continue;
            }
            out.extend_from_slice(h.name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(h.value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(combd_fleet::forward::FORWARDED_HEADER.as_bytes());
        out.extend_from_slice(b": 1\r\n");
        let client = client.map_or(String::new(), |a| a.to_string());
        if !client.is_empty() {
            out.extend_from_slice(combd_fleet::forward::CLIENT_HEADER.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(client.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        let fields = req.headers.iter().map(|h| (h.name, h.value));
        Replay {
            head: out,
            target,
            covered: combd_fleet::forward::covered(&client, fields),
        }
    }

    /// The head to send to `owner`, signed for it.
    pub(super) fn signed(mut self, fleet: &crate::fleet::Fleet, owner: &str) -> Vec<u8> {
        let signature = fleet.sign(owner, "GET", &self.target, &self.covered, b"");
        self.head
            .extend_from_slice(combd_fleet::auth::AUTH_HEADER.as_bytes());
        self.head.extend_from_slice(b": ");
        self.head.extend_from_slice(signature.as_bytes());
        self.head.extend_from_slice(b"\r\n\r\n");
        self.head
    }
}
