//! An object's log of its broadcasts, topic by topic: each broadcast gets the next sequence
//! number of its topic in the transaction that commits it, and is kept in the object's own
//! database (node tables, out of the app's reach: `crate::sandbox`), so what a viewer was sent
//! and what the log says can never differ, whatever crashes. A viewer that reconnects resumes
//! from it ([`resume`], [`crate::ws::numbered`]).
//!
//! The log keeps the last [`TOPIC_LOG_FRAMES`] frames, [`TOPIC_LOG_BYTES`] of payload and
//! [`TOPIC_LOG_AGE`] of time per topic, whichever is least, and always its newest frame (its
//! number); older frames are trimmed in the same transaction, once a topic passes one of them
//! by an eighth. Its rows count against the object's `COMBD_DB_MAX` like any write: a broadcast
//! that would pass it fails its call (`db_full`), applying nothing.
//!
//! A topic's epoch is drawn when its first frame is logged: a sequence number means something
//! only with its epoch, so a log that starts over (its rows lost, an object restored from
//! before them) is told from the one a viewer followed.
//!
//! A frame's row is keyed by one integer, its topic's id and its number (`id << 40 | seq`):
//! a call appends at the end of its topic's range and trims from its start, with no text key
//! compared, and an object keeps its topics' state between calls ([`TopicCache`]), so a call
//! reads nothing of the log. A running total of payload bytes in each row sizes any range from
//! its two ends. Measured (RESULTS.md, "A log per topic"): text keys with a topic's row
//! rewritten each call cost click 5,000 and heavy 2,000 13 % and 11 % more CPU than no log;
//! this layout 7 % and 9 %, most of it the page of the log each commit writes.

use std::collections::HashMap;

#[cfg(doc)]
use combd_kernel::limits::TOPIC_LOG_REPLAY_BATCH_BYTES;
use combd_kernel::limits::{TOPIC_LOG_AGE, TOPIC_LOG_BYTES, TOPIC_LOG_FRAMES};
use rusqlite::{params, Connection, OptionalExtension};

use crate::app::{AppError, Effect, SessionId};
use crate::sandbox;
use crate::ws::numbered::{position, prefixed, Resume, Why, PARAM};

/// The log's tables: each topic's id and epoch, and the frames.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS _combd_topics (\
     id INTEGER PRIMARY KEY, topic TEXT NOT NULL UNIQUE, epoch INTEGER NOT NULL); \
     CREATE TABLE IF NOT EXISTS _combd_log (\
     key INTEGER PRIMARY KEY, at_ms INTEGER NOT NULL, text INTEGER NOT NULL, \
     total INTEGER NOT NULL, payload BLOB NOT NULL);";

/// Bits of a row's key that number its frame: past `2^40 - 1` frames (35 years at 1,000 a
/// second) a topic's log starts over with a new epoch.
const SEQ_BITS: u32 = 40;
const SEQ_MAX: u64 = (1 << SEQ_BITS) - 1;

/// How much of a topic's log is kept.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retention {
    pub frames: u64,
    pub bytes: u64,
    pub age_ms: u64,
}

impl Retention {
    /// The node's ([`TOPIC_LOG_FRAMES`], [`TOPIC_LOG_BYTES`], [`TOPIC_LOG_AGE`]).
    #[cfg(test)]
    pub fn node() -> Retention {
        Retention::of(crate::app::LogRetention::NODE)
    }

    /// An app's ([`crate::app::App::log_retention`]), each at most the node's and at least 1.
    pub fn of(app: crate::app::LogRetention) -> Retention {
        Retention {
            frames: app.frames.clamp(1, TOPIC_LOG_FRAMES),
            bytes: app.bytes.clamp(1, TOPIC_LOG_BYTES),
            age_ms: (app.age.as_millis() as u64).clamp(1, TOPIC_LOG_AGE.as_millis() as u64),
        }
    }
}

/// What one call's broadcasts did to the log, and its topics as its transaction leaves them
/// (for [`TopicCache::keep`] once it committed).
#[derive(Debug, Default)]
pub(super) struct Appended {
    pub logged: Logged,
    pub touched: Vec<(String, Cached)>,
}

/// What calls' broadcasts did to the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Logged {
    /// Frames numbered and kept.
    pub frames: u64,
    /// Older frames trimmed.
    pub trimmed: u64,
}

/// A topic as a call finds it: its id and epoch, and its newest frame's number and running
/// byte total (0 and 0 with none).
#[derive(Debug, Clone, Copy)]
struct Topic {
    id: i64,
    epoch: u64,
    last: u64,
    total: u64,
}

impl Topic {
    /// The key of frame `seq`.
    fn key(&self, seq: u64) -> i64 {
        (self.id << SEQ_BITS) | seq as i64
    }

    /// Its keys' range.
    fn range(&self) -> (i64, i64) {
        (self.key(0), self.key(SEQ_MAX))
    }

    /// The topic with its newest frame's number and running total, as `db` has them.
    fn with_newest(self, db: &Connection) -> rusqlite::Result<Topic> {
        Ok(match newest(db, &self)? {
            Some(end) => Topic {
                last: end.seq,
                total: end.total,
                ..self
            },
            None => self,
        })
    }
}

/// Whether the object has the log's tables (made by its first broadcast).
fn has_log(db: &Connection) -> bool {
    db.prepare_cached("SELECT 1 FROM _combd_log LIMIT 0")
        .is_ok()
}

/// What an object knows of its topics' logs between its calls, so a call that broadcasts
/// reads none of it from the database: each topic as the last commit left it, with its oldest
/// frame (none: an empty log). Filled as calls commit ([`TopicCache::keep`]); dropped with the
/// object's connection when it is opened again. At most [`TopicCache::MAX`] topics: past that
/// it starts over (an app that broadcasts to ever new topics reads them again).
#[derive(Debug, Default)]
pub(super) struct TopicCache(std::cell::RefCell<HashMap<String, Cached>>);

/// A topic as a call found or left it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cached {
    t: Topic,
    first: Option<End>,
}

impl TopicCache {
    const MAX: usize = 1024;

    fn get(&self, topic: &str) -> Option<Cached> {
        self.0.borrow().get(topic).copied()
    }

    /// What a call's transaction left of its topics, once it committed.
    pub fn keep(&self, touched: Vec<(String, Cached)>) {
        let mut map = self.0.borrow_mut();
        if map.len() + touched.len() > Self::MAX {
            map.clear();
        }
        map.extend(touched);
    }
}

/// A frame's row as the ends of a range are read: its number, when it was logged, its
/// running byte total and its payload's length.
#[derive(Debug, Clone, Copy)]
struct End {
    seq: u64,
    at_ms: i64,
    total: u64,
    len: u64,
}

impl End {
    /// A row of `SELECT key, at_ms, total, length(payload) FROM _combd_log`.
    fn of(r: &rusqlite::Row<'_>) -> rusqlite::Result<End> {
        Ok(End {
            seq: (r.get::<_, i64>(0)? as u64) & SEQ_MAX,
            at_ms: r.get(1)?,
            total: r.get::<_, i64>(2)? as u64,
            len: r.get::<_, i64>(3)? as u64,
        })
    }
}

/// Numbers the broadcasts among `effects` (one call's, in order) topic by topic, keeps them in
/// the log within `retention`, and trims what falls out of it; in `tx`, the call's own
/// transaction, before it commits. What `cache` knows of a topic is not read again.
pub(super) fn append(
    tx: &Connection,
    effects: &mut [Effect],
    retention: Retention,
    now_ms: u64,
    cache: &TopicCache,
) -> rusqlite::Result<Appended> {
    let mut out = Appended::default();
    if !effects
        .iter()
        .any(|e| matches!(e, Effect::Broadcast { .. }))
    {
        return Ok(out);
    }
    let _node = sandbox::NodeSql::enter();
    // A call's broadcasts go to one topic or few: a short list, in first-seen order.
    let topics = &mut out.touched;
    for e in effects.iter_mut() {
        let Effect::Broadcast {
            topic,
            text,
            payload,
            seq,
            epoch,
        } = e
        else {
            continue;
        };
        let c = entry(tx, cache, topics, topic)?;
        log_frame(tx, c, *text, payload, now_ms)?;
        (*seq, *epoch) = (c.t.last, c.t.epoch);
        out.logged.frames += 1;
    }
    for (_, c) in topics.iter_mut() {
        out.logged.trimmed += trim(tx, c, retention, now_ms)?;
    }
    Ok(out)
}

/// `topic` among a call's `topics`: from what the call found already, or what the object
/// knew, or the database; started over past its last number.
fn entry<'t>(
    tx: &Connection,
    cache: &TopicCache,
    topics: &'t mut Vec<(String, Cached)>,
    topic: &str,
) -> rusqlite::Result<&'t mut Cached> {
    let i = match topics.iter().position(|(name, _)| name == topic) {
        Some(i) => i,
        None => {
            let found = match cache.get(topic) {
                Some(c) => c,
                None => open_topic(tx, topic)?,
            };
            topics.push((topic.to_string(), found));
            topics.len() - 1
        }
    };
    let c = &mut topics[i].1;
    if c.t.last == SEQ_MAX {
        *c = start_over(tx, topic, &c.t)?;
    }
    Ok(c)
}

/// Keeps one broadcast as `c`'s next frame.
fn log_frame(
    tx: &Connection,
    c: &mut Cached,
    text: bool,
    payload: &[u8],
    now_ms: u64,
) -> rusqlite::Result<()> {
    let t = &mut c.t;
    t.last += 1;
    t.total += payload.len() as u64;
    tx.prepare_cached(
        "INSERT INTO _combd_log (key, at_ms, text, total, payload) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        t.key(t.last),
        now_ms as i64,
        text,
        t.total as i64,
        payload
    ])?;
    c.first.get_or_insert(End {
        seq: t.last,
        at_ms: now_ms as i64,
        total: t.total,
        len: payload.len() as u64,
    });
    Ok(())
}

/// `topic` as a call finds it in the database: made, with a fresh epoch, if it has no row (the
/// tables too, at an object's first broadcast).
fn open_topic(tx: &Connection, topic: &str) -> rusqlite::Result<Cached> {
    if !has_log(tx) {
        tx.execute_batch(SCHEMA)?;
    }
    let (id, epoch) = match find_topic(tx, topic)? {
        Some(found) => found,
        None => {
            let epoch = new_epoch();
            tx.prepare_cached("INSERT INTO _combd_topics (topic, epoch) VALUES (?1, ?2)")?
                .execute(params![topic, epoch as i64])?;
            (tx.last_insert_rowid(), epoch)
        }
    };
    let t = Topic {
        id,
        epoch,
        last: 0,
        total: 0,
    }
    .with_newest(tx)?;
    Ok(Cached {
        t,
        first: oldest(tx, &t)?,
    })
}

/// `topic`'s id and epoch, if it has a row.
fn find_topic(db: &Connection, topic: &str) -> rusqlite::Result<Option<(i64, u64)>> {
    db.prepare_cached("SELECT id, epoch FROM _combd_topics WHERE topic = ?1")?
        .query_row([topic], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64)))
        .optional()
}

/// A topic past its last number: its frames dropped, a new epoch, numbered from 1 again.
fn start_over(tx: &Connection, topic: &str, t: &Topic) -> rusqlite::Result<Cached> {
    let (lo, hi) = t.range();
    tx.prepare_cached("DELETE FROM _combd_log WHERE key BETWEEN ?1 AND ?2")?
        .execute([lo, hi])?;
    let epoch = new_epoch();
    tx.prepare_cached("UPDATE _combd_topics SET epoch = ?2 WHERE topic = ?1")?
        .execute(params![topic, epoch as i64])?;
    let t = Topic {
        epoch,
        last: 0,
        total: 0,
        ..*t
    };
    Ok(Cached { t, first: None })
}

/// The newest or the oldest frame of `t`'s range, if it has one.
fn end(db: &Connection, t: &Topic, newest: bool) -> rusqlite::Result<Option<End>> {
    let sql = match newest {
        true => {
            "SELECT key, at_ms, total, length(payload) FROM _combd_log \
                 WHERE key BETWEEN ?1 AND ?2 ORDER BY key DESC LIMIT 1"
        }
        false => {
            "SELECT key, at_ms, total, length(payload) FROM _combd_log \
                  WHERE key BETWEEN ?1 AND ?2 ORDER BY key LIMIT 1"
        }
    };
    let (lo, hi) = t.range();
    db.prepare_cached(sql)?
        .query_row([lo, hi], End::of)
        .optional()
}

fn newest(db: &Connection, t: &Topic) -> rusqlite::Result<Option<End>> {
    end(db, t, true)
}

fn oldest(db: &Connection, t: &Topic) -> rusqlite::Result<Option<End>> {
    end(db, t, false)
}

/// Trims `t`'s oldest frames once it keeps more than `retention` by an eighth (frames, bytes,
/// or its oldest frame's age), down to within it, never its newest; how many went. The
/// eighth's slack makes a trim one statement for many frames, not one a call.
fn trim(
    tx: &Connection,
    c: &mut Cached,
    retention: Retention,
    now_ms: u64,
) -> rusqlite::Result<u64> {
    let t = c.t;
    let Some(first) = c.first else {
        return Ok(0);
    };
    let slack = |v: u64| v.saturating_add(v / 8);
    let kept = |from: &End| (t.last - from.seq + 1, t.total - from.total + from.len);
    let (frames, bytes) = kept(&first);
    let too_old = |at: i64, age: u64| at < now_ms.saturating_sub(age) as i64;
    if frames <= slack(retention.frames)
        && bytes <= slack(retention.bytes)
        && !too_old(first.at_ms, slack(retention.age_ms))
    {
        return Ok(0);
    }
    // The first frame to keep: the oldest within every bound, at most the newest.
    let mut keep = first;
    let (lo, hi) = (t.key(first.seq), t.key(t.last));
    let mut stmt = tx.prepare_cached(
        "SELECT key, at_ms, total, length(payload) FROM _combd_log \
         WHERE key BETWEEN ?1 AND ?2 ORDER BY key",
    )?;
    let mut q = stmt.query([lo, hi])?;
    while let Some(r) = q.next()? {
        let end = End::of(r)?;
        let (frames, bytes) = kept(&end);
        keep = end;
        let within = frames <= retention.frames
            && bytes <= retention.bytes
            && !too_old(end.at_ms, retention.age_ms);
        if within || end.seq == t.last {
            break;
        }
    }
    drop(q);
    if keep.seq == first.seq {
        return Ok(0);
    }
    c.first = Some(keep);
    let cut = t.key(keep.seq - 1);
    let gone = tx
        .prepare_cached("DELETE FROM _combd_log WHERE key BETWEEN ?1 AND ?2")?
        .execute([lo, cut])?;
    Ok(gone as u64)
}

/// What a numbered session attaching to `topic` is sent first ([`crate::ws::numbered`]): the
/// log's position, and if its place (`resume`) is in the log, the frames after it, encoded. A
/// place in another epoch, trimmed, or further behind than [`TOPIC_LOG_BYTES`] of frames gets
/// the position alone (`snapshot`: the app's attach gives the state); one ahead of the log is
/// refused (400), as no client could have it. A place before a log began (`0.0`) resumes from
/// its first frame if none was trimmed. Read on the object's connection before the attach's
/// call, so nothing commits between the two. `budget`: the bytes of replay the batch may still
/// read ([`TOPIC_LOG_REPLAY_BATCH_BYTES`]), less this one's; past it the attach is refused
/// (503 `overloaded`: its client comes back with its place; a session that fell behind is
/// closed for it with 1013, `cells::call`), so a storm of resumes into one object holds at most
/// that much a batch.
pub(super) fn resume(
    db: &Connection,
    topic: &str,
    to: SessionId,
    (resume, budget): (Resume, &mut u64),
) -> Result<(Effect, Why), AppError> {
    let _node = sandbox::NodeSql::enter();
    let t = current(db, topic)?;
    let why = match resume {
        Resume::New => Why::New,
        Resume::After { epoch, seq } => {
            let same = epoch == t.epoch || (epoch == 0 && seq == 0);
            if same && seq > t.last {
                let e = format!(
                    "{PARAM}: {epoch}.{seq} is ahead of the log, at {}.{}",
                    t.epoch, t.last
                );
                return Err(AppError::new(400, e));
            }
            match replayable(db, &t, seq)?.filter(|_| same) {
                // Past what this batch may still read for resumes: refused, and its client
                // comes back later with its place (one resuming in place is closed for it).
                Some(bytes) if bytes > *budget => {
                    let e = AppError::new(503, "overloaded: too many resumes at once");
                    return Err(e.with_detail(format!("{bytes} bytes of replay, {budget} left")));
                }
                Some(bytes) => {
                    *budget -= bytes;
                    Why::Resumed
                }
                None => Why::Snapshot,
            }
        }
    };
    let mut out = Vec::new();
    crate::ws::encode_message(&mut out, true, position(t.epoch, t.last, why).as_bytes());
    // Nothing after its place (nothing at all with no log): the position alone.
    match (why, resume) {
        (Why::Resumed, Resume::After { seq, .. }) if seq < t.last => {
            replay(db, &t, seq, &mut out)?;
        }
        _ => {}
    }
    let effect = Effect::Resume {
        to,
        frames: out,
        place: (t.epoch, t.last),
    };
    Ok((effect, why))
}

/// `topic` as a resume finds it: its id, epoch, last frame and running total; all 0 with no
/// log (no tables yet, or no row).
fn current(db: &Connection, topic: &str) -> rusqlite::Result<Topic> {
    let none = Topic {
        id: 0,
        epoch: 0,
        last: 0,
        total: 0,
    };
    let found = match has_log(db) {
        true => find_topic(db, topic)?,
        false => None,
    };
    match found {
        Some((id, epoch)) => Topic { id, epoch, ..none }.with_newest(db),
        None => Ok(none),
    }
}

/// Appends `t`'s frames after `after` to `out`, each numbered.
fn replay(db: &Connection, t: &Topic, after: u64, out: &mut Vec<u8>) -> rusqlite::Result<()> {
    let (_, hi) = t.range();
    let mut stmt = db.prepare_cached(
        "SELECT key, text, payload FROM _combd_log WHERE key BETWEEN ?1 AND ?2 ORDER BY key",
    )?;
    let mut rows = stmt.query([t.key(after + 1), hi])?;
    while let Some(r) = rows.next()? {
        let (key, text, payload): (i64, bool, Vec<u8>) = (r.get(0)?, r.get(1)?, r.get(2)?);
        let seq = key as u64 & SEQ_MAX;
        crate::ws::encode_message(out, text, &prefixed(seq, &payload));
    }
    Ok(())
}

/// The bytes of payload after `after` in `t`'s log, if every frame after it is there and
/// together within [`TOPIC_LOG_BYTES`] (a resume reads no more than that); `None` if not.
fn replayable(db: &Connection, t: &Topic, after: u64) -> rusqlite::Result<Option<u64>> {
    if after == t.last {
        return Ok(Some(0));
    }
    let Some(first) = oldest(db, t)? else {
        return Ok(None);
    };
    if after + 1 < first.seq {
        return Ok(None);
    }
    // The running total just before frame `after + 1`.
    let before = match after + 1 == first.seq {
        true => first.total - first.len,
        false => db
            .prepare_cached("SELECT total FROM _combd_log WHERE key = ?1")?
            .query_row([t.key(after)], |r| r.get::<_, i64>(0))? as u64,
    };
    let bytes = t.total - before;
    Ok((bytes <= TOPIC_LOG_BYTES).then_some(bytes))
}

/// A new topic's epoch: random (the system's random source), positive, and exact as a
/// JavaScript number (below 2^53).
fn new_epoch() -> u64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    (u64::from_le_bytes(b) >> 11).max(1)
}

/// The numbers the log gave `effects`' broadcasts (0: none), in order: for tests.
#[cfg(test)]
pub(super) fn seqs(effects: &[Effect]) -> Vec<u64> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Broadcast { seq, .. } => Some(*seq),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// An object's database and what it knows of its topics between calls.
    struct Db {
        conn: Connection,
        cache: TopicCache,
        /// Forget the cache after every call: each reads its topics from the database.
        cold: bool,
    }

    impl std::ops::Deref for Db {
        type Target = Connection;
        fn deref(&self) -> &Connection {
            &self.conn
        }
    }

    fn open(tag: &str) -> Db {
        let path = std::env::temp_dir().join(format!(
            "combd-topic-log-{tag}-{}.sqlite",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let conn = Connection::open(path).unwrap();
        Db {
            conn,
            cache: TopicCache::default(),
            cold: false,
        }
    }

    fn broadcast(topic: &str, payload: &[u8]) -> Effect {
        Effect::Broadcast {
            topic: topic.into(),
            text: false,
            payload: payload.to_vec(),
            seq: 0,
            epoch: 0,
        }
    }

    /// Appends `effects` in one transaction, as a call does, and keeps what it left of its
    /// topics once it committed.
    fn commit(db: &mut Db, effects: &mut [Effect], r: Retention, now: u64) -> Logged {
        let tx = db.conn.transaction().unwrap();
        let appended = append(&tx, effects, r, now, &db.cache).unwrap();
        tx.commit().unwrap();
        match db.cold {
            true => db.cache = TopicCache::default(),
            false => db.cache.keep(appended.touched),
        }
        appended.logged
    }

    /// The numbers of `topic`'s frames kept.
    fn kept(db: &Connection, topic: &str) -> Vec<u64> {
        let (id, _) = find_topic(db, topic).unwrap().unwrap();
        db.prepare("SELECT key FROM _combd_log WHERE key >> 40 = ?1 ORDER BY key")
            .unwrap()
            .query_map([id], |r| r.get::<_, i64>(0))
            .unwrap()
            .map(|k| k.unwrap() as u64 & SEQ_MAX)
            .collect()
    }

    fn epoch(db: &Connection, topic: &str) -> u64 {
        find_topic(db, topic).unwrap().unwrap().1
    }

    const WIDE: Retention = Retention {
        frames: 1000,
        bytes: 1 << 20,
        age_ms: 60_000,
    };

    #[test]
    fn each_topic_counts_its_own_frames_in_order_under_one_epoch() {
        let mut db = open("order");
        let mut e = vec![
            broadcast("a", b"1"),
            broadcast("b", b"2"),
            broadcast("a", b"3"),
        ];
        let logged = commit(&mut db, &mut e, WIDE, 1_000);
        assert_eq!(
            logged,
            Logged {
                frames: 3,
                trimmed: 0
            }
        );
        assert_eq!(seqs(&e), [1, 1, 2]);
        let first = epoch(&db, "a");
        assert!(matches!(e[0], Effect::Broadcast { epoch, .. } if epoch == first));
        let mut more = vec![broadcast("a", b"4")];
        commit(&mut db, &mut more, WIDE, 2_000);
        assert_eq!(seqs(&more), [3]);
        assert_eq!(kept(&db, "a"), [1, 2, 3]);
        assert_eq!(kept(&db, "b"), [1]);
        assert_eq!(epoch(&db, "a"), first);
        assert!(first > 0 && first < 1 << 53, "exact as a JavaScript number");
        // Another object's log starts with an epoch of its own.
        let mut other = open("order-other");
        commit(&mut other, &mut [broadcast("a", b"x")], WIDE, 1_000);
        assert_ne!(epoch(&other, "a"), first);
    }

    #[test]
    fn a_call_without_broadcasts_makes_no_log() {
        let mut db = open("none");
        let mut e = vec![Effect::Send {
            to: SessionId::new(0, 1),
            text: true,
            payload: b"x".to_vec(),
        }];
        assert_eq!(commit(&mut db, &mut e, WIDE, 1), Logged::default());
        let tables: i64 = db
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert_eq!(tables, 0);
    }

    #[test]
    fn an_apps_retention_is_taken_within_the_nodes() {
        use crate::app::LogRetention;
        use std::time::Duration;
        let node = Retention::node();
        let less = Retention::of(LogRetention {
            frames: 5,
            bytes: 100,
            age: Duration::from_secs(1),
        });
        assert_eq!((less.frames, less.bytes, less.age_ms), (5, 100, 1000));
        let more = Retention::of(LogRetention {
            frames: u64::MAX,
            bytes: u64::MAX,
            age: Duration::from_secs(86_400),
        });
        assert_eq!(
            (more.frames, more.bytes, more.age_ms),
            (node.frames, node.bytes, node.age_ms)
        );
        let none = Retention::of(LogRetention {
            frames: 0,
            bytes: 0,
            age: Duration::ZERO,
        });
        assert_eq!((none.frames, none.bytes, none.age_ms), (1, 1, 1));
    }

    #[test]
    fn past_its_frames_the_oldest_go() {
        // Cold: each call reads its topics from the database; warm: from what the last left.
        for cold in [false, true] {
            let mut db = open(&format!("frames-{cold}"));
            db.cold = cold;
            let r = Retention { frames: 5, ..WIDE };
            let mut trimmed = 0;
            for i in 0..12u8 {
                trimmed += commit(&mut db, &mut [broadcast("t", &[i])], r, 1_000).trimmed;
            }
            assert_eq!(kept(&db, "t"), [8, 9, 10, 11, 12]);
            assert_eq!(trimmed, 7);
            // Two hundred in one call.
            let mut many: Vec<Effect> = (0..200).map(|_| broadcast("t", b"y")).collect();
            let logged = commit(&mut db, &mut many, r, 1_000);
            assert_eq!(
                logged,
                Logged {
                    frames: 200,
                    trimmed: 200
                }
            );
            assert_eq!(kept(&db, "t"), [208, 209, 210, 211, 212]);
        }
    }

    #[test]
    fn a_trim_waits_for_an_eighth_more_then_goes_back_to_the_retention() {
        // Cold: each call reads its topics from the database; warm: from what the last left.
        for cold in [false, true] {
            let mut db = open(&format!("slack-{cold}"));
            db.cold = cold;
            let r = Retention { frames: 80, ..WIDE };
            for _ in 0..90 {
                assert_eq!(
                    commit(&mut db, &mut [broadcast("t", b"x")], r, 1_000).trimmed,
                    0
                );
            }
            assert_eq!(kept(&db, "t").len(), 90, "80 and an eighth kept untrimmed");
            let logged = commit(&mut db, &mut [broadcast("t", b"x")], r, 1_000);
            assert_eq!(logged.trimmed, 11);
            assert_eq!(kept(&db, "t"), (12..=91).collect::<Vec<u64>>());
        }
    }

    #[test]
    fn past_its_bytes_the_oldest_go_but_never_the_newest() {
        // Cold: each call reads its topics from the database; warm: from what the last left.
        for cold in [false, true] {
            let mut db = open(&format!("bytes-{cold}"));
            db.cold = cold;
            let r = Retention { bytes: 10, ..WIDE };
            for _ in 0..4 {
                commit(&mut db, &mut [broadcast("t", b"abcd")], r, 1_000);
            }
            assert_eq!(kept(&db, "t"), [3, 4], "8 bytes kept of 16, within 10");
            // One frame larger than the whole log's bytes: alone, it is kept (its number is the
            // log's last).
            commit(&mut db, &mut [broadcast("t", &[0; 12])], r, 1_000);
            assert_eq!(kept(&db, "t"), [5]);
        }
    }

    #[test]
    fn past_its_age_the_oldest_go() {
        // Cold: each call reads its topics from the database; warm: from what the last left.
        for cold in [false, true] {
            let mut db = open(&format!("age-{cold}"));
            db.cold = cold;
            let r = Retention {
                age_ms: 1_000,
                ..WIDE
            };
            commit(&mut db, &mut [broadcast("t", b"old")], r, 10_000);
            commit(&mut db, &mut [broadcast("t", b"mid")], r, 10_500);
            commit(&mut db, &mut [broadcast("t", b"new")], r, 11_200);
            assert_eq!(
                kept(&db, "t"),
                [2, 3],
                "the frame of 10,000 is 1,200 ms old"
            );
            commit(&mut db, &mut [broadcast("t", b"later")], r, 99_000);
            assert_eq!(kept(&db, "t"), [4], "the newest stays, whatever its age");
        }
    }

    /// The payloads of a resume's frames (unmasked, as the node writes them).
    /// A resume's frames, as text; each says why, and the resume's `Why` must agree.
    fn frames((effect, why): &(Effect, Why)) -> Vec<String> {
        let Effect::Resume { frames, .. } = effect else {
            panic!("not a resume: {effect:?}");
        };
        let (mut out, mut at) = (Vec::new(), 0);
        while at < frames.len() {
            let (len, head) = match frames[at + 1] {
                126 => (
                    u16::from_be_bytes([frames[at + 2], frames[at + 3]]) as usize,
                    4,
                ),
                127 => panic!("no frame here is that long"),
                n => (n as usize, 2),
            };
            let payload = &frames[at + head..at + head + len];
            out.push(String::from_utf8(payload.to_vec()).unwrap());
            at += head + len;
        }
        let said = out[0].split('|').nth(1).unwrap();
        let said = [Why::New, Why::Resumed, Why::Snapshot]
            .into_iter()
            .find(|w| position(0, 0, *w).ends_with(&format!("|{said}")));
        assert_eq!(said, Some(*why));
        out
    }

    #[test]
    fn a_place_in_the_log_gets_what_came_after_it_else_a_snapshot_or_a_refusal() {
        let mut db = open("resume");
        let to = SessionId::new(0, 7);
        let none = resume(&db, "t", to, (Resume::New, &mut { u64::MAX })).unwrap();
        assert_eq!(frames(&none), ["!0.0|new"]);
        // No log yet: a place before it is where the log is.
        let zero = Resume::After { epoch: 0, seq: 0 };
        assert_eq!(
            frames(&resume(&db, "t", to, (zero, &mut { u64::MAX })).unwrap()),
            ["!0.0|resumed"]
        );
        for i in 1..=5u8 {
            commit(&mut db, &mut [broadcast("t", &[b'0' + i])], WIDE, 1_000);
        }
        let e = epoch(&db, "t");
        let after = |seq| Resume::After { epoch: e, seq };
        assert_eq!(
            frames(&resume(&db, "t", to, (after(3), &mut { u64::MAX })).unwrap()),
            [format!("!{e}.5|resumed"), "4|4".into(), "5|5".into()]
        );
        assert_eq!(
            frames(&resume(&db, "t", to, (after(5), &mut { u64::MAX })).unwrap()),
            [format!("!{e}.5|resumed")]
        );
        // From before the log began: every frame.
        let from_zero = resume(
            &db,
            "t",
            to,
            (Resume::After { epoch: 0, seq: 0 }, &mut { u64::MAX }),
        )
        .unwrap();
        assert_eq!(frames(&from_zero).len(), 6);
        // Another epoch: a snapshot; ahead of the log: refused.
        let other = Resume::After {
            epoch: e + 1,
            seq: 2,
        };
        assert_eq!(
            frames(&resume(&db, "t", to, (other, &mut { u64::MAX })).unwrap()),
            [format!("!{e}.5|snapshot")]
        );
        let ahead = resume(&db, "t", to, (after(6), &mut { u64::MAX })).unwrap_err();
        assert_eq!(ahead.status, 400);
        assert!(
            ahead.message.contains("ahead of the log"),
            "{}",
            ahead.message
        );
        // Trimmed: a snapshot.
        let r = Retention { frames: 2, ..WIDE };
        commit(&mut db, &mut [broadcast("t", b"6")], r, 1_000);
        assert_eq!(kept(&db, "t"), [5, 6]);
        assert_eq!(
            frames(&resume(&db, "t", to, (after(3), &mut { u64::MAX })).unwrap()),
            [format!("!{e}.6|snapshot")]
        );
        assert_eq!(
            frames(&resume(&db, "t", to, (after(4), &mut { u64::MAX })).unwrap()).len(),
            3
        );
    }

    #[test]
    fn a_batchs_resumes_share_a_budget_past_which_one_connecting_comes_back_later() {
        let mut db = open("budget");
        let to = SessionId::new(0, 7);
        for i in 1..=5u8 {
            commit(&mut db, &mut [broadcast("t", &[b'0' + i])], WIDE, 1_000);
        }
        let e = epoch(&db, "t");
        let after = |seq| Resume::After { epoch: e, seq };
        // Past the budget: refused for now (503), not a snapshot.
        let mut budget = 3;
        assert!(resume(&db, "t", to, (after(3), &mut budget)).is_ok());
        assert_eq!(budget, 1, "frames 4 and 5, a byte each");
        let later = resume(&db, "t", to, (after(3), &mut budget)).unwrap_err();
        assert_eq!((later.status, budget), (503, 1));
    }
}
