//! What is read off the settings table for the command line: a flag's setting, and the
//! `--help` text.

use super::table::SETTINGS;
use super::*;

/// The setting whose flag is `flag`.
pub(super) fn spec_by_flag(flag: &str) -> Option<&'static SettingSpec> {
    SETTINGS.iter().find(|s| s.flag == flag)
}

/// The `--help` text, written from [`SETTINGS`].
pub fn help_text() -> String {
    let mut out = String::from(
        "combd: a realtime application server (HTTP/1.1 and WebSocket on io_uring)\n\n\
         Usage: combd [--flag value]...\n\n\
         Every setting is an environment variable with a matching flag; a flag wins.\n\n",
    );
    for s in SETTINGS {
        out.push_str(&format!(
            "  {:<22} {:<22} default: {}\n      {}\n",
            s.flag,
            s.env,
            s.default_text(),
            s.meaning
        ));
    }
    out.push_str(
        "\n  --check-config         validate the settings, print every effective limit and where it came from\n  \
         -h, --help             this text\n  -V, --version          the version\n\n\
         Subcommands:\n  \
         combd top [--port P] [--once] [--json]   a live per-shard view of /stats (q quits)\n  \
         combd objects ls [<app>] | show <app>/<name> | sql <app>/<name> <query> | rm <app>/<name> [--json] [--port P]\n      \
         list, inspect, query (read-only) and delete objects, over the localhost /objects\n  \
         combd restore <app>/<name> --at <latest|batch|time> [--as <name>] | --all --backup B --data D\n      \
         an object from the backup (COMBD_BACKUP), in place or into a new name; a whole node offline\n  \
         combd token --sub <subject> [--name N] [--ttl D] [--app A]   a token the node takes (development)\n  \
         combd new <app> [--lang wat|rust|c] [--dir D]   a working app module to start from, in a new directory\n",
    );
    out
}
