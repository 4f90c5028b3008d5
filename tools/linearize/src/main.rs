//! `linearize HISTORY [--initial N] [--timeout SECONDS] [--html FILE] [--raw | --exact]`:
//! checks a recorded history of combd's counter for linearizability (README.md). `--exact`
//! checks only with the gaps given to the unknown adds in invocation order; `--raw` with no
//! reduction at all. `--dump-reduced FILE` writes the reduced history (the latest assignment,
//! or with `--exact` the exact one) in the recorded format, for another checker.
//!
//! Exit status: 0 linearizable, 1 not linearizable (with `--html`, the failing piece drawn
//! there), 2 unknown (the check did not finish within `--timeout`), 3 bad usage or a history
//! that cannot be read.

use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use combd_linearize::{check, check_reduced, dump, html, parse, raw, reduce, Assign, Outcome};

const USAGE: &str = "usage: linearize HISTORY.jsonl [--initial N] [--timeout SECONDS] \
                     [--html FILE] [--raw | --exact] [--dump-reduced FILE]";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut path, mut initial, mut timeout, mut html_out, mut raw_check, mut exact) =
        (None, None, 600.0f64, None, false, false);
    let mut dump_out = None;
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))
        };
        let parsed = match a.as_str() {
            "--initial" => value("--initial").and_then(|v| {
                v.parse::<i64>()
                    .map(|v| initial = Some(v))
                    .map_err(|e| format!("--initial: {e}"))
            }),
            "--timeout" => value("--timeout").and_then(|v| {
                v.parse::<f64>()
                    .map(|v| timeout = v)
                    .map_err(|e| format!("--timeout: {e}"))
            }),
            "--html" => value("--html").map(|v| html_out = Some(v)),
            "--dump-reduced" => value("--dump-reduced").map(|v| dump_out = Some(v)),
            "--raw" => {
                raw_check = true;
                Ok(())
            }
            "--exact" => {
                exact = true;
                Ok(())
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            _ if path.is_none() && !a.starts_with("--") => {
                path = Some(a);
                Ok(())
            }
            _ => Err(format!("unexpected argument {a}\n{USAGE}")),
        };
        if let Err(e) = parsed {
            eprintln!("linearize: {e}");
            return ExitCode::from(3);
        }
    }
    let Some(path) = path else {
        eprintln!("{USAGE}");
        return ExitCode::from(3);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("linearize: {path}: {e}");
            return ExitCode::from(3);
        }
    };
    let t_parse = Instant::now();
    let mut rec = match parse(&text) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("linearize: {path}: {e}");
            return ExitCode::from(3);
        }
    };
    if let Some(i) = initial {
        rec.initial = i;
    }
    println!(
        "history: {path}: {} operations ({}); initial value {}; read in {:.2} s",
        rec.ops.len(),
        rec.counts(),
        rec.initial,
        t_parse.elapsed().as_secs_f64()
    );
    if let Some(out) = &dump_out {
        let assign = if exact {
            Assign::Earliest
        } else {
            Assign::Latest
        };
        if let Err(e) = std::fs::write(out, dump(&rec, &reduce(&rec, assign))) {
            eprintln!("linearize: {out}: {e}");
            return ExitCode::from(3);
        }
        println!("reduced history ({assign:?}) written to {out}");
    }
    // The check runs on a thread of its own, so a search that takes too long ends in
    // "unknown" rather than a hang.
    let (tx, rx) = mpsc::channel();
    let shared = rec.clone();
    let started = Instant::now();
    std::thread::spawn(move || {
        let outcomes = if raw_check {
            vec![check_reduced(raw(&shared))]
        } else if exact {
            vec![check_reduced(reduce(&shared, Assign::Earliest))]
        } else {
            check(&shared)
        };
        let _ = tx.send(outcomes);
    });
    let outcomes: Vec<Outcome> = match rx.recv_timeout(Duration::from_secs_f64(timeout.max(0.0))) {
        Ok(o) => o,
        Err(_) => {
            println!("verdict: unknown (the check did not finish within {timeout} s; --timeout)");
            return ExitCode::from(2);
        }
    };
    let took = started.elapsed().as_secs_f64();
    for (k, o) in outcomes.iter().enumerate() {
        let r = &o.reduced;
        let how = if raw_check {
            "raw (unknown adds never complete)"
        } else if k == 0 && !exact {
            "gaps to the latest unknown add before each"
        } else {
            "gaps to the unknown adds in invocation order (exact)"
        };
        println!(
            "check {}: {how}: {} operations checked in {} pieces (largest {}); {} gaps, {} \
             unknown adds given one, {} unfilled, {} unknown adds dropped, {} failed or \
             unknown reads dropped: {}",
            k + 1,
            r.ops.len(),
            o.chunks,
            o.largest,
            r.gaps,
            r.assigned,
            r.unfilled,
            r.dropped_adds,
            r.dropped_other,
            if o.linearizable {
                "linearizable"
            } else {
                "NOT linearizable"
            }
        );
    }
    let Some(last) = outcomes.last() else {
        return ExitCode::from(2);
    };
    if last.linearizable {
        println!(
            "verdict: linearizable ({} operations, {took:.2} s)",
            rec.ops.len()
        );
        return ExitCode::SUCCESS;
    }
    if let Some(chunk) = &last.failed {
        let t0 = chunk.ops.iter().map(|o| o.call).min().unwrap_or(0);
        println!(
            "the first piece not linearizable: {} operations from value {}, invoked from {} ns",
            chunk.ops.len(),
            chunk.initial,
            t0
        );
        if let Some(out) = &html_out {
            let page = html(
                &rec,
                chunk,
                last.before.as_ref(),
                &format!("{path}: not linearizable"),
            );
            match std::fs::write(out, page) {
                Ok(()) => println!("drawn in {out}"),
                Err(e) => eprintln!("linearize: {out}: {e}"),
            }
        }
    }
    println!(
        "verdict: NOT linearizable ({} operations, {took:.2} s)",
        rec.ops.len()
    );
    ExitCode::from(1)
}
