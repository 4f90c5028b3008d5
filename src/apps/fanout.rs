//! `fanout` (test app, served only with `COMBD_TEST_APPS=on`): every session of an object
//! subscribes to one topic, and `POST /o/fanout/<name>?n=N` broadcasts N small text frames
//! (`{"f":<seq>}` padded to 40 bytes) to all of them in one call, answering `{"sent": N}`.
//! It measures the node's fan-out (frames and sends a second to many viewers; `bench/fanout.sh`)
//! without SQL in the way: the object's database holds nothing.

use combd_shards::app::{App, AppError, Cx, Input, Output};
use combd_shards::http::Response;

/// Most frames one call broadcasts.
const FRAMES_MAX: usize = 64;
/// The size of each frame's payload, in bytes.
const FRAME_BYTES: usize = 40;

/// The fanout app.
pub struct Fanout;

impl App for Fanout {
    fn name(&self) -> &'static str {
        "fanout"
    }

    fn topic(&self, _query: Option<&str>) -> Result<String, AppError> {
        Ok("all".to_string())
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        let Input::Http { query, .. } = input else {
            return Ok(Output::None);
        };
        let n = match super::query_param(*query, "n").map(str::parse::<usize>) {
            None => 1,
            Some(Ok(n)) if (1..=FRAMES_MAX).contains(&n) => n,
            Some(_) => {
                return Err(AppError::new(
                    400,
                    "n must be a number of frames from 1 to 64",
                ))
            }
        };
        for i in 0..n {
            let digits = i.to_string().len();
            let pad = "x".repeat(FRAME_BYTES - 13 - digits);
            cx.broadcast("all", &format!("{{\"f\":{i},\"p\":\"{pad}\"}}"))?;
        }
        Ok(Output::Http(Response::json(
            200,
            &serde_json::json!({ "sent": n }),
        )))
    }
}
