//! The key file: an HS256 secret on one line, or a PEM public key, and the algorithm that goes
//! with it; what is refused (a private key, a public key that is not PEM, a short secret).

use std::path::PathBuf;

use combd_kernel::limits;
use jsonwebtoken::{Algorithm, DecodingKey};

use super::KeyError;

/// Reads `file`: an HS256 secret or a PEM public key, and the algorithm that goes with it.
pub(super) fn read_key(file: &PathBuf) -> Result<(DecodingKey, Algorithm), KeyError> {
    let shown = file.display();
    let meta = std::fs::metadata(file).map_err(|e| KeyError(format!("{shown}: {e}")))?;
    if meta.len() > limits::AUTH_KEY_FILE_MAX_BYTES as u64 {
        return Err(KeyError(format!(
            "{shown}: {} bytes, more than a key ({} at most)",
            meta.len(),
            limits::AUTH_KEY_FILE_MAX_BYTES
        )));
    }
    let bytes = std::fs::read(file).map_err(|e| KeyError(format!("{shown}: {e}")))?;
    key_from(&bytes).map_err(|e| KeyError(format!("{shown}: {e}")))
}

/// The key in a key file's bytes, and its algorithm.
pub fn key_from(bytes: &[u8]) -> Result<(DecodingKey, Algorithm), String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not text".to_string())?;
    if text.contains("-----BEGIN") {
        if text.contains("PRIVATE KEY-----") {
            return Err("holds a private key: give the node the public key only".into());
        }
        let pem = text.as_bytes();
        if let Ok(k) = DecodingKey::from_rsa_pem(pem) {
            return Ok((k, Algorithm::RS256));
        }
        if let Ok(k) = DecodingKey::from_ec_pem(pem) {
            return Ok((k, Algorithm::ES256));
        }
        if let Ok(k) = DecodingKey::from_ed_pem(pem) {
            return Ok((k, Algorithm::EdDSA));
        }
        return Err("a PEM file, but not an RSA, P-256 or Ed25519 public key".into());
    }
    let secret = hs256_secret(text)?;
    let key = DecodingKey::from_secret(secret.as_bytes()).map_err(|e| e.to_string())?;
    Ok((key, Algorithm::HS256))
}

/// An HS256 secret file's secret: its one line, at least
/// [`limits::AUTH_HS256_SECRET_MIN_BYTES`].
pub fn hs256_secret(text: &str) -> Result<&str, String> {
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.contains(['\n', '\r']) {
        return Err("more than one line: an HS256 secret is one line".into());
    }
    if looks_like_a_public_key(secret) {
        return Err(
            "looks like a public key (a JWK, an SSH key, or base64 DER), which anyone may \
                    read: an HS256 secret must be secret (give a public key as a PEM file)"
                .into(),
        );
    }
    if secret.len() < limits::AUTH_HS256_SECRET_MIN_BYTES {
        return Err(format!(
            "an HS256 secret of {} bytes; at least {} (e.g. `openssl rand -base64 48`)",
            secret.len(),
            limits::AUTH_HS256_SECRET_MIN_BYTES
        ));
    }
    Ok(secret)
}

/// Whether a one-line key file holds a public key in a form that is not PEM: taken as an
/// HS256 secret, anyone who has the public key could sign tokens.
fn looks_like_a_public_key(line: &str) -> bool {
    use base64::Engine;
    if line.starts_with('{')
        || ["ssh-", "ecdsa-", "sk-"]
            .iter()
            .any(|p| line.starts_with(p))
    {
        return true;
    }
    // Base64 of a DER SEQUENCE whose length is exactly what follows it.
    let Ok(der) = base64::engine::general_purpose::STANDARD.decode(line.trim()) else {
        return false;
    };
    let (len, head) = match der.get(1) {
        Some(&n) if n < 0x80 => (usize::from(n), 2),
        Some(0x81) => (der.get(2).map_or(0, |&n| usize::from(n)), 3),
        Some(0x82) if der.len() >= 4 => (usize::from(der[2]) << 8 | usize::from(der[3]), 4),
        _ => return false,
    };
    der.first() == Some(&0x30) && head + len == der.len()
}
