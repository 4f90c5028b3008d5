//! `hold` (test app, served only by `combd-test-node`): each request holds its object for
//! `?ms=N` milliseconds (at most 10,000) before answering `{"seq": n}`, its place in the
//! object's order, so tests can fill a mailbox and watch the wake queue. `&alloc=N` makes
//! the call hold N bytes while it runs: its `memory_kb` is 4096.

use std::time::Duration;

use combd_shards::app::{App, AppError, Cx, Input, Output};
use combd_shards::http::Response;

/// The hold app.
pub struct Hold;

impl App for Hold {
    fn name(&self) -> &'static str {
        "hold"
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS seq (id INTEGER PRIMARY KEY CHECK (id = 1), n INTEGER NOT NULL);
         INSERT OR IGNORE INTO seq (id, n) VALUES (1, 0);"
    }

    fn mailbox(&self) -> usize {
        8
    }

    fn memory_kb(&self) -> Option<u64> {
        Some(4096)
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        let Input::Http { query, .. } = input else {
            return Ok(Output::None);
        };
        let ms: u64 = super::query_param(*query, "ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
            .min(10_000);
        std::thread::sleep(Duration::from_millis(ms));
        let alloc: usize = super::query_param(*query, "alloc")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let held = vec![1u8; alloc];
        cx.tick()?;
        let _ = held.len();
        let n: i64 = cx.db()?.query_row(
            "UPDATE seq SET n = n + 1 WHERE id = 1 RETURNING n",
            [],
            |r| r.get(0),
        )?;
        Ok(Output::Http(Response::json(
            200,
            &serde_json::json!({ "seq": n }),
        )))
    }
}
