//! Handmade histories, and the reductions checked against the raw check on random ones.
#![allow(clippy::unwrap_used)]

use super::*;

/// A history from `(call, ret, what, value)`: `add` / `read` answered `value`, `add?` / `read?`
/// unknown, `add!` failed.
fn h(initial: i64, ops: &[(u64, u64, &str, i64)]) -> Recorded {
    let ops = ops
        .iter()
        .enumerate()
        .map(|(i, &(call, ret, what, value))| {
            let (func, kind) = match what {
                "add" => (Func::Add, Kind::Ok),
                "add?" => (Func::Add, Kind::Info),
                "add!" => (Func::Add, Kind::Fail),
                "read" => (Func::Read, Kind::Ok),
                "read?" => (Func::Read, Kind::Info),
                _ => panic!("{what}"),
            };
            Op {
                id: i as u64,
                process: i as i64,
                func,
                call,
                ret,
                kind,
                value: (kind == Kind::Ok).then_some(value),
                error: None,
            }
        })
        .collect();
    Recorded { ops, initial }
}

fn verdict(rec: &Recorded) -> bool {
    check(rec).last().unwrap().linearizable
}

fn raw_verdict(rec: &Recorded) -> bool {
    check_reduced(raw(rec)).linearizable
}

#[test]
fn concurrent_adds_and_unknown_ones_are_linearizable() {
    // Two adds overlap and answer in the other order; an add of unknown outcome (its node
    // killed) made 3, which a read sees; another unknown one never happened; a failed add
    // and an unknown read change nothing.
    let rec = h(
        0,
        &[
            (0, 10, "add", 2),
            (1, 9, "add", 1),
            (5, 8, "add?", 0),
            (6, 7, "add?", 0),
            (11, 12, "add!", 0),
            (12, 20, "read?", 0),
            (13, 14, "read", 3),
            (15, 16, "add", 4),
            (17, 18, "read", 4),
        ],
    );
    assert!(verdict(&rec));
    assert!(raw_verdict(&rec));
}

#[test]
fn a_read_below_an_add_answered_before_it_is_not() {
    let rec = h(0, &[(0, 1, "add", 1), (2, 3, "add", 2), (4, 5, "read", 1)]);
    assert!(!verdict(&rec));
    assert!(!raw_verdict(&rec));
}

#[test]
fn two_adds_answered_the_same_value_are_not() {
    let rec = h(0, &[(0, 5, "add", 1), (1, 6, "add", 1)]);
    assert!(!verdict(&rec));
    assert!(!raw_verdict(&rec));
}

#[test]
fn a_stale_read_after_failover_is_not() {
    // The old owner acknowledged 1..3; after it is killed (two adds in flight, unknown) the
    // new owner serves 2: an acknowledged write is missing.
    let rec = h(
        0,
        &[
            (0, 1, "add", 1),
            (2, 3, "add", 2),
            (4, 5, "add", 3),
            (6, 100, "add?", 0),
            (6, 100, "add?", 0),
            (200, 201, "read?", 0),
            (210, 220, "read", 2),
        ],
    );
    assert!(!verdict(&rec));
    assert!(!raw_verdict(&rec));
    // ... while serving 3, 4 or 5 is fine (each unknown add applied or not), and 6 is not.
    for (v, ok) in [(3, true), (4, true), (5, true), (6, false)] {
        let mut r = rec.clone();
        r.ops[6].value = Some(v);
        assert_eq!(verdict(&r), ok, "read {v}");
        assert_eq!(raw_verdict(&r), ok, "raw, read {v}");
    }
}

#[test]
fn an_unknown_add_cannot_fill_a_gap_before_its_invocation() {
    // The value 2 was seen before the only unknown add was invoked: nothing made it.
    let rec = h(
        0,
        &[
            (0, 1, "add", 1),
            (2, 3, "read", 2),
            (4, 10, "add?", 0),
            (11, 12, "add", 3),
        ],
    );
    assert!(!verdict(&rec));
    assert!(!raw_verdict(&rec));
}

#[test]
fn an_initial_value_is_where_the_count_starts() {
    let rec = h(41, &[(0, 1, "add", 42), (2, 3, "read", 42)]);
    assert!(verdict(&rec));
    let rec = h(0, &[(0, 1, "add", 42)]);
    assert!(!verdict(&rec));
}

#[test]
fn pieces_are_cut_where_nothing_is_open() {
    let rec = h(
        5,
        &[
            (0, 4, "add", 6),
            (1, 3, "add", 7),
            (5, 6, "read", 7),
            (6, 8, "add", 8),
            (9, 10, "add", 9),
        ],
    );
    let red = reduce(&rec, Assign::Latest);
    let pieces = chunks(&red);
    // The read and the add touch at 6 (concurrent): one piece.
    assert_eq!(
        pieces
            .iter()
            .map(|c| (c.initial, c.ops.len()))
            .collect::<Vec<_>>(),
        vec![(5, 2), (7, 2), (8, 1)]
    );
    assert!(pieces.iter().all(check_chunk));
}

#[test]
fn parse_reads_the_recorded_format() {
    let text = r#"{"type":"meta","tool":"t","initial":3}
{"type":"invoke","f":"add","id":0,"process":0,"node":0,"time":10}
{"type":"invoke","f":"add","id":1,"process":1,"node":0,"time":10}
{"type":"ok","f":"add","id":0,"process":0,"time":20,"value":4}
{"type":"info","f":"add","id":1,"process":1,"time":30,"error":"unanswered"}
{"type":"invoke","f":"read","id":2,"process":2,"node":1,"time":40}
{"type":"fail","f":"read","id":2,"process":2,"time":41,"error":"connect"}
{"type":"invoke","f":"read","id":3,"process":3,"node":1,"time":50}
"#;
    let rec = parse(text).unwrap();
    assert_eq!(rec.initial, 3);
    assert_eq!(rec.ops.len(), 4);
    let c = rec.counts();
    assert_eq!(
        (c.add_ok, c.add_info, c.read_fail, c.read_info),
        (1, 1, 1, 1)
    );
    assert_eq!(rec.ops[3].ret, u64::MAX);
    assert!(verdict(&rec));
    assert!(parse("{\"type\":\"ok\",\"id\":9,\"time\":1,\"value\":1}").is_err());
    assert!(parse("{\"type\":\"invoke\",\"f\":\"add\",\"id\":1,\"time\":5}\n{\"type\":\"ok\",\"id\":1,\"time\":4,\"value\":1}").is_err());
}

/// A small deterministic generator (no dependency for it).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A random history of a real counter: ops with random intervals, each applied at a random
/// instant inside its interval; some lose their answer (unknown; applied or not), some
/// fail (not applied).
fn random_history(rng: &mut Lcg, n: usize, max_info: usize) -> Recorded {
    let mut ops = Vec::new();
    let mut infos = 0;
    for i in 0..n {
        let call = rng.next(40);
        let ret = call + 1 + rng.next(15);
        let at = call + rng.next(ret - call + 1);
        let read = rng.next(3) == 0;
        let roll = rng.next(10);
        let (kind, applied) = if roll < 2 && infos < max_info {
            infos += 1;
            (Kind::Info, rng.next(2) == 0)
        } else if roll == 2 {
            (Kind::Fail, false)
        } else {
            (Kind::Ok, true)
        };
        ops.push((at, i, call, ret, read, kind, applied));
    }
    // Apply in order of the instants: each add's value is the count right after it.
    ops.sort_by_key(|o| (o.0, o.1));
    let mut count = 0i64;
    let mut out = Vec::new();
    for (_, i, call, ret, read, kind, applied) in ops {
        let value = if read {
            count
        } else {
            if applied {
                count += 1;
            }
            count
        };
        out.push(Op {
            id: i as u64,
            process: i as i64,
            func: if read { Func::Read } else { Func::Add },
            call,
            ret,
            kind,
            value: (kind == Kind::Ok).then_some(value),
            error: None,
        });
    }
    Recorded {
        ops: out,
        initial: 0,
    }
}

#[test]
fn the_reductions_keep_the_verdict_of_the_raw_check() {
    // Real histories (linearizable by construction) and the same with one answered value
    // changed (mostly not): the reduced check and the raw one (unknown adds left open to the
    // end) must agree on every one.
    let mut rng = Lcg(27);
    let (mut agree_ok, mut agree_bad) = (0, 0);
    for round in 0..20000 {
        let n = 3 + (round % 12);
        let mut rec = random_history(&mut rng, n, 5);
        assert!(raw_verdict(&rec), "a real counter's history: {rec:?}");
        assert!(verdict(&rec), "a real counter's history, reduced: {rec:?}");
        assert!(
            check_reduced(reduce(&rec, Assign::Earliest)).linearizable,
            "{rec:?}"
        );
        agree_ok += 1;
        let answered: Vec<usize> = (0..rec.ops.len())
            .filter(|&i| rec.ops[i].kind == Kind::Ok)
            .collect();
        if answered.is_empty() {
            continue;
        }
        let i = answered[rng.next(answered.len() as u64) as usize];
        let delta = [-2i64, -1, 1, 2][rng.next(4) as usize];
        rec.ops[i].value = rec.ops[i].value.map(|v| v + delta);
        let raw = raw_verdict(&rec);
        for assign in [Assign::Latest, Assign::Earliest] {
            let reduced = check_reduced(reduce(&rec, assign)).linearizable;
            assert_eq!(reduced, raw, "{assign:?} and raw disagree on {rec:?}");
        }
        assert_eq!(verdict(&rec), raw, "reduced and raw disagree on {rec:?}");
        if !raw {
            agree_bad += 1;
        }
    }
    assert!(
        agree_ok == 20000 && agree_bad > 5000,
        "{agree_ok} {agree_bad}"
    );
}
