//! The alarm host calls of [`Cx`]: setting and cancelling durable alarms in the call's
//! transaction (`crate::alarms` says how they fire).

use combd_kernel::limits::{
    ALARMS_PER_OBJECT_MAX, ALARM_PAYLOAD_MAX_BYTES, OBJECT_MESSAGE_MAX_BYTES, OUTBOX_MAX,
};

use super::Cx;
use crate::app::AppError;
use crate::sandbox::NodeSql;

impl Cx<'_> {
    /// Sets an alarm: at `at_ms` (milliseconds since the Unix epoch; a time already past fires
    /// at once) the object is called with `Input::Alarm` carrying `payload`, exactly once,
    /// across crashes and restarts. Written in the call's transaction: a call that fails sets
    /// nothing. Its id, for [`Cx::cancel_alarm`]. At most
    /// [`ALARMS_PER_OBJECT_MAX`] pending (else `507 too many alarms`), a payload of at most
    /// [`ALARM_PAYLOAD_MAX_BYTES`] (else `413`).
    pub fn set_alarm(&mut self, at_ms: u64, payload: &[u8]) -> Result<i64, AppError> {
        if payload.len() > ALARM_PAYLOAD_MAX_BYTES {
            return Err(AppError::new(
                413,
                format!(
                    "alarm payload past {ALARM_PAYLOAD_MAX_BYTES} bytes (alarm_payload_max_bytes)"
                ),
            ));
        }
        let db = self.db()?;
        let _node = NodeSql::enter();
        db.execute_batch(crate::alarms::TABLE)?;
        let pending: i64 = db
            .prepare("SELECT count(*) FROM _combd_alarms")?
            .query_row([], |r| r.get(0))?;
        if pending as usize >= ALARMS_PER_OBJECT_MAX {
            return Err(AppError::new(
                507,
                format!("too many alarms: {ALARMS_PER_OBJECT_MAX} pending (alarms_per_object_max)"),
            ));
        }
        let at = at_ms.min(i64::MAX as u64);
        let id: i64 = db
            .prepare(
                "INSERT INTO _combd_alarms (at_ms, payload, set_ms) VALUES (?1, ?2, ?3) RETURNING id",
            )?
            .query_row(
                rusqlite::params![at as i64, payload, crate::alarms::now_ms() as i64],
                |r| r.get(0),
            )?;
        for lowest in [&mut self.budget.alarm_set, &mut self.budget.first_alarm] {
            *lowest = Some(lowest.map_or(at, |l| l.min(at)));
        }
        Ok(id)
    }

    /// Cancels alarm `id` in the call's transaction: whether it was pending.
    pub fn cancel_alarm(&mut self, id: i64) -> Result<bool, AppError> {
        let db = self.db()?;
        let _node = NodeSql::enter();
        if !crate::alarms::has_table(db)? {
            return Ok(false);
        }
        let n = db
            .prepare("DELETE FROM _combd_alarms WHERE id = ?1")?
            .execute([id])?;
        Ok(n == 1)
    }

    /// Sends `body` to object `name` of app `app` (on any shard), once this call's commit is
    /// durable; the receiver gets it as `Input::FromObject` exactly once (it records what it
    /// took in the same transaction). Messages to one receiver arrive in the order sent. Queued
    /// in the call's transaction, in the object's outbox: a call that fails sends nothing; the
    /// node delivers it across crashes and restarts, retrying with a backoff while the
    /// receiver is busy or failing, never dropping it. Its id in the outbox. At most
    /// [`OUTBOX_MAX`] undelivered (else `507`), a body of at most
    /// [`OBJECT_MESSAGE_MAX_BYTES`] (else `413`); `name` must be a valid object name (else
    /// `400`).
    pub fn send_to_object(&mut self, app: &str, name: &str, body: &[u8]) -> Result<i64, AppError> {
        if body.len() > OBJECT_MESSAGE_MAX_BYTES {
            return Err(AppError::new(
                413,
                format!(
                    "a message past {OBJECT_MESSAGE_MAX_BYTES} bytes (object_message_max_bytes)"
                ),
            ));
        }
        if !crate::app::valid_object_name(name) || !crate::app::valid_object_name(app) {
            return Err(AppError::new(
                400,
                "send_to_object: not an app and object name",
            ));
        }
        let db = self.db()?;
        let _node = NodeSql::enter();
        db.execute_batch(crate::alarms::OUTBOX)?;
        let waiting: i64 = db
            .prepare("SELECT count(*) FROM _combd_outbox")?
            .query_row([], |r| r.get(0))?;
        if waiting as usize >= OUTBOX_MAX {
            return Err(AppError::new(
                507,
                format!("too many undelivered messages: {OUTBOX_MAX} (outbox_max)"),
            ));
        }
        let now = crate::alarms::now_ms();
        let id: i64 = db
            .prepare(
                "INSERT INTO _combd_outbox (app, name, body, next_ms) VALUES (?1, ?2, ?3, ?4) RETURNING id",
            )?
            .query_row(rusqlite::params![app, name, body, now as i64], |r| r.get(0))?;
        // The node's index wakes the object now to send it (`crate::alarms`).
        let lowest = &mut self.budget.alarm_set;
        *lowest = Some(lowest.map_or(now, |l| l.min(now)));
        Ok(id)
    }
}
