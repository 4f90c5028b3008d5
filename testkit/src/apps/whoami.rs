//! `whoami` (test app, served only by `combd-test-node`): an identified app that says who
//! its client is. `GET /o/whoami/<name>` answers `{"sub":…,"name":…}`; a `POST` also counts
//! the client's visits in the object's database and answers `{"sub":…,"name":…,"n":…}`
//! (a write, so that in a fleet the object has an owner to pass requests on to); a WebSocket's attach
//! sends `{"t":"hello","me":…,"name":…}` (a message is answered `{"t":"seen"}`). Without a
//! valid token the node answers 401 before the app is called.

use combd_shards::app::{App, AppError, Client, Cx, Input, Output};
use combd_shards::http::Response;

/// The whoami app.
pub struct WhoAmI;

fn described(client: Option<&Client>) -> Result<serde_json::Value, AppError> {
    // The node never calls an identified app without a client: a missing one is a bug.
    let c = client.ok_or_else(|| AppError::new(500, "no client for an identified app"))?;
    Ok(serde_json::json!({ "sub": c.subject, "name": c.name }))
}

impl App for WhoAmI {
    fn name(&self) -> &'static str {
        "whoami"
    }

    fn identified(&self) -> bool {
        true
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS visits (sub TEXT PRIMARY KEY, n INTEGER NOT NULL);"
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            Input::Http {
                method: "POST",
                client,
                ..
            } => {
                let mut said = described(*client)?;
                let n: i64 = cx.db()?.query_row(
                    "INSERT INTO visits (sub, n) VALUES (?1, 1)
                     ON CONFLICT (sub) DO UPDATE SET n = n + 1 RETURNING n",
                    [said["sub"].as_str()],
                    |r| r.get(0),
                )?;
                said["n"] = n.into();
                Ok(Output::Http(Response::json(200, &said)))
            }
            Input::Http { client, .. } => {
                Ok(Output::Http(Response::json(200, &described(*client)?)))
            }
            Input::Attach {
                session, client, ..
            } => {
                let mut hello = described(*client)?;
                hello["t"] = "hello".into();
                hello["me"] = hello["sub"].take();
                cx.send(*session, &hello.to_string())?;
                Ok(Output::None)
            }
            Input::Message { session, .. } => {
                cx.send(*session, r#"{"t":"seen"}"#)?;
                Ok(Output::None)
            }
            Input::Detach { .. } | Input::Alarm { .. } | Input::FromObject { .. } => {
                Ok(Output::None)
            }
        }
    }
}
