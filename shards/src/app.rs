//! The app API: what an app compiled into the node defines, and the context it works through.
//!
//! An app is registered by name at start-up and reached at `/o/<app>/<name>`: `name` is one
//! **object** of the app, with its own SQLite database, living on shard
//! `hash(app/name) % shards`. The object takes one [`Input`] at a time from its mailbox: an
//! HTTP request, a message from a session (a WebSocket attached to the object), a session
//! attaching or detaching. [`App::handle`] answers one; [`App::handle_batch`], if the app opts
//! in, takes what is waiting at once in ONE transaction. Host calls go through [`Cx`]: SQL on
//! the object's database, sends to one session, broadcasts to the sessions of a topic. Sends
//! and broadcasts leave only after the transaction commits: a failed request sends nothing.
//!
//! A *stateless* app (like `echo`) has no object and no database: its `handle` runs inline on
//! the connection's shard.
//!
//! ```
//! use combd_shards::app::{App, AppError, Cx, Input, Output};
//! use combd_shards::http::Response;
//!
//! /// A durable counter: `POST /o/counter/<name>` adds one and answers the new value.
//! struct Counter;
//!
//! impl App for Counter {
//!     fn name(&self) -> &'static str { "counter" }
//!     fn schema(&self) -> &'static str {
//!         "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL);
//!          INSERT OR IGNORE INTO counter VALUES (1, 0);"
//!     }
//!     fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
//!         match input {
//!             Input::Http { method: "POST", .. } => {
//!                 let v: i64 = cx.db()?.query_row(
//!                     "UPDATE counter SET value = value + 1 RETURNING value", [], |r| r.get(0))?;
//!                 Ok(Output::Http(Response::json(200, &serde_json::json!({ "value": v }))))
//!             }
//!             Input::Http { .. } => Err(AppError::new(405, "POST to count")),
//!             _ => Ok(Output::None),
//!         }
//!     }
//!     fn handles_batch(&self) -> bool { true }
//! }
//! ```

use std::fmt;
use std::sync::Arc;

use crate::http::Response;

/// A session: one WebSocket attached to an object, on the shard that holds its connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId {
    /// The shard holding the connection.
    pub shard: u32,
    /// Unique on that shard.
    pub id: u64,
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.shard, self.id)
    }
}

/// One thing for an object to handle.
#[derive(Debug, Clone, Copy)]
pub enum Input<'a> {
    /// An HTTP request to the object.
    Http {
        /// The method.
        method: &'a str,
        /// The query string, if any.
        query: Option<&'a str>,
        /// The body.
        body: &'a [u8],
    },
    /// A message from a session.
    Message {
        /// Who sent it.
        session: SessionId,
        /// The message.
        msg: Message<'a>,
    },
    /// A session attached (its WebSocket opened).
    Attach {
        /// The session.
        session: SessionId,
        /// The query string of its upgrade request.
        query: Option<&'a str>,
    },
    /// A session detached (its WebSocket closed).
    Detach {
        /// The session.
        session: SessionId,
    },
}

/// What handling an input produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// The response to an HTTP input.
    Http(Response),
    /// Nothing to answer (messages answer through [`Cx::send`]).
    None,
}

/// A message a session sent or is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// A text message.
    Text(&'a str),
    /// A binary message.
    Binary(&'a [u8]),
}

/// A request the app refuses or fails: a status and a message for `{"error": ...}` (a session
/// gets `{"error": ...}` as a text message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppError {
    /// HTTP status.
    pub status: u16,
    /// What went wrong.
    pub message: String,
}

impl AppError {
    /// An error with a status.
    pub fn new(status: u16, message: impl Into<String>) -> AppError {
        AppError {
            status,
            message: message.into(),
        }
    }
}

impl From<rusqlite::Error> for AppError {
    fn from(e: rusqlite::Error) -> AppError {
        AppError::new(500, format!("storage: {e}"))
    }
}

impl fmt::Display for AppError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

/// An effect of handling, applied after the transaction commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// A message to one session.
    Send {
        /// The session.
        to: SessionId,
        /// Text (true) or binary.
        text: bool,
        /// The payload.
        payload: Vec<u8>,
    },
    /// A message to every session of the object subscribed to `topic`, on every shard.
    Broadcast {
        /// The topic ([`App::topic`] of each session).
        topic: String,
        /// Text (true) or binary.
        text: bool,
        /// The payload.
        payload: Vec<u8>,
    },
}

/// The context of one call: the object's database and the effects it queues.
pub struct Cx<'a> {
    db: Option<&'a rusqlite::Connection>,
    effects: &'a mut Vec<Effect>,
}

impl<'a> Cx<'a> {
    /// A context over a database (None for a stateless app).
    pub fn new(db: Option<&'a rusqlite::Connection>, effects: &'a mut Vec<Effect>) -> Cx<'a> {
        Cx { db, effects }
    }

    /// The object's database, inside the call's transaction.
    pub fn db(&self) -> Result<&rusqlite::Connection, AppError> {
        self.db
            .ok_or_else(|| AppError::new(500, "this app has no database"))
    }

    /// Sends a text message to a session once the call commits.
    pub fn send(&mut self, to: SessionId, text: &str) {
        self.effects.push(Effect::Send {
            to,
            text: true,
            payload: text.as_bytes().to_vec(),
        });
    }

    /// Sends a binary message to a session once the call commits.
    pub fn send_binary(&mut self, to: SessionId, bytes: &[u8]) {
        self.effects.push(Effect::Send {
            to,
            text: false,
            payload: bytes.to_vec(),
        });
    }

    /// Sends a text message to every session of this object subscribed to `topic`.
    pub fn broadcast(&mut self, topic: &str, text: &str) {
        self.effects.push(Effect::Broadcast {
            topic: topic.to_string(),
            text: true,
            payload: text.as_bytes().to_vec(),
        });
    }
}

/// A built-in app.
pub trait App: Send + Sync + 'static {
    /// The app's name, the `<app>` of `/o/<app>/<name>`.
    fn name(&self) -> &'static str;

    /// Whether the app is stateless: no objects, no database; `handle` runs inline on the
    /// connection's shard.
    fn stateless(&self) -> bool {
        false
    }

    /// SQL run when an object's database opens (its schema; `IF NOT EXISTS` throughout).
    fn schema(&self) -> &'static str {
        ""
    }

    /// Most inputs waiting in an object's mailbox; past it an input is refused at once.
    fn mailbox(&self) -> usize {
        combd_kernel::limits::MAILBOX_DEFAULT
    }

    /// Most inputs handled in one batch (when [`App::handles_batch`]).
    fn batch(&self) -> usize {
        combd_kernel::limits::BATCH_DEFAULT
    }

    /// The topic a session attaching with this query subscribes to (for broadcasts), or an
    /// error that refuses the attach. Runs on the session's shard.
    fn topic(&self, _query: Option<&str>) -> Result<String, AppError> {
        Ok(String::new())
    }

    /// A page the node serves for this app: its path (outside `/o/`) and its HTML.
    fn page(&self) -> Option<(&'static str, &'static str)> {
        None
    }

    /// Handles one input.
    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError>;

    /// Whether the node may hand this app several waiting inputs at once, in one
    /// transaction, through [`App::handle_batch`].
    fn handles_batch(&self) -> bool {
        false
    }

    /// Handles several inputs in one transaction. If it fails, nothing of the batch is
    /// applied and the node retries the inputs one by one. The default calls
    /// [`App::handle`] for each.
    fn handle_batch(&self, cx: &mut Cx<'_>, inputs: &[Input<'_>]) -> Result<Vec<Output>, AppError> {
        inputs.iter().map(|i| self.handle(cx, i)).collect()
    }
}

/// The apps of a node, by name.
#[derive(Clone, Default)]
pub struct Apps {
    apps: Vec<Arc<dyn App>>,
}

impl Apps {
    /// No apps.
    pub fn new() -> Apps {
        Apps::default()
    }

    /// Adds an app; a second app of the same name is refused.
    pub fn register(&mut self, app: Arc<dyn App>) -> Result<(), String> {
        if self.get(app.name()).is_some() {
            return Err(format!("app {:?} registered twice", app.name()));
        }
        if !valid_object_name(app.name()) {
            return Err(format!("app name {:?} is not a valid name", app.name()));
        }
        self.apps.push(app);
        Ok(())
    }

    /// The app of this name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn App>> {
        self.apps.iter().find(|a| a.name() == name)
    }

    /// Every app's page: (path, HTML).
    pub fn pages(&self) -> Vec<(&'static str, &'static str)> {
        self.apps.iter().filter_map(|a| a.page()).collect()
    }

    /// The names of every app.
    pub fn names(&self) -> Vec<&'static str> {
        self.apps.iter().map(|a| a.name()).collect()
    }
}

/// Whether `name` is a valid object name: 1 to
/// [`OBJECT_NAME_MAX_BYTES`](combd_kernel::limits::OBJECT_NAME_MAX_BYTES) bytes of
/// `[A-Za-z0-9_.-]`, not starting with a dot. Such a name is always one safe path component.
pub fn valid_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= combd_kernel::limits::OBJECT_NAME_MAX_BYTES
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn object_names() {
        assert!(valid_object_name("board-1"));
        assert!(valid_object_name("a.b_c"));
        assert!(valid_object_name(&"a".repeat(64)));
        assert!(!valid_object_name(&"a".repeat(65)));
        assert!(!valid_object_name(""));
        assert!(!valid_object_name(".."));
        assert!(!valid_object_name(".hidden"));
        assert!(!valid_object_name("a/b"));
        assert!(!valid_object_name("a%2fb"));
        assert!(!valid_object_name("é"));
    }
}
