//! The SQL state of one call of a module: the parameters it bound, the rows of its last
//! statement, its error. A leaf: the host's state holds it (`host`), the SQL imports fill it
//! and read it (`sql`).

use rusqlite::types::Value;

/// The SQL state of one call.
#[derive(Debug, Default)]
pub(crate) struct Sql {
    pub(crate) params: Vec<Value>,
    /// What `params` holds, in bytes.
    pub(crate) params_bytes: u64,
    pub(crate) rows: Vec<Vec<Value>>,
    pub(crate) columns: usize,
    pub(crate) changes: i64,
    pub(crate) error: String,
    /// The error of the call's last statement that failed, kept past the statements after it:
    /// what the node's warning says when the call then fails.
    pub(crate) failed: Option<String>,
}

impl Sql {
    /// The error of the call's last statement that failed, if one did.
    pub(crate) fn last_failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The value at `row`, `col` of the last statement's rows, if there is one.
    pub(crate) fn value(&self, row: i32, col: i32) -> Option<&Value> {
        self.rows
            .get(usize::try_from(row).ok()?)?
            .get(usize::try_from(col).ok()?)
    }
}
