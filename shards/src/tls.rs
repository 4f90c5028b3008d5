//! TLS with rustls: the server configuration loaded from PEM files (a chain, and a PKCS#8, RSA
//! or EC key that must match it), reloaded on demand (SIGHUP) without touching open
//! connections, and the stream type connections use for plain and TLS alike.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use futures_lite::{AsyncRead, AsyncWrite};
use glommio::net::TcpStream;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;

/// A TLS set-up error: the setting it is about, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    /// `COMBD_TLS_CERT` or `COMBD_TLS_KEY`.
    pub setting: &'static str,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.setting, self.message)
    }
}

fn err(setting: &'static str, message: impl Into<String>) -> TlsError {
    TlsError {
        setting,
        message: message.into(),
    }
}

/// Builds the server configuration from a certificate chain and a key in PEM files: TLS 1.2
/// and 1.3, ALPN `http/1.1`, no client certificates.
pub fn load(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    let cert_pem = std::fs::read(cert).map_err(|e| {
        err(
            "COMBD_TLS_CERT",
            format!("cannot read {}: {e}", cert.display()),
        )
    })?;
    let key_pem = std::fs::read(key).map_err(|e| {
        err(
            "COMBD_TLS_KEY",
            format!("cannot read {}: {e}", key.display()),
        )
    })?;
    let chain: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| {
            err(
                "COMBD_TLS_CERT",
                format!("{} is not PEM: {e}", cert.display()),
            )
        })?;
    if chain.is_empty() {
        return Err(err(
            "COMBD_TLS_CERT",
            format!("{} holds no certificate", cert.display()),
        ));
    }
    let key_der: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| {
            err(
                "COMBD_TLS_KEY",
                format!("{} is not PEM: {e}", key.display()),
            )
        })?
        .ok_or_else(|| {
            err(
                "COMBD_TLS_KEY",
                format!("{} holds no PKCS#8, RSA or EC private key", key.display()),
            )
        })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err("COMBD_TLS_CERT", e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => {
                err("COMBD_TLS_KEY", "the key does not match the certificate")
            }
            e => err("COMBD_TLS_KEY", format!("unusable key: {e}")),
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The configuration in force, and where to reload it from.
pub struct Tls {
    config: RwLock<Arc<ServerConfig>>,
    /// Reloads that took effect.
    pub reloads: std::sync::atomic::AtomicU64,
    /// Reloads refused (the old pair stayed).
    pub reload_failures: std::sync::atomic::AtomicU64,
    cert: PathBuf,
    key: PathBuf,
}

impl Tls {
    /// Loads the pair once (start-up fails on an error).
    pub fn new(cert: PathBuf, key: PathBuf) -> Result<Tls, TlsError> {
        let config = load(&cert, &key)?;
        Ok(Tls {
            config: RwLock::new(config),
            reloads: Default::default(),
            reload_failures: Default::default(),
            cert,
            key,
        })
    }

    /// The configuration new handshakes use.
    pub fn current(&self) -> Arc<ServerConfig> {
        match self.config.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Loads the files again; a bad pair is refused and the old one stays. Open connections
    /// keep the configuration they were made with.
    pub fn reload(&self) -> Result<(), TlsError> {
        use std::sync::atomic::Ordering;
        let new = match load(&self.cert, &self.key) {
            Ok(c) => c,
            Err(e) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        self.reloads.fetch_add(1, Ordering::Relaxed);
        match self.config.write() {
            Ok(mut c) => *c = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
        Ok(())
    }
}

/// A connection's byte stream: plain TCP, or TLS over it.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<futures_rustls::server::TlsStream<TcpStream>>),
}

impl Stream {
    /// The TCP socket under it.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }
}

impl std::os::fd::AsFd for Stream {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        tcp_fd(self.tcp())
    }
}

/// A TCP stream's descriptor, borrowed for a system call on it (glommio's `TcpStream` has
/// `AsRawFd` but not `AsFd`, which `nix` and so `combd_kernel::sys` take).
pub(crate) fn tcp_fd(stream: &TcpStream) -> std::os::fd::BorrowedFd<'_> {
    use std::os::fd::AsRawFd;
    // SAFETY: the stream owns its descriptor and closes it only when dropped; the borrow is
    // tied to `stream`'s, so the descriptor stays open while it lives.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(stream.as_raw_fd()) }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    /// Closes the write side: TLS sends its close_notify first.
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_close(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_close(cx),
        }
    }
}
