//! One batch of an object: taken from its mailbox under an awake slot and run on a blocking
//! thread, on the object's database, or while the object is absent on its scratch database.
//!
//! An absent object's batch runs on the scratch database first ([`On::Scratch`]). If no call
//! of it committed a write there, it is answered from that run: nothing was written, so
//! nothing is synced and no file is made. If one did (SQLite held a write transaction when
//! the call was about to commit, and that call was rolled back), the run is dropped whole (its
//! answers, sends, broadcasts, logs and counts) and the batch runs again on the object's
//! database, created for it ([`super::super::create`]): the object is present from then on. If
//! creating is refused, the batch runs again on the scratch database one input at a time
//! ([`On::ScratchRefusing`]): each input that writes is refused, the others are answered.

use std::rc::Rc;
use std::sync::atomic::Ordering;

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::HTTP_OBJECT_PIPELINE;

use crate::app::{AppError, Output};
use crate::backup::object::ObjectBackup;
use crate::http::Reserved;
use crate::inbound::Hold;
use crate::job::{Owned, Reply};
use crate::state::blocking::Work;
use crate::state::log_budget::warn_app_errors_suppressed;
use crate::state::ShardState;
use crate::stats::{ShardStats, Stage};

use super::super::call::{BatchResult, CallLimits, On, Run, Target};
use super::super::commit::Committed;
use super::super::create::create;
use super::super::fire::run_inputs;
use super::super::presence;
use super::super::store::{Store, Wal};
use super::super::{Cells, Refusal};
use super::{ObjectCell, Queued};

/// What running a batch on a blocking thread gave.
struct Ran {
    result: BatchResult,
    /// The WAL to sync before answering: none on a scratch database (or before the first
    /// write).
    wal: Option<Wal>,
    /// In a fleet: the WAL's length right after the batch committed.
    wal_len: u64,
    /// In a fleet, when the batch may have moved it: when the object next has something due.
    due: Option<Option<u64>>,
}

/// What a batch asks of its object's task once it is handed to the commit task.
pub(super) struct After {
    /// A call was killed: the object is reloaded from its database.
    pub killed: bool,
    /// A call that committed deleted the object (`cx.delete()`).
    pub deleted: bool,
}

impl After {
    /// What `result` asks: a reload if a call was killed, a delete if one asked.
    fn of(result: &BatchResult) -> After {
        After {
            killed: result.killed,
            deleted: result
                .effects
                .iter()
                .any(|e| matches!(e, crate::app::Effect::Delete)),
        }
    }
}

/// Takes a batch from the mailbox under an awake slot and runs it (in a fleet, noting the WAL's
/// length at `fleet_wal` after its commit). Returns the store (present once a write created
/// the database), the committed batch (its answers and effects, to leave once it is durable),
/// and what the object's task is to do next ([`After`]).
pub(super) async fn run_one(
    cells: &Rc<Cells>,
    cell: &Rc<ObjectCell>,
    store: Store,
    fleet_wal: Option<std::path::PathBuf>,
) -> (Store, Committed, After) {
    let state = &cells.state;
    let stats = state.stats();
    let permit = state.acquire_awake().await;
    let Taken {
        inputs,
        replies,
        holds,
        askers,
        first_at,
    } = take_batch(cells, cell);
    let count = inputs.len() as u64;
    let moves = match cell.app.presence() {
        true => presence::moves(&inputs, askers.iter().map(|a| a.key)),
        false => Vec::new(),
    };
    let (store, ran) = match store {
        Store::Present(db) => {
            let (db, _, ran) = run_on(cells, cell, db, inputs, On::Db, fleet_wal).await;
            drop(permit);
            (Store::Present(db), ran)
        }
        Store::Absent(scratch) => {
            let (scratch, inputs, ran) =
                run_on(cells, cell, scratch, inputs, On::Scratch, None).await;
            drop(permit);
            if ran.result.wrote {
                write_absent(cells, cell, scratch, inputs, fleet_wal).await
            } else {
                (Store::Absent(scratch), ran)
            }
        }
    };
    // The inputs' bytes were held against their connections' inbound budgets until they ran.
    drop(holds);
    let mut ran = ran;
    reserve_answers(state, &askers, &mut ran.result.outputs);
    let result = &mut ran.result;
    cells
        .presence
        .apply(&cell.key, moves, &result.outputs, &mut result.effects);
    file_result(state, cell, &ran.result);
    ShardStats::add(&stats.batches, 1);
    stats.batch_max.fetch_max(count, Ordering::Relaxed);
    let after = After::of(&ran.result);
    if let Some(at) = ran.result.alarm_at {
        // An alarm due before the shard's next tick fires on time, not at the tick.
        cells.alarm_wakes().arm(cells, at);
    }
    let committed = Committed {
        replies,
        outputs: ran.result.outputs,
        effects: ran.result.effects,
        wal: ran.wal,
        wal_len: ran.wal_len,
        due: ran.due,
        first_input_at: first_at,
        committed_at: std::time::Instant::now(),
    };
    (store, committed, after)
}

/// The next batch: its inputs, where their answers go, their bytes held against their
/// connections' inbound budgets, who asked each, and when the first of them arrived.
struct Taken {
    inputs: Vec<Owned>,
    replies: Vec<Reply>,
    holds: Vec<Hold>,
    askers: Vec<Asker>,
    first_at: Option<std::time::Instant>,
}

/// Who asked for an input, and whether its answer may be refused after it ran: a read's
/// (`GET`, `HEAD`) may, as nothing of it was applied; any other request's answer is delivered
/// whatever its size (its effect is committed: a 503 would have its client do it again), its
/// bytes still counted to its client, who is then refused before its next requests run.
#[derive(Clone, Copy)]
struct Asker {
    key: ClientKey,
    read: bool,
}

/// Takes the next batch from the mailbox: what waits, up to the app's batch, and up to a
/// client's share of it ([`batch_end`]). A request of a client that holds its share of the
/// node's answers already (it reads nothing of them) is refused at once (503 `overloaded`):
/// its answer is never made.
fn take_batch(cells: &Cells, cell: &ObjectCell) -> Taken {
    let state = &cells.state;
    let n = if cell.app.handles_batch() {
        cell.app.batch().max(1)
    } else {
        1
    };
    let jobs: Vec<Queued> = {
        let mut mb = cell.mailbox.borrow_mut();
        let k = batch_end(&mb, n, state.settings().client_share_max_percent);
        mb.drain(..k).collect()
    };
    if let Some(oldest) = jobs.first() {
        let age = oldest.at.elapsed().as_millis() as u64;
        state
            .stats()
            .mailbox_oldest_age_ms
            .fetch_max(age, Ordering::Relaxed);
    }
    let first_at = jobs.first().map(|q| q.at);
    let stages = &state.stats().stages;
    let answers = &state.node().pools.answers;
    let mut taken = Taken {
        inputs: Vec::with_capacity(jobs.len()),
        replies: Vec::with_capacity(jobs.len()),
        holds: Vec::with_capacity(jobs.len()),
        askers: Vec::with_capacity(jobs.len()),
        first_at,
    };
    for q in jobs {
        stages.record(Stage::Mailbox, q.at.elapsed());
        let job = q.job;
        if matches!(job.reply, Reply::Http(_)) && answers.over_share(job.asker) {
            cells.refuse(job, Refusal::AnswersHeld);
            continue;
        }
        let read =
            matches!(&job.input, Owned::Http { method, .. } if method == "GET" || method == "HEAD");
        taken.askers.push(Asker {
            key: job.asker,
            read,
        });
        taken.holds.extend(job.hold);
        taken.inputs.push(job.input);
        taken.replies.push(job.reply);
    }
    taken
}

/// How many of the mailbox's first jobs make the next batch (none when the first is the
/// operator's delete): at most `n`, up to the first delete, and at most
/// `max_percent` of `n` HTTP requests of any one client held to shares (never fewer than one
/// connection's pipeline, [`HTTP_OBJECT_PIPELINE`]), so one client's burst of requests is
/// several batches, each of whose answers is reserved before the next is made. The batch ends
/// before the first request past its client's part, keeping the mailbox's order.
fn batch_end(mailbox: &std::collections::VecDeque<Queued>, n: usize, max_percent: u64) -> usize {
    let part = ((n as u64 * max_percent / 100) as usize).max(HTTP_OBJECT_PIPELINE);
    let mut counts: Vec<(ClientKey, usize)> = Vec::new();
    for (i, q) in mailbox.iter().take(n).enumerate() {
        if q.job.is_lifecycle() {
            // The operator's delete is the object's task's, after the batch before it.
            return i;
        }
        let asker = q.job.asker;
        if !asker.is_shared() || !matches!(q.job.reply, Reply::Http(_)) {
            continue;
        }
        match counts.iter_mut().find(|(k, _)| *k == asker) {
            Some((_, c)) if *c == part => return i.max(1),
            Some((_, c)) => *c += 1,
            None => counts.push((asker, 1)),
        }
    }
    n.min(mailbox.len())
}

/// Reserves each HTTP answer's bytes for the client that asked, before the answer waits for
/// its sync and its connection (`crate::fair`, pool `answer_bytes`): a read's answer past its
/// client's share is dropped at once and answered 503 `overloaded` instead; another request's
/// is counted past it ([`Asker`]).
fn reserve_answers(state: &ShardState, askers: &[Asker], outputs: &mut [Result<Output, AppError>]) {
    let answers = &state.node().pools.answers;
    for (out, asker) in outputs.iter_mut().zip(askers) {
        let Ok(Output::Http(resp)) = out else {
            continue;
        };
        let bytes = resp.body.len() as u64;
        match answers.take(asker.key, bytes) {
            Ok(share) => resp.reserved = Reserved::new(share),
            Err(_) if !asker.read => resp.reserved = Reserved::new(answers.force(asker.key, bytes)),
            Err(_) => *out = Err(Refusal::AnswersHeld.app_error()),
        }
    }
}

/// A batch that wrote on an absent object's scratch database (that run is dropped): creates
/// the object's database and runs the batch on it (in a fleet, noting the WAL's length at
/// `fleet_wal`, so the schema and the batch ship as the object's first segments); if creating is refused, runs it one input
/// at a time on the scratch database, each input that writes refused (and counted).
async fn write_absent(
    cells: &Rc<Cells>,
    cell: &Rc<ObjectCell>,
    scratch: rusqlite::Connection,
    inputs: Vec<Owned>,
    fleet_wal: Option<std::path::PathBuf>,
) -> (Store, Ran) {
    let state = &cells.state;
    let (path, config) = cell.store_config(state);
    match create(cells, cell, path, config).await {
        Ok(db) => {
            drop(scratch);
            let permit = state.acquire_awake().await;
            let (db, _, ran) = run_on(cells, cell, db, inputs, On::Db, fleet_wal).await;
            drop(permit);
            (Store::Present(db), ran)
        }
        Err(refusal) => {
            let permit = state.acquire_awake().await;
            let on = On::ScratchRefusing(refusal.app_error());
            let (scratch, _, ran) = run_on(cells, cell, scratch, inputs, on, None).await;
            drop(permit);
            let stats = state.stats();
            let counter = match refusal {
                Refusal::TooManyObjects => Some(&stats.objects_refused_count),
                Refusal::CreateRate => Some(&stats.objects_refused_rate),
                _ => None,
            };
            if let Some(counter) = counter {
                ShardStats::add(counter, ran.result.refused);
            }
            (Store::Absent(scratch), ran)
        }
    }
}

/// Runs `inputs` on `db` on a blocking thread; gives back the connection and the inputs (to
/// run again when a scratch run wrote).
async fn run_on(
    cells: &Cells,
    cell: &ObjectCell,
    db: rusqlite::Connection,
    inputs: Vec<Owned>,
    on: On,
    fleet_wal: Option<std::path::PathBuf>,
) -> (rusqlite::Connection, Vec<Owned>, Ran) {
    let state = &cells.state;
    let app = cell.app.clone();
    let limits = CallLimits::of(state, app.as_ref());
    let syncs = crate::cells::commit::syncs_wal(state);
    // The object's own name (its key is `app/name`), for `Cx::object`.
    let name = cell.key.name().to_string();
    let alarms = state.node().alarms.clone();
    let shard = state.id();
    let stages = [Stage::BatchToThread, Stage::BatchRun, Stage::BatchBack];
    // What the object knows of its topics' logs goes with its connection, and comes back.
    let topics = cell.topics.take();
    let presence = cells.presence.view(&cell.key);
    let users = state.node().users.clone();
    let backing_up = (
        cell.backup.take(),
        state.node().backup.clone(),
        cell.key.clone(),
    );
    let (db, inputs, ran, topics, backed_up) = state
        .on_thread_timed((cell.opened_by(), Work::Compute), stages, move || {
            let mut db = db;
            let target = Target {
                app: app.name(),
                name: &name,
                shard,
                alarms: Some(&alarms),
                topics: Some(&topics),
                presence: presence.as_ref(),
                users: Some(&users),
            };
            let run = Run::new(app.as_ref(), target, limits, &on);
            let result = run_inputs(run, &mut db, &inputs);
            let backed_up = match on {
                On::Db => back_up(backing_up, &db),
                On::Scratch | On::ScratchRefusing(_) => backing_up.0,
            };
            // A scratch database has nothing to make durable: it is answered without a sync.
            let wal = match on {
                On::Db if syncs => Wal::of(&db),
                On::Db | On::Scratch | On::ScratchRefusing(_) => None,
            };
            // In a fleet, the WAL's length once the batch committed bounds what its shipment
            // reads.
            let fleet = fleet_wal.is_some();
            let wal_len = fleet_wal.map_or(0, |p| std::fs::metadata(p).map_or(0, |m| m.len()));
            let due =
                (fleet && matches!(on, On::Db) && result.due_moved).then(|| due_after(&db, &name));
            let ran = Ran {
                result,
                wal,
                wal_len,
                due,
            };
            (db, inputs, ran, topics, backed_up)
        })
        .await;
    cell.topics.set(topics);
    cell.backup.set(backed_up);
    (db, inputs, ran)
}

/// Reads what a batch committed on the object's database `db` into its backup (with backup on),
/// started now for a database the batch created. Blocks.
fn back_up(
    (ob, backup, key): (
        Option<Box<ObjectBackup>>,
        Option<std::sync::Arc<crate::backup::Backup>>,
        crate::object_key::ObjectKey,
    ),
    db: &rusqlite::Connection,
) -> Option<Box<ObjectBackup>> {
    let backup = backup?;
    let mut ob = match ob {
        Some(ob) => ob,
        None => {
            let path = std::path::PathBuf::from(db.path()?);
            Box::new(ObjectBackup::open(&backup, &key, &path, db))
        }
    };
    ob.after_batch(db);
    Some(ob)
}

/// In a fleet, what the fleet's wake index is to say once a batch that moved what the object
/// has due is the head: when its next alarm or message is due.
fn due_after(db: &rusqlite::Connection, name: &str) -> Option<u64> {
    let _node = crate::sandbox::NodeSql::enter();
    match crate::alarms::remaining(db) {
        Ok((next, _)) => next,
        Err(e) => {
            // Said due now: the index may be early, never late.
            tracing::warn!(object = %name, "cannot read what the object has due: {e}");
            Some(crate::alarms::now_ms())
        }
    }
}

/// Logs a batch's output, warns of its failed calls, and counts its slow calls and tripped
/// limits.
fn file_result(state: &ShardState, cell: &ObjectCell, result: &BatchResult) {
    let key = &cell.key;
    for line in result.logs.lines() {
        tracing::info!(object = %key, "{line}");
    }
    let stats = state.stats();
    ShardStats::add(&stats.slow_calls, result.slow_calls);
    ShardStats::add(&stats.topic_log_frames, result.logged.frames);
    ShardStats::add(&stats.topic_log_trimmed, result.logged.trimmed);
    ShardStats::add(&stats.topic_log_resumes_refused, result.resumes_refused);
    for l in &result.limits {
        ShardStats::add(l.counter(stats), 1);
    }
    let object = key.name();
    for &i in &result.failed {
        if let Some(Err(e)) = result.outputs.get(i) {
            warn_failed(state, cell.app.name(), object, e);
        }
    }
}

/// Warns of a call that failed (a trap, a SQL error, a limit), within the shard's budget of
/// such warnings (past it counted in `app_errors_log_suppressed`, and summed up once its
/// window is over).
fn warn_failed(state: &ShardState, app: &str, object: &str, e: &AppError) {
    let (log, suppressed) = state.app_errors().take(state.now_ms());
    if suppressed > 0 {
        warn_app_errors_suppressed(state.id(), suppressed);
    }
    if !log {
        return ShardStats::add(&state.stats().app_errors_log_suppressed, 1);
    }
    tracing::warn!(
        shard = state.id(),
        app = %app,
        object = %object,
        status = e.status,
        error = %e.message,
        detail = e.detail().map(tracing::field::display),
        "call failed"
    );
}
