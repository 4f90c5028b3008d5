//! `combd token --sub <subject> [--name <name>] [--ttl <duration>] [--app <app>]`: prints an
//! HS256 token signed with the secret in `COMBD_AUTH_JWT_KEY_FILE` (or `--key-file`), with the
//! issuer and audience of `COMBD_AUTH_ISSUER` and `COMBD_AUTH_AUDIENCE` (with `--app`, the
//! audience `<COMBD_AUTH_AUDIENCE>/<app>`: a token for that app only): a token the node takes,
//! for development and tests. Production tokens come from the identity provider.

use combd_kernel::settings::parse_duration;

const USE: &str =
    "use: combd token --sub <subject> [--name <name>] [--ttl <duration, default 1h>] \
                   [--app <app>, with COMBD_AUTH_AUDIENCE: for that app only] \
                   [--key-file <file>, default COMBD_AUTH_JWT_KEY_FILE]";

/// `combd token`'s arguments, as given.
struct Args {
    sub: Option<String>,
    name: Option<String>,
    ttl: String,
    key_file: Option<String>,
    app: Option<String>,
}

impl Args {
    /// Reads the arguments; `Err` holds the exit status of a usage error (printed).
    fn parse(args: &[String]) -> Result<Args, i32> {
        let mut a = Args {
            sub: None,
            name: None,
            ttl: "1h".to_string(),
            key_file: None,
            app: None,
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let slot = match arg.as_str() {
                "--sub" => &mut a.sub,
                "--name" => &mut a.name,
                "--key-file" => &mut a.key_file,
                "--app" => &mut a.app,
                "--ttl" => {
                    match it.next() {
                        Some(t) => a.ttl = t.clone(),
                        None => return Err(usage("--ttl needs a duration")),
                    }
                    continue;
                }
                other => return Err(usage(&format!("unknown argument {other:?}"))),
            };
            match it.next() {
                Some(v) => *slot = Some(v.clone()),
                None => return Err(usage(&format!("{arg} needs a value"))),
            }
        }
        Ok(a)
    }
}

/// Runs `combd token` with its own arguments; returns the exit status.
pub fn run(args: &[String]) -> i32 {
    let Args {
        sub,
        name,
        ttl,
        key_file,
        app,
    } = match Args::parse(args) {
        Ok(a) => a,
        Err(status) => return status,
    };
    let Some(sub) = sub else {
        return usage("--sub is required");
    };
    let ttl = match parse_duration(&ttl) {
        Ok(d) if d.as_secs() > 0 => d.as_secs(),
        Ok(_) => return usage("--ttl must be a second or more"),
        Err(e) => return usage(&format!("--ttl: {e}")),
    };
    let Some(file) = key_file.or_else(|| std::env::var("COMBD_AUTH_JWT_KEY_FILE").ok()) else {
        return usage("no key: set COMBD_AUTH_JWT_KEY_FILE or pass --key-file");
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("combd token: {file}: {e}");
            return 1;
        }
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (iss, aud) = (
        std::env::var("COMBD_AUTH_ISSUER").ok(),
        std::env::var("COMBD_AUTH_AUDIENCE").ok(),
    );
    let aud = match (aud, app) {
        (Some(aud), Some(app)) => Some(format!("{aud}/{app}")),
        (None, Some(_)) => return usage("--app needs COMBD_AUTH_AUDIENCE (the node's audience)"),
        (aud, None) => aud,
    };
    match combd_shards::auth::mint(
        &text,
        &sub,
        name.as_deref(),
        ttl,
        now,
        (iss.as_deref(), aud.as_deref()),
    ) {
        Ok(token) => {
            // A reader that went away is no failure (`combd token ... | head -c 10`).
            use std::io::Write;
            let _ = writeln!(std::io::stdout(), "{token}");
            0
        }
        Err(e) => {
            eprintln!("combd token: {file}: {e}");
            1
        }
    }
}

fn usage(why: &str) -> i32 {
    eprintln!("combd token: {why}\n{USE}");
    2
}
