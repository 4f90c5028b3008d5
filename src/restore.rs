//! `combd restore`: an object rebuilt from the node's backup (`COMBD_BACKUP`, README "Backup
//! and restore").
//!
//! - `combd restore <app>/<name> --at <latest | batch | RFC 3339 time> [--as <name>]` asks the
//!   running node (its localhost `/objects/<app>/<name>/restore`; `--port`, default
//!   `COMBD_LISTEN`'s, else 8080) to restore the object in place, or into a new name, a fork;
//!   `--list` prints the object's bases and last batches instead.
//! - `combd restore --all --backup <dir | s3://bucket/prefix> --data <dir>` rebuilds every
//!   object of a backup, as of its latest batch, into an empty data directory, with no node
//!   running: a node restored whole after its disk was lost. A bucket is reached with the
//!   `COMBD_BACKUP_S3_*` settings and `COMBD_BACKUP_KEY_FILE` in the environment, as the node
//!   reached it.
//!
//! Exit status 0 when done, 1 when it was refused or failed, 2 for a usage error.

use serde_json::Value;

const USE: &str = "use: combd restore <app>/<name> --at <latest|batch|RFC 3339 time> \
                   [--as <name>] [--port <port>] [--json] | combd restore <app>/<name> --list \
                   | combd restore --all --backup <dir|s3://bucket/prefix> --data <dir>";

/// What was asked.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    One {
        object: String,
        at: String,
        into: Option<String>,
    },
    List(String),
    All {
        backup: String,
        data: String,
    },
}

/// Reads the arguments; `None` after a usage error.
fn parse(args: &[String]) -> Option<(Command, u16, bool)> {
    let mut port: u16 = crate::objects::local_port();
    let (mut at, mut into, mut backup, mut data) = (None, None, None, None);
    let (mut all, mut list, mut json, mut object) = (false, false, false, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--at" => at = Some(it.next()?.clone()),
            "--as" => into = Some(it.next()?.clone()),
            "--backup" => backup = Some(it.next()?.clone()),
            "--data" => data = Some(it.next()?.clone()),
            "--port" => port = it.next()?.parse().ok()?,
            "--all" => all = true,
            "--list" => list = true,
            "--json" => json = true,
            o if !o.starts_with('-') && object.is_none() => object = Some(o.to_string()),
            _ => return None,
        }
    }
    let command = match (all, list, object, at) {
        (true, false, None, None) => Command::All {
            backup: backup?,
            data: data?,
        },
        (false, true, Some(o), None) => Command::List(o),
        (false, false, Some(object), Some(at)) => Command::One { object, at, into },
        _ => return None,
    };
    Some((command, port, json))
}

/// Runs `combd restore`; its exit status.
pub fn run(args: &[String]) -> i32 {
    let Some((command, port, json)) = parse(args) else {
        eprintln!("{USE}");
        return 2;
    };
    let out = match command {
        Command::All { backup, data } => all(&backup, &data).map(|(restored, absent)| {
            format!("restored {restored} objects into {data} ({absent} had been deleted)\n")
        }),
        Command::List(o) => {
            crate::objects::ask_local(port, "GET", &format!("/objects/{o}/backup"), "", json)
                .map(|v| list_text(&v, json))
        }
        Command::One { object, at, into } => {
            let mut path = format!("/objects/{object}/restore?at={}", at.replace('+', "%2B"));
            if let Some(into) = &into {
                path.push_str(&format!("&as={into}"));
            }
            crate::objects::ask_local(port, "POST", &path, "", json).map(|v| match json {
                true => format!("{v}\n"),
                false => format!(
                    "restored {} as of batch {} ({} ms) into {}\n",
                    v["restored"].as_str().unwrap_or("?"),
                    v["seq"],
                    v["at_ms"],
                    v["into"].as_str().unwrap_or("?")
                ),
            })
        }
    };
    crate::objects::finish("combd restore", out)
}

/// `--all`: the backup's target as a node with `COMBD_BACKUP=<backup>` and `COMBD_DATA=<data>`
/// (and the rest of the environment) would reach it, restored whole into `data`.
fn all(backup: &str, data: &str) -> Result<(u64, u64), String> {
    let env = |k: &str| match k {
        "COMBD_BACKUP" => Some(backup.to_string()),
        "COMBD_DATA" => Some(data.to_string()),
        _ => std::env::var(k).ok(),
    };
    let (_, settings) =
        combd_kernel::settings::Settings::load(env, &[], 1).map_err(|e| e.to_string())?;
    let Some(target) = &settings.backup else {
        return Err("--backup is off: name a directory or s3://bucket/prefix".into());
    };
    let target = combd_shards::node::backup_target(&settings, target).map_err(|e| e.to_string())?;
    combd_shards::backup::restore::restore_all(&target, data.as_ref())
}

fn list_text(v: &Value, json: bool) -> String {
    if json {
        return format!("{v}\n");
    }
    let mut out = String::from("BASE BATCH            AT (ms)        EXISTS\n");
    for b in v["bases"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<22} {:<14} {}\n",
            b["seq"], b["at_ms"], b["exists"]
        ));
    }
    out.push_str("BATCH                 AT (ms)\n");
    for b in v["batches"].as_array().into_iter().flatten() {
        out.push_str(&format!("{:<22} {}\n", b["seq"], b["at_ms"]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Option<(Command, u16, bool)> {
        parse(&s.split(' ').map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn a_restore_is_one_object_a_listing_or_all() {
        assert_eq!(
            args("counter/a --at 12 --as b --port 9").map(|(c, p, _)| (c, p)),
            Some((
                Command::One {
                    object: "counter/a".into(),
                    at: "12".into(),
                    into: Some("b".into())
                },
                9
            ))
        );
        assert!(matches!(
            args("counter/a --list"),
            Some((Command::List(_), _, _))
        ));
        assert!(matches!(
            args("--all --backup /b --data /d"),
            Some((Command::All { .. }, _, _))
        ));
        assert!(args("counter/a").is_none(), "--at is needed");
        assert!(args("--all --backup /b").is_none());
        assert!(args("counter/a --at 1 --frob").is_none());
    }
}
