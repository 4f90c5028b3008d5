//! A subscription of a multiplexed WebSocket (`conn/mux.rs`) to an object another node of the
//! fleet owns: carried to the owner as a WebSocket of its own ([`Relay`]). This node opens it
//! as the client would, to `/o/<app>/<name>?<query>` on the owner's fleet address, signed with
//! the fleet key and marked forwarded (the owner never passes it on), with the client's token
//! and address; the owner runs the session (its attach, place, presence). What the owner
//! sends is queued, frame by frame, in the subscription's session here (its socket's one
//! budget, its mailbox, headed with its channel as any subscription's); what the client sends
//! on the channel goes to the owner. The relay answers the owner's pings; it ends when the
//! owner closes or fails (the subscription ends with 1013: its client subscribes again with
//! its place, to whoever owns the object then), and when the subscription ends here (its task
//! is dropped with the subscription, and the owner sees its connection close).

use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll};

use combd_kernel::limits;
use futures_lite::io::AsyncWriteExt;
use futures_lite::{AsyncRead, AsyncWrite, Stream};
use glommio::net::TcpStream;

use crate::cells::session::SessionOut;
use crate::fleet::Fleet;
use crate::state::ShardState;
use crate::ws::OutFrame;

/// Messages from the client to the owner waiting for the relay to write them.
const TO_OWNER_QUEUE: usize = 16;

/// A message of the client's for the owner: whether it is text, and its payload.
type ToOwner = (bool, Vec<u8>);

/// What the relay of a subscription needs to open it on the owner.
pub(super) struct Opening<'a> {
    pub owner: &'a str,
    /// `/o/<app>/<name>[?<query>]`.
    pub target: String,
    /// The client's token, if it has one (the owner verifies it again).
    pub token: Option<&'a str>,
    pub origin: Option<&'a str>,
    /// The client's address, as the fleet vouches for it.
    pub addr: Option<std::net::IpAddr>,
}

/// A subscription carried to its owner: the client's messages go through `to_owner`; the
/// relay's task ends when this is dropped.
pub(super) struct Remote {
    to_owner: async_channel::Sender<ToOwner>,
    _task: glommio::Task<()>,
}

impl Remote {
    /// Sends a message of the client's to the owner; false if the relay cannot take it now.
    pub(super) fn send(&self, text: bool, payload: &[u8]) -> bool {
        self.to_owner.try_send((text, payload.to_vec())).is_ok()
    }
}

/// Opens the subscription's WebSocket on the owner: its stream and what the owner sent after
/// its 101, or why not as a refusal's JSON (the owner's status and error, or 503).
pub(super) async fn open(fleet: &Fleet, o: &Opening<'_>) -> Result<(TcpStream, Vec<u8>), String> {
    let unreachable = || crate::ws::mux::refusal(503, "object owner unreachable");
    let Some(attempt) = fleet.may_try(o.owner) else {
        return Err(unreachable());
    };
    let mut up = match super::pass_through::connect_owner(o.owner, attempt.connect_within()).await {
        Ok(s) => s,
        Err((how, _)) => {
            fleet.owner_failed(o.owner, attempt, how);
            return Err(unreachable());
        }
    };
    super::set_socket_options(&up);
    let head = upgrade_head(fleet, o);
    let answered = glommio::timer::timeout(limits::FLEET_FORWARD_TIMEOUT, async {
        up.write_all(&head).await?;
        read_head(&mut up)
            .await
            .map_err(glommio::GlommioError::IoError)
    })
    .await;
    let (status, body, rest) = match answered {
        Ok(answer) => answer,
        Err(_) => {
            fleet.owner_failed(o.owner, attempt, crate::fleet::Failed::Waited);
            return Err(unreachable());
        }
    };
    fleet.owner_reached(o.owner);
    if status != 101 {
        let error = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_else(|| format!("the owner answered {status}"));
        return Err(crate::ws::mux::refusal(status, &error));
    }
    Ok((up, rest))
}

/// The upgrade request for the owner: the client's as the fleet passes one on, signed.
fn upgrade_head(fleet: &Fleet, o: &Opening<'_>) -> Vec<u8> {
    let mut fields: Vec<(&str, String)> = vec![
        ("upgrade", "websocket".into()),
        ("sec-websocket-version", "13".into()),
        ("sec-websocket-key", "Y29tYmQtcmVsYXktMDAwMA==".into()),
    ];
    if let Some(t) = o.token {
        fields.push(("authorization", format!("Bearer {t}")));
    }
    if let Some(origin) = o.origin {
        fields.push(("origin", origin.to_string()));
    }
    let client = o.addr.map_or(String::new(), |a| a.to_string());
    let covered =
        combd_fleet::forward::covered(&client, fields.iter().map(|(n, v)| (*n, v.as_bytes())));
    let signature = fleet.trust.sign(o.owner, "GET", &o.target, &covered, b"");
    let mut head = format!(
        "GET {} HTTP/1.1\r\nhost: {}\r\nconnection: Upgrade\r\n",
        o.target, o.owner
    );
    for (n, v) in &fields {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str(&format!(
        "{}: 1\r\n",
        combd_fleet::forward::FORWARDED_HEADER
    ));
    if !client.is_empty() {
        head.push_str(&format!(
            "{}: {client}\r\n",
            combd_fleet::forward::CLIENT_HEADER
        ));
    }
    head.push_str(&format!(
        "{}: {signature}\r\n\r\n",
        combd_fleet::auth::AUTH_HEADER
    ));
    head.into_bytes()
}

/// Reads an answer's head (and its body, for a refusal with a length): its status, its body,
/// and what came after a 101.
async fn read_head(s: &mut TcpStream) -> std::io::Result<(u16, Vec<u8>, Vec<u8>)> {
    use futures_lite::io::AsyncReadExt;
    let mut buf = Vec::new();
    let mut tmp = [0u8; 4096];
    let end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > limits::HEADER_SECTION_MAX_BYTES {
            return Err(std::io::Error::other("the owner's answer head is too long"));
        }
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let rest = buf.split_off(end);
    if status == 101 {
        return Ok((status, Vec::new(), rest));
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())
                .flatten()
        })
        .unwrap_or(0)
        .min(limits::FLEET_ERROR_BODY_MAX_BYTES as usize);
    let mut body = rest;
    while body.len() < length {
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&tmp[..n]);
    }
    body.truncate(length);
    Ok((status, body, Vec::new()))
}

/// Starts carrying the subscription of `session` over `up` (opened by [`open`], `rest` what
/// came after its 101): its task, on the shard, and the way to it.
pub(super) fn start(
    state: &Rc<ShardState>,
    fleet: Arc<Fleet>,
    session: Rc<SessionOut>,
    (up, rest): (TcpStream, Vec<u8>),
) -> Option<Remote> {
    let (to_owner, from_client) = async_channel::bounded(TO_OWNER_QUEUE);
    let relay = Relay {
        state: state.clone(),
        session,
        up,
        inbuf: rest,
        out: Vec::new(),
        from_client: Box::pin(from_client),
        max: state.settings().ws_max_message_bytes as usize,
    };
    let task = state
        .spawn(async move {
            let _passing = fleet.stats.ws_passing();
            relay.run().await;
        })
        .ok()?;
    Some(Remote {
        to_owner,
        _task: task,
    })
}

/// The relay of one subscription (see the module's notes).
struct Relay {
    state: Rc<ShardState>,
    session: Rc<SessionOut>,
    up: TcpStream,
    /// What the owner sent and was not yet a whole frame.
    inbuf: Vec<u8>,
    /// Frames for the owner not yet written (the client's messages, pongs).
    out: Vec<u8>,
    from_client: Pin<Box<async_channel::Receiver<ToOwner>>>,
    /// The largest message taken from the owner.
    max: usize,
}

impl Relay {
    /// Carries frames both ways until the owner closes or fails, then ends the subscription
    /// (1013: its client subscribes again with its place).
    async fn run(mut self) {
        let _ = futures_lite::future::poll_fn(|cx| self.poll(cx)).await;
        if let Some(slot) = self.session.close_on_owner_end() {
            self.state.wake_slot(slot);
        }
    }

    /// One poll: the client's messages and pongs written, the owner's frames read and queued
    /// in the session. Ready once the relay is to end.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        loop {
            if self.session.closing().is_some() {
                return Poll::Ready(Ok(()));
            }
            // What came before is taken first: its pongs are written below, before the wait.
            if let Some(end) = self.take_frames() {
                return Poll::Ready(end);
            }
            while self.out.len() < 64 * 1024 {
                match self.from_client.as_mut().poll_next(cx) {
                    Poll::Ready(Some((text, payload))) => {
                        crate::ws::encode_masked(&mut self.out, if text { 1 } else { 2 }, &payload)
                    }
                    Poll::Ready(None) => return Poll::Ready(Ok(())),
                    Poll::Pending => break,
                }
            }
            if let Poll::Ready(Err(e)) = self.poll_write_out(cx) {
                return Poll::Ready(Err(e));
            }
            let mut scratch = self.state.scratch();
            match Pin::new(&mut self.up).poll_read(cx, &mut scratch[..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(n)) => self.inbuf.extend_from_slice(&scratch[..n]),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Writes what waits for the owner, as far as its socket takes it now.
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while !self.out.is_empty() {
            match Pin::new(&mut self.up).poll_write(cx, &self.out) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()))
                }
                Poll::Ready(Ok(n)) => {
                    self.out.drain(..n);
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.out = Vec::new();
        Pin::new(&mut self.up).poll_flush(cx)
    }

    /// Takes the whole frames the owner sent: a message queued in the session, a ping
    /// answered, a close the end. `Some`: the relay is to end.
    fn take_frames(&mut self) -> Option<std::io::Result<()>> {
        loop {
            let Some((op, start, end)) = crate::ws::mux::server_frame(&self.inbuf) else {
                if self.inbuf.len() > self.max + 16 {
                    return Some(Err(std::io::Error::other(
                        "a frame past the largest message",
                    )));
                }
                return None;
            };
            let payload = &self.inbuf[start..end];
            match op {
                1 | 2 => {
                    let frame = OutFrame::message(op == 1, payload);
                    if let Some(slot) = self.session.queue_relayed(frame) {
                        self.state.wake_slot(slot);
                    }
                }
                9 => crate::ws::encode_masked(&mut self.out, 10, payload),
                10 => {}
                _ => return Some(Ok(())),
            }
            self.inbuf.drain(..end);
        }
    }
}
