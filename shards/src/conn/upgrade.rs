//! A WebSocket upgrade that passed its checks (`routes.rs`): what the HTTP loop
//! ([`super::http_conn::HttpConn::upgrade`]) needs to answer it (a stateful app's session
//! attaches to its object first, [`Attaching`], which may refuse it or say another node owns
//! it, then the whole WebSocket passes through with its [`Replay`]; then the 101, with the
//! subprotocol and the compression negotiated), and what the WebSocket loop keeps of it.

use std::sync::Arc;

use std::rc::Rc;

use crate::app::{App, Caller};
use crate::auth::Client;
use crate::cells::session::{SessionOut, Sessions};
use crate::http::Request;
use crate::object_key::ObjectKey;
use crate::ws;

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
    /// Where a numbered session starts, if its client asked for one ([`ws::numbered`]).
    pub resume: Option<ws::numbered::Resume>,
    /// A stateful app's session, once its object took it ([`Attaching::keep`]).
    pub session: Option<Rc<SessionOut>>,
}

/// A multiplexed WebSocket upgrade that passed its checks (`routes.rs`).
pub(super) struct MuxUpgrade {
    pub accept: String,
    /// The subprotocol the 101 answers, if any (`combd`, beside an offered token).
    pub protocol: Option<&'static str>,
    /// The client its token named, if any: a subscription to an app it is for acts as it.
    pub client: Option<Arc<Client>>,
    /// Its address and `Origin` (no path under an object, no app's header fields).
    pub caller: Arc<Caller>,
}

/// The parts of an upgrade the WebSocket loop keeps.
pub(super) struct ForLoop {
    pub app: Arc<dyn App>,
    pub object: String,
    pub deflate: Option<ws::deflate::Negotiated>,
    /// Its messages are numbered ([`ws::numbered`]).
    pub numbered: bool,
    pub session: Option<Rc<SessionOut>>,
}

impl Upgrade {
    /// What the WebSocket loop keeps of an upgrade: its app, its object and the compression
    /// negotiated. The rest, and the box, are freed here (taken apart in place, a box is
    /// freed only when its binding goes, at the end of the loop).
    #[allow(clippy::boxed_local)] // taking the box is the point: it is freed here
    pub(super) fn into_loop(self: Box<Self>) -> ForLoop {
        let Upgrade {
            app,
            object,
            deflate,
            resume,
            session,
            ..
        } = *self;
        ForLoop {
            app,
            object,
            deflate,
            numbered: resume.is_some(),
            session,
        }
    }

    /// The object's key (`app/name`) its session attaches to.
    pub(super) fn object_key(&self) -> ObjectKey {
        ObjectKey::new(self.app.name(), &self.object)
    }

    /// Appends the 101 that answers the upgrade to `out` (`date`: the shard's date header).
    pub(super) fn write_101(&self, out: &mut Vec<u8>, date: &[u8]) {
        write_101(out, date, (&self.accept, self.protocol, self.deflate));
    }
}

/// What the HTTP loop hands the WebSocket loop once it wrote the 101.
pub(super) enum Upgraded {
    /// A WebSocket of one object (`/o/<app>/<name>`).
    One(Box<Upgrade>),
    /// The multiplexed WebSocket (`/ws`), with its hub.
    Many(Box<MuxUpgrade>, Rc<SessionOut>),
}

/// Appends a 101 to `out` (`date`: the shard's date header) with its accept key, and the
/// subprotocol and compression negotiated, if any.
pub(super) fn write_101(
    out: &mut Vec<u8>,
    date: &[u8],
    (accept, protocol, deflate): (&str, Option<&str>, Option<ws::deflate::Negotiated>),
) {
    out.extend_from_slice(b"HTTP/1.1 101 Switching Protocols\r\ndate: ");
    out.extend_from_slice(date);
    out.extend_from_slice(
        format!(
            "\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-accept: {accept}\r\n"
        )
        .as_bytes(),
    );
    if let Some(protocol) = protocol {
        out.extend_from_slice(b"sec-websocket-protocol: ");
        out.extend_from_slice(protocol.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(negotiated) = deflate {
        out.extend_from_slice(b"sec-websocket-extensions: ");
        out.extend_from_slice(negotiated.response().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A session opened for an upgrade while its object is asked to take it: ended here unless
/// the upgrade keeps it (refused, passed on to another node, or its task dropped while it
/// waits), so a session the WebSocket loop never owned stays in no table.
pub(super) struct Attaching<'a> {
    sessions: &'a Sessions,
    session: Option<Rc<SessionOut>>,
}

impl<'a> Attaching<'a> {
    pub(super) fn new(sessions: &'a Sessions, session: Rc<SessionOut>) -> Attaching<'a> {
        Attaching {
            sessions,
            session: Some(session),
        }
    }

    /// The object took the session: the WebSocket loop owns it from here.
    pub(super) fn keep(mut self) -> Option<Rc<SessionOut>> {
        self.session.take()
    }
}

impl Drop for Attaching<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.session.take() {
            self.sessions.end(&s);
        }
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
        let signature = fleet
            .trust
            .sign(owner, "GET", &self.target, &self.covered, b"");
        self.head
            .extend_from_slice(combd_fleet::auth::AUTH_HEADER.as_bytes());
        self.head.extend_from_slice(b": ");
        self.head.extend_from_slice(signature.as_bytes());
        self.head.extend_from_slice(b"\r\n\r\n");
        self.head
    }
}
