//! `counter`: a durable counter per object. `POST /o/counter/<name>` adds one (or the
//! whole number in the body, e.g. `5` or `-2`) and answers `{"value": n}` once committed;
//! `GET` answers the value. A body that is not a number is refused with 400 and changes
//! nothing. Increments that wait together are applied in one transaction (a batch).

use combd_shards::app::{App, AppError, Cx, Input, Output};
use combd_shards::http::Response;

/// The counter app.
pub struct Counter;

fn value(cx: &mut Cx<'_>) -> Result<i64, AppError> {
    Ok(cx
        .db()?
        .prepare_cached("SELECT value FROM counter WHERE id = 1")?
        .query_row([], |r| r.get(0))?)
}

impl App for Counter {
    fn name(&self) -> &'static str {
        "counter"
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS counter (id INTEGER PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL);
         INSERT OR IGNORE INTO counter (id, value) VALUES (1, 0);"
    }

    fn handles_batch(&self) -> bool {
        true
    }

    /// A body is a whole number (an `i64` is at most 20 characters), with room for spaces.
    fn max_input_bytes(&self) -> Option<u64> {
        Some(64)
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            Input::Http {
                method: "GET" | "HEAD",
                ..
            } => Ok(Output::Http(Response::json(
                200,
                &serde_json::json!({ "value": value(cx)? }),
            ))),
            Input::Http {
                method: "POST",
                body,
                ..
            } => {
                let by: i64 = if body.is_empty() {
                    1
                } else {
                    std::str::from_utf8(body)
                        .ok()
                        .and_then(|t| t.trim().parse().ok())
                        .ok_or_else(|| AppError::new(400, "the body must be a whole number"))?
                };
                // Cached statements: parsing them anew would cost more than running them. An
                // UPDATE, then a read, rather than `RETURNING` (which opens a temporary table
                // per step: a quarter of this update's cost in a profile).
                cx.db()?
                    .prepare_cached("UPDATE counter SET value = value + ?1 WHERE id = 1")?
                    .execute([by])?;
                let v = value(cx)?;
                Ok(Output::Http(Response::json(
                    200,
                    &serde_json::json!({ "value": v }),
                )))
            }
            Input::Http { .. } => Err(AppError::method_not_allowed(
                "GET, HEAD, POST",
                "GET the value or POST to add",
            )),
            Input::Message { session, .. } => {
                let v = value(cx)?;
                cx.send(*session, &serde_json::json!({ "value": v }).to_string())?;
                Ok(Output::None)
            }
            Input::Attach { .. }
            | Input::Detach { .. }
            | Input::Alarm { .. }
            | Input::FromObject { .. } => Ok(Output::None),
        }
    }
}
