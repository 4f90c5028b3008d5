//! `chat`: rooms of messages with history, for identified clients (a token, README "Who the
//! client is"), on the node's realtime primitives. `/o/chat/<room>` upgrades to a WebSocket;
//! a client that keeps its place (`combd_after`, README "Resuming a WebSocket") resumes from
//! the room's log and is told who is in the room (the node's presence, README "Presence"):
//!
//! - on attach the session gets `{"t":"hello","me":<sub>,"history":[<msg>…],"last":<id>}`, the
//!   room's last 50 messages, unless it resumes (the node replays what it missed, in order,
//!   none twice: it needs no hello);
//! - `{"t":"say","text":"…"}` (1 to 4,096 bytes of text) is stored in the room's database and
//!   broadcast to the room as `{"t":"msg","id":<n>,"from":<sub>,"name":<name>,"text":"…",
//!   "at":<unix ms>}`, ids going up by one per room;
//! - who is in the room is the node's presence of its topic `room` (members are subjects: a
//!   user with two tabs is one member, with two devices).
//!
//! A session may get the room's broadcasts between its upgrade and its hello; the hello is the
//! room as of its attach, which includes them, so a client skips what comes before it.
//!
//! `GET /o/chat/<room>` answers `{"last":<id>,"presence":[<sub>…]}`; with `?user=<sub>`, where
//! that user is among the rooms (`{"user":…,"rooms":[{"room":…,"devices":n,"since":ms}],
//! "last_seen":ms|null}`, the node's record of users across rooms). The node serves a page at
//! `/chat/`.

use combd_shards::app::{App, AppError, Client, Cx, Input, Message, Output};
use combd_shards::http::Response;

use combd_kernel::limits;

/// Messages a hello carries (`chat_history_messages`).
pub const HISTORY: i64 = limits::CHAT_HISTORY_MESSAGES as i64;
/// Longest message text, in bytes (`chat_text_max_bytes`).
pub const TEXT_MAX_BYTES: usize = limits::CHAT_TEXT_MAX_BYTES;
/// Messages a room keeps; older ones are deleted as new ones come (`chat_retain_messages`).
pub const RETAIN: i64 = limits::CHAT_RETAIN_MESSAGES as i64;
/// The topic every session of a room is subscribed to.
const TOPIC: &str = "room";

/// The chat app.
pub struct Chat;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn last_id(cx: &mut Cx<'_>) -> Result<i64, AppError> {
    Ok(cx
        .db()?
        .query_row("SELECT COALESCE(MAX(id), 0) FROM messages", [], |r| {
            r.get(0)
        })?)
}

/// The room's last `HISTORY` messages, as the protocol sends them, oldest first.
fn recent(cx: &mut Cx<'_>) -> Result<Vec<serde_json::Value>, AppError> {
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
    let mut v = cx
        .db()?
        .prepare_cached("SELECT id, sub, name, text, at FROM messages ORDER BY id DESC LIMIT ?1")?
        .query_map([HISTORY], row)?
        .collect::<Result<Vec<_>, _>>()?;
    v.reverse();
    Ok(v)
}

fn client_of(client: Option<&Client>) -> Result<&Client, AppError> {
    // The node never calls an identified app without a client.
    client.ok_or_else(|| AppError::new(401, "unauthorized"))
}

/// Handles one input.
fn one(cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
    match input {
        Input::Http {
            method: "GET" | "HEAD",
            query,
            ..
        } => {
            if let Some(sub) =
                query.and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("user=")))
            {
                let sub = percent_decoded(sub)
                    .ok_or_else(|| AppError::new(400, "user must be a URL-encoded subject"))?;
                return Ok(Output::Http(Response::json(200, &user(cx, &sub)?)));
            }
            let (members, _) = cx.presence(TOPIC)?;
            let subs: Vec<String> = members.into_iter().map(|m| m.who).collect();
            let body = serde_json::json!({ "last": last_id(cx)?, "presence": subs });
            Ok(Output::Http(Response::json(200, &body)))
        }
        Input::Http { .. } => Err(AppError::method_not_allowed(
            "GET, HEAD",
            "chat over a WebSocket",
        )),
        Input::Attach {
            session,
            client,
            resumed,
            ..
        } => {
            let client = client_of(*client)?;
            // A session that resumes is sent what it missed by the node: no hello.
            if !resumed {
                let hello = serde_json::json!({
                    "t": "hello",
                    "me": client.subject,
                    "history": recent(cx)?,
                    "last": last_id(cx)?,
                });
                cx.send(*session, &hello.to_string())?;
            }
            Ok(Output::None)
        }
        // The chat sets no alarms, and keeps nothing for a session: presence is the node's.
        Input::Alarm { .. } | Input::FromObject { .. } | Input::Detach { .. } => Ok(Output::None),
        Input::Message { client, msg, .. } => say(cx, client_of(*client)?, msg),
    }
}

/// `text` with its `%XX` escapes decoded, if they are all valid and make UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let (bytes, mut out, mut i) = (text.as_bytes(), Vec::with_capacity(text.len()), 0);
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Where user `sub` is among the chat's rooms (on how many devices, since when), and when it was
/// last in a room of the node: `{"user":…,"rooms":[{"room":…,"devices":n,"since":ms}],
/// "last_seen":ms|null}`; a user the node does not know: 404.
fn user(cx: &mut Cx<'_>, sub: &str) -> Result<serde_json::Value, AppError> {
    let seen = cx
        .user(sub)?
        .ok_or_else(|| AppError::new(404, "no such user seen"))?;
    let rooms: Vec<serde_json::Value> = seen
        .places
        .iter()
        .filter(|p| p.topic == TOPIC)
        .map(|p| serde_json::json!({ "room": p.object, "devices": p.devices, "since": p.since_ms }))
        .collect();
    Ok(serde_json::json!({ "user": sub, "rooms": rooms, "last_seen": seen.last_seen_ms }))
}

/// A user says something: stored (the room keeps its last `RETAIN`) and broadcast to the room.
fn say(cx: &mut Cx<'_>, client: &Client, msg: &Message<'_>) -> Result<Output, AppError> {
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
    let (sub, name) = (&client.subject, &client.name);
    let at = now_ms();
    let id: i64 = cx
        .db()?
        .prepare_cached(
            "INSERT INTO messages (sub, name, text, at) VALUES (?1, ?2, ?3, ?4) RETURNING id",
        )?
        .query_row(rusqlite::params![sub, name, text, at], |r| r.get(0))?;
    // The room keeps its last RETAIN messages.
    cx.db()?
        .prepare_cached("DELETE FROM messages WHERE id <= ?1")?
        .execute([id - RETAIN])?;
    let msg = serde_json::json!({
        "t": "msg", "id": id, "from": sub, "name": name, "text": text, "at": at,
    });
    cx.broadcast(TOPIC, &msg.to_string())?;
    Ok(Output::None)
}

impl App for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn identified(&self) -> bool {
        true
    }

    /// Who is in the room: the node keeps it (README "Presence").
    fn presence(&self) -> bool {
        true
    }

    /// Its messages; a room made before presence was the node's drops the table it kept it in.
    fn expiry(&self) -> Option<std::time::Duration> {
        Some(combd_kernel::limits::CHAT_ROOM_EXPIRY)
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS messages (id INTEGER PRIMARY KEY, sub TEXT NOT NULL, \
           name TEXT, text TEXT NOT NULL, at INTEGER NOT NULL);
         DROP TABLE IF EXISTS presence;"
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

    fn topic(&self, _query: Option<&str>) -> Result<String, AppError> {
        Ok(TOPIC.to_string())
    }

    fn page(&self) -> Option<(&'static str, &'static str)> {
        Some(("/chat/", include_str!("chat.html")))
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        one(cx, input)
    }

    /// Inputs in order, in one transaction.
    fn handle_batch(&self, cx: &mut Cx<'_>, inputs: &[Input<'_>]) -> Result<Vec<Output>, AppError> {
        let mut outputs = Vec::with_capacity(inputs.len());
        for input in inputs {
            cx.tick()?;
            outputs.push(one(cx, input)?);
        }
        Ok(outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_in_the_query_is_url_decoded() {
        assert_eq!(percent_decoded("alice").as_deref(), Some("alice"));
        assert_eq!(percent_decoded("a%40b.c").as_deref(), Some("a@b.c"));
        assert_eq!(percent_decoded("%C3%A9").as_deref(), Some("é"));
        assert_eq!(percent_decoded("%4"), None);
        assert_eq!(percent_decoded("%zz"), None);
        assert_eq!(percent_decoded("%FF"), None, "not UTF-8");
    }
}
