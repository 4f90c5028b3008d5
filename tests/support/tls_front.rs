//! A TLS front for a plain-HTTP server, as an operator puts one before Garage (which speaks
//! plain HTTP only): TLS connections on a port of its own, their bytes passed to the server and
//! back, one thread per connection.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::tls::Pair;

/// The front; it runs until the test process ends (its threads end with their connections).
pub struct TlsFront {
    /// Where clients reach it: `127.0.0.1:<port>`.
    pub addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
}

impl TlsFront {
    /// A front for `to` with `pair` as its certificate.
    pub fn start(to: SocketAddr, pair: &Pair) -> TlsFront {
        let certs = vec![pair.der.clone()];
        let key = rustls_pemfile::private_key(&mut pair.key_pem.as_bytes())
            .unwrap()
            .unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let handshakes = Arc::new(AtomicUsize::new(0));
        let counted = handshakes.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (config, counted) = (config.clone(), counted.clone());
                std::thread::spawn(move || {
                    let _ = pass(client, to, config, &counted);
                });
            }
        });
        TlsFront { addr, handshakes }
    }

    /// The TLS handshakes completed so far.
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

/// One connection: the handshake, then bytes each way until either side closes.
fn pass(
    mut client: TcpStream,
    to: SocketAddr,
    config: Arc<rustls::ServerConfig>,
    handshakes: &AtomicUsize,
) -> std::io::Result<()> {
    let mut tls = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    while tls.is_handshaking() {
        tls.complete_io(&mut client)?;
    }
    handshakes.fetch_add(1, Ordering::SeqCst);
    let mut server = TcpStream::connect(to)?;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // What rustls decrypted already (the request can come in the same read as the
        // handshake's last message) goes first: the socket may have nothing more to say.
        loop {
            match tls.reader().read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => server.write_all(&buf[..n])?,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        while tls.wants_write() {
            tls.write_tls(&mut client)?;
        }
        let (from_client, from_server) = {
            let mut fds = [
                PollFd::new(client.as_fd(), PollFlags::POLLIN),
                PollFd::new(server.as_fd(), PollFlags::POLLIN),
            ];
            poll(&mut fds, PollTimeout::NONE).map_err(std::io::Error::from)?;
            let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if from_client {
            if tls.read_tls(&mut client)? == 0 {
                return Ok(());
            }
            tls.process_new_packets().map_err(std::io::Error::other)?;
        }
        if from_server {
            let n = server.read(&mut buf)?;
            if n == 0 {
                tls.send_close_notify();
                while tls.wants_write() {
                    tls.write_tls(&mut client)?;
                }
                return Ok(());
            }
            tls.writer().write_all(&buf[..n])?;
        }
    }
}
