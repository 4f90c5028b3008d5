//! The bounds of what apps do through the node beside serving requests: what an app is told of
//! a request and may answer, alarms, messages between objects, and the built-in chat.

/// The chat app's (`src/apps/chat.rs`) bounds, here so `/stats` shows them. Messages a hello
/// carries: a screenful (a client that resumes gets what it missed from the room's log).
pub const CHAT_HISTORY_MESSAGES: usize = 50;

/// Longest chat message text, in bytes.
pub const CHAT_TEXT_MAX_BYTES: usize = 4096;

/// Messages a chat room keeps: older ones are deleted as new ones come, so a room's database
/// (and a flood of messages) stays bounded, ~45 MB at most (10,000 of 4 KiB text).
pub const CHAT_RETAIN_MESSAGES: usize = 10_000;
const _: () = assert!(CHAT_RETAIN_MESSAGES >= CHAT_HISTORY_MESSAGES);

/// How long a chat room may go without a message (or any write) before the node deletes it
/// (`App::expiry`): a room name used once does not hold a database for ever.
pub const CHAT_ROOM_EXPIRY: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// How long a reminder object may go unwritten before the node deletes it (`App::expiry`);
/// one with a reminder pending is kept whatever its age (its alarm is pending).
pub const REMINDER_EXPIRY: std::time::Duration = std::time::Duration::from_secs(30 * 86_400);

/// Most alarms an object may have pending (`cx.set_alarm`): past it a set fails the call
/// (`507 too many alarms`). An object's alarms are rows of its own database; the bound keeps a
/// loop that sets one per call from growing it, and a firing batch's scan short.
pub const ALARMS_PER_OBJECT_MAX: usize = 10_000;

/// Largest alarm payload, in bytes: what the alarm hands back to its object when it fires
/// (an id, a small JSON document). A larger one fails the call (`413`).
pub const ALARM_PAYLOAD_MAX_BYTES: usize = 16 * 1024;

/// Objects with a due alarm a shard wakes per housekeeping tick (100 ms): at most 2,560 objects
/// a second per shard, each firing up to [`ALARMS_PER_WAKE`] alarms, so a second at which
/// 100,000 alarms fall due is spread over turns instead of restoring every object at once
/// (restores are bounded by `COMBD_RESTORES_AT_ONCE` besides).
pub const ALARM_WAKES_PER_TICK: usize = 256;

/// Between two reads of the alarm index a shard makes for an alarm due before its next
/// housekeeping tick (a timer for the earliest due, besides the tick's read every 100 ms), at
/// least this many milliseconds: alarms fire within tens of milliseconds instead of up to a
/// tick late, and when thousands a second fall due an object's wake still takes several (a
/// wake is a batch and a sync: at 10,000 alarms a second over 100 objects, 5 ms here took the
/// node from 53 % to 92 % of its core, 20 ms to 75 %; `bench/alarms.sh`, RESULTS).
pub const ALARM_READ_GAP_MS: u64 = 20;

/// Alarms an object fires per wake (each in its own transaction, synced together): a wake that
/// leaves some due is followed by another at the next tick.
pub const ALARMS_PER_WAKE: usize = 100;

/// How long a failed alarm waits before it fires again (an error or a panic of its handler,
/// which rolled back, so the alarm is still there): doubling from this to
/// [`ALARM_RETRY_MAX_MS`], so a handler that always fails does not spin.
pub const ALARM_RETRY_MIN_MS: u64 = 1_000;

/// How long an object whose wake was refused (its mailbox full, its database that would not
/// open, in a fleet another node's) waits before it is woken again: without it the same
/// objects, earliest in the index, would take every wake of every tick, and the shard's other
/// alarms would wait behind them.
pub const ALARM_WAKE_RETRY_MS: u64 = 5_000;

/// The longest wait between the tries of a failing alarm.
pub const ALARM_RETRY_MAX_MS: u64 = 60_000;

/// Largest message an object sends another (`Cx::send_to_object`), in bytes: as an HTTP body
/// an app takes by default is larger, a message between objects is an instruction (a
/// transfer, an event), not a document. A larger one fails the call (413).
pub const OBJECT_MESSAGE_MAX_BYTES: usize = 64 * 1024;

/// Most messages an object may have waiting to be delivered (its outbox): past it a send
/// fails the call (`507 too many undelivered messages`), so a receiver that is down cannot
/// make a sender grow without bound.
pub const OUTBOX_MAX: usize = 10_000;

/// The reminder app's (`src/apps/reminder.rs`) bounds, here so `/stats` shows them. Most
/// reminders an object holds pending: past it a new one is refused (`507 too many
/// reminders`). Under [`ALARMS_PER_OBJECT_MAX`], so the app says it before the alarm table
/// does.
pub const REMINDERS_PENDING_MAX: usize = 2_000;

/// Most reminders one client (an IPv4 address, an IPv6 /64; `combd_kernel::fair::ClientKey`)
/// holds pending on one object: past it a new one from that client is refused (`429`), so one
/// address fills at most a quarter of an object's [`REMINDERS_PENDING_MAX`].
pub const REMINDERS_PER_CLIENT_MAX: usize = 500;

/// Fired reminders an object keeps (the newest): the older are deleted in the transaction
/// that fires a new one, so fired reminders do not grow an object without bound.
pub const REMINDERS_FIRED_KEPT: usize = 100;

/// Largest reminder list a `GET` answers, in bytes of JSON: the pending (earliest first), then
/// the fired (newest first), as many as fit, and `"more":true` when some were left out. At
/// 1 KiB a text escaped up to six times, 1,000 of each made one GET answer 12.4 MB.
pub const REMINDER_LIST_MAX_BYTES: usize = 512 * 1024;

/// Most header fields an app sees of a request (those it declares), and most an app's answer
/// may set: what a session keeps of its upgrade, and what an answer adds to a response, stay
/// small. A page's cookies, a redirect, caching and a few of its own are well within it.
pub const APP_HEADERS_MAX: usize = 16;

/// Longest header field value an app sees (a longer one is left out) or may set (a longer one
/// fails the answer): 4 KiB holds a cookie of the size browsers keep (RFC 6265, 6.1).
pub const APP_HEADER_VALUE_MAX_BYTES: usize = 4 * 1024;

/// Most bytes of declared header fields (names and values) an app is told of one request: a
/// session keeps them for its whole life, so a client cannot make each of its sessions hold
/// its whole 16 KiB head. Past it the later fields are left out.
pub const APP_HEADERS_MAX_BYTES: usize = 8 * 1024;

/// Longest `Caller::rest`, the path under an object (`/o/<app>/<name>/<rest>`): within the
/// request target's own bound, so a session keeps at most this much of it.
pub const APP_PATH_REST_MAX_BYTES: usize = 1024;

/// Most origins an app module's `cors()` may list (as `COMBD_ALLOWED_ORIGINS`'s bound).
pub const APP_CORS_ORIGINS_MAX: usize = 64;

/// How long a browser may keep a preflight's answer (`access-control-max-age`), in seconds,
/// unless a native app says otherwise: ten minutes, Chromium's own cap (Firefox keeps a day).
pub const CORS_MAX_AGE_SECONDS: u64 = 600;

/// Frames an object's log keeps per topic (`_combd_log`: each broadcast numbered in the
/// transaction that committed it, what a client that reconnects resumes from); older ones are
/// trimmed as new ones come. Twice a session's mailbox ([`super::SESSION_MAILBOX`]): a
/// numbered session that overflowed it resumes from frames still in the log. A viewer further
/// behind is served a snapshot instead.
pub const TOPIC_LOG_FRAMES: u64 = 2000;
const _: () = assert!(TOPIC_LOG_FRAMES >= 2 * super::SESSION_MAILBOX as u64);

/// Bytes of payload an object's log keeps per topic: at most 1 MiB of it is ever read for one
/// resume. Rows of the object's own database, within its `COMBD_DB_MAX` like any write.
pub const TOPIC_LOG_BYTES: u64 = 1024 * 1024;

/// Bytes of replay one batch of an object reads for the numbered sessions resuming in it (at
/// most [`TOPIC_LOG_BYTES`] each): past it an attach is refused with 503 `overloaded` and its
/// client comes back, so a storm of resumes holds at most this much per batch of an object, and
/// at most 9 times it per object (its batches waiting for a sync, and the one running).
pub const TOPIC_LOG_REPLAY_BATCH_BYTES: u64 = TOPIC_LOG_BYTES;

/// How long an object's log keeps a frame: two minutes of disconnection resume without loss
/// (Ably's promise of continuity).
pub const TOPIC_LOG_AGE: std::time::Duration = std::time::Duration::from_secs(120);
