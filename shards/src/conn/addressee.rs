//! What a WebSocket session is to the node beside its outbound side: the object its messages
//! go to ([`Addressee`], one for the one-object route, one for each subscription of a
//! multiplexed socket), how it resyncs after missing frames, and how the node ends a
//! WebSocket ([`Close`]).

use std::sync::Arc;

use crate::app::{App, Resync};
use crate::cells::session::{CloseWhy, SessionOut};
use crate::job::Job;
use crate::stats::ShardStats;
use crate::ws::numbered::Resume;
use crate::ws::{self, close};

use super::access::WsEnd;
use super::Conn;

/// The close of a session the node decided to close.
pub(super) fn closing(why: CloseWhy) -> Close {
    match why {
        CloseWhy::Slow => Close::Frame(Some(close::POLICY), "slow"),
        CloseWhy::OutboundBudget => Close::Frame(Some(close::TRY_AGAIN_LATER), "outbound budget"),
        CloseWhy::AppRemoved => Close::Frame(Some(close::GOING_AWAY), "app removed"),
        CloseWhy::ResumeLater => Close::Frame(Some(close::TRY_AGAIN_LATER), "resume later"),
        CloseWhy::LeaseLost => Close::Frame(Some(close::TRY_AGAIN_LATER), "lease lost"),
        CloseWhy::ObjectDeleted => Close::Frame(Some(close::OBJECT_DELETED), "object deleted"),
        CloseWhy::ObjectRestored => Close::Frame(Some(close::RESTARTED), "object restored"),
    }
}

/// How the node ends a WebSocket.
#[derive(Debug, Clone, Copy)]
pub(super) enum Close {
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
    pub(super) fn end(self) -> WsEnd {
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
pub(super) struct Addressee {
    pub app: Arc<dyn App>,
    pub object: String,
    /// permessage-deflate as negotiated.
    pub deflate: Option<ws::deflate::Negotiated>,
    /// Its messages are numbered ([`ws::numbered`]): the session resumes from its log.
    pub numbered: bool,
}

impl Addressee {
    /// The session missed messages: it closes, or attaches again, as its app says. A numbered
    /// one attaches again resuming from its place (what its connection took to write): what
    /// it missed is in its log, and comes before anything newer.
    pub(super) fn resync(&self, conn: &Conn, session: &SessionOut) -> Option<Close> {
        let to = self;
        let try_again = Close::Frame(Some(close::TRY_AGAIN_LATER), "missed messages: reconnect");
        if to.numbered {
            // Missed again before its last resume reached it (the resume did not fit either):
            // closed, and its client reconnects with its place, so a client that does not read
            // cannot make its object read the log again and again.
            if !session.start_resume() {
                return Some(try_again);
            }
            let resume = match conn.cells.sessions().place(session) {
                Some((epoch, seq)) => Resume::After { epoch, seq },
                None => Resume::New,
            };
            ShardStats::add(&conn.state().stats().session_resumes, 1);
            self.reattach(conn, session, Some(resume));
            return None;
        }
        match to.app.resync() {
            Resync::Close => Some(try_again),
            Resync::Attach => {
                self.reattach(conn, session, None);
                None
            }
        }
    }

    /// Attaches the session again, in place, as it first attached; a numbered one from
    /// `resume`.
    pub(super) fn reattach(&self, conn: &Conn, session: &SessionOut, resume: Option<Resume>) {
        let to = self;
        let job = Job::reattach(
            session.session_id(),
            session.query().map(str::to_string),
            session.client().cloned(),
            session.caller().clone(),
        )
        .on_topic(session.topic_name(), resume, to.app.presence());
        conn.cells.submit(&to.app, &to.object, job);
    }
}
