//! Migrations: an object is brought to its app's version ([`App::schema_version`]) as it opens. Its
//! version is recorded in its own database (the node's table `_combd_version`; none recorded is
//! version 1, what the app's schema makes). An object behind runs every step it needs
//! ([`App::migrate`]: a native app's SQL steps, a module's `migrate(from)`) and then records
//! its new version, all in one transaction, as a call of the app: under the sandbox and the
//! call's limits. A step that fails rolls everything back: the object stays as it was, and is
//! refused (503 `migration failed`) until an app that migrates it is deployed; a log line names
//! the app, the object and the step. An object recorded past its app's version (a module
//! deployed again at an older version) is refused too: its app does not know its tables.
//!
//! A module reload that raises the version reaches an object when it next opens: its cell on
//! the old version goes once what waits is done, and the fresh one restores it.

use rusqlite::OptionalExtension;

use crate::app::{App, AppError};
use crate::sandbox::NodeSql;

use std::path::Path;

use crate::stats::ShardStats;

use super::call::{call, CallLimits, Target};
use super::store::{Migrate, StoreError};

/// The node's table of an object's version.
const TABLE: &str = "_combd_version";

/// A migration that failed: the step (`from` → `from + 1`) and why.
#[derive(Debug)]
pub(super) struct Failed {
    pub from: u32,
    pub to: u32,
    pub error: String,
}

/// The version recorded in the object's database (1 when none is).
fn recorded(db: &rusqlite::Connection) -> rusqlite::Result<u32> {
    let _node = NodeSql::enter();
    if !crate::alarms::has(db, TABLE)? {
        return Ok(1);
    }
    let v: Option<i64> = db
        .query_row("SELECT version FROM _combd_version", [], |r| r.get(0))
        .optional()?;
    Ok(v.map_or(1, |v| v.clamp(1, u32::MAX as i64) as u32))
}

/// Records `version` in the transaction open on `db`.
fn record(db: &rusqlite::Connection, version: u32) -> rusqlite::Result<()> {
    let _node = NodeSql::enter();
    db.execute_batch(
        "CREATE TABLE IF NOT EXISTS _combd_version (version INTEGER NOT NULL); \
         DELETE FROM _combd_version;",
    )?;
    db.execute(
        "INSERT INTO _combd_version (version) VALUES (?1)",
        [version],
    )
    .map(|_| ())
}

/// Brings object `name`'s database to `app`'s version: `Ok(Some((from, to)))` when it
/// migrated, `Ok(None)` when it was there already. Blocks.
pub(super) fn run(
    app: &dyn App,
    db: &mut rusqlite::Connection,
    name: &str,
    limits: CallLimits,
) -> Result<Option<(u32, u32)>, Failed> {
    let to = app.schema_version().max(1);
    let from = recorded(db).map_err(|e| Failed {
        from: 0,
        to,
        error: format!("cannot read its version: {e}"),
    })?;
    if from == to {
        return Ok(None);
    }
    if from > to {
        let error = format!("it is at version {from}, past its app's {to}");
        return Err(Failed { from, to, error });
    }
    let target = Target::bare(app.name(), name);
    let (mut effects, mut logs) = (Vec::new(), String::new());
    let mut at = from;
    let (r, _) = call(
        target,
        db,
        limits,
        false,
        0,
        &mut effects,
        &mut logs,
        |cx| {
            for v in from..to {
                at = v;
                app.migrate(cx, v)?;
            }
            record(cx.db()?, to).map_err(AppError::from)
        },
    );
    r.map(|()| Some((from, to))).map_err(|e| Failed {
        from: at,
        to: at + 1,
        error: match e.detail() {
            Some(d) => format!("{}: {d}", e.message),
            None => e.message.clone(),
        },
    })
}

/// What an object's open needs to migrate it: its app, its name, its calls' limits, and
/// where it counts.
pub(super) struct Migrating {
    pub app: std::sync::Arc<dyn App>,
    pub name: String,
    pub limits: CallLimits,
    pub stats: (std::sync::Arc<crate::NodeShared>, usize),
}

impl Migrating {
    /// The hook an object's open runs after its schema ([`Migrating::run`]).
    pub fn hook(self) -> Migrate {
        std::sync::Arc::new(move |db, path| self.run(db, path))
    }

    /// Brings `db` to the app's version, counting it; the error of a step that failed (logged,
    /// naming the app, the object and the step).
    fn run(&self, db: &mut rusqlite::Connection, path: &Path) -> Result<(), StoreError> {
        let (node, shard) = &self.stats;
        let stats = &node.stats[*shard];
        match run(self.app.as_ref(), db, &self.name, self.limits) {
            Ok(None) => Ok(()),
            Ok(Some((from, to))) => {
                ShardStats::add(&stats.objects_migrated, 1);
                tracing::debug!(app = self.app.name(), object = %self.name, from, to, "migrated");
                Ok(())
            }
            Err(f) => {
                ShardStats::add(&stats.objects_migration_failed, 1);
                tracing::warn!(
                    app = self.app.name(),
                    object = %self.name,
                    step = %format_args!("{} to {}", f.from, f.to),
                    "migration failed: {}",
                    f.error
                );
                Err(StoreError::migration(path, &f.error))
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::app::{Cx, Input, Output};

    /// A native app whose version 2 adds a column and whose version 3 (when `broken`) fails.
    struct Evolving {
        broken: bool,
    }

    impl App for Evolving {
        fn name(&self) -> &'static str {
            "evolving"
        }
        fn migrations(&self) -> &'static [&'static str] {
            match self.broken {
                false => &["ALTER TABLE t ADD COLUMN y INTEGER NOT NULL DEFAULT 7"],
                true => &[
                    "ALTER TABLE t ADD COLUMN y INTEGER NOT NULL DEFAULT 7",
                    "UPDATE t SET nosuch = 1",
                ],
            }
        }
        fn handle(&self, _: &mut Cx<'_>, _: &Input<'_>) -> Result<Output, AppError> {
            Ok(Output::None)
        }
    }

    fn limits() -> CallLimits {
        CallLimits {
            ticks: u64::MAX,
            memory_bytes: None,
            retention: super::super::topic_log::Retention::node(),
        }
    }

    fn db() -> rusqlite::Connection {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        crate::sandbox::lock_down(&db).unwrap();
        db.execute_batch("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1);")
            .unwrap();
        db
    }

    #[test]
    fn an_object_migrates_once_and_records_its_version() {
        let mut db = db();
        let app = Evolving { broken: false };
        assert_eq!(app.schema_version(), 2);
        assert_eq!(run(&app, &mut db, "o", limits()).unwrap(), Some((1, 2)));
        let y: i64 = db.query_row("SELECT y FROM t", [], |r| r.get(0)).unwrap();
        assert_eq!(y, 7);
        assert_eq!(recorded(&db).unwrap(), 2);
        assert_eq!(run(&app, &mut db, "o", limits()).unwrap(), None, "once");
    }

    #[test]
    fn a_failing_step_rolls_every_step_back() {
        let mut db = db();
        let failed = run(&Evolving { broken: true }, &mut db, "o", limits()).unwrap_err();
        assert_eq!((failed.from, failed.to), (2, 3));
        assert!(failed.error.contains("nosuch"), "{}", failed.error);
        let columns: i64 = db
            .query_row(
                "SELECT count(*) FROM pragma_table_info('t') WHERE name = 'y'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(columns, 0, "step 1 rolled back with step 2");
        assert_eq!(recorded(&db).unwrap(), 1);
        // An object past its app's version is refused, not taken back.
        let mut ahead = self::db();
        run(&Evolving { broken: false }, &mut ahead, "o", limits()).unwrap();
        let app = crate::app::registry::tests::NameOnly("evolving");
        let e = run(&app, &mut ahead, "o", limits()).unwrap_err();
        assert!(e.error.contains("past its app's 1"), "{}", e.error);
    }
}
