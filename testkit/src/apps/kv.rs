//! `kv` (test app, served only by `combd-test-node`): a map of keys to values, the history the
//! backup's tests replay. `POST /o/kv/<name>` with `<key>=<value>` sets a key (an empty value
//! deletes it) and answers `{"n":<keys>}`; `GET` answers `{"kv":{<key>:<value>,…}}`.

use combd_shards::app::{App, AppError, Cx, Input, Output};
use combd_shards::http::Response;

/// The kv app.
pub struct Kv;

impl App for Kv {
    fn name(&self) -> &'static str {
        "kv"
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT NOT NULL);"
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            Input::Http {
                method: "POST",
                body,
                ..
            } => {
                let text = std::str::from_utf8(body).map_err(|_| AppError::new(400, "text"))?;
                let (k, v) = text
                    .split_once('=')
                    .ok_or_else(|| AppError::new(400, "<key>=<value>"))?;
                let db = cx.db()?;
                match v {
                    "" => db.execute("DELETE FROM kv WHERE k = ?1", [k])?,
                    v => db.execute(
                        "INSERT INTO kv (k, v) VALUES (?1, ?2) ON CONFLICT (k) DO UPDATE SET v = excluded.v",
                        [k, v],
                    )?,
                };
                let n: i64 = db.query_row("SELECT count(*) FROM kv", [], |r| r.get(0))?;
                Ok(Output::Http(Response::json(
                    200,
                    &serde_json::json!({ "n": n }),
                )))
            }
            Input::Http { .. } => {
                let db = cx.db()?;
                let mut stmt = db.prepare("SELECT k, v FROM kv ORDER BY k")?;
                let rows =
                    stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))?;
                let mut map = serde_json::Map::new();
                for row in rows {
                    let (k, v) = row?;
                    map.insert(k, v.into());
                }
                Ok(Output::Http(Response::json(
                    200,
                    &serde_json::json!({ "kv": map }),
                )))
            }
            _ => Ok(Output::None),
        }
    }
}
