//! `combd objects`: the operator's look into objects, over the node's localhost `/objects`
//! (`combd_shards` `inspect`): `ls [<app>]`, `show <app>/<name>`, `sql <app>/<name> <query>`,
//! `rm <app>/<name>`; `--json` prints the node's answer as it is, `--port` names the node's
//! port (default: `COMBD_LISTEN`'s, else 8080). Exit status 0 when done, 1 when the node
//! refused or could not be reached, 2 for a usage error.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::Value;

const USE: &str = "use: combd objects ls [<app>] [--after <name>] [--limit <n>] \
                   | show <app>/<name> | sql <app>/<name> <query> | rm <app>/<name> \
                   [--json] [--port <port>]";

/// What was asked.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Ls { app: Option<String> },
    Show(String),
    Sql(String, String),
    Rm(String),
}

/// The arguments, read.
struct Args {
    command: Command,
    after: Option<String>,
    limit: Option<usize>,
    json: bool,
    port: u16,
}

impl Args {
    /// Reads the arguments; `None` after a usage error (printed).
    fn parse(args: &[String]) -> Option<Args> {
        let mut port: u16 = local_port();
        let (mut after, mut limit, mut json, mut words) = (None, None, false, Vec::new());
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--json" => json = true,
                "--port" => port = it.next().and_then(|p| p.parse().ok())?,
                "--after" => after = Some(it.next()?.clone()),
                "--limit" => limit = Some(it.next().and_then(|n| n.parse().ok())?),
                _ => words.push(a.clone()),
            }
        }
        let command = match words.as_slice() {
            [c] if c == "ls" => Command::Ls { app: None },
            [c, app] if c == "ls" => Command::Ls {
                app: Some(app.clone()),
            },
            [c, o] if c == "show" => Command::Show(o.clone()),
            [c, o, q] if c == "sql" => Command::Sql(o.clone(), q.clone()),
            [c, o] if c == "rm" => Command::Rm(o.clone()),
            _ => return None,
        };
        Some(Args {
            command,
            after,
            limit,
            json,
            port,
        })
    }
}

/// Runs `combd objects`; its exit status.
pub fn run(args: &[String]) -> i32 {
    let Some(a) = Args::parse(args) else {
        eprintln!("{USE}");
        return 2;
    };
    let out = match &a.command {
        Command::Ls { app: None } => ask(&a, "GET", "/objects", "").map(|v| apps_text(&v, &a)),
        Command::Ls { app: Some(app) } => list(&a, app),
        Command::Show(o) => ask(&a, "GET", &format!("/objects/{o}"), "").map(|v| show_text(&v, &a)),
        Command::Sql(o, q) => {
            ask(&a, "POST", &format!("/objects/{o}/sql"), q).map(|v| sql_text(&v, &a))
        }
        Command::Rm(o) => ask(&a, "DELETE", &format!("/objects/{o}"), "").map(|v| match a.json {
            true => format!("{v}\n"),
            false if v["deleted"] == true => format!("deleted {o}\n"),
            false => format!("{o} had no database: nothing to delete\n"),
        }),
    };
    finish("combd objects", out)
}

/// Prints a subcommand's output (a reader that went away is no failure), or its error on
/// The port of the node's localhost listener as this shell's `COMBD_LISTEN` names it (`ip:port`,
/// `:port` or `port`, as the node reads it), else 8080: where the subcommands ask.
pub(crate) fn local_port() -> u16 {
    std::env::var("COMBD_LISTEN")
        .ok()
        .and_then(|l| combd_kernel::settings::parse_listen(&l).ok())
        .map_or(8080, |a| a.port())
}

/// stderr; its exit status: 0, or 1 for an error.
pub(crate) fn finish(name: &str, out: Result<String, String>) -> i32 {
    match out {
        Ok(text) => {
            let mut stdout = std::io::stdout();
            let _ = stdout
                .write_all(text.as_bytes())
                .and_then(|()| stdout.flush());
            0
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            1
        }
    }
}

/// `ls <app>`: a page when `--limit` is given, else every page, one after the other.
fn list(a: &Args, app: &str) -> Result<String, String> {
    let mut after = a.after.clone();
    let mut rows = Vec::new();
    loop {
        let mut path = format!("/objects/{app}?limit={}", a.limit.unwrap_or(1000));
        if let Some(after) = &after {
            path.push_str(&format!("&after={after}"));
        }
        let page = ask(a, "GET", &path, "")?;
        if a.json && a.limit.is_some() {
            return Ok(format!("{page}\n"));
        }
        rows.extend(page["objects"].as_array().cloned().unwrap_or_default());
        match page["next"].as_str() {
            Some(next) if a.limit.is_none() => after = Some(next.to_string()),
            _ => break,
        }
    }
    if a.json {
        return Ok(format!(
            "{}\n",
            serde_json::json!({ "app": app, "objects": rows })
        ));
    }
    let mut out = format!(
        "{:<24} {:>12} {:>12} {:>7} {:>7} {:>5}\n",
        "NAME", "BYTES", "WRITTEN", "ALARMS", "OUTBOX", "LIVE"
    );
    for o in &rows {
        out.push_str(&format!(
            "{:<24} {:>12} {:>12} {:>7} {:>7} {:>5}\n",
            o["name"].as_str().unwrap_or("?"),
            o["bytes"].as_u64().unwrap_or(0),
            ago(o["written_ms"].as_u64().unwrap_or(0)),
            count(&o["alarms"]),
            count(&o["outbox"]),
            if o["live"] == true { "yes" } else { "no" },
        ));
    }
    Ok(out)
}

/// A count the node may not know (`-`).
fn count(v: &Value) -> String {
    v.as_u64().map_or("-".to_string(), |n| n.to_string())
}

/// How long ago a time in milliseconds since the Unix epoch was.
fn ago(ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let s = now.saturating_sub(ms) / 1000;
    match s {
        0..=119 => format!("{s}s ago"),
        120..=7199 => format!("{}m ago", s / 60),
        7200..=172_799 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

fn apps_text(v: &Value, a: &Args) -> String {
    if a.json {
        return format!("{v}\n");
    }
    let mut out = format!("{:<24} {:>9}\n", "APP", "OBJECTS");
    for app in v["apps"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<24} {:>9}\n",
            app["app"].as_str().unwrap_or("?"),
            app["objects"].as_u64().unwrap_or(0)
        ));
    }
    out
}

fn show_text(v: &Value, a: &Args) -> String {
    if a.json {
        return format!("{v}\n");
    }
    let mut out = format!(
        "{}: {} bytes, written {}, alarms {}, outbox {}, live {}, schema version {}\n",
        v["name"].as_str().unwrap_or("?"),
        v["bytes"].as_u64().unwrap_or(0),
        ago(v["written_ms"].as_u64().unwrap_or(0)),
        count(&v["alarms"]),
        count(&v["outbox"]),
        if v["live"] == true { "yes" } else { "no" },
        v["tables"]["user_version"],
    );
    out.push_str(&format!("{:<32} {:>10}\n", "TABLE", "ROWS"));
    for t in v["tables"]["list"].as_array().into_iter().flatten() {
        let node = if t["node"] == true { " (node's)" } else { "" };
        let name = format!("{}{node}", t["name"].as_str().unwrap_or("?"));
        out.push_str(&format!(
            "{name:<32} {:>10}\n",
            t["rows"].as_i64().unwrap_or(0)
        ));
    }
    out
}

fn sql_text(v: &Value, a: &Args) -> String {
    if a.json {
        return format!("{v}\n");
    }
    let cell = |x: &Value| match x {
        Value::String(s) => s.clone(),
        Value::Null => "NULL".to_string(),
        other => other.to_string(),
    };
    let columns: Vec<String> = v["columns"]
        .as_array()
        .into_iter()
        .flatten()
        .map(cell)
        .collect();
    let mut out = format!("{}\n", columns.join("\t"));
    for row in v["rows"].as_array().into_iter().flatten() {
        let cells: Vec<String> = row.as_array().into_iter().flatten().map(cell).collect();
        out.push_str(&format!("{}\n", cells.join("\t")));
    }
    if v["truncated"] == true {
        out.push_str("(truncated: past object_sql_rows_max or object_sql_answer_max_bytes)\n");
    }
    out
}

/// Asks the node's localhost listener; its JSON answer, or the error it gave.
fn ask(a: &Args, method: &str, path: &str, body: &str) -> Result<Value, String> {
    ask_local(a.port, method, path, body, a.json)
}

/// Asks the node's localhost listener on `port`; its JSON answer, or the error it gave (as the
/// node's JSON when `json`).
pub(crate) fn ask_local(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    json: bool,
) -> Result<Value, String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .map_err(|e| format!("cannot reach 127.0.0.1:{port}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30))).ok();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/sql\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP response")?;
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no HTTP status")?;
    let v: Value = serde_json::from_str(body).map_err(|e| format!("not JSON ({status}): {e}"))?;
    match status {
        200..=299 => Ok(v),
        _ if json => Err(v.to_string()),
        _ => Err(match v["detail"].as_str() {
            Some(d) => format!("{status} {}: {d}", v["error"].as_str().unwrap_or("")),
            None => format!("{status} {}", v["error"].as_str().unwrap_or("")),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Option<Args> {
        Args::parse(&s.split(' ').map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn commands_are_read_and_bad_ones_refused() {
        assert_eq!(
            args("ls counter --json").map(|a| (a.command, a.json)),
            Some((
                Command::Ls {
                    app: Some("counter".into())
                },
                true
            ))
        );
        assert_eq!(
            args("sql counter/a select").map(|a| a.command),
            Some(Command::Sql("counter/a".into(), "select".into()))
        );
        assert_eq!(args("rm counter/a --port 9").map(|a| a.port), Some(9));
        assert!(args("rm").is_none());
        assert!(args("ls a b").is_none());
        assert!(args("show a --port x").is_none());
        assert!(args("frob a").is_none());
    }
}
