//! TLS for the tests: a self-signed certificate made in the test, and a real rustls client
//! that trusts only it.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};

use super::{TestNode, WAIT};

/// A rustls client stream.
pub type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A certificate for `localhost` and its key.
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

/// A new self-signed certificate for `localhost`.
pub fn make_pair() -> Pair {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    Pair {
        cert_pem: ck.cert.pem(),
        key_pem: ck.key_pair.serialize_pem(),
        der: ck.cert.der().clone(),
    }
}

/// Writes `cert.pem` and `key.pem` into `dir`.
pub fn write_pair(dir: &Path, p: &Pair) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&c, &p.cert_pem).unwrap();
    std::fs::write(&k, &p.key_pem).unwrap();
    (c, k)
}

/// A rustls client connection for `localhost` that trusts only `trusted`, ALPN `http/1.1`.
fn client(trusted: &CertificateDer<'static>) -> rustls::ClientConnection {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap())
        .unwrap()
}

/// The bytes of a real client's first flight: one complete ClientHello, for a client that
/// sends it and then nothing more.
pub fn client_hello(trusted: &CertificateDer<'static>) -> Vec<u8> {
    let mut conn = client(trusted);
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello).unwrap();
    }
    hello
}

/// A rustls client of `node`'s TLS listener at `host`, trusting only `trusted`, its handshake
/// done.
pub fn tls_connect_to(
    node: &TestNode,
    host: &str,
    trusted: &CertificateDer<'static>,
) -> std::io::Result<Tls> {
    let tcp = TcpStream::connect((host, node.tls_port.unwrap()))?;
    tls_over(tcp, trusted)
}

/// A rustls client over `tcp` (connected by the test), trusting only `trusted`, its handshake
/// done.
pub fn tls_over(tcp: TcpStream, trusted: &CertificateDer<'static>) -> std::io::Result<Tls> {
    let conn = client(trusted);
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    // Complete the handshake now, so a certificate error shows here.
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    Ok(tls)
}

/// A certificate authority made in the test, and the certificates it signs: what an operator
/// whose fleet servers speak TLS has.
pub struct Authority {
    issuer: rcgen::Certificate,
    key: rcgen::KeyPair,
    /// Its own certificate, PEM: what a client that trusts it is given.
    pub pem: String,
}

impl Authority {
    pub fn new(name: &str) -> Authority {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let issuer = params.self_signed(&key).unwrap();
        Authority {
            pem: issuer.pem(),
            issuer,
            key,
        }
    }

    fn sign(&self, names: &[&str]) -> Pair {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = rcgen::CertificateParams::new(names).unwrap();
        // No subject: etcd's JSON gateway refuses a client certificate with a CommonName
        // (etcd 3.4: 400 "CommonName of client sending a request against gateway will be
        // ignored"); a server's names are its subjectAltNames.
        params.distinguished_name = rcgen::DistinguishedName::new();
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer, &self.key).unwrap();
        Pair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }

    /// A server certificate for `127.0.0.1` and `localhost`.
    pub fn server(&self) -> Pair {
        self.sign(&["127.0.0.1", "localhost"])
    }

    /// A client certificate (no names, no subject).
    pub fn client(&self) -> Pair {
        self.sign(&[])
    }
}
