//! Checks a recorded client history of combd's counter (`POST /o/counter/<name>` adds one and
//! answers the value right after it; `GET` reads it) for linearizability.
//!
//! The search itself is not ours: it is `todc-utils`' [`WGLChecker`] (Wing & Gong's algorithm
//! with Lowe's memoisation, after Horn & Kroening, the algorithm Porcupine implements), given
//! the counter's sequential specification ([`Counter`]). What this crate adds is reading the
//! history (JSON lines, as `tools/fleet-killloop --history` and `tools/fleet-netns/run
//! --history` write them), two reductions that keep the verdict (README.md says why each is
//! sound) and a report.
//!
//! Standard semantics: an operation that completed `ok` took effect once between its invocation
//! and its completion; `fail` never took effect (dropped); `info` is unknown: it may take effect
//! at any time after its invocation, or never. An `info` read observes nothing and is dropped.
//! An `info` add is an increment that may happen at any time after its call, or never.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;

use todc_utils::{Action, History, Specification, WGLChecker};

/// What a client asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    /// `POST`: add one; answers the value right after.
    Add,
    /// `GET`: the value.
    Read,
}

/// How an operation completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Answered with a value.
    Ok,
    /// Surely never applied.
    Fail,
    /// Unknown: may have been applied, at any time after its call, or never.
    Info,
}

/// One recorded operation.
#[derive(Clone, Debug)]
pub struct Op {
    /// The operation's id in the history.
    pub id: u64,
    /// The client process (a pipelined slot) it went out on.
    pub process: i64,
    /// Add or read.
    pub func: Func,
    /// Invocation time (monotonic ns).
    pub call: u64,
    /// Completion time (monotonic ns); `u64::MAX` for one never completed in the file.
    pub ret: u64,
    /// How it completed.
    pub kind: Kind,
    /// The value answered (`ok` only).
    pub value: Option<i64>,
    /// Why it failed or is unknown, as recorded.
    pub error: Option<String>,
}

/// A parsed history.
#[derive(Clone, Debug, Default)]
pub struct Recorded {
    /// Every operation, in invocation order of the file.
    pub ops: Vec<Op>,
    /// The counter's value before the first operation (the meta line's `initial`, else 0).
    pub initial: i64,
}

/// Reads a history: JSON lines of `{"type": "invoke", "f": "add"|"read", "id", "process",
/// "time"}` and completions `{"type": "ok"|"fail"|"info", "id", "time", "value"}` (ok only),
/// plus `{"type": "meta", "initial": N}`. An invocation never completed counts as `info`.
pub fn parse(text: &str) -> Result<Recorded, String> {
    let mut rec = Recorded::default();
    let mut open: HashMap<u64, usize> = HashMap::new();
    let mut seen: HashSet<u64> = HashSet::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let at = |e: &str| format!("line {}: {e}", n + 1);
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| at(&e.to_string()))?;
        let ty = v["type"].as_str().ok_or_else(|| at("no \"type\""))?;
        if ty == "meta" {
            if let Some(i) = v["initial"].as_i64() {
                rec.initial = i;
            }
            continue;
        }
        let id = v["id"].as_u64().ok_or_else(|| at("no \"id\""))?;
        let time = v["time"].as_u64().ok_or_else(|| at("no \"time\""))?;
        match ty {
            "invoke" => {
                if !seen.insert(id) {
                    return Err(at(&format!("operation {id} invoked twice")));
                }
                let func = match v["f"].as_str() {
                    Some("add") => Func::Add,
                    Some("read") => Func::Read,
                    other => return Err(at(&format!("unknown \"f\" {other:?}"))),
                };
                open.insert(id, rec.ops.len());
                rec.ops.push(Op {
                    id,
                    process: v["process"].as_i64().unwrap_or(-1),
                    func,
                    call: time,
                    ret: u64::MAX,
                    kind: Kind::Info,
                    value: None,
                    error: Some("never completed in the history".into()),
                });
            }
            "ok" | "fail" | "info" => {
                let i = open
                    .remove(&id)
                    .ok_or_else(|| at(&format!("operation {id} completed but not open")))?;
                let op = &mut rec.ops[i];
                if time < op.call {
                    return Err(at(&format!(
                        "operation {id} completed before its invocation"
                    )));
                }
                op.ret = time;
                op.error = v["error"].as_str().map(str::to_string);
                op.kind = match ty {
                    "ok" => Kind::Ok,
                    "fail" => Kind::Fail,
                    _ => Kind::Info,
                };
                if op.kind == Kind::Ok {
                    op.value = Some(
                        v["value"]
                            .as_i64()
                            .ok_or_else(|| at(&format!("ok operation {id} without a value")))?,
                    );
                }
            }
            other => return Err(at(&format!("unknown \"type\" {other:?}"))),
        }
    }
    Ok(rec)
}

/// How many operations of each sort a history holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Adds answered with a value.
    pub add_ok: usize,
    /// Adds surely not applied.
    pub add_fail: usize,
    /// Adds of unknown outcome.
    pub add_info: usize,
    /// Reads answered.
    pub read_ok: usize,
    /// Reads refused.
    pub read_fail: usize,
    /// Reads of unknown outcome.
    pub read_info: usize,
}

impl Recorded {
    /// The operations by sort.
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for op in &self.ops {
            let slot = match (op.func, op.kind) {
                (Func::Add, Kind::Ok) => &mut c.add_ok,
                (Func::Add, Kind::Fail) => &mut c.add_fail,
                (Func::Add, Kind::Info) => &mut c.add_info,
                (Func::Read, Kind::Ok) => &mut c.read_ok,
                (Func::Read, Kind::Fail) => &mut c.read_fail,
                (Func::Read, Kind::Info) => &mut c.read_info,
            };
            *slot += 1;
        }
        c
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "add ok {}, add info {}, add fail {}, read ok {}, read info {}, read fail {}",
            self.add_ok, self.add_info, self.add_fail, self.read_ok, self.read_info, self.read_fail
        )
    }
}

/// An operation as the specification sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CounterOp {
    /// Sets the value a piece of the history starts from (legal only first).
    Init(i64),
    /// An increment that answered this value.
    Add(i64),
    /// An increment whose answer is unknown.
    AddUnknown,
    /// A read that answered this value.
    Read(i64),
}

/// The counter's sequential specification: the state is its value (none before [`CounterOp::Init`]).
pub struct Counter;

impl Specification for Counter {
    type State = Option<i64>;
    type Operation = CounterOp;

    fn init() -> Self::State {
        None
    }

    fn apply(op: &CounterOp, state: &Option<i64>) -> (bool, Option<i64>) {
        match (op, *state) {
            (CounterOp::Init(v), None) => (true, Some(*v)),
            (CounterOp::Init(_), Some(_)) | (_, None) => (false, *state),
            (CounterOp::Add(v), Some(s)) => (s + 1 == *v, Some(s + 1)),
            (CounterOp::AddUnknown, Some(s)) => (true, Some(s + 1)),
            (CounterOp::Read(v), Some(s)) => (s == *v, Some(s)),
        }
    }
}

/// An operation handed to the checker: its interval and what the specification sees.
#[derive(Clone, Debug)]
pub struct Checked {
    /// Invocation time.
    pub call: u64,
    /// Completion time (`u64::MAX`: never, for an unknown add in the raw check).
    pub ret: u64,
    /// What the specification sees.
    pub op: CounterOp,
    /// Its index in [`Recorded::ops`].
    pub src: usize,
    /// An unknown add given the value of a gap by the reduction.
    pub assigned: bool,
}

/// Which unknown add fills each gap (a value no answered add holds, below the highest value
/// observed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assign {
    /// The gaps in increasing order take the unknown adds in invocation order: exact (the
    /// verdict is the history's; README.md has the argument), but windows may be long.
    Earliest,
    /// Each gap, in increasing order, takes the latest-invoked unused unknown add invoked at
    /// or before the gap's deadline: short windows. A pass proves linearizability (any
    /// linearization of the reduced history is one of the history); a failure is checked
    /// again with [`Assign::Earliest`] (README.md argues the two always agree, and the tests
    /// check that they do).
    Latest,
}

/// A history reduced for the checker.
#[derive(Clone, Debug)]
pub struct Reduced {
    /// The operations kept.
    pub ops: Vec<Checked>,
    /// The value before the first.
    pub initial: i64,
    /// Values up to the highest observed that no answered add holds.
    pub gaps: usize,
    /// Gaps no unknown add could fill (each makes the history non-linearizable).
    pub unfilled: usize,
    /// Unknown adds given a gap's value.
    pub assigned: usize,
    /// Unknown adds dropped: taking effect after everything else, they change nothing observed.
    pub dropped_adds: usize,
    /// Operations dropped otherwise (failed ones, unknown reads).
    pub dropped_other: usize,
}

/// Reduces `rec` (README.md, "The reductions"): failed operations and unknown reads are
/// dropped; each gap value gets an unknown add (as `assign` says), its window closed at the
/// gap's deadline (the earliest completion of an operation that observed the gap's value or
/// more, which must follow the add that made it); the other unknown adds are dropped.
pub fn reduce(rec: &Recorded, assign: Assign) -> Reduced {
    let mut ops = Vec::new();
    let mut infos: Vec<(u64, usize)> = Vec::new();
    let mut acked: HashSet<i64> = HashSet::new();
    let mut dropped_other = 0;
    // (key, ret): an answered add of v must follow the makers of every value below v (key
    // v - 1); a read of v, of every value up to v (key v).
    let mut observers: Vec<(i64, u64)> = Vec::new();
    let mut max_seen = rec.initial;
    for (i, op) in rec.ops.iter().enumerate() {
        match (op.func, op.kind, op.value) {
            (Func::Add, Kind::Ok, Some(v)) => {
                acked.insert(v);
                observers.push((v - 1, op.ret));
                max_seen = max_seen.max(v);
                ops.push(Checked {
                    call: op.call,
                    ret: op.ret,
                    op: CounterOp::Add(v),
                    src: i,
                    assigned: false,
                });
            }
            (Func::Read, Kind::Ok, Some(v)) => {
                observers.push((v, op.ret));
                max_seen = max_seen.max(v);
                ops.push(Checked {
                    call: op.call,
                    ret: op.ret,
                    op: CounterOp::Read(v),
                    src: i,
                    assigned: false,
                });
            }
            (Func::Add, Kind::Info, _) => infos.push((op.call, i)),
            _ => dropped_other += 1,
        }
    }
    let gaps: Vec<i64> = (rec.initial + 1..=max_seen)
        .filter(|v| !acked.contains(v))
        .collect();
    // Each gap's deadline: the earliest completion among operations keyed at or above it.
    observers.sort_unstable_by_key(|o| std::cmp::Reverse(o.0));
    let mut deadlines = vec![u64::MAX; gaps.len()];
    let mut k = 0;
    let mut min_ret = u64::MAX;
    for (j, &g) in gaps.iter().enumerate().rev() {
        while k < observers.len() && observers[k].0 >= g {
            min_ret = min_ret.min(observers[k].1);
            k += 1;
        }
        deadlines[j] = min_ret;
    }
    infos.sort_unstable();
    let mut assigned = 0;
    let mut unfilled = 0;
    let mut used = vec![false; infos.len()];
    let give = |ops: &mut Vec<Checked>, info: (u64, usize), g: i64, deadline: u64| {
        ops.push(Checked {
            call: info.0,
            // An unknown add invoked after the deadline cannot be the gap's maker: the window
            // is then empty, and the checker finds the history not linearizable.
            ret: deadline.max(info.0),
            op: CounterOp::Add(g),
            src: info.1,
            assigned: true,
        });
    };
    match assign {
        Assign::Earliest => {
            for (j, &g) in gaps.iter().enumerate() {
                match infos.get(j) {
                    Some(&info) => {
                        used[j] = true;
                        give(&mut ops, info, g, deadlines[j]);
                        assigned += 1;
                    }
                    None => unfilled += 1,
                }
            }
        }
        Assign::Latest => {
            // Deadlines do not fall as gaps rise: the unknown adds invoked before a deadline
            // only grow.
            let mut available: BTreeSet<(u64, usize)> = BTreeSet::new();
            let mut next = 0;
            for (j, &g) in gaps.iter().enumerate() {
                while next < infos.len() && infos[next].0 <= deadlines[j] {
                    available.insert((infos[next].0, next));
                    next += 1;
                }
                match available.pop_last() {
                    Some((_, x)) => {
                        used[x] = true;
                        give(&mut ops, infos[x], g, deadlines[j]);
                        assigned += 1;
                    }
                    None => unfilled += 1,
                }
            }
        }
    }
    Reduced {
        ops,
        initial: rec.initial,
        gaps: gaps.len(),
        unfilled,
        assigned,
        dropped_adds: used.iter().filter(|u| !**u).count(),
        dropped_other,
    }
}

/// The history as standard semantics has it, unreduced but for what cannot matter: failed
/// operations and unknown reads dropped, unknown adds kept with no completion (after every
/// other event). Exponential for the checker with more than a few unknown adds: for tests of
/// the reductions on small histories.
pub fn raw(rec: &Recorded) -> Reduced {
    let mut ops = Vec::new();
    let mut dropped_other = 0;
    for (i, op) in rec.ops.iter().enumerate() {
        let c = match (op.func, op.kind, op.value) {
            (Func::Add, Kind::Ok, Some(v)) => CounterOp::Add(v),
            (Func::Read, Kind::Ok, Some(v)) => CounterOp::Read(v),
            (Func::Add, Kind::Info, _) => CounterOp::AddUnknown,
            _ => {
                dropped_other += 1;
                continue;
            }
        };
        let ret = if c == CounterOp::AddUnknown {
            u64::MAX
        } else {
            op.ret
        };
        ops.push(Checked {
            call: op.call,
            ret,
            op: c,
            src: i,
            assigned: false,
        });
    }
    Reduced {
        ops,
        initial: rec.initial,
        gaps: 0,
        unfilled: 0,
        assigned: 0,
        dropped_adds: 0,
        dropped_other,
    }
}

/// A piece of a history that every operation before it precedes and every one after it
/// follows, with the value it starts from.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// The counter's value before it.
    pub initial: i64,
    /// Its operations, by invocation.
    pub ops: Vec<Checked>,
}

/// Cuts `red` where no operation is open (every operation before the cut completed before
/// every one after it was invoked): linearizable iff every piece is, each from the value the
/// pieces before it leave (the initial value plus their adds). An unknown add with no
/// completion (the raw check) spans everything after it.
pub fn chunks(red: &Reduced) -> Vec<Chunk> {
    let mut ops = red.ops.clone();
    ops.sort_unstable_by_key(|o| (o.call, o.ret));
    let mut out: Vec<Chunk> = Vec::new();
    let mut initial = red.initial;
    let mut cur: Vec<Checked> = Vec::new();
    let mut max_ret = 0u64;
    for op in ops {
        if !cur.is_empty() && op.call > max_ret {
            let adds = cur
                .iter()
                .filter(|o| matches!(o.op, CounterOp::Add(_) | CounterOp::AddUnknown))
                .count() as i64;
            out.push(Chunk {
                initial,
                ops: std::mem::take(&mut cur),
            });
            initial += adds;
        }
        max_ret = max_ret.max(op.ret);
        cur.push(op);
    }
    if !cur.is_empty() {
        out.push(Chunk { initial, ops: cur });
    }
    out
}

/// Whether `chunk` is linearizable from its initial value: todc-utils' WGL checker, on the
/// chunk's calls and completions in time order (at equal times calls first, so operations
/// that touch count as concurrent), after an [`CounterOp::Init`] that precedes them all.
pub fn check_chunk(chunk: &Chunk) -> bool {
    let n = chunk.ops.len();
    let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(2 * n);
    for (i, op) in chunk.ops.iter().enumerate() {
        events.push((op.call, 0, i));
        events.push((op.ret, 1, i));
    }
    events.sort_unstable();
    let mut actions = Vec::with_capacity(2 * n + 2);
    actions.push((n, Action::Call(CounterOp::Init(chunk.initial))));
    actions.push((n, Action::Response(CounterOp::Init(chunk.initial))));
    for (_, end, i) in events {
        let op = chunk.ops[i].op.clone();
        actions.push((
            i,
            if end == 0 {
                Action::Call(op)
            } else {
                Action::Response(op)
            },
        ));
    }
    WGLChecker::<Counter>::is_linearizable(History::from_actions(actions))
}

/// What a check found.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// Linearizable or not.
    pub linearizable: bool,
    /// The reduction the verdict came from.
    pub reduced: Reduced,
    /// How many pieces, and the largest.
    pub chunks: usize,
    /// Operations in the largest piece.
    pub largest: usize,
    /// The first piece found not linearizable, if any.
    pub failed: Option<Chunk>,
    /// The piece before it (what led to it), if any.
    pub before: Option<Chunk>,
}

/// Checks `red` piece by piece.
pub fn check_reduced(red: Reduced) -> Outcome {
    let pieces = chunks(&red);
    let largest = pieces.iter().map(|c| c.ops.len()).max().unwrap_or(0);
    let at = pieces.iter().position(|c| !check_chunk(c));
    let failed = at.map(|i| pieces[i].clone());
    let before = at.and_then(|i| i.checked_sub(1)).map(|i| pieces[i].clone());
    Outcome {
        linearizable: failed.is_none(),
        chunks: pieces.len(),
        largest,
        failed,
        before,
        reduced: red,
    }
}

/// Checks `rec`: first with [`Assign::Latest`] (short windows; a pass is a proof), then, if
/// that fails, with [`Assign::Earliest`] (exact). Returns the outcomes tried, the last one
/// the verdict.
pub fn check(rec: &Recorded) -> Vec<Outcome> {
    let first = check_reduced(reduce(rec, Assign::Latest));
    if first.linearizable {
        return vec![first];
    }
    let exact = check_reduced(reduce(rec, Assign::Earliest));
    vec![first, exact]
}

/// `red` as a history in the recorded format (a meta line with the initial value, then every
/// operation kept as an invocation and an `ok` completion; an unknown add given a gap answers
/// the gap's value and completes at its deadline), for another checker to read.
pub fn dump(rec: &Recorded, red: &Reduced) -> String {
    let mut events: Vec<(u64, u8, String)> = Vec::with_capacity(2 * red.ops.len());
    for (k, o) in red.ops.iter().enumerate() {
        let (f, value) = match o.op {
            CounterOp::Add(v) => ("add", v),
            CounterOp::Read(v) => ("read", v),
            CounterOp::AddUnknown | CounterOp::Init(_) => continue,
        };
        let src = &rec.ops[o.src];
        events.push((
            o.call,
            0,
            format!(
                "{{\"type\":\"invoke\",\"f\":\"{f}\",\"id\":{k},\"process\":{},\"src\":{},\"time\":{}}}",
                src.process, src.id, o.call
            ),
        ));
        events.push((
            o.ret,
            1,
            format!(
                "{{\"type\":\"ok\",\"f\":\"{f}\",\"id\":{k},\"process\":{},\"time\":{},\"value\":{value}{}}}",
                src.process,
                o.ret,
                if o.assigned { ",\"assigned\":true" } else { "" }
            ),
        ));
    }
    events.sort();
    let mut out = format!(
        "{{\"type\":\"meta\",\"initial\":{},\"reduced\":true}}\n",
        red.initial
    );
    for (_, _, line) in events {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// An HTML page of a piece of history: one row per operation, a bar from its invocation to its
/// completion, what it answered, and the recorded operation it came from.
pub fn html(rec: &Recorded, chunk: &Chunk, before: Option<&Chunk>, title: &str) -> String {
    let max_rows = 4000;
    // The piece before the failing one first (grey labels), for what led to it.
    let context: Vec<&Checked> = before.map_or(Vec::new(), |b| b.ops.iter().collect());
    let skip = context.len().saturating_sub(max_rows / 2);
    let context_rows = context.len() - skip;
    let ops: Vec<&Checked> = context
        .into_iter()
        .skip(skip)
        .chain(chunk.ops.iter())
        .take(max_rows)
        .collect();
    let t0 = ops.iter().map(|o| o.call).min().unwrap_or(0);
    let t1 = ops
        .iter()
        .map(|o| if o.ret == u64::MAX { o.call } else { o.ret })
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let width = 1400.0;
    let x = |t: u64| (t.saturating_sub(t0)) as f64 / (t1 - t0) as f64 * width;
    let mut rows = String::new();
    for (k, o) in ops.iter().enumerate() {
        let src = &rec.ops[o.src];
        let (label, colour) = match (&o.op, o.assigned) {
            (CounterOp::Add(v), false) => (format!("add → {v}"), "#4a4"),
            (CounterOp::Add(v), true) => (format!("add → ? (unknown; given gap {v})"), "#e90"),
            (CounterOp::AddUnknown, _) => ("add → ? (unknown)".to_string(), "#e90"),
            (CounterOp::Read(v), _) => (format!("read → {v}"), "#48c"),
            (CounterOp::Init(v), _) => (format!("init {v}"), "#999"),
        };
        let end = if o.ret == u64::MAX { t1 } else { o.ret };
        let y = k * 16 + if k >= context_rows { 16 } else { 0 };
        let label = if k < context_rows {
            format!("{label} [the piece before]")
        } else {
            label
        };
        rows.push_str(&format!(
            "<rect x=\"{:.1}\" y=\"{y}\" width=\"{:.1}\" height=\"12\" fill=\"{colour}\"><title>op {} process {} {label}: {} .. {} ns{}</title></rect>\
             <text x=\"{:.1}\" y=\"{}\" font-size=\"11\">{label} (op {}, process {})</text>\n",
            x(o.call),
            (x(end) - x(o.call)).max(1.0),
            src.id,
            src.process,
            o.call,
            end,
            src.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default(),
            x(end) + 4.0,
            y + 10,
            src.id,
            src.process,
        ));
    }
    format!(
        "<!doctype html><meta charset=\"utf-8\"><title>{title}</title>\
         <h1>{title}</h1><p>The first piece of the history (operations between two instants at \
         which none was open) that todc-utils' WGL checker found not linearizable: {} operations \
         from counter value {}, below the last {context_rows} operations of the piece before it \
         (which is linearizable), {:.3} ms in all. Green: an add that answered; blue: a read; \
         orange: an add of unknown outcome given a missing value. Hover for times.</p>\
         <svg width=\"{}\" height=\"{}\">\n{rows}</svg>\n",
        chunk.ops.len(),
        chunk.initial,
        (t1 - t0) as f64 / 1e6,
        width + 400.0,
        ops.len() * 16 + 36,
    )
}

#[cfg(test)]
mod tests;
