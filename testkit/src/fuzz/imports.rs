//! The script of the `host_imports` fuzz target: a WebAssembly module that calls the node's
//! imports in any order with any arguments, and what clients do with it. Pure (no I/O):
//! [`decode`] turns the fuzzer's input into a [`Script`], [`encode`] turns a script back into
//! bytes (for the named seeds); [`super::wat`] writes the module, [`super::host`] deploys it on
//! a real node and plays the steps.
//!
//! A script is the module's shape ([`Module`]: its memory, `memory_kb`, `schema`, batches,
//! `topic`, `_initialize`, `resync`), the calls its `handle` makes ([`Call`], each an import
//! with its arguments, or a `memory.grow`, maybe repeated in a loop), the calls made where no
//! input is being handled (`topic` and `_initialize`), and the clients' [`Step`]s (requests
//! pipelined on a few connections, WebSocket sessions attaching, sending, closing).
//!
//! Arguments are drawn so a few bits reach what matters: a pointer or length of one of the
//! dictionary's strings (SQL good and hostile, texts, bad UTF-8, `iovec`s), the end of the
//! memory and just past it, 0, -1, `i32::MIN` and `MAX`, statuses, the result of the previous
//! call, the session's own id. Every input decodes to a script (unknown opcodes wrap around, a
//! truncated operation ends it), so a mutation never wastes a run on a parse error.

use super::cursor::Cursor;
use super::steps::{decode_step, encode_step};
pub use super::steps::{Body, Method, Step, CONNS_MAX, METHODS, OBJECTS};

/// Calls `handle` may make (the body of the module's input function); more are ignored.
pub const CALLS_MAX: usize = 48;
/// Calls made without an input (in `topic` and `_initialize`); more are ignored.
pub const SIDE_CALLS_MAX: usize = 16;
/// Steps of the clients; more are ignored.
pub const STEPS_MAX: usize = 24;
/// The most times a repeated call runs (a loop in the module; fuel ends it sooner).
pub const REPEAT_MAX: u32 = 1 << 16;
/// `memory_kb()` answers by the header's top four bits (`None`: no export, 64 MiB): most are
/// small, so the memory bound the harness checks is tight; the last four are refused at load.
pub const MEMORY_KB: [Option<i32>; 16] = [
    None,
    None,
    Some(64),
    Some(128),
    Some(256),
    Some(512),
    Some(1024),
    Some(1024),
    Some(2048),
    Some(2048),
    Some(4096),
    Some(16384),
    Some(0),
    Some(-1),
    Some(256 * 1024 + 1),
    Some(i32::MAX),
];
/// Statuses an `i32` argument may be (for `respond` and `fail`, but any argument may get one).
pub const STATUSES: [i32; 16] = [
    200, 201, 204, 304, 400, 404, 405, 500, 599, 600, 99, 101, 0, -200, 299, 418,
];

/// A WebAssembly value type of an import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `f64`.
    F64,
}

use Ty::{F64, I32, I64};

/// Every import a module may name: `(module, name, params, result)`. `fd_read`, `sock_accept`
/// and `random_get` are not defined by the node: they get its `ENOSYS` stub.
pub const IMPORTS: &[(&str, &str, &[Ty], Option<Ty>)] = &[
    ("combd", "kind", &[], Some(I32)),
    ("combd", "session_shard", &[], Some(I32)),
    ("combd", "session_id", &[], Some(I64)),
    ("combd", "input", &[I32, I32, I32], Some(I32)),
    ("combd", "select", &[I32], Some(I32)),
    ("combd", "respond", &[I32, I32, I32], None),
    ("combd", "fail", &[I32, I32, I32], None),
    ("combd", "log", &[I32, I32], None),
    ("combd", "sql_bind_null", &[], None),
    ("combd", "sql_bind_int", &[I64], None),
    ("combd", "sql_bind_float", &[F64], None),
    ("combd", "sql_bind_text", &[I32, I32], None),
    ("combd", "sql_bind_blob", &[I32, I32], None),
    ("combd", "sql", &[I32, I32], Some(I32)),
    ("combd", "sql_changes", &[], Some(I64)),
    ("combd", "sql_columns", &[], Some(I32)),
    ("combd", "sql_type", &[I32, I32], Some(I32)),
    ("combd", "sql_int", &[I32, I32], Some(I64)),
    ("combd", "sql_float", &[I32, I32], Some(F64)),
    ("combd", "sql_text", &[I32, I32, I32, I32], Some(I32)),
    ("combd", "sql_error", &[I32, I32], Some(I32)),
    ("combd", "send", &[I32, I64, I32, I32], Some(I32)),
    ("combd", "send_binary", &[I32, I64, I32, I32], Some(I32)),
    ("combd", "broadcast", &[I32, I32, I32, I32], Some(I32)),
    (WASI, "fd_write", &[I32, I32, I32, I32], Some(I32)),
    (WASI, "fd_close", &[I32], Some(I32)),
    (WASI, "fd_fdstat_get", &[I32, I32], Some(I32)),
    (WASI, "fd_prestat_get", &[I32, I32], Some(I32)),
    (WASI, "fd_prestat_dir_name", &[I32, I32, I32], Some(I32)),
    (
        WASI,
        "path_open",
        &[I32, I32, I32, I32, I32, I64, I64, I32, I32],
        Some(I32),
    ),
    (WASI, "environ_sizes_get", &[I32, I32], Some(I32)),
    (WASI, "environ_get", &[I32, I32], Some(I32)),
    (WASI, "args_sizes_get", &[I32, I32], Some(I32)),
    (WASI, "args_get", &[I32, I32], Some(I32)),
    (WASI, "clock_time_get", &[I32, I64, I32], Some(I32)),
    (WASI, "proc_exit", &[I32], None),
    (WASI, "fd_read", &[I32, I32, I32, I32], Some(I32)),
    (WASI, "sock_accept", &[I32, I32, I32], Some(I32)),
    (WASI, "random_get", &[I32, I32], Some(I32)),
];

const WASI: &str = "wasi_snapshot_preview1";

/// The index in [`IMPORTS`] of `name`.
pub fn import(name: &str) -> u8 {
    IMPORTS
        .iter()
        .position(|(_, n, _, _)| *n == name)
        .unwrap_or_else(|| panic!("no import {name}")) as u8
}

/// An `i32` argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum A32 {
    /// A constant.
    Const(i32),
    /// Where dictionary entry `k` starts (`k` modulo the dictionary's size).
    Start(u8),
    /// Entry `k`'s length (without its NUL).
    Len(u8),
    /// Just past entry `k`.
    End(u8),
    /// The memory's current size in bytes, plus this.
    MemEnd(i8),
    /// What the previous call answered (an `i32`; 0 before any).
    Last,
    /// `session_shard()`.
    Shard,
}

/// An argument of an import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    /// An `i32`.
    I32(A32),
    /// An `i64`: a constant, or (`None`) `session_id()`.
    I64(Option<i64>),
    /// An `f64`, by its bits (NaN and infinities included).
    F64(u64),
}

/// One thing the module does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// Calls [`IMPORTS`]`[import]` with `args`, `times` times in a loop (a power of two).
    Import {
        /// The index in [`IMPORTS`].
        import: u8,
        /// One per parameter, of its type.
        args: Vec<Arg>,
        /// How many times.
        times: u32,
    },
    /// `memory.grow` by this many pages.
    Grow(A32),
}

/// The module's shape and code.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Module {
    /// Initial memory, in 64 KiB pages (1 to 4).
    pub pages: u8,
    /// The memory's declared maximum, in pages, if any (at least `pages`).
    pub max_pages: Option<u8>,
    /// What `memory_kb()` answers, if exported.
    pub memory_kb: Option<i32>,
    /// `schema()` exported, answering dictionary entry `k`.
    pub schema: Option<u8>,
    /// `handle_batch` exported: it selects each input in turn and runs `handle`'s calls.
    pub batch: bool,
    /// `topic()` exported: it makes the side calls, then answers 0 (`None`) or entry `k`.
    pub topic: Option<Option<u8>>,
    /// `_initialize` exported: it makes the side calls.
    pub init: bool,
    /// `resync()` exported, answering 1.
    pub resync: bool,
    /// What `handle` answers after its calls (0 is success).
    pub code: i32,
    /// `handle`'s calls.
    pub handle: Vec<Call>,
    /// The calls of `topic` and `_initialize`.
    pub side: Vec<Call>,
}

/// One script: a module and what the clients do with it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Script {
    /// The module.
    pub module: Module,
    /// The clients' steps; never without a request or an attach (a script without one gets
    /// a `POST` to object `a`).
    pub steps: Vec<Step>,
}

/// The script an input stands for.
pub fn decode(data: &[u8]) -> Script {
    let mut c = Cursor::new(data);
    // The header: missing bytes are zeros.
    let [h0, h1, h2, h3] = [0; 4].map(|_| c.byte().unwrap_or(0));
    let pages = 1 + (h1 & 3);
    let mut module = Module {
        pages,
        max_pages: (h1 & 4 != 0).then_some(pages + ((h1 >> 3) & 3)),
        memory_kb: MEMORY_KB[usize::from(h0 >> 4)],
        schema: h2.checked_sub(1),
        batch: h0 & 1 != 0,
        topic: (h0 & 2 != 0).then_some((h3 >> 2).checked_sub(1)),
        init: h0 & 4 != 0,
        resync: h0 & 8 != 0,
        code: [0, 0, 1, -1][usize::from(h3 & 3)],
        ..Module::default()
    };
    let mut steps = Vec::new();
    while let Some(op) = c.byte() {
        let done = match op % 16 {
            0..=5 => decode_call(&mut c, 1).map(|call| push(&mut module.handle, CALLS_MAX, call)),
            6 => c.byte().and_then(|r| {
                decode_call(&mut c, 1 << (r % 17))
                    .map(|call| push(&mut module.handle, CALLS_MAX, call))
            }),
            7 => decode_call(&mut c, 1).map(|call| push(&mut module.side, SIDE_CALLS_MAX, call)),
            8 => a32(&mut c).map(|a| push(&mut module.handle, CALLS_MAX, Call::Grow(a))),
            code => decode_step(&mut c, code).map(|s| push(&mut steps, STEPS_MAX, s)),
        };
        if done.is_none() {
            break;
        }
    }
    if !steps
        .iter()
        .any(|s| matches!(s, Step::Request { .. } | Step::Attach { .. }))
    {
        let post = Step::Request {
            conn: 0,
            method: Method::Post,
            object: 0,
            query: None,
            body: Body::Empty,
        };
        steps.truncate(STEPS_MAX - 1);
        steps.push(post);
    }
    Script { module, steps }
}

fn push<T>(to: &mut Vec<T>, max: usize, item: T) {
    if to.len() < max {
        to.push(item);
    }
}

fn decode_call(c: &mut Cursor<'_>, times: u32) -> Option<Call> {
    let import = c.byte()? % IMPORTS.len() as u8;
    let params = IMPORTS[usize::from(import)].2;
    let mut args = Vec::with_capacity(params.len());
    for ty in params {
        args.push(match ty {
            I32 => Arg::I32(a32(c)?),
            I64 => Arg::I64(a64(c)?),
            F64 => Arg::F64(f64_bits(c)?),
        });
    }
    Some(Call::Import {
        import,
        args,
        times,
    })
}

fn a32(c: &mut Cursor<'_>) -> Option<A32> {
    let b = c.byte()?;
    Some(match b % 16 {
        0 => A32::Const(0),
        1 => A32::Const(1),
        2 => A32::Const(-1),
        3 => A32::Const(i32::MIN),
        4 => A32::Const(i32::MAX),
        5 => A32::Start(c.byte()?),
        6 => A32::Len(c.byte()?),
        7 => A32::End(c.byte()?),
        8 => A32::MemEnd(c.byte()? as i8),
        // The scratch area below the dictionary, 16 bytes apart.
        9 => A32::Const(i32::from(c.byte()?) * 16),
        10 => A32::Const(i32::from(c.byte()?)),
        11 => A32::Const(i32::from_be_bytes(c.array()?)),
        12 => A32::Const(STATUSES[usize::from(c.byte()? % 16)]),
        13 => A32::Const(i32::from(c.byte()? % 8) << 16),
        14 => A32::Last,
        _ => A32::Shard,
    })
}

fn a64(c: &mut Cursor<'_>) -> Option<Option<i64>> {
    let b = c.byte()?;
    Some(match b % 8 {
        0 => Some(0),
        1 => Some(-1),
        2 => Some(i64::MIN),
        3 => Some(i64::MAX),
        4 => None,
        5 => Some(i64::from(c.byte()?)),
        6 => Some(i64::from_be_bytes(c.array()?)),
        _ => Some(1 << 32),
    })
}

fn f64_bits(c: &mut Cursor<'_>) -> Option<u64> {
    let b = c.byte()?;
    Some(match b % 4 {
        0 => 0f64.to_bits(),
        1 => f64::NAN.to_bits(),
        2 => f64::INFINITY.to_bits(),
        _ => u64::from_be_bytes(c.array()?),
    })
}

/// The bytes [`decode`] reads as `script` (its sizes rounded to what the encoding holds:
/// repeats and fillers to powers of two, entries to 0..=238, queries to 0..=62).
pub fn encode(script: &Script) -> Vec<u8> {
    let m = &script.module;
    let kb = MEMORY_KB
        .iter()
        .position(|k| *k == m.memory_kb)
        .unwrap_or(0) as u8;
    let max = m
        .max_pages
        .map_or(0, |x| 4 | (x.saturating_sub(m.pages) & 3) << 3);
    let topic = m.topic.flatten().map_or(0, |k| k.min(62) + 1);
    let code: u8 = match m.code {
        1 => 2,
        -1 => 3,
        _ => 0,
    };
    let mut out = vec![
        u8::from(m.batch)
            | u8::from(m.topic.is_some()) << 1
            | u8::from(m.init) << 2
            | u8::from(m.resync) << 3
            | kb << 4,
        (m.pages.clamp(1, 4) - 1) | max,
        m.schema.map_or(0, |k| k.min(254) + 1),
        topic << 2 | code,
    ];
    for call in &m.handle {
        encode_call(&mut out, call, false);
    }
    for call in &m.side {
        encode_call(&mut out, call, true);
    }
    for step in &script.steps {
        encode_step(&mut out, step);
    }
    out
}

fn encode_call(out: &mut Vec<u8>, call: &Call, side: bool) {
    match call {
        Call::Grow(a) => {
            out.push(8);
            encode_a32(out, *a);
        }
        Call::Import {
            import,
            args,
            times,
        } => {
            match (side, *times) {
                (true, _) => out.push(7),
                (false, 0 | 1) => out.push(0),
                (false, t) => out.extend([6, t.ilog2().min(16) as u8]),
            }
            out.push(*import);
            for a in args {
                match *a {
                    Arg::I32(a) => encode_a32(out, a),
                    Arg::I64(None) => out.push(4),
                    Arg::I64(Some(v)) => {
                        out.push(6);
                        out.extend(v.to_be_bytes());
                    }
                    Arg::F64(bits) => {
                        out.push(3);
                        out.extend(bits.to_be_bytes());
                    }
                }
            }
        }
    }
}

fn encode_a32(out: &mut Vec<u8>, a: A32) {
    match a {
        A32::Const(v) => {
            out.push(11);
            out.extend(v.to_be_bytes());
        }
        A32::Start(k) => out.extend([5, k]),
        A32::Len(k) => out.extend([6, k]),
        A32::End(k) => out.extend([7, k]),
        A32::MemEnd(d) => out.extend([8, d as u8]),
        A32::Last => out.push(14),
        A32::Shard => out.push(15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_arg() -> Vec<Arg> {
        vec![
            Arg::I32(A32::Const(-7)),
            Arg::I32(A32::Start(3)),
            Arg::I32(A32::Len(200)),
            Arg::I32(A32::End(0)),
            Arg::I32(A32::MemEnd(-128)),
            Arg::I32(A32::Last),
            Arg::I32(A32::Shard),
        ]
    }

    #[test]
    fn every_call_and_step_encodes_to_bytes_that_decode_to_it() {
        // Each import once, its arguments cycling through every kind of argument.
        let mut handle = Vec::new();
        let mut n = 0;
        for (i, (_, _, params, _)) in IMPORTS.iter().enumerate() {
            let args = params
                .iter()
                .map(|ty| {
                    n += 1;
                    match ty {
                        Ty::I32 => every_arg()[n % 7],
                        Ty::I64 => [Arg::I64(None), Arg::I64(Some(i64::MIN))][n % 2],
                        Ty::F64 => Arg::F64(f64::NAN.to_bits() ^ n as u64),
                    }
                })
                .collect();
            handle.push(Call::Import {
                import: i as u8,
                args,
                times: if i % 5 == 0 { 1 << (i % 17) } else { 1 },
            });
        }
        handle.truncate(CALLS_MAX - 1);
        handle.push(Call::Grow(A32::MemEnd(3)));
        let script = Script {
            module: Module {
                pages: 3,
                max_pages: Some(5),
                memory_kb: Some(4096),
                schema: Some(17),
                batch: true,
                topic: Some(Some(9)),
                init: true,
                resync: true,
                code: -1,
                handle,
                side: vec![Call::Import {
                    import: import("log"),
                    args: vec![Arg::I32(A32::Start(1)), Arg::I32(A32::Len(1))],
                    times: 1,
                }],
            },
            steps: vec![
                Step::Request {
                    conn: 2,
                    method: Method::Head,
                    object: 1,
                    query: Some(62),
                    body: Body::Filler(1 << 15),
                },
                Step::Flush,
                Step::Attach {
                    object: 2,
                    query: None,
                },
                Step::Message {
                    session: 1,
                    binary: true,
                    body: Body::Entry(238),
                },
                Step::Detach { session: 2 },
            ],
        };
        assert_eq!(decode(&encode(&script)), script);
    }

    #[test]
    fn any_bytes_decode_to_a_bounded_script() {
        let empty = decode(&[]);
        assert_eq!(empty.module.pages, 1);
        assert!(empty.module.handle.is_empty());
        assert_eq!(empty.steps.len(), 1, "a script always makes a request");
        let zeros = decode(&[0u8; 10_000]);
        assert_eq!(zeros.module.handle.len(), CALLS_MAX);
        for seed in 0..64u8 {
            let data: Vec<u8> = (0..4096u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> (seed % 24)) as u8 ^ seed)
                .collect();
            let s = decode(&data);
            let m = &s.module;
            assert!((1..=4).contains(&m.pages));
            assert!(m.max_pages.is_none_or(|x| x >= m.pages));
            assert!(m.handle.len() <= CALLS_MAX && m.side.len() <= SIDE_CALLS_MAX);
            assert!(!s.steps.is_empty() && s.steps.len() <= STEPS_MAX);
            for c in m.handle.iter().chain(&m.side) {
                if let Call::Import {
                    import,
                    args,
                    times,
                } = c
                {
                    assert_eq!(args.len(), IMPORTS[usize::from(*import)].2.len());
                    assert!(*times >= 1 && *times <= REPEAT_MAX && times.is_power_of_two());
                }
            }
        }
    }
}
