//! WebSocket (RFC 6455) framing: decoding client frames with limits and reassembling
//! fragmented messages; encoding server frames. Frame headers are tungstenite's
//! ([`FrameHeader::parse`] and [`FrameHeader::format`]); the loop around them is ours so that an
//! idle socket holds no buffer: the decoder keeps only a message under reassembly.

use std::io::Cursor;

use combd_kernel::limits::{
    WS_CONTROL_PAYLOAD_MAX_BYTES, WS_INFLATE_RATIO_FLOOR_BYTES, WS_INFLATE_RATIO_MAX,
};
use tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

pub mod deflate;
pub mod mux;
pub mod numbered;
mod utf8;

pub use deflate::OutFrame;

use utf8::Utf8Check;

/// Close codes the node sends.
pub mod close {
    /// Normal closure.
    pub const NORMAL: u16 = 1000;
    /// The node is shutting down.
    pub const GOING_AWAY: u16 = 1001;
    /// The client broke the protocol.
    pub const PROTOCOL: u16 = 1002;
    /// A text message was not valid UTF-8.
    pub const INVALID_DATA: u16 = 1007;
    /// The client broke a policy (its message rate).
    pub const POLICY: u16 = 1008;
    /// A message was larger than `COMBD_WS_MAX_MESSAGE`.
    pub const TOO_BIG: u16 = 1009;
    /// Try again later: the session missed messages (or the node is busy); reconnecting
    /// gets fresh state.
    pub const TRY_AGAIN_LATER: u16 = 1013;
    /// The session's token expired (IANA's registered 3000, "Unauthorized"): reconnect with a
    /// new one.
    pub const UNAUTHORIZED: u16 = 3000;
    /// The object the session was attached to was replaced by a restore (1012, "service
    /// restart"): reconnecting attaches to it as restored.
    pub const RESTARTED: u16 = 1012;
    /// The object the session was attached to was deleted (a private-use code: HTTP's 404
    /// "not found" after 4000). Reconnecting attaches to a new, empty object of the name.
    pub const OBJECT_DELETED: u16 = 4404;
}

/// Why the node closes a WebSocket after decoding: maps to one close code each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WsError {
    /// A protocol violation (close 1002), with what was wrong.
    Protocol(&'static str),
    /// Text that is not UTF-8 (close 1007).
    InvalidUtf8,
    /// A message over the size limit (close 1009), compressed or once decompressed.
    TooBig,
    /// A compressed message that does not decompress (close 1007).
    BadDeflate,
    /// A compressed message that decompresses to more than `WS_INFLATE_RATIO_MAX` times its
    /// compressed size (close 1009: like a message past the size limit, it is a message too
    /// big, here for its size on the wire; a client told so sends smaller messages, or sends
    /// them uncompressed, and a bomb closes with one code whichever bound it passes first).
    Ratio,
    /// A compressed message that decompresses to more than the connection's
    /// `COMBD_WS_INFLATE_RATE` has left (close 1008, a policy, like the message rate: the
    /// message itself is acceptable, the client sends too much too fast).
    InflateRate,
}

impl WsError {
    /// The close code for this error.
    pub fn code(self) -> u16 {
        match self {
            WsError::Protocol(_) => close::PROTOCOL,
            WsError::InvalidUtf8 | WsError::BadDeflate => close::INVALID_DATA,
            WsError::TooBig | WsError::Ratio => close::TOO_BIG,
            WsError::InflateRate => close::POLICY,
        }
    }

    /// The close reason sent with the code.
    pub fn reason(self) -> &'static str {
        match self {
            WsError::Protocol(why) => why,
            WsError::InvalidUtf8 => "invalid utf-8 in text message",
            WsError::TooBig => "message too big",
            WsError::BadDeflate => "invalid compressed message",
            WsError::Ratio => "compressed message decompresses too far",
            WsError::InflateRate => "decompressed bytes rate exceeded",
        }
    }
}

/// One decoded event. Payloads borrow from the read buffer or the reassembly buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum WsEvent<'a> {
    /// A complete text message.
    Text(&'a str),
    /// A complete binary message.
    Binary(&'a [u8]),
    /// A ping with its payload (to be answered with a pong).
    Ping(&'a [u8]),
    /// A pong.
    Pong,
    /// A close frame: its code (if any) and reason.
    Close(Option<u16>, &'a str),
}

/// Decodes client frames, enforcing masking, control-frame rules, UTF-8 and the message size.
#[derive(Debug)]
pub struct Decoder {
    max_message_bytes: u64,
    /// The message under reassembly: whether it is text, and its bytes so far.
    partial: Option<(bool, Vec<u8>)>,
    /// The UTF-8 check of the text message being received, across its fragments. Text is
    /// checked as its bytes arrive, so an invalid message fails at its first invalid byte,
    /// not once it is complete.
    utf8: Utf8Check,
    /// Payload bytes of the incomplete text frame at the start of the buffer already checked.
    checked: usize,
    /// permessage-deflate was negotiated: a message's first frame may set RSV1.
    deflate: bool,
    /// The message being received is compressed (its first frame set RSV1): its text is
    /// checked once decompressed, not as its bytes arrive.
    compressed: bool,
    /// Compressed messages decompressed since [`Decoder::take_inflated`] was last called.
    inflated: u32,
    /// Bytes its compressed messages may still decompress to: what the connection's
    /// `COMBD_WS_INFLATE_RATE` allows ([`Decoder::allow_inflate`]), less what they did.
    inflate_left: u64,
}

/// Whether a received close code may appear on the wire (RFC 6455, 7.4).
pub fn close_code_valid(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

impl Decoder {
    /// A decoder for messages of at most `max_message_bytes`.
    pub fn new(max_message_bytes: u64) -> Decoder {
        Decoder {
            max_message_bytes,
            partial: None,
            utf8: Utf8Check::default(),
            checked: 0,
            deflate: false,
            compressed: false,
            inflated: 0,
            inflate_left: 0,
        }
    }

    /// Lets its compressed messages decompress to `bytes` in all from now on (none until
    /// this is called).
    pub fn allow_inflate(&mut self, bytes: u64) {
        self.inflate_left = bytes;
    }

    /// What is left of [`Decoder::allow_inflate`]'s bytes.
    pub fn inflate_left(&self) -> u64 {
        self.inflate_left
    }

    /// Compressed messages decompressed since the last call (for the shard's stats).
    pub fn take_inflated(&mut self) -> u32 {
        std::mem::take(&mut self.inflated)
    }

    /// The same decoder, for a WebSocket that negotiated permessage-deflate.
    pub fn with_deflate(mut self, deflate: bool) -> Decoder {
        self.deflate = deflate;
        self
    }

    /// Whether a fragmented message is being reassembled (the connection is not idle).
    pub fn in_message(&self) -> bool {
        self.partial.is_some()
    }

    /// Bytes of the message under reassembly held so far.
    pub fn partial_len(&self) -> usize {
        self.partial.as_ref().map_or(0, |(_, b)| b.len())
    }

    /// Decodes the complete frames at the start of `buf` (unmasking them in place), calling
    /// `on` with each event until it returns `false`. Returns how many bytes were consumed;
    /// the rest is an incomplete frame to keep for the next read.
    pub fn decode(
        &mut self,
        buf: &mut [u8],
        mut on: impl FnMut(WsEvent<'_>) -> bool,
    ) -> Result<usize, WsError> {
        let mut pos = 0usize;
        loop {
            let mut cursor = Cursor::new(&buf[pos..]);
            let (header, len) = match FrameHeader::parse(&mut cursor) {
                Ok(Some(h)) => h,
                Ok(None) => return Ok(pos),
                Err(_) => return Err(WsError::Protocol("invalid frame header")),
            };
            let header_len = cursor.position() as usize;
            let mask = self.check_header(&header, len)?;
            // The checks above bound `len` by the message limit or 125.
            let len = len as usize;
            let end = pos + header_len + len;
            let text = self.starts_text(&header);
            if buf.len() < end {
                // An incomplete frame: check the text that has arrived, so invalid text
                // fails now rather than once the whole frame is in.
                if text {
                    self.check_arrived(&buf[pos + header_len..], mask)?;
                }
                return Ok(pos);
            }
            let payload = &mut buf[pos + header_len..end];
            apply_mask(payload, mask);
            pos = end;
            if text {
                let unchecked = &payload[self.checked..];
                self.checked = 0;
                if !self.utf8.bytes(unchecked) || (header.is_final && !self.utf8.complete()) {
                    return Err(WsError::InvalidUtf8);
                }
            }
            let go_on = match header.opcode {
                OpCode::Control(Control::Ping) => on(WsEvent::Ping(payload)),
                OpCode::Control(Control::Pong) => on(WsEvent::Pong),
                OpCode::Control(_) => {
                    on(close_event(payload)?);
                    return Ok(pos);
                }
                OpCode::Data(data) => {
                    self.data(data, header.is_final, header.rsv1, payload, &mut on)?
                }
            };
            if !go_on {
                return Ok(pos);
            }
        }
    }

    /// Checks a frame header (RFC 6455, 5.2 to 5.5) against the message under reassembly and
    /// the size limit; returns its mask.
    fn check_header(&self, header: &FrameHeader, len: u64) -> Result<[u8; 4], WsError> {
        if len > i64::MAX as u64 {
            // The most significant bit of a 64-bit length must be 0.
            return Err(WsError::Protocol("frame length with its top bit set"));
        }
        // RSV1 marks a compressed message, on its first frame only (RFC 7692, 6).
        let first_frame = matches!(header.opcode, OpCode::Data(Data::Text | Data::Binary));
        if (header.rsv1 && !(self.deflate && first_frame)) || header.rsv2 || header.rsv3 {
            return Err(WsError::Protocol("reserved bits set"));
        }
        let Some(mask) = header.mask else {
            return Err(WsError::Protocol("client frames must be masked"));
        };
        match header.opcode {
            OpCode::Control(Control::Reserved(_)) | OpCode::Data(Data::Reserved(_)) => {
                return Err(WsError::Protocol("reserved opcode"))
            }
            OpCode::Control(_) => {
                if !header.is_final {
                    return Err(WsError::Protocol("fragmented control frame"));
                }
                if len > WS_CONTROL_PAYLOAD_MAX_BYTES {
                    return Err(WsError::Protocol("control frame payload over 125 bytes"));
                }
            }
            OpCode::Data(Data::Continue) => {
                let Some((_, so_far)) = &self.partial else {
                    return Err(WsError::Protocol("continuation without a message"));
                };
                if len > self.max_message_bytes.saturating_sub(so_far.len() as u64) {
                    return Err(WsError::TooBig);
                }
            }
            OpCode::Data(_) => {
                if self.partial.is_some() {
                    return Err(WsError::Protocol("new message before the last one ended"));
                }
                if len > self.max_message_bytes {
                    return Err(WsError::TooBig);
                }
            }
        }
        Ok(mask)
    }

    /// Whether a frame carries text (a text frame, or a continuation of a text message); a
    /// new text message starts its UTF-8 check afresh.
    /// A compressed message's text is checked once decompressed, not here.
    fn starts_text(&mut self, header: &FrameHeader) -> bool {
        match header.opcode {
            OpCode::Data(Data::Text) if header.rsv1 => false,
            OpCode::Data(Data::Text) => {
                if self.checked == 0 {
                    self.utf8 = Utf8Check::default();
                }
                true
            }
            OpCode::Data(Data::Continue) => {
                !self.compressed && self.partial.as_ref().is_some_and(|(t, _)| *t)
            }
            _ => false,
        }
    }

    /// Checks the payload bytes of an incomplete text frame that arrived since the last look
    /// (still masked: they are unmasked once the frame is complete).
    fn check_arrived(&mut self, payload: &[u8], mask: [u8; 4]) -> Result<(), WsError> {
        let at = self.checked;
        let arrived = &payload[at..];
        let valid = arrived
            .iter()
            .enumerate()
            .all(|(i, &b)| self.utf8.byte(b ^ mask[(at + i) % 4]));
        if !valid {
            return Err(WsError::InvalidUtf8);
        }
        self.checked += arrived.len();
        Ok(())
    }

    /// A complete data frame: delivered as a message, or added to the one under reassembly.
    /// `rsv1`: the frame is a message's first and compressed.
    fn data(
        &mut self,
        data: Data,
        is_final: bool,
        rsv1: bool,
        payload: &[u8],
        on: &mut impl FnMut(WsEvent<'_>) -> bool,
    ) -> Result<bool, WsError> {
        let text = match data {
            Data::Text => true,
            Data::Binary => false,
            _ => self.partial.as_ref().is_some_and(|(t, _)| *t),
        };
        if matches!(data, Data::Text | Data::Binary) {
            self.compressed = rsv1;
        }
        if is_final && self.partial.is_none() {
            return self.deliver_message(text, payload, on);
        }
        let (_, bytes) = self.partial.get_or_insert_with(|| (text, Vec::new()));
        bytes.extend_from_slice(payload);
        if !is_final {
            return Ok(true);
        }
        let (text, bytes) = self.partial.take().unwrap_or_default();
        self.deliver_message(text, &bytes, on)
    }

    /// Delivers a whole message, decompressed first if it is compressed: within the message
    /// limit, [`WS_INFLATE_RATIO_MAX`] times its compressed size (at least
    /// [`WS_INFLATE_RATIO_FLOOR_BYTES`]) and what is left of its byte rate, the decompressing
    /// stopping as soon as its output passes the least of the three.
    fn deliver_message(
        &mut self,
        text: bool,
        payload: &[u8],
        on: &mut impl FnMut(WsEvent<'_>) -> bool,
    ) -> Result<bool, WsError> {
        if !std::mem::take(&mut self.compressed) {
            return deliver(text, payload, on);
        }
        let by_ratio = (payload.len() as u64)
            .saturating_mul(WS_INFLATE_RATIO_MAX)
            .max(WS_INFLATE_RATIO_FLOOR_BYTES);
        let bound = self.max_message_bytes.min(by_ratio).min(self.inflate_left);
        let plain = deflate::inflate(payload, bound).map_err(|e| match e {
            WsError::TooBig if bound == self.max_message_bytes => WsError::TooBig,
            WsError::TooBig if bound == by_ratio => WsError::Ratio,
            WsError::TooBig => WsError::InflateRate,
            e => e,
        })?;
        self.inflated += 1;
        self.inflate_left -= plain.len() as u64;
        deliver(text, &plain, on)
    }
}

/// The event of a close frame's payload: no code, or a valid code and a UTF-8 reason.
fn close_event(payload: &[u8]) -> Result<WsEvent<'_>, WsError> {
    match payload.len() {
        0 => Ok(WsEvent::Close(None, "")),
        1 => Err(WsError::Protocol("close payload of one byte")),
        _ => {
            let code = u16::from_be_bytes([payload[0], payload[1]]);
            if !close_code_valid(code) {
                return Err(WsError::Protocol("invalid close code"));
            }
            let reason = std::str::from_utf8(&payload[2..]).map_err(|_| WsError::InvalidUtf8)?;
            Ok(WsEvent::Close(Some(code), reason))
        }
    }
}

fn deliver(
    text: bool,
    payload: &[u8],
    on: &mut impl FnMut(WsEvent<'_>) -> bool,
) -> Result<bool, WsError> {
    if text {
        let s = std::str::from_utf8(payload).map_err(|_| WsError::InvalidUtf8)?;
        Ok(on(WsEvent::Text(s)))
    } else {
        Ok(on(WsEvent::Binary(payload)))
    }
}

/// XORs `buf` with the frame's masking key.
pub fn apply_mask(buf: &mut [u8], mask: [u8; 4]) {
    let word = u32::from_ne_bytes(mask);
    let mut chunks = buf.chunks_exact_mut(4);
    for c in &mut chunks {
        let v = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]) ^ word;
        c.copy_from_slice(&v.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= mask[i];
    }
}

/// Appends one unmasked, final server frame.
pub fn encode(out: &mut Vec<u8>, opcode: OpCode, payload: &[u8]) {
    let header = FrameHeader {
        is_final: true,
        opcode,
        ..FrameHeader::default()
    };
    // Writing into a Vec cannot fail.
    let _ = header.format(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

/// Appends a final frame of `opcode` (1 text, 2 binary, 10 pong) masked, as a client sends
/// it (RFC 6455, 5.3): the node's relay of a subscription to another node of its fleet
/// (`conn/relay.rs`).
pub fn encode_masked(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    encode_masked_frame(out, 0x80 | (opcode & 0x0f), payload);
}

/// Appends a frame masked as a client sends it, its first byte (FIN, RSV and opcode) as given:
/// [`encode_masked`]'s, and the tests' fragments and compressed frames. The mask is drawn from
/// a per-thread xorshift seeded by the clock: the two ends are nodes of one fleet (or a test
/// and its node), with no intermediary to confuse.
pub fn encode_masked_frame(out: &mut Vec<u8>, first: u8, payload: &[u8]) {
    thread_local! {
        static SEED: std::cell::Cell<u64> = std::cell::Cell::new(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0x9e37_79b9_7f4a_7c15, |d| d.as_nanos() as u64)
                | 1,
        );
    }
    let mask = SEED.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x as u32).to_be_bytes()
    });
    out.push(first);
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n < 65536 => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
}

/// Appends a text message.
pub fn encode_text(out: &mut Vec<u8>, text: &str) {
    encode(out, OpCode::Data(Data::Text), text.as_bytes());
}

/// Appends a text (`text`) or binary message.
pub fn encode_message(out: &mut Vec<u8>, text: bool, payload: &[u8]) {
    let data = if text { Data::Text } else { Data::Binary };
    encode(out, OpCode::Data(data), payload);
}

/// Appends `{"error": message}` as a text message: how a session learns that an input failed.
pub fn encode_error(out: &mut Vec<u8>, message: &str) {
    encode_text(out, &error_text(message));
}

/// The text of an error message to a session: `{"error": message}`.
pub fn error_text(message: &str) -> String {
    serde_json::json!({ "error": message }).to_string()
}

/// Appends a ping with no payload.
pub fn encode_ping(out: &mut Vec<u8>) {
    encode(out, OpCode::Control(Control::Ping), b"");
}

/// Appends a close frame with a code and a reason (cut to fit a control frame).
pub fn encode_close(out: &mut Vec<u8>, code: Option<u16>, reason: &str) {
    let mut payload = Vec::with_capacity(2 + reason.len());
    if let Some(code) = code {
        payload.extend_from_slice(&code.to_be_bytes());
        let mut cut = reason.len().min(WS_CONTROL_PAYLOAD_MAX_BYTES as usize - 2);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        payload.extend_from_slice(&reason.as_bytes()[..cut]);
    }
    encode(out, OpCode::Control(Control::Close), &payload);
}

/// Appends a pong answering a ping's payload.
pub fn encode_pong(out: &mut Vec<u8>, payload: &[u8]) {
    encode(out, OpCode::Control(Control::Pong), payload);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
