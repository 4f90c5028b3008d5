//! The host side of one call: the state a module's imports reach (the call's [`Cx`], its
//! inputs and outputs, the SQL parameters and rows, the captured stdout/stderr, the memory
//! limiter) and the `combd` imports themselves (see the ABI in the crate's docs).

use std::ptr::NonNull;

use combd_kernel::limits::{
    HOST_CALL_TICKS, LOG_MAX_BYTES, WASM_BYTES_PER_TICK, WASM_TABLE_ELEMENT_BYTES,
};
use combd_shards::app::{limit_error, AppError, Cx, Input, Message, SessionId};
use combd_shards::http::carries_body;
use combd_shards::limit::Limit;
use wasmtime::{Caller, Linker, ResourceLimiter};

use crate::sql_state::Sql;

/// Why a call stopped before its module returned: a limit, or a host call that failed the
/// call (the module trapped on purpose). Travels as the error of the host call.
#[derive(Debug)]
pub(crate) struct Stop(pub AppError);

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for Stop {}

/// One input, copied out of the node's borrowed [`Input`] so the module can read it.
#[derive(Debug, Clone, Default)]
pub(crate) struct CallInput {
    /// 0 HTTP, 1 text message, 2 binary message, 3 attach, 4 detach, 5 alarm, 6 a message
    /// from another object.
    pub kind: i32,
    pub session: Option<SessionId>,
    pub method: Option<String>,
    pub query: Option<String>,
    pub body: Vec<u8>,
    /// The client the input's token named: its subject and its name, if any.
    pub client: Option<(String, Option<String>)>,
    /// What else the node saw of it (`input` parts 5 to 8).
    pub caller: Option<std::sync::Arc<combd_shards::app::Caller>>,
    /// Parts 5 and 8 as the module reads them (the client's address; the declared header
    /// fields, `name: value` lines), made once per input, not at each `input` call.
    pub caller_text: Option<(Option<String>, Vec<u8>)>,
    /// The object's own name (`input` part 9).
    pub object: Option<String>,
    /// For an alarm (kind 5): its id and how late it fires, in milliseconds.
    pub alarm: Option<(i64, u64)>,
    /// For a message from another object (kind 6): its app and name (`input` parts 10, 11).
    pub from: Option<(String, String)>,
    /// For an attach: whether its session resumes from its topic's log (`input` part 12).
    pub resumed: Option<bool>,
}

/// The client of an input, as a module reads it (`input` parts 3 and 4).
fn client_of(c: Option<&combd_shards::app::Client>) -> Option<(String, Option<String>)> {
    c.map(|c| (c.subject.clone(), c.name.clone()))
}

/// Parts 5 and 8 of an input, as a module reads them: the client's address, and the declared
/// header fields as `name: value` lines.
fn caller_text(c: &combd_shards::app::Caller) -> (Option<String>, Vec<u8>) {
    let mut headers = Vec::new();
    for (n, v) in &c.headers {
        headers.extend_from_slice(n.as_bytes());
        headers.extend_from_slice(b": ");
        headers.extend_from_slice(v.as_bytes());
        headers.push(b'\n');
    }
    (c.addr.map(|a| a.to_string()), headers)
}

impl CallInput {
    /// What a request and an attach share: the query, the client, what the node saw of the
    /// caller.
    fn asked(
        query: Option<&str>,
        client: Option<&combd_shards::app::Client>,
        caller: &combd_shards::app::Caller,
    ) -> CallInput {
        CallInput {
            query: query.map(str::to_string),
            client: client_of(client),
            caller: Some(std::sync::Arc::new(caller.clone())),
            caller_text: Some(caller_text(caller)),
            ..CallInput::default()
        }
    }

    pub fn new(input: &Input<'_>) -> CallInput {
        match *input {
            Input::Http {
                method,
                query,
                body,
                client,
                caller,
            } => CallInput {
                kind: 0,
                method: Some(method.to_string()),
                body: body.to_vec(),
                ..CallInput::asked(query, client, caller)
            },
            Input::Message {
                session,
                msg,
                client,
            } => {
                let (kind, body) = match msg {
                    Message::Text(t) => (1, t.as_bytes().to_vec()),
                    Message::Binary(b) => (2, b.to_vec()),
                };
                CallInput {
                    kind,
                    session: Some(session),
                    body,
                    client: client_of(client),
                    ..CallInput::default()
                }
            }
            Input::Attach {
                session,
                query,
                client,
                caller,
                resumed,
            } => CallInput {
                kind: 3,
                session: Some(session),
                resumed: Some(resumed),
                ..CallInput::asked(query, client, caller)
            },
            Input::Detach { session } => CallInput {
                kind: 4,
                session: Some(session),
                ..CallInput::default()
            },
            Input::Alarm {
                id,
                payload,
                late_ms,
            } => CallInput {
                kind: 5,
                body: payload.to_vec(),
                alarm: Some((id, late_ms)),
                ..CallInput::default()
            },
            Input::FromObject { app, name, body } => CallInput {
                kind: 6,
                body: body.to_vec(),
                from: Some((app.to_string(), name.to_string())),
                ..CallInput::default()
            },
        }
    }
}

/// What the module answered for one input.
#[derive(Debug, Clone, Default)]
pub(crate) struct Answer {
    /// `respond`: a status and a body (JSON unless `content_type` said otherwise).
    pub response: Option<(u16, Vec<u8>)>,
    /// `content_type`: the answer's content type (ABI v2).
    pub content_type: Option<String>,
    /// `header`: header fields of the answer (ABI v2), each one an app may set.
    pub headers: Vec<(&'static str, String)>,
    /// `fail`: a status and a message.
    pub failure: Option<(u16, String)>,
}

/// Caps what a module's instance may hold: linear memory and tables together, in bytes.
#[derive(Debug)]
pub(crate) struct Limiter {
    pub max_bytes: usize,
    memory: usize,
    tables: usize,
    /// Growth past `max_bytes` was asked for.
    pub tripped: bool,
}

impl Limiter {
    pub fn new(max_bytes: usize) -> Limiter {
        Limiter {
            max_bytes,
            memory: 0,
            tables: 0,
            tripped: false,
        }
    }
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        // Past the memory's own maximum the growth fails whatever this answers (wasmtime asks
        // all the same): `memory.grow` answers -1, and nothing is counted (each such growth
        // was, so a module probing past its maximum was soon killed with `memory_limit`
        // holding a fraction of it).
        if maximum.is_some_and(|m| desired > m) {
            return Ok(false);
        }
        let after = self.memory + desired.saturating_sub(current);
        if after + self.tables > self.max_bytes {
            self.tripped = true;
            return Err(Stop(limit_error(Limit::Memory)).into());
        }
        self.memory = after;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if maximum.is_some_and(|m| desired > m) {
            return Ok(false);
        }
        let grow = desired.saturating_sub(current) * WASM_TABLE_ELEMENT_BYTES;
        if self.memory + self.tables + grow > self.max_bytes {
            self.tripped = true;
            return Err(Stop(limit_error(Limit::Memory)).into());
        }
        self.tables += grow;
        Ok(true)
    }

    fn instances(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        1
    }
}

/// What a module writes to stdout and stderr (and `combd.log`), up to [`LOG_MAX_BYTES`] a
/// request; the rest is cut and a marker says so.
#[derive(Debug, Default)]
pub(crate) struct Output {
    pub bytes: Vec<u8>,
    pub cut: bool,
}

impl Output {
    /// Bytes still kept (as an i32 length).
    pub fn room(&self) -> i32 {
        i32::try_from(LOG_MAX_BYTES.saturating_sub(self.bytes.len())).unwrap_or(i32::MAX)
    }

    pub fn write(&mut self, data: &[u8]) {
        let room = LOG_MAX_BYTES.saturating_sub(self.bytes.len());
        if data.len() > room {
            self.cut = true;
        }
        self.bytes.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// The lines written, then the marker if output was cut.
    pub fn lines(&self) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.bytes);
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        if self.cut {
            lines.push(format!(
                "[module output past {} KiB cut]",
                LOG_MAX_BYTES / 1024
            ));
        }
        lines
    }
}

/// The state of one call's store.
pub(crate) struct Host {
    /// The node's context for the call, while a `handle` runs (None for `topic`, `schema`).
    cx: Option<NonNull<Cx<'static>>>,
    pub inputs: Vec<CallInput>,
    pub current: usize,
    pub answers: Vec<Answer>,
    pub sql: Sql,
    pub output: Output,
    pub limiter: Limiter,
    /// A limit or failure that stops the call, whatever the module does next.
    pub stopped: Option<AppError>,
    /// The last answer of `presence` or `user`, copied out from here.
    pub reply: Vec<u8>,
}

impl Host {
    pub fn new(inputs: Vec<CallInput>, memory_bytes: usize) -> Host {
        let answers = vec![Answer::default(); inputs.len().max(1)];
        Host {
            cx: None,
            inputs,
            current: 0,
            answers,
            sql: Sql::default(),
            output: Output::default(),
            limiter: Limiter::new(memory_bytes),
            stopped: None,
            reply: Vec::new(),
        }
    }

    /// Lends the call's context to the store for the duration of `f`.
    pub fn with_cx<R>(
        store: &mut wasmtime::Store<Host>,
        cx: &mut Cx<'_>,
        f: impl FnOnce(&mut wasmtime::Store<Host>) -> R,
    ) -> R {
        // The pointer is only dereferenced by host calls made while `f` runs, and is cleared
        // before this returns; `cx` outlives `f`, so the erased lifetime is never exceeded.
        store.data_mut().cx = NonNull::new((cx as *mut Cx<'_>).cast::<Cx<'static>>());
        let r = f(store);
        store.data_mut().cx = None;
        r
    }

    pub(crate) fn cx(&mut self) -> Result<&mut Cx<'static>, Stop> {
        lent(&mut self.cx)
    }

    /// What the SQL imports use (`sql`): the call's SQL state, its context, and the module's
    /// memory limit in bytes.
    pub(crate) fn sql_parts(&mut self) -> (&mut Sql, Result<&mut Cx<'static>, Stop>, u64) {
        let max = self.limiter.max_bytes as u64;
        (&mut self.sql, lent(&mut self.cx), max)
    }

    pub(crate) fn input(&self) -> &CallInput {
        static NONE: CallInput = CallInput {
            kind: -1,
            session: None,
            method: None,
            query: None,
            body: Vec::new(),
            client: None,
            caller: None,
            caller_text: None,
            object: None,
            alarm: None,
            from: None,
            resumed: None,
        };
        self.inputs.get(self.current).unwrap_or(&NONE)
    }

    /// Stops the call with `e` (the first stop wins).
    pub(crate) fn stop(&mut self, e: AppError) -> wasmtime::Error {
        let first = self.stopped.get_or_insert(e).clone();
        Stop(first).into()
    }
}

/// The call's context lent to the store (`Host::with_cx`), while an input is handled.
fn lent<'h>(cx: &'h mut Option<NonNull<Cx<'static>>>) -> Result<&'h mut Cx<'static>, Stop> {
    match cx {
        // SAFETY: set by `with_cx` from a live `&mut Cx` for exactly the time `f` runs
        // (see there); host calls run inside `f` on this thread, and the store holding
        // the pointer is borrowed mutably by the caller (through `cx`), so no other
        // reference exists.
        Some(p) => Ok(unsafe { p.as_mut() }),
        None => Err(Stop(AppError::new(
            500,
            "this host call is only possible while handling an input",
        ))),
    }
}

/// The module's linear memory, from inside a host call.
fn memory(caller: &mut Caller<'_, Host>) -> wasmtime::Result<wasmtime::Memory> {
    caller
        .get_export("memory")
        .and_then(|e| e.into_memory())
        .ok_or_else(|| wasmtime::Error::msg("the module exports no memory"))
}

/// The fuel of copying `n` bytes into or out of a module: a tick every [`WASM_BYTES_PER_TICK`]
/// bytes or part of them, so every byte copied is paid for.
fn copy_ticks(n: usize) -> u64 {
    (n as u64).div_ceil(WASM_BYTES_PER_TICK)
}

/// Copies `len` bytes at `ptr` out of the module's memory ([`copy_ticks`]).
pub(crate) fn read(caller: &mut Caller<'_, Host>, ptr: i32, len: i32) -> wasmtime::Result<Vec<u8>> {
    spend(caller, copy_ticks(len.max(0) as usize))?;
    let mem = memory(caller)?;
    let (p, n) = (ptr as u32 as usize, len as u32 as usize);
    mem.data(&caller)
        .get(p..p.saturating_add(n))
        .map(<[u8]>::to_vec)
        .ok_or_else(|| wasmtime::Error::msg("a host call read outside the module's memory"))
}

/// Writes `bytes` at `ptr` into the module's memory, up to `cap` bytes ([`copy_ticks`]).
pub(crate) fn write(
    caller: &mut Caller<'_, Host>,
    ptr: i32,
    cap: i32,
    bytes: &[u8],
) -> wasmtime::Result<()> {
    let n = bytes.len().min(cap.max(0) as usize);
    spend(caller, copy_ticks(n))?;
    let mem = memory(caller)?;
    let p = ptr as u32 as usize;
    mem.data_mut(&mut *caller)
        .get_mut(p..p.saturating_add(n))
        .ok_or_else(|| wasmtime::Error::msg("a host call wrote outside the module's memory"))?
        .copy_from_slice(&bytes[..n]);
    Ok(())
}

/// Copies what `src` finds in the call's state into the module's memory at `ptr`, up to `cap`
/// bytes ([`copy_ticks`] of them), straight from where it lies: never a copy of the whole of
/// it first (a module asking for none of a 1 MiB body in a loop had it cloned at each call,
/// for nothing). Answers its full length, or -1 when `src` finds nothing.
pub(crate) fn copy_out(
    caller: &mut Caller<'_, Host>,
    ptr: i32,
    cap: i32,
    src: impl Fn(&Host) -> Option<&[u8]>,
) -> wasmtime::Result<i32> {
    let Some(full) = src(caller.data()).map(<[u8]>::len) else {
        return Ok(-1);
    };
    let n = full.min(cap.max(0) as usize);
    spend(caller, copy_ticks(n))?;
    if n > 0 {
        let mem = memory(caller)?;
        let p = ptr as u32 as usize;
        let (data, host) = mem.data_and_store_mut(&mut *caller);
        let bytes = src(host).unwrap_or_default();
        data.get_mut(p..p.saturating_add(n))
            .ok_or_else(|| wasmtime::Error::msg("a host call wrote outside the module's memory"))?
            .copy_from_slice(&bytes[..n]);
    }
    Ok(len(full))
}

/// Takes `ticks` of the call's fuel; past it the call stops with `cpu_limit`.
fn spend(caller: &mut Caller<'_, Host>, ticks: u64) -> wasmtime::Result<()> {
    let fuel = caller.get_fuel()?;
    if fuel < ticks {
        return Err(caller.data_mut().stop(limit_error(Limit::Cpu)));
    }
    caller.set_fuel(fuel - ticks)
}

/// Counts a host call against the call's fuel, like [`HOST_CALL_TICKS`] for native apps.
pub(crate) fn charge(caller: &mut Caller<'_, Host>) -> wasmtime::Result<()> {
    spend(caller, HOST_CALL_TICKS)
}

pub(crate) fn text(bytes: Vec<u8>, what: &str) -> wasmtime::Result<String> {
    String::from_utf8(bytes).map_err(|_| wasmtime::Error::msg(format!("{what} is not UTF-8")))
}

/// A `fail` status: 400 to 599, else 500.
fn status(s: i32, default: u16) -> u16 {
    u16::try_from(s)
        .ok()
        .filter(|s| (400..=599).contains(s))
        .unwrap_or(default)
}

/// A length for the module: the full length, whatever was copied.
pub(crate) fn len(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// Part `part` of an input, as the `input` import reads it (see the ABI in the README).
fn input_part(i: &CallInput, part: i32) -> Option<&[u8]> {
    fn text(s: &Option<String>) -> Option<&[u8]> {
        s.as_deref().map(str::as_bytes)
    }
    let caller = i.caller.as_deref();
    match part {
        0 => Some(&i.body),
        1 => text(&i.query),
        2 => text(&i.method),
        // The verified client (README "Who the client is"): its subject, its name.
        3 => i.client.as_ref().map(|(sub, _)| sub.as_bytes()),
        4 => i.client.as_ref().and_then(|(_, n)| text(n)),
        // ABI v2 (README "What an app sees"): the client's address, its Origin, the path
        // under the object, the header fields the module declared.
        5 => i.caller_text.as_ref().and_then(|(addr, _)| text(addr)),
        6 => caller.and_then(|c| text(&c.origin)),
        7 => caller.and_then(|c| text(&c.rest)),
        8 => i
            .caller_text
            .as_ref()
            .map(|(_, headers)| headers.as_slice()),
        9 => text(&i.object),
        10 => i.from.as_ref().map(|(a, _)| a.as_bytes()),
        11 => i.from.as_ref().map(|(_, n)| n.as_bytes()),
        // An attach that resumes from its topic's log ("Resuming a WebSocket"): "1", else "0".
        12 => i.resumed.map(|r| if r { &b"1"[..] } else { &b"0"[..] }),
        _ => None,
    }
}

/// Defines the host's own `combd` imports (the input, the answer, sends, the log); the SQL
/// ones are `sql`'s, the second version's `v2`'s.
pub(crate) fn link(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    link_input(linker)?;
    link_sends(linker)
}

fn link_input(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap("combd", "kind", |c: Caller<'_, Host>| c.data().input().kind)?;
    linker.func_wrap("combd", "session_shard", |c: Caller<'_, Host>| {
        c.data().input().session.map_or(-1, |s| s.shard as i32)
    })?;
    linker.func_wrap("combd", "session_id", |c: Caller<'_, Host>| {
        c.data().input().session.map_or(-1, |s| s.id as i64)
    })?;
    // ABI v2: the life of the node the session belongs to (positive), so a module can tell a
    // session it kept from another life (README "Session ids").
    linker.func_wrap("combd", "session_life", |c: Caller<'_, Host>| {
        c.data().input().session.map_or(-1, |s| s.life as i64)
    })?;
    linker.func_wrap(
        "combd",
        "input",
        |mut c: Caller<'_, Host>, part: i32, ptr: i32, cap: i32| -> wasmtime::Result<i32> {
            copy_out(&mut c, ptr, cap, |h| input_part(h.input(), part))
        },
    )?;
    linker.func_wrap("combd", "select", |mut c: Caller<'_, Host>, i: i32| {
        let h = c.data_mut();
        match usize::try_from(i).ok().filter(|&i| i < h.inputs.len()) {
            Some(i) => {
                h.current = i;
                h.inputs[i].kind
            }
            None => -1,
        }
    })?;
    link_answer(linker)
}

/// The answer's imports: `respond`, `fail`, and the call's `log`.
fn link_answer(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "combd",
        "respond",
        |mut c: Caller<'_, Host>, s: i32, ptr: i32, n: i32| -> wasmtime::Result<()> {
            let body = read(&mut c, ptr, n)?;
            let h = c.data_mut();
            if let Some(a) = h.answers.get_mut(h.current) {
                match u16::try_from(s).ok().filter(|&s| carries_body(s)) {
                    Some(s) => a.response = Some((s, body)),
                    None => {
                        a.failure = Some((
                            500,
                            format!("the module responded with status {s}: respond takes 200 to 599 but 204 and 304"),
                        ))
                    }
                }
            }
            Ok(())
        },
    )?;
    linker.func_wrap(
        "combd",
        "fail",
        |mut c: Caller<'_, Host>, s: i32, ptr: i32, n: i32| -> wasmtime::Result<()> {
            let msg = String::from_utf8_lossy(&read(&mut c, ptr, n)?).into_owned();
            let h = c.data_mut();
            if let Some(a) = h.answers.get_mut(h.current) {
                a.failure = Some((status(s, 500), msg));
            }
            Ok(())
        },
    )?;
    linker.func_wrap(
        "combd",
        "log",
        |mut c: Caller<'_, Host>, ptr: i32, n: i32| -> wasmtime::Result<()> {
            charge(&mut c)?;
            let kept = n.clamp(0, c.data().output.room());
            let mut line = read(&mut c, ptr, kept)?;
            line.push(b'\n');
            let out = &mut c.data_mut().output;
            out.write(&line);
            out.cut |= kept < n;
            Ok(())
        },
    )?;
    Ok(())
}

/// A host call that goes through the call's [`Cx`]; an error from it (a limit) stops the call.
fn through_cx(
    c: &mut Caller<'_, Host>,
    f: impl FnOnce(&mut Cx<'static>) -> Result<(), AppError>,
) -> wasmtime::Result<i32> {
    charge(c)?;
    let h = c.data_mut();
    match h.cx().map_err(|Stop(e)| e).and_then(f) {
        Ok(()) => Ok(0),
        Err(e) => Err(h.stop(e)),
    }
}

fn link_sends(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "combd",
        "send",
        |mut c: Caller<'_, Host>, shard: i32, id: i64, ptr: i32, n: i32| -> wasmtime::Result<i32> {
            let t = text(read(&mut c, ptr, n)?, "a text message")?;
            // A module names a session of this life (`session_life` tells which it is).
            let to = SessionId::new(shard as u32, id as u64);
            through_cx(&mut c, |cx| cx.send(to, &t))
        },
    )?;
    linker.func_wrap(
        "combd",
        "send_binary",
        |mut c: Caller<'_, Host>, shard: i32, id: i64, ptr: i32, n: i32| -> wasmtime::Result<i32> {
            let b = read(&mut c, ptr, n)?;
            // A module names a session of this life (`session_life` tells which it is).
            let to = SessionId::new(shard as u32, id as u64);
            through_cx(&mut c, |cx| cx.send_binary(to, &b))
        },
    )?;
    linker.func_wrap(
        "combd",
        "broadcast",
        |mut c: Caller<'_, Host>, tp: i32, tn: i32, ptr: i32, n: i32| -> wasmtime::Result<i32> {
            let topic = text(read(&mut c, tp, tn)?, "a topic")?;
            let t = text(read(&mut c, ptr, n)?, "a text message")?;
            through_cx(&mut c, |cx| cx.broadcast(&topic, &t))
        },
    )?;
    Ok(())
}
