//! `room` (test app, served only by `combd-test-node`): a public app that keeps presence
//! (`App::presence`). A session of an object subscribes to topic `t<T>` (`?topic=T`, 0–99;
//! topic 0 without it); a text message it sends is broadcast to its topic as it is. It crosses
//! presence's paths without identities (each session a member) and without SQL.

use combd_shards::app::{App, AppError, Cx, Input, Message, Output};
use combd_shards::http::Response;

/// Topics a session may pick from.
const TOPICS: u32 = 100;

/// The room app.
pub struct Room;

impl App for Room {
    fn name(&self) -> &'static str {
        "room"
    }

    fn presence(&self) -> bool {
        true
    }

    fn handles_batch(&self) -> bool {
        true
    }

    fn topic(&self, query: Option<&str>) -> Result<String, AppError> {
        match super::query_param(query, "topic").map(str::parse::<u32>) {
            None => Ok("t0".to_string()),
            Some(Ok(t)) if t < TOPICS => Ok(format!("t{t}")),
            Some(_) => Err(AppError::new(400, "topic must be a number from 0 to 99")),
        }
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            Input::Message {
                msg: Message::Text(text),
                ..
            } => {
                // The topic is the session's; the app names it from the text's first word
                // (`t<T> ...`), as a test's client knows its own.
                let topic = text.split(' ').next().unwrap_or("t0");
                cx.broadcast(topic, text)?;
                Ok(Output::None)
            }
            Input::Http { .. } => Ok(Output::Http(Response::json(
                200,
                &serde_json::json!({ "room": true }),
            ))),
            _ => Ok(Output::None),
        }
    }
}
