//! `echo`: `POST /o/echo/<name>` answers with its body; a WebSocket at `/o/echo/<name>` gets
//! every text and binary message back.

use combd_shards::app::{App, Message, Reply};
use combd_shards::http::{Request, Response};

/// The echo app.
pub struct Echo;

impl App for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn http(&self, _object: &str, req: &Request<'_>) -> Response {
        if req.method != "POST" {
            return Response::error(405, "echo takes POST (or a WebSocket upgrade)")
                .with_header("allow", "POST");
        }
        Response::bytes(200, "application/octet-stream", req.body.to_vec())
    }

    fn ws_message(&self, _object: &str, msg: Message<'_>, reply: &mut dyn Reply) {
        reply.send(msg);
    }
}
