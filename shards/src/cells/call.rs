//! One call of an app, under its limits, and a batch of calls in one transaction. Runs on a
//! blocking thread, never on the shard's loop.

use combd_kernel::limits::{SLOW_CALL, TOPIC_LOG_REPLAY_BATCH_BYTES};

use crate::app::{limit_error, App, AppError, CallBudget, Cx, Effect, Input, Output};
use crate::job::Owned;
use crate::limit::Limit;
use crate::ws::numbered::Why;

use super::store::watch;
use super::topic_log::{self, Appended, Logged, Retention, TopicCache};
use crate::sandbox;

/// The object a batch runs for: its app's and its own name, its shard, and the node's alarm
/// index (which a call that sets an alarm updates before it commits).
#[derive(Clone, Copy)]
pub(super) struct Target<'a> {
    pub app: &'a str,
    pub name: &'a str,
    pub shard: usize,
    pub alarms: Option<&'a crate::alarms::AlarmIndex>,
    /// What the object knows of its topics' logs between calls, kept as each call commits.
    pub topics: Option<&'a TopicCache>,
    /// Its presence, for an app that keeps it.
    pub presence: Option<&'a super::PresenceView>,
    /// The node's users (`crate::users`).
    pub users: Option<&'a crate::users::Users>,
}

impl<'a> Target<'a> {
    /// Object `name` of `app`, with none of the node's tables an object's batch uses beside
    /// its database (alarm index, topics' logs, presence, users): a migration's, a test's.
    pub const fn bare(app: &'a str, name: &'a str) -> Target<'a> {
        Target {
            app,
            name,
            shard: 0,
            alarms: None,
            topics: None,
            presence: None,
            users: None,
        }
    }
}

/// The database a batch runs on.
#[derive(Debug, Clone)]
pub(super) enum On {
    /// The object's own database: what commits is kept.
    Db,
    /// The scratch database of an object whose database does not exist. A call that has
    /// written when its transaction is about to commit is rolled back instead, and the batch
    /// stops there: [`BatchResult::wrote`], and the object runs it again on its real database.
    Scratch,
    /// A scratch database, one input at a time, when no database may be created for the
    /// object: a call that has written when it is about to commit is rolled back and answered
    /// with this error (counted in [`BatchResult::refused`]); the others are answered.
    ScratchRefusing(AppError),
}

/// What comes back from the blocking thread for a batch.
pub(super) struct BatchResult {
    pub outputs: Vec<Result<Output, AppError>>,
    pub effects: Vec<Effect>,
    /// The calls' log output.
    pub logs: String,
    /// A limit killed a call: the object is reloaded from its database.
    pub killed: bool,
    /// Calls slower than `SLOW_CALL`.
    pub slow_calls: u64,
    /// The limits that tripped.
    pub limits: Vec<Limit>,
    /// On [`On::Scratch`]: a call wrote, so nothing of this result may be used (its outputs,
    /// effects, logs and counts are for a run that is discarded).
    pub wrote: bool,
    /// On [`On::ScratchRefusing`]: the inputs refused because they wrote.
    pub refused: u64,
    /// The outputs (by index) of calls that failed ([`AppError::is_failure`]): what the node
    /// warns about. The node's own refusals are not among them.
    pub failed: Vec<usize>,
    /// A call that committed set an alarm or queued a message, or the node's input ran (an
    /// alarm wake, a message taken, a delivery): when the object next has something due may
    /// have moved (the fleet's wake index learns it with the batch's head).
    pub due_moved: bool,
    /// The earliest alarm a call that committed set (a shard's timer reads the index for it,
    /// if it is due before the next tick).
    pub alarm_at: Option<u64>,
    /// What the calls that committed did to their topics' logs.
    pub logged: Logged,
    /// Numbered sessions' attaches refused for now: past the batch's replay budget.
    pub resumes_refused: u64,
}

impl BatchResult {
    /// An empty result.
    pub fn new() -> BatchResult {
        BatchResult {
            outputs: Vec::new(),
            effects: Vec::new(),
            logs: String::new(),
            killed: false,
            slow_calls: 0,
            limits: Vec::new(),
            wrote: false,
            refused: 0,
            failed: Vec::new(),
            due_moved: false,
            alarm_at: None,
            logged: Logged::default(),
            resumes_refused: 0,
        }
    }

    /// What one call told of itself: slow, or a limit it tripped (which may kill the call).
    pub fn note(&mut self, st: CallStats) {
        self.slow_calls += st.slow as u64;
        self.set_due(st);
        if let Some(l) = st.limit {
            self.killed |= l.kills();
            self.limits.push(l);
        }
    }

    /// What a call that committed set: alarms or messages (what is due moved), and the
    /// earliest alarm.
    fn set_due(&mut self, st: CallStats) {
        self.due_moved |= st.due_moved;
        self.set_alarm_at(st.alarm_at);
        self.add_logged(st.logged);
    }

    fn add_logged(&mut self, logged: Logged) {
        self.logged.frames += logged.frames;
        self.logged.trimmed += logged.trimmed;
    }

    /// The earliest alarm a call that committed set, if it set one.
    fn set_alarm_at(&mut self, at: Option<u64>) {
        if let Some(at) = at {
            self.alarm_at = Some(self.alarm_at.map_or(at, |was| was.min(at)));
        }
    }

    /// `more` (the inputs after these) appended.
    pub fn append(&mut self, mut more: BatchResult) {
        let at = self.outputs.len();
        self.outputs.append(&mut more.outputs);
        self.effects.append(&mut more.effects);
        self.logs.push_str(&more.logs);
        self.killed |= more.killed;
        self.slow_calls += more.slow_calls;
        self.limits.append(&mut more.limits);
        self.wrote |= more.wrote;
        self.refused += more.refused;
        self.due_moved |= more.due_moved;
        self.set_alarm_at(more.alarm_at);
        self.add_logged(more.logged);
        self.resumes_refused += more.resumes_refused;
        self.failed.extend(more.failed.into_iter().map(|i| i + at));
    }
}

/// What [`call`] tells the object about a call besides its result.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct CallStats {
    /// It took longer than [`SLOW_CALL`].
    pub slow: bool,
    /// Which limit tripped, if any.
    pub limit: Option<Limit>,
    /// On a scratch database: the call had written when it was about to commit, and was
    /// rolled back instead.
    pub wrote: bool,
    /// It set an alarm or queued a message, and committed.
    pub due_moved: bool,
    /// The earliest alarm it set, if it set one and committed.
    pub alarm_at: Option<u64>,
    /// What its broadcasts did to the log, if it committed.
    pub logged: Logged,
}

/// The limits of every call of one batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct CallLimits {
    /// `COMBD_CPU_LIMIT_TICKS`.
    pub ticks: u64,
    /// The app's `memory_kb`, in bytes.
    pub memory_bytes: Option<u64>,
    /// How much of its topics' logs the app keeps.
    pub retention: Retention,
}

impl CallLimits {
    /// The limits of `app`'s calls on the shard of `state`.
    pub fn of(state: &crate::state::ShardState, app: &dyn crate::app::App) -> CallLimits {
        CallLimits {
            ticks: state.settings().cpu_limit_ticks,
            memory_bytes: app.memory_kb().map(|kb| kb * 1024),
            retention: Retention::of(app.log_retention()),
        }
    }
}

/// What every call of one batch runs with: the app, the object it runs on, the calls' limits
/// and the database it runs on (the object's, or a scratch one).
#[derive(Clone, Copy)]
pub(super) struct Run<'a> {
    pub app: &'a dyn App,
    pub target: Target<'a>,
    pub limits: CallLimits,
    pub on: &'a On,
}

impl<'a> Run<'a> {
    pub fn new(app: &'a dyn App, target: Target<'a>, limits: CallLimits, on: &'a On) -> Self {
        Run {
            app,
            target,
            limits,
            on,
        }
    }

    /// Whether the run is on a scratch database.
    pub fn scratch(&self) -> bool {
        !matches!(self.on, On::Db)
    }

    /// One call of the run ([`call`]) on `db`, for input of `input_bytes`.
    pub fn call<T>(
        &self,
        db: &mut rusqlite::Connection,
        input_bytes: u64,
        effects: &mut Vec<Effect>,
        logs: &mut String,
        f: impl FnOnce(&mut Cx<'_>) -> Result<T, AppError>,
    ) -> (Result<T, AppError>, CallStats) {
        call(
            self.target,
            db,
            self.limits,
            self.scratch(),
            input_bytes,
            effects,
            logs,
            f,
        )
    }
}

/// Runs the app's inputs (none the node made: [`super::fire::run_inputs`] runs those where
/// they stand) in one transaction (a batch), or each in its own when the batch fails, the app
/// takes one at a time, or the run refuses writes ([`On::ScratchRefusing`]).
pub(super) fn run_batch(
    run: Run<'_>,
    db: &mut rusqlite::Connection,
    inputs: &[Owned],
) -> BatchResult {
    debug_assert!(!inputs.iter().any(Owned::is_node_input));
    let mut result = BatchResult::new();
    // A numbered session's attach is sent what the log holds before its own call (it reads
    // the log where the call starts): one by one.
    let resumes = inputs.iter().any(|i| i.resume().is_some());
    if inputs.len() > 1 && !resumes && !matches!(run.on, On::ScratchRefusing(_)) {
        match run_together(run, db, inputs) {
            Ok(done) => return done,
            // Nothing of the batch was applied; retry one by one so one bad input does not
            // fail its neighbours.
            Err(tried) => result = tried,
        }
    }
    run_each(result, run, db, inputs)
}

/// Runs `inputs` in one call of the app's `handle_batch`: the result, or, if the batch failed
/// (nothing of it applied), what the attempt counted.
fn run_together(
    run: Run<'_>,
    db: &mut rusqlite::Connection,
    inputs: &[Owned],
) -> Result<BatchResult, BatchResult> {
    let mut result = BatchResult::new();
    let all: u64 = inputs.iter().map(Owned::bytes).sum();
    let mut effects = Vec::new();
    let mut logs = String::new();
    let (r, st) = run.call(db, all, &mut effects, &mut logs, |cx| {
        let borrowed: Vec<Input<'_>> = inputs.iter().map(Owned::input).collect::<Result<_, _>>()?;
        let outs = run.app.handle_batch(cx, &borrowed)?;
        if outs.len() != inputs.len() {
            return Err(AppError::new(
                500,
                "handle_batch answered the wrong number of inputs",
            ));
        }
        outs.into_iter().map(checked).collect::<Result<Vec<_>, _>>()
    });
    if st.wrote {
        result.wrote = true;
        return Ok(result);
    }
    result.slow_calls += st.slow as u64;
    let Ok(outs) = r else {
        return Err(result);
    };
    result.set_due(st);
    result.outputs = outs.into_iter().map(Ok).collect();
    result.effects = effects;
    result.logs = logs;
    Ok(result)
}

/// Runs each of `inputs` in its own call and transaction, into `result`.
fn run_each(
    mut result: BatchResult,
    run: Run<'_>,
    db: &mut rusqlite::Connection,
    inputs: &[Owned],
) -> BatchResult {
    // What the batch's resumes may read of the log, together.
    let mut replay = TOPIC_LOG_REPLAY_BATCH_BYTES;
    for input in inputs {
        let mut mine = Vec::new();
        let mut resumed = false;
        if let Some((to, r, topic)) = input.resume() {
            match topic_log::resume(db, topic, to, (r.resume, &mut replay)) {
                Ok((first, why)) => {
                    resumed = why == Why::Resumed;
                    mine.push(first);
                }
                Err(e) if e.status == 503 && r.in_place => {
                    // A session resuming in place past the batch's replay: closed with 1013,
                    // its client reconnects with its place (a snapshot would lose frames).
                    result.resumes_refused += 1;
                    result.effects.push(Effect::TryAgain { to });
                    result.outputs.push(Ok(Output::None));
                    continue;
                }
                Err(e) => {
                    result.resumes_refused += u64::from(e.status == 503);
                    result.outputs.push(Err(e));
                    continue;
                }
            }
        }
        let (r, st) = run.call(db, input.bytes(), &mut mine, &mut result.logs, |cx| {
            let mut input = input.input()?;
            if let Input::Attach { resumed: r, .. } = &mut input {
                *r = resumed;
            }
            run.app.handle(cx, &input).and_then(checked)
        });
        if st.wrote {
            match run.on {
                On::ScratchRefusing(refusal) => {
                    result.refused += 1;
                    result.slow_calls += st.slow as u64;
                    result.outputs.push(Err(refusal.clone()));
                    continue;
                }
                On::Db | On::Scratch => {
                    result.wrote = true;
                    return result;
                }
            }
        }
        if r.is_ok() {
            result.effects.append(&mut mine);
        }
        result.note(st);
        if r.as_ref().is_err_and(AppError::is_failure) {
            result.failed.push(result.outputs.len());
        }
        result.outputs.push(r);
    }
    result
}

/// What a call's transaction must pass once the app's code ran, before it commits: the
/// call's limits, no write on a scratch database (`wrote` then set), and an alarm it set
/// known to the shard's index.
fn before_commit(
    tx: &rusqlite::Transaction<'_>,
    target: Target<'_>,
    (scratch, deletes): (bool, bool),
    budget: &mut CallBudget,
    wrote: &mut bool,
) -> Result<(), AppError> {
    let _ = budget.check_memory();
    if let Some(limit) = budget.tripped {
        return Err(limit_error(limit));
    }
    // The one point where a scratch run is told from a write: the app's code has run, the
    // transaction is still open, and nothing but the commit is left. A call that fails
    // before here is rolled back on any database and applied nothing either way.
    if scratch && writing(tx) {
        *wrote = true;
        // Dropping the transaction rolls it back: the scratch database stays as new.
        return Err(AppError::new(500, "wrote on the scratch database"));
    }
    // An alarm set: the index of the object's shard learns it, durably (a sync shared with
    // the shard's other lowers waiting, or none if the entry is due by then already), before
    // the commit makes it real (`crate::alarms`); if it cannot, the call fails and sets
    // nothing.
    if let (Some(at), Some(index)) = (budget.alarm_set, target.alarms) {
        let (_, count) = {
            let _node = sandbox::NodeSql::enter();
            crate::alarms::remaining(tx)?
        };
        index
            .lower(target.app, target.name, target.shard, at, count)
            .map_err(|e| {
                AppError::new(503, "alarm index unavailable").with_detail(e.to_string())
            })?;
    }
    // A delete is decided with the call: the mark commits in its transaction (a scratch
    // database has nothing to delete).
    if deletes && !scratch {
        let _node = sandbox::NodeSql::enter();
        crate::object_files::mark(tx)?;
    }
    Ok(())
}

/// Numbers a call's broadcasts in their topics' logs, in its transaction
/// ([`topic_log::append`]). A scratch run commits nothing, so it keeps no log: its broadcasts
/// go unnumbered.
fn log_broadcasts(
    tx: &rusqlite::Transaction<'_>,
    effects: &mut [Effect],
    scratch: bool,
    (cache, retention): (Option<&TopicCache>, Retention),
) -> Result<Appended, AppError> {
    if scratch {
        return Ok(Appended::default());
    }
    let now = crate::alarms::now_ms();
    let none = TopicCache::default();
    let cache = cache.unwrap_or(&none);
    Ok(topic_log::append(tx, effects, retention, now, cache)?)
}

/// An answer the app may give (`check_app_response`: its content type, the header fields it
/// may set): checked before the commit, so an invalid one fails its call and applies nothing.
pub(super) fn checked(out: Output) -> Result<Output, AppError> {
    if let Output::Http(resp) = &out {
        crate::app::check_app_response(resp)?;
    }
    Ok(out)
}

/// Runs an app call, turning a panic into an error: the transaction around it is rolled back
/// and the object keeps serving, instead of the panic taking the shard down.
fn guarded<T>(f: impl FnOnce() -> Result<T, AppError>) -> Result<T, AppError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err(AppError::new(500, "the app failed on this input")))
}

/// One call of an app in its own transaction, under its limits: ticks, memory (for
/// `input_bytes` of input), sends, log, the SQL watch, the host-time limit. A limit that trips
/// decides the result whatever the app returned, and the transaction is rolled back. On a
/// `scratch` database a call that has written is rolled back instead of committed
/// ([`CallStats::wrote`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn call<T>(
    target: Target<'_>,
    db: &mut rusqlite::Connection,
    limits: CallLimits,
    scratch: bool,
    input_bytes: u64,
    effects: &mut Vec<Effect>,
    logs: &mut String,
    f: impl FnOnce(&mut Cx<'_>) -> Result<T, AppError>,
) -> (Result<T, AppError>, CallStats) {
    let started = std::time::Instant::now();
    let mut budget = CallBudget::new(limits.ticks).with_memory(limits.memory_bytes, input_bytes);
    watch::begin();
    sandbox::take_denied();
    if limits.memory_bytes.is_some() {
        crate::alloc::begin();
    }
    let mut wrote = false;
    let mut logged = Logged::default();
    let first_effect = effects.len();
    let r = (|| -> Result<T, AppError> {
        let tx = db.transaction()?;
        let out = {
            let mut cx = context(target, &tx, effects, &mut budget);
            let _app = sandbox::AppSql::enter();
            guarded(|| f(&mut cx))
        };
        // A statement the node does not allow apps fails the call whatever the app made of
        // its error: rolled back, answered `sql_denied`.
        if sandbox::take_denied() {
            return Err(limit_error(Limit::SqlDenied));
        }
        let out = out?;
        let deletes = effects[first_effect..]
            .iter()
            .any(|e| matches!(e, Effect::Delete));
        before_commit(&tx, target, (scratch, deletes), &mut budget, &mut wrote)?;
        let log = log_broadcasts(
            &tx,
            &mut effects[first_effect..],
            scratch,
            (target.topics, limits.retention),
        )?;
        tx.commit()?;
        logged = log.logged;
        if let Some(cache) = target.topics {
            cache.keep(log.touched);
        }
        Ok(out)
    })();
    let interrupted = watch::end();
    crate::alloc::end();
    logs.push_str(&budget.log);
    let ran = Ran {
        started,
        interrupted,
        wrote,
        logged,
    };
    ran.told(r, &budget)
}

/// What a call's run left besides its result and budget.
struct Ran {
    started: std::time::Instant,
    /// The limit SQL was interrupted for, if any.
    interrupted: Option<Limit>,
    wrote: bool,
    logged: Logged,
}

impl Ran {
    /// The call's result as its caller is told it (a limit it tripped, or SQL was interrupted
    /// for, wins over what the app answered; else one SQLite enforces by refusing the
    /// statement, the app having seen the error and returned it), and its stats.
    fn told<T>(
        self,
        r: Result<T, AppError>,
        budget: &CallBudget,
    ) -> (Result<T, AppError>, CallStats) {
        let tripped = budget
            .tripped
            .or(self.interrupted)
            .or_else(|| r.as_ref().err().and_then(AppError::limit));
        let r = match tripped {
            Some(limit) => Err(limit_error(limit)),
            None => r,
        };
        let stats = CallStats {
            slow: self.started.elapsed() > SLOW_CALL,
            limit: tripped,
            wrote: self.wrote,
            due_moved: budget.alarm_set.is_some() && r.is_ok(),
            alarm_at: budget.first_alarm.filter(|_| r.is_ok()),
            logged: if r.is_ok() {
                self.logged
            } else {
                Logged::default()
            },
        };
        (r, stats)
    }
}

/// A call's context for `target`: its transaction `tx`, the effects and budget it adds to, the
/// object's presence and the node's users.
fn context<'c>(
    target: Target<'c>,
    tx: &'c rusqlite::Connection,
    effects: &'c mut Vec<Effect>,
    budget: &'c mut CallBudget,
) -> Cx<'c> {
    let presence = target
        .presence
        .map(|p| p as &dyn crate::app::PresenceSource);
    Cx::new(Some(tx), effects, budget)
        .with_object(target.name)
        .with_presence(presence)
        .with_users(target.users.map(|u| (u, target.app)))
}

/// Whether the connection holds a write transaction on any of its schemas (`main`, or `temp`
/// whose tables a scratch connection would otherwise carry into its next batches): SQLite's
/// own record that a statement of the open transaction wrote, or began to (an `UPDATE` that
/// matched no row counts: it opened the write transaction all the same).
fn writing(db: &rusqlite::Connection) -> bool {
    use rusqlite::ffi;
    // SAFETY: the handle is open for the borrow; a null schema name asks for the highest
    // transaction state of every schema of the connection.
    let state = unsafe { ffi::sqlite3_txn_state(db.handle(), std::ptr::null()) };
    state == ffi::SQLITE_TXN_WRITE
}

#[cfg(test)]
mod tests;
