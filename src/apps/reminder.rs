//! `reminder`, the durable alarm's reference app (README "Alarms"), at `/o/reminder/<name>`:
//!
//! - `POST` with `{"in_ms":<n>,"text":"…"}` (`in_ms` 0 to a year, `text` 1 to 1,024 bytes) sets
//!   a reminder and answers `{"id":<n>,"due_ms":<unix ms>}` once it is durable: the alarm is set
//!   in the same transaction as the reminder's row;
//! - when it is due, every WebSocket on the object gets
//!   `{"t":"fired","id":<n>,"text":"…","late_ms":<n>}`, and the reminder is marked fired, in the
//!   transaction that consumes its alarm (so it fires exactly once: `fires` stays 1);
//! - `GET` answers `{"pending":[{"id","text","due_ms"}…],"fired":[{"id","text","due_ms",
//!   "fired_ms","late_ms","fires"}…]}`, the first 1,000 of each.

use combd_shards::app::{App, AppError, Cx, Input, Output};
use combd_shards::http::Response;

/// Longest reminder text, in bytes.
pub const TEXT_MAX_BYTES: usize = 1024;
/// Furthest a reminder may be set, in milliseconds: a year.
pub const IN_MAX_MS: u64 = 365 * 24 * 3600 * 1000;
/// Most reminders of each kind a `GET` lists.
pub const LIST_MAX: i64 = 1000;

/// The reminder app.
pub struct Reminder;

fn now_ms() -> u64 {
    combd_shards::alarms::now_ms()
}

fn set(cx: &mut Cx<'_>, body: &[u8]) -> Result<Output, AppError> {
    let bad = || {
        AppError::new(
            400,
            format!(
                "send {{\"in_ms\":<0 to {IN_MAX_MS}>,\"text\":\"<1 to {TEXT_MAX_BYTES} bytes>\"}}"
            ),
        )
    };
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|_| bad())?;
    let in_ms = v["in_ms"]
        .as_u64()
        .filter(|n| *n <= IN_MAX_MS)
        .ok_or_else(bad)?;
    let text = v["text"]
        .as_str()
        .filter(|t| !t.is_empty() && t.len() <= TEXT_MAX_BYTES)
        .ok_or_else(bad)?;
    let due = now_ms() + in_ms;
    let id: i64 = cx
        .db()?
        .prepare_cached("INSERT INTO reminders (text, due_ms) VALUES (?1, ?2) RETURNING id")?
        .query_row(rusqlite::params![text, due as i64], |r| r.get(0))?;
    cx.set_alarm(due, id.to_string().as_bytes())?;
    Ok(Output::Http(Response::json(
        200,
        &serde_json::json!({ "id": id, "due_ms": due }),
    )))
}

fn fired(cx: &mut Cx<'_>, payload: &[u8], late_ms: u64) -> Result<Output, AppError> {
    let id: i64 = std::str::from_utf8(payload)
        .ok()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| AppError::new(500, "an alarm without a reminder id"))?;
    let text: String = cx
        .db()?
        .prepare_cached(
            "UPDATE reminders SET fired_ms = ?2, late_ms = ?3, fires = fires + 1 WHERE id = ?1
             RETURNING text",
        )?
        .query_row(
            rusqlite::params![id, now_ms() as i64, late_ms as i64],
            |r| r.get(0),
        )?;
    let msg = serde_json::json!({ "t": "fired", "id": id, "text": text, "late_ms": late_ms });
    cx.broadcast("", &msg.to_string())?;
    Ok(Output::None)
}

fn list(cx: &mut Cx<'_>) -> Result<Output, AppError> {
    let db = cx.db()?;
    let pending = db
        .prepare_cached(
            "SELECT id, text, due_ms FROM reminders WHERE fired_ms IS NULL ORDER BY due_ms, id LIMIT ?1",
        )?
        .query_map([LIST_MAX], |r| {
            Ok(serde_json::json!({ "id": r.get::<_, i64>(0)?, "text": r.get::<_, String>(1)?,
                "due_ms": r.get::<_, i64>(2)? }))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let fired = db
        .prepare_cached(
            "SELECT id, text, due_ms, fired_ms, late_ms, fires FROM reminders
             WHERE fired_ms IS NOT NULL ORDER BY fired_ms, id LIMIT ?1",
        )?
        .query_map([LIST_MAX], |r| {
            Ok(
                serde_json::json!({ "id": r.get::<_, i64>(0)?, "text": r.get::<_, String>(1)?,
                "due_ms": r.get::<_, i64>(2)?, "fired_ms": r.get::<_, i64>(3)?,
                "late_ms": r.get::<_, i64>(4)?, "fires": r.get::<_, i64>(5)? }),
            )
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Output::Http(Response::json(
        200,
        &serde_json::json!({ "pending": pending, "fired": fired }),
    )))
}

impl App for Reminder {
    fn name(&self) -> &'static str {
        "reminder"
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS reminders (id INTEGER PRIMARY KEY, text TEXT NOT NULL,
           due_ms INTEGER NOT NULL, fired_ms INTEGER, late_ms INTEGER,
           fires INTEGER NOT NULL DEFAULT 0);"
    }

    fn handles_batch(&self) -> bool {
        true
    }

    fn max_input_bytes(&self) -> Option<u64> {
        Some(8 * 1024)
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            Input::Http {
                method: "POST",
                body,
                ..
            } => set(cx, body),
            Input::Http {
                method: "GET" | "HEAD",
                ..
            } => list(cx),
            Input::Http { .. } => Err(AppError::method_not_allowed(
                "GET, HEAD, POST",
                "POST a reminder, GET the list",
            )),
            Input::Alarm {
                payload, late_ms, ..
            } => fired(cx, payload, *late_ms),
            Input::Attach { .. }
            | Input::Detach { .. }
            | Input::Message { .. }
            | Input::FromObject { .. } => Ok(Output::None),
        }
    }
}
