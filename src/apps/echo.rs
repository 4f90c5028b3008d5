//! `echo`: `POST /o/echo/<name>` answers with its body; a WebSocket at `/o/echo/<name>` gets
//! every text and binary message back. Stateless: no object, no database.

use combd_shards::app::{App, AppError, Cx, Input, Message, Output};
use combd_shards::http::Response;

/// The echo app.
pub struct Echo;

impl App for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn stateless(&self) -> bool {
        true
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            Input::Http {
                method: "POST",
                body,
                ..
            } => Ok(Output::Http(Response::bytes(
                200,
                "application/octet-stream",
                body.to_vec(),
            ))),
            Input::Http { .. } => Err(AppError::method_not_allowed(
                "POST",
                "echo takes POST (or a WebSocket upgrade)",
            )),
            Input::Message {
                session,
                msg: Message::Text(t),
                ..
            } => {
                cx.send(*session, t)?;
                Ok(Output::None)
            }
            Input::Message {
                session,
                msg: Message::Binary(b),
                ..
            } => {
                cx.send_binary(*session, b)?;
                Ok(Output::None)
            }
            Input::Attach { .. }
            | Input::Detach { .. }
            | Input::Alarm { .. }
            | Input::FromObject { .. } => Ok(Output::None),
        }
    }
}
