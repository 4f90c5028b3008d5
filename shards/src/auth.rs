//! Verified identity: a client's token (a JWT) checked in the node before its request reaches
//! an app or its WebSocket is upgraded (`COMBD_AUTH_JWT_KEY_FILE`, `COMBD_AUTH_ISSUER`,
//! `COMBD_AUTH_AUDIENCE`).
//!
//! - **The key**: an HS256 secret on one line (at least
//!   [`limits::AUTH_HS256_SECRET_MIN_BYTES`]), or a PEM public key: RSA (RS256), P-256 (ES256)
//!   or Ed25519 (EdDSA). One algorithm per key, taken from the key, never from the token's
//!   header (a token that names another algorithm is refused: no `alg: none`, no HS256 token
//!   "signed" with a public key). Read at start-up, where a bad file stops the node, and again
//!   on SIGHUP, where a bad file keeps the old key ([`Auth::reload`]).
//! - **The token**: from `Authorization: Bearer <jwt>`, else a WebSocket subprotocol
//!   `combd.bearer.<jwt>` (browsers cannot set headers on a WebSocket; offered beside `combd`,
//!   which the 101 answers), else the cookie `combd_token`. At most
//!   [`limits::AUTH_TOKEN_MAX_BYTES`].
//! - **What is checked**: the signature; `exp` (required) and `nbf` within
//!   [`limits::AUTH_LEEWAY_SECONDS`]; `iss` and `aud` when set; a `sub` of 1 to
//!   [`limits::AUTH_CLAIM_MAX_BYTES`] bytes; a `name`, if any, within the same bound.
//! - **What an app sees**: a [`Client`] (subject and name), never the token. The token is
//!   never logged.
//!
//! The verification is `jsonwebtoken` 9 (Keats), on `ring`, the crypto library the node's TLS
//! and fleet already use: nothing here is cryptography written by hand.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use combd_kernel::limits;
use combd_kernel::settings::AuthSettings;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// The client a verified token names: what an app sees of it (never the token).
#[derive(Clone, PartialEq, Eq)]
pub struct Client {
    /// The token's `sub`.
    pub subject: String,
    /// The token's `name` claim, if any.
    pub name: Option<String>,
    /// The token itself, for a request passed on to its object's owner in a fleet (which
    /// verifies it again); not the app's to see, and never printed.
    token: Box<str>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("subject", &self.subject)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// The token the client came with (for a request passed on to another node).
    pub(crate) fn token(&self) -> &str {
        &self.token
    }
}

/// Why a token was not taken (said in the log at debug level and in nothing the client sees
/// beyond `invalid_token`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No token came with the request.
    Missing,
    /// A token came and failed: why.
    Invalid(String),
}

/// A key file that cannot be used: start-up stops, a reload keeps the old key.
#[derive(Debug)]
pub struct KeyError(pub String);

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A key and the validation that goes with it.
struct Verifier {
    key: DecodingKey,
    validation: Validation,
}

/// The node's token verifier, shared by every shard.
pub struct Auth {
    verifier: RwLock<Arc<Verifier>>,
    settings: AuthSettings,
    /// SIGHUP reloads of the key that took effect.
    pub reloads: AtomicU64,
    /// Reloads refused (the old key stayed).
    pub reload_failures: AtomicU64,
}

/// Reads `file`: an HS256 secret or a PEM public key, and the algorithm that goes with it.
fn read_key(file: &PathBuf) -> Result<(DecodingKey, Algorithm), KeyError> {
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
    Ok((
        DecodingKey::from_secret(secret.as_bytes()),
        Algorithm::HS256,
    ))
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

fn verifier(settings: &AuthSettings) -> Result<Verifier, KeyError> {
    let (key, alg) = read_key(&settings.key_file)?;
    let mut validation = Validation::new(alg);
    validation.leeway = limits::AUTH_LEEWAY_SECONDS;
    validation.validate_exp = true;
    validation.validate_nbf = true;
    // jsonwebtoken checks `iss` and `aud` only when a token carries them: a configured one is
    // also required, or a token without it (another service's, signed with the same key)
    // would pass.
    let mut required = vec!["exp", "sub"];
    if settings.issuer.is_some() {
        required.push("iss");
    }
    if settings.audience.is_some() {
        required.push("aud");
    }
    validation.set_required_spec_claims(&required);
    match &settings.issuer {
        Some(iss) => validation.set_issuer(&[iss]),
        None => validation.iss = None,
    }
    match &settings.audience {
        Some(aud) => validation.set_audience(&[aud]),
        None => validation.validate_aud = false,
    }
    Ok(Verifier { key, validation })
}

impl Auth {
    /// Reads the key once (start-up fails on an error).
    pub fn new(settings: AuthSettings) -> Result<Auth, KeyError> {
        let v = verifier(&settings)?;
        Ok(Auth {
            verifier: RwLock::new(Arc::new(v)),
            settings,
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
        })
    }

    /// Reads the key file again; a bad file is refused and the old key stays.
    pub fn reload(&self) -> Result<(), KeyError> {
        match verifier(&self.settings) {
            Ok(v) => {
                self.reloads.fetch_add(1, Ordering::Relaxed);
                match self.verifier.write() {
                    Ok(mut cur) => *cur = Arc::new(v),
                    Err(poisoned) => *poisoned.into_inner() = Arc::new(v),
                }
                Ok(())
            }
            Err(e) => {
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    fn current(&self) -> Arc<Verifier> {
        match self.verifier.read() {
            Ok(v) => v.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Verifies `token`: the client it names, or why not.
    pub fn verify(&self, token: &[u8]) -> Result<Client, Refused> {
        if token.len() > limits::AUTH_TOKEN_MAX_BYTES {
            return Err(Refused::Invalid(format!(
                "longer than {} bytes",
                limits::AUTH_TOKEN_MAX_BYTES
            )));
        }
        let token = std::str::from_utf8(token).map_err(|_| Refused::Invalid("not text".into()))?;
        let v = self.current();
        let data = jsonwebtoken::decode::<serde_json::Value>(token, &v.key, &v.validation)
            .map_err(|e| Refused::Invalid(e.to_string()))?;
        let claim = |name: &str| -> Result<Option<String>, Refused> {
            match data.claims.get(name) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(serde_json::Value::String(s))
                    if !s.is_empty() && s.len() <= limits::AUTH_CLAIM_MAX_BYTES =>
                {
                    Ok(Some(s.clone()))
                }
                Some(_) => Err(Refused::Invalid(format!(
                    "{name} must be a string of 1 to {} bytes",
                    limits::AUTH_CLAIM_MAX_BYTES
                ))),
            }
        };
        let subject = claim("sub")?.ok_or_else(|| Refused::Invalid("no sub".into()))?;
        Ok(Client {
            subject,
            name: claim("name")?,
            token: token.into(),
        })
    }
}

/// A token for development (`combd token`): HS256, signed with the secret in `key_file_text`,
/// naming `sub` (and `name`), valid for `ttl_seconds` from `now` (Unix seconds), with the
/// issuer and audience the node checks. A PEM key file cannot sign: its tokens come from the
/// issuer that holds the private key.
pub fn mint(
    key_file_text: &str,
    sub: &str,
    name: Option<&str>,
    ttl_seconds: u64,
    now: u64,
    settings: (Option<&str>, Option<&str>),
) -> Result<String, String> {
    if key_file_text.contains("-----BEGIN") {
        return Err(
            "the key file holds a public key: only an HS256 secret can sign here (tokens for \
                    RS256, ES256 or EdDSA come from the issuer that holds the private key)"
                .into(),
        );
    }
    let secret = hs256_secret(key_file_text)?;
    for (what, v) in [("--sub", Some(sub)), ("--name", name)] {
        if v.is_some_and(|v| v.is_empty() || v.len() > limits::AUTH_CLAIM_MAX_BYTES) {
            return Err(format!(
                "{what} must be 1 to {} bytes",
                limits::AUTH_CLAIM_MAX_BYTES
            ));
        }
    }
    let mut claims = serde_json::json!({
        "sub": sub,
        "iat": now,
        "exp": now.saturating_add(ttl_seconds),
    });
    if let Some(n) = name {
        claims["name"] = n.into();
    }
    let (issuer, audience) = settings;
    if let Some(iss) = issuer {
        claims["iss"] = iss.into();
    }
    if let Some(aud) = audience {
        claims["aud"] = aud.into();
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .map_err(|e| e.to_string())
}

/// The subprotocol a browser offers its token in: `combd.bearer.<jwt>`.
pub const BEARER_PROTOCOL_PREFIX: &str = "combd.bearer.";
/// The subprotocol offered beside it, which the 101 answers.
pub const PROTOCOL: &str = "combd";
/// The cookie a token may come in.
pub const COOKIE: &str = "combd_token";

/// The items of the request's `Sec-WebSocket-Protocol` fields, in order.
pub fn offered_protocols<'a>(
    headers: impl Iterator<Item = (&'a str, &'a [u8])> + 'a,
) -> impl Iterator<Item = &'a [u8]> + 'a {
    headers
        .filter(|(n, _)| n.eq_ignore_ascii_case("sec-websocket-protocol"))
        .flat_map(|(_, v)| v.split(|b| *b == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|p| !p.is_empty())
}

/// The request's token, from the first place that has one: `Authorization: Bearer`, a
/// `combd.bearer.` subprotocol, the `combd_token` cookie.
pub fn token<'a, I>(headers: I) -> Option<&'a [u8]>
where
    I: Iterator<Item = (&'a str, &'a [u8])> + Clone + 'a,
{
    let bearer = headers
        .clone()
        .filter(|(n, _)| n.eq_ignore_ascii_case("authorization"))
        .find_map(|(_, v)| {
            let v = v.trim_ascii();
            (v.len() > 7 && v[..7].eq_ignore_ascii_case(b"bearer ")).then(|| v[7..].trim_ascii())
        });
    if bearer.is_some() {
        return bearer;
    }
    if let Some(t) = offered_protocols(headers.clone())
        .find_map(|p| p.strip_prefix(BEARER_PROTOCOL_PREFIX.as_bytes()))
    {
        return Some(t);
    }
    headers
        .filter(|(n, _)| n.eq_ignore_ascii_case("cookie"))
        .flat_map(|(_, v)| v.split(|b| *b == b';'))
        .find_map(|pair| {
            let pair = pair.trim_ascii();
            pair.strip_prefix(COOKIE.as_bytes())
                .and_then(|rest| rest.strip_prefix(b"="))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "combd-test-secret-0123456789abcdef-0123456789";

    fn auth(issuer: Option<&str>, audience: Option<&str>) -> Auth {
        let dir = std::env::temp_dir().join(format!("combd-auth-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(format!("key-{}-{}", issuer.is_some(), audience.is_some()));
        std::fs::write(&file, format!("{SECRET}\n")).unwrap();
        Auth::new(AuthSettings {
            key_file: file,
            issuer: issuer.map(str::to_string),
            audience: audience.map(str::to_string),
        })
        .unwrap()
    }

    fn now() -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    }

    fn sign(claims: serde_json::Value, secret: &str) -> String {
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    #[test]
    fn a_good_token_names_its_client_and_a_bad_one_is_refused() {
        let a = auth(None, None);
        let good = sign(
            serde_json::json!({ "sub": "alice", "name": "Alice", "exp": now() + 60 }),
            SECRET,
        );
        let client = a.verify(good.as_bytes()).unwrap();
        assert_eq!(client.subject, "alice");
        assert_eq!(client.name.as_deref(), Some("Alice"));
        assert_eq!(client.token(), good);
        assert!(
            !format!("{client:?}").contains(&good),
            "the token is never printed"
        );
        for (why, t) in [
            (
                "another key",
                sign(
                    serde_json::json!({ "sub": "a", "exp": now() + 60 }),
                    &SECRET.replace('0', "1"),
                ),
            ),
            (
                "expired",
                sign(
                    serde_json::json!({ "sub": "a", "exp": now() - 120 }),
                    SECRET,
                ),
            ),
            (
                "not yet",
                sign(
                    serde_json::json!({ "sub": "a", "exp": now() + 600, "nbf": now() + 300 }),
                    SECRET,
                ),
            ),
            ("no exp", sign(serde_json::json!({ "sub": "a" }), SECRET)),
            (
                "no sub",
                sign(serde_json::json!({ "exp": now() + 60 }), SECRET),
            ),
            (
                "empty sub",
                sign(serde_json::json!({ "sub": "", "exp": now() + 60 }), SECRET),
            ),
            (
                "long name",
                sign(
                    serde_json::json!({ "sub": "a", "name": "n".repeat(300), "exp": now() + 60 }),
                    SECRET,
                ),
            ),
            ("garbage", "not.a.token".to_string()),
            ("alg none", {
                // {"alg":"none"} . {"sub":"a","exp":...} . (no signature)
                let b64 = |s: &str| base64_url(s.as_bytes());
                format!(
                    "{}.{}.",
                    b64(r#"{"alg":"none","typ":"JWT"}"#),
                    b64(&format!(r#"{{"sub":"a","exp":{}}}"#, now() + 60))
                )
            }),
        ] {
            assert!(
                matches!(a.verify(t.as_bytes()), Err(Refused::Invalid(_))),
                "{why}"
            );
        }
        // Within the leeway an expired token still passes.
        let late = sign(serde_json::json!({ "sub": "a", "exp": now() - 5 }), SECRET);
        assert!(a.verify(late.as_bytes()).is_ok());
        assert!(a
            .verify(&vec![b'a'; limits::AUTH_TOKEN_MAX_BYTES + 1])
            .is_err());
    }

    /// Base64url without padding, as JWTs are written.
    fn base64_url(bytes: &[u8]) -> String {
        const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let n = chunk
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            for i in 0..=chunk.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            }
        }
        out
    }

    #[test]
    fn issuer_and_audience_are_checked_when_set() {
        let a = auth(Some("https://id.example"), Some("combd"));
        let with = |iss: &str, aud: &str| {
            sign(
                serde_json::json!({ "sub": "a", "iss": iss, "aud": aud, "exp": now() + 60 }),
                SECRET,
            )
        };
        assert!(a
            .verify(with("https://id.example", "combd").as_bytes())
            .is_ok());
        assert!(a
            .verify(with("https://other.example", "combd").as_bytes())
            .is_err());
        assert!(a
            .verify(with("https://id.example", "other").as_bytes())
            .is_err());
        // A configured claim is required: a token without it, or with it not a string, fails.
        for claims in [
            serde_json::json!({ "sub": "a", "aud": "combd", "exp": now() + 60 }),
            serde_json::json!({ "sub": "a", "iss": "https://id.example", "exp": now() + 60 }),
            serde_json::json!({ "sub": "a", "iss": "https://id.example", "aud": 1, "exp": now() + 60 }),
        ] {
            assert!(
                a.verify(sign(claims.clone(), SECRET).as_bytes()).is_err(),
                "{claims}"
            );
        }
        // Unset, any audience (or none) passes.
        let open = auth(None, None);
        assert!(open.verify(with("x", "anything").as_bytes()).is_ok());
    }

    #[test]
    fn key_files_are_an_hs256_secret_or_a_public_key() {
        assert!(hs256_secret("short\n").unwrap_err().contains("at least 32"));
        assert!(hs256_secret(&format!("{SECRET}\nsecond line\n")).is_err());
        assert_eq!(hs256_secret(&format!("{SECRET}\r\n")), Ok(SECRET));
        // A public key that is not PEM is no secret.
        use base64::Engine;
        let mut der = vec![0x30, 0x59];
        der.extend([7u8; 0x59]);
        let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
        for public in [
            b64.as_str(),
            r#"{"kty":"EC","crv":"P-256","x":"f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU"}"#,
            "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
        ] {
            assert!(
                hs256_secret(public).unwrap_err().contains("public key"),
                "{public}"
            );
        }
        // A random secret, base64 as openssl writes it, is one.
        assert!(
            hs256_secret("q8Vd0bW3nqDq3m9Jc1d3vE2QkqGz0eY7uB1lZ2dQe8p4kT0yXh6mS5rN9aF2cW1v")
                .is_ok()
        );
        let private =
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIA==\n-----END PRIVATE KEY-----\n";
        assert!(key_from(private.as_bytes())
            .err()
            .unwrap()
            .contains("private key"));
        let junk = "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n";
        assert!(key_from(junk.as_bytes()).is_err());
    }

    #[test]
    fn the_token_comes_from_a_bearer_header_a_subprotocol_or_a_cookie() {
        fn token_of(v: &[(&'static str, &'static str)]) -> Option<&'static [u8]> {
            let v: &'static [(&'static str, &'static str)] =
                Box::leak(v.to_vec().into_boxed_slice());
            token(v.iter().map(|(n, v)| (*n, v.as_bytes())))
        }
        assert_eq!(
            token_of(&[("Authorization", "Bearer abc")]),
            Some(&b"abc"[..])
        );
        assert_eq!(
            token_of(&[("authorization", "bearer  abc ")]),
            Some(&b"abc"[..])
        );
        assert_eq!(token_of(&[("Authorization", "Basic abc")]), None);
        assert_eq!(
            token_of(&[("Sec-WebSocket-Protocol", "combd, combd.bearer.x.y.z")]),
            Some(&b"x.y.z"[..])
        );
        assert_eq!(
            token_of(&[("Cookie", "a=1; combd_token=t.o.k; b=2")]),
            Some(&b"t.o.k"[..])
        );
        assert_eq!(token_of(&[("Cookie", "xcombd_token=1")]), None);
        // The header first, then the subprotocol, then the cookie.
        assert_eq!(
            token_of(&[
                ("Cookie", "combd_token=c"),
                ("Sec-WebSocket-Protocol", "combd.bearer.p"),
                ("Authorization", "Bearer h")
            ]),
            Some(&b"h"[..])
        );
        assert_eq!(
            token_of(&[
                ("Cookie", "combd_token=c"),
                ("Sec-WebSocket-Protocol", "combd.bearer.p")
            ]),
            Some(&b"p"[..])
        );
        assert_eq!(token_of(&[]), None);
    }
}
