//! `caller` (test app, served only by `combd-test-node`): a public app that says what the
//! node told it of its caller, and answers with header fields of its own.
//!
//! - It declares two request header fields, `x-request-id` and `accept-language` (and, as a
//!   careless app might, `authorization`, `cookie` and `sec-websocket-protocol`, which the
//!   node never hands an app), and a CORS
//!   policy taking pages of `http://pages.example` (with the user's cookies) and nothing else.
//! - `POST /o/caller/<name>[/<rest>]` records the call in the object's database and answers
//!   `{"addr":…,"origin":…,"rest":…,"headers":[[name,value]…],"calls":<n>,"object":<name>}` with `set-cookie` and
//!   `cache-control`. With `?bad=split` (a value with CR LF) or `?bad=field` (a field an app
//!   may not set) the answer is invalid: the node fails the call (500) and nothing of it is
//!   applied. `?type=<content type>` answers plain text of that type.
//! - `GET` answers the same without recording (`calls` as it stands); `GET …?go=<path>` answers
//!   a 302 to it.
//! - A WebSocket's attach sends `{"t":"hello","session":…,"life":…,"addr":…,"origin":…,
//!   "rest":…,"headers":[[name,value]…]}`; a message `to:<life>:<shard>:<id>` sends
//!   `{"t":"poke"}` to that session, any other is answered `{"t":"seen"}`.

use combd_shards::app::{App, AppError, Caller, Cors, Cx, Input, Output, SessionId};
use combd_shards::http::Response;

/// The caller app.
pub struct CallerApp;

fn told(caller: &Caller) -> serde_json::Value {
    let headers: Vec<[&str; 2]> = caller.headers.iter().map(|(n, v)| [&**n, &**v]).collect();
    serde_json::json!({
        "addr": caller.addr.map(|a| a.to_string()),
        "origin": caller.origin,
        "rest": caller.rest,
        "headers": headers,
    })
}

impl App for CallerApp {
    fn name(&self) -> &'static str {
        "caller"
    }

    fn wants_header(&self, name: &str) -> bool {
        [
            "x-request-id",
            "accept-language",
            "authorization",
            "cookie",
            "sec-websocket-protocol",
        ]
        .iter()
        .any(|h| h.eq_ignore_ascii_case(name))
    }

    fn cors(&self, origin: &str) -> Option<Cors> {
        (origin == "http://pages.example").then_some(Cors {
            credentials: true,
            max_age_seconds: 60,
        })
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS calls (n INTEGER PRIMARY KEY, rest TEXT);"
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            Input::Http {
                method,
                query,
                caller,
                ..
            } => http(cx, method, *query, caller),
            Input::Attach {
                session, caller, ..
            } => {
                let mut hello = told(caller);
                hello["t"] = "hello".into();
                hello["session"] = session.to_string().into();
                hello["life"] = session.life.to_string().into();
                hello["shard"] = session.shard.into();
                hello["id"] = session.id.to_string().into();
                cx.send(*session, &hello.to_string())?;
                Ok(Output::None)
            }
            Input::Message { session, msg, .. } => message(cx, *session, msg),
            Input::Detach { .. } | Input::Alarm { .. } | Input::FromObject { .. } => {
                Ok(Output::None)
            }
        }
    }
}

/// A request: a POST records its path's rest; `?go=` redirects; else what the app was told,
/// with the calls recorded, as JSON or as `?type=`, and `?bad=` asks for a header the node
/// must refuse to send.
fn http(
    cx: &mut Cx<'_>,
    method: &str,
    query: Option<&str>,
    caller: &Caller,
) -> Result<Output, AppError> {
    if method == "POST" {
        cx.db()?
            .execute("INSERT INTO calls (rest) VALUES (?1)", [&caller.rest])?;
    } else if let Some(to) = super::query_param(query, "go") {
        return Ok(Output::Http(
            Response::json(302, &serde_json::json!({ "location": to })).with_header("location", to),
        ));
    }
    let calls: i64 = cx
        .db()?
        .query_row("SELECT count(*) FROM calls", [], |r| r.get(0))?;
    let mut said = told(caller);
    said["calls"] = calls.into();
    said["object"] = cx.object().into();
    let mut resp = match super::query_param(query, "type") {
        Some(ct) => Response::bytes(200, ct.replace("%20", " "), said.to_string().into_bytes()),
        None => Response::json(200, &said),
    };
    resp = resp
        .with_header("set-cookie", "seen=1; Path=/; HttpOnly; SameSite=Lax")
        .with_header("cache-control", "no-store");
    match super::query_param(query, "bad") {
        Some("split") => resp = resp.with_header("location", "/\r\nx-evil: 1"),
        Some("field") => resp = resp.with_header("content-length", "0"),
        _ => {}
    }
    Ok(Output::Http(resp))
}

/// A message: `to:<life>:<shard>:<id>` pokes that session (one of another life is dropped);
/// anything else is answered `seen`.
fn message(
    cx: &mut Cx<'_>,
    session: SessionId,
    msg: &combd_shards::app::Message<'_>,
) -> Result<Output, AppError> {
    let to = match msg {
        combd_shards::app::Message::Text(t) => t.strip_prefix("to:"),
        combd_shards::app::Message::Binary(_) => None,
    };
    let parts: Option<Vec<u64>> =
        to.map(|t| t.split(':').map(|p| p.parse().unwrap_or(0)).collect());
    match parts.as_deref() {
        Some(&[life, shard, id]) => {
            let to = SessionId {
                life,
                shard: shard as u32,
                id,
            };
            cx.send(to, r#"{"t":"poke"}"#)?;
        }
        _ => cx.send(session, r#"{"t":"seen"}"#)?,
    }
    Ok(Output::None)
}
