//! lobby, in Rust with `combd-guest` (`guest/`): a room that keeps presence, as a module. The
//! node keeps who is in each room (the `presence` export) and tells its numbered sessions
//! (`combd_after=`) as they come and go; the module keeps what was said.
//!
//! - A session's text message (1 to 1,024 bytes) is stored and broadcast to the room as
//!   `{"t":"said","who":<sub or null>,"text":…}`.
//! - An attach is sent `{"t":"hello","said":[…the last 10…]}`, unless its session resumes from
//!   the room's log (it has them already).
//! - `GET /o/<app>/<room>` answers the room's members (`presence`);
//!   `GET /o/<app>/<room>?user=<sub>` where that user is among the app's rooms (`user`), or 404.
//!
//! Built by `examples/wasm/build-rust.sh` to `apps/lobby-rs.wasm`.

use combd_guest::{self as combd, Kind, Part, Value};

#[no_mangle]
pub extern "C" fn schema() -> *const u8 {
    combd::c_str(
        "CREATE TABLE IF NOT EXISTS said (id INTEGER PRIMARY KEY, who TEXT, text TEXT NOT NULL);\0",
    )
}

/// The node keeps the rooms' presence.
#[no_mangle]
pub extern "C" fn presence() -> i32 {
    1
}

/// Every session of a room is on its one topic.
#[no_mangle]
pub extern "C" fn topic() -> *const u8 {
    combd::c_str("\0")
}

/// A message: stored, then broadcast to the room.
fn say() -> Result<(), (u16, &'static str)> {
    let text = combd::input_text(Part::Body).ok_or((400, "a message is text"))?;
    if text.is_empty() || text.len() > 1024 {
        return Err((400, "a message is 1 to 1024 bytes"));
    }
    // The sender's subject (a verified token's), or none for an anonymous session.
    let who = combd::input_text(Part::Subject);
    combd::sql(
        "INSERT INTO said (who, text) VALUES (?1, ?2)",
        &[who.as_deref().map_or(Value::Null, Value::Text), Value::Text(&text)],
    )
    .map_err(|_| (500, "storage"))?;
    let who = who.map_or("null".into(), |s| combd::json_string(&s));
    let json = format!("{{\"t\":\"said\",\"who\":{who},\"text\":{}}}", combd::json_string(&text));
    combd::broadcast("", &json);
    Ok(())
}

/// An attach: the last 10 messages, unless the session resumes from the room's log.
fn hello() -> Result<(), (u16, &'static str)> {
    if combd::resumed() {
        return Ok(());
    }
    let rows = combd::sql(
        "SELECT who, text FROM (SELECT id, who, text FROM said ORDER BY id DESC LIMIT 10) ORDER BY id",
        &[],
    )
    .map_err(|_| (500, "storage"))?;
    let mut json = String::from("{\"t\":\"hello\",\"said\":[");
    for r in 0..rows.count {
        let text = |c| rows.bytes(r, c).and_then(|b| String::from_utf8(b).ok());
        if r > 0 {
            json.push(',');
        }
        let who = text(0).map_or("null".into(), |w| combd::json_string(&w));
        let said = combd::json_string(&text(1).unwrap_or_default());
        json.push_str(&format!("{{\"who\":{who},\"text\":{said}}}"));
    }
    json.push_str("]}");
    if let Some(s) = combd::session() {
        combd::send(s, &json);
    }
    Ok(())
}

/// `GET`: the room's members, or where a user is.
fn get() -> Result<(), (u16, &'static str)> {
    let method = combd::input_text(Part::Method).unwrap_or_default();
    if method != "GET" && method != "HEAD" {
        return Err((405, "GET the room's members, or ?user=<sub>"));
    }
    let query = combd::input_text(Part::Query).unwrap_or_default();
    match query.split('&').find_map(|kv| kv.strip_prefix("user=")) {
        Some(sub) => match combd::user(sub) {
            Some(json) => combd::respond(200, &json),
            None => return Err((404, "no such user")),
        },
        None => combd::respond(200, &combd::presence("")),
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn handle() -> i32 {
    let r = match combd::kind() {
        Kind::Text => say(),
        Kind::Binary => Err((400, "messages are text")),
        Kind::Attach => hello(),
        Kind::Http => get(),
        _ => Ok(()),
    };
    match r {
        Ok(()) => 0,
        Err((status, message)) => {
            combd::fail(status, message);
            1
        }
    }
}
