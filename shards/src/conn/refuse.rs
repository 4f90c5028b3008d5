//! The late refusal: a connection that got in while the node is full (or past the connection
//! cap) is answered `503` with `retry-after: 1` and `{"error":"overloaded"}`, written before
//! reading anything (a WebSocket upgrade gets it before upgrading), then closed with a linger.
//! A TLS connection cannot be answered before its handshake, so the shard closes it instead.

use std::rc::Rc;

use glommio::net::TcpStream;

use crate::cells::Cells;
use crate::http::Response;
use crate::state::slot::ConnSlot;
use crate::tls::Stream;

use super::{Asked, Conn};

/// Answers a plain connection that got in while the node is full. `slot` is its place in the
/// connection count, already open.
pub(crate) async fn refuse(cells: Rc<Cells>, slot: ConnSlot, stream: TcpStream) {
    let _ = stream.set_write_timeout(Some(combd_kernel::limits::WRITE_STALL_TIMEOUT));
    let mut conn = Conn::new(cells, slot, Stream::Plain(stream), false);
    let mut out = Vec::new();
    let overloaded = Response::overloaded();
    conn.respond(&mut out, &overloaded, false, false, Asked::Nothing);
    conn.flush_and_close(&mut out).await;
}
