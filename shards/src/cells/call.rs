//! One call of an app, under its limits, and a batch of calls in one transaction. Runs on a
//! blocking thread, never on the shard's loop.

use combd_kernel::limits::SLOW_CALL;

use crate::app::{limit_error, App, AppError, CallBudget, Cx, Effect, Input, Output};
use crate::job::Owned;
use crate::limit::Limit;

use super::sandbox;
use super::store::watch;

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
}

/// What [`call`] tells the object about a call besides its result.
#[derive(Debug, Default, Clone, Copy)]
struct CallStats {
    /// It took longer than [`SLOW_CALL`].
    slow: bool,
    /// Which limit tripped, if any.
    limit: Option<Limit>,
    /// On a scratch database: the call had written when it was about to commit, and was
    /// rolled back instead.
    wrote: bool,
}

/// The limits of every call of one batch.
#[derive(Debug, Clone, Copy)]
pub(super) struct CallLimits {
    /// `COMBD_CPU_LIMIT_TICKS`.
    pub ticks: u64,
    /// The app's `memory_kb`, in bytes.
    pub memory_bytes: Option<u64>,
}

/// Runs inputs in one transaction (a batch), or each in its own when the batch fails, the app
/// takes one at a time, or the run refuses writes ([`On::ScratchRefusing`]).
pub(super) fn run_batch(
    app: &dyn App,
    object: &str,
    db: &mut rusqlite::Connection,
    inputs: &[Owned],
    limits: CallLimits,
    on: &On,
) -> BatchResult {
    let mut result = BatchResult {
        outputs: Vec::new(),
        effects: Vec::new(),
        logs: String::new(),
        killed: false,
        slow_calls: 0,
        limits: Vec::new(),
        wrote: false,
        refused: 0,
        failed: Vec::new(),
    };
    let scratch = !matches!(on, On::Db);
    if inputs.len() > 1 && !matches!(on, On::ScratchRefusing(_)) {
        let all: u64 = inputs.iter().map(Owned::bytes).sum();
        let mut effects = Vec::new();
        let mut logs = String::new();
        let (r, st) = call(
            object,
            db,
            limits,
            scratch,
            all,
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
                outs.into_iter().map(checked).collect::<Result<Vec<_>, _>>()
            },
        );
        if st.wrote {
            result.wrote = true;
            return result;
        }
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
            object,
            db,
            limits,
            scratch,
            input.bytes(),
            &mut mine,
            &mut result.logs,
            |cx| app.handle(cx, &input.input()?).and_then(checked),
        );
        if st.wrote {
            match on {
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
        result.slow_calls += st.slow as u64;
        if let Some(l) = st.limit {
            result.killed |= l.kills();
            result.limits.push(l);
        }
        if r.as_ref().is_err_and(AppError::is_failure) {
            result.failed.push(result.outputs.len());
        }
        result.outputs.push(r);
    }
    result
}

/// An answer the app may give (`check_app_response`: its content type, the header fields it
/// may set): checked before the commit, so an invalid one fails its call and applies nothing.
fn checked(out: Output) -> Result<Output, AppError> {
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
fn call<T>(
    object: &str,
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
    let r = (|| -> Result<T, AppError> {
        let tx = db.transaction()?;
        let out = {
            let mut cx = Cx::new(Some(&tx), effects, &mut budget).with_object(object);
            let _app = sandbox::AppSql::enter();
            guarded(|| f(&mut cx))
        };
        // A statement the node does not allow apps fails the call whatever the app made of
        // its error: rolled back, answered `sql_denied`.
        if sandbox::take_denied() {
            return Err(limit_error(Limit::SqlDenied));
        }
        let out = out?;
        let _ = budget.check_memory();
        if let Some(limit) = budget.tripped {
            return Err(limit_error(limit));
        }
        // The one point where a scratch run is told from a write: the app's code has run, the
        // transaction is still open, and nothing but the commit is left. A call that fails
        // before here is rolled back on any database and applied nothing either way.
        if scratch && writing(&tx) {
            wrote = true;
            // Dropping the transaction rolls it back: the scratch database stays as new.
            return Err(AppError::new(500, "wrote on the scratch database"));
        }
        tx.commit()?;
        Ok(out)
    })();
    let interrupted = watch::end();
    crate::alloc::end();
    logs.push_str(&budget.log);
    // A limit the call tripped or SQL was interrupted for; else one SQLite enforces by
    // refusing the statement (the app saw the error and returned it).
    let tripped = budget
        .tripped
        .or(interrupted)
        .or_else(|| r.as_ref().err().and_then(AppError::limit));
    let r = match tripped {
        Some(limit) => Err(limit_error(limit)),
        None => r,
    };
    let stats = CallStats {
        slow: started.elapsed() > SLOW_CALL,
        limit: tripped,
        wrote,
    };
    (r, stats)
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::store::{self, StoreConfig};
    use super::*;
    use crate::http::Response;

    const NO_LIMITS: CallLimits = CallLimits {
        ticks: u64::MAX,
        memory_bytes: None,
    };

    fn open(name: &str, schema: &'static str) -> rusqlite::Connection {
        let path = std::env::temp_dir().join(format!("combd-{name}-{}.sqlite", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let config = StoreConfig {
            db_max_bytes: 1 << 30,
            schema,
            fleet: false,
        };
        store::open(&path, config).unwrap()
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
            forwarded: false,
            client: None,
            caller: Default::default(),
        }
    }

    #[test]
    fn a_failed_batch_applies_nothing_then_runs_one_by_one() {
        let mut db = open("batch", Log.schema());
        let inputs = [http("a"), http("bad"), http("b")];
        let r = run_batch(&Log, "o", &mut db, &inputs, NO_LIMITS, &On::Db);
        assert!(matches!(&r.outputs[0], Ok(Output::Http(resp)) if resp.status == 200));
        assert_eq!(r.outputs[1].as_ref().unwrap_err().status, 400);
        assert!(r.outputs[2].is_ok());
        assert!(
            r.failed.is_empty(),
            "a 4xx is the app's refusal, not a failure"
        );
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
        let r = run_batch(
            &Log,
            "o",
            &mut db,
            &[http("c"), http("d")],
            NO_LIMITS,
            &On::Db,
        );
        assert!(r.outputs.iter().all(|o| o.is_ok()));
        assert_eq!(r.effects.len(), 2);
    }

    /// `GET` reads, `POST` inserts a row, `NOOP` updates no row, `TEMP` inserts a row and tries
    /// a temp table,
    /// `BAD` inserts then fails; each broadcasts what it did.
    struct Notes;

    impl App for Notes {
        fn name(&self) -> &'static str {
            "notes"
        }
        fn schema(&self) -> &'static str {
            "CREATE TABLE IF NOT EXISTS notes (v TEXT NOT NULL);"
        }
        fn handles_batch(&self) -> bool {
            true
        }
        fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
            let Input::Http { method, .. } = input else {
                return Ok(Output::None);
            };
            let db = cx.db()?;
            match *method {
                "POST" | "BAD" => {
                    db.execute("INSERT INTO notes (v) VALUES ('x')", [])?;
                }
                "NOOP" => {
                    db.execute("UPDATE notes SET v = v WHERE 0", [])?;
                }
                "TEMP" => {
                    db.execute("INSERT INTO notes (v) VALUES ('x')", [])?;
                    // A temp table (a file outside the data directory) is not allowed apps;
                    // this app swallows the error.
                    let _ = db.execute_batch(
                        "CREATE TEMP TABLE IF NOT EXISTS t (x); INSERT INTO t VALUES (1);",
                    );
                }
                _ => {}
            }
            let n: i64 = db.query_row("SELECT COUNT(*) FROM notes", [], |r| r.get(0))?;
            cx.broadcast("t", method)?;
            if *method == "BAD" {
                return Err(AppError::new(400, "bad"));
            }
            Ok(Output::Http(Response::json(
                200,
                &serde_json::json!({ "n": n }),
            )))
        }
    }

    fn method(m: &str) -> Owned {
        Owned::Http {
            method: m.into(),
            query: None,
            body: Vec::new(),
            forwarded: false,
            client: None,
            caller: Default::default(),
        }
    }

    fn scratch(schema: &'static str) -> rusqlite::Connection {
        let config = StoreConfig {
            db_max_bytes: 1 << 30,
            schema,
            fleet: false,
        };
        store::open_scratch(std::path::Path::new("scratch"), config).unwrap()
    }

    fn notes(db: &rusqlite::Connection) -> i64 {
        db.query_row("SELECT COUNT(*) FROM notes", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn a_batch_that_reads_on_scratch_is_answered_and_leaves_it_as_new() {
        let mut db = scratch(Notes.schema());
        // A failed write applied nothing: it is answered too.
        let inputs = [method("GET"), method("BAD"), method("GET")];
        let r = run_batch(&Notes, "o", &mut db, &inputs, NO_LIMITS, &On::Scratch);
        assert!(!r.wrote);
        assert!(matches!(&r.outputs[0], Ok(Output::Http(resp)) if resp.status == 200));
        assert_eq!(r.outputs[1].as_ref().unwrap_err().status, 400);
        assert_eq!(
            r.effects.len(),
            2,
            "the reads' broadcasts, not the failed write's"
        );
        assert_eq!(notes(&db), 0);
    }

    #[test]
    fn a_write_on_scratch_stops_the_batch_and_is_rolled_back() {
        for (inputs, what) in [
            (vec![method("GET"), method("POST")], "an insert in a batch"),
            (vec![method("POST")], "an insert alone"),
            (vec![method("NOOP")], "an update of no row"),
            (
                vec![method("BAD"), method("POST")],
                "a write after a failed batch",
            ),
        ] {
            let mut db = scratch(Notes.schema());
            let r = run_batch(&Notes, "o", &mut db, &inputs, NO_LIMITS, &On::Scratch);
            assert!(r.wrote, "{what}");
            assert_eq!(notes(&db), 0, "{what}: nothing of it stays");
            // The scratch database is as new: a read after it is answered from it.
            let r = run_batch(
                &Notes,
                "o",
                &mut db,
                &[method("GET")],
                NO_LIMITS,
                &On::Scratch,
            );
            assert!(!r.wrote && r.outputs[0].is_ok(), "{what}");
        }
    }

    #[test]
    fn refusing_writes_on_scratch_answers_the_reads_and_refuses_the_writes() {
        let mut db = scratch(Notes.schema());
        let refusal = AppError::new(507, "too many objects");
        let inputs = [method("GET"), method("POST"), method("GET")];
        let on = On::ScratchRefusing(refusal.clone());
        let r = run_batch(&Notes, "o", &mut db, &inputs, NO_LIMITS, &on);
        assert!(!r.wrote);
        assert_eq!(r.refused, 1);
        assert!(
            r.failed.is_empty(),
            "the node's own refusal is no failure of the app"
        );
        assert!(r.outputs[0].is_ok() && r.outputs[2].is_ok());
        assert_eq!(r.outputs[1].as_ref().unwrap_err(), &refusal);
        assert_eq!(r.effects.len(), 2, "the refused write sends nothing");
        assert_eq!(notes(&db), 0);
    }

    #[test]
    fn on_the_database_a_write_commits() {
        let mut db = open("notes", Notes.schema());
        let r = run_batch(&Notes, "o", &mut db, &[method("POST")], NO_LIMITS, &On::Db);
        assert!(!r.wrote && r.outputs[0].is_ok());
        assert_eq!(notes(&db), 1);
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
        let mut db = open("panic", Panics.schema());
        let inputs = [http("ok"), http("panic"), http("ok")];
        let r = run_batch(&Panics, "o", &mut db, &inputs, NO_LIMITS, &On::Db);
        assert!(r.outputs[0].is_ok() && r.outputs[2].is_ok());
        assert_eq!(r.outputs[1].as_ref().unwrap_err().status, 500);
        assert_eq!(r.failed, [1], "the panic is a failure the node warns about");
        let n: i64 = db
            .query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 2);
    }

    #[test]
    fn a_tripped_limit_decides_the_result_and_kills_the_call() {
        let mut db = open("ticks", Panics.schema());
        let limits = CallLimits {
            ticks: 10,
            memory_bytes: None,
        };
        // Each db() is a host call of 1,000 ticks: past 10 at once.
        let r = run_batch(&Panics, "o", &mut db, &[http("ok")], limits, &On::Db);
        assert_eq!(r.outputs[0].as_ref().unwrap_err().message, "cpu_limit");
        assert_eq!(r.limits, [Limit::Cpu]);
        assert_eq!(r.failed, [0]);
        assert!(r.killed);
    }

    /// SQL the node does not allow apps fails the call with `sql_denied` whatever the app made
    /// of its error, and what the call wrote before it is rolled back; the calls around it
    /// commit.
    #[test]
    fn sql_apps_may_not_run_fails_the_call_and_rolls_it_back() {
        let mut db = open("denied", Notes.schema());
        let inputs = [method("POST"), method("TEMP"), method("POST")];
        let r = run_batch(&Notes, "o", &mut db, &inputs, NO_LIMITS, &On::Db);
        assert!(r.outputs[0].is_ok() && r.outputs[2].is_ok());
        let e = r.outputs[1].as_ref().unwrap_err();
        assert_eq!(e.limit(), Some(Limit::SqlDenied));
        assert_eq!(notes(&db), 2, "the denied call's insert was rolled back");
        let temp: i64 = db
            .query_row("SELECT COUNT(*) FROM temp.sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert_eq!(temp, 0, "no temp table");
    }
}
