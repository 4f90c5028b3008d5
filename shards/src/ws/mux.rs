//! Many subscriptions on one WebSocket: the envelope of the multiplexed route (`GET /ws`).
//!
//! Each subscription is a session of its own (attached to an object of any app on any shard
//! of the node, with its own place in its topic's log and its own presence), named on the
//! socket by a channel number the client chose. Every message on the socket starts with a
//! header up to the first `|`:
//!
//! | from | header | what follows |
//! |---|---|---|
//! | client | `+<ch>` | `<app>/<name>[?<query>]`: subscribe channel `ch` to object `name` of `app`, its query as an upgrade's (`combd_after=` makes it numbered) |
//! | client | `-<ch>` | nothing: unsubscribe |
//! | client | `<ch>` | a message to the channel's object (text or binary, as sent) |
//! | node | `<ch>` | a message of the subscription, exactly as the one-object route sends it (numbered: `<ch>\|<seq>\|…`) |
//! | node | `+<ch>` | nothing: the object took the subscription; its messages follow |
//! | node | `-<ch>` | nothing (the client's unsubscribe is done), or why the node refused or ended it: `{"status":…,"error":…}` (a refusal, with the status the upgrade would have had) or `{"code":…,"error":…}` (an end, with the close code the one-object socket would have closed with) |
//!
//! A channel is a whole number from 0 to 4,294,967,295; one that is open cannot be subscribed
//! again. A message that does not follow this closes the socket (1008, `bad envelope`).

/// The route of the multiplexed WebSocket.
pub const PATH: &str = "/ws";

/// What a client's message asks.
#[derive(Debug, PartialEq, Eq)]
pub enum Envelope<'a> {
    /// Subscribe channel `ch` to `object` of `app`, with `query`.
    Subscribe {
        /// The channel.
        ch: u32,
        /// The app's name.
        app: &'a str,
        /// The object's name, as in `/o/<app>/<name>`.
        object: &'a str,
        /// The query its app is given, as an upgrade's.
        query: Option<&'a str>,
    },
    /// End channel `ch`.
    Unsubscribe {
        /// The channel.
        ch: u32,
    },
    /// A message to channel `ch`'s object.
    Message {
        /// The channel.
        ch: u32,
        /// The message, after the header.
        payload: &'a [u8],
    },
}

/// Reads a client's message; the error says what is wrong with it (at most 40 bytes of it).
pub fn parse(message: &[u8]) -> Result<Envelope<'_>, String> {
    let bar = message
        .iter()
        .position(|&b| b == b'|')
        .ok_or("no | after the channel")?;
    let (head, rest) = (&message[..bar], &message[bar + 1..]);
    let (op, digits) = match head.first() {
        Some(b'+') => (Some(true), &head[1..]),
        Some(b'-') => (Some(false), &head[1..]),
        _ => (None, head),
    };
    let ch = channel(digits).ok_or_else(|| {
        format!(
            "bad channel {:.40}",
            String::from_utf8_lossy(&head[..head.len().min(40)])
        )
    })?;
    match op {
        None => Ok(Envelope::Message { ch, payload: rest }),
        Some(false) if rest.is_empty() => Ok(Envelope::Unsubscribe { ch }),
        Some(false) => Err("an unsubscribe carries nothing after |".into()),
        Some(true) => {
            let target = std::str::from_utf8(rest).map_err(|_| "a subscribe is not UTF-8")?;
            let (path, query) = match target.split_once('?') {
                Some((p, q)) => (p, Some(q)),
                None => (target, None),
            };
            let (app, object) = path
                .split_once('/')
                .filter(|(a, o)| !a.is_empty() && !o.is_empty())
                .ok_or_else(|| format!("expected <app>/<name>, not {path:.40}"))?;
            Ok(Envelope::Subscribe {
                ch,
                app,
                object,
                query,
            })
        }
    }
}

/// A channel number: 1 to 10 decimal digits that fit 32 bits.
fn channel(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(digits).ok()?.parse().ok()
}

/// `+<ch>|`: the object took channel `ch`.
pub fn subscribed(out: &mut Vec<u8>, ch: u32) {
    super::encode_message(out, true, format!("+{ch}|").as_bytes());
}

/// `-<ch>|<json>`: channel `ch` ended, with why (`json` empty: the client asked).
pub fn ended(out: &mut Vec<u8>, ch: u32, json: &str) {
    super::encode_message(out, true, format!("-{ch}|{json}").as_bytes());
}

/// Why the node refused a subscribe: the status its upgrade would have had.
pub fn refusal(status: u16, error: &str) -> String {
    serde_json::json!({ "status": status, "error": error }).to_string()
}

/// Why the node ended a subscription: the close code its own socket would have had.
pub fn end(code: u16, error: &str) -> String {
    serde_json::json!({ "code": code, "error": error }).to_string()
}

/// Appends `frames` (whole, unmasked frames the node encoded, none of them compressed or
/// fragmented) to `out`, each with `<ch>|` before its payload. A frame that is not one of
/// those is appended as it is (never made here).
pub fn rewrap(out: &mut Vec<u8>, ch: u32, mut frames: &[u8]) {
    let prefix = format!("{ch}|");
    while let Some((op @ (1 | 2), start, end)) = server_frame(frames) {
        let text = op == 1;
        let mut payload = Vec::with_capacity(prefix.len() + end - start);
        payload.extend_from_slice(prefix.as_bytes());
        payload.extend_from_slice(&frames[start..end]);
        super::encode_message(out, text, &payload);
        frames = &frames[end..];
    }
    out.extend_from_slice(frames);
}

/// The first frame of `frames` if it is a whole final frame without RSV bits or mask, as a
/// node sends them (never fragmented, never compressed here): its opcode, and where its
/// payload starts and ends.
pub fn server_frame(frames: &[u8]) -> Option<(u8, usize, usize)> {
    let (&b0, &b1) = (frames.first()?, frames.get(1)?);
    if b0 & 0xf0 != 0x80 {
        return None;
    }
    let op = b0 & 0x0f;
    if b1 & 0x80 != 0 {
        return None;
    }
    let (len, start): (usize, usize) = match b1 & 0x7f {
        126 => (
            u16::from_be_bytes(frames.get(2..4)?.try_into().ok()?) as usize,
            4,
        ),
        127 => (
            usize::try_from(u64::from_be_bytes(frames.get(2..10)?.try_into().ok()?)).ok()?,
            10,
        ),
        n => (n as usize, 2),
    };
    let end = start.checked_add(len).filter(|&e| e <= frames.len())?;
    Some((op, start, end))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_read_as_documented() {
        assert_eq!(
            parse(b"+7|chat/lobby?combd_after=new").unwrap(),
            Envelope::Subscribe {
                ch: 7,
                app: "chat",
                object: "lobby",
                query: Some("combd_after=new")
            }
        );
        assert_eq!(
            parse(b"+0|board/a").unwrap(),
            Envelope::Subscribe {
                ch: 0,
                app: "board",
                object: "a",
                query: None
            }
        );
        assert_eq!(
            parse(b"-4294967295|").unwrap(),
            Envelope::Unsubscribe { ch: u32::MAX }
        );
        assert_eq!(
            parse(b"12|a|b").unwrap(),
            Envelope::Message {
                ch: 12,
                payload: b"a|b"
            }
        );
        for bad in [
            &b"hello"[..],
            b"|x",
            b"+|chat/a",
            b"4294967296|x",
            b"-1|x",
            b"+1|chat",
            b"+1|/a",
            b"+1|chat/",
            b"x1|y",
            b"+1|\xff/a",
        ] {
            assert!(parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn rewrapped_frames_carry_their_channel() {
        let mut frames = Vec::new();
        super::super::encode_message(&mut frames, true, b"!1.5|resumed");
        super::super::encode_message(&mut frames, false, &[7u8; 300]);
        super::super::encode_message(&mut frames, true, b"5|{}");
        let mut out = Vec::new();
        rewrap(&mut out, 42, &frames);
        let mut expected = Vec::new();
        super::super::encode_message(&mut expected, true, b"42|!1.5|resumed");
        let mut binary = b"42|".to_vec();
        binary.extend_from_slice(&[7u8; 300]);
        super::super::encode_message(&mut expected, false, &binary);
        super::super::encode_message(&mut expected, true, b"42|5|{}");
        assert_eq!(out, expected);
    }
}
