//! `limits` (test app, served only by `combd-test-node`): requests that cross a cell's
//! limits on purpose, so tests can check each error and that the object carries on.
//! `POST /o/limits/<name>?do=<what>&n=<n>`:
//! - `spin`: loops calling `cx.tick()` forever (killed: `cpu_limit`);
//! - `value`: stores a blob of `n` bytes (past 2 MB: `too_big`);
//! - `slowsql`: one endless SQL statement (interrupted: `sql_timeout`);
//! - `manysql`: short statements, one after another, forever (killed: `host_time`);
//! - `fill`: adds 64 KiB rows until the database cap (`db_full`);
//! - `sends`: broadcasts `n` messages of `size` bytes (default 1 MiB; past 16 MiB in all:
//!   `send_limit`);
//! - `sleep`: holds the object `ms` milliseconds (not host time: no SQL);
//! - `count`: answers how many rows the object holds (nothing half-applied survives).

use combd_shards::app::{App, AppError, Cx, Input, Output};
use combd_shards::http::Response;

use super::query_param as param;

/// The limits app.
pub struct Limits;

impl App for Limits {
    fn name(&self) -> &'static str {
        "limits"
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS rows (v BLOB NOT NULL);"
    }

    /// Batches of at most 3, so a test can cross the batch size.
    fn batch(&self) -> usize {
        3
    }

    fn handles_batch(&self) -> bool {
        true
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        let Input::Http { query, .. } = input else {
            return Ok(Output::None);
        };
        let n: usize = param(*query, "n").and_then(|v| v.parse().ok()).unwrap_or(1);
        match param(*query, "do").unwrap_or("count") {
            "spin" => {
                // A row first, so a kill must roll it back.
                cx.db()?
                    .execute("INSERT INTO rows (v) VALUES (x'00')", [])?;
                loop {
                    cx.tick()?;
                }
            }
            "value" => {
                cx.db()?
                    .execute("INSERT INTO rows (v) VALUES (?1)", [vec![7u8; n]])?;
            }
            "slowsql" => {
                cx.db()?
                    .execute("INSERT INTO rows (v) VALUES (x'00')", [])?;
                cx.db()?.query_row(
                    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c",
                    [],
                    |r| r.get::<_, i64>(0),
                )?;
            }
            "manysql" => {
                cx.db()?
                    .execute("INSERT INTO rows (v) VALUES (x'00')", [])?;
                loop {
                    cx.db()?.query_row(
                        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 20000) SELECT count(*) FROM c",
                        [],
                        |r| r.get::<_, i64>(0),
                    )?;
                }
            }
            "fill" => loop {
                cx.db()?
                    .execute("INSERT INTO rows (v) VALUES (zeroblob(65536))", [])?;
            },
            "sends" => {
                let size = param(*query, "size")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1 << 20);
                let msg = "x".repeat(size);
                for _ in 0..n {
                    cx.broadcast("", &msg)?;
                }
            }
            "sleep" => {
                let ms = param(*query, "ms")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0u64)
                    .min(5_000);
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
            "count" => {}
            other => return Err(AppError::new(400, format!("unknown do={other}"))),
        }
        let rows: i64 = cx
            .db()?
            .query_row("SELECT count(*) FROM rows", [], |r| r.get(0))?;
        Ok(Output::Http(Response::json(
            200,
            &serde_json::json!({ "rows": rows }),
        )))
    }
}
