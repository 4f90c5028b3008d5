//! `fanout` (test app, served only by `combd-test-node`): a session of an object subscribes
//! to topic `t<T>` (`?topic=T` on the upgrade, 0–999; topic 0 without it), and
//! `POST /o/fanout/<name>?n=N&topics=K&size=B` broadcasts N text frames (`{"f":<seq>}` padded
//! to B bytes, 40 by default, 24–16,384) to each of topics 0..K (K 1–1,000, default 1) in one
//! call, answering `{"sent": N}`.
//! It measures the node's fan-out (frames and sends a second to many viewers; `bench/fanout.sh`)
//! without SQL in the way: the object's database holds nothing.

use combd_shards::app::{App, AppError, Cx, Input, Output};
use combd_shards::http::Response;

/// Most frames one call broadcasts.
const FRAMES_MAX: usize = 64;
/// Most topics (and the topics a session may pick from).
const TOPICS_MAX: usize = 1000;
/// The size of each frame's payload, in bytes, unless the call says (`size`), and its range.
const FRAME_BYTES: usize = 40;
const FRAME_BYTES_RANGE: std::ops::Range<usize> = 24..16_385;

/// The fanout app.
pub struct Fanout;

impl App for Fanout {
    fn name(&self) -> &'static str {
        "fanout"
    }

    fn topic(&self, query: Option<&str>) -> Result<String, AppError> {
        let t = number(query, "topic", 0, 0..TOPICS_MAX)?;
        Ok(format!("t{t}"))
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        let Input::Http { query, .. } = input else {
            return Ok(Output::None);
        };
        let n = number(*query, "n", 1, 1..FRAMES_MAX + 1)?;
        let topics = number(*query, "topics", 1, 1..TOPICS_MAX + 1)?;
        let size = number(*query, "size", FRAME_BYTES, FRAME_BYTES_RANGE)?;
        for i in 0..n {
            let digits = i.to_string().len();
            let pad = "x".repeat(size - 13 - digits);
            let frame = format!("{{\"f\":{i},\"p\":\"{pad}\"}}");
            for t in 0..topics {
                cx.broadcast(&format!("t{t}"), &frame)?;
            }
        }
        Ok(Output::Http(Response::json(
            200,
            &serde_json::json!({ "sent": n }),
        )))
    }
}

/// The number `key` of the query, `default` without it; 400 unless it is in `range`.
fn number(
    query: Option<&str>,
    key: &str,
    default: usize,
    range: std::ops::Range<usize>,
) -> Result<usize, AppError> {
    match super::query_param(query, key).map(str::parse::<usize>) {
        None => Ok(default),
        Some(Ok(v)) if range.contains(&v) => Ok(v),
        Some(_) => Err(AppError::new(
            400,
            format!(
                "{key} must be a number from {} to {}",
                range.start,
                range.end - 1
            ),
        )),
    }
}
