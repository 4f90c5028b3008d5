//! The script of the `http_conn` fuzz target: what a few clients do to the node, decoded from
//! any bytes. Pure (no I/O): [`decode`] turns the fuzzer's input into [`Op`]s, [`Item::write`]
//! turns each request item into the bytes a client sends. The harness that plays a script on
//! real sockets is [`super::conn`].
//!
//! Every input decodes to a script (unknown opcodes wrap around, a truncated operation ends
//! it), so a mutation never wastes a run on a parse error. Sizes are drawn from four scales
//! ([`size`]) so a few bits reach the bounds that matter: a connection's floor (4 KiB), the
//! read scratch (64 KiB), the body limit the harness sets and past it.

/// Clients one script may have open at once.
pub const CONNS_MAX: usize = 8;
/// Operations one script may have: more are ignored (keeps one run under a second).
pub const OPS_MAX: usize = 96;
/// Bytes one script may queue on all its clients together: items past it are dropped.
pub const QUEUED_MAX_BYTES: usize = 2 << 20;
/// How long a read may wait for its first byte, by the top two bits of its argument: not at
/// all, a moment, or as long as a busy object of the grammar takes to answer.
pub const READ_WAITS_MS: [u16; 4] = [0, 0, 10, 200];

/// One thing a client does.
// Each variant's doc says what its fields are.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A new client from `127.0.1.<from % 250 + 1>`; `small_rcvbuf`: its receive buffer is
    /// the kernel's smallest, so a client that does not read stops taking the node's writes
    /// after a few KiB (the peer that stops reading).
    Open { from: u8, small_rcvbuf: bool },
    /// Appends an item's bytes `times` times to what the client has to send (a pipelined
    /// burst).
    Queue { conn: u8, item: Item, times: u16 },
    /// Writes up to `bytes` of what the client has to send (`None`: all of it), as much as
    /// the socket takes without blocking: partial requests, split heads and bodies.
    Send { conn: u8, bytes: Option<usize> },
    /// Reads up to `bytes` of what the node sent, waiting up to `wait_ms` (one of
    /// [`READ_WAITS_MS`]) for the first: a client that waits for an answer (a busy object's).
    Read {
        conn: u8,
        bytes: usize,
        wait_ms: u16,
    },
    /// Closes the client (with unread input: a reset).
    Close { conn: u8 },
    /// Closes the client's write side (half close); it may still read.
    ShutdownWrite { conn: u8 },
}

/// What a client sends: a request from a small grammar, or a WebSocket frame.
// Each variant's doc says what its fields are.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// `GET /million/` (the page, ~9 KiB).
    GetPage,
    /// `HEAD /million/`.
    HeadPage,
    /// `GET /healthz`.
    Health,
    /// `POST /o/counter/x` with body `1`.
    CounterAdd,
    /// `GET /o/counter/x`.
    CounterGet,
    /// `POST /o/echo/e` declaring `len` bytes of body and sending `sent` of them (fewer: a
    /// body never finished); `expect`: with `Expect: 100-continue`.
    Echo {
        len: usize,
        sent: usize,
        expect: bool,
    },
    /// `POST /o/hold/h<ms>?ms=<ms>` (busy for that long: input waits behind it) with `len`
    /// bytes; one object for each `ms`.
    Hold { ms: u8, len: usize },
    /// `GET /healthz` with `Connection: close`.
    CloseRequest,
    /// A POST with `Transfer-Encoding: chunked` (refused: 400).
    Chunked,
    /// A GET with one header of `len` bytes (past the header section limit at the top).
    BigHeader { len: usize },
    /// A WebSocket upgrade: to `/o/echo/w` (`to` 0), `/o/hold/h100` (1: the object
    /// `Hold { ms: 100 }` keeps busy) or `/o/million/b?page=0` (2).
    Upgrade { to: u8 },
    /// A masked client frame with `len` payload bytes.
    Frame { opcode: u8, fin: bool, len: usize },
    /// A frame header announcing `len` bytes, none of them sent.
    FrameClaim { len: u64 },
    /// Bytes taken from the input as they are.
    Raw(Vec<u8>),
}

/// Reads the input front to back; every read past its end ends the script.
struct Cursor<'a> {
    data: &'a [u8],
}

impl Cursor<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.data.split_first()?;
        self.data = rest;
        Some(b)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes([self.byte()?, self.byte()?]))
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let n = n.min(self.data.len());
        let (taken, rest) = self.data.split_at(n);
        self.data = rest;
        taken.to_vec()
    }
}

/// A size from 16 bits: the top two pick the scale (up to 255 B, 4 KiB, 64 KiB, 256 KiB).
pub fn size(n: u16) -> usize {
    let low = usize::from(n & 0x3fff);
    match n >> 14 {
        0 => low & 0xff,
        1 => low & 0xfff,
        2 => low * 4,
        _ => low * 16,
    }
}

/// The script an input stands for.
pub fn decode(data: &[u8]) -> Vec<Op> {
    let mut c = Cursor { data };
    let mut ops = Vec::new();
    while ops.len() < OPS_MAX {
        let Some(op) = decode_op(&mut c) else { break };
        ops.push(op);
    }
    ops
}

fn decode_op(c: &mut Cursor<'_>) -> Option<Op> {
    let code = c.byte()?;
    Some(match code % 8 {
        0 => Op::Open {
            from: c.byte()?,
            small_rcvbuf: code & 0x80 != 0,
        },
        1 => Op::Queue {
            conn: c.byte()?,
            item: decode_item(c)?,
            times: 1,
        },
        2 => Op::Queue {
            conn: c.byte()?,
            times: u16::from(c.byte()?) + 1,
            item: decode_item(c)?,
        },
        3 | 4 => {
            let conn = c.byte()?;
            let b = c.byte()?;
            Op::Send {
                conn,
                bytes: (b != 0).then(|| 1 << (b % 18)),
            }
        }
        5 => {
            let conn = c.byte()?;
            let b = c.byte()?;
            Op::Read {
                conn,
                bytes: 1 << (b % 18),
                wait_ms: READ_WAITS_MS[usize::from(b >> 6)],
            }
        }
        6 => Op::Close { conn: c.byte()? },
        _ => Op::ShutdownWrite { conn: c.byte()? },
    })
}

fn decode_item(c: &mut Cursor<'_>) -> Option<Item> {
    let kind = c.byte()?;
    Some(match kind % 16 {
        0 => Item::GetPage,
        1 => Item::HeadPage,
        2 => Item::Health,
        3 => Item::CounterAdd,
        4 => Item::CounterGet,
        5 | 6 => {
            let len = size(c.u16()?);
            // Mostly whole bodies; one in four is cut short by a fraction the next byte picks.
            let cut = c.byte()?;
            let sent = if cut & 3 == 0 {
                len * usize::from(cut >> 2) / 64
            } else {
                len
            };
            Item::Echo {
                len,
                sent,
                expect: kind % 16 == 6,
            }
        }
        7 => Item::Hold {
            ms: c.byte()? % 101,
            len: size(c.u16()?),
        },
        8 => Item::CloseRequest,
        9 => Item::Chunked,
        10 => Item::BigHeader {
            len: size(c.u16()?),
        },
        11 => Item::Upgrade {
            to: (kind >> 6) % 3,
        },
        12 => {
            let b = c.byte()?;
            // Text, binary, continuation, close, ping, pong, and a reserved opcode.
            let opcode = [0x1, 0x2, 0x0, 0x8, 0x9, 0xa, 0x3][usize::from(b & 0x7) % 7];
            Item::Frame {
                opcode,
                fin: b & 0x80 != 0,
                len: size(c.u16()?),
            }
        }
        13 => Item::FrameClaim {
            len: u64::from(c.u16()?) << (c.byte()? % 48),
        },
        _ => {
            let n = usize::from(c.byte()?);
            Item::Raw(c.bytes(n))
        }
    })
}

impl Item {
    /// Appends the bytes a client sends for this item.
    pub fn write(&self, out: &mut Vec<u8>) {
        let h = "Host: fuzz\r\n";
        match self {
            Item::GetPage => push(out, format!("GET /million/ HTTP/1.1\r\n{h}\r\n")),
            Item::HeadPage => push(out, format!("HEAD /million/ HTTP/1.1\r\n{h}\r\n")),
            Item::Health => push(out, format!("GET /healthz HTTP/1.1\r\n{h}\r\n")),
            Item::CounterAdd => push(
                out,
                format!("POST /o/counter/x HTTP/1.1\r\n{h}Content-Length: 1\r\n\r\n1"),
            ),
            Item::CounterGet => push(out, format!("GET /o/counter/x HTTP/1.1\r\n{h}\r\n")),
            Item::Echo { len, sent, expect } => {
                let expect = if *expect {
                    "Expect: 100-continue\r\n"
                } else {
                    ""
                };
                push(
                    out,
                    format!("POST /o/echo/e HTTP/1.1\r\n{h}{expect}Content-Length: {len}\r\n\r\n"),
                );
                out.resize(out.len() + (*sent).min(*len), b'e');
            }
            Item::Hold { ms, len } => {
                push(
                    out,
                    format!(
                        "POST /o/hold/h{ms}?ms={ms} HTTP/1.1\r\n{h}Content-Length: {len}\r\n\r\n"
                    ),
                );
                out.resize(out.len() + len, b'h');
            }
            Item::CloseRequest => push(
                out,
                format!("GET /healthz HTTP/1.1\r\n{h}Connection: close\r\n\r\n"),
            ),
            Item::Chunked => push(
                out,
                format!(
                    "POST /o/echo/c HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                ),
            ),
            Item::BigHeader { len } => {
                push(out, format!("GET /healthz HTTP/1.1\r\n{h}X-Big: "));
                out.resize(out.len() + len, b'b');
                push(out, "\r\n\r\n".to_string());
            }
            Item::Upgrade { to } => {
                let path = ["/o/echo/w", "/o/hold/h100", "/o/million/b?page=0"][usize::from(*to % 3)];
                push(
                    out,
                    format!(
                        "GET {path} HTTP/1.1\r\n{h}Upgrade: websocket\r\nConnection: Upgrade\r\n\
                         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
                    ),
                );
            }
            Item::Frame { opcode, fin, len } => {
                frame_header(out, *opcode, *fin, *len as u64);
                // Mask 0: the payload goes as is. Text payloads stay valid UTF-8.
                out.resize(out.len() + len, b'f');
            }
            Item::FrameClaim { len } => frame_header(out, 0x2, true, *len),
            Item::Raw(bytes) => out.extend_from_slice(bytes),
        }
    }
}

fn push(out: &mut Vec<u8>, s: String) {
    out.extend_from_slice(s.as_bytes());
}

/// A masked client frame's header (mask key 0) announcing `len` payload bytes.
fn frame_header(out: &mut Vec<u8>, opcode: u8, fin: bool, len: u64) {
    out.push(if fin { 0x80 } else { 0 } | opcode);
    match len {
        0..=125 => out.push(0x80 | len as u8),
        126..=0xffff => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(0x80 | 127);
            out.extend_from_slice(&len.to_be_bytes());
        }
    }
    out.extend_from_slice(&[0, 0, 0, 0]);
}

/// Encodes a script back into an input that decodes to it (for seeds written in Rust: the
/// corpus generator and the tests).
pub fn encode(ops: &[Op]) -> Vec<u8> {
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Open { from, small_rcvbuf } => {
                out.extend_from_slice(&[if *small_rcvbuf { 0x80 } else { 0 }, *from]);
            }
            Op::Queue { conn, item, times } => {
                match times {
                    0 | 1 => out.extend_from_slice(&[1, *conn]),
                    n => out.extend_from_slice(&[2, *conn, ((*n).min(256) - 1) as u8]),
                }
                encode_item(&mut out, item);
            }
            Op::Send { conn, bytes } => {
                // 1 << (b % 18): b = 18 for one byte, since 0 means all.
                let b = bytes.map_or(0, |n| match n.max(1).ilog2().min(17) as u8 {
                    0 => 18,
                    k => k,
                });
                out.extend_from_slice(&[3, *conn, b]);
            }
            Op::Read {
                conn,
                bytes,
                wait_ms,
            } => {
                let k = (*bytes).max(1).ilog2().min(17) as u8;
                // The first byte whose shift and wait are these (each quarter of the bytes
                // holds every shift).
                let b = (0..=255u8)
                    .find(|b| b % 18 == k && READ_WAITS_MS[usize::from(b >> 6)] >= *wait_ms)
                    .unwrap_or(k);
                out.extend_from_slice(&[5, *conn, b]);
            }
            Op::Close { conn } => out.extend_from_slice(&[6, *conn]),
            Op::ShutdownWrite { conn } => out.extend_from_slice(&[7, *conn]),
        }
    }
    out
}

/// The 16 bits [`size`] turns into the smallest scale that holds `len` (rounded down).
fn size_code(len: usize) -> u16 {
    match len {
        0..=0xff => len as u16,
        0x100..=0xfff => (1 << 14) | len as u16,
        0x1000..=0xffff => (2 << 14) | (len / 4) as u16,
        _ => (3 << 14) | (len / 16).min(0x3fff) as u16,
    }
}

fn encode_item(out: &mut Vec<u8>, item: &Item) {
    let u16s = |out: &mut Vec<u8>, n: u16| out.extend_from_slice(&n.to_be_bytes());
    match item {
        Item::GetPage => out.push(0),
        Item::HeadPage => out.push(1),
        Item::Health => out.push(2),
        Item::CounterAdd => out.push(3),
        Item::CounterGet => out.push(4),
        Item::Echo { len, sent, expect } => {
            out.push(if *expect { 6 } else { 5 });
            u16s(out, size_code(*len));
            let cut = if sent < len && *len > 0 {
                ((sent * 64 / len).min(63) as u8) << 2
            } else {
                1
            };
            out.push(cut);
        }
        Item::Hold { ms, len } => {
            out.extend_from_slice(&[7, *ms]);
            u16s(out, size_code(*len));
        }
        Item::CloseRequest => out.push(8),
        Item::Chunked => out.push(9),
        Item::BigHeader { len } => {
            out.push(10);
            u16s(out, size_code(*len));
        }
        Item::Upgrade { to } => out.push(11 | (to % 3) << 6),
        Item::Frame { opcode, fin, len } => {
            out.push(12);
            let i = [0x1, 0x2, 0x0, 0x8, 0x9, 0xa, 0x3]
                .iter()
                .position(|o| o == opcode)
                .unwrap_or(0) as u8;
            out.push(i | if *fin { 0x80 } else { 0 });
            u16s(out, size_code(*len));
        }
        Item::FrameClaim { len } => {
            out.push(13);
            // len = n << shift with n in 16 bits (rounded down to what that holds).
            let shift = (64 - len.leading_zeros()).saturating_sub(16).min(47);
            u16s(out, (len >> shift) as u16);
            out.push(shift as u8);
        }
        Item::Raw(bytes) => {
            out.push(14);
            let n = bytes.len().min(255);
            out.push(n as u8);
            out.extend_from_slice(&bytes[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_reach_each_scale_and_encode_back() {
        assert_eq!(size(0x00ff), 255);
        assert_eq!(size(0x4fff), 4095);
        assert_eq!(size(0xbfff), 0x3fff * 4);
        assert_eq!(size(0xffff), 0x3fff * 16);
        for len in [
            0,
            1,
            255,
            256,
            4095,
            4096,
            65532,
            65536,
            96 * 1024,
            0x3fff * 16,
        ] {
            assert_eq!(size(size_code(len)), len, "{len}");
        }
    }

    #[test]
    fn every_op_encodes_to_bytes_that_decode_to_it() {
        let ops = vec![
            Op::Open {
                from: 7,
                small_rcvbuf: true,
            },
            Op::Queue {
                conn: 0,
                item: Item::Echo {
                    len: 4096,
                    sent: 2048,
                    expect: true,
                },
                times: 1,
            },
            Op::Queue {
                conn: 1,
                item: Item::GetPage,
                times: 256,
            },
            Op::Queue {
                conn: 0,
                item: Item::Frame {
                    opcode: 0x9,
                    fin: true,
                    len: 125,
                },
                times: 3,
            },
            Op::Queue {
                conn: 0,
                item: Item::FrameClaim { len: 1 << 40 },
                times: 1,
            },
            Op::Queue {
                conn: 0,
                item: Item::Raw(b"GET / HTTP/1.1\r\n".to_vec()),
                times: 1,
            },
            Op::Send {
                conn: 0,
                bytes: Some(1),
            },
            Op::Send {
                conn: 0,
                bytes: Some(1 << 17),
            },
            Op::Send {
                conn: 2,
                bytes: None,
            },
            Op::Read {
                conn: 0,
                bytes: 1,
                wait_ms: 10,
            },
            Op::Read {
                conn: 0,
                bytes: 1 << 17,
                wait_ms: 200,
            },
            Op::Read {
                conn: 0,
                bytes: 512,
                wait_ms: 0,
            },
            Op::ShutdownWrite { conn: 3 },
            Op::Close { conn: 1 },
        ];
        assert_eq!(decode(&encode(&ops)), ops);
    }

    #[test]
    fn any_bytes_decode_to_a_bounded_script() {
        assert!(decode(&[]).is_empty());
        // Truncated operations end the script.
        assert!(decode(&[1, 0]).is_empty());
        let ops = decode(&[0u8; 10_000]);
        assert_eq!(ops.len(), OPS_MAX);
        let mut items = Vec::new();
        for op in decode(&(0..=255u8).cycle().take(4096).collect::<Vec<_>>()) {
            if let Op::Queue { item, .. } = op {
                item.write(&mut items);
            }
        }
        assert!(!items.is_empty());
    }
}
