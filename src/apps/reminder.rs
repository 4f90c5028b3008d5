//! `reminder`, the durable alarm's reference app (README "Alarms"), at `/o/reminder/<name>`:
//!
//! - `POST` with `{"in_ms":<n>,"text":"…"}` (`in_ms` 0 to a year, `text` 1 to 1,024 bytes) sets
//!   a reminder and answers `{"id":<n>,"due_ms":<unix ms>}` once it is durable: the alarm is set
//!   in the same transaction as the reminder's row. An object holds at most
//!   [`REMINDERS_PENDING_MAX`] pending (else `507 too many reminders`), and one client (its
//!   address, an IPv6 /64) at most [`REMINDERS_PER_CLIENT_MAX`] of them (else `429`);
//! - when it is due, every WebSocket on the object gets
//!   `{"t":"fired","id":<n>,"text":"…","late_ms":<n>}`, and the reminder is marked fired, in the
//!   transaction that consumes its alarm (so it fires exactly once: `fires` stays 1); that
//!   transaction also deletes the fired reminders older than the newest
//!   [`REMINDERS_FIRED_KEPT`];
//! - `GET` answers `{"pending":[{"id","text","due_ms"}…],"fired":[{"id","text","due_ms",
//!   "fired_ms","late_ms","fires"}…],"pending_count":<n>,"fired_count":<n>,"more":<bool>}`: the
//!   pending earliest first, then the fired newest first, as many as fit in
//!   [`REMINDER_LIST_MAX_BYTES`] (and [`LIST_MAX`] of each); `more` says some were left out.

use combd_kernel::fair::ClientKey;
use combd_kernel::limits::{
    REMINDERS_FIRED_KEPT, REMINDERS_PENDING_MAX, REMINDERS_PER_CLIENT_MAX, REMINDER_LIST_MAX_BYTES,
};
use combd_shards::app::{App, AppError, Caller, Cx, Input, Output};
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

/// Who a reminder's quota counts it to: its client's address (an IPv4 address, an IPv6 /64),
/// as the node's pools count clients.
fn client_of(caller: &Caller) -> String {
    caller
        .addr
        .map_or_else(|| "unknown".to_string(), |ip| ClientKey::of(ip).to_string())
}

/// Refuses a new reminder past the object's bound, or its client's.
fn check_room(db: &rusqlite::Connection, client: &str) -> Result<(), AppError> {
    let pending: i64 = db
        .prepare_cached("SELECT count(*) FROM reminders WHERE fired_ms IS NULL")?
        .query_row([], |r| r.get(0))?;
    if pending as usize >= REMINDERS_PENDING_MAX {
        return Err(AppError::new(
            507,
            format!("too many reminders: {REMINDERS_PENDING_MAX} pending (reminders_pending_max)"),
        ));
    }
    let mine: i64 = db
        .prepare_cached("SELECT count(*) FROM reminder_clients WHERE client = ?1")?
        .query_row([client], |r| r.get(0))?;
    if mine as usize >= REMINDERS_PER_CLIENT_MAX {
        return Err(AppError::new(
            429,
            format!(
                "too many reminders from your address: {REMINDERS_PER_CLIENT_MAX} pending on this object (reminders_per_client_max)"
            ),
        ));
    }
    Ok(())
}

fn set(cx: &mut Cx<'_>, body: &[u8], caller: &Caller) -> Result<Output, AppError> {
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
    let client = client_of(caller);
    let db = cx.db()?;
    check_room(db, &client)?;
    let id: i64 = db
        .prepare_cached("INSERT INTO reminders (text, due_ms) VALUES (?1, ?2) RETURNING id")?
        .query_row(rusqlite::params![text, due as i64], |r| r.get(0))?;
    db.prepare_cached("INSERT INTO reminder_clients (id, client) VALUES (?1, ?2)")?
        .execute(rusqlite::params![id, client])?;
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
    let db = cx.db()?;
    let text: String = db
        .prepare_cached(
            "UPDATE reminders SET fired_ms = ?2, late_ms = ?3, fires = fires + 1 WHERE id = ?1
             RETURNING text",
        )?
        .query_row(
            rusqlite::params![id, now_ms() as i64, late_ms as i64],
            |r| r.get(0),
        )?;
    // No longer pending: off its client's quota; and the fired kept are the newest only.
    db.prepare_cached("DELETE FROM reminder_clients WHERE id = ?1")?
        .execute([id])?;
    db.prepare_cached(
        "DELETE FROM reminders WHERE id IN (SELECT id FROM reminders WHERE fired_ms IS NOT NULL
           ORDER BY fired_ms DESC, id DESC LIMIT -1 OFFSET ?1)",
    )?
    .execute([REMINDERS_FIRED_KEPT as i64])?;
    let msg = serde_json::json!({ "t": "fired", "id": id, "text": text, "late_ms": late_ms });
    cx.broadcast("", &msg.to_string())?;
    Ok(Output::None)
}

/// Rows of `sql` (bound to [`LIST_MAX`]) as JSON, while they fit in `room` bytes (taken from
/// it); whether any was left out.
fn fill(
    db: &rusqlite::Connection,
    sql: &str,
    room: &mut usize,
    row: impl Fn(&rusqlite::Row<'_>) -> rusqlite::Result<serde_json::Value>,
) -> Result<(Vec<serde_json::Value>, bool), AppError> {
    let mut stmt = db.prepare_cached(sql)?;
    let mut rows = stmt.query([LIST_MAX + 1])?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        let v = row(r)?;
        // Its bytes as the answer writes it, and a comma.
        let len = serde_json::to_vec(&v).map_or(usize::MAX, |b| b.len() + 1);
        if out.len() as i64 == LIST_MAX || len > *room {
            return Ok((out, true));
        }
        *room -= len;
        out.push(v);
    }
    Ok((out, false))
}

fn list(cx: &mut Cx<'_>) -> Result<Output, AppError> {
    let db = cx.db()?;
    let count = |sql: &str| -> rusqlite::Result<i64> {
        db.prepare_cached(sql)?.query_row([], |r| r.get(0))
    };
    let pending_count = count("SELECT count(*) FROM reminders WHERE fired_ms IS NULL")?;
    let fired_count = count("SELECT count(*) FROM reminders WHERE fired_ms IS NOT NULL")?;
    // What the answer says besides the lists: well under a kilobyte.
    let mut room = REMINDER_LIST_MAX_BYTES - 256;
    let (pending, more_pending) = fill(
        db,
        "SELECT id, text, due_ms FROM reminders WHERE fired_ms IS NULL ORDER BY due_ms, id LIMIT ?1",
        &mut room,
        |r| {
            Ok(serde_json::json!({ "id": r.get::<_, i64>(0)?, "text": r.get::<_, String>(1)?,
                "due_ms": r.get::<_, i64>(2)? }))
        },
    )?;
    let (fired, more_fired) = fill(
        db,
        "SELECT id, text, due_ms, fired_ms, late_ms, fires FROM reminders
         WHERE fired_ms IS NOT NULL ORDER BY fired_ms DESC, id DESC LIMIT ?1",
        &mut room,
        |r| {
            Ok(
                serde_json::json!({ "id": r.get::<_, i64>(0)?, "text": r.get::<_, String>(1)?,
                "due_ms": r.get::<_, i64>(2)?, "fired_ms": r.get::<_, i64>(3)?,
                "late_ms": r.get::<_, i64>(4)?, "fires": r.get::<_, i64>(5)? }),
            )
        },
    )?;
    Ok(Output::Http(Response::json(
        200,
        &serde_json::json!({ "pending": pending, "fired": fired, "pending_count": pending_count,
            "fired_count": fired_count, "more": more_pending || more_fired }),
    )))
}

impl App for Reminder {
    fn name(&self) -> &'static str {
        "reminder"
    }

    fn expiry(&self) -> Option<std::time::Duration> {
        Some(combd_kernel::limits::REMINDER_EXPIRY)
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS reminders (id INTEGER PRIMARY KEY, text TEXT NOT NULL,
           due_ms INTEGER NOT NULL, fired_ms INTEGER, late_ms INTEGER,
           fires INTEGER NOT NULL DEFAULT 0);
         CREATE INDEX IF NOT EXISTS reminders_fired ON reminders (fired_ms);
         CREATE TABLE IF NOT EXISTS reminder_clients (id INTEGER PRIMARY KEY,
           client TEXT NOT NULL);
         CREATE INDEX IF NOT EXISTS reminder_clients_client ON reminder_clients (client);"
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
                caller,
                ..
            } => set(cx, body, caller),
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
