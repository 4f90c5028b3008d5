//! `combd-guest`: the combd module ABI (version 2, README "The ABI") as safe Rust, for app
//! modules built for `wasm32-unknown-unknown` without the standard library (`no_std` +
//! `alloc`).
//!
//! A module is one app. It defines `handle` (and optionally `handle_batch`, `schema`, `topic`,
//! `resync`, ...) with `#[no_mangle] pub extern "C"`, and reaches the node through the
//! functions here: the current input ([`kind`], [`input`], [`session`], [`select`]), its answer
//! ([`respond`], [`fail`]), SQL in the call's transaction ([`sql`]), sends and broadcasts
//! (after the commit), alarms and messages between objects. A string a module hands the node
//! from an export (`schema`, `topic`) is NUL-terminated: [`c_str`].
//!
//! The crate needs only `core` and `alloc`: the module provides the allocator and the panic
//! handler, most simply by linking `std` (which `wasm32-unknown-unknown` has, importing
//! nothing from the host: a panic is a trap, which fails the input).
//!
//! Builds with today's stable Rust as rustup has it (`rustup target add wasm32-unknown-unknown`,
//! then `cargo build --release --target wasm32-unknown-unknown` in a project that depends on it:
//! `examples/wasm/rust-app/`), and with Rust 1.63 (Debian's `rustc` with
//! `libstd-rust-dev-wasm32`): `examples/wasm/build-rust.sh`.
//!
//! Helpers beside the ABI: [`query`] (a query parameter, percent-decoded), [`percent_decode`],
//! [`header`] (a declared header field), [`json_string`] (a string as JSON), and [`log_panic`]
//! (a panic's message into the call's log, from `std::panic::set_hook`).

#![no_std]
#![deny(missing_docs)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

mod raw {
    #[link(wasm_import_module = "combd")]
    extern "C" {
        pub fn kind() -> i32;
        pub fn session_shard() -> i32;
        pub fn session_id() -> i64;
        pub fn session_life() -> i64;
        pub fn input(part: i32, ptr: *mut u8, cap: i32) -> i32;
        pub fn select(i: i32) -> i32;
        pub fn respond(status: i32, ptr: *const u8, len: i32);
        pub fn fail(status: i32, ptr: *const u8, len: i32);
        pub fn log(ptr: *const u8, len: i32);
        pub fn sql_bind_null();
        pub fn sql_bind_int(v: i64);
        pub fn sql_bind_text(ptr: *const u8, len: i32);
        pub fn sql_bind_blob(ptr: *const u8, len: i32);
        pub fn sql(ptr: *const u8, len: i32) -> i32;
        pub fn sql_type(row: i32, col: i32) -> i32;
        pub fn sql_int(row: i32, col: i32) -> i64;
        pub fn sql_text(row: i32, col: i32, ptr: *mut u8, cap: i32) -> i32;
        pub fn sql_error(ptr: *mut u8, cap: i32) -> i32;
        pub fn send(shard: i32, id: i64, ptr: *const u8, len: i32) -> i32;
        pub fn broadcast(tp: *const u8, tn: i32, ptr: *const u8, len: i32) -> i32;
        pub fn set_alarm(at_ms: i64, ptr: *const u8, len: i32) -> i64;
        pub fn cancel_alarm(id: i64) -> i32;
        pub fn delete() -> i32;
        pub fn send_to_object(
            ap: *const u8,
            an: i32,
            np: *const u8,
            nn: i32,
            bp: *const u8,
            bn: i32,
        ) -> i64;
        pub fn presence(tp: *const u8, tn: i32, ptr: *mut u8, cap: i32) -> i32;
        pub fn user(sp: *const u8, sn: i32, ptr: *mut u8, cap: i32) -> i32;
    }
}

/// A length for the node (every length here is far below 2 GiB: a module's memory is smaller).
fn len(n: usize) -> i32 {
    n as i32
}

/// What the current input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An HTTP request.
    Http,
    /// A session's text message.
    Text,
    /// A session's binary message.
    Binary,
    /// A session attaching (its WebSocket opened).
    Attach,
    /// A session detaching.
    Detach,
    /// A due alarm (its payload is the body).
    Alarm,
    /// A message from another object (its body is the body).
    FromObject,
    /// Something a newer node has that this crate does not know.
    Other(i32),
}

impl Kind {
    fn of(k: i32) -> Kind {
        match k {
            0 => Kind::Http,
            1 => Kind::Text,
            2 => Kind::Binary,
            3 => Kind::Attach,
            4 => Kind::Detach,
            5 => Kind::Alarm,
            6 => Kind::FromObject,
            k => Kind::Other(k),
        }
    }
}

/// The current input's kind.
pub fn kind() -> Kind {
    // SAFETY: an import of the node's, without arguments.
    Kind::of(unsafe { raw::kind() })
}

/// In `handle_batch`: makes input `i` current; its kind, or `None` past the last.
pub fn select(i: usize) -> Option<Kind> {
    // SAFETY: an import of the node's; any index is checked by the node.
    let k = unsafe { raw::select(len(i)) };
    if k < 0 {
        None
    } else {
        Some(Kind::of(k))
    }
}

/// A part of the current input ([`input`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The request body, the message, an alarm's payload, another object's message.
    Body = 0,
    /// The query string.
    Query = 1,
    /// The HTTP method.
    Method = 2,
    /// The client's subject (a verified token's `sub`).
    Subject = 3,
    /// The client's `name` claim.
    Name = 4,
    /// The client's address.
    Address = 5,
    /// The request's `Origin`.
    Origin = 6,
    /// The path under the object.
    Rest = 7,
    /// The declared header fields, each `name: value` and a newline.
    Headers = 8,
    /// The object's own name.
    Object = 9,
    /// A message's sender: its app.
    FromApp = 10,
    /// A message's sender: its name.
    FromName = 11,
    /// An attach: `1` if its session resumes from its topic's log (it has the state its
    /// broadcasts make: no snapshot needed), else `0`.
    Resumed = 12,
}

/// Whether the current attach's session resumes from its topic's log ([`Part::Resumed`]).
pub fn resumed() -> bool {
    input(Part::Resumed).as_deref() == Some(b"1")
}

/// A copying import's answer whole: called once to learn its length, then with room for it.
fn copied(call: impl Fn(*mut u8, i32) -> i32) -> Option<Vec<u8>> {
    let n = call(core::ptr::null_mut(), 0);
    if n < 0 {
        return None;
    }
    let mut buf = alloc::vec![0u8; n as usize];
    call(buf.as_mut_ptr(), n);
    Some(buf)
}

/// `topic`'s members, as JSON: `{"members":[{"who","verified","name","devices","since"}…],
/// "unlisted":n}` (an app that keeps presence: export `presence` answering 1).
pub fn presence(topic: &str) -> Vec<u8> {
    // SAFETY: the pointers and lengths are live slices' (the buffer's, `copied`'s).
    copied(|ptr, cap| unsafe { raw::presence(topic.as_ptr(), len(topic.len()), ptr, cap) })
        .unwrap_or_default()
}

/// Where the verified user `sub` is among the app's objects, as JSON:
/// `{"places":[{"object","topic","devices","since"}…],"last_seen":ms|null}`; `None` for a user
/// the node does not know.
pub fn user(sub: &str) -> Option<Vec<u8>> {
    // SAFETY: the pointers and lengths are live slices' (the buffer's, `copied`'s).
    copied(|ptr, cap| unsafe { raw::user(sub.as_ptr(), len(sub.len()), ptr, cap) })
}

/// A part of the current input, or `None` if it has none.
pub fn input(part: Part) -> Option<Vec<u8>> {
    // SAFETY: a zero capacity copies nothing; the answer is the part's length.
    let n = unsafe { raw::input(part as i32, core::ptr::null_mut(), 0) };
    if n < 0 {
        return None;
    }
    let mut buf = alloc::vec![0u8; n as usize];
    // SAFETY: `buf` holds `n` bytes, the capacity given.
    unsafe { raw::input(part as i32, buf.as_mut_ptr(), n) };
    Some(buf)
}

/// A part of the current input as text (`None` if absent or not UTF-8).
pub fn input_text(part: Part) -> Option<String> {
    input(part).and_then(|b| String::from_utf8(b).ok())
}

/// A session: one WebSocket attached to the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    /// The shard holding its connection.
    pub shard: u32,
    /// Its number on that shard.
    pub id: u64,
    /// The life of the node it belongs to.
    pub life: u64,
}

/// The session of the current message, attach or detach.
pub fn session() -> Option<Session> {
    // SAFETY: imports of the node's, without arguments.
    let (shard, id, life) =
        unsafe { (raw::session_shard(), raw::session_id(), raw::session_life()) };
    if shard < 0 {
        return None;
    }
    Some(Session {
        shard: shard as u32,
        id: id as u64,
        life: life as u64,
    })
}

/// The current request's answer: `status` with this JSON body.
pub fn respond(status: u16, json: &[u8]) {
    // SAFETY: the pointer and length are a live slice's.
    unsafe { raw::respond(i32::from(status), json.as_ptr(), len(json.len())) }
}

/// Fails the current input: `{"error": message}` with `status` (400 to 599), rolled back.
pub fn fail(status: u16, message: &str) {
    // SAFETY: the pointer and length are a live string's.
    unsafe { raw::fail(i32::from(status), message.as_ptr(), len(message.len())) }
}

/// A line of the call's log.
pub fn log(line: &str) {
    // SAFETY: the pointer and length are a live string's.
    unsafe { raw::log(line.as_ptr(), len(line.len())) }
}

/// A parameter of a statement.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// NULL.
    Null,
    /// An integer.
    Int(i64),
    /// Text.
    Text(&'a str),
    /// A blob.
    Blob(&'a [u8]),
}

/// The rows of the last statement (valid until the next one).
#[derive(Debug, Clone, Copy)]
pub struct Rows {
    /// How many.
    pub count: usize,
}

impl Rows {
    /// The integer in row `row`, column `col` (0 if NULL or absent).
    pub fn int(&self, row: usize, col: usize) -> i64 {
        // SAFETY: an import of the node's; any cell is checked by the node.
        unsafe { raw::sql_int(len(row), len(col)) }
    }

    /// The text or blob in row `row`, column `col` (`None` if NULL or absent).
    pub fn bytes(&self, row: usize, col: usize) -> Option<Vec<u8>> {
        // SAFETY: as `input`: a zero capacity asks the length, then a buffer of it is filled.
        unsafe {
            if raw::sql_type(len(row), len(col)) <= 0 {
                return None;
            }
            let n = raw::sql_text(len(row), len(col), core::ptr::null_mut(), 0);
            if n < 0 {
                return None;
            }
            let mut buf = alloc::vec![0u8; n as usize];
            raw::sql_text(len(row), len(col), buf.as_mut_ptr(), n);
            Some(buf)
        }
    }
}

/// Runs one statement with `params` (`?1`, `?2`, ...) in the call's transaction: its rows, or
/// the error SQLite gave. A limit it meets fails the call whatever the module does.
pub fn sql(query: &str, params: &[Value<'_>]) -> Result<Rows, String> {
    for p in params {
        // SAFETY: the pointers and lengths are live slices'.
        unsafe {
            match *p {
                Value::Null => raw::sql_bind_null(),
                Value::Int(v) => raw::sql_bind_int(v),
                Value::Text(t) => raw::sql_bind_text(t.as_ptr(), len(t.len())),
                Value::Blob(b) => raw::sql_bind_blob(b.as_ptr(), len(b.len())),
            }
        }
    }
    // SAFETY: the pointer and length are a live string's.
    let n = unsafe { raw::sql(query.as_ptr(), len(query.len())) };
    if n >= 0 {
        return Ok(Rows { count: n as usize });
    }
    let mut buf = alloc::vec![0u8; 512];
    // SAFETY: `buf` holds 512 bytes, the capacity given.
    let m = unsafe { raw::sql_error(buf.as_mut_ptr(), 512) }.clamp(0, 512);
    buf.truncate(m as usize);
    Err(String::from_utf8(buf).unwrap_or_default())
}

/// Sends a text message to `to`, once the call commits.
pub fn send(to: Session, text: &str) {
    // SAFETY: the pointer and length are a live string's.
    unsafe {
        raw::send(
            to.shard as i32,
            to.id as i64,
            text.as_ptr(),
            len(text.len()),
        )
    };
}

/// Sends a text message to every session of the object on `topic`, once the call commits.
pub fn broadcast(topic: &str, text: &str) {
    // SAFETY: the pointers and lengths are live strings'.
    unsafe {
        raw::broadcast(
            topic.as_ptr(),
            len(topic.len()),
            text.as_ptr(),
            len(text.len()),
        )
    };
}

/// Sets a durable alarm at `at_ms` (Unix milliseconds) with `payload`: its id.
pub fn set_alarm(at_ms: u64, payload: &[u8]) -> i64 {
    // SAFETY: the pointer and length are a live slice's.
    unsafe { raw::set_alarm(at_ms as i64, payload.as_ptr(), len(payload.len())) }
}

/// Cancels alarm `id`: whether it was pending.
pub fn cancel_alarm(id: i64) -> bool {
    // SAFETY: an import of the node's.
    unsafe { raw::cancel_alarm(id) == 1 }
}

/// Deletes this object once the call's batch is durable and answered: its database, alarms,
/// outbox, inbox and logs; its sessions close with 4404. What comes next finds a new, empty
/// object of the same name.
pub fn delete() {
    // SAFETY: an import of the node's.
    unsafe {
        raw::delete();
    }
}

/// Sends `body` to object `name` of `app`, exactly once, after the call commits: its id.
pub fn send_to_object(app: &str, name: &str, body: &[u8]) -> i64 {
    // SAFETY: the pointers and lengths are live slices'.
    unsafe {
        raw::send_to_object(
            app.as_ptr(),
            len(app.len()),
            name.as_ptr(),
            len(name.len()),
            body.as_ptr(),
            len(body.len()),
        )
    }
}

/// A NUL-terminated string for an export that answers one (`schema`, `topic`): `s` must end
/// with `\0`.
pub fn c_str(s: &'static str) -> *const u8 {
    debug_assert!(s.ends_with('\0'));
    s.as_ptr()
}

/// Leaks `s` with a NUL after it, for an export that answers a string made at run time (the
/// instance is thrown away after the call).
pub fn c_string(mut s: String) -> *const u8 {
    s.push('\0');
    let p = s.as_ptr();
    core::mem::forget(s);
    p
}

/// `text` with its `%XX` escapes decoded, and with `+` as a space when `plus` (a query's
/// form encoding); `None` for a bad escape or bytes that are not UTF-8.
pub fn percent_decode(text: &str, plus: bool) -> Option<String> {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = core::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The query parameter `name` of the current request, decoded (`+` is a space); the first if
/// it is given more than once; `Some("")` for one given without a value; `None` if absent (or
/// not decodable).
pub fn query(name: &str) -> Option<String> {
    let q = input_text(Part::Query)?;
    q.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k, true)? == name).then(|| percent_decode(v, true))?
    })
}

/// The header field `name` of the current request (compared without case), if the app declared
/// it (`headers` export) and the request has it.
pub fn header(name: &str) -> Option<String> {
    let all = input_text(Part::Headers)?;
    all.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| String::from(v.trim()))
    })
}

/// `s` as a JSON string, quoted and escaped.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                out.push_str(&alloc::format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Writes a panic's message (what `std::panic::set_hook` is given, which displays as it) to the
/// call's log, so it is not lost with the trap that follows. In a module that links `std`:
///
/// ```ignore
/// std::panic::set_hook(Box::new(|info| combd_guest::log_panic(info)));
/// ```
pub fn log_panic(info: &dyn core::fmt::Display) {
    // Today's std says `panicked at <file>:<line>:<col>:` and the message on the next line.
    log(&alloc::format!("{info}").replace('\n', " "));
}
