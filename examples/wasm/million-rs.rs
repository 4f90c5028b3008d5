//! million, in Rust with `combd-guest` (`guest/`): the board of 1,000,000 checkboxes as a
//! module, speaking the native app's protocol (src/apps/million.rs), as `million.c` does:
//! `GET /o/<app>/<board>?page=<p>` upgrades to a viewer of page p, whose first message is
//! `{"t":"page","p":p,"s":<session>,"bits":"<hex>"}`; a click `{"t":"click","i":<box>,"c":<seq>}`
//! toggles a box and every viewer of its page gets `{"t":"set","u":[[i,v,session,c],...]}`.
//! Clicks waiting together are applied in one transaction, one read, one write and one update
//! per page. Built by `examples/wasm/build-rust.sh` to `apps/million-rs.wasm`.

use combd_guest::{self as combd, Kind, Part, Value};

const BOXES: u64 = 1_000_000;
const PAGE_BOXES: u64 = 4096;
const PAGES: u64 = (BOXES + PAGE_BOXES - 1) / PAGE_BOXES;
const PAGE_BYTES: usize = (PAGE_BOXES / 8) as usize;

#[no_mangle]
pub extern "C" fn schema() -> *const u8 {
    combd::c_str(
        "CREATE TABLE IF NOT EXISTS pages (page INTEGER PRIMARY KEY, bits BLOB NOT NULL);\0",
    )
}

/// A viewer that missed updates is attached again: its attach sends the page whole.
#[no_mangle]
pub extern "C" fn resync() -> i32 {
    1
}

/// An input refused: the message for `fail`.
struct Refused(u16, String);

/// The page in the query (`page=<p>`, default 0).
fn page_of_query() -> Result<u64, Refused> {
    let q = combd::input_text(Part::Query).unwrap_or_default();
    for kv in q.split('&') {
        if let Some(v) = kv.strip_prefix("page=") {
            let p: u64 = v
                .parse()
                .map_err(|_| Refused(400, "page must be a whole number".into()))?;
            if p >= PAGES {
                return Err(Refused(400, format!("page must be below {PAGES}")));
            }
            return Ok(p);
        }
    }
    Ok(0)
}

/// The session as the protocol numbers it: its shard in the bits above 40.
fn session_number() -> u64 {
    let s = combd::session().map_or((0, 0), |s| (s.shard as u64, s.id));
    (s.0 << 40) | (s.1 & ((1 << 40) - 1))
}

fn load_page(page: u64) -> Vec<u8> {
    let mut bits = vec![0u8; PAGE_BYTES];
    if let Ok(rows) = combd::sql(
        "SELECT bits FROM pages WHERE page = ?1",
        &[Value::Int(page as i64)],
    ) {
        if rows.count == 1 {
            if let Some(b) = rows.bytes(0, 0) {
                let n = b.len().min(PAGE_BYTES);
                bits[..n].copy_from_slice(&b[..n]);
            }
        }
    }
    bits
}

struct Click {
    i: u64,
    c: u64,
    session: u64,
}

/// The number after `key` in a JSON object (a plain reading, as million.c's).
fn number_at(s: &str, key: &str) -> Option<u64> {
    let rest = s[s.find(key)? + key.len()..].trim_start();
    let digits: String = rest
        .chars()
        .take_while(char::is_ascii_digit)
        .take(12)
        .collect();
    digits.parse().ok()
}

/// The current input's click.
fn click() -> Result<Click, Refused> {
    if combd::kind() != Kind::Text {
        return Err(Refused(400, "clicks are text messages".into()));
    }
    let m = combd::input_text(Part::Body).unwrap_or_default();
    if !m.starts_with('{') || m.len() > 1023 {
        return Err(Refused(400, "a click is JSON".into()));
    }
    if !m.contains("\"t\":\"click\"") {
        return Err(Refused(400, "unknown message type".into()));
    }
    let i = number_at(&m, "\"i\":").ok_or_else(|| Refused(400, "i must be a box index".into()))?;
    if i >= BOXES {
        return Err(Refused(400, "i must be below 1000000".into()));
    }
    Ok(Click {
        i,
        c: number_at(&m, "\"c\":").unwrap_or(0),
        session: session_number(),
    })
}

/// Applies `clicks`, grouped by page (in order within a page): one read, one write, one
/// broadcast each.
fn apply(clicks: &mut Vec<Click>) -> Result<(), Refused> {
    clicks.sort_by_key(|c| c.i / PAGE_BOXES); // stable: order within a page kept
    let mut k = 0;
    while k < clicks.len() {
        let page = clicks[k].i / PAGE_BOXES;
        let mut bits = load_page(page);
        let mut json = String::from("{\"t\":\"set\",\"u\":[");
        let mut first = true;
        while k < clicks.len() && clicks[k].i / PAGE_BOXES == page {
            let c = &clicks[k];
            let off = (c.i % PAGE_BOXES) as usize;
            bits[off / 8] ^= 1 << (off % 8);
            let v = (bits[off / 8] >> (off % 8)) & 1;
            if !first {
                json.push(',');
            }
            first = false;
            json.push_str(&format!("[{},{},{},{}]", c.i, v, c.session, c.c));
            k += 1;
        }
        json.push_str("]}");
        combd::sql(
            "INSERT OR REPLACE INTO pages (page, bits) VALUES (?1, ?2)",
            &[Value::Int(page as i64), Value::Blob(&bits)],
        )
        .map_err(|_| Refused(500, "storage".into()))?;
        combd::broadcast(&format!("p{page}"), &json);
    }
    clicks.clear();
    Ok(())
}

/// Answers the current input (not a click).
fn answer() -> Result<(), Refused> {
    match combd::kind() {
        Kind::Http => {
            let method = combd::input_text(Part::Method).unwrap_or_default();
            if method != "GET" && method != "HEAD" {
                return Err(Refused(405, "view the board over a WebSocket".into()));
            }
            page_of_query()?;
            let json =
                format!("{{\"boxes\":{BOXES},\"page_boxes\":{PAGE_BOXES},\"pages\":{PAGES}}}");
            combd::respond(200, json.as_bytes());
            Ok(())
        }
        Kind::Attach => {
            let page = page_of_query()?;
            let bits = load_page(page);
            let mut msg = format!(
                "{{\"t\":\"page\",\"p\":{page},\"s\":{},\"bits\":\"",
                session_number()
            );
            const HEX: &[u8; 16] = b"0123456789abcdef";
            for b in bits {
                msg.push(HEX[(b >> 4) as usize] as char);
                msg.push(HEX[(b & 15) as usize] as char);
            }
            msg.push_str("\"}");
            if let Some(s) = combd::session() {
                combd::send(s, &msg);
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

fn failed(r: Result<(), Refused>) -> i32 {
    match r {
        Ok(()) => 0,
        Err(Refused(status, msg)) => {
            combd::fail(status, &msg);
            1
        }
    }
}

#[no_mangle]
pub extern "C" fn topic() -> *const u8 {
    match page_of_query() {
        Ok(p) => combd::c_string(format!("p{p}")),
        Err(Refused(status, msg)) => {
            combd::fail(status, &msg);
            core::ptr::null()
        }
    }
}

#[no_mangle]
pub extern "C" fn handle() -> i32 {
    failed(match combd::kind() {
        Kind::Text | Kind::Binary => click().and_then(|c| apply(&mut vec![c])),
        _ => answer(),
    })
}

/// Attaches and reads in order; clicks applied together. Any bad input fails the batch, which
/// the node then retries one input at a time.
#[no_mangle]
pub extern "C" fn handle_batch(n: i32) -> i32 {
    let mut clicks = Vec::new();
    let mut run = || -> Result<(), Refused> {
        for k in 0..n.max(0) as usize {
            match combd::select(k) {
                Some(Kind::Text) | Some(Kind::Binary) => clicks.push(click()?),
                Some(_) => {
                    if !clicks.is_empty() {
                        apply(&mut clicks)?;
                    }
                    answer()?;
                }
                None => break,
            }
        }
        if !clicks.is_empty() {
            apply(&mut clicks)?;
        }
        Ok(())
    };
    failed(run())
}
