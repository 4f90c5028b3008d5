//! `brief` (test app, served only by `combd-test-node`): an app that keeps a short log
//! ([`App::log_retention`]: its topic's newest 3 frames). `POST /o/brief/<name>` with a text
//! body stores it and broadcasts it to the object's topic; a session's attach is sent
//! `{"t":"state","n":<rows>}` (the app's snapshot). `DELETE` broadcasts `bye` and deletes the
//! object (`Cx::delete`): its sessions get `bye`, then close with 4404.

use combd_shards::app::{App, AppError, Cx, Input, LogRetention, Output};
use combd_shards::http::Response;

/// The brief app.
pub struct Brief;

/// Frames of its topic's log it keeps.
pub const KEPT: u64 = 3;

impl App for Brief {
    fn name(&self) -> &'static str {
        "brief"
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS said (id INTEGER PRIMARY KEY, text TEXT NOT NULL);"
    }

    fn log_retention(&self) -> LogRetention {
        LogRetention {
            frames: KEPT,
            ..LogRetention::NODE
        }
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            Input::Http {
                method: "POST",
                body,
                ..
            } => {
                let text = std::str::from_utf8(body)
                    .map_err(|_| AppError::new(400, "the body must be text"))?;
                cx.db()?
                    .execute("INSERT INTO said (text) VALUES (?1)", [text])?;
                cx.broadcast("", text)?;
                Ok(Output::Http(Response::json(200, &serde_json::json!({}))))
            }
            Input::Http {
                method: "DELETE", ..
            } => {
                cx.broadcast("", "bye")?;
                cx.delete()?;
                Ok(Output::Http(Response::json(
                    200,
                    &serde_json::json!({ "deleted": true }),
                )))
            }
            Input::Attach { session, .. } => {
                let n: i64 = cx
                    .db()?
                    .query_row("SELECT count(*) FROM said", [], |r| r.get(0))?;
                cx.send(
                    *session,
                    &serde_json::json!({ "t": "state", "n": n }).to_string(),
                )?;
                Ok(Output::None)
            }
            _ => Ok(Output::None),
        }
    }
}
