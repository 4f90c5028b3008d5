//! The TLS hand-off: a new TLS connection's ClientHello, then its handshake, before the HTTP
//! loop sees it.
//!
//! Two deadlines, both from the accept (the start of the connection's task, right after it):
//!
//! - `COMBD_TLS_HELLO_TIMEOUT`: the client's complete ClientHello must be in. Until then the
//!   connection holds no handshake slot and no rustls state: it waits for its first byte with
//!   a 1-byte read into the task's own stack (an io_uring poll, no buffer), and only then
//!   makes rustls's [`Acceptor`](rustls::server::Acceptor), hands it that byte and reads the
//!   rest of the hello. Late: closed, `tls_hello_timeouts`.
//! - `COMBD_TLS_HANDSHAKE_TIMEOUT`: the whole handshake must be done. Once the hello is in the
//!   connection takes one of the shard's [`TLS_HANDSHAKES_MAX`](combd_kernel::limits) slots
//!   (past the cap, or past its client's share of them: closed, `tls_handshakes_refused`) and
//!   holds it to the handshake's end. So one address replaying canned ClientHellos and going
//!   silent holds its share of the slots (`COMBD_CLIENT_SHARE_MAX_PERCENT`), not all of them.
//!
//! So a socket that connects and sends nothing costs its descriptor, its task and a pending
//! poll for the hello timeout, and never keeps a real client's handshake from a slot.
//!
//! Not `TcpStream::peek`: glommio 0.9 peeks with an io_uring `recv` into a buffer it allocates
//! aligned to 4 KiB whatever the length, held for as long as the peek waits. 2,000 silent
//! sockets on one shard cost the node 6.2 to 6.5 KB each with it, 2.2 KB with the read (RSS,
//! debug build; an idle plain connection costs 2.1 KB there). Reading the byte loses nothing:
//! rustls's acceptor takes it before the rest.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use combd_kernel::fair::ClientKey;
use combd_kernel::limits;
use futures_rustls::{LazyConfigAcceptor, StartHandshake};
use glommio::net::TcpStream;
use rustls::ServerConfig;

use crate::state::ShardState;
use crate::stats::ShardStats;
use crate::tls::Stream;

/// How the wait for a ClientHello ended.
enum Hello {
    /// The complete ClientHello is in (boxed: it holds a rustls connection, which would
    /// otherwise size the hand-off for it from the accept on).
    In(Box<StartHandshake<TcpStream>>),
    /// The client closed, failed, or sent something that is not a ClientHello.
    Failed,
    /// The hello deadline passed first.
    Late,
}

/// The hello and handshake of a new connection. `None`: refused, failed or timed out (counted).
pub(super) async fn handshake(
    state: &ShardState,
    tcp: TcpStream,
    asker: ClientKey,
) -> Option<Stream> {
    let stats = state.stats();
    let tls = state.node().tls.as_ref()?;
    let settings = state.settings();
    let accepted = Instant::now();
    let hello = futures_lite::future::or(client_hello(tcp), async {
        glommio::timer::Timer::new(settings.tls_hello_timeout).await;
        Hello::Late
    })
    .await;
    let start = match hello {
        Hello::In(start) => start,
        Hello::Failed => {
            ShardStats::add(&stats.tls_handshake_failures, 1);
            return None;
        }
        Hello::Late => {
            ShardStats::add(&stats.tls_hello_timeouts, 1);
            return None;
        }
    };
    // Boxed: the handshake's state (its rustls connection) is only held once the hello is in.
    Box::pin(finish(state, tls.current(), start, (accepted, asker))).await
}

/// The handshake after its hello: a slot, then the rest within the handshake deadline.
async fn finish(
    state: &ShardState,
    config: Arc<ServerConfig>,
    start: Box<StartHandshake<TcpStream>>,
    (accepted, asker): (Instant, ClientKey),
) -> Option<Stream> {
    let stats = state.stats();
    let Some(_in_progress) = state.begin_handshake(asker) else {
        ShardStats::add(&stats.tls_handshakes_refused, 1);
        return None;
    };
    let left = state
        .settings()
        .tls_handshake_timeout
        .saturating_sub(accepted.elapsed());
    let result = glommio::timer::timeout(left, async {
        (*start)
            .into_stream(config)
            .await
            .map_err(glommio::GlommioError::IoError)
    })
    .await;
    match result {
        Ok(mut s) => {
            ShardStats::add(&stats.tls_handshakes, 1);
            s.get_mut()
                .1
                .set_buffer_limit(Some(limits::TLS_SEND_BUFFER_MAX_BYTES));
            Some(Stream::Tls(Box::new(s)))
        }
        Err(_) => {
            ShardStats::add(&stats.tls_handshake_failures, 1);
            None
        }
    }
}

/// Waits for the first byte, then reads the ClientHello.
async fn client_hello(mut tcp: TcpStream) -> Hello {
    let mut first = [0u8; 1];
    match futures_lite::AsyncReadExt::read(&mut tcp, &mut first).await {
        Ok(1) => {}
        _ => return Hello::Failed,
    }
    let Some(acceptor) = acceptor(first, tcp) else {
        return Hello::Failed;
    };
    match acceptor.await {
        Ok(start) => Hello::In(Box::new(start)),
        Err(_) => Hello::Failed,
    }
}

/// The acceptor that reads the rest of the hello, `first` already in it. Boxed, and built
/// outside the async fn so that its rustls state never sizes the wait for the first byte.
fn acceptor(first: [u8; 1], tcp: TcpStream) -> Option<Pin<Box<LazyConfigAcceptor<TcpStream>>>> {
    let mut acceptor = rustls::server::Acceptor::default();
    acceptor.read_tls(&mut &first[..]).ok()?;
    Some(Box::pin(LazyConfigAcceptor::new(acceptor, tcp)))
}
