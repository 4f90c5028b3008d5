//! Passing an HTTP request on to an object's owner over the shard's own io_uring sockets (as
//! the WebSocket pass-through does), so forwards wait on the network without holding a
//! blocking thread, many at once, each within [`FLEET_FORWARD_TIMEOUT`] (the connect within
//! [`FLEET_CONNECT_TIMEOUT`](combd_kernel::limits::FLEET_CONNECT_TIMEOUT); the one try of an
//! owner that made a request wait in vain a moment ago within
//! [`FLEET_PROBE_CONNECT_TIMEOUT`](combd_kernel::limits::FLEET_PROBE_CONNECT_TIMEOUT)). One
//! connection per request (`connection: close`): on the fleet's network a connect is well under a millisecond, and nothing is kept open for an owner that
//! may be gone by the next request.
//!
//! The owner is untrusted input like any peer: its header section is parsed by `httparse`
//! within the node's own request bounds ([`HEADER_SECTION_MAX_BYTES`], [`HEADER_COUNT_MAX`]),
//! its body must say its length (a combd node always does) and be at most the caller's bound.

use std::net::SocketAddr;
use std::time::Duration;

use combd_fleet::auth::{FleetKey, AUTH_HEADER};
use combd_fleet::forward::{Forwarded, CLIENT_HEADER, FORWARDED_HEADER};
use combd_fleet::Failure;
use combd_kernel::limits::{FLEET_FORWARD_TIMEOUT, HEADER_COUNT_MAX, HEADER_SECTION_MAX_BYTES};
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;

/// Sends `method target` with `body` to the node at `owner` (`ip:port`), signed with `key`,
/// connected within `connect_within`; its answer, with at most `max_body` bytes of body.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn forward(
    key: &FleetKey,
    owner: &str,
    method: &str,
    target: &str,
    body: &[u8],
    token: Option<&str>,
    caller: &crate::app::Caller,
    (connect_within, max_body): (Duration, u64),
) -> Result<Forwarded, Failure> {
    within(
        FLEET_FORWARD_TIMEOUT,
        exchange(
            key,
            owner,
            method,
            target,
            body,
            token,
            caller,
            (connect_within, max_body),
        ),
    )
    .await
}

/// `work`, or [`Failure::Timeout`] once `limit` has passed.
async fn within<T>(
    limit: Duration,
    work: impl std::future::Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    futures_lite::future::or(work, async {
        glommio::timer::Timer::new(limit).await;
        Err(Failure::Timeout)
    })
    .await
}

/// What an I/O error on the way means: the time ran out, or the owner is not there.
fn io_failure(e: std::io::Error) -> Failure {
    match e.kind() {
        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => Failure::Timeout,
        _ => Failure::Unreachable(format!("io: {e}")),
    }
}

#[allow(clippy::too_many_arguments)]
async fn exchange(
    key: &FleetKey,
    owner: &str,
    method: &str,
    target: &str,
    body: &[u8],
    token: Option<&str>,
    caller: &crate::app::Caller,
    (connect_within, max_body): (Duration, u64),
) -> Result<Forwarded, Failure> {
    let addr: SocketAddr = owner
        .parse()
        .map_err(|_| Failure::BadAnswer(format!("{owner:?} is not an address")))?;
    let mut stream = TcpStream::connect_timeout(addr, connect_within)
        .await
        .map_err(|e| match e {
            glommio::GlommioError::TimedOut(_) => Failure::Timeout,
            e => io_failure(e.into()),
        })?;
    let _ = stream.set_nodelay(true);
    let (client, fields) = told(token, caller);
    // The MAC covers the fields sent beside the client's address (`forward::covered`).
    let signed = combd_fleet::forward::covered(&client, field_lines(&fields));
    let signature = key.sign_for(owner, method, target, &signed, body);
    let mut request = format!(
        "{method} {target} HTTP/1.1\r\nhost: {owner}\r\n{FORWARDED_HEADER}: 1\r\n\
         {AUTH_HEADER}: {signature}\r\n{fields}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body);
    stream.write_all(&request).await.map_err(io_failure)?;
    stream.flush().await.map_err(io_failure)?;
    let answer = read_answer(&mut stream, max_body).await?;
    signed_for(key, &signature, answer)
}

/// What a request passed on tells the owner of its client: its address (the
/// [`CLIENT_HEADER`] value, which the signature covers on its own), and its header fields:
/// the client's token, for the owner to verify again (the owner trusts no identity a peer
/// asserts, only a token its own key verifies), its `Origin` and the fields the app declared
/// (each checked as a header value when it was read), as `name: value\r\n` lines with the
/// [`CLIENT_HEADER`] line.
fn told(token: Option<&str>, caller: &crate::app::Caller) -> (String, String) {
    // Not the fields this request frames or carries itself (a second `host`, a
    // `content-length` or an `expect` would change what the owner reads).
    const OWN: &[&str] = &[
        "authorization",
        "origin",
        "host",
        "content-length",
        "transfer-encoding",
        "expect",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "proxy-connection",
    ];
    let mut fields = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let client = caller.addr.map_or(String::new(), |a| a.to_string());
    if !client.is_empty() {
        fields.push_str(&format!("{CLIENT_HEADER}: {client}\r\n"));
    }
    if let Some(origin) = &caller.origin {
        fields.push_str(&format!("origin: {origin}\r\n"));
    }
    for (name, value) in &caller.headers {
        if !OWN.iter().any(|o| name.eq_ignore_ascii_case(o)) {
            fields.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    (client, fields)
}

/// `answer` if the owner signed it for the request it sent with `signature`: one changed on
/// the way, or from a node without the key, is not passed on.
fn signed_for(key: &FleetKey, signature: &str, answer: Forwarded) -> Result<Forwarded, Failure> {
    let a = &answer;
    let signed = a.signature.as_deref();
    if !key.check_answer(signed, signature, a.status, &a.signed_fields, &a.body) {
        return Err(Failure::BadAnswer(
            "an answer the fleet key did not sign".into(),
        ));
    }
    Ok(answer)
}

/// Whether the node passing an owner's answer on keeps the field `name` (and the answer's MAC
/// covers it): `retry-after`, `allow`, and the fields an app's answer may carry.
pub(crate) fn kept_in_answer(name: &str) -> bool {
    name.eq_ignore_ascii_case("retry-after")
        || name.eq_ignore_ascii_case("allow")
        || crate::app::app_response_header(name).is_some()
}

/// The `name: value` lines of a header section this node wrote, as (name, value).
fn field_lines(fields: &str) -> impl Iterator<Item = (&str, &[u8])> {
    fields
        .split("\r\n")
        .filter_map(|l| l.split_once(": "))
        .map(|(n, v)| (n, v.as_bytes()))
}

/// The owner's answer on `stream`: the header section, then the body its `content-length`
/// says.
async fn read_answer(stream: &mut TcpStream, max_body: u64) -> Result<Forwarded, Failure> {
    let bad = |m: &str| Failure::BadAnswer(m.to_string());
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let (mut answer, length, head_len) = loop {
        let n = stream.read(&mut chunk).await.map_err(io_failure)?;
        if n == 0 {
            return Err(Failure::Unreachable(
                "the owner closed the connection before answering".into(),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; HEADER_COUNT_MAX];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(head_len)) => {
                let (answer, length) = answer_head(&resp)?;
                break (answer, length, head_len);
            }
            Ok(httparse::Status::Partial) if buf.len() <= HEADER_SECTION_MAX_BYTES => {}
            Ok(httparse::Status::Partial) => return Err(bad("a header section past its bound")),
            Err(e) => return Err(Failure::BadAnswer(format!("not HTTP: {e}"))),
        }
    };
    if length > max_body {
        return Err(Failure::TooLarge { limit: max_body });
    }
    let mut body = buf.split_off(head_len);
    if body.len() as u64 > length {
        return Err(bad("more bytes than its content-length"));
    }
    body.reserve_exact(length as usize - body.len());
    while (body.len() as u64) < length {
        let want = (length - body.len() as u64).min(chunk.len() as u64) as usize;
        let n = stream.read(&mut chunk[..want]).await.map_err(io_failure)?;
        if n == 0 {
            return Err(bad("an answer cut short"));
        }
        body.extend_from_slice(&chunk[..n]);
    }
    answer.body = body;
    Ok(answer)
}

/// What an owner's answer says in its header section (its body still to read), and its
/// `content-length`.
fn answer_head(resp: &httparse::Response<'_, '_>) -> Result<(Forwarded, u64), Failure> {
    let bad = |m: &str| Failure::BadAnswer(m.to_string());
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case(name))
            .and_then(|h| std::str::from_utf8(h.value).ok())
            .map(str::to_string)
    };
    if header("transfer-encoding").is_some() {
        return Err(bad("a chunked answer (a node always sends its length)"));
    }
    let length: u64 = header("content-length")
        .ok_or_else(|| bad("an answer without content-length"))?
        .trim()
        .parse()
        .map_err(|_| bad("a content-length that is not a number"))?;
    let signed_fields = combd_fleet::forward::answer_fields(
        header("content-type").as_deref(),
        resp.headers
            .iter()
            .filter_map(|h| Some((h.name, std::str::from_utf8(h.value).ok()?))),
        kept_in_answer,
    );
    let answer = Forwarded {
        status: resp.code.ok_or_else(|| bad("no status"))?,
        content_type: header("content-type"),
        retry_after: header("retry-after"),
        allow: header("allow"),
        // The fields an app's answer may carry (the node checks them again).
        headers: resp
            .headers
            .iter()
            .filter(|h| crate::app::app_response_header(h.name).is_some())
            .filter_map(|h| {
                let v = std::str::from_utf8(h.value).ok()?;
                Some((h.name.to_string(), v.to_string()))
            })
            .take(combd_kernel::limits::APP_HEADERS_MAX)
            .collect(),
        body: Vec::new(),
        signature: header(combd_fleet::auth::ANSWER_HEADER),
        signed_fields,
    };
    Ok((answer, length))
}
