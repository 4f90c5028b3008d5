//! The batch and call runner on real SQLite files.

#![allow(clippy::unwrap_used)]

use super::super::store::{self, StoreConfig};
use super::super::topic_log::seqs;
use super::*;
use crate::http::Response;

fn no_limits() -> CallLimits {
    CallLimits {
        ticks: u64::MAX,
        memory_bytes: None,
        retention: Retention::node(),
    }
}

const TEST_TARGET: Target<'static> = Target::bare("t", "o");

/// `run_batch` on the test object, without limits.
fn batch(app: &dyn App, db: &mut rusqlite::Connection, inputs: &[Owned], on: &On) -> BatchResult {
    run_batch(
        Run {
            app,
            target: TEST_TARGET,
            limits: no_limits(),
            on,
        },
        db,
        inputs,
    )
}

fn open(name: &str, schema: &'static str) -> rusqlite::Connection {
    let path = std::env::temp_dir().join(format!("combd-{name}-{}.sqlite", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let config = StoreConfig {
        db_max_bytes: 1 << 30,
        schema,
        fleet: false,
        backup: false,
        migrate: None,
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
    let r = batch(&Log, &mut db, &inputs, &On::Db);
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
            _ => String::new(),
        })
        .collect();
    assert_eq!(sent, ["a", "b"]);

    // What committed was numbered in its topic's log, with nothing of what was rolled back
    // (the failed batch's try, the failed input).
    assert_eq!(seqs(&r.effects), [1, 2]);
    assert_eq!(r.logged.frames, 2);

    // A batch that succeeds is one transaction with every effect.
    let r = batch(&Log, &mut db, &[http("c"), http("d")], &On::Db);
    assert!(r.outputs.iter().all(|o| o.is_ok()));
    assert_eq!(r.effects.len(), 2);
    assert_eq!(seqs(&r.effects), [3, 4]);
    let kept: Vec<(i64, Vec<u8>)> = db
        .prepare("SELECT key & 1099511627775, payload FROM _combd_log ORDER BY key")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let want: Vec<(i64, Vec<u8>)> = vec![
        (1, b"a".to_vec()),
        (2, b"b".to_vec()),
        (3, b"c".to_vec()),
        (4, b"d".to_vec()),
    ];
    assert_eq!(kept, want, "the log holds what viewers were sent, in order");

    // A scratch run keeps no log: its broadcasts go unnumbered.
    let mut scratch = open("batch-scratch", Log.schema());
    let r = batch(&Echo, &mut scratch, &[http("e")], &On::Scratch);
    assert!(!r.wrote);
    assert_eq!(seqs(&r.effects), [0]);
}

/// Broadcasts its input, writing nothing.
struct Echo;

impl App for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }
    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        if let Input::Http { body, .. } = input {
            cx.broadcast("t", &String::from_utf8_lossy(body))?;
        }
        Ok(Output::None)
    }
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
        backup: false,
        migrate: None,
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
    let r = batch(&Notes, &mut db, &inputs, &On::Scratch);
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
        let r = batch(&Notes, &mut db, &inputs, &On::Scratch);
        assert!(r.wrote, "{what}");
        assert_eq!(notes(&db), 0, "{what}: nothing of it stays");
        // The scratch database is as new: a read after it is answered from it.
        let r = batch(&Notes, &mut db, &[method("GET")], &On::Scratch);
        assert!(!r.wrote && r.outputs[0].is_ok(), "{what}");
    }
}

#[test]
fn refusing_writes_on_scratch_answers_the_reads_and_refuses_the_writes() {
    let mut db = scratch(Notes.schema());
    let refusal = AppError::new(507, "too many objects");
    let inputs = [method("GET"), method("POST"), method("GET")];
    let on = On::ScratchRefusing(refusal.clone());
    let r = batch(&Notes, &mut db, &inputs, &on);
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
    let r = batch(&Notes, &mut db, &[method("POST")], &On::Db);
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
    let r = batch(&Panics, &mut db, &inputs, &On::Db);
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
        retention: Retention::node(),
    };
    // Each db() is a host call of 1,000 ticks: past 10 at once.
    let run = Run {
        app: &Panics,
        target: TEST_TARGET,
        limits,
        on: &On::Db,
    };
    let r = run_batch(run, &mut db, &[http("ok")]);
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
    let r = batch(&Notes, &mut db, &inputs, &On::Db);
    assert!(r.outputs[0].is_ok() && r.outputs[2].is_ok());
    let e = r.outputs[1].as_ref().unwrap_err();
    assert_eq!(e.limit(), Some(Limit::SqlDenied));
    assert_eq!(notes(&db), 2, "the denied call's insert was rolled back");
    let temp: i64 = db
        .query_row("SELECT COUNT(*) FROM temp.sqlite_master", [], |r| r.get(0))
        .unwrap();
    assert_eq!(temp, 0, "no temp table");
}
