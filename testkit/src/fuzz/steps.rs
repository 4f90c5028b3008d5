//! What the clients of a `host_imports` script do ([`Step`]): requests pipelined on a few
//! connections to the script's objects, WebSocket sessions attaching, sending and closing;
//! and how a step is read from the fuzzer's bytes and written back ([`super::imports`]).

use super::cursor::Cursor;

/// The objects a script addresses, `/o/fz/<name>`.
pub const OBJECTS: [&str; 3] = ["a", "b", "c"];
/// HTTP connections, and WebSocket sessions, one script may open.
pub const CONNS_MAX: usize = 3;

/// A request method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `GET`.
    Get,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
    /// `DELETE`.
    Delete,
    /// `HEAD` (its answers carry no body).
    Head,
    /// `PATCH`.
    Patch,
}

/// The methods, by their code.
pub const METHODS: [Method; 6] = [
    Method::Get,
    Method::Post,
    Method::Put,
    Method::Delete,
    Method::Head,
    Method::Patch,
];

/// A request's body or a message's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Nothing.
    Empty,
    /// Dictionary entry `k` (a text message's payload must be UTF-8: a non-UTF-8 entry goes
    /// as a binary message).
    Entry(u8),
    /// This many bytes of `x` (a power of two up to 32 KiB).
    Filler(u32),
}

/// What the clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Queues a request on connection `conn` (opened at its first request) to
    /// `/o/fz/<OBJECTS[object]>`, with dictionary entry `query` as its query.
    Request {
        /// The connection (modulo [`CONNS_MAX`]).
        conn: u8,
        /// Its method.
        method: Method,
        /// The object (modulo [`OBJECTS`]' length).
        object: u8,
        /// A dictionary entry, percent-encoded, as the query.
        query: Option<u8>,
        /// Its body.
        body: Body,
    },
    /// Writes what every connection has queued (the rest goes at the end: pipelined).
    Flush,
    /// Opens a WebSocket session on the object, with a query (its `topic()` reads it).
    Attach {
        /// The object.
        object: u8,
        /// A dictionary entry as the query.
        query: Option<u8>,
    },
    /// Sends a message on session `session` (modulo those open).
    Message {
        /// The session.
        session: u8,
        /// A binary message (else text).
        binary: bool,
        /// Its payload.
        body: Body,
    },
    /// Closes session `session`, reading what it was sent to the end.
    Detach {
        /// The session.
        session: u8,
    },
}

fn body(b: u8) -> Body {
    match b {
        0 => Body::Empty,
        240.. => Body::Filler(1 << (b - 240)),
        k => Body::Entry(k - 1),
    }
}

fn body_code(b: Body) -> u8 {
    match b {
        Body::Empty => 0,
        Body::Entry(k) => k.min(238) + 1,
        Body::Filler(n) => 240 + n.max(1).ilog2().min(15) as u8,
    }
}

pub(super) fn decode_step(c: &mut Cursor<'_>, code: u8) -> Option<Step> {
    let query = |b: u8| (b >> 2).checked_sub(1);
    Some(match code {
        9..=11 => {
            let (cm, oq, b) = (c.byte()?, c.byte()?, c.byte()?);
            Step::Request {
                conn: (cm & 3) % CONNS_MAX as u8,
                method: METHODS[usize::from(cm >> 2) % METHODS.len()],
                object: (oq & 3) % OBJECTS.len() as u8,
                query: query(oq),
                body: body(b),
            }
        }
        12 => Step::Flush,
        13 => {
            let oq = c.byte()?;
            Step::Attach {
                object: (oq & 3) % OBJECTS.len() as u8,
                query: query(oq),
            }
        }
        14 => {
            let (s, b) = (c.byte()?, c.byte()?);
            Step::Message {
                session: (s & 0x7f) % CONNS_MAX as u8,
                binary: s & 0x80 != 0,
                body: body(b),
            }
        }
        _ => Step::Detach {
            session: c.byte()? % CONNS_MAX as u8,
        },
    })
}

pub(super) fn encode_step(out: &mut Vec<u8>, step: &Step) {
    let oq = |object: u8, query: Option<u8>| {
        (object % OBJECTS.len() as u8) | query.map_or(0, |q| q.min(62) + 1) << 2
    };
    match *step {
        Step::Request {
            conn,
            method,
            object,
            query,
            body,
        } => {
            let m = METHODS.iter().position(|x| *x == method).unwrap_or(0) as u8;
            out.extend([
                9,
                (conn % CONNS_MAX as u8) | m << 2,
                oq(object, query),
                body_code(body),
            ]);
        }
        Step::Flush => out.push(12),
        Step::Attach { object, query } => out.extend([13, oq(object, query)]),
        Step::Message {
            session,
            binary,
            body,
        } => out.extend([
            14,
            (session % CONNS_MAX as u8) | u8::from(binary) << 7,
            body_code(body),
        ]),
        Step::Detach { session } => out.extend([15, session % CONNS_MAX as u8]),
    }
}
