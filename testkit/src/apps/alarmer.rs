//! `alarmer` (test app, served only by `combd-test-node`): sets alarms and records each
//! one's firing, for the tests of durable alarms.
//!
//! - `POST /o/alarmer/<name>?n=<k>&in_ms=<ms>[&step_ms=<ms>][&fail=1][&tamper=1]` sets `k`
//!   alarms, the i-th due `in_ms + i × step_ms` from now, payload `<tag>:<i>` (`tag`: the
//!   object's name unless `&tag=` says), and answers
//!   their ids; `fail=1` then fails the call (nothing set); `tamper=1` tries to delete the
//!   node's alarm table with the app's own SQL (denied).
//! - `POST …?cancel=<id>` cancels an alarm: `{"cancelled":true|false}`; `&payload_bytes=<b>`
//!   sets alarms with payloads of `b` bytes.
//! - `POST …?send=<n>&bytes=<b>` queues n messages of b bytes to an object of an app that does
//!   not exist (they stay in the outbox).
//! - `POST …?broken=1|0`: while broken, every alarm's handler fails (rolled back, so its alarm
//!   fires again later).
//! - An alarm: `fires` of its payload goes up by one, in the transaction that consumes it.
//! - `GET` answers `{"fired":<payloads fired>,"twice":<fired more than once>,"fires":<sum>,
//!   "late_ms_p50","late_ms_p99","late_ms_max"}` (how late they fired, for `bench/alarms.sh`).

use combd_shards::app::{App, AppError, Cx, Input, Output};
use combd_shards::http::Response;

use super::query_param;

/// The alarmer app.
pub struct Alarmer;

fn num(query: Option<&str>, key: &str) -> Result<Option<u64>, AppError> {
    query_param(query, key)
        .map(|v| {
            v.parse()
                .map_err(|_| AppError::new(400, format!("{key} must be a number")))
        })
        .transpose()
}

fn post(cx: &mut Cx<'_>, query: Option<&str>) -> Result<Output, AppError> {
    if let Some(b) = num(query, "broken")? {
        cx.db()?
            .execute("UPDATE state SET broken = ?1", [b as i64])?;
        return Ok(Output::Http(Response::json(
            200,
            &serde_json::json!({ "broken": b }),
        )));
    }
    if let Some(id) = num(query, "cancel")? {
        let was = cx.cancel_alarm(id as i64)?;
        return Ok(Output::Http(Response::json(
            200,
            &serde_json::json!({ "cancelled": was }),
        )));
    }
    if let Some(n) = num(query, "send")? {
        // n messages of `bytes` bytes to an object of an app that does not exist: they wait in
        // the outbox (for the tests of its bounds).
        let body = vec![b'm'; num(query, "bytes")?.unwrap_or(1) as usize];
        for _ in 0..n {
            cx.tick()?;
            cx.send_to_object("nosuchapp", "sink", &body)?;
        }
        return Ok(Output::Http(Response::json(
            200,
            &serde_json::json!({ "sent": n }),
        )));
    }
    if query_param(query, "tamper").is_some() {
        cx.db()?.execute("DELETE FROM _combd_alarms", [])?;
    }
    let n = num(query, "n")?.unwrap_or(1);
    let in_ms = num(query, "in_ms")?.unwrap_or(0);
    let step = num(query, "step_ms")?.unwrap_or(0);
    let name = query_param(query, "tag")
        .unwrap_or(cx.object().unwrap_or(""))
        .to_string();
    let now = combd_shards::alarms::now_ms();
    let mut ids = Vec::new();
    for i in 0..n {
        cx.tick()?;
        let mut payload = format!("{name}:{i}").into_bytes();
        if let Some(b) = num(query, "payload_bytes")? {
            payload.resize(b as usize, b'p');
        }
        ids.push(cx.set_alarm(now + in_ms + i * step, &payload)?);
    }
    if query_param(query, "fail").is_some() {
        return Err(AppError::new(500, "failed on purpose"));
    }
    Ok(Output::Http(Response::json(
        200,
        &serde_json::json!({ "ids": ids }),
    )))
}

impl App for Alarmer {
    fn name(&self) -> &'static str {
        "alarmer"
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS fired (payload TEXT PRIMARY KEY, fires INTEGER NOT NULL,
           late_ms INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS state (broken INTEGER NOT NULL);
         INSERT INTO state SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM state);"
    }

    fn handles_batch(&self) -> bool {
        true
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            Input::Http {
                method: "POST",
                query,
                ..
            } => post(cx, *query),
            Input::Http { .. } => {
                let db = cx.db()?;
                let (fired, twice, fires): (i64, i64, i64) = db.query_row(
                    "SELECT count(*), count(*) FILTER (WHERE fires > 1), COALESCE(sum(fires), 0) FROM fired",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )?;
                let late: Vec<i64> = db
                    .prepare("SELECT late_ms FROM fired ORDER BY late_ms")?
                    .query_map([], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                let at = |q: f64| {
                    late.get(((late.len() as f64 - 1.0) * q).round() as usize)
                        .copied()
                };
                Ok(Output::Http(Response::json(
                    200,
                    &serde_json::json!({ "fired": fired, "twice": twice, "fires": fires,
                        "late_ms_p50": at(0.5), "late_ms_p99": at(0.99), "late_ms_max": late.last() }),
                )))
            }
            Input::Alarm {
                payload, late_ms, ..
            } => {
                let db = cx.db()?;
                let broken: i64 = db.query_row("SELECT broken FROM state", [], |r| r.get(0))?;
                if broken != 0 {
                    return Err(AppError::new(500, "broken on purpose"));
                }
                db.execute(
                    "INSERT INTO fired (payload, fires, late_ms) VALUES (?1, 1, ?2)
                     ON CONFLICT (payload) DO UPDATE SET fires = fires + 1",
                    rusqlite::params![String::from_utf8_lossy(payload), *late_ms as i64],
                )?;
                Ok(Output::None)
            }
            Input::Attach { .. }
            | Input::Detach { .. }
            | Input::Message { .. }
            | Input::FromObject { .. } => Ok(Output::None),
        }
    }
}
