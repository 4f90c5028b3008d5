//! `combd top`: a live per-shard view of the localhost `/stats`, redrawn every second, with
//! the rates of its counters over the last second (requests, batches, refusals a second).
//! `--once` prints one snapshot, its rates over a second, and exits (scriptable); `--json`
//! passes the raw stats through.
//! Refusal states are highlighted when the output is a terminal. The live view retries while
//! the node is unreachable, quits on `q`, and stops when its stdout closes.

use std::io::{IsTerminal, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::termios::{self, LocalFlags, SetArg, SpecialCharacterIndices, Termios};

fn fetch(port: u16) -> Result<serde_json::Value, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .map_err(|e| format!("cannot reach 127.0.0.1:{port}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    write!(
        s,
        "GET /stats HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .ok_or("no HTTP response")?;
    serde_json::from_str(body).map_err(|e| format!("/stats is not JSON: {e}"))
}

fn mb(v: &serde_json::Value) -> String {
    let b = v.as_u64().unwrap_or(0) as f64;
    if b >= 1e9 {
        format!("{:.1} GB", b / 1e9)
    } else {
        format!("{:.1} MB", b / 1e6)
    }
}

/// The snapshot before, and how long before: what the rates are taken over.
pub type Before<'a> = Option<(&'a serde_json::Value, Duration)>;

/// Renders one snapshot, with the rates since `before` ("-" without it). `color` highlights
/// refusal states.
pub fn render(s: &serde_json::Value, before: Before<'_>, color: bool) -> String {
    let style = Style { color };
    let mut out = node_lines(s, before, style);
    out.push_str(&shard_table(s, before, style));
    out
}

/// How much a counter grew a second: from `before` (its value, and how long ago) to `now`;
/// "-" without a value before.
fn per_second(now: u64, before: Option<(u64, Duration)>) -> String {
    match before {
        Some((was, took)) if took.as_secs_f64() > 0.0 => {
            format!("{:.0}", now.saturating_sub(was) as f64 / took.as_secs_f64())
        }
        _ => "-".to_string(),
    }
}

/// [`per_second`] of the counter `at` picks from a snapshot, since the one `before`.
fn rate(
    now: &serde_json::Value,
    before: Before<'_>,
    at: impl Fn(&serde_json::Value) -> u64,
) -> String {
    per_second(at(now), before.map(|(b, took)| (at(b), took)))
}

/// How a figure that needs attention is shown: bold red on a terminal.
#[derive(Clone, Copy)]
struct Style {
    color: bool,
}

impl Style {
    /// `text`, marked when `on`.
    fn flag(self, on: bool, text: &str) -> String {
        if on && self.color {
            format!("\x1b[1;31m{text}\x1b[0m")
        } else {
            text.to_string()
        }
    }
}

/// A figure of `/stats` as a number (0 when missing).
fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// The node's three lines: version, uptime and whether it accepts; memory, pressure,
/// connections and disk; the refusals.
fn node_lines(s: &serde_json::Value, before: Before<'_>, style: Style) -> String {
    let mut out = String::new();
    let refusing = u(&s["tcp_refusing"]) == 1;
    out.push_str(&format!(
        "combd {}  pid {}  up {}s  {}\n",
        s["version"].as_str().unwrap_or("?"),
        u(&s["pid"]),
        u(&s["uptime_ms"]) / 1000,
        if refusing {
            style.flag(
                true,
                &format!(
                    "REFUSING AT TCP ({})",
                    s["full_reason"].as_str().unwrap_or("?")
                ),
            )
        } else {
            "accepting".to_string()
        }
    ));
    out.push_str(&format!(
        "memory {} of {} ({}%, {})  {}  machine {}%  conns {}/{}  {}\n",
        mb(&s["memory_own_bytes"]),
        mb(&s["memory_budget_bytes"]),
        u(&s["memory_own_percent"]),
        s["memory_budget_source"].as_str().unwrap_or("?"),
        style.flag(
            u(&s["pressure"]) >= 2,
            &format!("pressure {}", u(&s["pressure"]))
        ),
        u(&s["machine_percent"]),
        u(&s["conns"]),
        u(&s["max_conns_effective"]),
        style.flag(
            u(&s["disk_low"]) == 1,
            &format!(
                "disk free {}{}",
                mb(&s["disk_free_bytes"]),
                if u(&s["disk_low"]) == 1 { " LOW" } else { "" }
            )
        ),
    ));
    out.push_str(&rates_line(s, before));
    out
}

/// The node's counters over all shards a second, and its refusals (totals, and a second).
fn rates_line(s: &serde_json::Value, before: Before<'_>) -> String {
    let sum = |v: &serde_json::Value, field: &str| -> u64 {
        v["shards"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|sh| u(&sh[field]))
            .sum()
    };
    // A counter of every shard's, a second.
    let totals = |field: &str| rate(s, before, |v| sum(v, field));
    format!(
        "requests/s {}  batches/s {}  refused late {} ({}/s)  listen stops {}  mailbox refused {} ({}/s)  session drops {}\n\n",
        totals("requests"),
        totals("batches"),
        u(&s["refused_late"]),
        rate(s, before, |v| u(&v["refused_late"])),
        u(&s["listen_stops"]),
        u(&s["mailbox_refused"]),
        rate(s, before, |v| u(&v["mailbox_refused"])),
        u(&s["session_mailbox_dropped"])
    )
}

/// A line a shard, under a header.
fn shard_table(s: &serde_json::Value, before: Before<'_>, style: Style) -> String {
    let mut out = format!(
        "{:>5} {:>7} {:>7} {:>7} {:>9} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8} {:>5}\n",
        "shard",
        "conns",
        "ws",
        "objects",
        "awake/max",
        "ready",
        "behind",
        "listen",
        "mbox_ref",
        "batch/s",
        "req/s",
        "lag"
    );
    for (i, sh) in s["shards"].as_array().into_iter().flatten().enumerate() {
        let was = before.and_then(|(b, took)| Some((b["shards"].get(i)?, took)));
        let behind = u(&sh["behind"]) == 1;
        let listening = u(&sh["listening"]) == 1;
        out.push_str(&format!(
            "{:>5} {:>7} {:>7} {:>7} {:>9} {:>6} {:>6} {:>6} {:>8} {:>8} {:>8} {:>5}\n",
            u(&sh["shard"]),
            u(&sh["conns"]),
            u(&sh["ws_open"]),
            u(&sh["objects_live"]),
            format!("{}/{}", u(&sh["cells_awake"]), u(&sh["cells_awake_max"])),
            u(&sh["sessions_ready"]),
            style.flag(behind, if behind { "YES" } else { "no" }),
            style.flag(!listening, if listening { "yes" } else { "NO" }),
            u(&sh["mailbox_refused"]),
            rate(sh, was, |v| u(&v["batches"])),
            rate(sh, was, |v| u(&v["requests"])),
            format!("{}ms", u(&sh["lag_ms"])),
        ));
    }
    out
}

/// The terminal on stdin in non-canonical mode without echo or signal keys, so that `q` (or
/// Ctrl-C, which then arrives as a byte) is read at once; the saved mode is restored when this
/// is dropped.
struct RawStdin {
    saved: Termios,
}

impl RawStdin {
    /// Switches stdin's terminal, or None when stdin is not one (or cannot be switched).
    fn enter() -> Option<RawStdin> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let saved = termios::tcgetattr(&stdin).ok()?;
        let mut mode = saved.clone();
        mode.local_flags
            .remove(LocalFlags::ICANON | LocalFlags::ECHO | LocalFlags::ISIG);
        mode.control_chars[SpecialCharacterIndices::VMIN as usize] = 1;
        mode.control_chars[SpecialCharacterIndices::VTIME as usize] = 0;
        termios::tcsetattr(&stdin, SetArg::TCSANOW, &mode).ok()?;
        Some(RawStdin { saved })
    }
}

impl Drop for RawStdin {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), SetArg::TCSANOW, &self.saved);
    }
}

/// What ends the live view: `q`, `Q`, Ctrl-C or Ctrl-D typed on a terminal stdin (read raw,
/// see [`RawStdin`]), or SIGINT, SIGTERM or SIGHUP; each sends on `quit`.
fn watch_for_quit(quit: &mpsc::Sender<()>) -> Option<RawStdin> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    if let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        let quit = quit.clone();
        std::thread::spawn(move || {
            if signals.forever().next().is_some() {
                let _ = quit.send(());
            }
        });
    }
    let raw = RawStdin::enter()?;
    let quit = quit.clone();
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin();
        let mut buf = [0u8; 64];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) if buf[..n].iter().any(|b| matches!(b, b'q' | b'Q' | 3 | 4)) => break,
                Ok(_) => {}
            }
        }
        let _ = quit.send(());
    });
    Some(raw)
}

/// Runs `combd top` with its own arguments; returns the exit status.
///
/// The live view keeps going while the node is unreachable (it says so and retries every
/// second, so it can watch a restart), and ends on `q` or when its stdout closes
/// (`combd top --json | head`).
pub fn run(args: &[String]) -> i32 {
    let Some((port, once, json)) = parse_args(args) else {
        return 2;
    };
    let color = std::io::stdout().is_terminal();
    let mut stdout = std::io::stdout();
    if once {
        let text = match fetch(port) {
            Ok(s) if json => format!("{s}\n"),
            Ok(first) => {
                // The rates over a second.
                let started = std::time::Instant::now();
                std::thread::sleep(Duration::from_secs(1));
                match fetch(port) {
                    Ok(s) => render(&s, Some((&first, started.elapsed())), color),
                    Err(_) => render(&first, None, color),
                }
            }
            Err(e) => {
                eprintln!("combd top: {e}");
                return 1;
            }
        };
        // A reader that went away is no failure.
        let _ = stdout
            .write_all(text.as_bytes())
            .and_then(|()| stdout.flush());
        return 0;
    }
    let (quit, quitting) = mpsc::channel();
    let _raw = watch_for_quit(&quit);
    let mut last: Option<(serde_json::Value, std::time::Instant)> = None;
    loop {
        let text = match fetch(port) {
            Ok(s) if json => Some(format!("{s}\n")),
            Ok(s) => {
                let before = last.as_ref().map(|(b, at)| (b, at.elapsed()));
                let text = render(&s, before, color);
                last = Some((s, std::time::Instant::now()));
                Some(text)
            }
            Err(e) => {
                let line = format!("combd top: node unreachable ({e}), retrying\n");
                if json {
                    // stdout carries only JSON.
                    eprint!("{line}");
                    None
                } else {
                    Some(line)
                }
            }
        };
        if let Some(text) = text {
            let clear = if color && !json { "\x1b[H\x1b[2J" } else { "" };
            let written = write!(stdout, "{clear}{text}").and_then(|()| stdout.flush());
            if written.is_err() {
                // The reader went away (`| head`): nothing more to show.
                return 0;
            }
        }
        match quitting.recv_timeout(Duration::from_secs(1)) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return 0,
        }
    }
}

/// The port to ask (`--port`, else `COMBD_LISTEN`'s, else 8080), and `--once` and `--json`;
/// `None` after saying on stderr what is wrong with them.
fn parse_args(args: &[String]) -> Option<(u16, bool, bool)> {
    let mut port: u16 = crate::objects::local_port();
    let (mut once, mut json) = (false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--once" => once = true,
            "--json" => json = true,
            "--port" => match it.next().and_then(|p| p.parse().ok()) {
                Some(p) => port = p,
                None => {
                    eprintln!("combd top: --port needs a port number");
                    return None;
                }
            },
            other => {
                eprintln!("combd top: unknown argument {other:?} (use --port P, --once, --json)");
                return None;
            }
        }
    }
    Some((port, once, json))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counters are shown as rates over the time between two snapshots; without one before,
    /// as "-".
    #[test]
    fn counters_show_as_rates_a_second() {
        let at = |requests: u64, batches: u64, refused: u64| {
            serde_json::json!({
                "refused_late": refused,
                "shards": [{ "shard": 0, "requests": requests, "batches": batches }],
            })
        };
        let (before, now) = (at(100, 10, 0), at(400, 70, 6));
        let text = render(&now, Some((&before, Duration::from_secs(2))), false);
        assert!(text.contains("requests/s 150  batches/s 30"), "{text}");
        assert!(text.contains("refused late 6 (3/s)"), "{text}");
        let row = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some("0"))
            .unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(&cells[9..11], ["30", "150"], "{row}");
        let alone = render(&now, None, false);
        assert!(alone.contains("requests/s -  batches/s -"), "{alone}");
    }
}
