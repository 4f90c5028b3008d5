//! permessage-deflate (RFC 7692): its negotiation, and compressing and decompressing whole
//! messages.
//!
//! The node always answers `server_no_context_takeover; client_no_context_takeover`: each
//! message is compressed on its own, in both directions. That is what lets one broadcast be
//! compressed once and the same bytes go to every viewer that negotiated it ([`OutFrame`]),
//! and it keeps no compression state in a connection: a shard has one compressor and one
//! decompressor, reset for each message, and a message is decompressed only once all of it has
//! arrived (its compressed bytes are held like any message under reassembly, within
//! `COMBD_WS_MAX_MESSAGE`, and its decompressed size is bounded by the same limit).

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use combd_kernel::limits::WS_DEFLATE_MIN_BYTES;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};
use tungstenite::protocol::frame::coding::{Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

use super::WsError;

/// The extension as the node accepts it, in its 101 (with `; server_max_window_bits=15` after
/// it when the offer named the window: see [`Negotiated`]).
pub const RESPONSE: &str =
    "permessage-deflate; server_no_context_takeover; client_no_context_takeover";

/// permessage-deflate as a WebSocket negotiated it. The node compresses with a 32 KiB window
/// (15 bits) and nothing smaller: an offer asking for a smaller `server_max_window_bits` is
/// declined (RFC 7692, 7.1.2.1 lets a server decline an offer it cannot honour). Accepting
/// one would mean sending every message longer than the window plain, and a client could
/// then turn small compressed messages into the node's uncompressed megabytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The offer named `server_max_window_bits` (15: the response must then name it too).
    pub window_asked: bool,
}

impl Negotiated {
    /// The `Sec-WebSocket-Extensions` value of the 101.
    pub fn response(self) -> String {
        if self.window_asked {
            format!("{RESPONSE}; server_max_window_bits=15")
        } else {
            RESPONSE.to_string()
        }
    }
}

/// The four bytes a sync flush ends with, which a message's compressed payload leaves out
/// (RFC 7692, 7.2.1) and its receiver adds back (7.2.2).
const TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// What the `Sec-WebSocket-Extensions` values of an upgrade offer of permessage-deflate the
/// node accepts (RFC 7692, 7.1): the first acceptable offer. Offers of other extensions, and
/// permessage-deflate offers that must be declined (an unknown or repeated parameter, an
/// invalid value, a `server_max_window_bits` under 15), are passed over.
pub fn offered<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<Negotiated> {
    values.into_iter().find_map(|value| {
        value
            .split(|&b| b == b',')
            .find_map(|offer| std::str::from_utf8(offer).ok().and_then(acceptable))
    })
}

/// One offer (`permessage-deflate; param; param=value`), if it can be accepted.
fn acceptable(offer: &str) -> Option<Negotiated> {
    let mut parts = offer.split(';').map(str::trim);
    if !parts
        .next()
        .is_some_and(|name| name.eq_ignore_ascii_case("permessage-deflate"))
    {
        return None;
    }
    let mut negotiated = Negotiated {
        window_asked: false,
    };
    let mut seen: Vec<String> = Vec::new();
    for param in parts {
        let (name, value) = match param.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (param, None),
        };
        let name = name.to_ascii_lowercase();
        if seen.contains(&name) {
            return None;
        }
        match (name.as_str(), value) {
            ("server_no_context_takeover" | "client_no_context_takeover", None) => {}
            // The window the client compresses with: any is fine to decompress.
            ("client_max_window_bits", None) => {}
            ("client_max_window_bits", Some(v)) => {
                window_bits(v)?;
            }
            // The window the node compresses with: its own 32 KiB, or the offer is declined.
            ("server_max_window_bits", Some(v)) => {
                if window_bits(v)? != 15 {
                    return None;
                }
                negotiated.window_asked = true;
            }
            _ => return None,
        }
        seen.push(name);
    }
    Some(negotiated)
}

/// A window size parameter's value: 8 to 15, in decimal without leading zeros.
fn window_bits(v: &str) -> Option<u8> {
    if v.starts_with('0') {
        return None;
    }
    v.parse::<u8>().ok().filter(|b| (8..=15).contains(b))
}

thread_local! {
    /// The shard's compressor and decompressor (raw deflate, no zlib header), reset for each
    /// message.
    static COMPRESS: RefCell<Compress> = RefCell::new(Compress::new(Compression::fast(), false));
    static DECOMPRESS: RefCell<Decompress> = RefCell::new(Decompress::new(false));
}

/// Decompresses a whole message's payload; more than `max` bytes out is [`WsError::TooBig`]
/// (what was decompressed is dropped at once), data that does not decompress is
/// [`WsError::BadDeflate`].
pub fn inflate(payload: &[u8], max: u64) -> Result<Vec<u8>, WsError> {
    DECOMPRESS.with(|d| {
        let mut d = d.borrow_mut();
        d.reset(false);
        let mut out = Vec::with_capacity((payload.len() * 3).clamp(64, 64 * 1024));
        for input in [payload, &TAIL[..]] {
            let mut at = 0;
            loop {
                if out.len() == out.capacity() {
                    // Grown by doubling, never past one byte over the limit.
                    let room = (max as usize).saturating_add(1).saturating_sub(out.len());
                    out.reserve(out.len().max(1024).min(room).max(1));
                }
                let (was_in, was_out) = (d.total_in(), d.total_out());
                let status = d
                    .decompress_vec(&input[at..], &mut out, FlushDecompress::Sync)
                    .map_err(|_| WsError::BadDeflate)?;
                at += (d.total_in() - was_in) as usize;
                if out.len() as u64 > max {
                    return Err(WsError::TooBig);
                }
                if status == Status::StreamEnd {
                    break;
                }
                // Done once a call with room to write takes and gives nothing: the
                // decompressor may hold output back after taking the last input.
                let idle = d.total_in() == was_in && d.total_out() == was_out;
                if idle && out.len() < out.capacity() {
                    if at < input.len() {
                        // Input left that it will not take.
                        return Err(WsError::BadDeflate);
                    }
                    break;
                }
            }
        }
        Ok(out)
    })
}

/// Compresses a whole message's payload, without the sync flush's four last bytes; `None` if
/// the compressor failed (it does not, writing into memory with room).
pub fn deflate(payload: &[u8]) -> Option<Vec<u8>> {
    COMPRESS.with(|c| {
        let mut c = c.borrow_mut();
        c.reset();
        // One call, with room for the worst case (stored blocks: 5 bytes of header for each
        // 16 KiB or less, and the flush's empty block): the compressor holds output back when a
        // call runs out of room, and a 64 KiB message came out 4 KiB short when it was
        // compressed in pieces.
        let mut out = Vec::with_capacity(payload.len() + payload.len() / 1024 * 5 + 64);
        c.compress_vec(payload, &mut out, FlushCompress::Sync)
            .ok()?;
        if c.total_in() != payload.len() as u64 || out.len() == out.capacity() {
            return None;
        }
        if out.ends_with(&TAIL) {
            out.truncate(out.len() - TAIL.len());
        }
        Some(out)
    })
}

/// A message frame as the node sends it, made once for every session it goes to: plain, and
/// (at most once, by the first session that negotiated permessage-deflate and writes it)
/// compressed, when its payload is at least [`WS_DEFLATE_MIN_BYTES`] and compressing makes it
/// smaller; and (at most once, by the first numbered session that writes it) with its number
/// ([`super::numbered`]).
#[derive(Debug)]
pub struct OutFrame {
    plain: Box<[u8]>,
    /// Where the payload starts in `plain`.
    header_len: usize,
    text: bool,
    deflated: OnceLock<Option<Box<[u8]>>>,
    numbered: OnceLock<Box<[u8]>>,
    /// Numbered and compressed where it is worth it, and whether it was.
    numbered_deflated: OnceLock<(Box<[u8]>, bool)>,
    kind: Kind,
}

/// What an [`OutFrame`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An app's message: `seq` its number in its topic's log (0: not in one) of epoch `epoch`.
    Message { seq: u64, epoch: u64 },
    /// The rest of a frame a write sent only part of: bytes, not a message of their own.
    Rest,
    /// Frames the node made for one numbered session (a position, a replay), sent as they are;
    /// the place they bring it to (epoch, last).
    Node { place: (u64, u64) },
    /// A change of a topic's presence, or its members (`crate::cells::presence`), already
    /// headed `!presence|`: for numbered sessions only.
    Presence,
    /// No frame: the session is to be closed with 1013 (its resume could not be served now).
    TryAgain,
}

/// How a session's messages are written: as they are, compressed where it is worth it
/// (permessage-deflate negotiated), or numbered ([`super::numbered`]), compressed too where
/// it was negotiated and is worth it (the node's own frames, a position or a replay, never).
#[derive(Debug, Clone, Copy)]
pub enum Framing {
    /// As they are.
    Plain,
    /// Compressed where it is worth it.
    Deflate(Negotiated),
    /// Numbered; compressed where it is worth it if `deflate` (negotiated).
    Numbered {
        /// permessage-deflate was negotiated.
        deflate: bool,
    },
    /// A subscription of a multiplexed WebSocket ([`super::mux`]): as the one-object route
    /// would send it, never compressed, numbered if `numbered`, each frame then headed with
    /// its channel ([`super::mux::rewrap`], by the session as it takes its mail).
    Mux {
        /// Its channel on the socket.
        ch: u32,
        /// Numbered.
        numbered: bool,
    },
}

impl Framing {
    /// A session's framing: numbered if its client asked, else as compression was negotiated.
    pub fn of(deflate: Option<Negotiated>, numbered: bool) -> Framing {
        match (numbered, deflate) {
            (true, d) => Framing::Numbered {
                deflate: d.is_some(),
            },
            (false, Some(d)) => Framing::Deflate(d),
            (false, None) => Framing::Plain,
        }
    }
}

impl OutFrame {
    fn new(plain: Vec<u8>, header_len: usize, text: bool, kind: Kind) -> Arc<OutFrame> {
        Arc::new(OutFrame {
            plain: plain.into_boxed_slice(),
            header_len,
            text,
            deflated: OnceLock::new(),
            numbered: OnceLock::new(),
            numbered_deflated: OnceLock::new(),
            kind,
        })
    }

    /// The unsent rest of a plain frame that a write cut short: written before anything else,
    /// never compressed, not counted as a message.
    pub fn rest(bytes: &[u8]) -> Arc<OutFrame> {
        OutFrame::new(bytes.to_vec(), 0, false, Kind::Rest)
    }

    /// Whether this is the rest of a frame cut short ([`OutFrame::rest`]).
    pub fn is_rest(&self) -> bool {
        self.kind == Kind::Rest
    }

    /// A final text (`text`) or binary message frame.
    pub fn message(text: bool, payload: &[u8]) -> Arc<OutFrame> {
        OutFrame::logged(text, payload, 0, 0)
    }

    /// A broadcast's frame, number `seq` of its topic's log of epoch `epoch` (0: in none).
    pub fn logged(text: bool, payload: &[u8], seq: u64, epoch: u64) -> Arc<OutFrame> {
        let mut plain = Vec::with_capacity(payload.len() + 10);
        super::encode_message(&mut plain, text, payload);
        let header_len = plain.len() - payload.len();
        OutFrame::new(plain, header_len, text, Kind::Message { seq, epoch })
    }

    /// Frames the node made for one numbered session, already encoded: sent as they are.
    /// `place`: the log's epoch and last frame once the session has them.
    pub fn node(frames: Vec<u8>, place: (u64, u64)) -> Arc<OutFrame> {
        OutFrame::new(frames, 0, false, Kind::Node { place })
    }

    /// A topic's presence, as numbered sessions are told it: `!presence|<json>`.
    pub fn presence(json: &[u8]) -> Arc<OutFrame> {
        let mut payload = Vec::with_capacity(json.len() + 10);
        payload.extend_from_slice(super::numbered::PRESENCE.as_bytes());
        payload.extend_from_slice(json);
        let mut plain = Vec::with_capacity(payload.len() + 10);
        super::encode_message(&mut plain, true, &payload);
        OutFrame::new(plain, 0, true, Kind::Presence)
    }

    /// Not a frame: what closes a session with 1013, try again later (a numbered session's
    /// resume in place its object could not serve now: its client reconnects with its place).
    pub fn try_again() -> Arc<OutFrame> {
        OutFrame::new(Vec::new(), 0, false, Kind::TryAgain)
    }

    /// What closes the session ([`OutFrame::try_again`]).
    pub fn is_try_again(&self) -> bool {
        self.kind == Kind::TryAgain
    }

    /// A topic's presence ([`OutFrame::presence`]), which only numbered sessions take.
    pub fn is_presence(&self) -> bool {
        self.kind == Kind::Presence
    }

    /// A broadcast numbered in its topic's log.
    pub fn is_logged(&self) -> bool {
        matches!(self.kind, Kind::Message { seq, .. } if seq > 0)
    }

    /// Frames the node made for one numbered session ([`OutFrame::node`]).
    pub fn is_node(&self) -> bool {
        matches!(self.kind, Kind::Node { .. })
    }

    /// The place in its topic's log a numbered session is at once it has this frame: (epoch,
    /// seq) of a broadcast in a log, or what the node's own frames bring it to.
    pub fn place(&self) -> Option<(u64, u64)> {
        match self.kind {
            Kind::Message { seq, epoch } if seq > 0 => Some((epoch, seq)),
            Kind::Node { place } => Some(place),
            _ => None,
        }
    }

    /// The frame's bytes as written on the wire, plain.
    pub fn plain(&self) -> &[u8] {
        &self.plain
    }

    /// The bytes for a session written with `framing`, and whether they are compressed.
    pub fn for_session(&self, framing: Framing) -> (&[u8], bool) {
        let Kind::Message { seq, epoch } = self.kind else {
            return (&self.plain, false);
        };
        match framing {
            Framing::Plain
            | Framing::Mux {
                numbered: false, ..
            } => (&self.plain, false),
            Framing::Numbered { deflate: false } | Framing::Mux { numbered: true, .. } => (
                self.numbered
                    .get_or_init(|| self.number(seq, epoch, false).0),
                false,
            ),
            Framing::Numbered { deflate: true } => {
                let (bytes, deflated) = self
                    .numbered_deflated
                    .get_or_init(|| self.number(seq, epoch, true));
                (bytes, *deflated)
            }
            Framing::Deflate(_) => match self.deflated.get_or_init(|| self.compress()) {
                Some(d) => (d, true),
                None => (&self.plain, false),
            },
        }
    }

    /// The frame for a numbered session: its number before its payload, compressed where it
    /// is worth it if `deflate`; the first frame of a log after the position that says the log
    /// begins (its epoch is new). Whether it went compressed.
    fn number(&self, seq: u64, epoch: u64, deflate: bool) -> (Box<[u8]>, bool) {
        let payload = &self.plain[self.header_len..];
        let mut out = Vec::with_capacity(payload.len() + 40);
        if seq == 1 {
            let begins = super::numbered::position(epoch, 0, super::numbered::Why::New);
            super::encode_message(&mut out, true, begins.as_bytes());
        }
        let numbered = super::numbered::prefixed(seq, payload);
        let deflated = match deflate
            .then(|| compressed_frame(self.text, &numbered))
            .flatten()
        {
            Some(frame) => {
                out.extend_from_slice(&frame);
                true
            }
            None => {
                super::encode_message(&mut out, self.text, &numbered);
                false
            }
        };
        (out.into_boxed_slice(), deflated)
    }

    fn compress(&self) -> Option<Box<[u8]>> {
        compressed_frame(self.text, &self.plain[self.header_len..]).map(Vec::into_boxed_slice)
    }
}

/// A message's frame compressed (RSV1 set), if its payload is at least
/// [`WS_DEFLATE_MIN_BYTES`] and the frame comes out smaller than the plain one.
fn compressed_frame(text: bool, payload: &[u8]) -> Option<Vec<u8>> {
    if payload.len() < WS_DEFLATE_MIN_BYTES {
        return None;
    }
    let compressed = deflate(payload)?;
    let header = FrameHeader {
        is_final: true,
        rsv1: true,
        opcode: OpCode::Data(if text { Data::Text } else { Data::Binary }),
        ..FrameHeader::default()
    };
    let mut out = Vec::with_capacity(compressed.len() + 10);
    // Writing into a Vec cannot fail.
    let _ = header.format(compressed.len() as u64, &mut out);
    out.extend_from_slice(&compressed);
    let plain_len = payload.len() + FrameHeader::default().len(payload.len() as u64);
    (out.len() < plain_len).then_some(out)
}

/// Appends a message for one session: compressed if it negotiated permessage-deflate
/// (`deflate`) and it is worth it (as [`OutFrame::for_session`]), else plain.
/// Returns whether it went compressed.
pub fn encode_message(
    out: &mut Vec<u8>,
    text: bool,
    payload: &[u8],
    deflate: Option<Negotiated>,
) -> bool {
    match deflate.and_then(|_| compressed_frame(text, payload)) {
        Some(frame) => {
            out.extend_from_slice(&frame);
            true
        }
        None => {
            super::encode_message(out, text, payload);
            false
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn offers_are_accepted_or_declined_by_their_parameters() {
        let ok = |v: &str| offered([v.as_bytes()]).is_some();
        assert!(ok("permessage-deflate"));
        assert!(ok("permessage-deflate; client_max_window_bits"));
        assert!(ok(
            "Permessage-Deflate; client_max_window_bits=10; server_no_context_takeover"
        ));
        assert!(ok(
            "permessage-deflate; server_max_window_bits=15; client_no_context_takeover"
        ));
        assert!(ok("x-webkit-deflate-frame, permessage-deflate"));
        let plain = offered([&b"permessage-deflate"[..]]).unwrap();
        assert_eq!(plain.response(), RESPONSE);
        let full = offered([&b"permessage-deflate; server_max_window_bits=15"[..]]).unwrap();
        assert_eq!(
            full.response(),
            format!("{RESPONSE}; server_max_window_bits=15")
        );
        // Declined: a window under the node's own 32 KiB (it would send long messages plain).
        for bits in 8..15 {
            let offer = format!("permessage-deflate; server_max_window_bits={bits}");
            assert!(!ok(&offer), "{offer}");
        }
        // Declined: a window without its value, a bad value, a repeat, an unknown parameter.
        assert!(!ok("permessage-deflate; server_max_window_bits"));
        assert!(!ok("permessage-deflate; server_max_window_bits=7"));
        assert!(!ok("permessage-deflate; server_max_window_bits=16"));
        assert!(!ok("permessage-deflate; client_max_window_bits=16"));
        assert!(!ok("permessage-deflate; client_max_window_bits=08"));
        assert!(!ok(
            "permessage-deflate; server_no_context_takeover; server_no_context_takeover"
        ));
        assert!(!ok("permessage-deflate; mystery"));
        assert!(!ok("permessage-deflate; server_no_context_takeover=1"));
        assert!(!ok("x-webkit-deflate-frame"));
        // A declined offer before an acceptable one: the second is taken.
        let second = offered([
            &b"permessage-deflate; server_max_window_bits=8, permessage-deflate; client_max_window_bits"[..],
        ]);
        assert_eq!(second.map(|n| n.window_asked), Some(false));
        assert!(offered([&b"foo"[..], &b"permessage-deflate"[..]]).is_some());
    }

    #[test]
    fn a_message_round_trips_and_the_tail_is_left_out() {
        let text = "{\"t\":\"set\",\"u\":[[1,1,2,3]]} ".repeat(50);
        let compressed = deflate(text.as_bytes()).unwrap();
        assert!(compressed.len() < text.len() / 5, "{}", compressed.len());
        assert!(!compressed.ends_with(&TAIL));
        let back = inflate(&compressed, 1 << 20).unwrap();
        assert_eq!(back, text.as_bytes());
        // The empty message (RFC 7692, 7.2.3.6) and a large incompressible one.
        assert_eq!(inflate(&deflate(b"").unwrap(), 10).unwrap(), b"");
        let noise: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        assert_eq!(inflate(&deflate(&noise).unwrap(), 1 << 20).unwrap(), noise);
    }

    /// Data like a bitmap's: runs, repeats and noise, in a mix that changes along it.
    fn structured(len: usize, seed: u32) -> Vec<u8> {
        let mut x = seed;
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            let run = (x >> 20) as usize % 300;
            match x >> 30 {
                0 => out.extend(std::iter::repeat_n((x >> 8) as u8, run)),
                1 if out.len() > 1000 => {
                    let from = out.len() - 1 - (x >> 10) as usize % 1000;
                    for k in 0..run {
                        out.push(out[from + k % (out.len() - from)]);
                    }
                }
                _ => out.extend((0..run).map(|k| (x >> (k % 24)) as u8)),
            }
        }
        out.truncate(len);
        out
    }

    #[test]
    fn each_side_agrees_with_flate2s_own_streams() {
        use std::io::{Read, Write};
        for (len, seed) in [
            (65_536, 1),
            (131_072, 2),
            (40_000, 3),
            (200_000, 4),
            (1, 5),
            (777, 6),
        ] {
            let data = structured(len, seed);
            // Ours compressed, flate2's reader decompressing.
            let mut ours = deflate(&data).unwrap();
            ours.extend_from_slice(&TAIL);
            let mut back = Vec::new();
            flate2::read::DeflateDecoder::new(&ours[..])
                .read_to_end(&mut back)
                .unwrap_or_default();
            assert!(back == data, "{len} bytes: {} back", back.len());
            // flate2's writer compressing (another level, in pieces), ours decompressing.
            let mut w = flate2::write::DeflateEncoder::new(Vec::new(), Compression::default());
            for piece in data.chunks(1000) {
                w.write_all(piece).unwrap();
            }
            w.flush().unwrap();
            let mut theirs = w.get_ref().clone();
            assert!(theirs.ends_with(&TAIL));
            theirs.truncate(theirs.len() - TAIL.len());
            assert!(inflate(&theirs, 1 << 20).unwrap() == data, "{len} bytes");
        }
    }

    #[test]
    fn rfc_7692_examples_decompress() {
        // 7.2.3.1: "Hello" compressed.
        let hello = [0xf2, 0x48, 0xcd, 0xc9, 0xc9, 0x07, 0x00];
        assert_eq!(inflate(&hello, 100).unwrap(), b"Hello");
        // 7.2.3.3: "Hello" in a block with no compression.
        let stored = [
            0x00, 0x05, 0x00, 0xfa, 0xff, 0x48, 0x65, 0x6c, 0x6c, 0x6f, 0x00,
        ];
        assert_eq!(inflate(&stored, 100).unwrap(), b"Hello");
    }

    #[test]
    fn a_bomb_stops_at_the_limit_and_garbage_fails() {
        let zeros = vec![0u8; 10 << 20];
        let bomb = deflate(&zeros).unwrap();
        assert!(bomb.len() < (10 << 20) / 100, "{}", bomb.len());
        assert_eq!(inflate(&bomb, 1 << 20), Err(WsError::TooBig));
        assert_eq!(inflate(&bomb, 10 << 20).unwrap().len(), 10 << 20);
        assert_eq!(
            inflate(&[0xff, 0xff, 0xff, 0xff], 100),
            Err(WsError::BadDeflate)
        );
    }

    #[test]
    fn a_frame_is_compressed_once_and_only_when_it_pays() {
        let big = "{\"t\":\"page\",\"bits\":\"".to_string() + &"0".repeat(1024) + "\"}";
        let f = OutFrame::message(true, big.as_bytes());
        let (plain, deflated) = f.for_session(Framing::Plain);
        assert!(!deflated);
        assert_eq!(plain, f.plain());
        let on = Framing::of(offered([&b"permessage-deflate"[..]]), false);
        let (bytes, deflated) = f.for_session(on);
        assert!(deflated && bytes.len() < 100, "{}", bytes.len());
        assert_eq!(bytes[0], 0xc1, "FIN, RSV1, text");
        let again = f.for_session(on).0.as_ptr();
        assert_eq!(again, bytes.as_ptr(), "made once");
        // Longer than any window under 15 bits: still compressed (no offer of one is taken).
        let window_15 = offered([&b"permessage-deflate; server_max_window_bits=15"[..]]);
        let window_15 = Framing::of(window_15, false);
        assert_eq!(f.for_session(window_15).0.as_ptr(), bytes.as_ptr());
        // A payload under the threshold goes plain to everyone.
        let small = OutFrame::message(true, b"{\"t\":\"set\"}");
        assert_eq!(small.for_session(on), (small.plain(), false));
    }

    #[test]
    fn a_numbered_session_gets_each_message_with_its_number() {
        let text = |b: &[u8]| String::from_utf8(b[2..].to_vec()).unwrap();
        let deflate = offered([&b"permessage-deflate"[..]]);
        let numbered = Framing::of(deflate, true);
        let sent = OutFrame::logged(true, b"{\"a\":1}", 42, 9);
        let (bytes, deflated) = sent.for_session(numbered);
        assert!(!deflated);
        assert_eq!(bytes[0], 0x81, "FIN, text");
        assert_eq!(text(bytes), "42|{\"a\":1}");
        assert_eq!(
            sent.for_session(numbered).0.as_ptr(),
            bytes.as_ptr(),
            "made once"
        );
        assert_eq!(
            sent.for_session(Framing::Plain).0,
            sent.plain(),
            "others as they were"
        );
        // A message to the session alone, and the first of a log after its position.
        let alone = OutFrame::message(false, b"x");
        let (bytes, _) = alone.for_session(numbered);
        assert_eq!((bytes[0], &bytes[2..]), (0x82, &b"|x"[..]));
        let first = OutFrame::logged(true, b"y", 1, 9);
        let (bytes, _) = first.for_session(numbered);
        let position = b"!9.0|new";
        assert_eq!(&bytes[2..2 + position.len()], position);
        assert_eq!(text(&bytes[2 + position.len()..]), "1|y");
        // A long one is compressed, number and all, where deflate was negotiated (once for
        // every such session), and plain for one without it.
        let long = format!("{{\"u\":\"{}\"}}", "ab".repeat(400));
        let sent = OutFrame::logged(true, long.as_bytes(), 7, 9);
        let (bytes, deflated) = sent.for_session(numbered);
        assert!(deflated && bytes.len() < long.len() / 4, "{}", bytes.len());
        assert_eq!(bytes[0], 0xC1, "FIN, RSV1, text");
        let body = &bytes[2..];
        let inflated = inflate(body, 1 << 20).unwrap();
        assert_eq!(String::from_utf8(inflated).unwrap(), format!("7|{long}"));
        let (plain, deflated) = sent.for_session(Framing::of(None, true));
        assert!(!deflated);
        // A 16-bit length: 126 and two bytes.
        assert_eq!((plain[0], plain[1]), (0x81, 126));
        assert_eq!(
            String::from_utf8(plain[4..].to_vec()).unwrap(),
            format!("7|{long}")
        );
        // The node's own frames go as they are.
        let node = OutFrame::node(vec![0x81, 1, b'z'], (9, 3));
        assert_eq!(node.for_session(numbered).0, &[0x81, 1, b'z']);
        assert_eq!(
            (node.place(), first.place(), alone.place()),
            (Some((9, 3)), Some((9, 1)), None)
        );
    }
}
