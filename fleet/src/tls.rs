//! TLS to the fleet's servers: which authorities an `https://` endpoint's certificate must
//! chain to (`COMBD_FLEET_CA_FILE`, else the Mozilla roots built in), and the client
//! certificate shown to etcd (`COMBD_FLEET_ETCD_CERT_FILE`, `COMBD_FLEET_ETCD_KEY_FILE`), each
//! read from its file at start-up. The TLS itself is rustls (with ring, as the node's own
//! listener), through `ureq`; an `http://` endpoint never uses any of it.

use std::path::Path;
use std::sync::Arc;

use combd_kernel::settings::ConfigError;
use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};

use crate::key_file::read_key_file;

/// The TLS configuration of one fleet client.
#[derive(Debug, Clone)]
pub struct FleetTls {
    pub(crate) config: TlsConfig,
}

impl Default for FleetTls {
    /// The Mozilla roots, no client certificate.
    fn default() -> FleetTls {
        FleetTls::from_parts(RootCerts::WebPki, None)
    }
}

impl FleetTls {
    fn from_parts(roots: RootCerts, client: Option<ClientCert>) -> FleetTls {
        FleetTls {
            config: TlsConfig::builder()
                .provider(TlsProvider::Rustls)
                .root_certs(roots)
                .client_cert(client)
                .build(),
        }
    }

    /// Trusting the authorities in the PEM file at `ca_file` (`COMBD_FLEET_CA_FILE`) or, with
    /// none, the Mozilla roots; showing the client certificate `client` (chain file, key file)
    /// when given. An error is the setting to look at and why (naming the file, never what a
    /// key file holds).
    pub fn from_files(
        ca_file: Option<&Path>,
        client: Option<(&Path, &Path)>,
    ) -> Result<FleetTls, (&'static str, String)> {
        fn read<T>(
            setting: &'static str,
            path: &Path,
            parse: impl FnOnce(&str) -> Result<T, String>,
        ) -> Result<T, (&'static str, String)> {
            read_key_file(setting, path, parse).map_err(|e: ConfigError| (setting, e.message))
        }
        let roots = match ca_file {
            None => RootCerts::WebPki,
            Some(path) => RootCerts::Specific(Arc::new(read("COMBD_FLEET_CA_FILE", path, |t| {
                certificates(t, "the authorities' certificates")
            })?)),
        };
        let client = match client {
            None => None,
            Some((chain, key)) => {
                let chain = read("COMBD_FLEET_ETCD_CERT_FILE", chain, |t| {
                    certificates(t, "the client certificate")
                })?;
                let key = read("COMBD_FLEET_ETCD_KEY_FILE", key, private_key)?;
                Some(ClientCert::new_with_certs(&chain, key))
            }
        };
        Ok(FleetTls::from_parts(roots, client))
    }
}

/// Every certificate of a PEM text (at least one); other items are refused, so a key pasted
/// into a certificate file is not silently carried along.
fn certificates(text: &str, what: &str) -> Result<Vec<Certificate<'static>>, String> {
    let mut out = Vec::new();
    for item in ureq::tls::parse_pem(text.as_bytes()) {
        match item.map_err(|e| format!("not PEM: {e}"))? {
            PemItem::Certificate(c) => out.push(c),
            _ => {
                return Err(format!(
                    "holds something other than {what} (PEM CERTIFICATE)"
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(format!("holds no certificate: it must hold {what} in PEM"));
    }
    Ok(out)
}

/// The one private key of a PEM text (PKCS#8, PKCS#1 or SEC1).
fn private_key(text: &str) -> Result<PrivateKey<'static>, String> {
    let mut keys = ureq::tls::parse_pem(text.as_bytes()).filter_map(|i| match i {
        Ok(PemItem::PrivateKey(k)) => Some(Ok(k)),
        Ok(_) => None,
        Err(e) => Some(Err(format!("not PEM: {e}"))),
    });
    let key = keys
        .next()
        .ok_or_else(|| "holds no private key in PEM".to_string())??;
    if keys.next().is_some() {
        return Err("holds more than one private key".to_string());
    }
    Ok(key)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const CERT: &str =
        "-----BEGIN CERTIFICATE-----\nMIIBajCCARGgAwIBAgIUY2VydA==\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg\n-----END PRIVATE KEY-----\n";

    #[test]
    fn a_certificate_file_holds_certificates_only() {
        assert_eq!(certificates(CERT, "x").unwrap().len(), 1);
        assert_eq!(
            certificates(&format!("{CERT}{CERT}"), "x").unwrap().len(),
            2
        );
        assert!(certificates("", "x")
            .unwrap_err()
            .contains("no certificate"));
        assert!(certificates("just text\n", "x")
            .unwrap_err()
            .contains("no certificate"));
        assert!(certificates(&format!("{CERT}{KEY}"), "x")
            .unwrap_err()
            .contains("something other than"));
    }

    #[test]
    fn a_key_file_holds_one_key() {
        assert!(private_key(KEY).is_ok());
        assert!(private_key(CERT).unwrap_err().contains("no private key"));
        assert!(private_key(&format!("{KEY}{KEY}"))
            .unwrap_err()
            .contains("more than one"));
    }

    #[test]
    fn errors_name_the_setting_and_the_file() {
        let e = FleetTls::from_files(Some(Path::new("/nonexistent/ca.pem")), None).unwrap_err();
        assert_eq!(e.0, "COMBD_FLEET_CA_FILE");
        assert!(e.1.starts_with("/nonexistent/ca.pem: "), "{e:?}");
        let e = FleetTls::from_files(
            None,
            Some((
                Path::new("/nonexistent/c.pem"),
                Path::new("/nonexistent/k.pem"),
            )),
        )
        .unwrap_err();
        assert_eq!(e.0, "COMBD_FLEET_ETCD_CERT_FILE");
    }
}
