//! The SQL imports: parameters bound in order, one statement run at a time in the call's
//! transaction (through the call's `Cx`, so the node's SQL limits apply), its rows buffered
//! for the module to read until the next statement. The imports reach the host's parts they
//! use through an `SqlCall`.

use combd_shards::app::{limit_error, AppError, Cx};
use combd_shards::limit::Limit;
use rusqlite::types::Value;
use wasmtime::{Caller, Linker};

use crate::host::{charge, copy_out, len, read, text, write, Host, Stop};
use crate::sql_state::Sql;

/// What the SQL imports use of the host: the call's SQL state, its context (while an input is
/// handled), and the module's memory limit. A limit met or a failure is given back as the
/// error that stops the call ([`Host::stop`]).
struct SqlCall<'h> {
    sql: &'h mut Sql,
    cx: Result<&'h mut Cx<'static>, Stop>,
    max_bytes: u64,
}

impl<'h> SqlCall<'h> {
    /// The SQL parts of `host`.
    fn of(host: &'h mut Host) -> SqlCall<'h> {
        let (sql, cx, max_bytes) = host.sql_parts();
        SqlCall { sql, cx, max_bytes }
    }

    /// Binds the next parameter. Parameters are held for the module like its rows: each is a
    /// tick of the call's work with the call's memory checked, so a module binding in a loop
    /// and never running a statement is stopped at its memory limit (it held 1.6 GB for a
    /// 1 MiB module before the call's fuel ran out; found by the `host_imports` fuzz target).
    /// Where no input is handled (`topic`, the calls at load) they hold at most that limit.
    fn bind(self, v: Value) -> Result<(), AppError> {
        self.sql.params_bytes += std::mem::size_of::<Value>() as u64
            + match &v {
                Value::Text(t) => t.len() as u64,
                Value::Blob(b) => b.len() as u64,
                _ => 0,
            };
        self.sql.params.push(v);
        let held = self.sql.params_bytes;
        match self.cx {
            Ok(cx) => cx.tick(),
            Err(_) if held > self.max_bytes => Err(limit_error(Limit::Memory)),
            Err(_) => Ok(()),
        }
    }

    /// Runs a statement with the bound parameters; buffers its rows. Returns the row count,
    /// or -1 with the error kept for `sql_error`. A limit the statement met stops the call.
    fn run(self, sql: &str) -> Result<i32, AppError> {
        let state = self.sql;
        let params = std::mem::take(&mut state.params);
        state.params_bytes = 0;
        state.rows.clear();
        state.columns = 0;
        state.changes = 0;
        state.error.clear();
        let cx = self.cx.map_err(|Stop(e)| e)?;
        let db = cx.db()?;
        // Each row read is a tick of the call's work, and its memory is checked as it is
        // held: a statement returning a million rows trips the module's limits while it is
        // read, not once every row is buffered.
        let mut tripped = None;
        let r = (|| -> rusqlite::Result<(usize, Vec<Vec<Value>>)> {
            let mut st = db.prepare_cached(sql)?;
            let n = st.column_count();
            let mut rows = st.query(rusqlite::params_from_iter(params.iter()))?;
            let mut out = Vec::new();
            while let Some(row) = rows.next()? {
                out.push((0..n).map(|i| row.get(i)).collect::<Result<_, _>>()?);
                if let Err(e) = cx.tick() {
                    tripped = Some(e);
                    break;
                }
            }
            Ok((n, out))
        })();
        if let Some(e) = tripped {
            return Err(e);
        }
        match r {
            Ok((n, rows)) => {
                state.columns = n;
                state.changes = db.changes() as i64;
                let count = rows.len();
                state.rows = rows;
                Ok(i32::try_from(count).unwrap_or(i32::MAX))
            }
            Err(e) => {
                state.error = e.to_string();
                state.failed = Some(state.error.clone());
                if let Some(l) = AppError::from(e).limit() {
                    return Err(limit_error(l));
                }
                Ok(-1)
            }
        }
    }
}

/// Binds `v` as the next parameter of `host`'s call.
fn bind(host: &mut Host, v: Value) -> wasmtime::Result<()> {
    SqlCall::of(host).bind(v).map_err(|e| host.stop(e))
}

/// Runs `sql` in `host`'s call: [`SqlCall::run`].
fn run_sql(host: &mut Host, sql: &str) -> wasmtime::Result<i32> {
    SqlCall::of(host).run(sql).map_err(|e| host.stop(e))
}

/// Defines the SQL imports.
pub(crate) fn link(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    link_bind(linker)?;
    link_rows(linker)
}

/// The parameters, and running a statement.
fn link_bind(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap("combd", "sql_bind_null", |mut c: Caller<'_, Host>| {
        bind(c.data_mut(), Value::Null)
    })?;
    linker.func_wrap(
        "combd",
        "sql_bind_int",
        |mut c: Caller<'_, Host>, v: i64| bind(c.data_mut(), Value::Integer(v)),
    )?;
    linker.func_wrap(
        "combd",
        "sql_bind_float",
        |mut c: Caller<'_, Host>, v: f64| bind(c.data_mut(), Value::Real(v)),
    )?;
    linker.func_wrap(
        "combd",
        "sql_bind_text",
        |mut c: Caller<'_, Host>, ptr: i32, n: i32| -> wasmtime::Result<()> {
            let t = text(read(&mut c, ptr, n)?, "a text parameter")?;
            bind(c.data_mut(), Value::Text(t))
        },
    )?;
    linker.func_wrap(
        "combd",
        "sql_bind_blob",
        |mut c: Caller<'_, Host>, ptr: i32, n: i32| -> wasmtime::Result<()> {
            let b = read(&mut c, ptr, n)?;
            bind(c.data_mut(), Value::Blob(b))
        },
    )?;
    linker.func_wrap(
        "combd",
        "sql",
        |mut c: Caller<'_, Host>, ptr: i32, n: i32| -> wasmtime::Result<i32> {
            charge(&mut c)?;
            let sql = text(read(&mut c, ptr, n)?, "SQL")?;
            run_sql(c.data_mut(), &sql)
        },
    )?;
    Ok(())
}

/// The rows of the last statement, and its error.
fn link_rows(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap("combd", "sql_changes", |c: Caller<'_, Host>| {
        c.data().sql.changes
    })?;
    linker.func_wrap("combd", "sql_columns", |c: Caller<'_, Host>| {
        len(c.data().sql.columns)
    })?;
    linker.func_wrap(
        "combd",
        "sql_type",
        |c: Caller<'_, Host>, row: i32, col: i32| match c.data().sql.value(row, col) {
            None => -1,
            Some(Value::Null) => 0,
            Some(Value::Integer(_)) => 1,
            Some(Value::Real(_)) => 2,
            Some(Value::Text(_)) => 3,
            Some(Value::Blob(_)) => 4,
        },
    )?;
    linker.func_wrap(
        "combd",
        "sql_int",
        |c: Caller<'_, Host>, row: i32, col: i32| match c.data().sql.value(row, col) {
            Some(Value::Integer(v)) => *v,
            Some(Value::Real(v)) => *v as i64,
            _ => 0,
        },
    )?;
    linker.func_wrap(
        "combd",
        "sql_float",
        |c: Caller<'_, Host>, row: i32, col: i32| match c.data().sql.value(row, col) {
            Some(Value::Integer(v)) => *v as f64,
            Some(Value::Real(v)) => *v,
            _ => 0.0,
        },
    )?;
    link_text(linker)
}

/// `sql_text` (a value as text or bytes, copied from where it lies) and `sql_error`.
fn link_text(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(
        "combd",
        "sql_text",
        |mut c: Caller<'_, Host>,
         row: i32,
         col: i32,
         ptr: i32,
         cap: i32|
         -> wasmtime::Result<i32> {
            // A number is written out (a few bytes); text and blobs are copied from where
            // they lie, as much as the module takes.
            let number = match c.data().sql.value(row, col) {
                Some(Value::Integer(v)) => v.to_string(),
                Some(Value::Real(v)) => v.to_string(),
                Some(Value::Text(_) | Value::Blob(_)) => {
                    return copy_out(&mut c, ptr, cap, |h| match h.sql.value(row, col) {
                        Some(Value::Text(t)) => Some(t.as_bytes()),
                        Some(Value::Blob(b)) => Some(b.as_slice()),
                        _ => None,
                    })
                }
                Some(Value::Null) | None => return Ok(-1),
            };
            write(&mut c, ptr, cap, number.as_bytes())?;
            Ok(len(number.len()))
        },
    )?;
    linker.func_wrap(
        "combd",
        "sql_error",
        |mut c: Caller<'_, Host>, ptr: i32, cap: i32| -> wasmtime::Result<i32> {
            copy_out(&mut c, ptr, cap, |h| Some(h.sql.error.as_bytes()))
        },
    )?;
    Ok(())
}
