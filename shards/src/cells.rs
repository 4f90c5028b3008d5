//! Cells: durable objects and sessions, their mailboxes, batches, and the routes between
//! shards.
//!
//! - An **object** (`app/name`) lives on shard `hash(app/name) % shards`. Its cell owns its
//!   SQLite database (`<data>/objects/<app>/<name>.sqlite`, WAL) and a bounded mailbox. A task
//!   per live object opens ("restores") the database, within the shard's restore cap, then
//!   takes its mail one input at a time, or a batch at once for apps that handle batches, in
//!   one transaction on glommio's blocking thread, while holding one of the shard's awake
//!   slots. Replies and effects (sends, broadcasts) leave after the commit. An idle object is
//!   closed after [`OBJECT_IDLE`] (longer under memory pressure).
//! - A **session** is a WebSocket attached to an object. It lives on its connection's shard,
//!   with its own mailbox of frames to write; a session with mail waits for an awake slot
//!   before it writes. Its messages go to its object's mailbox.
//! - Between shards, each shard has one bounded inbox: jobs for its objects, deliveries to
//!   its sessions, and broadcasts, which cross to each shard once and fan out there.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use combd_kernel::limits::{
    OBJECT_IDLE, OBJECT_IDLE_UNDER_PRESSURE, SESSION_MAILBOX, SESSION_MAILBOX_BEHIND,
    WS_SLOW_CLOSE_BYTES,
};
use glommio::timer::Timer;
use tracing::warn;

use crate::app::{App, AppError, CallBudget, Cx, Effect, Input, Message, Output, SessionId};
use crate::http::Response;
use crate::shard::Shard;
use crate::stats::ShardStats;
use crate::ws;

/// Work for an object: what to handle, and where its answer goes. Owned and `Send`: it may
/// cross shards.
pub(crate) struct Job {
    pub input: Owned,
    pub reply: Reply,
}

impl Job {
    /// An HTTP request; the response goes back on `reply`.
    pub fn http(
        method: String,
        query: Option<String>,
        body: Vec<u8>,
        reply: async_channel::Sender<Response>,
    ) -> Job {
        Job {
            input: Owned::Http {
                method,
                query,
                body,
            },
            reply: Reply::Http(reply),
        }
    }

    /// A message from a session (errors go back to the session).
    pub fn message(session: SessionId, text: bool, payload: Vec<u8>) -> Job {
        Job {
            input: Owned::Message {
                session,
                text,
                payload,
            },
            reply: Reply::Session(session),
        }
    }

    /// A session attaching; `Err` refuses it with that response.
    pub fn attach(
        session: SessionId,
        query: Option<String>,
        reply: async_channel::Sender<Result<(), Response>>,
    ) -> Job {
        Job {
            input: Owned::Attach { session, query },
            reply: Reply::Attach(reply),
        }
    }

    /// A session detaching. Never refused: it frees what the object keeps for the session.
    pub fn detach(session: SessionId) -> Job {
        Job {
            input: Owned::Detach { session },
            reply: Reply::None,
        }
    }

    fn is_detach(&self) -> bool {
        matches!(self.input, Owned::Detach { .. })
    }
}

/// What crosses between shards.
pub(crate) enum ShardMsg {
    /// A job for an object living on the receiving shard.
    Job { app: String, name: String, job: Job },
    /// A framed message for a session on the receiving shard.
    Deliver { session: u64, frame: Arc<[u8]> },
    /// A framed message for every session of `key` subscribed to `topic` on the receiving shard.
    Broadcast {
        key: String,
        topic: String,
        frame: Arc<[u8]>,
    },
}

/// The shard an object lives on: FNV-1a of `app/name`, modulo the shard count. Stable across
/// restarts and builds.
pub fn home_shard(app: &str, name: &str, shards: usize) -> usize {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in app.bytes().chain(std::iter::once(b'/')).chain(name.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x100000001b3);
    }
    (h % shards.max(1) as u64) as usize
}

/// An object's database file.
pub fn object_path(data_dir: &std::path::Path, app: &str, name: &str) -> PathBuf {
    data_dir
        .join("objects")
        .join(app)
        .join(format!("{name}.sqlite"))
}

struct Queued {
    job: Job,
    at: Instant,
}

/// A live object on its home shard.
pub(crate) struct ObjectCell {
    key: String,
    app: Arc<dyn App>,
    name: String,
    mailbox: RefCell<VecDeque<Queued>>,
    /// The object task's waker slot in the shard's waker slab.
    slot: usize,
}

/// A session on its connection's shard.
pub(crate) struct SessionCell {
    /// The connection's waker slot: a delivery wakes it.
    pub slot: usize,
    pub mail: VecDeque<Arc<[u8]>>,
    pub key: String,
    pub topic: String,
    /// Bytes waiting for the client: the mailbox's, and those being written, until the
    /// kernel has taken them.
    pub waiting_bytes: u64,
    /// Why the node closes this session: it reads too slowly, or its shard's outbound budget
    /// is spent. Its mail is dropped at once; the connection closes when it next runs.
    pub closing: Option<&'static str>,
}

/// The cells of one shard.
#[derive(Default)]
pub(crate) struct Cells {
    objects: RefCell<HashMap<String, Rc<ObjectCell>>>,
    pub sessions: RefCell<HashMap<u64, SessionCell>>,
    topics: RefCell<HashMap<(String, String), HashSet<u64>>>,
    next_session: Cell<u64>,
}

fn overloaded() -> Response {
    Response::error(503, "overloaded").with_header("retry-after", "1")
}

fn error_frame(message: &str) -> Arc<[u8]> {
    let mut out = Vec::new();
    ws::encode_text(
        &mut out,
        &serde_json::json!({ "error": message }).to_string(),
    );
    out.into()
}

fn frame(text: bool, payload: &[u8]) -> Arc<[u8]> {
    let mut out = Vec::with_capacity(payload.len() + 10);
    if text {
        ws::encode(
            &mut out,
            tungstenite::protocol::frame::coding::OpCode::Data(
                tungstenite::protocol::frame::coding::Data::Text,
            ),
            payload,
        );
    } else {
        ws::encode_binary(&mut out, payload);
    }
    out.into()
}

/// Answers a job that will not run, the way its kind calls for.
fn refuse(shard: &Rc<Shard>, job: Job, resp: Response) {
    match job.reply {
        Reply::Http(reply) => {
            let _ = reply.try_send(resp);
        }
        Reply::Attach(reply) => {
            let _ = reply.try_send(Err(resp));
        }
        Reply::Session(session) => {
            let msg = String::from_utf8_lossy(&resp.body).into_owned();
            let text = serde_json::from_str::<serde_json::Value>(&msg)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or(msg);
            shard.deliver(session, error_frame(&text));
        }
        Reply::None => {}
    }
}

impl Shard {
    /// A new session id on this shard.
    pub(crate) fn new_session(&self, slot: usize, key: String, topic: String) -> SessionId {
        let id = self.cells.next_session.get() + 1;
        self.cells.next_session.set(id);
        self.cells
            .topics
            .borrow_mut()
            .entry((key.clone(), topic.clone()))
            .or_default()
            .insert(id);
        self.cells.sessions.borrow_mut().insert(
            id,
            SessionCell {
                slot,
                mail: VecDeque::new(),
                waiting_bytes: 0,
                closing: None,
                key,
                topic,
            },
        );
        ShardStats::add(&self.stats().sessions, 1);
        SessionId {
            shard: self.id as u32,
            id,
        }
    }

    /// Forgets a session (its connection closed).
    pub(crate) fn end_session(&self, id: u64) {
        if let Some(s) = self.cells.sessions.borrow_mut().remove(&id) {
            ShardStats::sub(&self.stats().sessions, 1);
            self.release_outbound(s.waiting_bytes);
            let mut topics = self.cells.topics.borrow_mut();
            let k = (s.key, s.topic);
            if let Some(set) = topics.get_mut(&k) {
                set.remove(&id);
                if set.is_empty() {
                    topics.remove(&k);
                }
            }
        }
    }

    /// Whether a session has mail to write, or is to be closed.
    pub(crate) fn has_mail(&self, id: u64) -> bool {
        self.cells
            .sessions
            .borrow()
            .get(&id)
            .is_some_and(|s| !s.mail.is_empty() || s.closing.is_some())
    }

    /// Why the node is closing this session, if it is.
    pub(crate) fn closing(&self, id: u64) -> Option<&'static str> {
        self.cells
            .sessions
            .borrow()
            .get(&id)
            .and_then(|s| s.closing)
    }

    /// Takes a session's mail; its bytes stay counted as waiting until
    /// [`Shard::written`] says the kernel took them.
    pub(crate) fn take_mail(&self, id: u64) -> VecDeque<Arc<[u8]>> {
        self.cells
            .sessions
            .borrow_mut()
            .get_mut(&id)
            .map(|s| std::mem::take(&mut s.mail))
            .unwrap_or_default()
    }

    /// The kernel took `bytes` of a session's output.
    pub(crate) fn written(&self, id: u64, bytes: u64) {
        if let Some(s) = self.cells.sessions.borrow_mut().get_mut(&id) {
            let b = bytes.min(s.waiting_bytes);
            s.waiting_bytes -= b;
            self.release_outbound(b);
        }
    }

    fn release_outbound(&self, bytes: u64) {
        self.outbound.set(self.outbound.get().saturating_sub(bytes));
        self.stats()
            .outbound_bytes
            .store(self.outbound.get(), Ordering::Relaxed);
    }

    /// Puts a frame in a local session's mailbox and wakes its connection. The mailbox holds
    /// 1000 frames, or 8 while the shard is behind (what does not fit is dropped and counted).
    /// A session with [`WS_SLOW_CLOSE_BYTES`] waiting is closed (it reads too slowly), and so
    /// is one whose frame would take its shard past its outbound budget: the connection that
    /// would receive the send is closed, never the node.
    fn deliver_local(&self, id: u64, frame: Arc<[u8]>) {
        let limit = if self.is_behind() {
            SESSION_MAILBOX_BEHIND
        } else {
            SESSION_MAILBOX
        };
        let len = frame.len() as u64;
        let budget = self.node.outbound_budget_bytes;
        let slot = {
            let mut sessions = self.cells.sessions.borrow_mut();
            let Some(s) = sessions.get_mut(&id) else {
                return;
            };
            if s.closing.is_some() {
                return;
            }
            let close = if s.waiting_bytes + len > WS_SLOW_CLOSE_BYTES {
                ShardStats::add(&self.stats().ws_slow_closed, 1);
                Some("slow")
            } else if self.outbound.get() + len > budget {
                ShardStats::add(&self.stats().outbound_budget_closed, 1);
                Some("outbound_budget")
            } else {
                None
            };
            if close.is_some() {
                // Drop what waits in the mailbox now; what is being written is released as
                // the connection closes.
                let queued: u64 = s.mail.drain(..).map(|f| f.len() as u64).sum();
                s.waiting_bytes -= queued.min(s.waiting_bytes);
                self.outbound
                    .set(self.outbound.get().saturating_sub(queued));
                s.closing = close;
            } else if s.mail.len() >= limit {
                ShardStats::add(&self.stats().session_mailbox_dropped, 1);
                return;
            } else {
                s.mail.push_back(frame);
                s.waiting_bytes += len;
                self.outbound.set(self.outbound.get() + len);
                let stats = self.stats();
                stats
                    .outbound_bytes
                    .store(self.outbound.get(), Ordering::Relaxed);
                stats
                    .outbound_bytes_max
                    .fetch_max(self.outbound.get(), Ordering::Relaxed);
            }
            s.slot
        };
        self.wake_slot(slot);
    }

    /// Delivers a frame to a session on any shard.
    pub(crate) fn deliver(&self, to: SessionId, frame: Arc<[u8]>) {
        if to.shard as usize == self.id {
            self.deliver_local(to.id, frame);
        } else if let Some(inbox) = self.node.inboxes.get(to.shard as usize) {
            if inbox
                .try_send(ShardMsg::Deliver {
                    session: to.id,
                    frame,
                })
                .is_err()
            {
                ShardStats::add(&self.stats().cross_shard_dropped, 1);
            }
        }
    }

    fn fan_out_local(&self, key: &str, topic: &str, frame: &Arc<[u8]>) {
        let ids: Vec<u64> = self
            .cells
            .topics
            .borrow()
            .get(&(key.to_string(), topic.to_string()))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for id in ids {
            self.deliver_local(id, frame.clone());
        }
    }

    /// Sends a job to its object, wherever it lives. A job that cannot be queued is answered
    /// at once (503 `overloaded`, or 507 `disk_low` for a new object).
    pub(crate) fn submit(self: &Rc<Self>, app: &Arc<dyn App>, name: &str, job: Job) {
        let home = home_shard(app.name(), name, self.node.stats.len());
        if home == self.id {
            self.submit_local(app, name, job);
            return;
        }
        let msg = ShardMsg::Job {
            app: app.name().to_string(),
            name: name.to_string(),
            job,
        };
        if let Err(e) = self.node.inboxes[home].try_send(msg) {
            ShardStats::add(&self.stats().mailbox_refused, 1);
            if let ShardMsg::Job { job, .. } = e.into_inner() {
                refuse(self, job, overloaded());
            }
        }
    }

    fn submit_local(self: &Rc<Self>, app: &Arc<dyn App>, name: &str, job: Job) {
        let key = format!("{}/{}", app.name(), name);
        let existing = self.cells.objects.borrow().get(&key).cloned();
        let cell = match existing {
            Some(c) => c,
            None => {
                if job.is_detach() {
                    return;
                }
                // A new object needs disk: refuse it while the disk is low, unless its
                // database already exists (existing objects keep working).
                if self.node.admission.disk_low()
                    && !object_path(&self.node.settings.data_dir, app.name(), name).exists()
                {
                    refuse(self, job, Response::error(507, "disk_low"));
                    return;
                }
                let cell = Rc::new(ObjectCell {
                    key: key.clone(),
                    app: app.clone(),
                    name: name.to_string(),
                    mailbox: RefCell::new(VecDeque::new()),
                    slot: self.register(),
                });
                self.cells.objects.borrow_mut().insert(key, cell.clone());
                ShardStats::add(&self.stats().objects_live, 1);
                if let Ok(task) = self.gate_spawn(object_task(self.clone(), cell.clone())) {
                    task.detach();
                }
                cell
            }
        };
        {
            let mut mb = cell.mailbox.borrow_mut();
            if !job.is_detach() && mb.len() >= cell.app.mailbox() {
                drop(mb);
                ShardStats::add(&self.stats().mailbox_refused, 1);
                refuse(self, job, overloaded());
                return;
            }
            mb.push_back(Queued {
                job,
                at: Instant::now(),
            });
        }
        self.wake_slot(cell.slot);
    }

    /// Handles what another shard sent.
    pub(crate) fn receive(self: &Rc<Self>, msg: ShardMsg) {
        match msg {
            ShardMsg::Job { app, name, job } => match self.node.apps.get(&app).cloned() {
                Some(app) => self.submit_local(&app, &name, job),
                None => refuse(self, job, Response::error(404, "no such app")),
            },
            ShardMsg::Deliver { session, frame } => self.deliver_local(session, frame),
            ShardMsg::Broadcast { key, topic, frame } => self.fan_out_local(&key, &topic, &frame),
        }
    }

    /// Applies an object's effects after its transaction committed.
    fn apply_effects(&self, key: &str, effects: Vec<Effect>) {
        for e in effects {
            match e {
                Effect::Send { to, text, payload } => self.deliver(to, frame(text, &payload)),
                Effect::Broadcast {
                    topic,
                    text,
                    payload,
                } => {
                    let f = frame(text, &payload);
                    for (shard, inbox) in self.node.inboxes.iter().enumerate() {
                        if shard == self.id {
                            self.fan_out_local(key, &topic, &f);
                        } else if inbox
                            .try_send(ShardMsg::Broadcast {
                                key: key.to_string(),
                                topic: topic.clone(),
                                frame: f.clone(),
                            })
                            .is_err()
                        {
                            ShardStats::add(&self.stats().cross_shard_dropped, 1);
                        }
                    }
                }
            }
        }
    }
}

/// An input as it crosses into the blocking thread.
pub(crate) enum Owned {
    Http {
        method: String,
        query: Option<String>,
        body: Vec<u8>,
    },
    Message {
        session: SessionId,
        text: bool,
        payload: Vec<u8>,
    },
    Attach {
        session: SessionId,
        query: Option<String>,
    },
    Detach {
        session: SessionId,
    },
}

impl Owned {
    fn input(&self) -> Result<Input<'_>, AppError> {
        Ok(match self {
            Owned::Http {
                method,
                query,
                body,
            } => Input::Http {
                method,
                query: query.as_deref(),
                body,
            },
            Owned::Message {
                session,
                text,
                payload,
            } => Input::Message {
                session: *session,
                msg: if *text {
                    Message::Text(
                        std::str::from_utf8(payload)
                            .map_err(|_| AppError::new(400, "invalid utf-8"))?,
                    )
                } else {
                    Message::Binary(payload)
                },
            },
            Owned::Attach { session, query } => Input::Attach {
                session: *session,
                query: query.as_deref(),
            },
            Owned::Detach { session } => Input::Detach { session: *session },
        })
    }
}

/// What comes back from the blocking thread for a batch.
struct BatchResult {
    outputs: Vec<Result<Output, AppError>>,
    effects: Vec<Effect>,
    /// The calls' log output.
    logs: String,
    /// A limit killed a call: the object is reloaded from its database.
    killed: bool,
    /// Calls slower than `SLOW_CALL`.
    slow_calls: u64,
    /// The limits that tripped.
    limits: Vec<&'static str>,
}

/// Opens an object's database: WAL, the durability setting, the SQL limits (value size,
/// database size, the statement and host-time watch), the app's schema.
fn open_db(
    path: &std::path::Path,
    sync_full: bool,
    db_max_bytes: u64,
    schema: &str,
) -> Result<rusqlite::Connection, String> {
    use combd_kernel::limits::{SQL_PROGRESS_STEPS, SQL_VALUE_MAX_BYTES};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    let db =
        rusqlite::Connection::open(path).map_err(|e| format!("open {}: {e}", path.display()))?;
    let sync = if sync_full { "FULL" } else { "NORMAL" };
    db.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync}; PRAGMA foreign_keys=ON; PRAGMA busy_timeout=1000;"
    ))
    .map_err(|e| format!("configure {}: {e}", path.display()))?;
    db.set_limit(
        rusqlite::limits::Limit::SQLITE_LIMIT_LENGTH,
        SQL_VALUE_MAX_BYTES,
    );
    let page: u64 = db
        .query_row("PRAGMA page_size", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    db.execute_batch(&format!(
        "PRAGMA max_page_count = {};",
        (db_max_bytes / page.max(512)).max(1)
    ))
    .map_err(|e| format!("configure {}: {e}", path.display()))?;
    watch::install(&db);
    db.progress_handler(SQL_PROGRESS_STEPS, Some(watch::check));
    if !schema.is_empty() {
        db.execute_batch(schema)
            .map_err(|e| format!("schema of {}: {e}", path.display()))?;
    }
    Ok(db)
}

/// The statement and host-time watch. SQLite calls [`watch::check`] every few thousand VM
/// steps; it interrupts a statement that has run longer than
/// [`SQL_STATEMENT_LIMIT`](combd_kernel::limits::SQL_STATEMENT_LIMIT), or any statement once
/// the call's SQL has taken [`HOST_TIME_LIMIT`](combd_kernel::limits::HOST_TIME_LIMIT) in all.
/// Statement starts and durations come from `sqlite3_trace_v2`; time the app spends outside
/// host calls is bounded by its ticks instead. The state is per thread: a blocking thread runs
/// one call at a time.
mod watch {
    use std::cell::Cell;
    use std::time::{Duration, Instant};

    use combd_kernel::limits::{HOST_TIME_LIMIT, SQL_STATEMENT_LIMIT};
    use rusqlite::ffi;

    thread_local! {
        static CALL_START: Cell<Option<Instant>> = const { Cell::new(None) };
        static STMT_START: Cell<Option<Instant>> = const { Cell::new(None) };
        static TRIPPED: Cell<Option<&'static str>> = const { Cell::new(None) };
        static SQL_SPENT: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    unsafe extern "C" fn on_trace(
        kind: u32,
        _ctx: *mut std::ffi::c_void,
        _p: *mut std::ffi::c_void,
        x: *mut std::ffi::c_void,
    ) -> i32 {
        if kind == ffi::SQLITE_TRACE_PROFILE as u32 {
            // SAFETY: for SQLITE_TRACE_PROFILE, X points to the statement's run time in ns.
            let ns = unsafe { *(x as *const i64) };
            SQL_SPENT.with(|s| s.set(s.get() + Duration::from_nanos(ns.max(0) as u64)));
            STMT_START.with(|s| s.set(None));
        } else {
            STMT_START.with(|s| s.set(Some(Instant::now())));
        }
        0
    }

    /// Hooks statement starts on a connection.
    pub fn install(db: &rusqlite::Connection) {
        // SAFETY: the callback touches only thread-local state; the handle outlives the hook
        // (it is removed when the connection closes).
        unsafe {
            ffi::sqlite3_trace_v2(
                db.handle(),
                (ffi::SQLITE_TRACE_STMT | ffi::SQLITE_TRACE_PROFILE) as u32,
                Some(on_trace),
                std::ptr::null_mut(),
            );
        }
    }

    /// Starts watching a call on this thread.
    pub fn begin() {
        CALL_START.with(|c| c.set(Some(Instant::now())));
        STMT_START.with(|s| s.set(None));
        TRIPPED.with(|t| t.set(None));
        SQL_SPENT.with(|s| s.set(Duration::ZERO));
    }

    /// Which limit interrupted SQL during the call, if any; and stops watching.
    pub fn end() -> Option<&'static str> {
        CALL_START.with(|c| c.set(None));
        TRIPPED.with(|t| t.take())
    }

    /// The progress handler: true interrupts the statement.
    pub fn check() -> bool {
        if CALL_START.with(|c| c.get()).is_none() {
            return false;
        }
        let running = STMT_START
            .with(|s| s.get())
            .map_or(Duration::ZERO, |t| t.elapsed());
        if SQL_SPENT.with(|s| s.get()) + running > HOST_TIME_LIMIT {
            TRIPPED.with(|t| t.set(Some("host_time")));
            return true;
        }
        if running > SQL_STATEMENT_LIMIT {
            TRIPPED.with(|t| t.set(Some("sql_timeout")));
            return true;
        }
        false
    }
}

/// Runs an app call, turning a panic into an error: the transaction around it is rolled back
/// and the object keeps serving, instead of the panic taking the shard down.
fn guarded<T>(f: impl FnOnce() -> Result<T, AppError>) -> Result<T, AppError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(AppError::new(500, "the app failed on this input")))
}

/// One call of an app in its own transaction, under its limits: ticks, sends, log, the SQL
/// watch, the host-time limit. A limit that trips decides the result whatever the app
/// returned, and the transaction is rolled back.
fn call<T>(
    db: &mut rusqlite::Connection,
    tick_limit: u64,
    memory: (Option<u64>, u64),
    effects: &mut Vec<Effect>,
    logs: &mut String,
    f: impl FnOnce(&mut Cx<'_>) -> Result<T, AppError>,
) -> (Result<T, AppError>, CallStats) {
    let started = std::time::Instant::now();
    let mut budget = CallBudget::new(tick_limit).with_memory(memory.0, memory.1);
    watch::begin();
    if memory.0.is_some() {
        crate::alloc::begin();
    }
    let r = (|| -> Result<T, AppError> {
        let tx = db.transaction()?;
        let out = {
            let mut cx = Cx::new(Some(&tx), effects, &mut budget);
            guarded(|| f(&mut cx))?
        };
        let _ = budget.check_memory();
        if budget.tripped.is_some() {
            return Err(AppError::new(500, "limit"));
        }
        tx.commit()?;
        Ok(out)
    })();
    let interrupted = watch::end();
    crate::alloc::end();
    let elapsed = started.elapsed();
    let tripped = budget.tripped.or(interrupted);
    logs.push_str(&budget.log);
    let killed = tripped.is_some_and(|t| {
        matches!(
            t,
            "cpu_limit" | "host_time" | "sql_timeout" | "memory_limit"
        )
    });
    // Limits SQLite enforces by refusing the statement (the app sees the error).
    let tripped = tripped.or(match &r {
        Err(e) if e.message == "too_big" => Some("too_big"),
        Err(e) if e.message == "db_full" => Some("db_full"),
        _ => None,
    });
    let r = match (r, tripped) {
        (_, Some(t)) => Err(crate::app::limit_error(t)),
        (r, None) => r,
    };
    let stats = CallStats {
        killed,
        slow: elapsed > combd_kernel::limits::SLOW_CALL,
        limit: tripped,
    };
    (r, stats)
}

/// What [`call`] tells the object about a call besides its result.
#[derive(Debug, Default, Clone, Copy)]
struct CallStats {
    /// A limit killed it: reload the object from its database.
    killed: bool,
    /// It took longer than [`SLOW_CALL`](combd_kernel::limits::SLOW_CALL).
    slow: bool,
    /// Which limit tripped, if any.
    limit: Option<&'static str>,
}

/// Runs inputs in one transaction (a batch), or each in its own when the batch fails or the
/// app takes one at a time. Runs on the blocking thread.
fn run_batch(
    app: &dyn App,
    db: &mut rusqlite::Connection,
    inputs: &[Owned],
    tick_limit: u64,
) -> BatchResult {
    let limit = app.memory_kb().map(|kb| kb * 1024);
    let input_bytes = |i: &Owned| match i {
        Owned::Http { body, .. } => body.len() as u64,
        Owned::Message { payload, .. } => payload.len() as u64,
        _ => 0,
    };
    let all: u64 = inputs.iter().map(input_bytes).sum();
    let mut result = BatchResult {
        outputs: Vec::new(),
        effects: Vec::new(),
        logs: String::new(),
        killed: false,
        slow_calls: 0,
        limits: Vec::new(),
    };
    if inputs.len() > 1 {
        let mut effects = Vec::new();
        let mut logs = String::new();
        let (r, st) = call(
            db,
            tick_limit,
            (limit, all),
            &mut effects,
            &mut logs,
            |cx| {
                let borrowed: Vec<Input<'_>> =
                    inputs.iter().map(Owned::input).collect::<Result<_, _>>()?;
                let outs = app.handle_batch(cx, &borrowed)?;
                if outs.len() != inputs.len() {
                    return Err(AppError::new(
                        500,
                        "handle_batch answered the wrong number of inputs",
                    ));
                }
                Ok(outs)
            },
        );
        result.slow_calls += st.slow as u64;
        if let Ok(outs) = r {
            result.outputs = outs.into_iter().map(Ok).collect();
            result.effects = effects;
            result.logs = logs;
            return result;
        }
        // Nothing of the batch was applied; retry one by one so one bad input does not fail
        // its neighbours.
    }
    for input in inputs {
        let mut mine = Vec::new();
        let (r, st) = call(
            db,
            tick_limit,
            (limit, input_bytes(input)),
            &mut mine,
            &mut result.logs,
            |cx| {
                let input = input.input()?;
                app.handle(cx, &input)
            },
        );
        if r.is_ok() {
            result.effects.append(&mut mine);
        }
        result.killed |= st.killed;
        result.slow_calls += st.slow as u64;
        if let Some(l) = st.limit {
            result.limits.push(l);
        }
        result.outputs.push(r);
    }
    result
}

/// The life of one object on its home shard.
async fn object_task(shard: Rc<Shard>, cell: Rc<ObjectCell>) {
    let stats = shard.stats();
    // Restore, within the shard's restore cap, in order.
    shard
        .restores
        .acquire_observed(|| {
            stats
                .restores_waiting
                .store(shard.restores.waiting() as u64, Ordering::Relaxed)
        })
        .await;
    stats
        .restores_active
        .store(shard.restores.used() as u64, Ordering::Relaxed);
    stats
        .restores_active_max
        .store(shard.restores.used_max.get() as u64, Ordering::Relaxed);
    let path = object_path(&shard.node.settings.data_dir, cell.app.name(), &cell.name);
    let sync_full = shard.node.settings.sqlite_sync_full;
    let db_max = shard.node.settings.db_max_bytes;
    let schema = cell.app.schema();
    let opened = glommio::executor()
        .spawn_blocking(move || open_db(&path, sync_full, db_max, schema))
        .await;
    shard.restores.release();
    stats
        .restores_active
        .store(shard.restores.used() as u64, Ordering::Relaxed);
    ShardStats::add(&stats.restores, 1);
    let mut db = match opened {
        Ok(db) => Some(db),
        Err(e) => {
            warn!(object = %cell.key, "cannot open: {e}");
            None
        }
    };

    loop {
        // Wait for mail, or close when idle (longer under memory pressure).
        let idle = if shard.node.admission.pressure.load(Ordering::Relaxed) >= 1 {
            OBJECT_IDLE_UNDER_PRESSURE
        } else {
            OBJECT_IDLE
        };
        let mut timer = Timer::new(idle);
        let has_mail = futures_lite::future::poll_fn(|cx| {
            if !cell.mailbox.borrow().is_empty() {
                return Poll::Ready(true);
            }
            if shard.draining.get()
                || std::future::Future::poll(std::pin::Pin::new(&mut timer), cx).is_ready()
            {
                return Poll::Ready(false);
            }
            shard.park(cell.slot, cx.waker());
            Poll::Pending
        })
        .await;
        if !has_mail {
            // Idle (or draining with nothing queued): let the object go. It is removed from
            // the map now, in the same turn, so new mail makes a fresh cell.
            shard.cells.objects.borrow_mut().remove(&cell.key);
            shard.unregister(cell.slot);
            ShardStats::sub(&stats.objects_live, 1);
            if let Some(db) = db.take() {
                glommio::executor().spawn_blocking(move || drop(db)).await;
            }
            return;
        }

        let Some(conn) = db.take() else {
            // The database could not be opened: answer everything queued, and let go.
            let queued: Vec<Queued> = cell.mailbox.borrow_mut().drain(..).collect();
            for q in queued {
                refuse(
                    &shard,
                    q.job,
                    Response::error(500, "object storage unavailable"),
                );
            }
            continue;
        };

        // Take a batch while holding an awake slot.
        let permit = shard.acquire_awake().await;
        let n = if cell.app.handles_batch() {
            cell.app.batch().max(1)
        } else {
            1
        };
        let jobs: Vec<Queued> = {
            let mut mb = cell.mailbox.borrow_mut();
            let k = n.min(mb.len());
            mb.drain(..k).collect()
        };
        if let Some(oldest) = jobs.first() {
            let age = oldest.at.elapsed().as_millis() as u64;
            stats
                .mailbox_oldest_age_ms
                .fetch_max(age, Ordering::Relaxed);
        }
        let mut inputs = Vec::with_capacity(jobs.len());
        let mut replies = Vec::with_capacity(jobs.len());
        for q in jobs {
            inputs.push(q.job.input);
            replies.push(q.job.reply);
        }
        let count = inputs.len() as u64;
        let app = cell.app.clone();
        let tick_limit = shard.node.settings.cpu_limit_ticks;
        let (conn, result) = glommio::executor()
            .spawn_blocking(move || {
                let mut conn = conn;
                let r = run_batch(app.as_ref(), &mut conn, &inputs, tick_limit);
                (conn, r)
            })
            .await;
        if !result.logs.is_empty() {
            for line in result.logs.lines() {
                tracing::info!(object = %cell.key, "{line}");
            }
        }
        ShardStats::add(&stats.slow_calls, result.slow_calls);
        for l in &result.limits {
            let counter = match *l {
                "cpu_limit" => &stats.cpu_limit_killed,
                "host_time" => &stats.host_time_killed,
                "sql_timeout" => &stats.sql_timeouts,
                "too_big" => &stats.sql_too_big,
                "db_full" => &stats.db_full,
                "memory_limit" => &stats.memory_limit_killed,
                _ => &stats.send_limit_refused,
            };
            ShardStats::add(counter, 1);
        }
        if result.killed {
            // A killed call: reload the object from its database, so nothing of the call
            // survives anywhere (its transaction was rolled back).
            ShardStats::add(&stats.reloads, 1);
            let path = object_path(&shard.node.settings.data_dir, cell.app.name(), &cell.name);
            let schema = cell.app.schema();
            let reopened = glommio::executor()
                .spawn_blocking(move || {
                    drop(conn);
                    open_db(&path, sync_full, db_max, schema)
                })
                .await;
            db = reopened
                .map_err(|e| warn!(object = %cell.key, "cannot reopen: {e}"))
                .ok();
        } else {
            db = Some(conn);
        }
        ShardStats::add(&stats.batches, 1);
        stats.batch_max.fetch_max(count, Ordering::Relaxed);
        for (reply, out) in replies.into_iter().zip(result.outputs) {
            match (reply, out) {
                (Reply::Http(r), Ok(Output::Http(resp))) => {
                    let _ = r.try_send(resp);
                }
                (Reply::Http(r), Ok(Output::None)) => {
                    let _ = r.try_send(Response::bytes(204, "application/json", Vec::new()));
                }
                (Reply::Http(r), Err(e)) => {
                    let _ = r.try_send(Response::error(e.status, &e.message));
                }
                (Reply::Attach(r), Ok(_)) => {
                    let _ = r.try_send(Ok(()));
                }
                (Reply::Attach(r), Err(e)) => {
                    let _ = r.try_send(Err(Response::error(e.status, &e.message)));
                }
                (Reply::Session(s), Err(e)) => shard.deliver(s, error_frame(&e.message)),
                (Reply::Session(_), Ok(_)) | (Reply::None, _) => {}
            }
        }
        shard.apply_effects(&cell.key, result.effects);
        drop(permit);
    }
}

/// Where a job's answer goes.
pub(crate) enum Reply {
    Http(async_channel::Sender<Response>),
    Attach(async_channel::Sender<Result<(), Response>>),
    Session(SessionId),
    None,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn home_shard_is_stable_and_spread() {
        assert_eq!(home_shard("counter", "a", 1), 0);
        let a = home_shard("counter", "a", 4);
        assert_eq!(a, home_shard("counter", "a", 4));
        let mut seen = [0usize; 4];
        for i in 0..400 {
            seen[home_shard("million", &format!("b{i}"), 4)] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
    }

    /// Writes a row per input, then fails the ones whose body is `bad` (after writing).
    struct Log;

    impl App for Log {
        fn name(&self) -> &'static str {
            "log"
        }
        fn schema(&self) -> &'static str {
            "CREATE TABLE IF NOT EXISTS log (v TEXT NOT NULL);"
        }
        fn handles_batch(&self) -> bool {
            true
        }
        fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
            let Input::Http { body, .. } = input else {
                return Ok(Output::None);
            };
            let v = String::from_utf8_lossy(body).into_owned();
            cx.db()?.execute("INSERT INTO log (v) VALUES (?1)", [&v])?;
            cx.broadcast("t", &v)?;
            if v == "bad" {
                return Err(AppError::new(400, "bad input"));
            }
            Ok(Output::Http(Response::json(
                200,
                &serde_json::json!({ "v": v }),
            )))
        }
    }

    fn http(body: &str) -> Owned {
        Owned::Http {
            method: "POST".into(),
            query: None,
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a_failed_batch_applies_nothing_then_runs_one_by_one() {
        let path = std::env::temp_dir().join(format!("combd-batch-{}.sqlite", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut db = open_db(&path, true, 1 << 30, Log.schema()).unwrap();
        let inputs = [http("a"), http("bad"), http("b")];
        let r = run_batch(&Log, &mut db, &inputs, u64::MAX);
        assert!(matches!(&r.outputs[0], Ok(Output::Http(resp)) if resp.status == 200));
        assert_eq!(r.outputs[1].as_ref().unwrap_err().status, 400);
        assert!(r.outputs[2].is_ok());
        let rows: Vec<String> = db
            .prepare("SELECT v FROM log ORDER BY rowid")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            rows,
            ["a", "b"],
            "the failed input's write was rolled back, the others kept once"
        );
        // Effects only of what committed.
        let sent: Vec<_> = r
            .effects
            .iter()
            .map(|e| match e {
                Effect::Broadcast { payload, .. } => String::from_utf8_lossy(payload).into_owned(),
                Effect::Send { .. } => String::new(),
            })
            .collect();
        assert_eq!(sent, ["a", "b"]);

        // A batch that succeeds is one transaction with every effect.
        let r = run_batch(&Log, &mut db, &[http("c"), http("d")], u64::MAX);
        assert!(r.outputs.iter().all(|o| o.is_ok()));
        assert_eq!(r.effects.len(), 2);
        drop(db);
        let _ = std::fs::remove_file(&path);
    }

    struct Panics;

    impl App for Panics {
        fn name(&self) -> &'static str {
            "panics"
        }
        fn schema(&self) -> &'static str {
            "CREATE TABLE IF NOT EXISTS t (v INTEGER);"
        }
        fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
            cx.db()?.execute("INSERT INTO t (v) VALUES (1)", [])?;
            if let Input::Http { body: b"panic", .. } = input {
                panic!("an app bug");
            }
            Ok(Output::None)
        }
    }

    #[test]
    fn an_app_panic_fails_its_input_and_rolls_back() {
        let path = std::env::temp_dir().join(format!("combd-panic-{}.sqlite", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut db = open_db(&path, false, 1 << 30, Panics.schema()).unwrap();
        let r = run_batch(
            &Panics,
            &mut db,
            &[http("ok"), http("panic"), http("ok")],
            u64::MAX,
        );
        assert!(r.outputs[0].is_ok() && r.outputs[2].is_ok());
        assert_eq!(r.outputs[1].as_ref().unwrap_err().status, 500);
        let n: i64 = db
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
        drop(db);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn object_paths_stay_in_the_data_dir() {
        let p = object_path(std::path::Path::new("/data"), "counter", "a.b");
        assert_eq!(p, PathBuf::from("/data/objects/counter/a.b.sqlite"));
    }
}
