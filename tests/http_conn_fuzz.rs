//! The `http_conn` fuzz target (`fuzz/fuzz_targets/http_conn.rs`) run as plain tests against
//! the real node: its seed corpus (written from the scenarios below, each a shape of client
//! the node's bounds are for), then mutants of it from fixed seeds (more with
//! `COMBD_FUZZ_SCRIPTS=N`, from `COMBD_FUZZ_FIRST_SEED`). The harness
//! (`combd_testkit::fuzz::conn`) checks the node's byte bounds after every script and panics
//! with the script that broke one. The node is `combd-test-node`: the scripts use the test
//! apps.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use combd_testkit::fuzz::conn::Harness;
use combd_testkit::fuzz::script::{encode, Item, Op};

/// How long the corpus may take to replay (it takes a few seconds).
const CORPUS_TIME_MAX: Duration = Duration::from_secs(25);
/// Mutated scripts run by default, from fixed seeds.
const RANDOM_SCRIPTS: u64 = 30;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/http_conn")
}

fn open(from: u8, small_rcvbuf: bool) -> Op {
    Op::Open { from, small_rcvbuf }
}

fn queue(conn: u8, item: Item, times: u16) -> Op {
    Op::Queue { conn, item, times }
}

fn send(conn: u8, bytes: Option<usize>) -> Op {
    Op::Send { conn, bytes }
}

fn read(conn: u8) -> Op {
    Op::Read {
        conn,
        bytes: 1 << 17,
        wait_ms: 200,
    }
}

fn echo(len: usize, sent: usize) -> Item {
    Item::Echo {
        len,
        sent,
        expect: false,
    }
}

fn frame(opcode: u8, len: usize) -> Item {
    Item::Frame {
        opcode,
        fin: true,
        len,
    }
}

/// The seed scenarios, by name: each is one file of the corpus.
fn seeds() -> Vec<(&'static str, Vec<Op>)> {
    let mut seeds = vec![
        // An object's request, then pages pipelined, never read (tests/attacks.rs's attack).
        (
            "pipelined_never_read",
            vec![
                open(1, true),
                queue(0, Item::CounterAdd, 1),
                queue(0, Item::GetPage, 256),
                queue(0, Item::GetPage, 256),
                send(0, None),
                Op::Read {
                    conn: 0,
                    bytes: 1,
                    wait_ms: 10,
                },
                send(0, None),
                Op::Close { conn: 0 },
            ],
        ),
        // Object requests pipelined between pages, every answer read.
        (
            "pipelined_objects_read",
            vec![
                open(2, false),
                queue(0, echo(1000, 1000), 12),
                queue(0, Item::GetPage, 8),
                queue(0, Item::CounterAdd, 10),
                queue(0, Item::CounterGet, 10),
                queue(0, Item::HeadPage, 4),
                send(0, None),
                read(0),
                read(0),
                read(0),
            ],
        ),
        // Echoes of large bodies pipelined behind each other to a client that stops reading.
        (
            "pipelined_echoes_never_read",
            vec![
                open(3, true),
                queue(0, echo(60_000, 60_000), 12),
                send(0, None),
                read(0),
                send(0, None),
                send(0, None),
            ],
        ),
        // A body sent in 4 KiB pieces with reads between, then one never finished.
        (
            "slow_and_unfinished_bodies",
            vec![
                open(4, false),
                queue(0, echo(90_000, 90_000), 1),
                send(0, Some(4096)),
                send(0, Some(4096)),
                read(0),
                send(0, Some(1 << 16)),
                send(0, None),
                read(0),
                queue(0, echo(96 * 1024, 39_936), 1),
                send(0, None),
                open(5, false),
                queue(1, echo(200_000, 200_000), 1),
                send(1, None),
                read(1),
            ],
        ),
        // Expect: 100-continue, a body past the limit, chunked, a head past its limit.
        (
            "refused_heads",
            vec![
                open(6, false),
                queue(
                    0,
                    Item::Echo {
                        len: 5000,
                        sent: 5000,
                        expect: true,
                    },
                    1,
                ),
                send(0, Some(128)),
                read(0),
                send(0, None),
                read(0),
                open(7, false),
                queue(1, Item::Chunked, 1),
                send(1, None),
                read(1),
                open(8, false),
                queue(2, Item::BigHeader { len: 20_000 }, 1),
                send(2, None),
                read(2),
                open(9, false),
                queue(3, Item::Raw(b"GET /\x00 HTTP/1.1\r\n\r\n".to_vec()), 1),
                send(3, None),
                read(3),
            ],
        ),
        // WebSockets sending large messages to a busy object: each client past its input
        // waiting, the shard past its budget.
        (
            "busy_object_past_the_budget",
            (0..4)
                .flat_map(|c| {
                    [
                        open(10 + c, c % 2 == 0),
                        queue(c, Item::Upgrade { to: 1 }, 1),
                    ]
                })
                .chain((0..4).flat_map(|c| [send(c, None), read(c)]))
                .chain([
                    open(14, false),
                    queue(4, Item::Hold { ms: 100, len: 0 }, 4),
                    send(4, None),
                ])
                .chain((0..4).flat_map(|c| [queue(c, frame(0x2, 60_000), 8), send(c, None)]))
                .chain((0..3).flat_map(|_| {
                    [
                        read(4),
                        send(0, None),
                        send(1, None),
                        send(2, None),
                        send(3, None),
                    ]
                }))
                .collect(),
        ),
        // Bodies declared and never finished from every client: each reserved whole.
        (
            "unfinished_bodies",
            (0..8)
                .flat_map(|c| {
                    [
                        open(50 + c, false),
                        queue(c, echo(160 * 1024, 66_560), 1),
                        send(c, None),
                    ]
                })
                .chain([read(0)])
                .collect(),
        ),
        // A WebSocket: messages, a ping, fragments, a close.
        (
            "websocket_echo",
            vec![
                open(20, false),
                queue(0, Item::Upgrade { to: 0 }, 1),
                queue(0, frame(0x1, 1000), 10),
                queue(0, frame(0x9, 4), 1),
                queue(
                    0,
                    Item::Frame {
                        opcode: 0x1,
                        fin: false,
                        len: 3000,
                    },
                    1,
                ),
                queue(0, frame(0x0, 3000), 1),
                send(0, None),
                read(0),
                queue(0, frame(0x8, 2), 1),
                send(0, None),
                read(0),
            ],
        ),
        // WebSocket messages to a client that reads nothing, and a frame past the limit.
        (
            "websocket_flood_and_too_big",
            vec![
                open(21, true),
                queue(0, Item::Upgrade { to: 0 }, 1),
                queue(0, frame(0x2, 60_000), 30),
                send(0, None),
                send(0, None),
                open(22, false),
                queue(1, Item::Upgrade { to: 2 }, 1),
                queue(1, Item::FrameClaim { len: 1 << 30 }, 1),
                send(1, None),
                read(1),
                send(0, None),
            ],
        ),
        // A WebSocket's messages to a busy object: past its input waiting it is not read.
        (
            "websocket_to_a_busy_object",
            vec![
                open(24, false),
                queue(0, Item::Upgrade { to: 1 }, 1),
                send(0, None),
                read(0),
                open(23, false),
                queue(1, Item::Hold { ms: 100, len: 0 }, 3),
                send(1, None),
                queue(0, frame(0x2, 60_000), 12),
                send(0, None),
                read(1),
                send(0, None),
                read(1),
                send(0, None),
                read(1),
                read(0),
            ],
        ),
        // A request a byte at a time, a half close, a close with requests after it.
        (
            "split_and_half_closed",
            [open(30, false), queue(0, Item::Health, 1)]
                .into_iter()
                .chain((0..45).map(|_| send(0, Some(1))))
                .chain([
                    read(0),
                    queue(0, Item::CloseRequest, 1),
                    queue(0, Item::GetPage, 3),
                    send(0, None),
                    read(0),
                    open(31, false),
                    queue(1, Item::GetPage, 2),
                    send(1, None),
                    Op::ShutdownWrite { conn: 1 },
                    read(1),
                ])
                .collect(),
        ),
    ];
    // Eight clients at once, each pipelining, half of them never reading.
    seeds.push((
        "eight_clients",
        (0..8)
            .flat_map(|c| {
                [
                    open(40 + c, c % 2 == 1),
                    queue(c, Item::GetPage, 20),
                    queue(c, echo(30_000, 30_000), 4),
                    queue(c, Item::CounterAdd, 4),
                    send(c, None),
                ]
            })
            .chain((0..8).step_by(2).map(read))
            .collect(),
    ));
    seeds
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
    for (name, ops) in seeds() {
        let path = dir.join(name);
        let bytes = encode(&ops);
        assert_eq!(combd_testkit::fuzz::script::decode(&bytes), ops, "{name}");
        if write {
            std::fs::write(&path, &bytes).unwrap();
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(committed, bytes, "{name} differs from its scenario");
    }
}

/// Every corpus file against one node: its bounds hold after each, and the corpus reaches
/// them (the pipeline cap waited at, a connection not read for its input, the inbound budget
/// refusing, a WebSocket closed for its size).
#[test]
fn the_corpus_keeps_the_nodes_byte_bounds() {
    let started = Instant::now();
    let mut h = Harness::start(Path::new(env!("CARGO_BIN_EXE_combd-test-node")));
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "the http_conn corpus is empty");
    for f in &files {
        let out = h.run(&std::fs::read(f).unwrap());
        assert!(out.clients > 0, "{}: no client connected", f.display());
        let s = h.stats();
        eprintln!(
            "{}: {out:?} {}",
            f.display(),
            [
                "pipeline_held_waits",
                "pipeline_held_bytes_max",
                "inbound_waits",
                "inbound_refused",
                "inbound_bytes_max",
                "mailbox_refused",
                "ws_messages_in",
                "ws_protocol_closed",
                "responses_4xx",
                "responses_5xx",
                "ws_rate_closed",
            ]
            .map(|k| format!("{k}={}", s[k]))
            .join(" ")
        );
    }
    let s = h.stats();
    for reached in [
        "pipeline_held_waits",
        "inbound_waits",
        "inbound_refused",
        "ws_protocol_closed",
        "responses_4xx",
    ] {
        assert!(
            s[reached].as_u64().unwrap() > 0,
            "the corpus never reached {reached}: {s}"
        );
    }
    assert!(
        started.elapsed() < CORPUS_TIME_MAX,
        "the corpus took {:?}",
        started.elapsed()
    );
}

/// Mutants of the corpus from fixed seeds (`COMBD_FUZZ_SCRIPTS` of them, default 30): the
/// stable toolchain's fuzz loop, without cargo-fuzz. A failure names its seed and saves its
/// input, which `cargo fuzz run http_conn <file>` or the corpus replays.
#[test]
fn mutated_scripts_keep_the_nodes_byte_bounds() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let corpus: Vec<Vec<u8>> = files.iter().map(|f| std::fs::read(f).unwrap()).collect();
    let mut h = Harness::start(Path::new(env!("CARGO_BIN_EXE_combd-test-node")));
    let (mut clients, mut sent) = (0, 0);
    let seeds = combd_testkit::fuzz::mutant_seeds(RANDOM_SCRIPTS);
    let n = seeds.end - seeds.start;
    for seed in seeds {
        let data = combd_testkit::fuzz::mutant(seed, &corpus);
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.run(&data)))
            .unwrap_or_else(|e| {
                let path = std::env::temp_dir().join(format!("http_conn-seed-{seed}"));
                let _ = std::fs::write(&path, &data);
                eprintln!("seed {seed} failed; its input is in {}", path.display());
                std::panic::resume_unwind(e)
            });
        clients += out.clients;
        sent += out.sent_bytes;
    }
    eprintln!("{n} mutated scripts: {clients} clients, {sent} bytes sent");
    assert!(clients > 0, "no script connected a client");
}
