//! The `host_imports` fuzz target (`fuzz/fuzz_targets/host_imports.rs`) run as plain tests
//! against the real node: its seed corpus (written from the scenarios below, each a way a
//! hostile or careless module calls the node's imports), then mutants of it from fixed seeds
//! (more with `COMBD_FUZZ_SCRIPTS=N`, from `COMBD_FUZZ_FIRST_SEED`). The harness
//! (`combd_testkit::fuzz::host`) deploys each script's module and checks the node after it: no
//! panic, valid answers, at rest, nothing outside the script's objects changed, denials
//! counted, the memory peak within the module's limit. It panics with the script that broke
//! one.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use combd_testkit::fuzz::host::Harness;
use combd_testkit::fuzz::imports::{
    decode, encode, import, Arg, Body, Call, Method, Module, Script, Step, A32,
};
use combd_testkit::fuzz::wat::{find, must_fail};

/// How long the corpus may take to replay (it takes about a second a script).
const CORPUS_TIME_MAX: Duration = Duration::from_secs(40);
/// Mutated scripts run by default, from fixed seeds.
const RANDOM_SCRIPTS: u64 = 30;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/host_imports")
}

fn c(v: i32) -> Arg {
    Arg::I32(A32::Const(v))
}

fn a(a: A32) -> Arg {
    Arg::I32(a)
}

fn i64(v: i64) -> Arg {
    Arg::I64(Some(v))
}

/// The dictionary's entry that is not UTF-8.
const NOT_UTF8: &[u8] = b"\xff\xfe\xc3 not UTF-8";
/// The dictionary's `iovec`s: one over `hello`, two, one pointing at -1, one of `i32::MAX`
/// bytes.
const IOVS: [u8; 4] = [5, 6, 7, 8];

/// Entry `t`'s start and length.
fn text<T: AsRef<[u8]> + ?Sized>(t: &T) -> [Arg; 2] {
    let k = find(t);
    [a(A32::Start(k)), a(A32::Len(k))]
}

fn call(name: &str, args: &[Arg]) -> Call {
    repeat(1, name, args)
}

fn repeat(times: u32, name: &str, args: &[Arg]) -> Call {
    Call::Import {
        import: import(name),
        args: args.to_vec(),
        times,
    }
}

fn sql(t: &str) -> Call {
    call("sql", &text(t))
}

/// `respond(200, {"ok":1})`.
fn ok() -> Call {
    let [p, n] = text("{\"ok\":1}");
    call("respond", &[c(200), p, n])
}

fn request(conn: u8, method: Method, object: u8, body: Body) -> Step {
    Step::Request {
        conn,
        method,
        object,
        query: None,
        body,
    }
}

fn post(object: u8) -> Step {
    request(0, Method::Post, object, Body::Empty)
}

fn module(memory_kb: Option<i32>, handle: Vec<Call>) -> Module {
    Module {
        pages: 1,
        memory_kb,
        schema: Some(find(
            "CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v)",
        )),
        handle,
        ..Module::default()
    }
}

fn script(module: Module, steps: Vec<Step>) -> Script {
    Script { module, steps }
}

/// The must-fail statements whose text starts with one of `prefixes`, each run by `sql`
/// (the module checks each answered -1), then `{"ok":1}`: the call must answer
/// `sql_denied` or fail, never run one.
fn escapes(prefixes: &[&str]) -> Script {
    let dict = combd_testkit::fuzz::wat::dictionary(&combd_testkit::fuzz::wat::Paths {
        out: "/out".into(),
        data: "/data".into(),
    });
    let mut calls: Vec<Call> = must_fail()
        .into_iter()
        .filter(|&k| {
            let t = String::from_utf8_lossy(&dict[usize::from(k)].1.bytes).into_owned();
            prefixes.iter().any(|p| t.starts_with(p))
        })
        .map(|k| call("sql", &[a(A32::Start(k)), a(A32::Len(k))]))
        .collect();
    assert!(
        !calls.is_empty(),
        "no must-fail statement starts with {prefixes:?}"
    );
    calls.push(ok());
    script(
        module(Some(1024), calls),
        vec![post(0), request(1, Method::Put, 1, Body::Empty)],
    )
}

/// The seed scenarios, by name: each is one file of the corpus.
fn seeds() -> Vec<(&'static str, Script)> {
    let scratch = |at: i32| c(at);
    let session = [a(A32::Shard), Arg::I64(None)];
    vec![
        // A counter kept in SQL: bind, insert, count, read the row back, answer.
        (
            "counter_over_sql",
            script(
                module(
                    Some(1024),
                    vec![
                        call("sql_bind_int", &[i64(5)]),
                        sql("INSERT INTO t (v) VALUES (?1)"),
                        sql("SELECT count(*), total(length(v)) FROM t"),
                        call("sql_int", &[c(0), c(0)]),
                        call("sql_text", &[c(0), c(1), scratch(0), c(64)]),
                        call("sql_columns", &[]),
                        call("sql_changes", &[]),
                        ok(),
                    ],
                ),
                vec![
                    post(0),
                    request(1, Method::Post, 1, Body::Entry(0)),
                    Step::Flush,
                    request(0, Method::Get, 0, Body::Empty),
                    request(2, Method::Head, 2, Body::Empty),
                ],
            ),
        ),
        ("escape_by_attach_and_vacuum", escapes(&["ATTACH", "VACUUM", "DETACH"])),
        (
            "escape_by_transaction_control",
            escapes(&["BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE"]),
        ),
        ("escape_by_pragma", escapes(&["PRAGMA", "SELECT * FROM pragma"])),
        (
            "escape_by_temp_virtual_extension_schema",
            escapes(&["CREATE", "SELECT load", "INSERT INTO sqlite", "UPDATE sqlite", "SELECT * FROM sqlite"]),
        ),
        // A schema that attaches another app's database: the objects do not open.
        (
            "hostile_schema",
            script(
                Module {
                    schema: Some(find("ATTACH DATABASE '{data}/objects/counter/victim.sqlite' AS v")),
                    ..module(None, vec![ok()])
                },
                vec![post(0), post(1)],
            ),
        ),
        // A schema whose statement computes for longer than a statement may: the objects
        // do not open, and the node goes on answering.
        (
            "schema_past_its_time",
            script(
                Module {
                    schema: Some(find("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000000) SELECT sum(i) FROM c")),
                    ..module(Some(1024), vec![ok()])
                },
                vec![
                    post(0),
                    request(1, Method::Post, 1, Body::Empty),
                    Step::Attach {
                        object: 2,
                        query: None,
                    },
                ],
            ),
        ),
        // Endless rows for a module of 256 KiB: stopped at its memory.
        (
            "endless_rows",
            script(
                module(Some(256), vec![sql("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT i, zeroblob(1000) FROM c"), ok()]),
                vec![post(0)],
            ),
        ),
        // Two MB of rows written and read back, then a value past SQLite's length limit.
        (
            "big_rows_and_value",
            script(
                module(
                    Some(4096),
                    vec![
                        sql("INSERT INTO t (v) SELECT zeroblob(100000) FROM (WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 20) SELECT i FROM c)"),
                        sql("SELECT k, v FROM t ORDER BY k"),
                        call("sql_text", &[c(3), c(1), scratch(0), c(4096)]),
                        sql("SELECT zeroblob(3000000)"),
                        ok(),
                    ],
                ),
                vec![post(2)],
            ),
        ),
        // A statement that computes for longer than a statement may.
        (
            "long_statement",
            script(
                module(
                    Some(1024),
                    vec![
                        sql("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000000) SELECT sum(i) FROM c"),
                        ok(),
                    ],
                ),
                vec![post(0), post(1)],
            ),
        ),
        // Copies cut at their cap, zero and negative caps, rows and columns out of range.
        (
            "copies_and_reads_at_their_edges",
            script(
                module(
                    Some(512),
                    vec![
                        call("input", &[c(0), scratch(0), c(2)]),
                        call("input", &[c(1), scratch(64), c(0)]),
                        call("input", &[c(2), scratch(128), c(-1)]),
                        call("input", &[c(7), scratch(0), c(16)]),
                        sql("SELECT ?1, ?2, ?3, ?4, ?5"),
                        call("sql_type", &[c(0), c(-1)]),
                        call("sql_type", &[c(i32::MAX), c(0)]),
                        call("sql_int", &[c(-1), c(-1)]),
                        call("sql_float", &[c(0), c(4)]),
                        call("sql_text", &[c(0), c(0), scratch(0), c(0)]),
                        call("sql_text", &[c(0), c(9), scratch(0), c(64)]),
                        sql("hello"),
                        call("sql_error", &[scratch(0), c(8)]),
                        call("sql_error", &[scratch(0), c(-8)]),
                        call("select", &[c(3)]),
                        call("kind", &[]),
                        call("session_id", &[]),
                        ok(),
                    ],
                ),
                vec![
                    Step::Request {
                        conn: 0,
                        method: Method::Put,
                        object: 1,
                        query: Some(find("hello")),
                        body: Body::Filler(64),
                    },
                    request(0, Method::Delete, 1, Body::Empty),
                    request(0, Method::Patch, 1, Body::Entry(1)),
                ],
            ),
        ),
        // Pointers and lengths outside the memory: each traps its input.
        (
            "outside_the_memory",
            script(
                module(
                    Some(1024),
                    vec![call("input", &[c(0), a(A32::MemEnd(-2)), c(64)])],
                ),
                vec![
                    request(0, Method::Post, 0, Body::Filler(128)),
                    request(0, Method::Post, 0, Body::Empty),
                ],
            ),
        ),
        (
            "negative_and_huge_lengths",
            script(
                module(
                    Some(1024),
                    vec![
                        call("log", &[a(A32::Start(1)), c(-1)]),
                        call("respond", &[c(200), c(i32::MIN), c(i32::MAX)]),
                        call("sql", &[a(A32::MemEnd(0)), c(1)]),
                    ],
                ),
                vec![post(0)],
            ),
        ),
        // Answers a client cannot be given: no body on 204 or 304, no 1xx, a fail of 200.
        (
            "statuses",
            script(
                module(
                    None,
                    vec![
                        call("respond", &[c(204), a(A32::Start(0)), a(A32::Len(0))]),
                        call("respond", &[c(304), a(A32::Start(0)), a(A32::Len(0))]),
                        call("respond", &[c(101), a(A32::Start(0)), a(A32::Len(0))]),
                        call("fail", &[c(200), a(A32::Start(1)), a(A32::Len(1))]),
                    ],
                ),
                vec![post(0), request(0, Method::Head, 0, Body::Empty)],
            ),
        ),
        // A module that answers nothing: 204, without a body or its length.
        (
            "no_answer",
            script(
                module(Some(1024), vec![call("kind", &[])]),
                vec![post(0), request(0, Method::Get, 1, Body::Empty)],
            ),
        ),
        // Sends to its own session, a binary, a broadcast, and to sessions that are not its.
        (
            "sends_and_broadcasts",
            script(
                Module {
                    topic: Some(Some(find("t"))),
                    ..module(
                        Some(2048),
                        vec![
                            call("send", &[session[0], session[1], text("hello")[0], text("hello")[1]]),
                            call("send_binary", &[session[0], session[1], text("{}")[0], text("{}")[1]]),
                            call("broadcast", &[text("t")[0], text("t")[1], text("{\"ok\":1}")[0], text("{\"ok\":1}")[1]]),
                            call("send", &[c(0), i64(i64::MAX), text("hello")[0], text("hello")[1]]),
                            call("send", &[c(-1), i64(-1), text("hello")[0], text("hello")[1]]),
                        ]
                        .into_iter()
                        // Sessions 0 to 15 of shard 0: among them one of object c's.
                        .chain((0..16).map(|id| call("send", &[c(0), i64(id), text("hello")[0], text("hello")[1]])))
                        .chain([ok()])
                        .collect(),
                    )
                },
                vec![
                    Step::Attach {
                        object: 2,
                        query: None,
                    },
                    Step::Attach {
                        object: 0,
                        query: Some(find("t")),
                    },
                    Step::Attach {
                        object: 0,
                        query: None,
                    },
                    Step::Message {
                        session: 1,
                        binary: false,
                        body: Body::Entry(find("hello")),
                    },
                    Step::Message {
                        session: 2,
                        binary: true,
                        body: Body::Entry(find("{}")),
                    },
                    post(0),
                    Step::Flush,
                    Step::Detach { session: 1 },
                    Step::Message {
                        session: 2,
                        binary: false,
                        body: Body::Filler(4096),
                    },
                ],
            ),
        ),
        // A text message that is not UTF-8: the input traps.
        (
            "send_not_utf8",
            script(
                module(
                    Some(1024),
                    vec![call("send", &[session[0], session[1], text(NOT_UTF8)[0], text(NOT_UTF8)[1]])],
                ),
                vec![
                    Step::Attach {
                        object: 2,
                        query: None,
                    },
                    post(2),
                ],
            ),
        ),
        // More than a call may send: 32 MiB to its own session (when attaching) and to none
        // (a request's).
        (
            "past_the_send_limit",
            script(
                Module {
                    pages: 4,
                    // 64 MiB: sends count against the memory too.
                    ..module(
                        None,
                        vec![repeat(256, "send", &[session[0], session[1], c(1 << 16), c(1 << 17)])],
                    )
                },
                vec![
                    Step::Attach {
                        object: 0,
                        query: None,
                    },
                    post(0),
                ],
            ),
        ),
        // Parameters bound and never used, far past the module's memory.
        (
            "bind_flood",
            script(
                Module {
                    pages: 2,
                    ..module(
                        Some(1024),
                        vec![
                            repeat(4096, "sql_bind_blob", &[c(0), c(1 << 16)]),
                            repeat(1 << 16, "sql_bind_int", &[i64(1)]),
                            ok(),
                        ],
                    )
                },
                vec![post(0)],
            ),
        ),
        // A batch: inputs pipelined on three connections, each selected and answered.
        (
            "batches",
            script(
                Module {
                    batch: true,
                    ..module(
                        Some(1024),
                        vec![
                            call("kind", &[]),
                            call("input", &[c(0), scratch(0), c(256)]),
                            call("sql_bind_text", &[scratch(0), a(A32::Last)]),
                            sql("INSERT INTO t (v) VALUES (?1)"),
                            call("respond", &[c(200), text("{}")[0], text("{}")[1]]),
                        ],
                    )
                },
                (0..12)
                    .map(|i| request(i % 3, Method::Post, 0, Body::Entry(find("{\"ok\":1}"))))
                    .collect(),
            ),
        ),
        // WASI: stdout, stderr, the clock, the environment, files, sockets, exit.
        (
            "wasi",
            script(
                module(
                    Some(1024),
                    vec![
                        call("fd_write", &[c(1), a(A32::Start(IOVS[0])), c(1), scratch(0)]),
                        call("fd_write", &[c(2), a(A32::Start(IOVS[1])), c(2), scratch(0)]),
                        call("fd_write", &[c(7), a(A32::Start(IOVS[0])), c(1), scratch(0)]),
                        call("clock_time_get", &[c(0), i64(1), scratch(16)]),
                        call("environ_sizes_get", &[scratch(0), scratch(4)]),
                        call("args_sizes_get", &[scratch(0), scratch(4)]),
                        call("environ_get", &[scratch(0), scratch(4)]),
                        call("fd_prestat_get", &[c(3), scratch(0)]),
                        call("fd_prestat_dir_name", &[c(3), scratch(0), c(16)]),
                        call("path_open", &[c(3), c(0), a(A32::Start(find("hello"))), c(5), c(1), i64(-1), i64(-1), c(0), scratch(0)]),
                        call("fd_fdstat_get", &[c(1), scratch(32)]),
                        call("fd_close", &[c(1)]),
                        call("fd_read", &[c(0), scratch(0), c(1), scratch(8)]),
                        call("sock_accept", &[c(3), c(0), scratch(0)]),
                        call("random_get", &[scratch(0), c(16)]),
                        call("proc_exit", &[c(3)]),
                    ],
                ),
                vec![post(0), post(1)],
            ),
        ),
        // iovecs outside the memory, and more of them than a call takes.
        (
            "wasi_bad_iovecs",
            script(
                module(
                    Some(1024),
                    vec![
                        call("fd_write", &[c(1), a(A32::Start(IOVS[2])), c(1), scratch(0)]),
                        call("fd_write", &[c(1), a(A32::Start(IOVS[3])), c(1), scratch(0)]),
                    ],
                ),
                vec![post(0)],
            ),
        ),
        (
            "wasi_too_many_iovecs",
            script(
                module(
                    Some(1024),
                    vec![call("fd_write", &[c(1), a(A32::Start(IOVS[0])), c(i32::MAX), scratch(0)])],
                ),
                vec![post(0)],
            ),
        ),
        // Output past 64 KiB: a line 65,536 times, and a line longer than the memory.
        (
            "log_flood",
            script(
                module(
                    Some(1024),
                    vec![
                        repeat(4096, "log", &text("hello")),
                        call("log", &[c(0), a(A32::MemEnd(0))]),
                        ok(),
                    ],
                ),
                vec![post(2)],
            ),
        ),
        // Growing the memory within its limit, then past it.
        (
            "memory_growth",
            script(
                Module {
                    max_pages: Some(4),
                    ..module(
                        Some(1024),
                        vec![
                            Call::Grow(A32::Const(1)),
                            Call::Grow(A32::Const(8)),
                            Call::Grow(A32::Const(-1)),
                            Call::Grow(A32::Const(0)),
                            ok(),
                        ],
                    )
                },
                vec![post(0)],
            ),
        ),
        (
            "memory_grown_past_the_limit",
            script(
                module(Some(256), vec![Call::Grow(A32::Const(16)), ok()]),
                vec![post(0)],
            ),
        ),
        // Imports called where no input is handled: in topic() and _initialize.
        (
            "calls_without_an_input",
            script(
                Module {
                    topic: Some(None),
                    side: vec![
                        call("kind", &[]),
                        call("input", &[c(1), scratch(0), c(64)]),
                        call("log", &[scratch(0), a(A32::Last)]),
                        call("sql_bind_int", &[i64(1)]),
                        call("respond", &[c(200), text("{}")[0], text("{}")[1]]),
                        sql("SELECT count(*), total(length(v)) FROM t"),
                    ],
                    ..module(Some(1024), vec![ok()])
                },
                vec![
                    Step::Attach {
                        object: 1,
                        query: Some(find("hello")),
                    },
                    post(1),
                ],
            ),
        ),
        // _initialize's calls, made at load and before each input.
        (
            "initialize",
            script(
                Module {
                    init: true,
                    side: vec![
                        call("kind", &[]),
                        call("clock_time_get", &[c(0), i64(1), scratch(16)]),
                        call("log", &text("hello")),
                        call("fd_write", &[c(1), a(A32::Start(IOVS[0])), c(1), scratch(0)]),
                    ],
                    ..module(Some(1024), vec![ok()])
                },
                vec![post(0)],
            ),
        ),
        // Modules the node refuses at load: memory_kb() of 0, past the ceiling, a schema
        // that is not UTF-8.
        ("memory_kb_zero", script(module(Some(0), vec![ok()]), vec![post(0)])),
        (
            "memory_kb_past_the_ceiling",
            script(module(Some(256 * 1024 + 1), vec![ok()]), vec![post(0)]),
        ),
        (
            "schema_not_utf8",
            script(
                Module {
                    schema: Some(find(NOT_UTF8)),
                    ..module(None, vec![ok()])
                },
                vec![post(0)],
            ),
        ),
    ]
}

/// The committed corpus holds every seed as the scenarios above encode it (write them again
/// with `COMBD_WRITE_SEEDS=1`).
#[test]
fn the_seed_corpus_is_what_the_scenarios_encode() {
    let dir = corpus_dir();
    let write = std::env::var_os("COMBD_WRITE_SEEDS").is_some();
    if write {
        std::fs::create_dir_all(&dir).unwrap();
    }
    for (name, script) in seeds() {
        let path = dir.join(name);
        let bytes = encode(&script);
        assert_eq!(decode(&bytes), script, "{name}");
        if write {
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(committed, bytes, "{name} differs from its scenario");
    }
}

fn corpus() -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the host_imports corpus is empty");
    files
        .into_iter()
        .map(|f| {
            let b = std::fs::read(&f).unwrap();
            (f, b)
        })
        .collect()
}

/// Every corpus file against one node (`COMBD_FUZZ_ONLY=name,...`: those alone, for a look
/// at them with `COMBD_FUZZ_VERBOSE`; the reach checks then fail): its checks hold after each, and the corpus reaches
/// what the node refuses (a denied statement, the memory, CPU and send limits, a send to
/// another object's session, a module refused at load) and what it serves (answers,
/// batches, messages to sessions).
#[test]
fn the_corpus_keeps_the_node_whole() {
    let started = Instant::now();
    let mut h = Harness::start(Path::new(env!("CARGO_BIN_EXE_combd")));
    let mut ok = 0;
    for (f, data) in corpus() {
        if let Ok(only) = std::env::var("COMBD_FUZZ_ONLY") {
            if !only.split(',').any(|o| f.ends_with(o)) {
                continue;
            }
        }
        let t = Instant::now();
        let out = h.run(&data);
        ok += out.ok;
        eprintln!("{}: {out:?} in {:?}", f.display(), t.elapsed());
    }
    let s = h.stats();
    for reached in [
        "sql_denied",
        "memory_limit_killed",
        "cpu_limit_killed",
        "send_limit_refused",
        "sends_foreign_dropped",
        "wasm_reloads_refused",
        "ws_messages_out",
    ] {
        assert!(
            s[reached].as_u64().unwrap() > 0,
            "the corpus never reached {reached}: {s}"
        );
    }
    assert!(s["batch_max"].as_u64().unwrap() > 1, "no batch: {s}");
    assert!(ok > 0, "no script was answered 2xx");
    assert!(
        started.elapsed() < CORPUS_TIME_MAX,
        "the corpus took {:?}",
        started.elapsed()
    );
}

/// Mutants of the corpus from fixed seeds (`COMBD_FUZZ_SCRIPTS` of them, default 30): the
/// stable toolchain's fuzz loop, without cargo-fuzz. A failure names its seed and saves its
/// input, which `cargo fuzz run host_imports <file>` or the corpus replays.
#[test]
fn mutated_scripts_keep_the_node_whole() {
    let corpus: Vec<Vec<u8>> = corpus().into_iter().map(|(_, b)| b).collect();
    let mut h = Harness::start(Path::new(env!("CARGO_BIN_EXE_combd")));
    let (mut loaded, mut calls, mut answers) = (0, 0, 0);
    let started = Instant::now();
    let seeds = combd_testkit::fuzz::mutant_seeds(RANDOM_SCRIPTS);
    let n = seeds.end - seeds.start;
    for seed in seeds {
        let data = combd_testkit::fuzz::mutant(seed, &corpus);
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.run(&data)))
            .unwrap_or_else(|e| {
                let path = std::env::temp_dir().join(format!("host_imports-seed-{seed}"));
                let _ = std::fs::write(&path, &data);
                eprintln!("seed {seed} failed; its input is in {}", path.display());
                std::panic::resume_unwind(e)
            });
        loaded += usize::from(out.loaded);
        calls += out.calls;
        answers += out.answers;
    }
    eprintln!(
        "{n} mutated scripts in {:?}: {loaded} modules loaded, {calls} calls, {answers} answers",
        started.elapsed()
    );
    assert!(loaded > 0, "no mutated module loaded");
}
