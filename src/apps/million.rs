//! `million`: a board of 1,000,000 checkboxes per object, kept in SQLite, as `shared/BENCH.md`
//! describes. `GET /o/million/<board>?page=<p>` upgrades to a WebSocket viewing page `p`
//! (4,096 boxes); its first message is the page's state:
//! `{"t":"page","p":p,"s":<your session>,"bits":"<hex, box i of the page is bit i%8 of byte i/8>"}`.
//! A click `{"t":"click","i":<box>,"c":<your seq>}` toggles a box; every viewer of its page
//! gets `{"t":"set","u":[[i,v,session,c],...]}`. Clicks waiting together are applied in one
//! transaction and sent as one update per page. `GET /o/million/<board>?page=<p>` without an
//! upgrade answers the board's size, or the error an upgrade would get for that page. The
//! node serves a page at `/million/`.

use std::collections::BTreeMap;

use combd_shards::app::{App, AppError, Cx, Input, Message, Output, Resync, SessionId};
use combd_shards::http::Response;

/// Boxes on the board.
pub const BOXES: u64 = 1_000_000;
/// Boxes on a page.
pub const PAGE_BOXES: u64 = 4096;
/// Pages on the board (the last one is partly used).
pub const PAGES: u64 = BOXES.div_ceil(PAGE_BOXES);

/// Most inputs in one batch of a board: its whole mailbox.
pub const BATCH: usize = combd_kernel::limits::MAILBOX_DEFAULT;

/// The million app.
pub struct Million;

/// A session as a number in updates: the shard in the high bits, the id in the low 40.
pub fn session_number(s: SessionId) -> u64 {
    (u64::from(s.shard) << 40) | (s.id & ((1 << 40) - 1))
}

fn page_of(query: Option<&str>) -> Result<u64, AppError> {
    let p = match query.and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("page="))) {
        None => 0,
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| AppError::new(400, "page must be a whole number"))?,
    };
    if p >= PAGES {
        return Err(AppError::new(400, format!("page must be below {PAGES}")));
    }
    Ok(p)
}

fn load_page(cx: &mut Cx<'_>, page: u64) -> Result<Vec<u8>, AppError> {
    let bits: Option<Vec<u8>> = match cx
        .db()?
        .prepare_cached("SELECT bits FROM pages WHERE page = ?1")?
        .query_row([page], |r| r.get(0))
    {
        Ok(b) => Some(b),
        Err(rusqlite::Error::QueryReturnedNoRows) => None,
        Err(e) => return Err(e.into()),
    };
    let mut bits = bits.unwrap_or_default();
    bits.resize((PAGE_BOXES / 8) as usize, 0);
    Ok(bits)
}

struct Click {
    i: u64,
    c: u64,
    session: SessionId,
}

fn parse_click(session: SessionId, msg: &Message<'_>) -> Result<Click, AppError> {
    let Message::Text(text) = msg else {
        return Err(AppError::new(400, "clicks are text messages"));
    };
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|_| AppError::new(400, "a click is JSON"))?;
    if v["t"] != "click" {
        return Err(AppError::new(400, "unknown message type"));
    }
    let i = v["i"]
        .as_u64()
        .ok_or_else(|| AppError::new(400, "i must be a box index"))?;
    if i >= BOXES {
        return Err(AppError::new(400, format!("i must be below {BOXES}")));
    }
    let c = v["c"].as_u64().unwrap_or(0);
    Ok(Click { i, c, session })
}

/// Applies clicks, grouped by page, each page read and written once; returns the updates
/// to broadcast per page.
fn apply(cx: &mut Cx<'_>, clicks: &[Click]) -> Result<(), AppError> {
    let mut by_page: BTreeMap<u64, Vec<&Click>> = BTreeMap::new();
    for c in clicks {
        by_page.entry(c.i / PAGE_BOXES).or_default().push(c);
    }
    for (page, clicks) in by_page {
        let mut bits = load_page(cx, page)?;
        let mut updates = Vec::with_capacity(clicks.len());
        for c in clicks {
            cx.tick()?;
            let off = (c.i % PAGE_BOXES) as usize;
            bits[off / 8] ^= 1 << (off % 8);
            let v = (bits[off / 8] >> (off % 8)) & 1;
            updates.push(serde_json::json!([c.i, v, session_number(c.session), c.c]));
        }
        cx.db()?
            .prepare_cached("INSERT OR REPLACE INTO pages (page, bits) VALUES (?1, ?2)")?
            .execute(rusqlite::params![page, bits])?;
        cx.broadcast(
            &format!("p{page}"),
            &serde_json::json!({ "t": "set", "u": updates }).to_string(),
        )?;
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    const H: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(H[(b >> 4) as usize] as char);
        s.push(H[(b & 15) as usize] as char);
    }
    s
}

impl App for Million {
    fn name(&self) -> &'static str {
        "million"
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS pages (page INTEGER PRIMARY KEY, bits BLOB NOT NULL);"
    }

    fn handles_batch(&self) -> bool {
        true
    }

    /// A click is about 40 bytes (`{"t":"click","i":4095,"c":123456789}`): a kibibyte leaves
    /// room for any field order and spacing; a larger message closes the viewer with 1009.
    fn max_input_bytes(&self) -> Option<u64> {
        Some(1024)
    }

    /// Up to a whole mailbox of clicks at once: a batch forms only from clicks that queued, so
    /// under load its clicks merge into one update per page, and a page's viewers get one
    /// frame for many clicks instead of one each (the sends are the board's cost).
    fn batch(&self) -> usize {
        BATCH
    }

    /// A viewer that missed updates gets its page again: the attach sends it whole.
    fn resync(&self) -> Resync {
        Resync::Attach
    }

    fn topic(&self, query: Option<&str>) -> Result<String, AppError> {
        Ok(format!("p{}", page_of(query)?))
    }

    fn page(&self) -> Option<(&'static str, &'static str)> {
        Some(("/million/", include_str!("million.html")))
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            // A page in the query is checked as an upgrade checks it, so a client whose
            // upgrade failed can learn why (the page at `/million/` does).
            Input::Http {
                method: "GET" | "HEAD",
                query,
                ..
            } => {
                page_of(*query)?;
                Ok(Output::Http(Response::json(
                    200,
                    &serde_json::json!({ "boxes": BOXES, "page_boxes": PAGE_BOXES, "pages": PAGES }),
                )))
            }
            Input::Http { .. } => Err(AppError::method_not_allowed(
                "GET, HEAD",
                "view the board over a WebSocket",
            )),
            Input::Attach {
                session,
                query,
                resumed,
                ..
            } => {
                let page = page_of(*query)?;
                // A numbered viewer resuming is sent every update it missed: it has the page.
                if *resumed {
                    return Ok(Output::None);
                }
                let bits = load_page(cx, page)?;
                let msg = serde_json::json!({ "t": "page", "p": page, "s": session_number(*session), "bits": hex(&bits) });
                cx.send(*session, &msg.to_string())?;
                Ok(Output::None)
            }
            Input::Detach { .. } | Input::Alarm { .. } | Input::FromObject { .. } => {
                Ok(Output::None)
            }
            Input::Message { session, msg, .. } => {
                let click = parse_click(*session, msg)?;
                apply(cx, &[click])?;
                Ok(Output::None)
            }
        }
    }

    fn handle_batch(&self, cx: &mut Cx<'_>, inputs: &[Input<'_>]) -> Result<Vec<Output>, AppError> {
        // Attaches and reads are handled in order; clicks are applied together. Any bad
        // input fails the batch, which the node then retries one by one.
        let mut clicks = Vec::new();
        let mut outputs = Vec::with_capacity(inputs.len());
        for input in inputs {
            match input {
                Input::Message { session, msg, .. } => {
                    clicks.push(parse_click(*session, msg)?);
                    outputs.push(Output::None);
                }
                other => {
                    if !clicks.is_empty() {
                        apply(cx, &clicks)?;
                        clicks.clear();
                    }
                    outputs.push(self.handle(cx, other)?);
                }
            }
        }
        if !clicks.is_empty() {
            apply(cx, &clicks)?;
        }
        Ok(outputs)
    }
}

/// For the fuzz target: parses `data` as a client message and as a page query; a click that
/// parses is on the board.
pub fn fuzz_entry(data: &[u8]) {
    let session = SessionId::new(0, 1);
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(c) = parse_click(session, &Message::Text(text)) {
            assert!(c.i < BOXES);
        }
        if let Ok(p) = page_of(Some(text)) {
            assert!(p < PAGES);
        }
    }
    let _ = parse_click(session, &Message::Binary(data));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pages_and_queries() {
        assert_eq!(PAGES, 245);
        assert_eq!(page_of(None).unwrap(), 0);
        assert_eq!(page_of(Some("page=244")).unwrap(), 244);
        assert_eq!(page_of(Some("page=245")).unwrap_err().status, 400);
        assert_eq!(page_of(Some("x=1&page=nope")).unwrap_err().status, 400);
    }

    #[test]
    fn clicks_parse_and_validate() {
        let s = SessionId::new(1, 7);
        let c = parse_click(s, &Message::Text(r#"{"t":"click","i":4097,"c":3}"#)).unwrap();
        assert_eq!((c.i, c.c), (4097, 3));
        assert!(parse_click(s, &Message::Text(r#"{"t":"click","i":1000000}"#)).is_err());
        assert!(parse_click(s, &Message::Text("nope")).is_err());
        assert_eq!(session_number(s), (1 << 40) | 7);
        assert_eq!(hex(&[0, 255, 16]), "00ff10");
    }
}
