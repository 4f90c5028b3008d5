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
//!             Input::Http { .. } => Err(AppError::method_not_allowed("POST", "POST to count")),
//!             _ => Ok(Output::None),
//!         }
//!     }
//!     fn handles_batch(&self) -> bool { true }
//! }
//! ```

use std::fmt;
use std::sync::Arc;

use crate::http::Response;

mod caller;
mod cx;
pub(crate) mod registry;
pub use crate::auth::Client;
pub use crate::home::home_shard;
use crate::limit::Limit;
pub use crate::stats::Deployment;
pub use crate::users::{UserPlace, UserSeen};
pub use caller::{
    app_response_header, check_app_response, valid_content_type, valid_header_value,
    withheld_header, Caller, Cors, APP_HEADERS_WITHHELD, APP_RESPONSE_HEADERS, CORS_HEADERS,
    CORS_METHODS,
};
pub(crate) use cx::PresenceSource;
pub use cx::{limit_error, CallBudget, Cx};

/// How much of a topic's log an app's objects keep ([`App::log_retention`]): its newest
/// `frames`, `bytes` of payload and `age`, whichever keeps least, and always its newest frame.
/// Each is taken at most at the node's ([`LogRetention::NODE`]) and at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogRetention {
    /// Frames kept.
    pub frames: u64,
    /// Bytes of payload kept.
    pub bytes: u64,
    /// How long a frame is kept.
    pub age: std::time::Duration,
}

impl LogRetention {
    /// The node's: `topic_log_frames`, `topic_log_bytes`, `topic_log_age_ms`.
    pub const NODE: LogRetention = LogRetention {
        frames: combd_kernel::limits::TOPIC_LOG_FRAMES,
        bytes: combd_kernel::limits::TOPIC_LOG_BYTES,
        age: combd_kernel::limits::TOPIC_LOG_AGE,
    };
}
pub use registry::{Apps, Changes, RegisterError};

/// A session: one WebSocket attached to an object, on the shard that holds its connection.
///
/// Unique across the node's restarts and across the nodes of a fleet: `life` is drawn at random
/// when the node starts ([`SessionId::this_life`]), so a session id an object kept in its
/// database (a presence row) from before a crash, a restart or another owner never names a new
/// session. A send to a session of another life is dropped (`sends_to_other_lives`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId {
    /// The life of the node that made it: 63 random bits, drawn once per process.
    pub life: u64,
    /// The shard holding the connection.
    pub shard: u32,
    /// Unique on that shard within the life.
    pub id: u64,
}

impl SessionId {
    /// A session of this life of the node.
    pub fn new(shard: u32, id: u64) -> SessionId {
        SessionId {
            life: SessionId::this_life(),
            shard,
            id,
        }
    }

    /// This life of the node: 63 random bits (from the system's random source; a positive
    /// `i64`, as a module reads it), drawn when first asked.
    pub fn this_life() -> u64 {
        static LIFE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        *LIFE.get_or_init(|| {
            use ring::rand::SecureRandom;
            let mut b = [0u8; 8];
            // getrandom(2) does not fail on Linux once the pool is initialised; the clock
            // stands in if it ever did.
            if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
                b = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
                    .to_le_bytes();
            }
            (u64::from_le_bytes(b) >> 1).max(1)
        })
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}.{}.{}", self.life, self.shard, self.id)
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
        /// The client its token named (`COMBD_AUTH_JWT_KEY_FILE`), if it came with a valid one;
        /// always there for an app that is [`App::identified`].
        client: Option<&'a Client>,
        /// Its address, `Origin`, the rest of its path, the header fields the app declared.
        caller: &'a Caller,
    },
    /// A message from a session.
    Message {
        /// Who sent it.
        session: SessionId,
        /// The client its session's token named, as its attach had it ([`Input::Attach`]);
        /// `None` for a stateless app's message.
        client: Option<&'a Client>,
        /// The message.
        msg: Message<'a>,
    },
    /// A session attached (its WebSocket opened).
    Attach {
        /// The session.
        session: SessionId,
        /// The query string of its upgrade request.
        query: Option<&'a str>,
        /// The client its token named, as for [`Input::Http`]; the session keeps it for its
        /// whole life (a resync attaches with it again).
        client: Option<&'a Client>,
        /// What the node saw of its upgrade request, as for [`Input::Http`]; kept as long.
        caller: &'a Caller,
        /// A numbered session resuming (README "Resuming a WebSocket"): the node sends it,
        /// before anything this call sends, every broadcast of its topic after its place, so
        /// it has the state its broadcasts make. An app whose attach sends a snapshot (its
        /// state) need not send it again. False for a new session, and for one whose place was
        /// gone (it is told `snapshot`: it needs the state).
        resumed: bool,
    },
    /// A session detached (its WebSocket closed).
    Detach {
        /// The session.
        session: SessionId,
    },
    /// An alarm the object set ([`Cx::set_alarm`]) is due. It is consumed in the transaction
    /// of this call: if the call commits it never fires again; if it fails (rolled back) it
    /// fires again after a backoff.
    Alarm {
        /// Its id, as `set_alarm` answered.
        id: i64,
        /// The payload it was set with.
        payload: &'a [u8],
        /// How late it fires: now less the time it was set for, in milliseconds.
        late_ms: u64,
    },
    /// A message another object sent this one ([`Cx::send_to_object`]), applied exactly once:
    /// the node records it as taken in this call's transaction.
    FromObject {
        /// The sender's app.
        app: &'a str,
        /// The sender's name.
        name: &'a str,
        /// What it sent.
        body: &'a [u8],
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
    /// The limit this error reports, when a limit made it.
    limit: Option<Limit>,
    /// For a 405: the methods the resource takes (the `allow` header).
    allow: Option<&'static str>,
    /// A refusal the client may try again after a second (the `retry-after` header).
    retry_after: bool,
    /// What the node's log says of it besides its message, never sent to the client (a
    /// module's trap, the last SQL error of its call).
    detail: Option<String>,
}

impl AppError {
    /// An error with a status.
    pub fn new(status: u16, message: impl Into<String>) -> AppError {
        AppError {
            status,
            message: message.into(),
            limit: None,
            allow: None,
            retry_after: false,
            detail: None,
        }
    }

    /// The same error, telling the client to try again after a second (`retry-after: 1`): the
    /// node's refusals of load, not an app's errors.
    pub(crate) fn retry_after(self) -> AppError {
        AppError {
            retry_after: true,
            ..self
        }
    }

    /// `405 Method Not Allowed`, with the methods the resource takes (e.g. `"GET, HEAD"`),
    /// sent as the `allow` header the status calls for (RFC 9110, 15.5.6).
    pub fn method_not_allowed(allow: &'static str, message: impl Into<String>) -> AppError {
        AppError {
            allow: Some(allow),
            ..AppError::new(405, message)
        }
    }

    /// The HTTP response for this error: `{"error": message}` with its status (and `allow`
    /// for a 405, `retry-after` for a refusal of load).
    pub fn response(&self) -> Response {
        let mut resp = Response::error(self.status, &self.message);
        if let Some(allow) = self.allow {
            resp = resp.with_header("allow", allow);
        }
        if self.retry_after {
            resp = resp.with_header("retry-after", "1");
        }
        resp
    }

    /// The limit this error reports, if a limit made it (SQLite refuses a value past
    /// `SQL_VALUE_MAX_BYTES` or a write past `COMBD_DB_MAX` with such an error).
    pub fn limit(&self) -> Option<Limit> {
        self.limit
    }

    /// The same error with `detail` for the node's log (its first
    /// [`APP_ERROR_DETAIL_MAX_BYTES`](combd_kernel::limits::APP_ERROR_DETAIL_MAX_BYTES)); the
    /// client still sees only the message.
    pub fn with_detail(self, detail: impl Into<String>) -> AppError {
        let mut detail = detail.into();
        let mut cut = detail
            .len()
            .min(combd_kernel::limits::APP_ERROR_DETAIL_MAX_BYTES);
        while !detail.is_char_boundary(cut) {
            cut -= 1;
        }
        detail.truncate(cut);
        AppError {
            detail: Some(detail),
            ..self
        }
    }

    /// What the node's log says of it besides its message, if anything.
    pub fn detail(&self) -> Option<&str> {
        self.detail.as_deref()
    }

    /// Whether the call failed (a 5xx, or a limit's answer), as opposed to a refusal its app
    /// chose (a 4xx): what the node warns about.
    pub fn is_failure(&self) -> bool {
        self.status >= 500 || self.limit.is_some()
    }
}

impl From<rusqlite::Error> for AppError {
    fn from(e: rusqlite::Error) -> AppError {
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::TooBig) => limit_error(Limit::TooBig),
            Some(rusqlite::ErrorCode::DiskFull) => limit_error(Limit::DbFull),
            // An interrupted statement: the node's watch says which limit (see cells).
            Some(rusqlite::ErrorCode::OperationInterrupted) => limit_error(Limit::SqlTimeout),
            _ => AppError::new(500, format!("storage: {e}")),
        }
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
    /// A message to another object (from its outbox, once the commit that queued it is
    /// durable): the node's, not an app's to make.
    ToObject {
        /// The receiver's app and name.
        app: String,
        /// The receiver's name.
        name: String,
        /// The sender's outbox id of it.
        id: i64,
        /// What it says.
        body: Vec<u8>,
    },
    /// A message to every session of the object subscribed to `topic`, on every shard.
    Broadcast {
        /// The topic ([`App::topic`] of each session).
        topic: String,
        /// Text (true) or binary.
        text: bool,
        /// The payload.
        payload: Vec<u8>,
        /// Its sequence number in its topic's log, given in the transaction that commits it
        /// (`cells::topic_log`); 0 until then, and on a run that keeps no log.
        seq: u64,
        /// Its topic's log's epoch, with `seq`.
        epoch: u64,
    },
    /// What the node sends a numbered session as it attaches (`crate::ws::numbered`): the
    /// log's position and the frames after the session's place, encoded: the node's, not an
    /// app's to make.
    Resume {
        /// The session.
        to: SessionId,
        /// WebSocket frames, one after the other.
        frames: Vec<u8>,
        /// The log's epoch and last frame they bring the session to.
        place: (u64, u64),
    },
    /// A numbered session resuming in place that its object could not resume now: closed with
    /// 1013, so its client reconnects with its place: the node's, not an app's to make.
    TryAgain {
        /// The session.
        to: SessionId,
    },
    /// A change of a topic's presence (`to`: `None`), or its members for one session that
    /// attached (`to`: the session), as JSON (`cells::presence`): the node's, not an app's to
    /// make; numbered sessions only get it.
    Presence {
        /// The topic.
        topic: String,
        /// The session told the members, or `None`: the topic's change, to all its sessions.
        to: Option<SessionId>,
        /// The JSON.
        payload: Vec<u8>,
    },
    /// The object deletes itself ([`Cx::delete`]) once the batch of the call that asked is
    /// durable and answered: the node's to carry out, after the batch's other effects.
    Delete,
}

/// A member of a topic's presence, as an app reads it ([`Cx::presence`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// A verified identity's subject, else the session's id.
    pub who: String,
    /// Whether `who` is a verified identity.
    pub verified: bool,
    /// Its token's `name` claim, if it has one.
    pub name: Option<String>,
    /// Its sessions attached to the topic.
    pub devices: u32,
    /// When it joined, in milliseconds since the Unix epoch.
    pub since_ms: u64,
}

/// How a session that missed messages is brought back in sync ([`App::resync`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resync {
    /// Close the session with 1013 ("try again later"): its client reconnects and gets fresh
    /// state from its attach.
    Close,
    /// Attach the session again, in place: for an app whose attach sends the session
    /// everything it views (a snapshot), which then replaces what the session missed.
    Attach,
}

/// An app: built into the node, or deployed as a module.
pub trait App: Send + Sync + 'static {
    /// The app's name, the `<app>` of `/o/<app>/<name>`.
    fn name(&self) -> &'static str;

    /// Whether the app is stateless: no objects, no database; `handle` runs inline on the
    /// connection's shard.
    fn stateless(&self) -> bool {
        false
    }

    /// Whether the app serves only identified clients: a request or WebSocket upgrade without a
    /// valid token (`COMBD_AUTH_JWT_KEY_FILE`) is answered `401 unauthorized` before it reaches
    /// the app or an object. `false` (public): anyone, the client named if its token is valid.
    fn identified(&self) -> bool {
        false
    }

    /// The WebSocket subprotocols the app speaks (`Sec-WebSocket-Protocol`), each a token: an
    /// upgrade that offers some is answered with the first it offers that the app speaks (else
    /// `combd` when offered, for a token offered as `combd.bearer.<jwt>`; else none).
    fn subprotocols(&self) -> &'static [&'static str] {
        &[]
    }

    /// Whether the app sees request header field `name` (lower case) in [`Caller::headers`]:
    /// the app declares the few it needs (at most [`APP_HEADERS_MAX`](combd_kernel::limits::APP_HEADERS_MAX)
    /// are kept), and nothing else of a request's head reaches it. A cross-origin page may send
    /// the ones declared ([`App::cors`]). The client's credentials
    /// ([`APP_HEADERS_WITHHELD`]: `authorization`, `cookie`, …) never do, declared or not.
    fn wants_header(&self, _name: &str) -> bool {
        false
    }

    /// The app's CORS policy: whether a page of `origin` (normalised: lower case, no default
    /// port) may call its HTTP API, and how. `None` (the default): only the node's Origin
    /// policy (`COMBD_ALLOWED_ORIGINS`). The node answers preflights by it (204 with the
    /// `access-control-*` fields, or 403 `origin not allowed`), lets that origin's
    /// state-changing requests through, and adds `access-control-allow-origin` (and `vary:
    /// origin`) to its answers. WebSockets are not CORS's: `COMBD_ALLOWED_ORIGINS` decides them.
    fn cors(&self, _origin: &str) -> Option<Cors> {
        None
    }

    /// SQL run when an object's database opens (its schema; `IF NOT EXISTS` throughout): what
    /// version 1 of its objects is. Later versions come from it by [`App::migrate`].
    fn schema(&self) -> &'static str {
        ""
    }

    /// How long an object of the app may go unwritten before the node deletes it (README
    /// "Deleting an object"); `None` (the default) keeps objects until they are deleted. An
    /// object with alarms or messages pending is kept whatever its age.
    fn expiry(&self) -> Option<std::time::Duration> {
        None
    }

    /// The version the app's objects are brought to as they open (`cells::migrate`, README
    /// "Migrations"): 1 (its schema alone) plus its [`App::migrations`] by default.
    fn schema_version(&self) -> u32 {
        1 + self.migrations().len() as u32
    }

    /// The SQL of a native app's migration steps: step `k` (from 0) takes an object from
    /// version `k + 1` to `k + 2`.
    fn migrations(&self) -> &'static [&'static str] {
        &[]
    }

    /// Takes an object from version `from` to `from + 1`: one step of its migration, inside the
    /// transaction that runs every step it needs and records its new version (an error rolls
    /// it all back). By default, runs step `from - 1` of [`App::migrations`].
    fn migrate(&self, cx: &mut Cx<'_>, from: u32) -> Result<(), AppError> {
        let step = (from as usize)
            .checked_sub(1)
            .and_then(|k| self.migrations().get(k))
            .ok_or_else(|| AppError::new(500, format!("no migration from version {from}")))?;
        cx.db()?.execute_batch(step)?;
        Ok(())
    }

    /// Most inputs waiting in an object's mailbox; past it an input is refused at once.
    fn mailbox(&self) -> usize {
        combd_kernel::limits::MAILBOX_DEFAULT
    }

    /// The memory one call of this app may use, in KiB, if limited: its inputs waiting in the
    /// mailbox, the sends it queues, and what it allocates while it runs (counted by the
    /// node's allocator). Past it the call is killed with `memory_limit`.
    fn memory_kb(&self) -> Option<u64> {
        None
    }

    /// The largest input this app takes, in bytes: a request body, a WebSocket message. A
    /// larger one is refused before it is read into a mailbox: `413 {"error":"request body too
    /// large"}` for a body, close 1009 for a message. `None`: the node's limits
    /// (`COMBD_MAX_BODY`, `COMBD_WS_MAX_MESSAGE`) only. An app whose inputs are small says so,
    /// and a client cannot make its mailbox hold large ones.
    fn max_input_bytes(&self) -> Option<u64> {
        None
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

    /// How much of each of its topics' logs the app's objects keep (README "Resuming a
    /// WebSocket"): each at most the node's, which is the default. Less keeps an object's
    /// database smaller; a client away longer than it keeps resumes with a snapshot.
    fn log_retention(&self) -> LogRetention {
        LogRetention::NODE
    }

    /// Whether the node keeps the presence of the app's topics (who is attached to each: a
    /// verified identity, else a session) and tells it to their numbered sessions
    /// (`cells::presence`, README "Presence").
    fn presence(&self) -> bool {
        false
    }

    /// How a session that missed messages (its mailbox was full, its shard behind, or another
    /// shard could not reach it) is brought back in sync. The node never drops a message for a
    /// session silently: it drops what waits for the session and does this instead.
    fn resync(&self) -> Resync {
        Resync::Close
    }

    /// A page the node serves for this app: its path (outside `/o/`) and its HTML.
    fn page(&self) -> Option<(&'static str, &'static str)> {
        None
    }

    /// The app a newly restored object runs on, if not this one (a module's version in force).
    fn pinned(&self) -> Option<Arc<dyn App>> {
        None
    }

    /// A module's version replaced by a reload: its objects are let go after their batch.
    fn retired(&self) -> bool {
        false
    }

    /// For an app deployed as a module: its version in force, for `/stats`.
    fn deployment(&self) -> Option<Deployment> {
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

/// An object's database file: `<data>/objects/<app>/<name>.sqlite`. With a name that passed
/// [`valid_object_name`], it is always inside the data directory.
pub fn object_path(data_dir: &std::path::Path, app: &str, name: &str) -> std::path::PathBuf {
    data_dir
        .join("objects")
        .join(app)
        .join(format!("{name}.sqlite"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn log_output_is_capped_at_64_kib_with_one_marker() {
        let mut effects = Vec::new();
        let mut budget = CallBudget::new(u64::MAX);
        let mut cx = Cx::new(None, &mut effects, &mut budget);
        let line = "x".repeat(1000);
        for _ in 0..100 {
            cx.log(&line);
        }
        assert!(budget.log.len() <= combd_kernel::limits::LOG_MAX_BYTES);
        assert_eq!(budget.log.matches("dropped").count(), 1);
        assert_eq!(budget.log.lines().filter(|l| l.len() == 1000).count(), 65);
    }

    #[test]
    fn a_tripped_limit_stays_tripped() {
        let mut effects = Vec::new();
        let mut budget = CallBudget::new(3);
        let mut cx = Cx::new(None, &mut effects, &mut budget);
        assert!(cx.tick().is_ok());
        assert!(cx.tick().is_ok());
        assert!(cx.tick().is_ok());
        assert_eq!(cx.tick().unwrap_err().message, "cpu_limit");
        assert_eq!(cx.tick().unwrap_err().message, "cpu_limit");
        assert_eq!(budget.tripped, Some(Limit::Cpu));
    }

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

    #[test]
    fn object_paths_stay_in_the_data_dir() {
        let p = object_path(std::path::Path::new("/data"), "counter", "a.b");
        assert_eq!(
            p,
            std::path::PathBuf::from("/data/objects/counter/a.b.sqlite")
        );
    }
}
