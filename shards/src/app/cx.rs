//! The context of one call ([`Cx`]): the object's database inside the call's transaction,
//! the effects it queues, the alarms it sets and the messages to other objects it queues
//! there (`crate::alarms` says how they fire), and what it has used of its limits
//! ([`CallBudget`]).

use combd_kernel::limits::{
    ALARMS_PER_OBJECT_MAX, ALARM_PAYLOAD_MAX_BYTES, OBJECT_MESSAGE_MAX_BYTES, OUTBOX_MAX,
};

use super::{AppError, Effect, SessionId};
use crate::limit::Limit;
use crate::sandbox::NodeSql;

/// Where a call reads its object's presence from ([`Cx::presence`]): the node's record of it,
/// kept by the cells.
pub(crate) trait PresenceSource: Sync {
    /// `topic`'s members, by name, and the sessions attached to it but not listed.
    fn members(&self, topic: &str) -> (Vec<super::Member>, u64);
}

/// What one call has used of its limits. A limit that trips stays tripped: the call fails with
/// that error even if the app ignored the error the host call returned.
#[derive(Debug)]
pub struct CallBudget {
    ticks: u64,
    tick_limit: u64,
    /// The app's `memory_kb` in bytes, and what the call holds besides its allocations
    /// (its inputs' bytes in the mailbox).
    memory_limit: Option<(u64, u64)>,
    sent_bytes: u64,
    /// The request's log output, up to [`LOG_MAX_BYTES`](combd_kernel::limits::LOG_MAX_BYTES).
    pub log: String,
    log_dropped: bool,
    /// The limit the call tripped, if one did.
    pub tripped: Option<Limit>,
    /// The earliest alarm the call set, if it set any: the node's alarm index learns it
    /// before the call commits (`crate::alarms`).
    pub alarm_set: Option<u64>,
    /// The earliest alarm the call set (not a message): the shard's timer reads the index for
    /// it.
    pub first_alarm: Option<u64>,
}

impl CallBudget {
    /// A fresh budget for one call.
    pub fn new(tick_limit: u64) -> CallBudget {
        CallBudget {
            ticks: 0,
            tick_limit,
            memory_limit: None,
            sent_bytes: 0,
            log: String::new(),
            log_dropped: false,
            tripped: None,
            alarm_set: None,
            first_alarm: None,
        }
    }

    /// Sets the call's memory limit: `limit_bytes` for the inputs' `base_bytes`, the sends it
    /// queues, and what it allocates while it runs.
    pub fn with_memory(mut self, limit_bytes: Option<u64>, base_bytes: u64) -> CallBudget {
        self.memory_limit = limit_bytes.map(|l| (l, base_bytes));
        self
    }

    /// Checks the memory limit now (also done at every tick and host call).
    pub fn check_memory(&mut self) -> Result<(), AppError> {
        if let Some((limit, base)) = self.memory_limit {
            if base + self.sent_bytes + crate::alloc::held() > limit {
                return Err(self.trip(Limit::Memory));
            }
        }
        Ok(())
    }

    fn trip(&mut self, what: Limit) -> AppError {
        self.tripped.get_or_insert(what);
        limit_error(what)
    }

    fn spend(&mut self, ticks: u64) -> Result<(), AppError> {
        if let Some(t) = self.tripped {
            return Err(limit_error(t));
        }
        self.ticks = self.ticks.saturating_add(ticks);
        if self.ticks > self.tick_limit {
            return Err(self.trip(Limit::Cpu));
        }
        self.check_memory()
    }
}

/// The error a tripped limit answers with.
pub fn limit_error(what: Limit) -> AppError {
    AppError {
        limit: Some(what),
        ..AppError::new(what.status(), what.as_str())
    }
}

/// The context of one call: the object's database, the effects it queues, its limits.
pub struct Cx<'a> {
    db: Option<&'a rusqlite::Connection>,
    object: Option<&'a str>,
    /// The object's presence, for an app that keeps it.
    presence: Option<&'a dyn PresenceSource>,
    /// The node's users, and the app's name (it sees its own objects only).
    users: Option<(&'a crate::users::Users, &'a str)>,
    effects: &'a mut Vec<Effect>,
    budget: &'a mut CallBudget,
}

impl<'a> Cx<'a> {
    /// A context over a database (None for a stateless app).
    pub fn new(
        db: Option<&'a rusqlite::Connection>,
        effects: &'a mut Vec<Effect>,
        budget: &'a mut CallBudget,
    ) -> Cx<'a> {
        Cx {
            db,
            object: None,
            presence: None,
            users: None,
            effects,
            budget,
        }
    }

    /// The same context, for the object named `name`.
    pub fn with_object(self, name: &'a str) -> Cx<'a> {
        Cx {
            object: Some(name),
            ..self
        }
    }

    /// The same context, reading the object's presence from `view`.
    pub(crate) fn with_presence(self, view: Option<&'a dyn PresenceSource>) -> Cx<'a> {
        Cx {
            presence: view,
            ..self
        }
    }

    /// The members of `topic`'s presence, by name, and the sessions attached to it but not
    /// listed, for an app that keeps presence ([`super::App::presence`]; none for another): as
    /// they were when the call's batch began (its own attaches and detaches apply once it
    /// ran). A host call.
    pub fn presence(&mut self, topic: &str) -> Result<(Vec<super::Member>, u64), AppError> {
        self.budget.spend(combd_kernel::limits::HOST_CALL_TICKS)?;
        Ok(self
            .presence
            .map_or((Vec::new(), 0), |view| view.members(topic)))
    }

    /// The same context, reading where users are from `users`, for app `app`.
    pub(crate) fn with_users(self, users: Option<(&'a crate::users::Users, &'a str)>) -> Cx<'a> {
        Cx { users, ..self }
    }

    /// Where the verified user `sub` is among the app's objects (the topics of apps that keep
    /// presence it is a member of, on how many devices, since when), and when it was last in
    /// any topic of the node; `None` for a user the node does not know. This node's objects
    /// only (in a fleet, not those another node owns). A host call.
    pub fn user(&mut self, sub: &str) -> Result<Option<super::UserSeen>, AppError> {
        self.budget.spend(combd_kernel::limits::HOST_CALL_TICKS)?;
        Ok(self.users.and_then(|(users, app)| users.of(sub, app)))
    }

    /// Deletes the object once this call's batch is durable and answered: its database, its
    /// alarms, its outbox and inbox, its topics' logs; its sessions are closed (4404
    /// `object deleted`), and its place under `COMBD_MAX_OBJECTS_PER_APP` is freed. The call
    /// goes on and commits as any other (its answer, sends and broadcasts leave as usual); a
    /// call that then fails deletes nothing. What waits in the mailbox after the batch finds a
    /// new, empty object of the same name (in a fleet, once the fleet has forgotten it: its
    /// etcd keys and its segments and snapshots in the bucket). A host call; `500` for a
    /// stateless app (it has no object).
    pub fn delete(&mut self) -> Result<(), AppError> {
        self.budget.spend(combd_kernel::limits::HOST_CALL_TICKS)?;
        if self.db.is_none() {
            return Err(AppError::new(500, "this app has no object to delete"));
        }
        if !self.effects.iter().any(|e| matches!(e, Effect::Delete)) {
            self.effects.push(Effect::Delete);
        }
        Ok(())
    }

    /// The object's own name: the `<name>` of `/o/<app>/<name>` (`None` for a stateless app).
    pub fn object(&self) -> Option<&'a str> {
        self.object
    }

    /// Counts one tick of work. Call it in every loop of an app: past
    /// `COMBD_CPU_LIMIT_TICKS` the call is killed with `cpu_limit` (native code cannot be
    /// preempted; ticks are how a compiled cell yields its claim on the CPU).
    pub fn tick(&mut self) -> Result<(), AppError> {
        self.budget.spend(1)
    }

    /// The object's database, inside the call's transaction. Each use counts as a host call.
    pub fn db(&mut self) -> Result<&'a rusqlite::Connection, AppError> {
        self.budget.spend(combd_kernel::limits::HOST_CALL_TICKS)?;
        self.db
            .ok_or_else(|| AppError::new(500, "this app has no database"))
    }

    fn queue(&mut self, bytes: usize) -> Result<(), AppError> {
        self.budget.spend(combd_kernel::limits::HOST_CALL_TICKS)?;
        self.budget.sent_bytes += bytes as u64;
        if self.budget.sent_bytes > combd_kernel::limits::SENDS_MAX_BYTES {
            return Err(self.budget.trip(Limit::Send));
        }
        Ok(())
    }

    /// Sends a text message to a session once the call commits. A request may queue 16 MiB of
    /// sends in all; past it: `send_limit`.
    pub fn send(&mut self, to: SessionId, text: &str) -> Result<(), AppError> {
        self.queue(text.len())?;
        self.effects.push(Effect::Send {
            to,
            text: true,
            payload: text.as_bytes().to_vec(),
        });
        Ok(())
    }

    /// Sends a binary message to a session once the call commits.
    pub fn send_binary(&mut self, to: SessionId, bytes: &[u8]) -> Result<(), AppError> {
        self.queue(bytes.len())?;
        self.effects.push(Effect::Send {
            to,
            text: false,
            payload: bytes.to_vec(),
        });
        Ok(())
    }

    /// Sends a text message to every session of this object subscribed to `topic`.
    pub fn broadcast(&mut self, topic: &str, text: &str) -> Result<(), AppError> {
        self.queue(text.len())?;
        self.effects.push(Effect::Broadcast {
            topic: topic.to_string(),
            text: true,
            payload: text.as_bytes().to_vec(),
            seq: 0,
            epoch: 0,
        });
        Ok(())
    }

    /// Writes a line to the node's log (after the call, at info level, with the object's
    /// name). A request keeps up to 64 KiB; past it lines are dropped and a marker says so.
    pub fn log(&mut self, line: &str) {
        let b = &mut *self.budget;
        if b.log.len() + line.len() + 1 > combd_kernel::limits::LOG_MAX_BYTES {
            if !b.log_dropped {
                b.log_dropped = true;
                b.log.push_str("[log output past 64 KiB dropped]\n");
            }
            return;
        }
        b.log.push_str(line);
        b.log.push('\n');
    }

    // --- Alarms and messages to objects, in the call's transaction (`crate::alarms`) ---

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
        crate::alarms::open_outbox(db)?;
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
