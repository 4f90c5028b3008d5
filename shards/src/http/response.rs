//! Responses: what a handler returns, and how it is written (RFC 9112, 4 and 6), without
//! `fmt` (a per-request cost the profile showed).

use std::borrow::Cow;
use std::sync::Arc;

use crate::fair::Share;

use super::HttpDate;

/// A response a handler returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The content type of the body (an app's answer may choose its own: checked before it
    /// is written, `app::check_app_response`).
    pub content_type: Cow<'static, str>,
    /// Extra header fields.
    pub headers: Vec<(&'static str, String)>,
    /// The body: borrowed when it is static (an app's page is shared, not copied per
    /// response; it is copied once, into the connection's write buffer).
    pub body: Cow<'static, [u8]>,
    /// The bytes of the node's answer pool it holds until it is written (an object's answer:
    /// see [`Reserved`]); none for a response the node makes itself.
    pub reserved: Reserved,
}

/// An object's answer's bytes, reserved in the node's answer pool (`crate::fair`,
/// `answer_bytes`) for the client that asked, from when the answer is made until its
/// connection has written it: what lets a client that reads nothing hold no more than its
/// share of answers. Equal to any other (a response is its status, fields and body).
#[derive(Clone, Default)]
pub struct Reserved(Option<Arc<Share>>);

impl Reserved {
    /// The answer's reservation.
    pub fn new(share: Share) -> Reserved {
        Reserved(Some(Arc::new(share)))
    }

    /// Bytes it holds.
    pub fn bytes(&self) -> u64 {
        self.0.as_ref().map_or(0, |s| s.units())
    }
}

impl std::fmt::Debug for Reserved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Reserved({})", self.bytes())
    }
}

impl PartialEq for Reserved {
    fn eq(&self, _: &Reserved) -> bool {
        true
    }
}

impl Eq for Reserved {}

impl Response {
    /// A JSON response.
    pub fn json(status: u16, value: &serde_json::Value) -> Response {
        Response {
            status,
            content_type: Cow::Borrowed("application/json"),
            headers: Vec::new(),
            body: Cow::Owned(value.to_string().into_bytes()),
            reserved: Reserved::default(),
        }
    }

    /// `{"error": message}` with the status.
    pub fn error(status: u16, message: &str) -> Response {
        Response::json(status, &serde_json::json!({ "error": message }))
    }

    /// `503 {"error":"overloaded"}` with `retry-after: 1`: the node's one answer to a request
    /// it turns away for load, which may pass a second later.
    pub fn overloaded() -> Response {
        Response::error(503, "overloaded").with_header("retry-after", "1")
    }

    /// A response with a body of the given type.
    pub fn bytes(
        status: u16,
        content_type: impl Into<Cow<'static, str>>,
        body: impl Into<Cow<'static, [u8]>>,
    ) -> Response {
        Response {
            status,
            content_type: content_type.into(),
            headers: Vec::new(),
            body: body.into(),
            reserved: Reserved::default(),
        }
    }

    /// The response, its bytes held by `share` until it is written.
    pub fn reserved_by(self, share: Share) -> Response {
        Response {
            reserved: Reserved::new(share),
            ..self
        }
    }

    /// Adds a header field.
    pub fn with_header(mut self, name: &'static str, value: impl Into<String>) -> Response {
        self.headers.push((name, value.into()));
        self
    }
}

/// Whether `status` may answer a request with a body, as every response the node writes has
/// one (and a `content-length`): 200 to 599 but 204 and 304 (RFC 9110, 15; a body on a 1xx,
/// 204 or 304 would be read by the client as the start of the next response).
pub fn carries_body(status: u16) -> bool {
    (200..=599).contains(&status) && status != 204 && status != 304
}

/// The reason phrase of a status code.
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        204 => "No Content",
        302 => "Found",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Content Too Large",
        414 => "URI Too Long",
        417 => "Expectation Failed",
        426 => "Upgrade Required",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        507 => "Insufficient Storage",
        _ => "",
    }
}

/// The status line of a status code, e.g. `HTTP/1.1 200 OK\r\n`, without formatting.
fn status_line(out: &mut Vec<u8>, status: u16) {
    let line: &[u8] = match status {
        200 => b"HTTP/1.1 200 OK\r\n",
        101 => b"HTTP/1.1 101 Switching Protocols\r\n",
        404 => b"HTTP/1.1 404 Not Found\r\n",
        503 => b"HTTP/1.1 503 Service Unavailable\r\n",
        _ => {
            out.extend_from_slice(b"HTTP/1.1 ");
            push_decimal(out, u64::from(status));
            out.push(b' ');
            out.extend_from_slice(reason(status).as_bytes());
            out.extend_from_slice(b"\r\n");
            return;
        }
    };
    out.extend_from_slice(line);
}

/// Appends `n` in decimal.
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Appends a response to `out`, with `date` (see [`http_date`]). `keep_alive == false` adds
/// `connection: close`; a `HEAD` request gets the headers without the body, and a 204 has
/// neither body nor length. Written piece by
/// piece, without `fmt` (a per-request cost the profile showed).
pub fn write_response(
    out: &mut Vec<u8>,
    resp: &Response,
    keep_alive: bool,
    head_only: bool,
    date: &HttpDate,
) {
    let extra: usize = resp
        .headers
        .iter()
        .map(|(n, v)| n.len() + v.len() + 4)
        .sum();
    out.reserve(160 + extra + if head_only { 0 } else { resp.body.len() });
    // A 204 (or a 1xx) has no content, and no content-length (RFC 9110, 8.6): one there would
    // say the client is owed a body, even of 0 bytes.
    let content = resp.status >= 200 && resp.status != 204;
    status_line(out, resp.status);
    out.extend_from_slice(b"content-type: ");
    out.extend_from_slice(resp.content_type.as_bytes());
    if content {
        out.extend_from_slice(b"\r\ncontent-length: ");
        push_decimal(out, resp.body.len() as u64);
    }
    out.extend_from_slice(b"\r\ndate: ");
    out.extend_from_slice(date);
    out.extend_from_slice(b"\r\n");
    let mut closing = !keep_alive;
    for (name, value) in &resp.headers {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        if closing && *name == "connection" {
            // One `connection` field: the response's own options, then `close`.
            out.extend_from_slice(b", close");
            closing = false;
        }
        out.extend_from_slice(b"\r\n");
    }
    if closing {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if !head_only && content {
        out.extend_from_slice(&resp.body);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::http_date;
    use super::*;

    #[test]
    fn response_framing() {
        let mut out = Vec::new();
        let date = http_date(784_111_777);
        write_response(
            &mut out,
            &Response::error(404, "not found"),
            false,
            false,
            &date,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("HTTP/1.1 404 Not Found\r\n"));
        assert!(text.contains("date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"));
        assert!(text.contains("content-length: 21\r\n"));
        assert!(text.contains("connection: close\r\n"));
        assert!(text.ends_with("\r\n\r\n{\"error\":\"not found\"}"));
        let mut out = Vec::new();
        let upgrade = Response::error(426, "x").with_header("connection", "upgrade");
        write_response(&mut out, &upgrade, false, false, &http_date(0));
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches("connection").count(), 1, "{text}");
        assert!(text.contains("connection: upgrade, close\r\n"), "{text}");
    }

    #[test]
    fn status_lines_and_lengths_without_fmt() {
        for status in [
            100u16, 101, 200, 204, 302, 308, 400, 404, 405, 408, 413, 414, 417, 426, 431, 500, 503,
            507, 299,
        ] {
            let mut out = Vec::new();
            status_line(&mut out, status);
            assert_eq!(
                out,
                format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes()
            );
        }
        for n in [0u64, 7, 10, 15, 999, 1_000_000, u64::MAX] {
            let mut out = Vec::new();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
        let mut out = Vec::new();
        let resp = Response::bytes(200, "text/plain", b"hi".to_vec()).with_header("x-a", "b");
        write_response(&mut out, &resp, true, true, &http_date(0));
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\
             date: Thu, 01 Jan 1970 00:00:00 GMT\r\nx-a: b\r\n\r\n"
        );
    }

    /// What a module that answers nothing gets (found by the `host_imports` fuzz target: a
    /// `content-length: 0` on every 204).
    #[test]
    fn a_204_has_no_content_length_and_no_body() {
        for head_only in [false, true] {
            let mut out = Vec::new();
            let resp = Response::bytes(204, "application/json", b"ignored".to_vec());
            write_response(&mut out, &resp, true, head_only, &http_date(0));
            assert_eq!(
                String::from_utf8(out).unwrap(),
                "HTTP/1.1 204 No Content\r\ncontent-type: application/json\r\n\
                 date: Thu, 01 Jan 1970 00:00:00 GMT\r\n\r\n"
            );
        }
    }
}
