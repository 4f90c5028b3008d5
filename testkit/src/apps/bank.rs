//! `bank` (test app, served only by `combd-test-node`): accounts that move value to each
//! other with messages between objects, the reference for `Cx::send_to_object`. Each account
//! starts with 1,000.
//!
//! - `POST /o/bank/<account>?to=<account>&amount=<n>` takes `n` from this account (if it has
//!   it: else `409`) and, in the same transaction, queues `{"credit":n}` to the other: the
//!   value is in exactly one of the two databases (this one's outbox until delivered) at every
//!   commit, so the sum over all accounts never changes, whatever crashes.
//! - A message `{"credit":n}` adds `n`, exactly once.
//! - `DELETE` closes the account: the object deletes itself (`Cx::delete`); a transfer to or
//!   from its name later opens a new account of 1,000.
//! - `GET` answers `{"balance":<n>}` (what is on its way to it is not in it yet: the sum over
//!   the accounts is 1,000 each once nothing is on its way, `alarm_objects` 0 in `/stats`).

use combd_shards::app::{App, AppError, Cx, Input, Output};
use combd_shards::http::Response;

use super::query_param;

/// What an account starts with.
pub const START: i64 = 1000;

/// The bank app.
pub struct Bank;

fn transfer(cx: &mut Cx<'_>, query: Option<&str>) -> Result<Output, AppError> {
    let to = query_param(query, "to").ok_or_else(|| AppError::new(400, "to=<account>"))?;
    let amount: i64 = query_param(query, "amount")
        .and_then(|a| a.parse().ok())
        .filter(|a| *a > 0)
        .ok_or_else(|| AppError::new(400, "amount=<a positive whole number>"))?;
    if Some(to) == cx.object() {
        return Err(AppError::new(400, "to another account"));
    }
    let left: i64 = cx
        .db()?
        .query_row(
            "UPDATE account SET balance = balance - ?1 WHERE balance >= ?1 RETURNING balance",
            [amount],
            |r| r.get(0),
        )
        .map_err(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => AppError::new(409, "not enough"),
            e => e.into(),
        })?;
    cx.send_to_object("bank", to, format!("{{\"credit\":{amount}}}").as_bytes())?;
    Ok(Output::Http(Response::json(
        200,
        &serde_json::json!({ "balance": left }),
    )))
}

impl App for Bank {
    fn name(&self) -> &'static str {
        "bank"
    }

    fn schema(&self) -> &'static str {
        "CREATE TABLE IF NOT EXISTS account (balance INTEGER NOT NULL);
         INSERT INTO account SELECT 1000 WHERE NOT EXISTS (SELECT 1 FROM account);"
    }

    fn handles_batch(&self) -> bool {
        true
    }

    fn handle(&self, cx: &mut Cx<'_>, input: &Input<'_>) -> Result<Output, AppError> {
        match input {
            Input::Http {
                method: "POST",
                query,
                ..
            } => transfer(cx, *query),
            Input::Http {
                method: "DELETE", ..
            } => {
                cx.delete()?;
                Ok(Output::Http(Response::json(
                    200,
                    &serde_json::json!({ "closed": true }),
                )))
            }
            Input::Http { .. } => {
                let balance: i64 = cx
                    .db()?
                    .query_row("SELECT balance FROM account", [], |r| r.get(0))?;
                Ok(Output::Http(Response::json(
                    200,
                    &serde_json::json!({ "balance": balance }),
                )))
            }
            Input::FromObject { app, .. } if *app != "bank" => {
                Err(AppError::new(403, "credits come from accounts only"))
            }
            Input::FromObject { body, .. } => {
                let v: serde_json::Value =
                    serde_json::from_slice(body).map_err(|_| AppError::new(400, "not a credit"))?;
                let n = v["credit"]
                    .as_i64()
                    .ok_or_else(|| AppError::new(400, "not a credit"))?;
                cx.db()?
                    .execute("UPDATE account SET balance = balance + ?1", [n])?;
                Ok(Output::None)
            }
            Input::Attach { .. }
            | Input::Detach { .. }
            | Input::Message { .. }
            | Input::Alarm { .. } => Ok(Output::None),
        }
    }
}
