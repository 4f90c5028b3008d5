//! What the node makes an object do within its batch (`crate::alarms` has the design): fire its
//! due alarms, each in its own transaction, consumed in the transaction that runs its handler,
//! so a crash before the commit fires it again and one after does not (a handler that fails is
//! rolled back with its alarm, which waits a backoff before it fires again); send the messages
//! at the head of its outbox; take a message from another object exactly once; and drop a
//! delivered message from its outbox.

use combd_kernel::limits::ALARMS_PER_WAKE;

use rusqlite::OptionalExtension;

use crate::alarms::{self, Due};
use crate::app::{AppError, Effect, Output};
use crate::http::Response;
use crate::job::Owned;

use super::call::{checked, run_batch, BatchResult, On, Run};
use crate::sandbox::NodeSql;

/// Runs a batch's inputs: the app's in batches ([`run_batch`]), and what the node makes (an
/// alarm wake, a message from another object, a delivery's acknowledgement) where it stands
/// among them, apart from the app's batch.
pub(super) fn run_inputs(
    run: Run<'_>,
    db: &mut rusqlite::Connection,
    inputs: &[Owned],
) -> BatchResult {
    match inputs.iter().position(Owned::is_node_input) {
        Some(k) => around(run, db, inputs, k),
        None => run_batch(run, db, inputs),
    }
}

/// Runs `inputs`, whose `k`th the node made: the inputs before it, it, then the inputs after
/// it.
fn around(run: Run<'_>, db: &mut rusqlite::Connection, inputs: &[Owned], k: usize) -> BatchResult {
    let mut result = run_batch(run, db, &inputs[..k]);
    if result.wrote {
        return result;
    }
    let answer = match &inputs[k] {
        Owned::FromObject {
            app: from,
            name,
            id,
            body,
            ..
        } => take(run, db, &mut result, (from, name, *id, body)),
        Owned::Delivered { app: to, name, id } => delivered(db, &mut result, to, name, *id)
            .map(|()| Output::None)
            .map_err(AppError::from),
        _ => fire(run, db, &mut result).map(Output::Http),
    };
    if result.wrote {
        return result;
    }
    result.due_moved = true;
    result.outputs.push(answer);
    let after = run_inputs(run, db, &inputs[k + 1..]);
    result.append(after);
    result
}

/// Fires the alarms due now (at most [`ALARMS_PER_WAKE`]) into `result`; the wake's answer:
/// `{"next_ms":…,"count":…,"fired":…,"failed":…,"late_ms_max":…}` (what remains, and what
/// this wake did), for the shard to settle the index with once the batch is durable.
fn fire(
    run: Run<'_>,
    db: &mut rusqlite::Connection,
    result: &mut BatchResult,
) -> Result<Response, AppError> {
    let now = alarms::now_ms();
    let due = {
        let _node = NodeSql::enter();
        alarms::due(db, now, ALARMS_PER_WAKE)?
    };
    let (mut fired, mut failed, mut late_max) = (0u64, 0u64, 0u64);
    for alarm in due {
        match fire_one(run, &mut *db, result, alarm, now)? {
            // Never on a scratch database (it has no alarms), but a run that wrote is redone.
            Fired::Wrote => return Ok(Response::overloaded()),
            Fired::Done { late_ms } => {
                fired += 1;
                late_max = late_max.max(late_ms);
            }
            Fired::Failed => failed += 1,
            Fired::Cancelled => {}
        }
        if result.killed {
            // The object is reloaded: what is left fires at the next wake.
            break;
        }
    }
    if !run.scratch() {
        send_heads(db, now, result)?;
    }
    // Taken as what remains is read: a call that lowers the index after it wins.
    let mark = run.target.alarms.map_or(0, |ix| ix.mark(run.target.shard));
    let (next, count) = {
        let _node = NodeSql::enter();
        alarms::remaining(db)?
    };
    Ok(Response::json(
        200,
        &serde_json::json!({
            "next_ms": next, "count": count, "fired": fired, "failed": failed,
            "late_ms_max": late_max, "mark": mark,
        }),
    ))
}

/// What firing one alarm came to.
enum Fired {
    /// Its handler committed, `late_ms` past its time.
    Done { late_ms: u64 },
    /// It was cancelled before it fired.
    Cancelled,
    /// Its handler failed: rolled back with its alarm, which is tried again after a backoff.
    Failed,
    /// The run wrote where it may not (a scratch database): the batch is redone.
    Wrote,
}

/// Fires `alarm` in its own transaction, consumed in the one that runs its handler.
fn fire_one(
    run: Run<'_>,
    db: &mut rusqlite::Connection,
    result: &mut BatchResult,
    alarm: Due,
    now: u64,
) -> Result<Fired, AppError> {
    let Run { app, target, .. } = run;
    let Due {
        id,
        at_ms,
        payload,
        tries,
    } = alarm;
    let late_ms = now.saturating_sub(at_ms);
    let input = Owned::Alarm {
        id,
        payload,
        late_ms,
    };
    let mut mine = Vec::new();
    let (r, st) = run.call(db, input.bytes(), &mut mine, &mut result.logs, |cx| {
        // Consumed in the handler's own transaction: exactly once.
        let gone = {
            let db = cx.db()?;
            let _node = NodeSql::enter();
            db.prepare("DELETE FROM _combd_alarms WHERE id = ?1")?
                .execute([id])?
        };
        if gone != 1 {
            return Err(AppError::new(409, "the alarm was cancelled"));
        }
        app.handle(cx, &input.input()?).and_then(checked)
    });
    if st.wrote {
        result.wrote = true;
        return Ok(Fired::Wrote);
    }
    result.note(st);
    match r {
        Ok(_) => {
            result.effects.append(&mut mine);
            Ok(Fired::Done { late_ms })
        }
        Err(e) if e.status == 409 && e.message == "the alarm was cancelled" => Ok(Fired::Cancelled),
        Err(e) => {
            tracing::warn!(
                app = target.app,
                object = target.name,
                alarm = id,
                "an alarm's handler failed ({e}); it fires again later"
            );
            let _node = NodeSql::enter();
            db.prepare("UPDATE _combd_alarms SET tries = tries + 1, at_ms = ?2 WHERE id = ?1")?
                .execute([id, alarms::retry_at(now, tries) as i64])?;
            Ok(Fired::Failed)
        }
    }
}

/// Sends the messages at the head of the outbox that are due (one per receiver: they arrive in
/// order), each to be sent again after a backoff unless its delivery is acknowledged first.
fn send_heads(
    db: &rusqlite::Connection,
    now: u64,
    result: &mut BatchResult,
) -> rusqlite::Result<()> {
    let _node = NodeSql::enter();
    for h in alarms::heads(db, now, ALARMS_PER_WAKE)? {
        resend_later(db, h.id, now, h.tries)?;
        result.effects.push(Effect::ToObject {
            app: h.app,
            name: h.name,
            id: h.id,
            body: h.body,
        });
    }
    Ok(())
}

/// Marks outbox message `id` to be sent again after a backoff (its `tries`-th).
fn resend_later(db: &rusqlite::Connection, id: i64, now: u64, tries: u32) -> rusqlite::Result<()> {
    db.prepare("UPDATE _combd_outbox SET tries = tries + 1, next_ms = ?2 WHERE id = ?1")?
        .execute([id, alarms::retry_at(now, tries) as i64])?;
    Ok(())
}

/// The receiver `to/name` took message `id`: it leaves the outbox, and the next one for that
/// receiver goes out.
fn delivered(
    db: &rusqlite::Connection,
    result: &mut BatchResult,
    to: &str,
    name: &str,
    id: i64,
) -> rusqlite::Result<()> {
    let _node = NodeSql::enter();
    if !alarms::has(db, "_combd_outbox")? {
        return Ok(());
    }
    db.prepare("DELETE FROM _combd_outbox WHERE id = ?1")?
        .execute([id])?;
    let next: Option<(i64, Vec<u8>, i64)> = db
        .prepare(
            "SELECT id, body, tries FROM _combd_outbox WHERE app = ?1 AND name = ?2 ORDER BY id LIMIT 1",
        )?
        .query_row([to, name], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    if let Some((next, body, tries)) = next {
        resend_later(db, next, alarms::now_ms(), tries.clamp(0, 64) as u32)?;
        result.effects.push(Effect::ToObject {
            app: to.to_string(),
            name: name.to_string(),
            id: next,
            body,
        });
    }
    Ok(())
}

/// Takes message `id` from object `from/name`: once. In the call's own transaction the
/// receiver records it as the sender's last taken; one it took before (a delivery sent again
/// after a crash, or before its acknowledgement came back) is answered without calling the
/// app. Answers 200 once taken.
fn take(
    run: Run<'_>,
    db: &mut rusqlite::Connection,
    result: &mut BatchResult,
    (from, name, id, body): (&str, &str, i64, &[u8]),
) -> Result<Output, AppError> {
    let (app, on) = (run.app, run.on);
    let input = Owned::FromObject {
        app: from.to_string(),
        name: name.to_string(),
        id,
        body: body.to_vec(),
        passed: false,
    };
    let mut mine = Vec::new();
    let (r, st) = run.call(db, input.bytes(), &mut mine, &mut result.logs, |cx| {
        let fresh = {
            let db = cx.db()?;
            let _node = NodeSql::enter();
            db.execute_batch(alarms::INBOX)?;
            let last: Option<i64> = db
                .prepare("SELECT last_id FROM _combd_inbox WHERE app = ?1 AND name = ?2")?
                .query_row([from, name], |r| r.get(0))
                .optional()?;
            let fresh = last.is_none_or(|l| id > l);
            if fresh {
                db.prepare(
                    "INSERT INTO _combd_inbox (app, name, last_id) VALUES (?1, ?2, ?3)
                         ON CONFLICT (app, name) DO UPDATE SET last_id = excluded.last_id",
                )?
                .execute(rusqlite::params![from, name, id])?;
            }
            fresh
        };
        if fresh {
            app.handle(cx, &input.input()?).and_then(checked)?;
        }
        Ok(fresh)
    });
    if st.wrote {
        // On a scratch database that may not become the object's: the message is refused (the
        // sender sends it again later); else the run is redone on the object's database.
        if let On::ScratchRefusing(refusal) = on {
            result.refused += 1;
            return Err(refusal.clone());
        }
        result.wrote = true;
        return Ok(Output::None);
    }
    result.note(st);
    let fresh = r?;
    result.effects.append(&mut mine);
    Ok(Output::Http(Response::json(
        200,
        &serde_json::json!({ "taken": fresh }),
    )))
}
