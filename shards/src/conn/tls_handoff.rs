//! The TLS hand-off: a new TLS connection's handshake, within the shard's cap on handshakes
//! in progress and `COMBD_TLS_HANDSHAKE_TIMEOUT`, before the HTTP loop sees it.

use glommio::net::TcpStream;

use crate::state::ShardState;
use crate::stats::ShardStats;
use crate::tls::Stream;

/// The handshake of a new connection. `None`: refused, failed or timed out (counted).
pub(super) async fn handshake(state: &ShardState, tcp: TcpStream) -> Option<Stream> {
    let stats = state.stats();
    let tls = state.node().tls.as_ref()?;
    let Some(_in_progress) = state.begin_handshake() else {
        ShardStats::add(&stats.tls_handshakes_refused, 1);
        return None;
    };
    let acceptor = futures_rustls::TlsAcceptor::from(tls.current());
    let timeout = state.settings().tls_handshake_timeout;
    let result = glommio::timer::timeout(timeout, async {
        acceptor
            .accept(tcp)
            .await
            .map_err(glommio::GlommioError::IoError)
    })
    .await;
    match result {
        Ok(s) => {
            ShardStats::add(&stats.tls_handshakes, 1);
            Some(Stream::Tls(Box::new(s)))
        }
        Err(_) => {
            ShardStats::add(&stats.tls_handshake_failures, 1);
            None
        }
    }
}
