//! An object's log of its broadcasts, topic by topic: each broadcast gets the next sequence
//! number of its topic in the transaction that commits it, and is kept in the object's own
//! database (node tables, out of the app's reach: `crate::sandbox`), so what a viewer was sent
//! and what the log says can never differ, whatever crashes. A viewer that reconnects resumes
//! from it. The log keeps the last [`TOPIC_LOG_FRAMES`] frames, [`TOPIC_LOG_BYTES`] of
//! payload and [`TOPIC_LOG_AGE`] of time per topic, whichever is least; older frames are
//! trimmed in the same transaction. Its rows count against the object's `COMBD_DB_MAX` like
//! any write: a broadcast that would pass it fails its call (`db_full`), applying nothing.
//!
//! A topic's epoch is drawn when its first frame is logged: a sequence number means something
//! only with its epoch, so a log that starts over (its rows lost, an object restored from
//! before them) is told from the one a viewer followed.

use std::collections::HashMap;

use combd_kernel::limits::{TOPIC_LOG_AGE, TOPIC_LOG_BYTES, TOPIC_LOG_FRAMES};
use rusqlite::{params, Connection, OptionalExtension};

use crate::app::Effect;
use crate::sandbox;

/// The log's tables: a topic's epoch, its last sequence number, and what its kept frames
/// hold; and the frames.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS _combd_topics (\
     topic TEXT PRIMARY KEY, epoch INTEGER NOT NULL, last INTEGER NOT NULL, \
     frames INTEGER NOT NULL, bytes INTEGER NOT NULL) WITHOUT ROWID; \
     CREATE TABLE IF NOT EXISTS _combd_log (\
     topic TEXT NOT NULL, seq INTEGER NOT NULL, at_ms INTEGER NOT NULL, \
     text INTEGER NOT NULL, payload BLOB NOT NULL, PRIMARY KEY (topic, seq)) WITHOUT ROWID;";

/// How much of a topic's log is kept.
#[derive(Debug, Clone, Copy)]
pub(super) struct Retention {
    pub frames: u64,
    pub bytes: u64,
    pub age_ms: u64,
}

impl Retention {
    /// The node's ([`TOPIC_LOG_FRAMES`], [`TOPIC_LOG_BYTES`], [`TOPIC_LOG_AGE`]).
    pub fn node() -> Retention {
        Retention {
            frames: TOPIC_LOG_FRAMES,
            bytes: TOPIC_LOG_BYTES,
            age_ms: TOPIC_LOG_AGE.as_millis() as u64,
        }
    }
}

/// What one call's broadcasts did to the log.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Logged {
    /// Frames numbered and kept.
    pub frames: u64,
    /// Older frames trimmed.
    pub trimmed: u64,
}

/// A topic's row: its epoch, last sequence number, and what its kept frames hold.
#[derive(Debug, Clone, Copy)]
struct Topic {
    epoch: i64,
    last: i64,
    frames: i64,
    bytes: i64,
}

/// Numbers the broadcasts among `effects` (one call's, in order) topic by topic, keeps them in
/// the log within `retention`, and trims what falls out of it; in `tx`, the call's own
/// transaction, before it commits.
pub(super) fn append(
    tx: &Connection,
    effects: &mut [Effect],
    retention: Retention,
    now_ms: u64,
) -> rusqlite::Result<Logged> {
    let mut logged = Logged::default();
    if !effects
        .iter()
        .any(|e| matches!(e, Effect::Broadcast { .. }))
    {
        return Ok(logged);
    }
    let _node = sandbox::NodeSql::enter();
    tx.execute_batch(SCHEMA)?;
    let mut topics: HashMap<String, Topic> = HashMap::new();
    let mut insert = tx.prepare_cached(
        "INSERT INTO _combd_log (topic, seq, at_ms, text, payload) VALUES (?1, ?2, ?3, ?4, ?5)",
    )?;
    for e in effects.iter_mut() {
        let Effect::Broadcast {
            topic,
            text,
            payload,
            seq,
        } = e
        else {
            continue;
        };
        let t = match topics.get_mut(topic.as_str()) {
            Some(t) => t,
            None => topics
                .entry(topic.clone())
                .or_insert(read_topic(tx, topic)?),
        };
        t.last += 1;
        t.frames += 1;
        t.bytes += payload.len() as i64;
        insert.execute(params![&*topic, t.last, now_ms as i64, *text, &*payload])?;
        *seq = t.last as u64;
        logged.frames += 1;
    }
    for (topic, t) in topics.iter_mut() {
        logged.trimmed += trim(tx, topic, t, retention, now_ms)?;
        tx.prepare_cached(
            "INSERT OR REPLACE INTO _combd_topics (topic, epoch, last, frames, bytes) \
             VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![topic, t.epoch, t.last, t.frames, t.bytes])?;
    }
    Ok(logged)
}

/// `topic`'s row, or a new one with a fresh epoch.
fn read_topic(tx: &Connection, topic: &str) -> rusqlite::Result<Topic> {
    let row = tx
        .prepare_cached("SELECT epoch, last, frames, bytes FROM _combd_topics WHERE topic = ?1")?
        .query_row([topic], |r| {
            Ok(Topic {
                epoch: r.get(0)?,
                last: r.get(1)?,
                frames: r.get(2)?,
                bytes: r.get(3)?,
            })
        })
        .optional()?;
    Ok(row.unwrap_or(Topic {
        epoch: new_epoch(),
        last: 0,
        frames: 0,
        bytes: 0,
    }))
}

/// Trims `topic`'s oldest frames while it keeps more than `retention` (frames, bytes, or one
/// older than its age); how many went.
fn trim(
    tx: &Connection,
    topic: &str,
    t: &mut Topic,
    retention: Retention,
    now_ms: u64,
) -> rusqlite::Result<u64> {
    let too_old = now_ms.saturating_sub(retention.age_ms) as i64;
    let over = |t: &Topic| t.frames as u64 > retention.frames || t.bytes as u64 > retention.bytes;
    let mut trimmed = 0;
    loop {
        // The oldest frames, a few at a time: a batch trims about as many as it logged.
        let oldest: Vec<(i64, i64, i64)> = tx
            .prepare_cached(
                "SELECT seq, at_ms, length(payload) FROM _combd_log WHERE topic = ?1 \
                 ORDER BY seq LIMIT 64",
            )?
            .query_map([topic], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let mut cut = None;
        for (seq, at, len) in &oldest {
            if !over(t) && *at >= too_old {
                break;
            }
            t.frames -= 1;
            t.bytes -= len;
            cut = Some(*seq);
        }
        let Some(cut) = cut else { return Ok(trimmed) };
        trimmed += tx
            .prepare_cached("DELETE FROM _combd_log WHERE topic = ?1 AND seq <= ?2")?
            .execute(params![topic, cut])? as u64;
        if oldest.len() < 64 || Some(&cut) != oldest.last().map(|o| &o.0) {
            return Ok(trimmed);
        }
    }
}

/// A new topic's epoch: random (the system's random source), positive, and exact as a
/// JavaScript number (below 2^53).
fn new_epoch() -> i64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    let _ = ring::rand::SystemRandom::new().fill(&mut b);
    ((u64::from_le_bytes(b) >> 11) as i64).max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn open(tag: &str) -> Connection {
        let path = std::env::temp_dir().join(format!(
            "combd-topic-log-{tag}-{}.sqlite",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        Connection::open(path).unwrap()
    }

    fn broadcast(topic: &str, payload: &[u8]) -> Effect {
        Effect::Broadcast {
            topic: topic.into(),
            text: false,
            payload: payload.to_vec(),
            seq: 0,
        }
    }

    /// Appends `effects` in one transaction, as a call does.
    fn commit(db: &mut Connection, effects: &mut [Effect], r: Retention, now: u64) -> Logged {
        let tx = db.transaction().unwrap();
        let logged = append(&tx, effects, r, now).unwrap();
        tx.commit().unwrap();
        logged
    }

    fn kept(db: &Connection, topic: &str) -> Vec<i64> {
        db.prepare("SELECT seq FROM _combd_log WHERE topic = ?1 ORDER BY seq")
            .unwrap()
            .query_map([topic], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    fn topic_row(db: &Connection, topic: &str) -> (i64, i64, i64, i64) {
        db.query_row(
            "SELECT epoch, last, frames, bytes FROM _combd_topics WHERE topic = ?1",
            [topic],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap()
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
        let seqs: Vec<u64> = e
            .iter()
            .map(|e| match e {
                Effect::Broadcast { seq, .. } => *seq,
                _ => 0,
            })
            .collect();
        assert_eq!(seqs, [1, 1, 2]);
        let (epoch, ..) = topic_row(&db, "a");
        let mut more = vec![broadcast("a", b"4")];
        commit(&mut db, &mut more, WIDE, 2_000);
        assert!(matches!(more[0], Effect::Broadcast { seq: 3, .. }));
        assert_eq!(kept(&db, "a"), [1, 2, 3]);
        assert_eq!(topic_row(&db, "a"), (epoch, 3, 3, 3));
        assert!(epoch > 0 && epoch < 1 << 53, "exact as a JavaScript number");
        // Another object's log starts with an epoch of its own.
        let mut other = open("order-other");
        commit(&mut other, &mut [broadcast("a", b"x")], WIDE, 1_000);
        assert_ne!(topic_row(&other, "a").0, epoch);
    }

    #[test]
    fn a_call_without_broadcasts_makes_no_log() {
        let mut db = open("none");
        let mut e = vec![Effect::Send {
            to: crate::app::SessionId::new(0, 1),
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
    fn past_its_frames_the_oldest_go() {
        let mut db = open("frames");
        let r = Retention { frames: 5, ..WIDE };
        let mut trimmed = 0;
        for i in 0..12u8 {
            trimmed += commit(&mut db, &mut [broadcast("t", &[i])], r, 1_000).trimmed;
        }
        assert_eq!(kept(&db, "t"), [8, 9, 10, 11, 12]);
        assert_eq!(trimmed, 7);
        let (_, last, frames, _) = topic_row(&db, "t");
        assert_eq!((last, frames), (12, 5));
        // Two hundred in one call: trimmed past one page of 64 oldest.
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

    #[test]
    fn past_its_bytes_the_oldest_go() {
        let mut db = open("bytes");
        let r = Retention { bytes: 10, ..WIDE };
        for _ in 0..4 {
            commit(&mut db, &mut [broadcast("t", b"abcd")], r, 1_000);
        }
        assert_eq!(kept(&db, "t"), [3, 4], "8 bytes kept of 16, within 10");
        assert_eq!(topic_row(&db, "t").3, 8);
        // One frame larger than the whole log's bytes leaves it empty, its number counted.
        commit(&mut db, &mut [broadcast("t", &[0; 11])], r, 1_000);
        assert!(kept(&db, "t").is_empty());
        assert_eq!(topic_row(&db, "t").1, 5);
    }

    #[test]
    fn past_its_age_the_oldest_go() {
        let mut db = open("age");
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
    }
}
