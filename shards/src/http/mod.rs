//! HTTP/1.1 framing (RFC 9112): parsing a request head (httparse) into what the connection
//! loop needs, and writing responses. Pure functions over byte slices; the connection loop
//! (`conn`) owns the socket.

use combd_kernel::limits::{HEADER_COUNT_MAX, HEADER_SECTION_MAX_BYTES, URL_MAX_BYTES};

mod date;
mod fields;
mod response;

pub(crate) use date::civil_date;
pub use date::{http_date, HttpDate};
pub use fields::valid_host;
use fields::{content_length, split_target, target_ok};
pub use response::{carries_body, push_decimal, reason, write_response, Reserved, Response};

/// What the connection loop learns from a complete request head. Owned scalars only, so the
/// read buffer may grow while the body arrives; handlers re-borrow the head with [`Request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// Length of the head in bytes, including the blank line.
    pub len: usize,
    /// Length of the body (`Content-Length`, else 0).
    pub body_len: u64,
    /// Whether the connection stays open after this request.
    pub keep_alive: bool,
    /// Whether the client sent `Expect: 100-continue`.
    pub expect_continue: bool,
    /// Whether this is a WebSocket upgrade request (`Upgrade: websocket`).
    pub upgrade_websocket: bool,
    /// Whether the request is HTTP/1.1 (else HTTP/1.0).
    pub http11: bool,
}

/// A request head that cannot be served: the status and the message for the JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadError {
    /// HTTP status to answer with.
    pub status: u16,
    /// Human-readable reason, sent as `{"error": ...}`.
    pub message: &'static str,
}

/// Outcome of looking for a request head at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A complete head.
    Complete(Head),
    /// More bytes are needed.
    Partial,
}

pub(super) fn bad(message: &'static str) -> HeadError {
    HeadError {
        status: 400,
        message,
    }
}

fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Outcome of parsing the request at the start of a buffer with [`parse_request`].
#[derive(Debug)]
pub enum ParsedRequest<'a> {
    /// More bytes are needed for the head.
    Partial,
    /// The head is complete but its body is not all here yet.
    Head(Head),
    /// The head and its whole body are here: the request, borrowed from the buffer.
    Complete(Head, Request<'a>),
}

/// Parses the head at the start of `buf`. The body limit is checked by the caller, which
/// knows the setting; the head limits ([`HEADER_SECTION_MAX_BYTES`], [`HEADER_COUNT_MAX`])
/// are checked here.
pub fn parse_head(buf: &[u8]) -> Result<Parsed, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; HEADER_COUNT_MAX];
    Ok(match parse_request(buf, &mut headers)? {
        ParsedRequest::Partial => Parsed::Partial,
        ParsedRequest::Head(head) | ParsedRequest::Complete(head, _) => Parsed::Complete(head),
    })
}

/// Parses the request at the start of `buf` once: its head (as [`parse_head`] does) and, when
/// the whole body is here too, the request handlers see, borrowing `headers`.
pub fn parse_request<'a>(
    buf: &'a [u8],
    headers: &'a mut [httparse::Header<'a>],
) -> Result<ParsedRequest<'a>, HeadError> {
    let mut req = httparse::Request::new(headers);
    let Some(len) = head_len(req.parse(buf), buf.len())? else {
        return Ok(ParsedRequest::Partial);
    };
    let Some(target) = req.path else {
        return Err(bad("malformed request"));
    };
    check_target(target)?;
    let http11 = req.version == Some(1);
    let f = read_fields(req.headers, http11)?;
    let head = Head {
        len,
        body_len: f.body_len.unwrap_or(0),
        keep_alive: if http11 {
            !f.close
        } else {
            f.keep_alive_token && !f.close
        },
        expect_continue: f.expect_continue,
        upgrade_websocket: f.upgrade_websocket,
        http11,
    };
    let end = (len as u64).saturating_add(head.body_len);
    if (buf.len() as u64) < end {
        return Ok(ParsedRequest::Head(head));
    }
    let (path, query) = split_target(target);
    let request = Request {
        method: req.method.unwrap_or_default(),
        path,
        query,
        headers: req.headers,
        body: &buf[len..end as usize],
    };
    Ok(ParsedRequest::Complete(head, request))
}

/// The head's length once it is whole (`None`: not yet, with `buffered` bytes of it), or why
/// it is refused: too large (431), too many fields (431), or malformed (400).
fn head_len(parsed: httparse::Result<usize>, buffered: usize) -> Result<Option<usize>, HeadError> {
    const TOO_LARGE: HeadError = HeadError {
        status: 431,
        message: "request header section too large",
    };
    match parsed {
        Ok(httparse::Status::Complete(len)) if len > HEADER_SECTION_MAX_BYTES => Err(TOO_LARGE),
        Ok(httparse::Status::Complete(len)) => Ok(Some(len)),
        Ok(httparse::Status::Partial) if buffered > HEADER_SECTION_MAX_BYTES => Err(TOO_LARGE),
        Ok(httparse::Status::Partial) => Ok(None),
        Err(httparse::Error::TooManyHeaders) => Err(HeadError {
            status: 431,
            message: "too many header fields",
        }),
        Err(_) => Err(bad("malformed request")),
    }
}

/// A request target the node takes: at most `URL_MAX_BYTES` (else 414), and one that
/// [`target_ok`] accepts (else 400).
fn check_target(target: &str) -> Result<(), HeadError> {
    if target.len() > URL_MAX_BYTES {
        return Err(HeadError {
            status: 414,
            message: "request target too long",
        });
    }
    if !target_ok(target) {
        return Err(bad("invalid request target"));
    }
    Ok(())
}

/// What the header fields of a request say about its framing and connection.
#[derive(Default)]
struct Fields {
    body_len: Option<u64>,
    close: bool,
    keep_alive_token: bool,
    expect_continue: bool,
    upgrade_websocket: bool,
}

/// Reads the header fields that frame the request: one consistent `Content-Length`, one
/// valid `Host` (required in HTTP/1.1), no `Transfer-Encoding`, `Connection`, `Expect` and
/// `Upgrade`.
fn read_fields(headers: &[httparse::Header<'_>], http11: bool) -> Result<Fields, HeadError> {
    let mut f = Fields::default();
    let mut hosts = 0;
    for h in headers {
        let name = h.name;
        if name.eq_ignore_ascii_case("content-length") {
            let n = content_length(h.value)?;
            if f.body_len.is_some_and(|b| b != n) {
                return Err(bad("conflicting content-length headers"));
            }
            f.body_len = Some(n);
        } else if name.eq_ignore_ascii_case("host") {
            // RFC 9112, 3.2: one Host, valid.
            hosts += 1;
            if hosts > 1 {
                return Err(bad("more than one host header"));
            }
            if !valid_host(h.value) {
                return Err(bad("invalid host header"));
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(bad(
                "transfer-encoding is not supported: send the body with content-length",
            ));
        } else if name.eq_ignore_ascii_case("connection") {
            f.close |= has_token(h.value, "close");
            f.keep_alive_token |= has_token(h.value, "keep-alive");
        } else if name.eq_ignore_ascii_case("expect") {
            if !has_token(h.value, "100-continue") {
                return Err(HeadError {
                    status: 417,
                    message: "unsupported expectation",
                });
            }
            // An HTTP/1.0 client cannot take a 100 (RFC 9110, 10.1.1): ignored.
            f.expect_continue = http11;
        } else if name.eq_ignore_ascii_case("upgrade") {
            f.upgrade_websocket |= has_token(h.value, "websocket");
        }
    }
    if http11 && hosts == 0 {
        return Err(bad("missing host header"));
    }
    Ok(f)
}

/// A complete request as handlers see it, borrowed from the connection's buffer.
#[derive(Debug)]
pub struct Request<'a> {
    /// The method, e.g. `GET`.
    pub method: &'a str,
    /// The path, without the query.
    pub path: &'a str,
    /// The query string after `?`, if any.
    pub query: Option<&'a str>,
    /// The header fields.
    pub headers: &'a [httparse::Header<'a>],
    /// The body (`Content-Length` bytes).
    pub body: &'a [u8],
}

impl Request<'_> {
    /// The first header with this name (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .map(|h| h.value)
    }

    /// The request target as it came: the path, and `?` and the query if there is one.
    pub fn target(&self) -> String {
        match self.query {
            Some(q) => format!("{}?{q}", self.path),
            None => self.path.to_string(),
        }
    }
}

/// Re-borrows a head that [`parse_head`] accepted, once its body is here. `headers` is the
/// caller's array.
pub fn borrow_request<'a>(
    buf: &'a [u8],
    head: &Head,
    headers: &'a mut [httparse::Header<'a>; HEADER_COUNT_MAX],
) -> Option<Request<'a>> {
    let end = head.len.checked_add(usize::try_from(head.body_len).ok()?)?;
    match parse_request(buf.get(..end)?, headers) {
        Ok(ParsedRequest::Complete(_, req)) => Some(req),
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<Parsed, HeadError> {
        parse_head(text.as_bytes())
    }

    #[test]
    fn keep_alive_rules() {
        let Ok(Parsed::Complete(h)) = head("GET / HTTP/1.1\r\nHost: x\r\n\r\n") else {
            panic!()
        };
        assert!(h.keep_alive);
        let Ok(Parsed::Complete(h)) =
            head("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        else {
            panic!()
        };
        assert!(!h.keep_alive);
        let Ok(Parsed::Complete(h)) = head("GET / HTTP/1.0\r\n\r\n") else {
            panic!()
        };
        assert!(!h.keep_alive);
        let Ok(Parsed::Complete(h)) = head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
        else {
            panic!()
        };
        assert!(h.keep_alive);
    }

    #[test]
    fn bodies_need_content_length() {
        let Ok(Parsed::Complete(h)) =
            head("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        else {
            panic!()
        };
        assert_eq!((h.len, h.body_len), (47, 5));
        assert_eq!(
            head("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            head("POST / HTTP/1.1\r\nContent-Length: x\r\n\r\n")
                .unwrap_err()
                .status,
            400
        );
        assert_eq!(
            head("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n")
                .unwrap_err()
                .status,
            400
        );
    }

    #[test]
    fn head_limits() {
        assert_eq!(head("GET / HTTP/1.1\r\nHost: x\r\n"), Ok(Parsed::Partial));
        let big = format!(
            "GET / HTTP/1.1\r\nX: {}\r\n",
            "a".repeat(HEADER_SECTION_MAX_BYTES)
        );
        assert_eq!(parse_head(big.as_bytes()).unwrap_err().status, 431);
        let mut many = String::from("GET / HTTP/1.1\r\n");
        for i in 0..HEADER_COUNT_MAX + 1 {
            many.push_str(&format!("X-{i}: y\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(parse_head(many.as_bytes()).unwrap_err().status, 431);
        let mut exactly = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
        for i in 0..HEADER_COUNT_MAX - 1 {
            exactly.push_str(&format!("X-{i}: y\r\n"));
        }
        exactly.push_str("\r\n");
        assert!(matches!(
            parse_head(exactly.as_bytes()),
            Ok(Parsed::Complete(_))
        ));
        assert_eq!(head("GARBAGE\r\n\r\n").unwrap_err().status, 400);
    }

    #[test]
    fn request_borrow_splits_query_and_body() {
        let buf = b"POST /o/echo/a?x=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi".to_vec();
        let Ok(Parsed::Complete(h)) = parse_head(&buf) else {
            panic!()
        };
        let mut hs = [httparse::EMPTY_HEADER; HEADER_COUNT_MAX];
        let r = borrow_request(&buf, &h, &mut hs).unwrap();
        assert_eq!(
            (r.method, r.path, r.query, r.body),
            ("POST", "/o/echo/a", Some("x=1"), &b"hi"[..])
        );
        assert_eq!(r.header("content-length"), Some(&b"2"[..]));
    }

    #[test]
    fn one_parse_gives_the_request_once_its_body_is_here() {
        let full = b"POST /o/a/b?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabcGET";
        let mut headers = [httparse::EMPTY_HEADER; HEADER_COUNT_MAX];
        match parse_request(&full[..full.len() - 4], &mut headers).unwrap() {
            ParsedRequest::Head(h) => assert_eq!(h.body_len, 3),
            other => panic!("expected only the head: {other:?}"),
        }
        let mut headers = [httparse::EMPTY_HEADER; HEADER_COUNT_MAX];
        match parse_request(full, &mut headers).unwrap() {
            ParsedRequest::Complete(h, req) => {
                assert_eq!(h.len + 3, full.len() - 3);
                assert_eq!(
                    (req.method, req.path, req.query),
                    ("POST", "/o/a/b", Some("x=1"))
                );
                assert_eq!(req.body, b"abc");
            }
            other => panic!("expected the request: {other:?}"),
        }
        let mut headers = [httparse::EMPTY_HEADER; HEADER_COUNT_MAX];
        assert!(matches!(
            parse_request(b"GET / HTTP/1.1\r\nHo", &mut headers),
            Ok(ParsedRequest::Partial)
        ));
    }

    fn status(text: &str) -> u16 {
        match head(text) {
            Ok(_) => 200,
            Err(e) => e.status,
        }
    }

    #[test]
    fn content_length_is_digits_only() {
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n"),
            200
        );
        for bad in [
            "+5",
            "-5",
            "5 5",
            "0x5",
            "5,5",
            "",
            "99999999999999999999999",
        ] {
            let req = format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {bad}\r\n\r\n");
            assert_eq!(status(&req), 400, "{bad:?}");
        }
        assert_eq!(
            status("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: +5\r\n\r\n"),
            400
        );
    }

    #[test]
    fn host_is_required_once_and_valid() {
        assert_eq!(status("GET / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n"), 400);
        assert_eq!(status("GET / HTTP/1.0\r\n\r\n"), 200);
        for ok in [
            "example.com",
            "example.com:8080",
            "127.0.0.2:80",
            "[::1]:8080",
            "[::1]",
            "",
            "a%20b",
            "x:",
        ] {
            assert!(valid_host(ok.as_bytes()), "{ok:?}");
        }
        for bad in [
            "a b", "a/b", "a@b", "[::1", "[::1]x", "a:b", "a:80:80", "a%2", "é",
        ] {
            assert!(!valid_host(bad.as_bytes()), "{bad:?}");
        }
    }

    #[test]
    fn expect_100_continue_only_for_http_1_1() {
        let h = |v: &str| match head(&format!(
            "POST / HTTP/{v}\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n"
        )) {
            Ok(Parsed::Complete(h)) => h.expect_continue,
            other => panic!("{other:?}"),
        };
        assert!(h("1.1"));
        assert!(!h("1.0"));
    }
}
