//! One access-log line: a JSON object on one line, written straight into the shard's chunk
//! (no allocation, no intermediate string). Pure: the caller gives the time and every value.
//!
//! Every line starts with `ts` (RFC 3339, UTC, milliseconds), `shard`, `peer` and `kind`;
//! the fields of its kind follow (see the README's "Access log" for each kind's). Text that
//! comes from a client (a method, a path) is cut to its bound first and written as a JSON
//! string: `"` and `\` escaped, control characters as `\u00XX`, bytes that are not UTF-8 as
//! U+FFFD. No line is longer than [`ACCESS_LOG_LINE_MAX_BYTES`].

use std::io::Write as _;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[cfg(test)]
use combd_kernel::limits::ACCESS_LOG_LINE_MAX_BYTES;

use crate::http::civil_date;

/// What a line records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// An HTTP request and its response.
    Http,
    /// A WebSocket upgrade answered with 101.
    WsOpen,
    /// A WebSocket's end.
    WsClose,
}

impl Event {
    fn as_str(self) -> &'static str {
        match self {
            Event::Http => "http",
            Event::WsOpen => "ws_open",
            Event::WsClose => "ws_close",
        }
    }
}

/// A line being written at the end of `out`; [`LogLine::end`] closes it.
pub(crate) struct LogLine<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> LogLine<'a> {
    /// Starts a line with its common fields.
    pub fn begin(
        out: &'a mut Vec<u8>,
        now: SystemTime,
        shard: usize,
        peer: SocketAddr,
        kind: Event,
    ) -> LogLine<'a> {
        out.extend_from_slice(b"{\"ts\":\"");
        push_timestamp(out, now);
        let _ = write!(out, "\",\"shard\":{shard},\"peer\":\"{peer}\",\"kind\":\"");
        out.extend_from_slice(kind.as_str().as_bytes());
        out.push(b'"');
        LogLine { out }
    }

    /// A text field from a client: its first `max` bytes as a JSON string, or `null` when
    /// there is none.
    pub fn text(mut self, name: &str, value: Option<&[u8]>, max: usize) -> LogLine<'a> {
        self.name(name);
        match value {
            Some(v) => {
                self.out.push(b'"');
                push_escaped(self.out, &v[..v.len().min(max)]);
                self.out.push(b'"');
            }
            None => self.out.extend_from_slice(b"null"),
        }
        self
    }

    /// A fixed word of the node's own (no escaping needed).
    pub fn word(mut self, name: &str, value: &'static str) -> LogLine<'a> {
        self.name(name);
        self.out.push(b'"');
        push_escaped(self.out, value.as_bytes());
        self.out.push(b'"');
        self
    }

    /// A whole number.
    pub fn number(mut self, name: &str, value: u64) -> LogLine<'a> {
        self.name(name);
        let _ = write!(self.out, "{value}");
        self
    }

    /// A duration, as `ms` in milliseconds with three decimals (microseconds).
    pub fn ms(mut self, took: Duration) -> LogLine<'a> {
        self.name("ms");
        let _ = write!(
            self.out,
            "{}.{:03}",
            took.as_millis(),
            took.subsec_micros() % 1000
        );
        self
    }

    /// Ends the line: `}` and a newline.
    pub fn end(self) {
        self.out.extend_from_slice(b"}\n");
    }

    fn name(&mut self, name: &str) {
        self.out.extend_from_slice(b",\"");
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
    }
}

/// `2026-10-22T14:03:07.123Z`.
fn push_timestamp(out: &mut Vec<u8>, now: SystemTime) {
    let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (year, month, day) = civil_date(secs / 86_400);
    let s = secs % 86_400;
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        s / 3600,
        s / 60 % 60,
        s % 60,
        since.subsec_millis()
    );
}

/// `bytes` as the inside of a JSON string: UTF-8 kept, `"` `\` and control characters
/// escaped, each run of bytes that is not UTF-8 as U+FFFD. Six bytes out for one in at most.
fn push_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.extend_from_slice(b"\\\""),
                '\\' => out.extend_from_slice(b"\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        if !chunk.invalid().is_empty() {
            out.extend_from_slice(b"\\ufffd");
        }
    }
}

/// The method and the path of the request line at the start of `raw` (a request the node
/// answers before, or instead of, parsing it: a malformed one, one too large): each `None`
/// when it is not there. Empty lines before it are skipped; the method is a token followed by
/// a space; the path runs to a space, a `?` (the query is never logged) or a line's end.
pub(crate) fn request_line(raw: &[u8]) -> (Option<&[u8]>, Option<&[u8]>) {
    // Empty lines before a request line are allowed, and skipped (RFC 9112, 2.2).
    let blank = raw
        .iter()
        .take_while(|b| matches!(b, b'\r' | b'\n'))
        .count();
    let raw = &raw[blank..];
    let tchar = |b: &u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b);
    let Some(sp) = raw.iter().position(|b| !tchar(b)) else {
        return (None, None);
    };
    if sp == 0 || raw[sp] != b' ' {
        return (None, None);
    }
    let target = &raw[sp + 1..];
    let end = target
        .iter()
        .position(|b| matches!(b, b' ' | b'?' | b'\r' | b'\n'))
        .unwrap_or(target.len());
    let path = (end > 0).then(|| &target[..end]);
    (Some(&raw[..sp]), path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use combd_kernel::limits::{
        ACCESS_LOG_FIELDS_MAX_BYTES, ACCESS_LOG_METHOD_MAX_BYTES, ACCESS_LOG_PATH_MAX_BYTES,
    };

    fn at(unix_ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(unix_ms)
    }

    fn peer() -> SocketAddr {
        "127.0.0.2:40000".parse().unwrap()
    }

    #[test]
    fn an_http_line_is_one_json_object() {
        let mut out = Vec::new();
        LogLine::begin(&mut out, at(1_792_677_787_123), 1, peer(), Event::Http)
            .text("method", Some(b"POST"), ACCESS_LOG_METHOD_MAX_BYTES)
            .text("path", Some(b"/o/echo/a"), ACCESS_LOG_PATH_MAX_BYTES)
            .number("status", 200)
            .ms(Duration::from_micros(12_345))
            .end();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "{\"ts\":\"2026-10-22T14:03:07.123Z\",\"shard\":1,\"peer\":\"127.0.0.2:40000\",\
             \"kind\":\"http\",\"method\":\"POST\",\"path\":\"/o/echo/a\",\"status\":200,\
             \"ms\":12.345}\n"
        );
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["ms"], 12.345);
    }

    #[test]
    fn client_text_is_escaped_cut_and_may_be_null() {
        let mut out = Vec::new();
        LogLine::begin(&mut out, at(0), 0, peer(), Event::WsOpen)
            .text("path", Some(b"/a\"b\\c\x01\xffd\xc3\xbc"), 64)
            .text("method", None, 16)
            .text("cut", Some(b"abcdef"), 3)
            .end();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["ts"], "1970-01-01T00:00:00.000Z");
        assert_eq!(v["path"], "/a\"b\\c\u{1}\u{fffd}d\u{fc}");
        assert_eq!(v["method"], serde_json::Value::Null);
        assert_eq!(v["cut"], "abc");
        assert_eq!(out.iter().filter(|&&b| b == b'\n').count(), 1);
    }

    /// The longest line there can be: every client byte escaped to six, the widest address
    /// and numbers. It fits the bound a chunk keeps free for a line.
    #[test]
    fn the_longest_line_fits_its_bound() {
        let peer: SocketAddr = "[ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff%4294967295]:65535"
            .parse()
            .unwrap();
        fn fields(out: &mut Vec<u8>, peer: SocketAddr) -> LogLine<'_> {
            LogLine::begin(
                out,
                at(u64::MAX / 2_000_000),
                usize::MAX,
                peer,
                Event::WsClose,
            )
            .number("code", u64::MAX)
            .word("by", "client")
            .word("reason", "missed messages: reconnect")
            .number("status", u64::MAX)
            .number("bytes_in", u64::MAX)
            .number("bytes_out", u64::MAX)
            .number("messages_in", u64::MAX)
            .number("messages_out", u64::MAX)
            .ms(Duration::MAX)
        }
        let mut out = Vec::new();
        fields(&mut out, peer).end();
        assert!(
            out.len() + "\"method\":\"\",\"path\":\"\",".len() <= ACCESS_LOG_FIELDS_MAX_BYTES,
            "{} bytes",
            out.len()
        );
        let mut out = Vec::new();
        let junk = [0x01u8; 10_000];
        fields(&mut out, peer)
            .text("method", Some(&junk), ACCESS_LOG_METHOD_MAX_BYTES)
            .text("path", Some(&junk), ACCESS_LOG_PATH_MAX_BYTES)
            .end();
        assert!(
            out.len() <= ACCESS_LOG_LINE_MAX_BYTES,
            "{} bytes",
            out.len()
        );
        serde_json::from_slice::<serde_json::Value>(&out).unwrap();
    }

    #[test]
    fn a_raw_request_line_gives_its_method_and_path_never_its_query() {
        let line = |raw: &'static [u8]| request_line(raw);
        let s = |b: &'static [u8]| Some(b);
        assert_eq!(
            line(b"GET /o/a/b?token=secret HTTP/1.1\r\n"),
            (s(b"GET"), s(b"/o/a/b"))
        );
        assert_eq!(line(b"POST /x HTTP/1.1\r\n"), (s(b"POST"), s(b"/x")));
        assert_eq!(line(b"\r\n\r\nPUT /y HTTP/1.1\r\n"), (s(b"PUT"), s(b"/y")));
        assert_eq!(line(b"GET /partial"), (s(b"GET"), s(b"/partial")));
        assert_eq!(line(b"GET "), (s(b"GET"), None));
        assert_eq!(line(b"GET"), (None, None));
        assert_eq!(line(b""), (None, None));
        assert_eq!(line(b"\x16\x03\x01\x02\x00"), (None, None), "a TLS hello");
        assert_eq!(line(b" /x HTTP/1.1"), (None, None));
    }
}
