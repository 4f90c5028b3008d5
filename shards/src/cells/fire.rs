//! Firing an object's due alarms within its batch (`crate::alarms` has the design): each alarm
//! in its own transaction, consumed in the transaction that runs its handler, so a crash
//! before the commit fires it again and one after does not; a handler that fails is rolled
//! back with its alarm, which waits a backoff before it fires again.

use combd_kernel::limits::ALARMS_PER_WAKE;

use crate::alarms::{self, Due};
use crate::app::{App, AppError, Output};
use crate::http::Response;
use crate::job::Owned;

use super::call::{call, checked, run_batch, BatchResult, CallLimits, On, Target};
use super::sandbox::NodeSql;

/// Runs `inputs`, whose `k`th is a wake for the object's alarms: the inputs before it, the
/// alarms due (the wake's answer says what remains), then the inputs after it.
pub(super) fn around_wake(
    app: &dyn App,
    target: Target<'_>,
    db: &mut rusqlite::Connection,
    inputs: &[Owned],
    k: usize,
    limits: CallLimits,
    on: &On,
) -> BatchResult {
    let mut result = run_batch(app, target, db, &inputs[..k], limits, on);
    if result.wrote {
        return result;
    }
    let answer = fire(app, target, db, limits, on, &mut result);
    if result.wrote {
        return result;
    }
    result.outputs.push(answer.map(Output::Http));
    let after = run_batch(app, target, db, &inputs[k + 1..], limits, on);
    result.append(after);
    result
}

/// Fires the alarms due now (at most [`ALARMS_PER_WAKE`]) into `result`; the wake's answer:
/// `{"next_ms":…,"count":…,"fired":…,"failed":…,"late_ms_max":…}` (what remains, and what
/// this wake did), for the shard to settle the index with once the batch is durable.
fn fire(
    app: &dyn App,
    target: Target<'_>,
    db: &mut rusqlite::Connection,
    limits: CallLimits,
    on: &On,
    result: &mut BatchResult,
) -> Result<Response, AppError> {
    let now = alarms::now_ms();
    let due = {
        let _node = NodeSql::enter();
        alarms::due(db, now, ALARMS_PER_WAKE)?
    };
    let scratch = !matches!(on, On::Db);
    let (mut fired, mut failed, mut late_max) = (0u64, 0u64, 0u64);
    for Due {
        id,
        at_ms,
        payload,
        tries,
    } in due
    {
        let late_ms = now.saturating_sub(at_ms);
        let input = Owned::Alarm {
            id,
            payload,
            late_ms,
        };
        let mut mine = Vec::new();
        let (r, st) = call(
            target,
            db,
            limits,
            scratch,
            input.bytes(),
            &mut mine,
            &mut result.logs,
            |cx| {
                // Consumed in the handler's own transaction: exactly once.
                let gone = {
                    let db = cx.db()?;
                    let _node = NodeSql::enter();
                    db.prepare_cached("DELETE FROM _combd_alarms WHERE id = ?1")?
                        .execute([id])?
                };
                if gone != 1 {
                    return Err(AppError::new(409, "the alarm was cancelled"));
                }
                app.handle(cx, &input.input()?).and_then(checked)
            },
        );
        if st.wrote {
            // Never on a scratch database (it has no alarms), but a run that wrote is redone.
            result.wrote = true;
            return Ok(Response::error(503, "overloaded"));
        }
        result.slow_calls += st.slow as u64;
        if let Some(l) = st.limit {
            result.killed |= l.kills();
            result.limits.push(l);
        }
        match r {
            Ok(_) => {
                result.effects.append(&mut mine);
                fired += 1;
                late_max = late_max.max(late_ms);
            }
            Err(e) => {
                // Rolled back with its alarm: tried again after a backoff.
                failed += 1;
                tracing::warn!(
                    app = target.app,
                    object = target.name,
                    alarm = id,
                    "an alarm's handler failed ({e}); it fires again later"
                );
                let _node = NodeSql::enter();
                db.prepare_cached(
                    "UPDATE _combd_alarms SET tries = tries + 1, at_ms = ?2 WHERE id = ?1",
                )?
                .execute([id, alarms::retry_at(now, tries) as i64])?;
            }
        }
        if result.killed {
            // The object is reloaded: what is left fires at the next wake.
            break;
        }
    }
    let (next, count) = {
        let _node = NodeSql::enter();
        alarms::remaining(db)?
    };
    Ok(Response::json(
        200,
        &serde_json::json!({
            "next_ms": next, "count": count, "fired": fired, "failed": failed,
            "late_ms_max": late_max,
        }),
    ))
}
