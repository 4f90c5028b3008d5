//! `stall` (test app, served only by `combd-test-node`): a stateless app that holds its
//! shard's loop. `POST /o/stall/<name>?ms=N` spins for `N` milliseconds (at most 1,000) right
//! on the loop, as a native app with a bug would, so tests can watch the shard's stall
//! detector (`turn_overruns`) see it. `?panic=1` panics right there instead, as a bug in a
//! native app or in the node would, so tests can watch a failed shard end the process (70).

use std::time::{Duration, Instant};

use combd_shards::app::{App, AppError, Cx, Input, Output};
use combd_shards::http::Response;

/// The stall app.
pub struct Stall;

impl App for Stall {
    fn name(&self) -> &'static str {
        "stall"
    }

    fn stateless(&self) -> bool {
        true
    }

    fn handle(&self, _cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        let Input::Http { query, .. } = input else {
            return Ok(Output::None);
        };
        if super::query_param(*query, "panic") == Some("1") {
            panic!("stall: asked to panic on the shard's loop");
        }
        let ms: u64 = super::query_param(*query, "ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
            .min(1_000);
        let until = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
        Ok(Output::Http(Response::json(
            200,
            &serde_json::json!({ "stalled_ms": ms }),
        )))
    }
}
