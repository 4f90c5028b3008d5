//! What reaches a cell: a job (an input and where its answer goes), and the messages that
//! cross between shards. Plain owned data, `Send`, with no behaviour: connections build jobs,
//! cells run them, and the inbox carries them between shards.

use std::sync::Arc;

use combd_kernel::fair::ClientKey;

use crate::app::{AppError, Caller, Input, Message, SessionId};
use crate::auth::Client;
use crate::http::Response;
use crate::inbound::Hold;
use crate::ws::numbered::Resume;
use crate::ws::OutFrame;

/// Work for an object: what to handle, where its answer goes, and the bytes of its input held
/// against its connection's and its shard's inbound budget (released when the job is dropped:
/// after its batch ran, or once it was refused).
pub(crate) struct Job {
    pub input: Owned,
    pub reply: Reply,
    pub hold: Option<Hold>,
    /// Who asks: what the pools it takes from (a live object, its answer's bytes, a
    /// creation) are counted to. The node's own machine for what the node makes itself.
    pub asker: ClientKey,
}

impl Job {
    /// The job with its input's bytes held.
    pub fn held(mut self, hold: Hold) -> Job {
        self.hold = Some(hold);
        self
    }

    /// The job, asked by `asker`.
    pub fn asked_by(mut self, asker: ClientKey) -> Job {
        self.asker = asker;
        self
    }

    /// An HTTP request; the response goes back on `reply`. `forwarded`: another node of the
    /// fleet passed it on (it is never passed on again). `client`: who its token named.
    pub fn http(
        method: String,
        query: Option<String>,
        body: Vec<u8>,
        forwarded: bool,
        client: Option<Arc<Client>>,
        caller: Arc<Caller>,
        reply: async_channel::Sender<Response>,
    ) -> Job {
        Job {
            input: Owned::Http {
                method,
                query,
                body,
                forwarded,
                client,
                caller,
            },
            reply: Reply::Http(reply),
            hold: None,
            asker: ClientKey::Local,
        }
    }

    /// A message from a session (errors go back to the session), whose token named `client`.
    pub fn message(
        session: SessionId,
        client: Option<Arc<Client>>,
        text: bool,
        payload: Vec<u8>,
    ) -> Job {
        Job {
            input: Owned::Message {
                session,
                client,
                text,
                payload,
            },
            reply: Reply::Session(session),
            hold: None,
            asker: ClientKey::Local,
        }
    }

    /// A session attaching; the answer says whether it may. `may_pass`: in a fleet, the
    /// WebSocket may be passed through whole to the object's owner (not when another node
    /// already passed it on).
    pub fn attach(
        session: SessionId,
        query: Option<String>,
        client: Option<Arc<Client>>,
        caller: Arc<Caller>,
        reply: async_channel::Sender<Attached>,
        may_pass: bool,
    ) -> Job {
        Job {
            input: Owned::Attach {
                session,
                query,
                client,
                caller,
                subscribed: None,
            },
            reply: Reply::Attach { reply, may_pass },
            hold: None,
            asker: ClientKey::Local,
        }
    }

    /// A session that missed messages attaching again, in place ([`crate::app::Resync::Attach`]):
    /// its attach sends it what it views. An error goes back to the session.
    pub fn reattach(
        session: SessionId,
        query: Option<String>,
        client: Option<Arc<Client>>,
        caller: Arc<Caller>,
    ) -> Job {
        Job {
            input: Owned::Attach {
                session,
                query,
                client,
                caller,
                subscribed: None,
            },
            reply: Reply::Session(session),
            hold: None,
            asker: ClientKey::Local,
        }
    }

    /// A session detaching. Never refused: it frees what the object keeps for the session.
    pub fn detach(session: SessionId) -> Job {
        Job {
            input: Owned::Detach { session },
            reply: Reply::None,
            hold: None,
            asker: ClientKey::Local,
        }
    }

    /// The operator's delete of the object (the localhost `DELETE /objects/<app>/<name>`): the
    /// answer goes back on `reply` once the object's files are gone.
    pub fn delete(reply: async_channel::Sender<Response>) -> Job {
        Job {
            input: Owned::Delete { idle_since: None },
            reply: Reply::Http(reply),
            hold: None,
            asker: ClientKey::Local,
        }
    }

    /// The expiry of an object its app declares expiring (`App::expiry`): a delete that
    /// happens only if the object was not written since `idle_since` (milliseconds since the
    /// Unix epoch) and has no alarm or message pending.
    pub fn expire(idle_since: u64, reply: async_channel::Sender<Response>) -> Job {
        Job {
            input: Owned::Delete {
                idle_since: Some(idle_since),
            },
            ..Job::delete(reply)
        }
    }

    /// The operator's restore of the object from the backup: as object `from` was (itself, in
    /// place; another, a fork into this one, which must have no database) after the batch `at`
    /// names. The answer goes back on `reply` once it is in place.
    pub fn restore(
        from: crate::object_key::ObjectKey,
        at: crate::backup::restore::At,
        reply: async_channel::Sender<Response>,
    ) -> Job {
        Job {
            input: Owned::Restore { from, at },
            ..Job::delete(reply)
        }
    }

    /// Whether this is the operator's delete or restore, or an expiry (which end a batch before
    /// them: the object's task carries them out, not a call).
    pub fn is_lifecycle(&self) -> bool {
        matches!(self.input, Owned::Delete { .. } | Owned::Restore { .. })
    }

    /// A wake for the object's due alarms; the answer says what remains (`crate::alarms`).
    pub fn alarms(reply: async_channel::Sender<Response>) -> Job {
        Job {
            input: Owned::Alarms,
            reply: Reply::Http(reply),
            hold: None,
            asker: ClientKey::Local,
        }
    }

    /// A message from object `app/name` (its outbox id `id`); the answer (200 once taken and
    /// durable) goes back on `reply`. `passed`: another node passed it on (it is not passed on
    /// again).
    pub fn from_object(
        (app, name, id): (String, String, i64),
        body: Vec<u8>,
        passed: bool,
        reply: async_channel::Sender<Response>,
    ) -> Job {
        Job {
            input: Owned::FromObject {
                app,
                name,
                id,
                body,
                passed,
            },
            reply: Reply::Http(reply),
            hold: None,
            asker: ClientKey::Local,
        }
    }

    /// The receiver `app/name` took message `id` of this object's outbox.
    pub fn delivered(app: String, name: String, id: i64) -> Job {
        Job {
            input: Owned::Delivered { app, name, id },
            reply: Reply::None,
            hold: None,
            asker: ClientKey::Local,
        }
    }

    /// The attach of a session subscribed to `topic`, for its object's presence (`presence`:
    /// the app keeps it); of a numbered one, with `resume`, its place. A session attaching
    /// again in place ([`Job::reattach`]) resumes in place. A plain session of an app without
    /// presence carries nothing of it.
    pub fn on_topic(mut self, topic: &str, resume: Option<Resume>, presence: bool) -> Job {
        let in_place = matches!(self.reply, Reply::Session(_));
        if let Owned::Attach { subscribed, .. } = &mut self.input {
            *subscribed = (resume.is_some() || presence).then(|| {
                Box::new(Subscribed {
                    topic: topic.to_string(),
                    resume: resume.map(|resume| Resuming { resume, in_place }),
                })
            });
        }
        self
    }

    /// Whether this is a detach (which a full mailbox never refuses).
    pub fn is_detach(&self) -> bool {
        matches!(self.input, Owned::Detach { .. })
    }
}

/// What an attach carries of its session's topic, when its object needs it: for a numbered
/// session's log, and for its app's presence. Boxed: a plain viewer's attach (most of them)
/// carries none, and every job, whatever its kind, is as large as its largest input.
pub(crate) struct Subscribed {
    /// The topic.
    pub topic: String,
    /// A numbered session's place ([`crate::ws::numbered`]).
    pub resume: Option<Resuming>,
}

/// A numbered session's attach ([`crate::ws::numbered`]): its place, and whether it resumes
/// in place (it fell behind) rather than as it connects.
pub(crate) struct Resuming {
    pub resume: Resume,
    pub in_place: bool,
}

/// Where a job's answer goes.
pub(crate) enum Reply {
    /// An HTTP request waiting for its response.
    Http(async_channel::Sender<Response>),
    /// A session waiting to know whether it may attach; `may_pass` as in [`Job::attach`].
    Attach {
        reply: async_channel::Sender<Attached>,
        may_pass: bool,
    },
    /// A session's message: only an error is answered, as a message to the session.
    Session(SessionId),
    /// Nobody waits.
    None,
}

/// The answer to a session attaching.
pub(crate) enum Attached {
    /// It is attached.
    Yes,
    /// It is refused with this response (no upgrade happens).
    Refused(Response),
    /// In a fleet: another node owns the object (its fleet address); the WebSocket is passed
    /// through to it whole.
    Owner(String),
}

/// An input as it crosses into the blocking thread.
pub(crate) enum Owned {
    Http {
        method: String,
        query: Option<String>,
        body: Vec<u8>,
        /// Passed on by another node of the fleet.
        forwarded: bool,
        /// Who its token named, if it came with a valid one.
        client: Option<Arc<Client>>,
        /// What else the node saw of it.
        caller: Arc<Caller>,
    },
    Message {
        session: SessionId,
        /// The client its session's token named, if any.
        client: Option<Arc<Client>>,
        text: bool,
        payload: Vec<u8>,
    },
    Attach {
        session: SessionId,
        query: Option<String>,
        client: Option<Arc<Client>>,
        caller: Arc<Caller>,
        /// Its topic and place, if its object needs them ([`Subscribed`]).
        subscribed: Option<Box<Subscribed>>,
    },
    Detach {
        session: SessionId,
    },
    /// A wake for the object's due alarms (`crate::alarms`): the batch fires them; the answer
    /// (a JSON `{"next_ms":…,"count":…}`) says what remains, once durable.
    Alarms,
    /// One due alarm, as the batch hands it to the app.
    Alarm {
        id: i64,
        payload: Vec<u8>,
        late_ms: u64,
    },
    /// A message from another object (`Cx::send_to_object`): its sender and the sender's
    /// outbox id of it (the receiver takes each sender's messages once, in order).
    FromObject {
        app: String,
        name: String,
        id: i64,
        body: Vec<u8>,
        /// Another node passed it on to this one, its owner (never passed on again).
        passed: bool,
    },
    /// The receiver `app/name` took the sender's message `id`: the sender's batch drops it
    /// from its outbox and sends the next one for that receiver, if any.
    Delivered {
        app: String,
        name: String,
        id: i64,
    },
    /// The operator's delete ([`Job::delete`]), or an expiry ([`Job::expire`]: only if not
    /// written since `idle_since`): never run in a batch.
    Delete {
        idle_since: Option<u64>,
    },
    /// The operator's restore ([`Job::restore`]): never run in a batch.
    Restore {
        from: crate::object_key::ObjectKey,
        at: crate::backup::restore::At,
    },
}

impl Owned {
    /// A numbered session's attach: the session, its place and its topic.
    pub fn resume(&self) -> Option<(SessionId, &Resuming, &str)> {
        match self {
            Owned::Attach {
                session,
                subscribed: Some(s),
                ..
            } => s.resume.as_ref().map(|r| (*session, r, s.topic.as_str())),
            _ => None,
        }
    }

    /// Whether the node makes this input (an alarm wake, another object's message, a delivery's
    /// acknowledgement), not a client: it is run apart from the app's batch.
    pub fn is_node_input(&self) -> bool {
        matches!(
            self,
            Owned::Alarms | Owned::FromObject { .. } | Owned::Delivered { .. }
        )
    }

    /// The input as the app sees it.
    pub fn input(&self) -> Result<Input<'_>, AppError> {
        Ok(match self {
            Owned::Http {
                method,
                query,
                body,
                client,
                caller,
                ..
            } => Input::Http {
                method,
                query: query.as_deref(),
                body,
                client: client.as_deref(),
                caller,
            },
            Owned::Message {
                session,
                client,
                text,
                payload,
            } => Input::Message {
                session: *session,
                client: client.as_deref(),
                msg: if *text {
                    Message::Text(
                        std::str::from_utf8(payload)
                            .map_err(|_| AppError::new(400, "invalid utf-8"))?,
                    )
                } else {
                    Message::Binary(payload)
                },
            },
            Owned::Attach {
                session,
                query,
                client,
                caller,
                ..
            } => Input::Attach {
                session: *session,
                query: query.as_deref(),
                client: client.as_deref(),
                caller,
                resumed: false,
            },
            Owned::Detach { session } => Input::Detach { session: *session },
            Owned::Alarm {
                id,
                payload,
                late_ms,
            } => Input::Alarm {
                id: *id,
                payload,
                late_ms: *late_ms,
            },
            Owned::FromObject {
                app, name, body, ..
            } => Input::FromObject { app, name, body },
            // Never handed to an app: the batch turns them into its due alarms and messages.
            Owned::Alarms
            | Owned::Delivered { .. }
            | Owned::Delete { .. }
            | Owned::Restore { .. } => return Err(AppError::new(500, "not an app's input")),
        })
    }

    /// The bytes the input brings (counted against the app's `memory_kb`).
    pub fn bytes(&self) -> u64 {
        match self {
            Owned::Http { body, caller, .. } => body.len() as u64 + caller.bytes(),
            Owned::Message { payload, .. } => payload.len() as u64,
            Owned::Attach { caller, .. } => caller.bytes(),
            Owned::Alarm { payload, .. } => payload.len() as u64,
            Owned::FromObject { body, .. } => body.len() as u64,
            Owned::Detach { .. }
            | Owned::Alarms
            | Owned::Delivered { .. }
            | Owned::Delete { .. }
            | Owned::Restore { .. } => 0,
        }
    }
}

/// What crosses between shards, through the receiving shard's bounded inbox.
pub(crate) enum ShardMsg {
    /// A job for an object living on the receiving shard.
    Job { app: String, name: String, job: Job },
    /// A framed message for a session on the receiving shard.
    Deliver {
        /// The object whose app sent it (a session attached to another is not delivered
        /// to); `None` for the node's own message.
        from: Option<String>,
        session: u64,
        frame: Arc<OutFrame>,
    },
    /// Object `key` was deleted or restored: its sessions on the receiving shard close.
    CloseObject { key: String, why: ObjectGone },
    /// A framed message for every session of `key` subscribed to `topic` on the receiving shard.
    Broadcast {
        key: String,
        topic: String,
        frame: Arc<OutFrame>,
    },
}

/// Why an object's sessions close on every shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ObjectGone {
    /// It was deleted (4404).
    Deleted,
    /// It was replaced by a restore (1012).
    Restored,
}
