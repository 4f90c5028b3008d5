//! The context of one call ([`Cx`]): the object's database inside the call's transaction,
//! the effects it queues, and what it has used of its limits ([`CallBudget`]).

use super::{AppError, Effect, SessionId};
use crate::limit::Limit;

mod alarms;

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
}
