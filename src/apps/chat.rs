//! `chat`: rooms of messages with history and presence, for identified clients (a token,
//! README "Who the client is"). `/o/chat/<room>` upgrades to a WebSocket:
//!
//! - on attach the session gets `{"t":"hello","me":<sub>,"history":[<msg>…],"presence":[<sub>…],
//!   "last":<id>}`: the last 50 messages; with `?after=<id>`, exactly the messages after `id`
//!   (up to 1,000; past that the last 50 and `"gap":true`), so a client that reconnects with
//!   the last id it saw loses nothing and repeats nothing;
//! - `{"t":"say","text":"…"}` (1 to 4,096 bytes of text) is stored in the room's database and
//!   sent to every session of the room as `{"t":"msg","id":<n>,"from":<sub>,"name":<name>,
//!   "text":"…","at":<unix ms>}`, ids going up by one per room;
//! - who is in the room changes by `{"t":"presence","join":[…],"leave":[…]}`, one per batch (a
//!   reconnect storm is one diff), of subjects: a user with two tabs is in the room once.
//!
//! A session may get the room's broadcasts between its upgrade and its hello; the hello is the
//! room as of its attach, which includes them, so a client skips what comes before it.
//!
//! `GET /o/chat/<room>` answers `{"last":<id>,"presence":[…]}`. Presence is kept in the room's
//! database with the node's boot epoch beside each session: rows of sessions from before a
//! crash or a restart (which never detached) are dropped at the next attach or detach, so a
//! new session is never confused with an old one. The node serves a page at `/chat/`.

use std::collections::BTreeSet;

use combd_shards::app::{App, AppError, Client, Cx, Input, Message, Output, SessionId};
use combd_shards::http::Response;

use combd_kernel::limits;

/// Messages a hello carries without `?after` (`chat_history_messages`).
pub const HISTORY: i64 = limits::CHAT_HISTORY_MESSAGES as i64;
/// Most messages a resume (`?after=<id>`) sends; past it the hello says `"gap":true`
/// (`chat_resume_max_messages`).
pub const RESUME_MAX: i64 = limits::CHAT_RESUME_MAX_MESSAGES as i64;
/// Longest message text, in bytes (`chat_text_max_bytes`).
pub const TEXT_MAX_BYTES: usize = limits::CHAT_TEXT_MAX_BYTES;
/// Largest resume: a hello carrying the messages after `?after=` past this many bytes of JSON
/// carries the last 50 and `"gap":true` instead (`chat_resume_max_bytes`).
pub const RESUME_MAX_BYTES: usize = limits::CHAT_RESUME_MAX_BYTES;
/// Messages a room keeps; older ones are deleted as new ones come (`chat_retain_messages`).
pub const RETAIN: i64 = limits::CHAT_RETAIN_MESSAGES as i64;

/// The chat app.
pub struct Chat;

/// This life of the node (a random number drawn when it started, part of every session id): a
/// session's presence row from another life (a crash, a restart, another owner in a fleet)
/// carries another one.
fn epoch() -> i64 {
    SessionId::this_life() as i64
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A session as a presence key: its id, unique across the node's lives.
fn session_key(s: SessionId) -> String {
    s.to_string()
}

fn after_of(query: Option<&str>) -> Result<Option<i64>, AppError> {
    match query.and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("after="))) {
        None => Ok(None),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .map(Some)
            .ok_or_else(|| AppError::new(400, "after must be a message id (a whole number)")),
    }
}

/// The subjects in the room now.
fn present(cx: &mut Cx<'_>) -> Result<BTreeSet<String>, AppError> {
    let db = cx.db()?;
    let mut stmt = db.prepare_cached("SELECT DISTINCT sub FROM presence WHERE epoch = ?1")?;
    let subs = stmt
        .query_map([epoch()], |r| r.get::<_, String>(0))?
        .collect::<Result<BTreeSet<_>, _>>()?;
    Ok(subs)
}

fn last_id(cx: &mut Cx<'_>) -> Result<i64, AppError> {
    Ok(cx
        .db()?
        .query_row("SELECT COALESCE(MAX(id), 0) FROM messages", [], |r| {
            r.get(0)
        })?)
}

/// Messages as the protocol sends them: those with `id > after` (at most `limit`, the first
/// ones), or the last `limit`.
fn messages(
    cx: &mut Cx<'_>,
    after: Option<i64>,
    limit: i64,
) -> Result<Vec<serde_json::Value>, AppError> {
    let db = cx.db()?;
    let row = |r: &rusqlite::Row<'_>| {
        Ok(serde_json::json!({
            "t": "msg",
            "id": r.get::<_, i64>(0)?,
            "from": r.get::<_, String>(1)?,
            "name": r.get::<_, Option<String>>(2)?,
            "text": r.get::<_, String>(3)?,
            "at": r.get::<_, i64>(4)?,
        }))
    };
    let out = match after {
        Some(after) => db
            .prepare_cached(
                "SELECT id, sub, name, text, at FROM messages WHERE id > ?1 ORDER BY id LIMIT ?2",
            )?
            .query_map([after, limit], row)?
            .collect::<Result<Vec<_>, _>>()?,
        None => {
            let mut v = db
                .prepare_cached(
                    "SELECT id, sub, name, text, at FROM messages ORDER BY id DESC LIMIT ?1",
                )?
                .query_map([limit], row)?
                .collect::<Result<Vec<_>, _>>()?;
            v.reverse();
            v
        }
    };
    Ok(out)
}

/// Drops the presence of sessions from another life of the node.
fn forget_other_lives(cx: &mut Cx<'_>) -> Result<(), AppError> {
    cx.db()?
        .prepare_cached("DELETE FROM presence WHERE epoch != ?1")?
        .execute([epoch()])?;
    Ok(())
}

fn client_of(client: Option<&Client>) -> Result<&Client, AppError> {
    // The node never calls an identified app without a client.
    client.ok_or_else(|| AppError::new(401, "unauthorized"))
}

/// Handles one input; presence changes show in the caller's diff.
fn one(cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
    match input {
        Input::Http {
            method: "GET" | "HEAD",
            ..
        } => {
            let body = serde_json::json!({ "last": last_id(cx)?, "presence": present(cx)? });
            Ok(Output::Http(Response::json(200, &body)))
        }
        Input::Http { .. } => Err(AppError::method_not_allowed(
            "GET, HEAD",
            "chat over a WebSocket",
        )),
        Input::Attach {
            session,
            query,
            client,
            ..
        } => attach(cx, *session, *query, *client),
        // The chat sets no alarms.
        Input::Alarm { .. } | Input::FromObject { .. } => Ok(Output::None),
        Input::Detach { session } => {
            forget_other_lives(cx)?;
            cx.db()?
                .prepare_cached("DELETE FROM presence WHERE session = ?1")?
                .execute([session_key(*session)])?;
            Ok(Output::None)
        }
        Input::Message { session, msg } => say(cx, *session, msg),
    }
}

/// A user joins: present from now, and sent its hello with the room's recent messages, or
/// with what it missed since `after` (a resume), or with a gap and the recent ones when it
/// missed more than a resume carries.
fn attach(
    cx: &mut Cx<'_>,
    session: SessionId,
    query: Option<&str>,
    client: Option<&Client>,
) -> Result<Output, AppError> {
    let client = client_of(client)?;
    let after = after_of(query)?;
    forget_other_lives(cx)?;
    cx.db()?
        .prepare_cached(
            "INSERT OR REPLACE INTO presence (session, epoch, sub, name) VALUES (?1, ?2, ?3, ?4)",
        )?
        .execute(rusqlite::params![
            session_key(session),
            epoch(),
            client.subject,
            client.name
        ])?;
    let last = last_id(cx)?;
    let mut hello = serde_json::json!({
        "t": "hello",
        "me": client.subject,
        "presence": present(cx)?,
        "last": last,
    });
    let gap = |cx: &mut Cx<'_>, hello: &mut serde_json::Value| -> Result<String, AppError> {
        hello["history"] = messages(cx, None, HISTORY)?.into();
        hello["gap"] = true.into();
        Ok(hello.to_string())
    };
    let text = match after {
        Some(after) if last - after > RESUME_MAX => gap(cx, &mut hello)?,
        Some(after) => {
            hello["history"] = messages(cx, Some(after), RESUME_MAX)?.into();
            let text = hello.to_string();
            if text.len() > RESUME_MAX_BYTES {
                gap(cx, &mut hello)?
            } else {
                text
            }
        }
        None => {
            hello["history"] = messages(cx, None, HISTORY)?.into();
            hello.to_string()
        }
    };
    cx.send(session, &text)?;
    Ok(Output::None)
}

/// A user says something: stored (the room keeps its last `RETAIN`) and broadcast to the room.
fn say(cx: &mut Cx<'_>, session: SessionId, msg: &Message<'_>) -> Result<Output, AppError> {
    let Message::Text(text) = msg else {
        return Err(AppError::new(400, "messages are JSON text"));
    };
    let said: serde_json::Value = serde_json::from_str(text)
        .map_err(|_| AppError::new(400, "a message is JSON: {\"t\":\"say\",\"text\":\"…\"}"))?;
    if said["t"] != "say" {
        return Err(AppError::new(
            400,
            "unknown message: send {\"t\":\"say\",\"text\":\"…\"}",
        ));
    }
    let text = said["text"]
        .as_str()
        .filter(|t| !t.is_empty() && t.len() <= TEXT_MAX_BYTES)
        .ok_or_else(|| AppError::new(400, format!("text must be 1 to {TEXT_MAX_BYTES} bytes")))?;
    let (sub, name): (String, Option<String>) = cx
        .db()?
        .prepare_cached("SELECT sub, name FROM presence WHERE session = ?1 AND epoch = ?2")?
        .query_row(rusqlite::params![session_key(session), epoch()], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .map_err(|_| AppError::new(409, "not in the room: reconnect"))?;
    let at = now_ms();
    let id: i64 = cx
        .db()?
        .prepare_cached(
            "INSERT INTO messages (sub, name, text, at) VALUES (?1, ?2, ?3, ?4) RETURNING id",
        )?
        .query_row(rusqlite::params![sub, name, text, at], |r| r.get(0))?;
    // The room keeps its last RETAIN messages (a resume never asks for older ones).
    cx.db()?
        .prepare_cached("DELETE FROM messages WHERE id <= ?1")?
        .execute([id - RETAIN])?;
    let msg = serde_json::json!({
        "t": "msg", "id": id, "from": sub, "name": name, "text": text, "at": at,
    });
    cx.broadcast("room", &msg.to_string())?;
    Ok(Output::None)
}

/// Sends who joined and who left between `before` and now, if anyone did.
fn presence_diff(cx: &mut Cx<'_>, before: &BTreeSet<String>) -> Result<(), AppError> {
    let after = present(cx)?;
    let join: Vec<&String> = after.difference(before).collect();
    let leave: Vec<&String> = before.difference(&after).collect();
    if !join.is_empty() || !leave.is_empty() {
        let diff = serde_json::json!({ "t": "presence", "join": join, "leave": leave });
        cx.broadcast("room", &diff.to_string())?;
    }
    Ok(())
}

fn changes_presence(input: &Input<'_>) -> bool {
    matches!(input, Input::Attach { .. } | Input::Detach { .. })
}

impl App for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn identified(&self) -> bool {
        true
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, sub TEXT NOT NULL, \
           name TEXT, text TEXT NOT NULL, at INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS presence (session TEXT PRIMARY KEY, epoch INTEGER NOT NULL, \
           sub TEXT NOT NULL, name TEXT);"
    }

    fn handles_batch(&self) -> bool {
        true
    }

    /// The protocol above, by name, for clients that ask for it.
    fn subprotocols(&self) -> &'static [&'static str] {
        &["combd.chat.v1"]
    }

    /// A `say` of 4,096 bytes of text, escaped as JSON at worst six bytes a byte, fits.
    fn max_input_bytes(&self) -> Option<u64> {
        Some(32 * 1024)
    }

    fn topic(&self, query: Option<&str>) -> Result<String, AppError> {
        after_of(query)?;
        Ok("room".to_string())
    }

    fn page(&self) -> Option<(&'static str, &'static str)> {
        Some(("/chat/", include_str!("chat.html")))
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        let before = if changes_presence(input) {
            forget_other_lives(cx)?;
            Some(present(cx)?)
        } else {
            None
        };
        let out = one(cx, input)?;
        if let Some(before) = before {
            presence_diff(cx, &before)?;
        }
        Ok(out)
    }

    /// Inputs in order, in one transaction; one presence diff for the whole batch.
    fn handle_batch(&self, cx: &mut Cx<'_>, inputs: &[Input<'_>]) -> Result<Vec<Output>, AppError> {
        let before = if inputs.iter().any(changes_presence) {
            forget_other_lives(cx)?;
            Some(present(cx)?)
        } else {
            None
        };
        let mut outputs = Vec::with_capacity(inputs.len());
        for input in inputs {
            cx.tick()?;
            outputs.push(one(cx, input)?);
        }
        if let Some(before) = before {
            presence_diff(cx, &before)?;
        }
        Ok(outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_is_a_message_id() {
        assert_eq!(after_of(None).unwrap(), None);
        assert_eq!(after_of(Some("x=1&after=7")).unwrap(), Some(7));
        assert!(after_of(Some("after=-1")).is_err());
        assert!(after_of(Some("after=seven")).is_err());
    }
}
