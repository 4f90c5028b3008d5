//! A combd app module in Rust, as a Cargo project built with stable Rust for
//! `wasm32-unknown-unknown` (`examples/wasm/rust-app/`, app `greet`; what `combd new <app>
//! --lang rust` writes). Each object counts its visitors:
//!
//! - `POST /o/<app>/<name>?who=<someone>` (the query percent-decoded, `+` a space) counts a
//!   visit and answers `{"hello":"<someone>","visits":n}`;
//! - `GET /o/<app>/<name>` answers `{"visits":n}`;
//! - a `who` longer than 64 bytes panics: the input fails (a trap) and the panic's message is in
//!   the call's log (`log_panic`).

use combd_guest::{self as combd, Kind, Value};

#[no_mangle]
pub extern "C" fn schema() -> *const u8 {
    combd::c_str("CREATE TABLE IF NOT EXISTS visits (who TEXT NOT NULL);\0")
}

fn visits() -> i64 {
    combd::sql("SELECT count(*) FROM visits", &[]).map_or(0, |rows| rows.int(0, 0))
}

/// The input's handler: 0 when it went through, else 1 after `fail` (the ABI's `handle`).
#[no_mangle]
pub extern "C" fn handle() -> i32 {
    std::panic::set_hook(Box::new(|info| combd::log_panic(info)));
    if combd::kind() != Kind::Http {
        return 0;
    }
    let method = combd::input_text(combd::Part::Method).unwrap_or_default();
    if method != "POST" {
        combd::respond(200, format!("{{\"visits\":{}}}", visits()).as_bytes());
        return 0;
    }
    let who = combd::query("who").unwrap_or_else(|| "world".to_string());
    assert!(who.len() <= 64, "a name of {} bytes", who.len());
    if let Err(e) = combd::sql("INSERT INTO visits (who) VALUES (?1)", &[Value::Text(&who)]) {
        combd::fail(500, &e);
        return 1;
    }
    let body = format!(
        "{{\"hello\":{},\"visits\":{}}}",
        combd::json_string(&who),
        visits()
    );
    combd::respond(200, body.as_bytes());
    0
}
