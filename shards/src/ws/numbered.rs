//! Numbered sessions: the wire protocol of a WebSocket whose client keeps its place in its
//! topic's log (`cells::topic_log`) and resumes from it after a reconnection.
//!
//! A client asks for it with `combd_after` in the upgrade's query: `combd_after=new` (no place
//! yet), or `combd_after=<epoch>.<seq>` (the last frame it got, and its log's epoch). Every
//! message the node then sends it starts with a header up to the first `|`, the app's payload
//! after it, in a frame of the payload's type (text stays text):
//!
//! | header | what follows |
//! |---|---|
//! | `<seq>` | a broadcast, number `seq` of the topic's log |
//! | (empty) | a message to this session alone (`cx.send`), not in the log |
//! | `!<epoch>.<last>` | a position: the log is at `epoch`, its last frame `last`; the rest says why: `new` (a log begins, or the session had no place), `resumed` (the frames after the client's place follow, up to `last`), or `snapshot` (its place is gone: trimmed, another epoch; the app's attach gives it the state) |
//!
//! A client takes a broadcast only if it is the next of its place (`last + 1`), drops one it
//! has (`<= last`), and after a position counts from its `last`; frames that came before a
//! position are in the app's state or in the replay that follows it. A broadcast that skips
//! a number means frames were lost on the way (its session fell behind): the client
//! reconnects with its place.

/// The header of a topic's presence (`crate::cells::presence`): a change,
/// `{"join":[...],"leave":[...],"unlisted":n}`, or its members as a session attaches,
/// `{"members":[...],"unlisted":n}`.
pub const PRESENCE: &str = "!presence|";

/// The query parameter that makes a session numbered.
pub const PARAM: &str = "combd_after";

/// Where a numbered session starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// No place yet: the app's attach gives the state, and the position says where the log is.
    New,
    /// After frame `seq` of the log of epoch `epoch`.
    After {
        /// The log's epoch.
        epoch: u64,
        /// The last frame the client got.
        seq: u64,
    },
}

impl Resume {
    /// The place `query` asks for: `None` when it has no `combd_after`; an error naming the
    /// parameter when its value is not `new` or `<epoch>.<seq>`, or it comes twice.
    pub fn from_query(query: Option<&str>) -> Result<Option<Resume>, String> {
        let mut found = None;
        for pair in query.unwrap_or("").split('&') {
            let Some(value) = pair.strip_prefix(PARAM).and_then(|r| r.strip_prefix('=')) else {
                if pair == PARAM {
                    return Err(format!("{PARAM}: expected new or <epoch>.<seq>"));
                }
                continue;
            };
            if found.is_some() {
                return Err(format!("{PARAM}: given twice"));
            }
            found = Some(Resume::parse(value)?);
        }
        Ok(found)
    }

    fn parse(value: &str) -> Result<Resume, String> {
        if value == "new" {
            return Ok(Resume::New);
        }
        let bad = || format!("{PARAM}: expected new or <epoch>.<seq>, not {value:.40}");
        let (epoch, seq) = value.split_once('.').ok_or_else(bad)?;
        let number = |s: &str| {
            (!s.is_empty() && s.len() <= 19 && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse::<u64>().ok())
                .flatten()
        };
        match (number(epoch), number(seq)) {
            (Some(epoch), Some(seq)) => Ok(Resume::After { epoch, seq }),
            _ => Err(bad()),
        }
    }
}

/// Why a position is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// A log begins, or the session had no place.
    New,
    /// The frames after the client's place follow.
    Resumed,
    /// The client's place is gone; the app's attach gives it the state.
    Snapshot,
}

/// A position's text: `!<epoch>.<last>|<why>`.
pub fn position(epoch: u64, last: u64, why: Why) -> String {
    let why = match why {
        Why::New => "new",
        Why::Resumed => "resumed",
        Why::Snapshot => "snapshot",
    };
    format!("!{epoch}.{last}|{why}")
}

/// A message's payload for a numbered session: `<seq>|` before a broadcast's (`seq` > 0),
/// `|` before a message to the session alone (`seq` 0).
pub fn prefixed(seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.len() + 21);
    if seq > 0 {
        out.extend_from_slice(seq.to_string().as_bytes());
    }
    out.push(b'|');
    out.extend_from_slice(payload);
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_new_or_an_epoch_and_a_number() {
        let q = |s| Resume::from_query(Some(s));
        assert_eq!(q("combd_after=new"), Ok(Some(Resume::New)));
        assert_eq!(
            q("room=1&combd_after=77.1200"),
            Ok(Some(Resume::After {
                epoch: 77,
                seq: 1200
            }))
        );
        assert_eq!(q("after=3"), Ok(None));
        assert_eq!(Resume::from_query(None), Ok(None));
        for bad in [
            "combd_after",
            "combd_after=",
            "combd_after=7",
            "combd_after=7.",
            "combd_after=.7",
            "combd_after=-1.2",
            "combd_after=1.2.3",
            "combd_after=99999999999999999999.1",
            "combd_after=new&combd_after=new",
        ] {
            let e = q(bad).unwrap_err();
            assert!(e.starts_with("combd_after: "), "{bad}: {e}");
        }
    }

    #[test]
    fn headers_end_at_the_first_bar() {
        assert_eq!(prefixed(12, b"{\"a\":1}"), b"12|{\"a\":1}");
        assert_eq!(prefixed(0, b"x|y"), b"|x|y");
        assert_eq!(position(9, 40, Why::Resumed), "!9.40|resumed");
    }
}
